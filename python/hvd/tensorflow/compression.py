"""Gradient compression for the wire, as horovod.tensorflow.Compression:
``Compression.none`` leaves tensors as they are, ``Compression.fp16`` casts
floating-point tensors to float16 before the collective and back after."""

import tensorflow as tf

from hvd._compression import Compressor, NoneCompressor


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
