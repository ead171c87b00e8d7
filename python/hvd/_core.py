"""The collectives, written once over an array "backend" (numpy's or
torch's, see hvd/_numpy.py and hvd/torch/mpi_ops.py).

Every operation is submitted with the C API's _async form and registered
under an int handle, as Horovod's are; synchronize(handle) waits for it
and returns its output, poll(handle) says whether it has finished. Until
then the request holds a reference to every buffer libhvd reads or writes,
so none of them can be freed under it.

An array hvd can hand to libhvd as it is (on the CPU, C-contiguous, of a
dtype the C API has) is used in place; any other one is copied into a
"carrier" buffer first (int16 and uint16 travel as int32, uint32 as int64,
bool as uint8), on the array's own device, and the result copied back when
the operation is synchronized. Before an array on a GPU goes to libhvd,
the backend's ready() makes the work queued on it visible (torch: its
current stream is synchronized).

The synchronous calls (allreduce_, broadcast_, allgather, ... of the
backends) are not _async + synchronize: they call the C API's blocking
forms (hvd_allreduce, hvd_ps_broadcast_shaped, ...) with the GIL released
(ctypes.CDLL releases it around every foreign call), so the calling thread
runs the engine itself as a C caller's does, and a small allreduce in the
job's set takes the express way (docs/design.md, "Who runs the engine"),
with no handle and no wake-up of the engine thread. Each takes sync=True
below; what is sent, the names and the errors' sentences are those of the
_async form.

Names follow Horovod's: the C operation of allreduce(x, name="w") is
"allreduce.w" (so an allreduce and a broadcast may share a name). Unnamed
operations are passed to libhvd without a name, and the k-th unnamed
operation of a kind matches the k-th of every rank, as in Horovod.
"""

import atexit
import ctypes
import itertools
import os
import pickle
import threading
import warnings

from hvd import _lib as L
from hvd import process_sets as _ps
from hvd._lib import (FLOATING, HvdError, InvalidArgumentError,
                      MismatchError)

# Reduction ops, as hvd.Sum etc. (the values of hvd_op). Adasum is for
# allreduce only (float16/32/64, a power-of-two number of ranks).
Sum, Average, Min, Max, Product = L.SUM, L.AVERAGE, L.MIN, L.MAX, L.PRODUCT
Adasum = L.ADASUM


def resolve_op(op, average):
    """Horovod's rules for op= and the deprecated average=: at most one of
    them; neither means Average."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please "
                         "provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and "
                      "will be removed", DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    if op is None:
        return Average
    if op not in (Sum, Average, Min, Max, Product, Adasum):
        raise ValueError("hvd: op %r is not one of hvd.Sum, hvd.Average, "
                         "hvd.Min, hvd.Max, hvd.Product, hvd.Adasum" % (op,))
    return op


class Spec:
    """How an array's dtype travels: code is the hvd_dtype of the buffer
    libhvd sees; native means the array already has that dtype."""

    __slots__ = ("code", "native", "is_bool", "name")

    def __init__(self, code, native, is_bool, name):
        self.code, self.native = code, native
        self.is_bool, self.name = is_bool, name

    @property
    def floating(self):
        return self.code in FLOATING and not self.is_bool


# ---------------------------------------------------------------------
# Basics

_atexit_registered = False


def init(comm=None, process_sets=None):
    """Joins the job (hvd_init), then adds process_sets (a list of
    hvd.ProcessSet, or "dynamic"), as Horovod's. comm is Horovod's
    argument; hvd supports only its default."""
    global _atexit_registered
    if comm is not None:
        raise NotImplementedError("hvd.init: comm= is not supported; hvd "
                                  "takes its ranks from its launcher")
    L.check(L.lib().hvd_init())
    _ps._init_process_sets(process_sets)
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def shutdown():
    """Leaves the job (hvd_shutdown). Operations still in flight finish
    with an error; their handles are released."""
    lib = L.lib()
    st = lib.hvd_shutdown()
    err = L.error_for(st) if st != 0 else None
    for handle in list(_requests):
        req = _requests.pop(handle, None)
        if req is not None:
            if req.ready is not None:
                req.ready.wait()  # its first step fails at shutdown
            _release(req)
    if err is not None:
        raise err


def _forget_requests():
    """Releases every operation in flight (they have failed: hvd was shut
    down or re-formed) and forgets the counts of unnamed operations, which
    the ranks of a new elastic generation start again from 0."""
    for handle in list(_requests):
        req = _requests.pop(handle, None)
        if req is not None:
            if req.ready is not None:
                req.ready.wait()
            _release(req)
    with _noname_lock:
        _noname_counts.clear()


def _shutdown_at_exit():
    if L.lib().hvd_initialized():
        try:
            shutdown()
        except HvdError:
            pass


def mpi_threads_supported():
    """True: any thread may submit and wait (hvd's engine is
    thread-safe)."""
    return True


def is_initialized():
    return bool(L.lib().hvd_initialized())


def _built(part):
    return bool(L.lib().hvd_built(part.encode()))


def mpi_built():
    """True if libhvd was built with its MPI transport (Open MPI)."""
    return _built("mpi")


def gloo_built():
    """False: hvd has no Gloo; its own TCP transport does that job."""
    return False


def nccl_built():
    """As Horovod's: the NCCL version code libhvd was built with (21805 for
    2.18.5; NCCL is loaded at run time), 0 without NCCL."""
    return int(L.lib().hvd_nccl_version())


def cuda_built():
    """True if libhvd was built with CUDA (device tensors)."""
    return _built("cuda")


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the timeline (Chrome trace JSON, as HVD_TIMELINE) to
    file_path on rank 0, from the next cycle on; mark_cycles adds a
    CYCLE_START mark at each cycle. Other ranks do nothing."""
    _require_init("hvd.start_timeline")
    L.check(L.lib().hvd_start_timeline(os.fsencode(file_path),
                                       1 if mark_cycles else 0))


