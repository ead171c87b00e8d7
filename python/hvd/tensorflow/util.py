"""Small helpers with horovod.tensorflow.util's names."""

import tensorflow as tf


def _executing_eagerly():
    """True when TensorFlow runs eagerly here (not while a tf.function or a
    graph is being built)."""
    return tf.executing_eagerly()
