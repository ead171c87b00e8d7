"""Process sets, as Horovod's (horovod.common.process_sets): a group of the
job's ranks whose collectives run among them alone. Every operation takes
process_set= (default: global_process_set, every rank).

    even = hvd.add_process_set([0, 2])
    if even.included():
        hvd.allreduce(x, process_set=even)

Adding and removing a set is a collective of the whole job (every rank
calls it, in the same order); hvd.init(process_sets=[...]) adds the sets
it is given. hvd needs no HOROVOD_DYNAMIC_PROCESS_SETS to add sets after
init (a set costs nothing while unused); HVD_DYNAMIC_PROCESS_SETS=0 (or
HOROVOD_DYNAMIC_PROCESS_SETS=0) forbids it, as Horovod does without the
variable. A broadcast's root_rank is a rank of the job (hvd.rank()), as in
Horovod.
"""

import ctypes
import os
import weakref

from hvd import _lib as L


class ProcessSet:
    """A set of ranks (sorted); process_set_id is set once it is added
    (by hvd.init(process_sets=...) or add_process_set)."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list "
                             "of process ranks (hvd has no mpi4py "
                             "communicators)")
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list "
                             "of process ranks or an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """The set's size, or None before it is added; ValueError if its
        process_set_id names no set (as Horovod's)."""
        if self.process_set_id is None:
            return None
        return set_size(self.process_set_id)

    def rank(self):
        """This process's rank within the set (None before it is added;
        -1 here if it is not a member). Operations take the job's ranks
        (hvd.rank()) all the same, as Horovod's."""
        if self.process_set_id is None:
            return None
        return L.lib().hvd_process_set_rank(self.process_set_id)

    def included(self):
        """Whether this process is a member (None without ranks)."""
        if self.ranks is None:
            return None
        return L.lib().hvd_rank() in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# The sets given an id since hvd.init() (an elastic reset forgets them).
_added = weakref.WeakSet()


def _dynamic_allowed():
    for var in ("HVD_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS"):
        if os.environ.get(var, "").strip() in ("0", "false", "False"):
            return False
    return True


def _create(ranks):
    """Adds a set of ranks on every rank; its id, or None if a set of
    those ranks exists already."""
    arr = (ctypes.c_int * len(ranks))(*ranks)
    out = ctypes.c_int(-1)
    st = L.lib().hvd_process_set_create(arr, len(ranks), ctypes.byref(out))
    if st != 0:
        err = L.error_for(st)
        if "exists already" in str(err):
            return None
        raise err
    return out.value


def _set_up_global():
    """After hvd_init: the global set's ranks are every rank."""
    global_process_set.ranks = list(range(L.lib().hvd_size()))


def _init_process_sets(process_sets):
    """hvd.init(process_sets=...): adds each set (a ProcessSet or a list
    of ranks) in order, on every rank; "dynamic" adds none. A set equal to
    one before it (or to the job) is left without an id, as Horovod
    does."""
    _set_up_global()
    if process_sets is None or process_sets == "dynamic":
        return
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError("hvd.init: process_sets must be a list of "
                             "hvd.ProcessSet (got %r)" % (ps,))
        ranks = ps.ranks
        if ranks == global_process_set.ranks:
            ps.process_set_id = 0
            continue
        ps.process_set_id = _create(ranks)
        if ps.process_set_id is not None:
            _added.add(ps)


def add_process_set(process_set):
    """Adds a set (a ProcessSet or a list of ranks) on every rank and
    returns it, with its id. Raises ValueError if a set of the same ranks
    exists."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if not _dynamic_allowed():
        raise ValueError("hvd.add_process_set: HVD_DYNAMIC_PROCESS_SETS=0 "
                         "forbids adding process sets after hvd.init()")
    if not L.lib().hvd_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    ps_id = _create(process_set.ranks)
    if ps_id is None:
        raise ValueError("Attempted to add a duplicate process set: %s" %
                         process_set)
    process_set.process_set_id = ps_id
    _added.add(process_set)
    return process_set


def remove_process_set(process_set):
    """Removes a set on every rank; returns whether it was removed (the
    global set and a set never added are not)."""
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    if not _dynamic_allowed():
        raise ValueError("hvd.remove_process_set: HVD_DYNAMIC_PROCESS_SETS=0 "
                         "forbids removing process sets")
    process_set._invalidate()
    return L.lib().hvd_process_set_remove(ps_id) == 0


def _after_elastic_reset():
    """After hvd_elastic_reset: libhvd dropped every set but the global
    one; those ProcessSet objects lose their id (as after
    remove_process_set), and the global set has the new generation's
    ranks."""
    for ps in list(_added):
        if ps is not global_process_set:
            ps._invalidate()
    _added.clear()
    if L.lib().hvd_initialized():
        _set_up_global()
    else:
        global_process_set.ranks = []


def ps_id(process_set):
    """The id of process_set (None: the global set), checked: it must
    have been added."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be an hvd.ProcessSet (got %r)" %
                         (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("%s has not been added: call "
                         "hvd.add_process_set() or pass it to hvd.init()" %
                         process_set)
    return process_set.process_set_id


def set_size(ps):
    """The number of ranks of set ps (an id); ValueError if there is no
    such set, with Horovod's sentence."""
    if not L.lib().hvd_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    n = L.lib().hvd_process_set_size(ps)
    if n < 0:
        raise ValueError("Process set does not exist or has not been "
                         "registered (process_set_id %d: never added, or "
                         "removed since)" % ps)
    return n


def set_rank(ps):
    """This rank's place in set ps (an id); -1 if not a member."""
    return L.lib().hvd_process_set_rank(ps)