def stop_timeline():
    """Stops the timeline and closes its file (a complete JSON array)."""
    _require_init("hvd.stop_timeline")
    L.check(L.lib().hvd_stop_timeline())


def is_homogeneous():
    """True if every host runs the same number of ranks."""
    value = L.lib().hvd_is_homogeneous()
    if value < 0:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return bool(value)


def _shape_query(fn):
    value = getattr(L.lib(), fn)()
    if value < 0:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return value


def rank():
    return _shape_query("hvd_rank")


def size():
    return _shape_query("hvd_size")


def local_rank():
    return _shape_query("hvd_local_rank")


def local_size():
    return _shape_query("hvd_local_size")


def cross_rank():
    return _shape_query("hvd_cross_rank")


def cross_size():
    return _shape_query("hvd_cross_size")


def _require_init(what):
    if not L.lib().hvd_initialized():
        raise InvalidArgumentError(
            L.HVD_ERR_NOT_INITIALIZED,
            "%s: hvd is not initialized: call hvd.init() first" % what)


def barrier(process_set=None):
    """Returns once every rank (of process_set) has called it."""
    L.check(L.lib().hvd_ps_barrier(_ps.ps_id(process_set)))


def join(device=-1):
    """For a rank out of data (hvd_join): the others' allreduces go on
    without it until every rank has joined. Returns the last rank to join.
    device is Horovod's argument and is ignored."""
    last = ctypes.c_int(-1)
    L.check(L.lib().hvd_join(ctypes.byref(last)))
    return last.value


# ---------------------------------------------------------------------
# Requests and handles


class _Request:
    """An operation in flight: its C handles, the objects that own the
    buffers they use, what to do once they are done (finish), and for a
    two-step operation the step to submit after the first (then).

    ready, when set, is an Event of the helper thread that runs the second
    step as soon as the first is done (see _advance_in_background); until
    it is set, that thread owns the request."""

    __slots__ = ("handles", "keep", "finish", "then", "error", "info",
                 "ready")

    def __init__(self, handles, keep, finish, then=None):
        self.handles = handles
        self.keep = keep
        self.finish = finish
        self.then = then
        self.error = None
        self.info = None
        self.ready = None


_requests = {}
_handle_ids = itertools.count(1)
_noname_lock = threading.Lock()


def _register(req):
    handle = next(_handle_ids)
    _requests[handle] = req
    return handle


def _release(req):
    """Waits for (and so frees) every C handle the request still holds."""
    lib = L.lib()
    handles, req.handles = req.handles, []
    for h in handles:
        lib.hvd_wait(h)


def _wait_handles(req):
    """Waits for every C handle; raises the first failure once all are
    released."""
    lib = L.lib()
    err = None
    handles, req.handles = req.handles, []
    for h in handles:
        st = lib.hvd_wait(h)
        if st != 0 and err is None:
            err = L.error_for(st)
    if err is not None:
        raise err


def _advance(req):
    """Waits for the first step and submits the second; a failure is kept
    in req.error for synchronize() to raise."""
    try:
        _wait_handles(req)
        then, req.then = req.then, None
        then(req)
    except Exception as e:  # raised again by synchronize()
        req.error = e


