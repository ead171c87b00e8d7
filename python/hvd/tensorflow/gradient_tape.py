"""Averaging gradients across ranks: the function DistributedGradientTape,
the TF1 DistributedOptimizer and hvd.tensorflow.keras share, and the
tape itself."""

import tensorflow as tf

from hvd.tensorflow._reduce import GradientReducer, reduce_but_local, ref
from hvd.tensorflow.compression import Compression
from hvd.tensorflow.mpi_ops import Average, _psid, _set_size, size


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
                 process_set=None, scale_local_gradients=True):
        super(self.__class__, self).__init__(persistent,
                                             watch_accessed_variables)
        self._tape = tape._tape
        self._allreduce_grads = cached_allreduce_grads_fn(
            "DistributedGradientTape", device_dense, device_sparse,
            compression, sparse_as_dense, op, gradient_predivide_factor,
            num_groups, groups, process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources = set()

    def register_local_source(self, source):
        """Registers a source (a variable, or a tensor watched by the tape)
        as worker local: its gradient is not reduced; gradient() returns
        this rank's own, divided by the process set's size when
        scale_local_gradients (Horovod's)."""
        self._local_sources.add(ref(source))

    def _set_size(self):
        if self.process_set is None:
            return size()
        return _set_size(_psid(self.process_set))

    def gradient(self, target, sources, output_gradients=None, *args,
                 **kwargs):
        # Horovod's signature has use_generic_names (naming only) there.
        kwargs.pop("use_generic_names", None)
        if args and isinstance(args[0], bool):
            args = args[1:]
        grads = super(self.__class__, self).gradient(
            target, sources, output_gradients, *args, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = reduce_but_local(
            self._allreduce_grads, flat_grads, flat_sources,
            self._local_sources, self.scale_local_gradients,
            self._set_size() if self._local_sources else 1)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target, sources,
                                       output_gradients=None,
                                       use_generic_names=False):
        """gradient(), split as Horovod's: ([(source, gradient)] of the
        registered local sources, [(source, gradient)] of the others), in
        the order of sources (a flat list)."""
        del use_generic_names
        grads = self.gradient(target, sources, output_gradients)
        local, global_ = [], []
        for s, g in zip(tf.nest.flatten(sources),
                        tf.nest.flatten(grads, expand_composites=False)):
            (local if ref(s) in self._local_sources else global_).append(
                (s, g))
        return local, global_


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none,
                            sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=None,
                            scale_local_gradients=True):
    """A tape whose gradient() returns the gradients averaged (op) over
    every rank (of process_set); the arguments are Horovod's. Sources
    registered with register_local_source keep this rank's gradient
    (divided by the set's size when scale_local_gradients)."""
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_DistributedGradientTape.__dict__))
    return cls(gradtape, device_dense, device_sparse, compression,
               sparse_as_dense, op, gradient_predivide_factor, num_groups,
               groups, gradtape._persistent,
               getattr(gradtape, "_watch_accessed_variables", True),
               process_set, scale_local_gradients)


def _is_keras_layer(obj):
    """True when obj is a Layer of its own Keras (Keras 3 or tf_keras, both
    of which a process may hold)."""
    from hvd.tensorflow import _keras_compat
    if _keras_compat.keras_package_of(obj) is None:
        return False
    keras = _keras_compat.keras_of(obj)
    return keras is not None and isinstance(obj, keras.layers.Layer)


def PartialDistributedGradientTape(gradtape, device_dense="",
                                   device_sparse="",
                                   compression=Compression.none,
                                   sparse_as_dense=False, op=Average,
                                   gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None,
                                   process_set=None, local_layers=None,
                                   scale_local_gradients=True):
    """Horovod's: a DistributedGradientTape on which the trainable
    weights of local_layers (a Layer of Keras 3 or of tf_keras, or a list
    of them) are registered as local sources: their gradients are not
    reduced. Without local_layers it is a DistributedGradientTape."""
    if local_layers is None:
        local_layers = []
    elif _is_keras_layer(local_layers):
        local_layers = [local_layers]
    elif not all(_is_keras_layer(layer) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer "
                         "type.")
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense,
        op, gradient_predivide_factor, num_groups, groups, process_set,
        scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
