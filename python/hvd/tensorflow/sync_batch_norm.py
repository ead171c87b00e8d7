"""SyncBatchNormalization: Horovod's batch normalization whose batch
statistics are those of the global batch (every rank's), a layer of the
Keras that tf.keras stands for in this process, as Horovod's subclasses
tf.keras.layers.BatchNormalization: Keras 2 (tf_keras) when
TF_USE_LEGACY_KERAS=1 asks for it (or on TensorFlow 2.15 and older), Keras 3
otherwise. keras3_class() and keras2_class() give either one explicitly."""

import tensorflow as tf

from hvd.tensorflow import _keras_compat
from hvd.tensorflow.mpi_ops import Sum, _allreduce, size

_DOC = """{base} whose mean and variance in training
    are computed over the inputs of every rank, as Horovod's
    horovod.tensorflow.SyncBatchNormalization: each rank sums its inputs,
    their squares and their count over the reduction axes, one allreduce
    (Sum) adds the three up, and mean = sum / count, variance =
    sum of squares / count - mean**2 (at least 0). The moving statistics
    are updated from these, so they stay the same on every rank, and the
    output on each rank is that of one BatchNormalization over the
    concatenated global batch.

    Ranks may hold batches of different sizes (even none): the statistics
    are weighted by each rank's count (Horovod averages the ranks' moments,
    which is the same for equal batches). A mask counts its True positions
    only. The gradient goes through the allreduce (its gradient is the sum
    of every rank's), so it is that of the loss summed over ranks, as with
    Horovod's. Every rank must call the layer in training together; at
    size 1 it is a plain BatchNormalization.

    Args:
        fused: Horovod's; only False (or left out) is accepted, as there.
        **kwargs: {base}'s (axis, momentum,
            epsilon, center, scale, initializers, ..., name).
    """


def _check_fused(fused):
    if fused in (True, None):
        raise ValueError("SyncBatchNormalization does not support "
                         "fused=True.")


def _global_moments(x, axes, mask, keep_dims):
    """Mean and variance of x over axes and over every rank's x (mask, of
    x's shape less its last axis, weights the positions)."""
    if mask is None:
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)),
                        x.dtype)
        local_sum = tf.reduce_sum(x, axis=axes, keepdims=keep_dims)
        local_squares = tf.reduce_sum(tf.square(x), axis=axes,
                                      keepdims=keep_dims)
        local_count = tf.fill(tf.shape(local_sum), count)
    else:
        weight = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1),
                                         tf.shape(x)), x.dtype)
        local_sum = tf.reduce_sum(x * weight, axis=axes, keepdims=keep_dims)
        local_squares = tf.reduce_sum(tf.square(x) * weight, axis=axes,
                                      keepdims=keep_dims)
        local_count = tf.reduce_sum(weight, axis=axes, keepdims=keep_dims)
    total = _allreduce(tf.stack([local_sum, local_squares, local_count]),
                       op=Sum)
    global_sum, global_squares, global_count = tf.unstack(total)
    mean = tf.math.divide_no_nan(global_sum, global_count)
    # var = E[x^2] - E[x]^2, as Horovod's and Keras' synchronized moments
    # compute it (one allreduce); rounding may take it below 0.
    variance = tf.maximum(
        tf.math.divide_no_nan(global_squares, global_count) -
        tf.square(mean), tf.zeros([], x.dtype))
    return mean, variance


_classes = {}


def keras3_class():
    """SyncBatchNormalization on Keras 3's BatchNormalization (made on
    first use)."""
    cls = _classes.get("keras3")
    if cls is not None:
        return cls
    import keras

    class SyncBatchNormalization(keras.layers.BatchNormalization):
        def __init__(self, fused=False, **kwargs):
            _check_fused(fused)
            # Keras 3's BatchNormalization has no fused argument; Keras
            # names the layer "sync_batch_normalization" (unique in a
            # model) unless name is given.
            super().__init__(**kwargs)

        def _moments(self, inputs, mask):
            if size() == 1:
                return super()._moments(inputs, mask)
            return _global_moments(inputs, list(self._reduction_axes), mask,
                                   keep_dims=False)

    SyncBatchNormalization.__doc__ = _DOC.format(
        base="keras.layers.BatchNormalization")
    SyncBatchNormalization.__module__ = __name__
    SyncBatchNormalization.__qualname__ = "SyncBatchNormalization"
    cls = keras.saving.register_keras_serializable(package="hvd")(
        SyncBatchNormalization)
    _classes["keras3"] = cls
    return cls


def keras2_class(keras2=None):
    """SyncBatchNormalization on Keras 2's BatchNormalization (tf_keras,
    or keras2 when given: a Keras 2 package), made on first use."""
    if keras2 is None:
        keras2 = _keras_compat.keras2_module()
        if keras2 is None:
            raise ImportError("No Keras 2 (tf_keras) in this process: "
                              "install tf_keras for it.")
    cls = _classes.get(keras2.__name__)
    if cls is not None:
        return cls

    class SyncBatchNormalization(keras2.layers.BatchNormalization):
        def __init__(self, fused=False, **kwargs):
            _check_fused(fused)
            super().__init__(fused=False, **kwargs)

        # Keras 2 computes the batch moments here (Horovod overrides the
        # same method); mask, when Keras gives one, is of inputs' shape
        # less the channels.
        def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims,
                                    mask=None):
            if size() == 1:
                return super()._calculate_mean_and_var(
                    inputs, reduction_axes, keep_dims, mask=mask)
            return _global_moments(inputs, list(reduction_axes), mask,
                                   keep_dims)

    SyncBatchNormalization.__doc__ = _DOC.format(
        base="tf_keras.layers.BatchNormalization")
    SyncBatchNormalization.__module__ = __name__
    SyncBatchNormalization.__qualname__ = "SyncBatchNormalization"
    cls = keras2.utils.register_keras_serializable(package="hvd")(
        SyncBatchNormalization)
    _classes[keras2.__name__] = cls
    return cls


def _tf_keras_class():
    """The class for the Keras that tf.keras is in this process."""
    if _keras_compat.legacy_tf_keras() or _keras_compat.keras3() is None:
        keras2 = _keras_compat.keras2_module()
        if keras2 is not None:
            return keras2_class(keras2)
    return keras3_class()


SyncBatchNormalization = _tf_keras_class()