def _advance_in_background(req):
    """Runs the second step of req from a helper thread as soon as the
    first is done, so that it is in flight on this rank without waiting
    for synchronize(): another rank may wait for it before doing what this
    rank waits for before synchronizing (as with Horovod, where an
    allgather_async proceeds by itself)."""
    req.ready = threading.Event()

    def run():
        try:
            _advance(req)
        finally:
            req.ready.set()

    threading.Thread(target=run, name="hvd-allgather", daemon=True).start()


def _lookup(handle):
    req = _requests.get(handle)
    if req is None:
        raise ValueError("hvd: handle %r is not an operation in flight (it "
                         "was synchronized already, or never returned by "
                         "an _async call)" % (handle,))
    return req


def _complete(req):
    if req.ready is not None:
        req.ready.wait()
    try:
        while True:
            if req.error is not None:
                raise req.error
            _wait_handles(req)
            if req.then is None:
                break
            then, req.then = req.then, None
            then(req)
        return req.finish()
    finally:
        _release(req)
        req.keep = None


def synchronize(handle):
    """Waits for the operation of handle and returns its output."""
    req = _lookup(handle)
    del _requests[handle]
    return _complete(req)


def synchronize_request(handle):
    """synchronize(), and the request (its info) too."""
    req = _lookup(handle)
    del _requests[handle]
    return _complete(req), req


def poll(handle):
    """True once the operation of handle has finished (synchronize() then
    returns at once; it raises the operation's error if it failed)."""
    return _poll(_lookup(handle))


def _poll(req):
    # A group (grouped_async): finished when every part is.
    if isinstance(req.keep, list) and req.keep and \
            all(isinstance(r, _Request) for r in req.keep):
        return req.then is None or all(_poll(r) for r in req.keep)
    if req.ready is not None and not req.ready.is_set():
        return False
    lib = L.lib()
    done = ctypes.c_int(0)
    while req.error is None:
        for h in req.handles:
            lib.hvd_test(h, ctypes.byref(done))
            if not done.value:
                return False
        if req.then is None:
            return True
        _advance(req)
    return True


# ---------------------------------------------------------------------
# Submitting


def _cname(kind, name):
    if name is None:
        return None
    return ("%s.%s" % (kind, name)).encode("utf-8")


def _check_handle(st, h):
    if st != 0:
        raise L.error_for(st)
    return h.value


def _dims(shape):
    return (ctypes.c_int64 * len(shape))(*shape)


# Each takes ps, the id of the process set it runs in (0: every rank), and
# sync: with it, the C API's blocking form runs the operation to its end on
# this thread and the function returns None (a failure raises), else it
# returns the handle of the _async form.

def _blocking(st):
    """The result of a blocking C call: None, or its failure raised with
    this thread's sentence."""
    if st != 0:
        raise L.error_for(st)


def _allreduce_c(cname, send, recv, count, code, op, shape=(), ps=0,
                 sync=False):
    """With a shape of two or more dimensions, ranks must agree on it
    (as Horovod checks shapes), not only on the count."""
    if sync and len(shape) >= 2 and L.has_shaped_blocking():
        return _blocking(L.lib().hvd_ps_allreduce_shaped(
            ps, cname, send, recv, len(shape), _dims(shape), code, op))
    if sync and len(shape) < 2:
        lib = L.lib()
        return _blocking(
            lib.hvd_allreduce(cname, send, recv, count, code, op) if ps == 0
            else lib.hvd_ps_allreduce(ps, cname, send, recv, count, code, op))
    h = ctypes.c_void_p()
    if len(shape) >= 2:
        st = L.lib().hvd_ps_allreduce_shaped_async(
            ps, cname, send, recv, len(shape), _dims(shape), code, op,
            ctypes.byref(h))
    else:
        st = L.lib().hvd_ps_allreduce_async(ps, cname, send, recv, count,
                                            code, op, ctypes.byref(h))
    return _sync_or_handle(st, h, sync)


def _sync_or_handle(st, h, sync):
    """The handle of a submitted _async call; with sync (the blocking form
    missing from this libhvd) it is waited for at once."""
    h = _check_handle(st, h)
    if sync:
        _wait_c(h)
        return None
    return h


def _grouped_c(cname, sends, recvs, counts, code, op, ps=0, sync=False):
    n = len(sends)
    arrays = ((ctypes.c_void_p * n)(*sends), (ctypes.c_void_p * n)(*recvs),
              (ctypes.c_size_t * n)(*counts))
    if sync:
        return _blocking(L.lib().hvd_ps_grouped_allreduce(
            ps, cname, n, *arrays, code, op))
    h = ctypes.c_void_p()
    st = L.lib().hvd_ps_grouped_allreduce_async(ps, cname, n, *arrays, code,
                                                op, ctypes.byref(h))
    return _check_handle(st, h)


