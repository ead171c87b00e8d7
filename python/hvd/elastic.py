"""Elastic training, as Horovod's (horovod.common.elastic): a job that
survives the loss of workers and takes in new ones, re-formed in the same
processes (docs/elastic.md).

    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank,
                                    epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

run() syncs the state from rank 0, then calls the function. When a
collective fails because a peer was lost (HorovodInternalError, for one
HVD_ERR_PEERS_CHANGED), every surviving rank restores its last committed
state, the job is re-formed (hvd_elastic_reset: new ranks and size), the
state is synced from the new rank 0 and the function is called again.
When the launcher announces that workers will change, commit() (its
check_host_updates()) raises HostsUpdatedInterrupt on every rank at the
same step, and the job is re-formed without a restore.

hvd.torch.elastic (TorchState, ElasticSampler) and hvd.tensorflow.elastic /
hvd.keras.elastic build on this module.
"""

import enum
import functools
import queue
import time

from hvd import _core
from hvd import _lib as L
from hvd import process_sets as _ps
from hvd._lib import HorovodInternalError, HostsUpdatedInterrupt


# ---------------------------------------------------------------------
# The C side


def is_enabled():
    """True in an elastic job (hvdrun --min-np/--max-np/
    --host-discovery-script started this process); False otherwise, and
    with a libhvd that predates elastic jobs."""
    try:
        return bool(L.elastic("enabled")())
    except L.UnsupportedError:
        return False


def hosts_updated():
    """True if the launcher announced, since this generation formed, that
    workers will be added or removed (this rank's view: see
    State.check_host_updates for the job's)."""
    if not is_enabled():
        return False
    return bool(L.elastic("hosts_updated")())


def generation():
    """The generation of the job this rank belongs to: 0 as started, one
    more at each re-formation; -1 before hvd.init()."""
    return int(L.elastic("generation")())


def reset():
    """Re-forms the job (hvd_elastic_reset) and clears what the Python
    side keeps per generation: operations in flight (failed), the counts
    of unnamed operations, the process sets other than the global one.
    hvd.rank(), hvd.size() etc. then give the new generation's values.

    Raises UnsupportedError outside an elastic job; a HorovodInternalError
    when the launcher ended the job (HVD_ERR_SHUTDOWN) or removed this
    worker (HVD_ERR_AUTH), or the re-formation timed out: hvd is then not
    initialized, and the process should exit."""
    fn = L.elastic("reset")
    st = fn()
    err = L.error_for(st) if st != 0 else None
    _core._forget_requests()
    _ps._after_elastic_reset()
    if err is not None:
        raise err


# ---------------------------------------------------------------------
# State


class HostUpdateResult(enum.IntFlag):
    """What a host update did (Horovod's
    horovod.runner.elastic.worker.HostUpdateResult), the second item of
    the messages State.on_hosts_updated takes. hvd's launcher does not
    say whether workers were added or removed: its notices are mixed."""
    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class _HostMessages(queue.Queue):
    """State._host_messages, as Horovod has it: a queue of (timestamp,
    HostUpdateResult) notices, those on_hosts_updated() puts and, the
    first time it is looked at (empty, qsize, get) after hvdrun announced
    a change of workers to this rank (hvd_elastic_hosts_updated), one for
    that announcement. A State gets a new one at each re-formation."""

    def __init__(self):
        super().__init__()
        self._noticed = False

    def _poll(self):
        if not self._noticed and hosts_updated():
            self._noticed = True
            self.put((time.time(), HostUpdateResult.mixed))

    def empty(self):
        self._poll()
        return super().empty()

    def qsize(self):
        self._poll()
        return super().qsize()

    def get(self, block=True, timeout=None):
        self._poll()
        return super().get(block, timeout)


def _allreduce_max(value, name):
    """The largest of every rank's int value (a small allreduce)."""
    import numpy as np
    from hvd._numpy import NumpyBackend
    arr = np.array([int(value)], dtype=np.int32)
    out = _core.synchronize(_core.allreduce_async(
        NumpyBackend, arr, name, _core.Max, 1.0, 1.0, False, 0))
    return int(out[0])


