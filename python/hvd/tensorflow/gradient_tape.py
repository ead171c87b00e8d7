"""Averaging gradients across ranks: the function DistributedGradientTape,
the TF1 DistributedOptimizer and hvd.tensorflow.keras share, and the
tape itself."""

import tensorflow as tf

from hvd.tensorflow import mpi_ops
from hvd.tensorflow.compression import Compression
from hvd.tensorflow.mpi_ops import Average, Sum


def _group_indices(grads, variables, num_groups, groups):
    """Which gradients go into one grouped allreduce together: the
    variable lists of groups, or num_groups even splits; None for one
    allreduce per gradient."""
    present = [i for i, g in enumerate(grads)
               if g is not None and not isinstance(g, tf.IndexedSlices)]
    if groups is not None:
        if variables is None:
            raise ValueError("groups= needs the variables of the gradients")
        index = {v.ref(): i for i, v in enumerate(variables)}
        out, seen = [], set()
        for group in groups:
            idx = [index[v.ref()] for v in group
                   if v.ref() in index and index[v.ref()] in present]
            seen.update(idx)
            if idx:
                out.append(idx)
        out.extend([i] for i in present if i not in seen)
        return out
    if num_groups and num_groups > 0:
        n = min(num_groups, len(present)) or 1
        return [present[k::n] for k in range(n)] if present else []
    return None


def make_allreduce_grads_fn(name, device_dense="", device_sparse="",
                            compression=Compression.none,
                            sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0,
                            groups=None):
    """allreduce_grads(grads, variables=None) -> the grads reduced with op
    (None stays None). With op=Average, gradient_predivide_factor f divides
    by f before the sum and by size/f after it, as Horovod's. Eagerly the
    reductions run in one tf.function, so that they are in flight together
    (and fused)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op "
                         "!= Average")
    if op == Average and gradient_predivide_factor != 1.0:
        prescale = 1.0 / gradient_predivide_factor
        postscale = gradient_predivide_factor
    else:
        prescale = postscale = 1.0

    def one(grad):
        return mpi_ops_allreduce(grad, device_dense, device_sparse,
                                 compression, op, prescale, postscale)

    def allreduce_grads(grads, variables=None):
        with tf.name_scope(name + "_Allreduce"):
            grads = list(grads)
            if sparse_as_dense:
                grads = [tf.convert_to_tensor(g)
                         if isinstance(g, tf.IndexedSlices) else g
                         for g in grads]
            out = list(grads)
            sets = _group_indices(grads, variables, num_groups, groups)
            if sets is None:
                return [one(g) if g is not None else None for g in grads]
            from hvd.tensorflow import grouped_allreduce
            done = set()
            for idx in sets:
                reduced = grouped_allreduce(
                    [grads[i] for i in idx], device_dense=device_dense,
                    device_sparse=device_sparse, compression=compression,
                    op=op, prescale_factor=prescale,
                    postscale_factor=postscale)
                for i, r in zip(idx, reduced):
                    out[i] = r
                done.update(idx)
            for i, g in enumerate(grads):
                if g is not None and i not in done:
                    out[i] = one(g)
            return out

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


def mpi_ops_allreduce(grad, device_dense, device_sparse, compression, op,
                      prescale, postscale):
    from hvd.tensorflow import allreduce
    return allreduce(grad, device_dense=device_dense,
                     device_sparse=device_sparse, compression=compression,
                     op=op, prescale_factor=prescale,
                     postscale_factor=postscale)


class _DistributedGradientTape(tf.GradientTape):
    def __init__(self, tape, device_dense, device_sparse, compression,
                 sparse_as_dense, op, gradient_predivide_factor, num_groups,
                 groups, persistent=False, watch_accessed_variables=True):
        super(self.__class__, self).__init__(persistent,
                                             watch_accessed_variables)
        self._tape = tape._tape
        self._allreduce_grads = cached_allreduce_grads_fn(
            "DistributedGradientTape", device_dense, device_sparse,
            compression, sparse_as_dense, op, gradient_predivide_factor,
            num_groups, groups)

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
                            groups=None):
    """A tape whose gradient() returns the gradients averaged (op) over
    every rank; the arguments are Horovod's."""
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_DistributedGradientTape.__dict__))
    return cls(gradtape, device_dense, device_sparse, compression,
               sparse_as_dense, op, gradient_predivide_factor, num_groups,
               groups, gradtape._persistent,
               getattr(gradtape, "_watch_accessed_variables", True))


_ = Sum, mpi_ops