def _broadcast_c(cname, buf, count, code, root, shape=(), ps=0, sync=False):
    if sync and len(shape) >= 2 and L.has_shaped_blocking():
        return _blocking(L.lib().hvd_ps_broadcast_shaped(
            ps, cname, buf, len(shape), _dims(shape), code, root))
    if sync and len(shape) < 2:
        return _blocking(L.lib().hvd_ps_broadcast(ps, cname, buf, count,
                                                  code, root))
    h = ctypes.c_void_p()
    if len(shape) >= 2:
        st = L.lib().hvd_ps_broadcast_shaped_async(
            ps, cname, buf, len(shape), _dims(shape), code, root,
            ctypes.byref(h))
    else:
        st = L.lib().hvd_ps_broadcast_async(ps, cname, buf, count, code,
                                            root, ctypes.byref(h))
    return _sync_or_handle(st, h, sync)


def _allgather_c(cname, send, recv, count, code, ps=0, sync=False):
    if sync:
        return _blocking(L.lib().hvd_ps_allgather(ps, cname, send, recv,
                                                  count, code))
    h = ctypes.c_void_p()
    st = L.lib().hvd_ps_allgather_async(ps, cname, send, recv, count, code,
                                        ctypes.byref(h))
    return _check_handle(st, h)


def _members(ps):
    """The number of ranks of set ps (the job's size for 0)."""
    return size() if ps == 0 else _ps.set_size(ps)


def _place(ps):
    """This rank's place in set ps (its rank for 0)."""
    return rank() if ps == 0 else _ps.set_rank(ps)


_noname_counts = {}


def _noname(kind, ps):
    """"noname.<k>" for the k-th unnamed two-step operation of kind in
    set ps (the set's members count them among themselves)."""
    with _noname_lock:
        k = _noname_counts.get((kind, ps), 0)
        _noname_counts[(kind, ps)] = k + 1
    return "noname.%d" % k


def _wait_c(h):
    L.check(L.lib().hvd_wait(h))


def _c_op(op, spec, what):
    """The hvd_op for op on spec's dtype: a bool travels as uint8, where
    max is logical or and min logical and. (What Adasum needs, a
    power-of-two number of ranks and a floating dtype, libhvd checks: its
    sentence is the UnsupportedError's, a NotImplementedError as Horovod
    raises.)"""
    if not spec.is_bool:
        return op
    if op in (Sum, Max):
        return Max
    if op in (Min, Product):
        return Min
    raise TypeError("%s: op=%s is not defined on bool tensors" %
                    (what, "Adasum" if op == Adasum else "Average"))


def _check_scale(spec, pre, post, what):
    if (pre != 1 or post != 1) and spec.is_bool:
        raise TypeError("%s: prescale_factor/postscale_factor do not apply "
                        "to bool tensors" % what)


class _Reduce:
    """One array of an allreduce: the buffer libhvd reduces (buf, in place,
    or send -> buf), and the output it ends in (out)."""

    __slots__ = ("x", "spec", "buf", "send", "out", "count")

    def __init__(self, B, x, spec, pre, inplace, what):
        """spec is B.spec(x), its factors checked by the caller."""
        if inplace:
            B.check_writable(x, what)
        self.x, self.spec, self.count = x, spec, B.numel(x)
        # With a prescale factor the input is scaled in a copy, so that a
        # failed submission leaves it as it was.
        if B.direct(x, spec) and inplace and pre == 1:
            self.buf = self.out = x
            self.send = B.ptr(x)
        elif B.direct(x, spec) and pre == 1:
            self.buf = self.out = B.empty_like(x)
            self.send = B.ptr(x)
        else:
            self.buf = B.carrier(x, spec)
            if pre != 1:
                B.scale(self.buf, pre, spec)
            self.send = B.ptr(self.buf)
            if inplace:
                self.out = x
            elif spec.native and B.same_place(x):
                self.out = self.buf
            else:
                self.out = B.empty_like(x)

    def finish(self, B, post):
        if post != 1:
            B.scale(self.buf, post, self.spec)
        if self.out is not self.buf:
            B.assign(self.out, self.buf)
        return self.out


