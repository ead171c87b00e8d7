"""libhvd through ctypes: finding the library, the C prototypes, and the
mapping of hvd_status to Python exceptions.

The library is looked for, in this order:

1. ``HVD_LIBRARY`` (a path to libhvd.so): if set, only there;
2. next to this package (``hvd/libhvd.so``, for a copy bundled with it);
3. where ``cmake --install`` put it, relative to the installed package
   (``hvd/_install.py``, written at install time);
4. the dynamic loader's path (``libhvd.so.0``, ``libhvd.so``: LD_LIBRARY_PATH,
   ldconfig's cache).

ctypes releases the GIL around every foreign call (the library is a
ctypes.CDLL, not a PyDLL), so a thread blocked in hvd_wait() or in a
blocking collective, which may run hvd's engine meanwhile, does not stop
the others.
"""

import ctypes
import os
import threading

# The order of HVD_STATUS_MAP in <hvd/types.h>.
STATUS_NAMES = (
    "HVD_OK",
    "HVD_ERR_INVALID_ARG",
    "HVD_ERR_NOT_INITIALIZED",
    "HVD_ERR_MISMATCH",
    "HVD_ERR_PEER_LOST",
    "HVD_ERR_TIMEOUT",
    "HVD_ERR_TRANSPORT",
    "HVD_ERR_AUTH",
    "HVD_ERR_NO_MEMORY",
    "HVD_ERR_UNSUPPORTED",
    "HVD_ERR_SHUTDOWN",
    "HVD_ERR_INTERNAL",
    "HVD_ERR_PEERS_CHANGED",
    "HVD_ERR_PROTOCOL",
)
(HVD_OK, HVD_ERR_INVALID_ARG, HVD_ERR_NOT_INITIALIZED, HVD_ERR_MISMATCH,
 HVD_ERR_PEER_LOST, HVD_ERR_TIMEOUT, HVD_ERR_TRANSPORT, HVD_ERR_AUTH,
 HVD_ERR_NO_MEMORY, HVD_ERR_UNSUPPORTED, HVD_ERR_SHUTDOWN,
 HVD_ERR_INTERNAL, HVD_ERR_PEERS_CHANGED,
 HVD_ERR_PROTOCOL) = range(len(STATUS_NAMES))

# hvd_dtype
UINT8, INT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = range(8)
DTYPE_NAMES = ("uint8", "int8", "int32", "int64", "float16", "bfloat16",
               "float32", "float64")
DTYPE_SIZES = (1, 1, 4, 8, 2, 2, 4, 8)
FLOATING = (FLOAT16, BFLOAT16, FLOAT32, FLOAT64)

# hvd_op
SUM, AVERAGE, MIN, MAX, PRODUCT, ADASUM = range(6)
OP_NAMES = ("sum", "average", "min", "max", "product", "adasum")


class HvdError(Exception):
    """Base of the errors hvd raises for a failed C call.

    ``status`` is the hvd_status (an int), ``status_name`` its name
    (``"HVD_ERR_MISMATCH"``); the message is hvd_last_error()'s sentence.
    """

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.status_name = (STATUS_NAMES[status]
                            if 0 <= status < len(STATUS_NAMES)
                            else "status %d" % status)


class HorovodInternalError(HvdError, RuntimeError):
    """A peer died or stalled, the transport failed, hvd was shut down, or
    (elastic jobs) the job's ranks changed (HVD_ERR_PEERS_CHANGED): Horovod's
    name for the errors an elastic trainer recovers from."""


class HostsUpdatedInterrupt(RuntimeError):
    """Elastic jobs: the launcher announced that workers will be added or
    removed (raised by State.check_host_updates(), on every rank at once).
    hvd.elastic.run then re-forms the job without restoring the committed
    state; skip_sync says whether the state need not be synced afterwards,
    as Horovod's horovod.common.exceptions.HostsUpdatedInterrupt."""

    def __init__(self, skip_sync=False):
        super().__init__("the hosts of the elastic job changed")
        self.skip_sync = skip_sync


class MismatchError(HvdError, RuntimeError):
    """Ranks disagree on an operation (HVD_ERR_MISMATCH)."""


class InvalidArgumentError(HvdError, ValueError, RuntimeError):
    """A bad argument, a name already in flight, or hvd not initialized.

    Also a RuntimeError: Horovod raises RuntimeError where a collective is
    refused by the ranks together (a broadcast or allgather while a rank
    is joined), and trainers written for it catch that."""


class UnsupportedError(HvdError, NotImplementedError):
    """Not supported by this build of libhvd."""


class HvdMemoryError(HvdError, MemoryError):
    """libhvd ran out of memory."""


for _cls in (HvdError, HorovodInternalError, HostsUpdatedInterrupt,
             MismatchError, InvalidArgumentError, UnsupportedError,
             HvdMemoryError):
    _cls.__module__ = "hvd"

