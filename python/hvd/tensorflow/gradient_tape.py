"""Averaging gradients across ranks: the function DistributedGradientTape,
the TF1 DistributedOptimizer and hvd.tensorflow.keras share, and the
tape itself."""

import tensorflow as tf

from hvd.tensorflow._reduce import GradientReducer
from hvd.tensorflow.compression import Compression
from hvd.tensorflow.mpi_ops import Average


def make_allreduce_grads_fn(name, device_dense="", device_sparse="",
                            compression=Compression.none,
                            sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=None):
    """allreduce_grads(grads, variables=None) -> the grads reduced with op
    over process_set (None stays None), as Horovod's _make_allreduce_grads_fn
    (_reduce.GradientReducer). Eagerly the reductions run in one
    tf.function, so that they are in flight together (and fused)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op "
                         "!= Average")
    reducer = GradientReducer(name, device_dense, device_sparse, compression,
                              sparse_as_dense, op, gradient_predivide_factor,
                              groups if groups is not None else num_groups,
                              process_set)

    def allreduce_grads(grads, variables=None):
        grads = list(grads)
        if variables is None:
            if isinstance(reducer.groups, list):
                raise ValueError("groups= needs the variables of the "
                                 "gradients")
            variables = [None] * len(grads)
        return reducer(grads, list(variables))

    if tf.executing_eagerly():
        fn = tf.function(allreduce_grads)
        return lambda grads, variables=None: fn(list(grads), variables)
    return allreduce_grads


_eager_fns = {}


def cached_allreduce_grads_fn(*args):
    """make_allreduce_grads_fn(*args), one per set of arguments when eager:
    a training loop makes a new tape every step, and each new tf.function
    would be traced again."""
    if not tf.executing_eagerly():
        return make_allreduce_grads_fn(*args)
    try:
        key = tuple(args)
        hash(key)
    except TypeError:  # groups as lists of variables
        return make_allreduce_grads_fn(*args)
    if key not in _eager_fns:
        _eager_fns[key] = make_allreduce_grads_fn(*args)
    return _eager_fns[key]


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape, device_dense, device_sparse, compression,
                 sparse_as_dense, op, gradient_predivide_factor, num_groups,
                 groups, persistent=False, watch_accessed_variables=True,
                 process_set=None):
        super(self.__class__, self).__init__(persistent,
                                             watch_accessed_variables)
        self._tape = tape._tape
        self._allreduce_grads = cached_allreduce_grads_fn(
            "DistributedGradientTape", device_dense, device_sparse,
            compression, sparse_as_dense, op, gradient_predivide_factor,
            num_groups, groups, process_set)

    def gradient(self, target, sources, output_gradients=None, *args,
                 **kwargs):
        grads = super(self.__class__, self).gradient(
            target, sources, output_gradients, *args, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._allreduce_grads(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none,
                            sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=None):
    """A tape whose gradient() returns the gradients averaged (op) over
    every rank (of process_set); the arguments are Horovod's."""
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_DistributedGradientTape.__dict__))
    return cls(gradtape, device_dense, device_sparse, compression,
               sparse_as_dense, op, gradient_predivide_factor, num_groups,
               groups, gradtape._persistent,
               getattr(gradtape, "_watch_accessed_variables", True),
               process_set)