def allreduce_async(B, x, name, op, pre, post, inplace, ps=0, sync=False):
    """A handle; with sync, the output (the operation run to its end)."""
    what = "hvd.allreduce" + ("_" if inplace else "")
    x = B.input(x, inplace, what)
    spec = B.spec(x, what)
    cop = _c_op(op, spec, what)
    _check_scale(spec, pre, post, what)
    r = _Reduce(B, x, spec, pre, inplace, what)
    B.ready((x, r.buf))
    h = _allreduce_c(_cname("allreduce", name), r.send, B.ptr(r.buf), r.count,
                     r.spec.code, cop, tuple(B.shape(x)), ps, sync)
    if sync:
        return r.finish(B, post)
    return _register(_Request([h], r, lambda: r.finish(B, post)))


def grouped_allreduce_async(B, xs, name, op, pre, post, inplace, ps=0,
                            sync=False):
    """One grouped allreduce per dtype among xs (the C call takes one
    dtype); with several, the name of each gets ".<dtype>". With sync,
    the list of outputs: a group of one dtype runs as the blocking call,
    several as handles waited for at once (every part is in flight before
    any is waited for, as with the _async form)."""
    what = "hvd.grouped_allreduce" + ("_" if inplace else "")
    xs = [B.input(x, inplace, what) for x in xs]
    if not xs:
        raise ValueError("%s: needs at least one tensor" % what)
    specs, keys = [], []
    for x in xs:
        spec = B.spec(x, what)
        _check_scale(spec, pre, post, what)
        specs.append(spec)
        keys.append((spec.code, _c_op(op, spec, what)))
    parts = [_Reduce(B, x, spec, pre, inplace, what)
             for x, spec in zip(xs, specs)]
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    if sync and len(groups) == 1:
        (code, cop), = groups
        B.ready([r.x for r in parts] + [r.buf for r in parts])
        _grouped_c(_cname("grouped_allreduce", name),
                   [r.send for r in parts], [B.ptr(r.buf) for r in parts],
                   [r.count for r in parts], code, cop, ps, sync=True)
        return [r.finish(B, post) for r in parts]
    handles = []
    req = _Request(handles, parts, None)
    B.ready([r.x for r in parts] + [r.buf for r in parts])
    try:
        for (code, cop), idx in groups.items():
            cname = _cname("grouped_allreduce", name)
            if name is not None and len(groups) > 1:
                cname = _cname("grouped_allreduce",
                               "%s.%s" % (name, L.DTYPE_NAMES[code]))
            handles.append(_grouped_c(cname, [parts[i].send for i in idx],
                                      [B.ptr(parts[i].buf) for i in idx],
                                      [parts[i].count for i in idx], code,
                                      cop, ps))
    except BaseException:
        _release(req)
        raise
    req.finish = lambda: [r.finish(B, post) for r in parts]
    if sync:
        return _complete(req)
    return _register(req)


def broadcast_async(B, x, root_rank, name, inplace, ps=0, sync=False):
    """A handle; with sync, the output."""
    what = "hvd.broadcast" + ("_" if inplace else "")
    x = B.input(x, inplace, what)
    spec = B.spec(x, what)
    if inplace:
        B.check_writable(x, what)
    if inplace and B.direct(x, spec):
        buf = out = x
    else:
        buf = B.carrier(x, spec)
        if inplace:
            out = x
        elif spec.native and B.same_place(x):
            out = buf
        else:
            out = B.empty_like(x)
    B.ready((buf,))
    h = _broadcast_c(_cname("broadcast", name), B.ptr(buf), B.numel(buf),
                     spec.code, int(root_rank), tuple(B.shape(x)), ps, sync)

    def finish():
        if out is not buf:
            B.assign(out, buf)
        return out

    if sync:
        return finish()
    return _register(_Request([h], (x, buf, out), finish))


# The shape record each rank contributes to an allgather's first step:
# ndim, dtype code, bool flag, first dimension, and up to _DIMS more
# dimensions (the last one the product of any beyond).
_DIMS = 8
_META = 4 + _DIMS


def _meta_of(shape, spec):
    rest = list(shape[1:])
    if len(rest) > _DIMS:
        tail = 1
        for d in rest[_DIMS - 1:]:
            tail *= d
        rest = rest[:_DIMS - 1] + [tail]
    rest += [-1] * (_DIMS - len(rest))
    return [len(shape), spec.code, int(spec.is_bool), shape[0]] + rest


def _describe(meta):
    ndim, code, is_bool, d0 = meta[:4]
    dims = [d0] + [d for d in meta[4:4 + max(ndim - 1, 0)]]
    return "%s %s" % ("bool" if is_bool else L.DTYPE_NAMES[code],
                      list(dims))


