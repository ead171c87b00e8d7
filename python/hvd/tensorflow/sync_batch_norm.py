"""SyncBatchNormalization: Horovod's batch normalization whose batch
statistics are those of the global batch (every rank's), for the Keras
that TensorFlow ships (Keras 3)."""

import keras
import tensorflow as tf

from hvd.tensorflow.mpi_ops import Sum, _allreduce, size


@keras.saving.register_keras_serializable(package="hvd")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose mean and variance in training
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
    which is the same for equal batches). A mask (Keras 3's) counts its
    True positions only. The gradient goes through the allreduce (its
    gradient is the sum of every rank's), so it is that of the loss summed
    over ranks, as with Horovod's. Every rank must call the layer in
    training together; at size 1 it is a plain BatchNormalization.

    Args:
        fused: Horovod's; only False (or left out) is accepted, as there.
        **kwargs: keras.layers.BatchNormalization's (axis, momentum,
            epsilon, center, scale, initializers, ..., name).
    """

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support "
                             "fused=True.")
        # Keras 3's BatchNormalization has no fused argument; Keras names
        # the layer "sync_batch_normalization" (unique in a model) unless
        # name is given.
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if size() == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        x = inputs
        if mask is None:
            shape = tf.shape(x)
            count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), x.dtype)
            local_sum = tf.reduce_sum(x, axis=axes)
            local_squares = tf.reduce_sum(tf.square(x), axis=axes)
            local_count = tf.fill(tf.shape(local_sum), count)
        else:
            weight = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1),
                                             tf.shape(x)), x.dtype)
            local_sum = tf.reduce_sum(x * weight, axis=axes)
            local_squares = tf.reduce_sum(tf.square(x) * weight, axis=axes)
            local_count = tf.reduce_sum(weight, axis=axes)
        total = _allreduce(tf.stack([local_sum, local_squares, local_count]),
                           op=Sum)
        global_sum, global_squares, global_count = tf.unstack(total)
        mean = tf.math.divide_no_nan(global_sum, global_count)
        # var = E[x^2] - E[x]^2, as Horovod's and Keras' synchronized
        # moments compute it (one allreduce); rounding may take it below 0.
        variance = tf.maximum(
            tf.math.divide_no_nan(global_squares, global_count) -
            tf.square(mean), 0.0)
        return mean, variance
