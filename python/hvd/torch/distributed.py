"""A torch.distributed (c10d) backend named "hvd": DistributedDataParallel,
FSDP and the torch.distributed collectives over libhvd, with one changed
word in a trainer:

    import hvd.torch  # registers the backend
    torch.distributed.init_process_group(backend="hvd")

The backend is a Python subclass of torch's ProcessGroup (no C++ compiled
against torch's headers, so no rebuild with each torch release) over the
_async operations of hvd.torch. Every collective returns a Work whose
wait() synchronizes hvd's operation; its get_future() (what DDP's comm
hooks use) is completed by one helper thread that waits for hvd's
operations in the order they were submitted, which is the order every
rank submits them in. An hvd failure (a lost peer, ranks that disagree on
a shape) is raised by wait() and set on the future, with hvd's sentence.

Ranks are hvd's: the creator calls hvd.init() if the script has not, and
checks that hvd's rank and size are torch's. The store torch passes is not
used. A subgroup (torch.distributed.new_group) is an hvd process set,
created by every rank as torch's new_group is called by every rank.

libhvd has no point-to-point operations: send and recv raise a sentence
saying so. docs/python.md ("DDP and FSDP on hvd") lists what is there.
"""

import ctypes

import torch
import torch.distributed as dist

from hvd import _core
from hvd import _lib as L
from hvd import process_sets as _ps
from hvd.torch.c10d.launch import _wrap_env_rendezvous
from hvd.torch.c10d.work import (HvdWork, _B, _Joined, _Then, _check,
                                 _copy_back, _done_work, _same,
                                 _scatter_rows, _source, _spec, _submit,
                                 _target, _unsupported)

BACKEND_NAME = "hvd"

_R = dist.ReduceOp.RedOpType
_OPS = {
    _R.SUM: _core.Sum,
    _R.AVG: _core.Average,
    _R.MIN: _core.Min,
    _R.MAX: _core.Max,
    _R.PRODUCT: _core.Product,
}


def _reduce_op(opts):
    """The reduce op of opts: an options object, or (pg.allreduce(tensors,
    op) called by hand) the op itself."""
    if opts is None:
        return dist.ReduceOp.SUM
    return getattr(opts, "reduceOp", opts)


def _hvd_op(reduce_op, dtype, what):
    """(hvd op, prescale factor) for torch's reduce op: PREMUL_SUM is a sum
    of the inputs times its factor; BAND and BOR are min and max on bool
    tensors (logical and, or)."""
    kind = getattr(reduce_op, "op", reduce_op)
    if kind in _OPS:
        return _OPS[kind], 1.0
    if kind == _R.PREMUL_SUM:
        factor = reduce_op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return _core.Sum, float(factor)
    if dtype == torch.bool and kind in (_R.BAND, _R.BOR):
        return (_core.Min if kind == _R.BAND else _core.Max), 1.0
    raise _unsupported("%s: the hvd backend has no %s (it has SUM, AVG, "
                       "MIN, MAX, PRODUCT, PREMUL_SUM, and BAND and BOR on "
                       "bool tensors)" % (what, kind))


# ---------------------------------------------------------------------
# The process group


def _on_gpu(*tensors):
    return any(t.is_cuda for t in tensors)


def _via_host(submit, outputs, inputs):
    """What libhvd does not do in GPU memory yet (reducescatter, alltoall):
    submit(host outputs, host inputs) on copies in host memory, the
    outputs copied back to the GPU once it is done."""
    host_in = [t.detach().cpu() for t in inputs]
    host_out = [torch.empty(t.shape, dtype=t.dtype) for t in outputs]

    def after():
        with torch.no_grad():
            for t, h in zip(outputs, host_out):
                t.copy_(h)
    return _Then(submit(host_out, host_in), outputs, after)


