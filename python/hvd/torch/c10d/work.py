"""The Work objects of the c10d backend "hvd": an hvd operation in flight,
its future, and the buffers it is done in.

wait() synchronizes hvd's operation; get_future() (what DDP's comm hooks
use) is completed by one helper thread that waits for hvd's operations in
the order they were submitted, which is the order every rank submits them
in. An hvd failure is raised by wait() and set on the future with hvd's
sentence.
"""

import atexit
import queue
import threading

import torch
from torch._C._distributed_c10d import Work as _Work

from hvd import _core
from hvd import _lib as L
from hvd.torch.mpi_ops import TorchBackend as _B


def _unsupported(message):
    return L.UnsupportedError(L.HVD_ERR_UNSUPPORTED, message)


# ---------------------------------------------------------------------
# Work objects and their futures


class _Completer:
    """One daemon thread that completes the futures asked for, in the
    order their operations were submitted.

    Setting a future runs torch's C++, which releases and takes the GIL
    again; a daemon thread that takes the GIL after the interpreter began
    to finalize is ended there, which inside C++ aborts the process. So
    futures are set under settling, and at exit (atexit) the helper waits
    for the one being set and sets no more."""

    def __init__(self):
        self._queue = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()
        self.settling = threading.RLock()
        self.exiting = False

    def put(self, work):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run,
                                                name="hvd-c10d-futures",
                                                daemon=True)
                self._thread.start()
                atexit.register(self._at_exit)
        self._queue.put(work)

    def _run(self):
        while True:
            self._queue.get()._finish()

    def _at_exit(self):
        # Bounded: a future's callbacks are the only thing waited for.
        if self.settling.acquire(timeout=30):
            self.exiting = True
            self.settling.release()


_completer = _Completer()


class HvdWork(_Work):
    """An hvd operation in flight (handle, of hvd._core), the tensors its
    future gives (result), and what to do once it is done (after: copying a
    carrier buffer back into the caller's tensors)."""

    def __init__(self, handle, result, after=None):
        super().__init__()
        self._handle = handle
        self._result = result
        self._after = after
        self._lock = threading.Lock()
        self._done = handle is None
        self._error = None
        self._future = None
        if self._done and after is not None:
            after()

    def _finish(self):
        with self._lock:
            if self._done:
                return
            try:
                _core.synchronize(self._handle)
                if self._after is not None:
                    self._after()
            except Exception as e:  # raised by wait(), set on the future
                self._error = _bare(e)
            self._done = True
            future = self._future
        if future is not None:
            self._settle(future)

    def _settle(self, future):
        with _completer.settling:
            if _completer.exiting:
                return
            if self._error is not None:
                future.set_exception(self._error)
            else:
                future.set_result(self._result)

    def wait(self, timeout=None):
        """Waits for hvd's operation (hvd's own timeouts apply); raises its
        error."""
        self._finish()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        if self._done:
            return True
        # The helper thread may be waiting for it: then it is not done.
        if not self._lock.acquire(blocking=False):
            return False
        try:
            ready = self._done or _core.poll(self._handle)
        finally:
            self._lock.release()
        if ready:
            self._finish()
        return ready

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def synchronize(self):
        self.wait()

    def get_future(self):
        with self._lock:
            if self._future is not None:
                return self._future
            self._future = torch.futures.Future()
            done = self._done
        if done:
            self._settle(self._future)
        else:
            _completer.put(self)
        return self._future


def _bare(error):
    """error without its traceback, whose frames hold the work that holds
    the error: that cycle, with the future's C++ side in it, is otherwise
    freed only at the interpreter's exit, where freeing it aborts."""
    return error.with_traceback(None)


def _done_work(result):
    return HvdWork(None, result)


# ---------------------------------------------------------------------
# Buffers: the caller's tensor when libhvd can use it as it is, else a
# contiguous copy of a dtype the C API has


def _spec(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: needs tensors, got %s" %
                        (what, type(t).__name__))
    return _B.spec(t, what)


def _source(t, spec):
    return t if _B.direct(t, spec) else _B.carrier(t, spec)


def _target(t, spec):
    """A buffer libhvd may write the result for t into."""
    if _B.direct(t, spec):
        return t
    return _B.empty(tuple(t.shape), spec, like=t)


def _copy_back(pairs):
    """After: copies each carrier buffer into its caller's tensor."""
    pairs = [(out, buf) for out, buf in pairs if out is not buf]
    if not pairs:
        return None

    def after():
        with torch.no_grad():
            for out, buf in pairs:
                out.copy_(buf.view(out.shape))
    return after


def _submit(handles, keep):
    """Registers C handles as one operation of hvd._core (whose
    synchronize() waits for them and releases them)."""
    return _core._register(_core._Request(list(handles), keep,
                                          lambda: None))


def _check(st, h):
    return _core._check_handle(st, h)


def _same(tensors, what):
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError("%s: the tensors must have one dtype, got %s" %
                        (what, sorted(str(d) for d in dtypes)))


class _Then(HvdWork):
    """A work done when inner is, then runs after (copying out)."""

    def __init__(self, inner, result, after):
        super().__init__(None, result)
        self._done = False
        self._inner = inner
        self._then = after

    def _finish(self):
        with self._lock:
            if self._done:
                return
            try:
                self._inner.wait()
                if self._then is not None:
                    self._then()
            except Exception as e:
                self._error = _bare(e)
            self._done = True
            future = self._future
        if future is not None:
            self._settle(future)

    def is_completed(self):
        if not self._done and self._inner.is_completed():
            self._finish()
        return self._done


class _Joined(_Then):
    """A work done when every one of works is."""

    def __init__(self, works, result):
        super().__init__(None, result, None)
        self._works = works

    def _finish(self):
        with self._lock:
            if self._done:
                return
            for w in self._works:
                try:
                    w.wait()
                except Exception as e:
                    if self._error is None:
                        self._error = _bare(e)
            self._done = True
            future = self._future
        if future is not None:
            self._settle(future)

    def is_completed(self):
        if not self._done and all(w.is_completed() for w in self._works):
            self._finish()
        return self._done


def _scatter_rows(flat, outs):
    with torch.no_grad():
        at = 0
        for o in outs:
            k = o.numel()
            o.copy_(flat[at:at + k].view(o.shape))
            at += k
