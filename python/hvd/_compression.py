"""What every framework's Compression shares: the interface and the
compressor that sends tensors as they are. Each binding adds its FP16
compressor (the casts are the framework's)."""


class Compressor:
    """compress(tensor) -> (tensor to send, ctx); decompress(tensor, ctx)
    -> the tensor in its original form."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