_ERROR_CLASSES = {
    HVD_ERR_INVALID_ARG: InvalidArgumentError,
    HVD_ERR_NOT_INITIALIZED: InvalidArgumentError,
    HVD_ERR_MISMATCH: MismatchError,
    HVD_ERR_UNSUPPORTED: UnsupportedError,
    HVD_ERR_NO_MEMORY: HvdMemoryError,
}


def error_for(status, message=None):
    """The exception for status, carrying hvd_last_error()'s sentence (read
    now, on this thread, unless message is given)."""
    if message is None:
        message = last_error() or strerror(status)
    return _ERROR_CLASSES.get(status, HorovodInternalError)(status, message)


def check(status):
    if status != 0:
        raise error_for(status)


_lock = threading.Lock()
_lib = None


def _candidates():
    env = os.environ.get("HVD_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    names = [os.path.join(here, "libhvd.so")]
    try:
        from hvd import _install  # written by cmake --install
        names.append(os.path.normpath(os.path.join(here, _install.LIBDIR,
                                                   "libhvd.so.0")))
    except ImportError:
        pass
    names += ["libhvd.so.0", "libhvd.so"]
    return names


def _declare(lib):
    c_int, c_size, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    c_char_p = ctypes.c_char_p
    handle_p = ctypes.POINTER(c_void_p)
    ptrs = ctypes.POINTER(c_void_p)
    dims = ctypes.POINTER(ctypes.c_int64)
    protos = {
        "hvd_init": (c_int, []),
        "hvd_shutdown": (c_int, []),
        "hvd_initialized": (c_int, []),
        "hvd_rank": (c_int, []),
        "hvd_size": (c_int, []),
        "hvd_local_rank": (c_int, []),
        "hvd_local_size": (c_int, []),
        "hvd_cross_rank": (c_int, []),
        "hvd_cross_size": (c_int, []),
        "hvd_strerror": (c_char_p, [c_int]),
        "hvd_last_error": (c_char_p, []),
        "hvd_allreduce_async": (c_int, [c_char_p, c_void_p, c_void_p, c_size,
                                        c_int, c_int, handle_p]),
        "hvd_grouped_allreduce_async": (c_int, [c_char_p, c_int, ptrs, ptrs,
                                                ctypes.POINTER(c_size), c_int,
                                                c_int, handle_p]),
        "hvd_allreduce_shaped_async": (c_int, [c_char_p, c_void_p, c_void_p,
                                               c_int, dims, c_int, c_int,
                                               handle_p]),
        "hvd_broadcast_async": (c_int, [c_char_p, c_void_p, c_size, c_int,
                                        c_int, handle_p]),
        "hvd_broadcast_shaped_async": (c_int, [c_char_p, c_void_p, c_int, dims,
                                               c_int, c_int, handle_p]),
        "hvd_allgather_async": (c_int, [c_char_p, c_void_p, c_void_p, c_size,
                                        c_int, handle_p]),
        "hvd_alltoall_async": (c_int, [c_char_p, c_void_p, c_size,
                                       ctypes.POINTER(c_size), c_void_p,
                                       c_size, ctypes.POINTER(c_size), c_int,
                                       handle_p]),
        "hvd_reducescatter_shaped_async": (c_int, [c_char_p, c_void_p,
                                                   c_void_p, c_int, dims,
                                                   c_int, c_int, handle_p]),
        "hvd_reducescatter_count": (c_size, [c_size, c_int, c_int]),
        "hvd_wait": (c_int, [c_void_p]),
        "hvd_test": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
        "hvd_barrier": (c_int, []),
        "hvd_join": (c_int, [ctypes.POINTER(c_int)]),
        "hvd_dtype_size": (c_size, [c_int]),
        "hvd_built": (c_int, [c_char_p]),
        "hvd_nccl_version": (c_int, []),
        "hvd_is_homogeneous": (c_int, []),
        "hvd_start_timeline": (c_int, [c_char_p, c_int]),
        "hvd_process_set_create": (c_int, [ctypes.POINTER(c_int), c_int,
                                           ctypes.POINTER(c_int)]),
        "hvd_process_set_remove": (c_int, [c_int]),
        "hvd_process_set_size": (c_int, [c_int]),
        "hvd_process_set_rank": (c_int, [c_int]),
        "hvd_ps_allreduce_async": (c_int, [c_int, c_char_p, c_void_p,
                                           c_void_p, c_size, c_int, c_int,
                                           handle_p]),
        "hvd_ps_allreduce_shaped_async": (c_int, [c_int, c_char_p, c_void_p,
                                                  c_void_p, c_int, dims, c_int,
                                                  c_int, handle_p]),
        "hvd_ps_grouped_allreduce_async": (c_int, [c_int, c_char_p, c_int,
                                                   ptrs, ptrs,
                                                   ctypes.POINTER(c_size),
                                                   c_int, c_int, handle_p]),
        "hvd_ps_broadcast_async": (c_int, [c_int, c_char_p, c_void_p, c_size,
                                           c_int, c_int, handle_p]),
        "hvd_ps_broadcast_shaped_async": (c_int, [c_int, c_char_p, c_void_p,
                                                  c_int, dims, c_int, c_int,
                                                  handle_p]),
        "hvd_ps_allgather_async": (c_int, [c_int, c_char_p, c_void_p,
                                           c_void_p, c_size, c_int,
                                           handle_p]),
        "hvd_ps_alltoall_async": (c_int, [c_int, c_char_p, c_void_p, c_size,
                                          ctypes.POINTER(c_size), c_void_p,
                                          c_size, ctypes.POINTER(c_size),
                                          c_int, handle_p]),
        "hvd_ps_reducescatter_shaped_async": (c_int, [c_int, c_char_p,
                                                      c_void_p, c_void_p,
                                                      c_int, dims, c_int,
                                                      c_int, handle_p]),
        "hvd_ps_barrier": (c_int, [c_int]),
        # The blocking forms, for the synchronous Python calls.
        "hvd_allreduce": (c_int, [c_char_p, c_void_p, c_void_p, c_size,
                                  c_int, c_int]),
        "hvd_ps_allreduce": (c_int, [c_int, c_char_p, c_void_p, c_void_p,
                                     c_size, c_int, c_int]),
        "hvd_ps_grouped_allreduce": (c_int, [c_int, c_char_p, c_int, ptrs,
                                             ptrs, ctypes.POINTER(c_size),
                                             c_int, c_int]),
        "hvd_ps_broadcast": (c_int, [c_int, c_char_p, c_void_p, c_size, c_int,
                                     c_int]),
        "hvd_ps_allgather": (c_int, [c_int, c_char_p, c_void_p, c_void_p,
                                     c_size, c_int]),
        "hvd_ps_alltoall": (c_int, [c_int, c_char_p, c_void_p, c_size,
                                    ctypes.POINTER(c_size), c_void_p, c_size,
                                    ctypes.POINTER(c_size), c_int]),
        "hvd_stop_timeline": (c_int, []),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    # Elastic jobs (docs/elastic.md): optional, so that a libhvd built
    # before them still serves everything else (elastic() then raises
    # UnsupportedError).
    optional = {
        "hvd_elastic_enabled": (c_int, []),
        "hvd_elastic_reset": (c_int, []),
        "hvd_elastic_hosts_updated": (c_int, []),
        "hvd_elastic_generation": (c_int, []),
        # The blocking shaped forms (a libhvd without them: the Python
        # calls wait for the _async forms instead).
        "hvd_ps_allreduce_shaped": (c_int, [c_int, c_char_p, c_void_p,
                                            c_void_p, c_int, dims, c_int,
                                            c_int]),
        "hvd_ps_broadcast_shaped": (c_int, [c_int, c_char_p, c_void_p, c_int,
                                            dims, c_int, c_int]),
        "hvd_ps_reducescatter_shaped": (c_int, [c_int, c_char_p, c_void_p,
                                                c_void_p, c_int, dims, c_int,
                                                c_int]),
    }
    for name, (restype, argtypes) in optional.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue
        fn.restype = restype
        fn.argtypes = argtypes


_shaped_blocking = None


def has_shaped_blocking():
    """Whether the loaded libhvd has hvd_ps_allreduce_shaped and the other
    blocking shaped calls."""
    global _shaped_blocking
    if _shaped_blocking is None:
        _shaped_blocking = hasattr(lib(), "hvd_ps_reducescatter_shaped")
    return _shaped_blocking


def elastic(name):
    """The C function hvd_elastic_<name> of the loaded libhvd; an
    UnsupportedError if this libhvd predates elastic jobs."""
    try:
        return getattr(lib(), "hvd_elastic_" + name)
    except AttributeError:
        raise UnsupportedError(
            HVD_ERR_UNSUPPORTED,
            "hvd_elastic_%s: this libhvd (%s) has no elastic support; "
            "rebuild it" % (name, library_path())) from None


def lib():
    """The loaded libhvd (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            errors = []
            for name in _candidates():
                if os.path.sep in name and not os.path.exists(name):
                    errors.append("%s: no such file" % name)
                    continue
                try:
                    loaded = ctypes.CDLL(name)
                except OSError as e:
                    errors.append(str(e))
                    continue
                _declare(loaded)
                _lib = loaded
                break
            else:
                raise ImportError(
                    "hvd: cannot load libhvd (%s); build it (tools/build) and "
                    "set HVD_LIBRARY=/path/to/libhvd.so, or put its folder "
                    "in LD_LIBRARY_PATH" % "; ".join(errors))
    return _lib


def library_path():
    """The file libhvd was loaded from (loads it if needed)."""
    return lib()._name


def strerror(status):
    return lib().hvd_strerror(status).decode("utf-8", "replace")


def last_error():
    return lib().hvd_last_error().decode("utf-8", "replace")