class State(object):
    """What a training function keeps across re-formations of the job.

    A subclass defines save() (copy the state to host memory), restore()
    (back to the last save) and sync() (every rank takes rank 0's state);
    reset() is for what must change with the job's shape (called after a
    re-formation, before the sync).

    bcast_object: a function (obj) -> rank 0's obj; get_rank: a function
    returning this process's rank (Horovod's arguments).
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        # Horovod's: notices of host updates, and the time of the last
        # one acted on (its training scripts look at both).
        self._host_messages = _HostMessages()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds functions (no arguments) to call after each re-formation,
        e.g. to scale the learning rate to the new hvd.size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called by run() once the job is re-formed: reset(), then the
        reset callbacks in the order they were registered."""
        self._host_messages = _HostMessages()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Queues a notice that hosts were updated at timestamp (seconds,
        as time.time()), update_res a HostUpdateResult (Horovod's
        notification manager calls it; hvd's notices come from libhvd).
        The next check_host_updates() acts on it if it is newer than the
        last one acted on."""
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """save(), then check_host_updates(). A commit copies the state (a
        model's weights from the GPU, say): commit every few batches
        rather than every one, trading the steps a failure loses against
        the time commits take."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank if any rank has been
        told that workers will be added or removed. The ranks agree by a
        small allreduce (max of their flags), so that all raise at the
        same step and none is left in a collective alone. Outside an
        elastic job it returns at once, with no collective."""
        if not is_enabled():
            return
        mine = 1 if L.elastic("hosts_updated")() else 0
        # Notices queued (on_hosts_updated, or libhvd's seen through
        # _host_messages) newer than the last acted on count too.
        messages = getattr(self, "_host_messages", None)
        last = getattr(self, "_last_updated_timestamp", 0)
        while messages is not None and not messages.empty():
            timestamp, _ = messages.get()
            if timestamp > last:
                last = timestamp
                mine = 1
        self._last_updated_timestamp = last
        if _allreduce_max(mine, "hvd.elastic.hosts_updated"):
            # hvd cannot tell added workers from removed ones: the state
            # is always synced after the reset (skip_sync=False).
            raise HostsUpdatedInterrupt(False)

    def save(self):
        """Saves the state to host memory."""
        raise NotImplementedError()

    def restore(self):
        """Restores the last saved state, undoing what was not
        committed."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state rank 0's."""
        raise NotImplementedError()

    def reset(self):
        """Adapts the state to the re-formed job (before its sync)."""
        pass


class ObjectState(State):
    """State of plain Python objects: each keyword argument becomes an
    attribute; save() records their values, restore() sets them back,
    sync() broadcasts rank 0's with bcast_object."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super(ObjectState, self).__init__(bcast_object=bcast_object,
                                          get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr)
                             for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


# ---------------------------------------------------------------------
# The run loop


def run_fn(func, reset):
    """func(state, ...) run elastically, reset being the function that
    re-forms the job (Horovod's horovod.common.elastic.run_fn).

    The state is synced, then func called. On a HorovodInternalError the
    state is restored to its last commit, the job re-formed, the state
    synced, and func called again; on a HostsUpdatedInterrupt the job is
    re-formed without a restore (and synced unless skip_sync). Outside an
    elastic job a HorovodInternalError propagates (the job cannot be
    re-formed). An error of reset itself (the launcher ended the job or
    removed this worker) propagates too."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                if not is_enabled():
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            reset()
            state.on_reset()

    return wrapper


def run(func):
    """Decorator: func(state, *args, **kwargs) runs elastically (see
    run_fn). Its first argument is a State. The function must not be
    called inside a collective, and its first collectives must be those
    of state.sync() (run() calls it): a new worker starts there."""
    return run_fn(func, reset)


__all__ = ["State", "ObjectState", "run", "run_fn", "reset", "is_enabled",
           "hosts_updated", "generation", "HorovodInternalError",
           "HostsUpdatedInterrupt", "HostUpdateResult"]