class ProcessGroupHvd(dist.ProcessGroup):
    """torch's ProcessGroup over hvd: ps is the hvd process set (0: every
    rank), ranks the job's ranks in it (a group rank r is ranks[r])."""

    def __init__(self, rank, size, ps=0, ranks=None):
        super().__init__(rank, size)
        self._ps = ps
        self._ranks = list(range(size)) if ranks is None else list(ranks)

    def getBackendName(self):
        return BACKEND_NAME

    # torch's base class keeps the group's name in its backends, which a
    # Python group has none of: the names are kept here.
    _group_name = ""
    _group_desc = ""

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    def __repr__(self):
        return "ProcessGroupHvd(rank=%d, size=%d, ps=%d)" % (
            self.rank(), self.size(), self._ps)

    # -- reductions

    def allreduce(self, tensors, opts=None):
        what = "hvd backend: allreduce"
        reduce_op = _reduce_op(opts)
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        tensors = list(tensors)
        if len(tensors) == 1:
            t = tensors[0]
            op, pre = _hvd_op(reduce_op, t.dtype, what)
            h = _core.allreduce_async(_B, t, None, op, pre, 1.0, True,
                                      self._ps)
            return HvdWork(h, tensors)
        return self._grouped(tensors, reduce_op, what)

    def allreduce_coalesced(self, tensors, opts=None):
        what = "hvd backend: allreduce_coalesced"
        reduce_op = _reduce_op(opts)
        return self._grouped(list(tensors), reduce_op, what)

    def _grouped(self, tensors, reduce_op, what):
        if not tensors:
            return _done_work([])
        op, pre = _hvd_op(reduce_op, tensors[0].dtype, what)
        h = _core.grouped_allreduce_async(_B, tensors, None, op, pre, 1.0,
                                          True, self._ps)
        return HvdWork(h, tensors)

    def reduce(self, tensors, opts=None):
        """The root reduces in place; the others reduce a copy, so that
        their tensors are left as they were (as Gloo does)."""
        what = "hvd backend: reduce"
        t = tensors[0]
        op, pre = _hvd_op(opts.reduceOp, t.dtype, what)
        buf = t if self.rank() == opts.rootRank else t.detach().clone()
        h = _core.allreduce_async(_B, buf, None, op, pre, 1.0, True,
                                  self._ps)
        return HvdWork(h, [t])

    def reduce_scatter_single(self, output, input, opts=None):
        if _on_gpu(output, input):
            return _via_host(lambda o, i: self._reduce_scatter(
                o[0], i[0], opts), [output], [input])
        return self._reduce_scatter(output, input, opts)

    def _reduce_scatter(self, output, input, opts):
        what = "hvd backend: reduce_scatter_tensor"
        reduce_op = _reduce_op(opts)
        _same([output, input], what)
        n = self.size()
        if input.numel() != n * output.numel():
            raise ValueError("%s: the input has %d elements, not the "
                             "group's size (%d) times the output's (%d)" %
                             (what, input.numel(), n, output.numel()))
        if input.numel() * input.element_size() <= _SMALL_REDUCE_SCATTER:
            return self._reduce_scatter_small(output, input, reduce_op, what)
        spec = _spec(input, what)
        op, pre = _hvd_op(reduce_op, input.dtype, what)
        cop = _core._c_op(op, spec, what)
        src = _source(input, spec)
        if pre != 1.0:
            src = _B.carrier(input, spec) if src is input else src
            _B.scale(src, pre, spec)
        dst = _target(output, spec)
        _B.ready((src, dst))
        # One row per element: the first dimension is cut evenly.
        dims = _core._dims((input.numel(),))
        h = ctypes.c_void_p()
        st = L.lib().hvd_ps_reducescatter_shaped_async(
            self._ps, None, _B.ptr(src), _B.ptr(dst), 1, dims, spec.code,
            cop, ctypes.byref(h))
        handle = _submit([_check(st, h)], (src, dst, dims))
        return HvdWork(handle, [output], _copy_back([(output, dst)]))

    def _reduce_scatter_small(self, output, input, reduce_op, what):
        """A small reduce-scatter as an allreduce of a copy, of which this
        rank keeps its part: the allreduce of a few bytes travels in one
        exchange (hvd's steps carry it), a reducescatter takes two."""
        buf = input.detach().clone().reshape(-1)
        op, pre = _hvd_op(reduce_op, buf.dtype, what)
        h = _core.allreduce_async(_B, buf, None, op, pre, 1.0, True,
                                  self._ps)
        m = output.numel()
        mine = buf[self.rank() * m:(self.rank() + 1) * m]

        def after():
            output.copy_(mine.view(output.shape))
        return HvdWork(h, [output], after)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, input_lists, opts=None):
        what = "hvd backend: reduce_scatter"
        output, inputs = outputs[0], list(input_lists[0])
        _same([output] + inputs, what)
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self.reduce_scatter_single(output, flat, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts)
                 for o, i in zip(outputs, inputs)]
        return _Joined(works, list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- broadcast, gathers

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        t = tensors[0]
        h = _core.broadcast_async(_B, t, self._ranks[root], None, True,
                                  self._ps)
        return HvdWork(h, tensors)

    def _allgather_into(self, output, input, what):
        """Submits an allgather of input into output (the group's size
        times its elements); returns the HvdWork."""
        _same([output, input], what)
        n = self.size()
        if output.numel() != n * input.numel():
            raise ValueError("%s: the output has %d elements, not the "
                             "group's size (%d) times the input's (%d)" %
                             (what, output.numel(), n, input.numel()))
        spec = _spec(input, what)
        src = _source(input, spec)
        dst = _target(output, spec)
        _B.ready((src, dst))
        h = _core._allgather_c(None, _B.ptr(src), _B.ptr(dst), src.numel(),
                               spec.code, self._ps)
        handle = _submit([h], (src, dst))
        return HvdWork(handle, [output], _copy_back([(output, dst)]))

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_into(output, input,
                                    "hvd backend: all_gather_into_tensor")

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None):
        what = "hvd backend: all_gather"
        outs, t = list(output_lists[0]), inputs[0]
        _same(outs + [t], what)
        if len(outs) != self.size():
            raise ValueError("%s: %d output tensors for a group of %d" %
                             (what, len(outs), self.size()))
        flat = torch.empty((self.size() * t.numel(),), dtype=t.dtype,
                           device=t.device)
        inner = self._allgather_into(flat, t.reshape(-1), what)
        return _Then(inner, output_lists, lambda: _scatter_rows(flat, outs))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts)
                 for o, i in zip(outputs, inputs)]
        return _Joined(works, list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        works = [self.allgather([outs], [t], opts)
                 for outs, t in zip(output_lists, inputs)]
        return _Joined(works, output_lists)

    def gather(self, output_lists, inputs, opts=None):
        """An allgather, of which the root keeps the result."""
        what = "hvd backend: gather"
        t = inputs[0]
        flat = torch.empty((self.size() * t.numel(),), dtype=t.dtype,
                           device=t.device)
        inner = self._allgather_into(flat, t.reshape(-1), what)
        if self.rank() != opts.rootRank:
            return _Then(inner, [], None)
        outs = list(output_lists[0])
        return _Then(inner, output_lists, lambda: _scatter_rows(flat, outs))

    def gather_single(self, output, input, opts=None):
        what = "hvd backend: gather_into_tensor"
        if self.rank() == opts.rootRank:
            return self._allgather_into(output, input, what)
        flat = torch.empty((self.size() * input.numel(),),
                           dtype=input.dtype, device=input.device)
        return self._allgather_into(flat, input.reshape(-1), what)

    def scatter(self, outputs, input_lists, opts=None):
        parts = list(input_lists[0]) if len(input_lists) else []
        if _on_gpu(outputs[0], *parts):
            return _via_host(lambda o, i: self._scatter(
                o, [i] if len(i) else [], opts), [outputs[0]], parts)
        return self._scatter(outputs, input_lists, opts)

    def _scatter(self, outputs, input_lists, opts):
        """An alltoall in which only the root sends: each rank gets its
        part."""
        what = "hvd backend: scatter"
        out = outputs[0]
        n, k = self.size(), out.numel()
        spec = _spec(out, what)
        if self.rank() == opts.rootRank:
            parts = list(input_lists[0])
            _same(parts + [out], what)
            send = torch.cat([p.reshape(-1) for p in parts])
            send = _B.carrier(send, spec) if not spec.native else send
            counts = [k] * n
        else:
            send = _B.empty((0,), spec, like=out)
            counts = [0] * n
        dst = _target(out, spec)
        _B.ready((send, dst))
        h = _core._alltoall_c(None, _B.ptr(send), send.numel(), counts,
                              _B.ptr(dst), k, spec.code, self._ps)
        handle = _submit([h], (send, dst))
        return HvdWork(handle, outputs, _copy_back([(out, dst)]))

    # -- alltoall

    def all_to_all_single(self, output, input, output_splits, input_splits,
                          opts=None):
        if _on_gpu(output, input):
            return _via_host(lambda o, i: self._all_to_all_single(
                o[0], i[0], input_splits), [output], [input])
        return self._all_to_all_single(output, input, input_splits)

    def _all_to_all_single(self, output, input, input_splits):
        what = "hvd backend: all_to_all_single"
        _same([output, input], what)
        n = self.size()
        spec = _spec(input, what)
        rows = input.shape[0] if input.dim() else 1
        row = input.numel() // rows if rows else 0
        if input_splits:
            counts = [int(s) * row for s in input_splits]
        else:
            if rows % n:
                raise ValueError("%s: %d rows do not split evenly among %d "
                                 "ranks" % (what, rows, n))
            counts = [rows // n * row] * n
        src = _source(input, spec)
        dst = _target(output, spec)
        _B.ready((src, dst))
        h = _core._alltoall_c(None, _B.ptr(src), src.numel(), counts,
                              _B.ptr(dst), dst.numel(), spec.code, self._ps)
        handle = _submit([h], (src, dst))
        return HvdWork(handle, [output], _copy_back([(output, dst)]))

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        outputs, inputs = list(outputs), list(inputs)
        if _on_gpu(*outputs, *inputs):
            return _via_host(self._alltoall, outputs, inputs)
        return self._alltoall(outputs, inputs)

    def _alltoall(self, outputs, inputs):
        what = "hvd backend: all_to_all"
        _same(outputs + inputs, what)
        send = torch.cat([t.reshape(-1) for t in inputs])
        recv = torch.empty((sum(t.numel() for t in outputs),),
                           dtype=send.dtype, device=send.device)
        spec = _spec(send, what)
        src = _source(send, spec)
        dst = _target(recv, spec)
        _B.ready((src, dst))
        h = _core._alltoall_c(None, _B.ptr(src), src.numel(),
                              [t.numel() for t in inputs], _B.ptr(dst),
                              dst.numel(), spec.code, self._ps)
        handle = _submit([h], (src, dst, send, recv))

        def after():
            with torch.no_grad():
                if dst is not recv:
                    recv.copy_(dst)
                _scatter_rows(recv, outputs)
        return HvdWork(handle, outputs, after)

    # -- barrier, point-to-point

    def barrier(self, opts=None):
        L.check(L.lib().hvd_ps_barrier(self._ps))
        return _done_work([])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier()

    def send(self, tensors, dst, tag=0):
        raise _unsupported("hvd backend: send is not supported: libhvd has "
                           "no point-to-point operations (make a group with "
                           "dist.new_group(backend='gloo') for send and "
                           "recv)")

    def recv(self, tensors, src, tag=0):
        raise _unsupported("hvd backend: recv is not supported: libhvd has "
                           "no point-to-point operations (make a group with "
                           "dist.new_group(backend='gloo') for send and "
                           "recv)")

    def recv_anysource(self, tensors, tag=0):
        return self.recv(tensors, -1, tag)

    # -- subgroups

    def new_group(self, ranks, timeout=None, backend=None, pg_options=None,
                  group_name=None, group_desc=None):
        """torch's new_group, called by every rank of the job: the hvd
        process set of ranks (created by every rank, as libhvd requires);
        None on a rank outside it. A group of another backend (gloo) is
        that backend's, made as torch makes it."""
        if self._ps != 0:
            raise _unsupported("hvd backend: new_group must be called on "
                               "the default group")
        if backend is not None and str(backend).lower() not in (
                BACKEND_NAME, "undefined"):
            return _foreign_group(ranks, backend, timeout, pg_options,
                                  group_name, group_desc)
        # torch names a group by a count, or by a hash of its ranks with
        # use_local_synchronization=True, where only the members call
        # this: libhvd's process set would wait for the others forever.
        if group_name is not None and not str(group_name).isdigit():
            raise _unsupported(
                "hvd backend: new_group(use_local_synchronization=True) is "
                "not supported: an hvd process set is made by every rank")
        ranks = sorted(int(r) for r in ranks)
        ps = _set_of(ranks)
        me = _core.rank()
        if me not in ranks:
            return None
        group = ProcessGroupHvd(ranks.index(me), len(ranks), ps, ranks)
        group.setGroupName(group_name or "")
        group.setGroupDesc(group_desc or "")
        return group


def _foreign_group(ranks, backend, timeout, pg_options, group_name,
                   group_desc):
    """new_group(backend="gloo") (or another backend) under the hvd
    default group: libraries make a Gloo group beside the default one for
    CPU coordination (checkpointing, object collectives). torch hands every
    new_group to the default group once it has one, so the group is made
    here the way torch makes it (on the default store, by every rank), and
    left for torch to register under its name."""
    c10d = dist.distributed_c10d
    make = getattr(c10d, "_new_process_group_helper", None)
    forget = getattr(c10d, "_cleanup_process_group_global_state", None)
    if make is None or forget is None:
        raise _unsupported(
            "hvd backend: new_group(backend=%r) under the hvd default group "
            "needs torch's _new_process_group_helper (torch %s has none); "
            "subgroups of this torch are hvd groups" %
            (backend, torch.__version__))
    ranks = sorted(int(r) for r in ranks)
    me = _core.rank()
    pg, _ = make(len(ranks), ranks.index(me) if me in ranks else None,
                 ranks, backend, c10d._get_default_store(), group_name,
                 backend_options=pg_options,
                 timeout=timeout or c10d.default_pg_timeout,
                 group_desc=group_desc)
    if me not in ranks:
        return None
    # torch registers what new_group returns; the helper registered it too.
    forget(pg)
    return pg


# A reduce-scatter whose input is no larger (bytes) runs as an allreduce:
# below this, an exchange costs more than the bytes it moves (64 KiB took
# 45 us as a reducescatter against 54 us for an allreduce, np 2, shm).
_SMALL_REDUCE_SCATTER = 16 * 1024

# ---------------------------------------------------------------------
# Process sets for subgroups

_sets = {}


def _set_of(ranks):
    """The id of the hvd process set of ranks: 0 for every rank, else the
    set made by an earlier new_group or by hvd.add_process_set, else a new
    one (every rank takes part)."""
    if ranks == list(range(_core.size())):
        return 0
    key = tuple(ranks)
    if key in _sets:
        return _sets[key]
    ps = _ps._create(ranks)
    if ps is None:
        ps = _find_set(ranks)
    _sets[key] = ps
    return ps


def _find_set(ranks):
    lib = L.lib()
    buf = (ctypes.c_int * len(ranks))()
    for ps in range(1, 1 << 16):
        n = lib.hvd_process_set_ranks(ps, buf, len(ranks))
        if n == len(ranks) and list(buf) == ranks:
            return ps
    raise _unsupported("hvd backend: no process set of ranks %s" % ranks)


# ---------------------------------------------------------------------
# Registration


def _create(backend_opts, pg_options=None):
    """The creator torch calls for init_process_group(backend="hvd")."""
    if not _core.is_initialized():
        _core.init()
    rank, size = _core.rank(), _core.size()
    if backend_opts.global_ranks_in_group:
        # Only the members get here, but libhvd's process sets are made by
        # every rank: a torch that does not hand new_group to the default
        # group (ProcessGroupHvd.new_group) would hang here.
        raise _unsupported(
            "hvd backend: this torch (%s) creates subgroups on their members "
            "only; hvd's subgroups need a torch that calls the default "
            "group's new_group on every rank" % torch.__version__)
    if (backend_opts.group_rank, backend_opts.group_size) != (rank, size):
        raise ValueError(
            "hvd backend: torch was given rank %d of %d but hvd is rank %d "
            "of %d: start the job with one launcher (torchrun, hvdrun, "
            "mpirun, srun) and let init_process_group take its ranks from "
            "it" % (backend_opts.group_rank, backend_opts.group_size, rank,
                    size))
    return ProcessGroupHvd(rank, size)


def _devices():
    try:
        return ["cpu", "cuda"] if _core.cuda_built() else ["cpu"]
    except Exception:  # libhvd is not loadable: the creator says why
        return ["cpu"]


def _supported():
    """Whether this torch can take a Python ProcessGroup as a backend and
    hand it new_group (torch 2.10 and later; Debian's 1.13 cannot)."""
    import inspect
    try:
        params = inspect.signature(dist.Backend.register_backend).parameters
    except (TypeError, ValueError):
        return False
    return "devices" in params and hasattr(dist, "Work")


def register():
    """Registers the backend (once); import hvd.torch does it. Returns
    whether the backend is registered."""
    if not dist.is_available() or not _supported():
        return False
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return True
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=_devices())
    _wrap_env_rendezvous()
    return True


register()

__all__ = ["ProcessGroupHvd", "HvdWork", "register", "BACKEND_NAME"]