def allgather_async(B, x, name, eager=True, ps=0, sync=False):
    """Gathers x from every rank along its first dimension, which may
    differ between ranks (as in Horovod): a first step gathers every
    rank's shape, the second the data (padded to the largest first
    dimension when they differ). With eager, a helper thread submits the
    second step as soon as the first is done; without, synchronize() does
    (for a caller that synchronizes at once). With sync, both steps are
    blocking calls and the result is (output, the request) (its info: the
    first dimension of every rank)."""
    what = "hvd.allgather"
    x = B.input(x, False, what)
    spec = B.spec(x, what)
    _require_init(what)
    nranks = _members(ps)
    shape = tuple(B.shape(x)) or (1,)
    if name is None:
        name = _noname("allgather", ps)
    if B.direct(x, spec):
        src = x
    else:
        src = B.carrier(x, spec)
    B.ready((x, src))
    meta_send = (ctypes.c_int64 * _META)(*_meta_of(shape, spec))
    meta_recv = (ctypes.c_int64 * (_META * nranks))()
    h = _allgather_c(_cname("allgather_shape", name), meta_send, meta_recv,
                     _META, L.INT64, ps, sync)

    def second(req):
        metas = [list(meta_recv[r * _META:(r + 1) * _META])
                 for r in range(nranks)]
        firsts = [m[3] for m in metas]
        if any(m[:3] + m[4:] != metas[0][:3] + metas[0][4:] for m in metas):
            raise MismatchError(
                L.HVD_ERR_MISMATCH,
                "hvd.allgather('%s'): ranks disagree on the dtype or on the "
                "dimensions after the first: %s" %
                (name, "; ".join("rank %d: %s" % (r, _describe(m))
                                 for r, m in enumerate(metas))))
        rest = shape[1:]
        row = 1
        for d in rest:
            row *= d
        total = sum(firsts)
        gathered = B.empty((total,) + tuple(rest), spec, like=x)
        cname = _cname("allgather", name)
        flat_src = B.flatten(src)
        if all(f == firsts[0] for f in firsts):
            B.ready((flat_src, gathered))
            step = _allgather_c(cname, B.ptr(flat_src), B.ptr(gathered),
                                firsts[0] * row, spec.code, ps, sync)
            padded = None
        else:
            most = max(firsts)
            send = B.empty((most * row,), spec, like=x)
            send[:shape[0] * row] = flat_src
            padded = B.empty((nranks * most * row,), spec, like=x)
            B.ready((send, padded))
            step = _allgather_c(cname, B.ptr(send), B.ptr(padded),
                                most * row, spec.code, ps, sync)
            req.keep = (req.keep, send)
        if step is not None:
            req.handles.append(step)
        req.keep = (req.keep, gathered, padded, flat_src)
        req.info = firsts

        def finish():
            if padded is not None:
                flat = B.flatten(gathered)
                at = 0
                for r, f in enumerate(firsts):
                    flat[at:at + f * row] = padded[r * most * row:
                                                   r * most * row + f * row]
                    at += f * row
            if spec.native and B.same_place(x):
                return gathered
            out = B.empty_like(x, (total,) + tuple(rest))
            B.assign(out, gathered)
            return out

        req.finish = finish

    if sync:
        req = _Request([], (x, src, meta_send, meta_recv), None)
        second(req)
        return req.finish(), req
    req = _Request([h], (x, src, meta_send, meta_recv), None, second)
    if eager:
        _advance_in_background(req)
    return _register(req)


def _alltoall_c(cname, send, count, sendcounts, recv, recvcap, code, ps=0,
                sync=False):
    n = len(sendcounts) if sendcounts is not None else 0
    counts = (ctypes.c_size_t * n)(*sendcounts) if n else None
    if sync:
        return _blocking(L.lib().hvd_ps_alltoall(
            ps, cname, send, count, counts, recv, recvcap, None, code))
    h = ctypes.c_void_p()
    st = L.lib().hvd_ps_alltoall_async(ps, cname, send, count, counts, recv,
                                       recvcap, None, code, ctypes.byref(h))
    return _check_handle(st, h)


def _invalid(message):
    return InvalidArgumentError(L.HVD_ERR_INVALID_ARG, message)




