"""horovod.torch's collectives over libhvd: the torch backend of
hvd/_core.py, and the autograd functions.

A tensor that is contiguous and of a dtype the C API has (uint8, int8,
int32, int64, float16, bfloat16, float32, float64) is handed to libhvd as
it is, on the CPU or on the GPU: libhvd sees a CUDA tensor's device
pointer and takes its device path (NCCL, or its staging pipeline;
docs/gpu.md). Before a CUDA tensor is handed over, torch's current stream
on its device is synchronized, since libhvd's stream does not wait for it.
Any other tensor (int16, bool, non-contiguous) is copied into a contiguous
buffer of a C API dtype first, on its own device, and the result copied
back when the operation is synchronized. Only a libhvd built without CUDA
gets CUDA tensors through host memory.

The synchronous calls (allreduce_, allreduce, broadcast_, allgather, ...)
call libhvd's blocking forms (hvd/_core.py), so the calling thread runs
the engine; the commonest, an in-place allreduce of a CPU tensor of one
dimension in the job's set, goes straight to hvd_allreduce
(_allreduce_fast).
"""

import numpy as np
import torch

from hvd import _core
from hvd import _lib as L
from hvd.process_sets import (ProcessSet, add_process_set, global_process_set,
                              ps_id, remove_process_set)
from hvd._core import (Adasum, Average, Max, Min, Product, Spec, Sum, barrier,
                       cross_rank, cross_size, init, is_initialized,
                       local_rank, local_size, poll, rank, resolve_op,
                       shutdown, size)
from hvd._lib import (HorovodInternalError, HvdError, InvalidArgumentError,
                      MismatchError)

_NATIVE = {
    torch.uint8: L.UINT8,
    torch.int8: L.INT8,
    torch.int32: L.INT32,
    torch.int64: L.INT64,
    torch.float16: L.FLOAT16,
    torch.bfloat16: L.BFLOAT16,
    torch.float32: L.FLOAT32,
    torch.float64: L.FLOAT64,
}
_CARRIED = {
    torch.int16: L.INT32,
    torch.bool: L.UINT8,
}
_TORCH_OF_CODE = {code: dt for dt, code in _NATIVE.items()}
_CPU = torch.device("cpu")
_cuda_built = None


def _on_device(x):
    """Whether x is a CUDA tensor libhvd takes as it is (a build with
    CUDA); else a CUDA tensor is carried through host memory."""
    global _cuda_built
    if not x.is_cuda:
        return False
    if _cuda_built is None:
        _cuda_built = bool(_core.cuda_built())
    return _cuda_built


class TorchBackend:
    name = "torch"

    @staticmethod
    def input(x, inplace, what):
        if not isinstance(x, torch.Tensor):
            raise TypeError("%s: needs a torch.Tensor, got %s" %
                            (what, type(x).__name__))
        if x.is_sparse:
            raise TypeError("%s: sparse tensors are not supported; pass "
                            "tensor.to_dense()" % what)
        return x

    @staticmethod
    def spec(x, what):
        code = _NATIVE.get(x.dtype)
        if code is not None:
            return Spec(code, True, False, str(x.dtype))
        code = _CARRIED.get(x.dtype)
        if code is not None:
            return Spec(code, False, x.dtype == torch.bool, str(x.dtype))
        raise TypeError(
            "%s: %s is not supported (supported: uint8, int8, int32, int64, "
            "float16, bfloat16, float32, float64; int16 and bool are "
            "carried in a wider type)" % (what, x.dtype))

    @staticmethod
    def check_writable(x, what):
        pass

    @staticmethod
    def direct(x, spec):
        return (spec.native and x.is_contiguous() and
                (x.device.type == "cpu" or _on_device(x)))

    @staticmethod
    def same_place(x):
        return x.device.type == "cpu" or _on_device(x)

    @staticmethod
    def ready(tensors):
        """Makes what torch queued on CUDA tensors visible to libhvd."""
        done = set()
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_cuda and \
                    t.device not in done:
                done.add(t.device)
                torch.cuda.current_stream(t.device).synchronize()

    @staticmethod
    def numel(x):
        return x.numel()

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def ptr(x):
        return x.data_ptr()

    @staticmethod
    def carrier(x, spec):
        with torch.no_grad():
            return x.detach().to(device=x.device if _on_device(x) else _CPU,
                                 dtype=_TORCH_OF_CODE[spec.code],
                                 memory_format=torch.contiguous_format,
                                 copy=True)

    @staticmethod
    def empty(shape, spec, like=None):
        device = like.device if like is not None and _on_device(like) else _CPU
        return torch.empty(shape, dtype=_TORCH_OF_CODE[spec.code],
                           device=device)

    @staticmethod
    def empty_like(x, shape=None):
        return torch.empty(x.shape if shape is None else shape,
                           dtype=x.dtype, device=x.device)

    @staticmethod
    def assign(dst, src):
        with torch.no_grad():
            dst.copy_(src.view(dst.shape))

    @staticmethod
    def flatten(x):
        return x.detach().view(-1)

    @staticmethod
    def ints(values):
        return torch.tensor(values, dtype=torch.int32)

    @staticmethod
    def scale(buf, factor, spec):
        with torch.no_grad():
            if buf.dtype in (torch.float16, torch.bfloat16):
                # In float32 by the factor rounded to float32, as Horovod
                # scales 16-bit floats.
                buf.copy_(buf.float().mul_(float(np.float32(factor))))
            elif spec.floating:
                buf.mul_(factor)
            else:
                # Integers: in float64, truncated toward zero (as C casts).
                buf.copy_(buf.double().mul_(factor))


