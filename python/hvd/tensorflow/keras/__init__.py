"""hvd.tensorflow.keras: a drop-in for ``horovod.tensorflow.keras`` on the
Kerases that TensorFlow ships: Keras 3 (``import keras``, and ``tf.keras``
on TensorFlow 2.16+) and Keras 2 (``tf_keras``, which ``tf.keras`` is with
TF_USE_LEGACY_KERAS=1, with its legacy optimizers too). Each optimizer,
model and callback is handled as its own Keras requires, so both may be
used in one process::

    import hvd.tensorflow.keras as hvd

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(
                      0.01 * hvd.size())), loss="mse")
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

``hvd.keras`` is the same module under Horovod's other name.
"""

import tensorflow as tf

import hvd.tensorflow as _hvd
from hvd.tensorflow import (  # noqa: F401 (re-exported)
                            Average, Sum, Min, Max, Product, Compression,
                            init, shutdown, is_initialized, size, local_size,
                            cross_size, rank, local_rank, cross_rank,
                            mpi_built, nccl_built)

# The rest of what horovod.tensorflow.keras re-exports, where this
# hvd.tensorflow has it.
_OPTIONAL = ("Adasum", "start_timeline", "stop_timeline",
             "mpi_threads_supported", "mpi_enabled", "gloo_enabled",
             "gloo_built", "ddl_built", "ccl_built", "cuda_built",
             "rocm_built", "is_homogeneous", "ProcessSet",
             "global_process_set", "add_process_set", "remove_process_set",
             "join", "barrier", "broadcast_object", "allgather_object",
             "broadcast_variables")
for _n in _OPTIONAL:
    if hasattr(_hvd, _n):
        globals()[_n] = getattr(_hvd, _n)
del _n

from hvd.tensorflow.keras import callbacks  # noqa: E402,F401
from hvd.tensorflow.keras import _optimizer as _impl  # noqa: E402


