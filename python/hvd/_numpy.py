"""The numpy backend of hvd/_core.py: how a numpy array is handed to
libhvd."""

import numpy as np

from hvd import _lib as L
from hvd._core import Spec

_NATIVE = {
    np.dtype(np.uint8): L.UINT8,
    np.dtype(np.int8): L.INT8,
    np.dtype(np.int32): L.INT32,
    np.dtype(np.int64): L.INT64,
    np.dtype(np.float16): L.FLOAT16,
    np.dtype(np.float32): L.FLOAT32,
    np.dtype(np.float64): L.FLOAT64,
}
# dtypes the C API lacks, carried in a wider type that holds every value.
_CARRIED = {
    np.dtype(np.int16): L.INT32,
    np.dtype(np.uint16): L.INT32,
    np.dtype(np.uint32): L.INT64,
    np.dtype(np.bool_): L.UINT8,
}
_NP_OF_CODE = {code: dt for dt, code in _NATIVE.items()}


def _native_order(dt):
    return dt.isnative or dt.byteorder == "|"


class NumpyBackend:
    name = "numpy"

    @staticmethod
    def input(x, inplace, what):
        if inplace:
            if not isinstance(x, np.ndarray):
                raise TypeError("%s: needs a numpy array, got %s" %
                                (what, type(x).__name__))
            return x
        return np.asarray(x)

    @staticmethod
    def spec(x, what):
        dt = x.dtype
        key = dt if _native_order(dt) else dt.newbyteorder("=")
        code = _NATIVE.get(key)
        if code is not None:
            # A byte-swapped array is carried in native order.
            return Spec(code, key == dt, False, str(dt))
        code = _CARRIED.get(key)
        if code is not None:
            return Spec(code, False, key == np.bool_, str(dt))
        return NumpyBackend._unsupported(dt, what)

    @staticmethod
    def _unsupported(dt, what):
        raise TypeError(
            "%s: numpy dtype %s is not supported (supported: uint8, int8, "
            "int32, int64, float16, float32, float64; int16, uint16, uint32 "
            "and bool are carried in a wider type)" % (what, dt))

    @staticmethod
    def check_writable(x, what):
        if not x.flags.writeable:
            raise ValueError("%s: the array is read-only" % what)

    @staticmethod
    def direct(x, spec):
        return spec.native and x.flags.c_contiguous

    @staticmethod
    def same_place(x):
        return True

    @staticmethod
    def ready(arrays):
        pass

    @staticmethod
    def numel(x):
        return int(x.size)

    @staticmethod
    def shape(x):
        return x.shape

    @staticmethod
    def ptr(x):
        return x.ctypes.data

    @staticmethod
    def carrier(x, spec):
        return np.array(x, dtype=_NP_OF_CODE[spec.code], order="C", copy=True)

    @staticmethod
    def empty(shape, spec, like=None):
        return np.empty(shape, dtype=_NP_OF_CODE[spec.code])

    @staticmethod
    def empty_like(x, shape=None):
        return np.empty(x.shape if shape is None else shape, dtype=x.dtype)

    @staticmethod
    def assign(dst, src):
        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")

    @staticmethod
    def flatten(x):
        return x.reshape(-1)

    @staticmethod
    def ints(values):
        return np.array(values, dtype=np.int32)

    @staticmethod
    def scale(buf, factor, spec):
        if spec.floating:
            np.multiply(buf, factor, out=buf, casting="unsafe")
        else:
            # Integers: in float64, truncated toward zero (as C casts).
            np.copyto(buf, np.trunc(buf * float(factor)), casting="unsafe")
