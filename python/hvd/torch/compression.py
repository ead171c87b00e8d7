"""Gradient compression for the wire, as horovod.torch's: Compression.none
and Compression.fp16 (floating tensors travel as float16 and come back in
their own dtype)."""

import torch

from hvd._compression import Compressor, NoneCompressor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes; about three
    significant digits)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.type(ctx)
        return tensor


class Compression:
    """The compressors: Compression.none, Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