_B = TorchBackend

# What _allreduce_fast takes: ops libhvd reduces as they are, and the C
# names of named allreduces (bounded, for programs that make up names).
_PLAIN_OPS = frozenset((Sum, Average, Min, Max, Product))
_cnames = {}
_CNAMES_MAX = 4096
_hvd_allreduce = None
_shaped = None
# The C arrays of the shapes of two or more dimensions seen (bounded too).
_dims = {}


def _allreduce_fast(tensor, name, op, inplace):
    """An allreduce of a contiguous CPU tensor of a C API dtype, in the
    job's set, without factors: straight to hvd_allreduce (the GIL
    released), or for two or more dimensions hvd_ps_allreduce_shaped,
    which run it on this thread (the express way when the engine is
    free). Returns the output (tensor itself in place, else a new tensor),
    or None, having done nothing, for any other call (the general path
    then checks and runs it). It makes the same C call the general path
    would make (name, buffers, count or shape, dtype, op), so the two
    agree across ranks."""
    global _hvd_allreduce, _shaped
    code = _NATIVE.get(tensor.dtype)
    if code is None or type(op) is not int or op not in _PLAIN_OPS or \
            tensor.is_sparse or not tensor.is_cpu or \
            not tensor.is_contiguous():
        return None
    if name is None:
        cname = None
    elif type(name) is not str:
        return None
    else:
        cname = _cnames.get(name)
        if cname is None:
            cname = ("allreduce.%s" % name).encode("utf-8")
            if len(_cnames) < _CNAMES_MAX:
                _cnames[name] = cname
    if _hvd_allreduce is None:
        _shaped = L.lib().hvd_ps_allreduce_shaped \
            if L.has_shaped_blocking() else False
        _hvd_allreduce = L.lib().hvd_allreduce
    ndim = tensor.dim()
    if ndim > 1:
        if not _shaped:
            return None
        shape = tensor.shape
        dims = _dims.get(shape)
        if dims is None:
            dims = _core._dims(shape)
            if len(_dims) < _CNAMES_MAX:
                _dims[shape] = dims
        out = tensor if inplace else torch.empty_like(tensor)
        st = _shaped(0, cname, tensor.data_ptr(), out.data_ptr(), ndim, dims,
                     code, op)
    else:
        out = tensor if inplace else torch.empty_like(tensor)
        st = _hvd_allreduce(cname, tensor.data_ptr(), out.data_ptr(),
                            tensor.numel(), code, op)
    if st != 0:
        raise L.error_for(st)
    return out