def DistributedOptimizer(optimizer, name=None,
                         device_dense='', device_sparse='',
                         compression=Compression.none,
                         sparse_as_dense=False,
                         gradient_predivide_factor=1.0,
                         op=Average,
                         backward_passes_per_step=1,
                         average_aggregated_gradients=False,
                         num_groups=0,
                         groups=None,
                         process_set=None,
                         scale_local_gradients=True):
    """Wraps a keras.optimizers.Optimizer so that the gradients it applies
    are first combined (averaged by default) over all ranks.

    Args:
        optimizer: the Keras optimizer to wrap. The result is an instance of
            a subclass of its class (same name and config), made afresh
            from its config; a built optimizer's state is copied over.
        name: prefix of the allreduce operations' names (default
            "Distributed" + the optimizer's class name).
        device_dense, device_sparse: devices for dense and sparse
            allreduces, passed to hvd.tensorflow.allreduce.
        compression: Compression.none or Compression.fp16 (gradients are
            sent as float16).
        sparse_as_dense: allreduce IndexedSlices gradients as dense tensors.
        gradient_predivide_factor: with op=Average, gradients are scaled by
            1/gradient_predivide_factor before the sum and
            gradient_predivide_factor/size after it.
        op: Average or Sum.
        backward_passes_per_step: gradients are summed locally over this
            many calls; the sums are allreduced and applied on every
            backward_passes_per_step-th call only (the others just count
            the iteration).
        average_aggregated_gradients: divide those sums by
            backward_passes_per_step.
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an integer n (the gradients go in n grouped allreduces) or a
            list of lists of variables (each list one grouped allreduce, a
            variable in none a group of its own).
        process_set: the ranks the gradients are averaged among (an
            hvd.ProcessSet that was added; None: every rank). Only its
            members may step this optimizer.
        scale_local_gradients: divide the gradients of variables registered
            with opt.register_local_var (not allreduced) by size.
    """
    if process_set is not None:
        from hvd.process_sets import ps_id
        if ps_id(process_set) == 0:
            process_set = None  # the global set
    if op != Average and op != Sum:
        raise ValueError('op currently only supports Average and Sum')
    if num_groups != 0:
        import warnings
        warnings.warn('Parameter `num_groups` has been replaced by `groups` '
                      'and will be removed in v0.23.0.', DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if not (isinstance(groups, list) or groups > 0):
            raise ValueError('groups should be a non-negative integer or '
                             'a list of list of tf.Variable.')
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    return _impl.create_distributed_optimizer(
        optimizer=optimizer, name=name, device_dense=device_dense,
        device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups, scale_local_gradients=scale_local_gradients,
        process_set=process_set)


def PartialDistributedOptimizer(optimizer, name=None,
                                device_dense='', device_sparse='',
                                compression=Compression.none,
                                sparse_as_dense=False,
                                gradient_predivide_factor=1.0,
                                op=Average,
                                backward_passes_per_step=1,
                                average_aggregated_gradients=False,
                                groups=None, process_set=None,
                                local_layers=None,
                                scale_local_gradients=True):
    """Horovod's (horovod.keras): a DistributedOptimizer whose gradients
    for the trainable weights of local_layers (a keras Layer or a list of
    them) are not allreduced but kept local (divided by size when
    scale_local_gradients, by the process set's size)."""
    if local_layers is None:
        local_layers = []
    elif _is_layer(local_layers):
        local_layers = [local_layers]
    elif not all(_is_layer(l) for l in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer "
                         "type.")
    opt = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense,
        device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def _is_layer(obj):
    """A Keras 3 or a Keras 2 (tf_keras) layer."""
    from hvd.tensorflow import _keras_compat as _compat
    if _compat.keras_package_of(obj) is None:
        return False
    keras = _compat.keras_of(obj)
    return isinstance(obj, keras.layers.Layer)


def broadcast_global_variables(root_rank):
    """Horovod's: broadcasts TF1 global variables, which TensorFlow 2 in
    eager mode does not have; use BroadcastGlobalVariablesCallback or
    hvd.broadcast_variables(model.variables, root_rank) instead."""
    fn = getattr(_hvd, "broadcast_global_variables", None)
    if fn is None:
        raise NotImplementedError(
            "broadcast_global_variables() needs TF1 global variables; in "
            "TensorFlow 2 use callbacks.BroadcastGlobalVariablesCallback("
            "root_rank) or broadcast_variables(model.variables, root_rank)")
    return fn(root_rank)


def allreduce(value, name=None, average=None, prescale_factor=1.0,
              postscale_factor=1.0, op=None, compression=Compression.none):
    """Allreduces a tensor-compatible value (default op: Average) and
    returns the result as a tensor."""
    return _hvd.allreduce(tf.constant(value, name=name), average=average,
                          prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, op=op,
                          compression=compression)


def allgather(value, name=None):
    """Concatenates a tensor-compatible value from every rank along its
    first dimension."""
    return _hvd.allgather(tf.constant(value, name=name))


def broadcast(value, root_rank, name=None):
    """Returns root_rank's value of a tensor-compatible value."""
    return _hvd.broadcast(tf.constant(value, name=name), root_rank)


if hasattr(_hvd, "reducescatter"):
    def reducescatter(value, name=None, op=Average):
        """Reduces a tensor-compatible value and scatters the result."""
        return _hvd.reducescatter(tf.constant(value, name=name), op=op)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Loads a saved Keras model (.keras or .h5) and wraps its optimizer in
    DistributedOptimizer(compression=compression), keeping the optimizer's
    saved state (slots, iterations, learning rate).

    The model is loaded by the Keras that tf.keras stands for: tf_keras
    (Keras 2) when TF_USE_LEGACY_KERAS=1 or legacy_opts=True, Keras 3
    otherwise.

    Args:
        filepath: the saved model's path.
        custom_optimizers: Optimizer subclasses (not keras built-ins) the
            file may name; they are wrapped as the built-ins are.
        custom_objects: other classes or functions to deserialize with.
        compression: the DistributedOptimizer's compression.
        legacy_opts: the file's optimizer is one of tf_keras'
            optimizers.legacy (Keras 2 only; Keras 3 has none).
    """
    from hvd.tensorflow import _keras_compat as _compat
    if legacy_opts or _compat.legacy_tf_keras() or \
            _compat.keras3() is None:
        keras2 = _compat.keras2_module()
        if keras2 is None:
            import tf_keras as keras2
        return _load_model_keras2(keras2, filepath, custom_optimizers,
                                  custom_objects, compression, legacy_opts)
    return _load_model_keras3(filepath, custom_optimizers, custom_objects,
                              compression)


def _load_model_keras2(keras2, filepath, custom_optimizers, custom_objects,
                       compression, legacy_opts):
    # As Horovod: the file's optimizer is deserialized straight into the
    # distributed class, so its saved slots load into it.
    if legacy_opts:
        base = keras2.optimizers.legacy.Optimizer
    else:
        base = keras2.optimizers.Optimizer
    options = _impl.hvd_options(None, '', '', compression, False, 1.0,
                                Average, 1, False, None, True, None)
    objects = {}
    for cls in base.__subclasses__():
        if cls.__name__ in ("RestoredOptimizer",) or \
                cls.__name__.startswith("LossScaleOptimizer"):
            continue
        wrapped = _impl.distributed_class(cls, options)
        objects[cls.__name__] = wrapped
        objects[cls.__name__.lower()] = wrapped
    for cls in custom_optimizers or ():
        objects[cls.__name__] = _impl.distributed_class(cls, options)
    if custom_objects:
        objects.update(custom_objects)
    model = keras2.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not _impl.is_distributed(opt):
        # Deserialized without our classes (the optimizers' format looks
        # built-in names up in tf_keras first): wrapped now, built on the
        # model's variables, taking the loaded state.
        from hvd.tensorflow.keras import _optimizer2
        new = DistributedOptimizer(opt, compression=compression)
        _optimizer2.copy_state(opt, new, list(model.trainable_variables))
        model.optimizer = new
    return model


def _load_model_keras3(filepath, custom_optimizers, custom_objects,
                       compression):
    import keras

    objects = {}
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
        try:
            objects[keras.saving.get_registered_name(cls)] = cls
        except Exception:  # pragma: no cover
            pass
    if custom_objects:
        objects.update(custom_objects)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not _impl.is_distributed(opt):
        new = DistributedOptimizer(opt, compression=compression)
        model.optimizer = new
        # What a later model.save() writes as the compiled optimizer.
        compile_config = getattr(model, "_compile_config", None)
        config = getattr(compile_config, "config", None)
        if isinstance(config, dict) and config.get("optimizer") is opt:
            config["optimizer"] = new
    return model


__all__ = [
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size",
    "rank", "local_rank", "cross_rank", "mpi_built", "nccl_built", "Average",
    "Sum", "Min", "Max", "Product", "Compression", "callbacks",
    "DistributedOptimizer", "PartialDistributedOptimizer",
    "broadcast_global_variables", "allreduce",
    "allgather", "broadcast", "load_model",
] + [n for n in _OPTIONAL if n in globals()] + (
    ["reducescatter"] if "reducescatter" in globals() else [])

from hvd.tensorflow.keras import elastic  # noqa: E402,F401