def alltoall_async(B, x, splits, name, eager=True, with_splits=False, ps=0,
                   sync=False):
    """Sends splits[r] rows of x (along its first dimension) to every rank
    r, in rank order, and gathers what every rank sends this one (as
    Horovod's alltoall): a first step tells each rank how many rows come
    and checks that the ranks agree on the dtype and the other dimensions,
    the second moves the data. The request's info is the list of rows
    received from each rank; with_splits, the output is (output, those
    rows as the backend's int32 array). With sync, both steps are blocking
    calls and the result is the output."""
    what = "hvd.alltoall"
    x = B.input(x, False, what)
    spec = B.spec(x, what)
    _require_init(what)
    nranks = _members(ps)
    shape = tuple(B.shape(x))
    if not shape:
        raise _invalid("%s: needs a tensor of at least one dimension" % what)
    rows = shape[0]
    if splits is None:
        if rows % nranks != 0:
            raise _invalid("%s: splits not provided, but first dimension of "
                           "tensor is not an even multiple of the number of "
                           "workers (%d rows, %d ranks)" %
                           (what, rows, nranks))
        splits = [rows // nranks] * nranks
    else:
        kind = str(getattr(splits, "dtype", "int"))
        if "int" not in kind:
            raise _invalid("%s: alltoall expects splits to contain 32-bit "
                           "integer elements, got %s" % (what, kind))
        if hasattr(splits, "tolist"):
            splits = splits.tolist()
        if any(isinstance(v, float) for v in splits):
            raise _invalid("%s: alltoall expects splits to contain 32-bit "
                           "integer elements, got %s" % (what, splits))
        splits = [int(v) for v in splits]
        if len(splits) != nranks:
            raise _invalid("%s: Number of entries in splits (%d) does not "
                           "equal number of workers (%d)" %
                           (what, len(splits), nranks))
        if any(v < 0 for v in splits):
            raise _invalid("%s: splits must not be negative: %s" %
                           (what, splits))
        if sum(splits) > rows:
            raise _invalid("%s: Sum of splits entries (%d) is greater than "
                           "the first dimension of tensor (%d)" %
                           (what, sum(splits), rows))
    if name is None:
        name = _noname("alltoall", ps)
    rest = shape[1:]
    row = 1
    for d in rest:
        row *= d
    src = x if B.direct(x, spec) else B.carrier(x, spec)
    B.ready((x, src))
    meta = _meta_of(shape, spec)
    meta_send = (ctypes.c_int64 * (_META * nranks))()
    for r in range(nranks):  # the first dimension: rows for rank r
        meta_send[r * _META:(r + 1) * _META] = meta[:3] + [splits[r]] + \
            meta[4:]
    meta_recv = (ctypes.c_int64 * (_META * nranks))()
    h = _alltoall_c(_cname("alltoall_shape", name), meta_send,
                    _META * nranks, None, meta_recv, _META * nranks, L.INT64,
                    ps, sync)

    def second(req):
        metas = [list(meta_recv[r * _META:(r + 1) * _META])
                 for r in range(nranks)]
        if any(m[:3] + m[4:] != meta[:3] + meta[4:] for m in metas):
            raise MismatchError(
                L.HVD_ERR_MISMATCH,
                "hvd.alltoall('%s'): ranks disagree on the dtype or on the "
                "dimensions after the first: %s" %
                (name, "; ".join("rank %d: %s" % (r, _describe(m))
                                 for r, m in enumerate(metas))))
        received = [m[3] for m in metas]
        total = sum(received)
        out = B.empty((total,) + tuple(rest), spec, like=x)
        flat_src = B.flatten(src)
        B.ready((flat_src, out))
        step = _alltoall_c(
            _cname("alltoall", name), B.ptr(flat_src), rows * row,
            [v * row for v in splits], B.ptr(out), total * row, spec.code,
            ps, sync)
        if step is not None:
            req.handles.append(step)
        req.keep = (req.keep, out, flat_src)
        req.info = received

        def finish():
            result = out
            if not (spec.native and B.same_place(x)):
                result = B.empty_like(x, (total,) + tuple(rest))
                B.assign(result, out)
            return (result, B.ints(received)) if with_splits else result

        req.finish = finish

    if sync:
        req = _Request([], (x, src, meta_send, meta_recv), None)
        second(req)
        return req.finish()
    req = _Request([h], (x, src, meta_send, meta_recv), None, second)
    if eager:
        _advance_in_background(req)
    return _register(req)


def reducescatter_count(rows, rank_, ps=0):
    """The rows rank_ (a place in set ps) gets of a reducescatter of rows
    (the first ranks one more, as Horovod splits)."""
    return int(L.lib().hvd_reducescatter_count(rows, _members(ps), rank_))


def reducescatter_async(B, x, name, op, pre, post, ps=0, sync=False):
    """Reduces x across ranks and leaves each rank its rows of the result
    (its first dimension cut as Horovod cuts it). A handle; with sync, the
    output."""
    what = "hvd.reducescatter"
    x = B.input(x, False, what)
    spec = B.spec(x, what)
    cop = _c_op(op, spec, what)
    _check_scale(spec, pre, post, what)
    _require_init(what)
    shape = tuple(B.shape(x))
    if not shape:
        raise _invalid("%s: needs a tensor of at least one dimension" % what)
    mine = (reducescatter_count(shape[0], _place(ps), ps),) + shape[1:]
    if B.direct(x, spec) and pre == 1:
        src = x
    else:
        src = B.carrier(x, spec)
        if pre != 1:
            B.scale(src, pre, spec)
    buf = B.empty(mine, spec, like=x)
    B.ready((x, src, buf))
    args = (ps, _cname("reducescatter", name), B.ptr(src), B.ptr(buf),
            len(shape), _dims(shape), spec.code, cop)
    if sync and L.has_shaped_blocking():
        h = _blocking(L.lib().hvd_ps_reducescatter_shaped(*args))
    else:
        h = ctypes.c_void_p()
        st = L.lib().hvd_ps_reducescatter_shaped_async(*args, ctypes.byref(h))
        h = _sync_or_handle(st, h, sync)

    def finish():
        if post != 1:
            B.scale(buf, post, spec)
        if spec.native and B.same_place(x):
            return buf
        out = B.empty_like(x, mine)
        B.assign(out, buf)
        return out

    if sync:
        return finish()
    return _register(_Request([h], (x, src, buf), finish))


def grouped_async(submit, xs, name, what):
    """Several operations as one handle: submit(x, name) for each x (named
    "<name>_<i>of<n>", as Horovod names the parts of a group); synchronize
    returns the list of outputs, with info the list of each one's info."""
    xs = list(xs)
    if not xs:
        raise ValueError("%s: needs at least one tensor" % what)
    handles = []
    try:
        for i, x in enumerate(xs):
            part = (None if name is None
                    else "%s_%dof%d" % (name, i + 1, len(xs)))
            handles.append(submit(x, part))
    except BaseException:
        for h in handles:
            try:
                synchronize(h)
            except Exception:
                pass
        raise
    reqs = [_lookup(h) for h in handles]
    for h in handles:
        del _requests[h]

    def then(req):
        outs, infos = [], []
        for r in reqs:
            outs.append(_complete(r))
            infos.append(r.info)
        req.info = infos
        req.finish = lambda: outs

    return _register(_Request([], reqs, None, then))


# ---------------------------------------------------------------------
# Python objects


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Pickles obj on root_rank and returns it, unpickled, on every rank.
    (The default name does not depend on obj, which the other ranks often
    pass as None.)"""
    _require_init("hvd.broadcast_object")
    ps = _ps.ps_id(process_set)
    name = name or "object"
    me = rank()
    if me == root_rank:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = ctypes.c_int64(len(data))
    else:
        n = ctypes.c_int64(0)
    _broadcast_c(_cname("broadcast", name + ".sz"), ctypes.byref(n), 1,
                 L.INT64, int(root_rank), ps=ps, sync=True)
    if me == root_rank:
        buf = (ctypes.c_char * n.value).from_buffer_copy(data)
    else:
        buf = (ctypes.c_char * n.value)()
    _broadcast_c(_cname("broadcast", name + ".t"), buf, n.value, L.UINT8,
                 int(root_rank), ps=ps, sync=True)
    if me == root_rank:
        return obj
    return pickle.loads(bytes(buf))


def allgather_object(obj, name=None, process_set=None):
    """Pickles obj on every rank; returns the list of every rank's object
    in rank order. The lengths are gathered first, then the bytes padded
    to the longest."""
    _require_init("hvd.allgather_object")
    ps = _ps.ps_id(process_set)
    name = name or "object"
    nranks = _members(ps)
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    n = ctypes.c_int64(len(data))
    lengths = (ctypes.c_int64 * nranks)()
    _allgather_c(_cname("allgather", name + ".sz"), ctypes.byref(n),
                 lengths, 1, L.INT64, ps, sync=True)
    most = max(lengths)
    send = (ctypes.c_char * most)()
    ctypes.memmove(send, data, len(data))
    recv = (ctypes.c_char * (most * nranks))()
    _allgather_c(_cname("allgather", name + ".t"), send, recv, most,
                 L.UINT8, ps, sync=True)
    raw = bytes(recv)
    return [pickle.loads(raw[r * most:r * most + lengths[r]])
            for r in range(nranks)]