def _broadcast_fast(tensor, root_rank, name):
    """broadcast_ of a contiguous CPU tensor of a C API dtype in the job's
    set: straight to hvd_ps_broadcast (hvd_ps_broadcast_shaped for two or
    more dimensions), as _allreduce_fast. Returns False, having done
    nothing, for any other call."""
    code = _NATIVE.get(tensor.dtype)
    if code is None or type(root_rank) is not int or \
            (name is not None and type(name) is not str) or \
            tensor.is_sparse or not tensor.is_cpu or \
            not tensor.is_contiguous():
        return False
    ndim = tensor.dim()
    if ndim > 1 and not L.has_shaped_blocking():
        return False
    cname = None if name is None else ("broadcast.%s" % name).encode("utf-8")
    lib = L.lib()
    if ndim > 1:
        st = lib.hvd_ps_broadcast_shaped(0, cname, tensor.data_ptr(), ndim,
                                         _core._dims(tensor.shape), code,
                                         root_rank)
    else:
        st = lib.hvd_ps_broadcast(0, cname, tensor.data_ptr(),
                                  tensor.numel(), code, root_rank)
    if st != 0:
        raise L.error_for(st)
    return True


# ---------------------------------------------------------------------
# Allreduce


def allreduce_async(tensor, average=None, name=None, op=None,
                    prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    """Starts an allreduce of tensor into a new tensor; returns a handle
    for synchronize()/poll()."""
    return _core.allreduce_async(_B, tensor, name, resolve_op(op, average),
                                 prescale_factor, postscale_factor, False,
                                 ps_id(process_set))


def allreduce_async_(tensor, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """Starts an in-place allreduce of tensor; returns a handle."""
    return _core.allreduce_async(_B, tensor, name, resolve_op(op, average),
                                 prescale_factor, postscale_factor, True,
                                 ps_id(process_set))


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce as an autograd function: the gradient of the output is
    allreduced with the same op and factors (as Horovod does)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor,
                process_set=None):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        return _core.allreduce_async(_B, tensor, name, op, prescale_factor,
                                     postscale_factor, False,
                                     ps_id(process_set), sync=True)

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, op=ctx.op,
                          prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor,
                          process_set=ctx.process_set),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Returns the reduction of tensor across ranks (default op: Average).
    Differentiable. compression (hvd.torch.Compression.fp16) sends the
    tensor in float16 and returns it in its own dtype."""
    if average is None and process_set is None and compression is None \
            and prescale_factor == 1.0 and postscale_factor == 1.0 and \
            isinstance(tensor, torch.Tensor) and not (
                tensor.requires_grad and torch.is_grad_enabled()):
        out = _allreduce_fast(tensor, name, Average if op is None else op,
                              False)
        if out is not None:
            return out
    ps = ps_id(process_set)
    op = resolve_op(op, average)
    if compression is None:
        if isinstance(tensor, torch.Tensor) and not (
                tensor.requires_grad and torch.is_grad_enabled()):
            # No gradient to carry: the autograd function adds only its
            # own cost.
            return _core.allreduce_async(_B, tensor, name, op,
                                         prescale_factor, postscale_factor,
                                         False, ps, sync=True)
        return HorovodAllreduce.apply(tensor, name, op, prescale_factor,
                                      postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """Reduces tensor in place and returns it (not differentiable)."""
    if average is None and process_set is None and \
            prescale_factor == 1.0 and postscale_factor == 1.0 and \
            isinstance(tensor, torch.Tensor) and \
            _allreduce_fast(tensor, name, Average if op is None else op,
                            True) is not None:
        return tensor
    return _core.allreduce_async(_B, tensor, name, resolve_op(op, average),
                                 prescale_factor, postscale_factor, True,
                                 ps_id(process_set), sync=True)


# ---------------------------------------------------------------------
# Grouped allreduce


def grouped_allreduce_async(tensors, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0,
                            process_set=None):
    """Starts one allreduce of a list of tensors (one negotiation, one
    collective per dtype among them); synchronize() returns the list."""
    return _core.grouped_allreduce_async(_B, list(tensors), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         False, ps_id(process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=None):
    return _core.grouped_allreduce_async(_B, list(tensors), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         True, ps_id(process_set))


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor,
                process_set, *tensors):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        return tuple(_core.grouped_allreduce_async(
            _B, list(tensors), name, op, prescale_factor, postscale_factor,
            False, ps_id(process_set), sync=True))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op,
                                  prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None):
    """Returns the list of the reductions of tensors. Differentiable."""
    ps_id(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    if compression is None:
        return list(HorovodGroupedAllreduce.apply(
            name, op, prescale_factor, postscale_factor, process_set,
            *tensors))
    pairs = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor,
                                            postscale_factor, process_set,
                                            *[p[0] for p in pairs])
    return [compression.decompress(t, p[1]) for t, p in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None):
    return _core.grouped_allreduce_async(_B, list(tensors), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         True, ps_id(process_set), sync=True)


# ---------------------------------------------------------------------
# Allgather


def allgather_async(tensor, name=None, process_set=None):
    """Starts an allgather along the first dimension, whose size may differ
    between ranks; returns a handle."""
    return _core.allgather_async(_B, tensor, name, ps=ps_id(process_set))


class HorovodAllgather(torch.autograd.Function):
    """Allgather as an autograd function: the gradient is averaged across
    ranks and each rank keeps its own rows (as Horovod does)."""

    @staticmethod
    def forward(ctx, tensor, name, process_set=None):
        ps = ps_id(process_set)
        out, req = _core.allgather_async(_B, tensor, name, ps=ps, sync=True)
        ctx.firsts = req.info
        ctx.shape = tensor.shape
        ctx.process_set = process_set
        ctx.me = _core._place(ps)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average,
                                 process_set=ctx.process_set)
        offset = sum(ctx.firsts[:ctx.me])
        grad = grad_reduced.narrow(0, offset, ctx.firsts[ctx.me])
        return grad.reshape(ctx.shape), None, None


def allgather(tensor, name=None, process_set=None):
    """Returns every rank's tensor concatenated along the first dimension.
    Differentiable."""
    ps_id(process_set)
    return HorovodAllgather.apply(tensor, name, process_set)


# ---------------------------------------------------------------------
# Broadcast


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts a broadcast of root_rank's tensor into a new tensor."""
    return _core.broadcast_async(_B, tensor, root_rank, name, False,
                                 ps_id(process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts a broadcast of root_rank's tensor into tensor on every rank."""
    return _core.broadcast_async(_B, tensor, root_rank, name, True,
                                 ps_id(process_set))


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast as an autograd function: the gradient is averaged across
    ranks and kept on the root only (as Horovod does)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set=None):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return _core.broadcast_async(_B, tensor, root_rank, name, False,
                                     ps_id(process_set), sync=True)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average,
                                 process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Returns root_rank's tensor on every rank. Differentiable."""
    ps_id(process_set)
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrites tensor with root_rank's on every rank and returns it."""
    if process_set is None and isinstance(tensor, torch.Tensor) and \
            _broadcast_fast(tensor, root_rank, name):
        return tensor
    return _core.broadcast_async(_B, tensor, root_rank, name, True,
                                 ps_id(process_set), sync=True)


# ---------------------------------------------------------------------
# Alltoall, reducescatter and the grouped forms


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an alltoall: splits[r] rows of tensor (first dimension) go
    to rank r (equal parts without splits). synchronize() returns
    (output, received_splits)."""
    return _core.alltoall_async(_B, tensor, splits, name, with_splits=True,
                                ps=ps_id(process_set))


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall as an autograd function: the gradient goes back by an
    alltoall with the received splits (as Horovod does)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set=None):
        output, received = _core.alltoall_async(
            _B, tensor, splits, name, with_splits=True,
            ps=ps_id(process_set), sync=True)
        ctx.recvsplits = received
        ctx.process_set = process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *dead_gradients):
        grad, _ = alltoall(grad_output, splits=ctx.recvsplits,
                           process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Scatters slices of tensor (along its first dimension: splits[r]
    rows to rank r, equal parts without splits) and gathers what every
    rank sends this one, in rank order. Returns the output, and with
    splits also the rows received from each rank (int32). Differentiable.
    """
    ps_id(process_set)
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


def reducescatter_async(tensor, name=None, op=Average, process_set=None,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; returns a handle."""
    return _core.reducescatter_async(_B, tensor, name, resolve_op(op, None),
                                     prescale_factor, postscale_factor,
                                     ps_id(process_set))


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter as an autograd function: the gradient is allgathered,
    times the size for Sum and by the factors (as Horovod's: gradients
    are taken as averaged over the ranks)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor,
                process_set=None):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        return _core.reducescatter_async(
            _B, tensor, name, op, prescale_factor, postscale_factor,
            ps_id(process_set), sync=True)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.op == Sum:
            grad_output = grad_output * _core._members(
                ps_id(ctx.process_set))
        if ctx.prescale_factor != 1.0:
            grad_output = grad_output * ctx.prescale_factor
        if ctx.postscale_factor != 1.0:
            grad_output = grad_output * ctx.postscale_factor
        return (allgather(grad_output, process_set=ctx.process_set), None,
                None, None, None, None)


def reducescatter(tensor, name=None, compression=None, op=Average,
                  process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces tensor across ranks and returns this rank's rows of the
    result (its first dimension cut as Horovod cuts it: the first ranks
    one row more). Differentiable."""
    ps_id(process_set)
    op = resolve_op(op, None)
    if compression is None:
        return HorovodReducescatter.apply(tensor, name, op, prescale_factor,
                                          postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(HorovodReducescatter.apply(
        compressed, name, op, prescale_factor, postscale_factor, process_set),
        ctx)


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Starts an allgather of each tensor as one operation; synchronize()
    returns the list."""
    ps = ps_id(process_set)
    return _core.grouped_async(
        lambda t, n: _core.allgather_async(_B, t, n, ps=ps), tensors, name,
        "hvd.grouped_allgather")


def grouped_allgather(tensors, name=None, process_set=None):
    """allgather of each tensor, as one operation. Differentiable."""
    ps_id(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("hvd.grouped_allgather: needs at least one tensor")
    return [allgather(t, None if name is None else
                      "%s_%dof%d" % (name, i + 1, len(tensors)),
                      process_set)
            for i, t in enumerate(tensors)]


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=None, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Starts a reducescatter of each tensor as one operation."""
    ps = ps_id(process_set)
    op = resolve_op(op, None)
    return _core.grouped_async(
        lambda t, n: _core.reducescatter_async(_B, t, n, op, prescale_factor,
                                               postscale_factor, ps),
        tensors, name, "hvd.grouped_reducescatter")


def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor, as one operation. Differentiable."""
    ps_id(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("hvd.grouped_reducescatter: needs at least one "
                         "tensor")
    return [reducescatter(t, None if name is None else
                          "%s_%dof%d" % (name, i + 1, len(tensors)),
                          compression, op, process_set, prescale_factor,
                          postscale_factor)
            for i, t in enumerate(tensors)]


def sparse_allreduce_async(tensor, name, op, process_set=None):
    """Reduces a sparse tensor as Horovod does: its indices and values are
    allgathered (every rank's entries, duplicates summed when the tensor is
    used), the values divided by the size for Average. Returns a callable
    handle: synchronize(handle) (or handle()) gives the sparse result."""
    n = _core._members(ps_id(process_set))
    t = tensor
    indices = allgather_async(t._indices().transpose(0, 1).contiguous(),
                              name="%s.indices" % name,
                              process_set=process_set)
    values = allgather_async(t._values(), name="%s.values" % name,
                             process_set=process_set)

    def handle():
        v = synchronize(values)
        i = synchronize(indices)
        v = v / n if op == Average else v
        if i.dim() == 0 or v.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(i.transpose(0, 1), v, t.size())

    return handle


# ---------------------------------------------------------------------


def synchronize(handle):
    """Waits for the operation of handle; returns its output tensor (or
    list, for a grouped operation). A callable handle (sparse_allreduce)
    is called."""
    if callable(handle):
        return handle()
    return _core.synchronize(handle)


def join(device=-1):
    """This rank is out of data: until every rank has joined, the others'
    allreduces complete without it. Returns the last rank to join."""
    return _core.join(device)


def mpi_enabled():
    """True if this job runs over MPI (started by mpirun without hvdrun's
    rendezvous), as Horovod's: whether MPI is its controller."""
    import os
    return bool(_core.mpi_built()) and \
        "OMPI_COMM_WORLD_SIZE" in os.environ and \
        "HVD_RENDEZVOUS_ADDR" not in os.environ


def gloo_enabled():
    """False: hvd has no Gloo (its own TCP transport does Gloo's job)."""
    return False


__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "barrier",
    "cross_rank", "cross_size", "init", "is_initialized", "local_rank",
    "local_size", "poll", "rank", "shutdown", "size", "HorovodInternalError",
    "HvdError", "InvalidArgumentError", "MismatchError", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "synchronize", "join",
    "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
    "HorovodBroadcast", "alltoall", "alltoall_async", "HorovodAlltoall",
    "reducescatter", "reducescatter_async", "HorovodReducescatter",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "sparse_allreduce_async", "mpi_enabled",
    "gloo_enabled", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set",
]
