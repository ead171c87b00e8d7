"""hvd.torch as a drop-in for horovod.torch, at any number of ranks: every
op and dtype on tensors, in place and out of place, with exact results;
async handles; autograd; DistributedOptimizer against a one-process
reference with the same global batch; fp16 compression; errors."""

import numpy as np
import pytest
import torch

import hvd.torch as hvd

# Several ranks share this machine's cores: one intra-op thread each.
torch.set_num_threads(1)

NATIVE = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
CARRIED = [torch.int16]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
OP_IDS = ["sum", "avg", "min", "max", "prod"]
COUNT = 23


def dname(dtype):
    return str(dtype).replace("torch.", "")


def values(r, dtype, op, count=COUNT):
    """Rank r's input: small integers, so that every result is exact."""
    i = torch.arange(count, dtype=torch.int64)
    if op == hvd.Product:
        v = 1 + (i + r) % 2
    elif dtype == torch.uint8:
        v = (i % 7) + r
    else:
        v = ((i % 7) - 3) * (r + 1)
    return v.to(dtype)


def expected(dtype, op, n, count=COUNT):
    xs = torch.stack([values(r, dtype, op, count).double() for r in range(n)])
    if op == hvd.Sum:
        e = xs.sum(0)
    elif op == hvd.Average:
        e = xs.sum(0) / n
        if not dtype.is_floating_point:
            e = torch.trunc(e)  # integer average truncates, as C divides
    elif op == hvd.Min:
        e = xs.min(0).values
    elif op == hvd.Max:
        e = xs.max(0).values
    else:
        e = xs.prod(0)
    return e.to(dtype)


def same(a, b):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.equal(a, b), (a, b)


def test_shape():
    r, n = hvd.rank(), hvd.size()
    assert hvd.is_initialized() and 0 <= r < n
    assert hvd.local_size() * hvd.cross_size() == n
    same(hvd.allgather(torch.tensor([r]), name="ranks"), torch.arange(n))


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", NATIVE + CARRIED, ids=dname)
def test_allreduce(dtype, op, inplace):
    r, n = hvd.rank(), hvd.size()
    x = values(r, dtype, op)
    keep = x.clone()
    name = "ar.%s.%d.%d" % (dname(dtype), op, inplace)
    if inplace:
        out = hvd.allreduce_(x, op=op, name=name)
        assert out is x
    else:
        out = hvd.allreduce(x, op=op, name=name)
        same(x, keep)
    same(out, expected(dtype, op, n))


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_allreduce_async(op, inplace):
    r, n = hvd.rank(), hvd.size()
    xs = [values(r, torch.float32, op, 100 * (i + 1)) for i in range(4)]
    fn = hvd.allreduce_async_ if inplace else hvd.allreduce_async
    handles = [fn(x, op=op, name="async.%d.%d.%d" % (op, inplace, i))
               for i, x in enumerate(xs)]
    for _ in range(100000):  # bounded; they finish quickly
        if all(hvd.poll(h) for h in handles):
            break
    for i in (2, 0, 3, 1):
        out = hvd.synchronize(handles[i])
        assert (out is xs[i]) == inplace
        same(out, expected(torch.float32, op, n, 100 * (i + 1)))


def test_allreduce_bool():
    r, n = hvd.rank(), hvd.size()
    x = torch.tensor([True, False, r == 0, r == n - 1])
    rows = torch.stack([torch.tensor([True, False, q == 0, q == n - 1])
                        for q in range(n)])
    same(hvd.allreduce(x, op=hvd.Sum, name="bool.or"), rows.any(0))
    same(hvd.allreduce(x, op=hvd.Min, name="bool.and"), rows.all(0))
    with pytest.raises(TypeError):
        hvd.allreduce(x)  # Average


def test_allreduce_unnamed_and_defaults():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((3,), 2.0 * (r + 1))
    same(hvd.allreduce(x), torch.full((3,), float(n + 1)))  # Average
    with pytest.warns(DeprecationWarning):
        same(hvd.allreduce(x, average=False),
             torch.full((3,), float(n * (n + 1))))
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    same(hvd.allreduce(x, compression=hvd.Compression.none, op=hvd.Max),
         torch.full((3,), 2.0 * n))


def test_allreduce_noncontiguous_and_views():
    r, n = hvd.rank(), hvd.size()
    a = torch.zeros(6, 4)
    a[:, ::2] = r + 1
    view = a[:, ::2]
    assert not view.is_contiguous()
    out = hvd.allreduce_(view, op=hvd.Sum, name="strided")
    assert out is view
    assert (a[:, ::2] == n * (n + 1) / 2).all() and (a[:, 1::2] == 0).all()
    t = torch.full((4, 5), float(r)).t()
    same(hvd.allreduce(t, op=hvd.Max, name="transposed"),
         torch.full((5, 4), float(n - 1)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64], ids=dname)
def test_scale_factors(dtype):
    r, n = hvd.rank(), hvd.size()
    x = torch.full((5,), 2.0 * (r + 1), dtype=dtype)
    same(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                       postscale_factor=4.0, name="scale"),
         torch.full((5,), 2.0 * n * (n + 1), dtype=dtype))
    same(x, torch.full((5,), 2.0 * (r + 1), dtype=dtype))
    out = hvd.allreduce_(x, op=hvd.Average, prescale_factor=2.0,
                         postscale_factor=0.25, name="scale2")
    assert out is x
    same(x, torch.full((5,), (n + 1) / 2, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dname)
def test_scale_16bit_in_float32(dtype):
    """A factor that float16 cannot hold: 16-bit floats are scaled in
    float32 by the factor rounded to float32, as Horovod does."""
    n = hvd.size()
    # float16: scaled in float64 this gives 41.84, in float32 41.88.
    factor = 0.19663828488605406
    x = torch.full((7,), 212.875, dtype=dtype)
    scaled = (x.float() * float(np.float32(factor))).to(dtype)
    # n <= 2: the sum of n equal 16-bit values is exact (a doubling).
    same(hvd.allreduce(x, op=hvd.Sum, prescale_factor=factor,
                       name="scale16"), scaled * n)


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
def test_grouped_allreduce(inplace):
    r, n = hvd.rank(), hvd.size()
    counts = [5, 7, 0, 3, 300]
    dtypes = [torch.float32, torch.int64, torch.float32, torch.int16,
              torch.bfloat16]
    xs = [values(r, d, hvd.Sum, c) for d, c in zip(dtypes, counts)]
    if inplace:
        outs = hvd.grouped_allreduce_(xs, op=hvd.Sum, name="grouped")
    else:
        h = hvd.grouped_allreduce_async(xs, op=hvd.Sum, name="grouped")
        outs = hvd.synchronize(h)
    for x, out, d, c in zip(xs, outs, dtypes, counts):
        assert (out is x) == inplace
        same(out, expected(d, hvd.Sum, n, c))
    outs = hvd.grouped_allreduce([torch.full((3,), r + 1.0),
                                  torch.full((2,), r + 1.0)])
    for out in outs:
        same(out, torch.full(out.shape, (n + 1) / 2))


@pytest.mark.parametrize("dtype", NATIVE + CARRIED + [torch.bool], ids=dname)
def test_allgather(dtype):
    r, n = hvd.rank(), hvd.size()

    def rows(q):
        return (torch.arange(q + 1) * 10 + q).view(-1, 1).repeat(1, 3) \
            .to(dtype) if dtype != torch.bool else \
            (torch.arange(3 * (q + 1)).view(-1, 3) % (q + 2) == 0)

    out = hvd.allgather(rows(r), name="ag." + dname(dtype))
    same(out, torch.cat([rows(q) for q in range(n)]))
    h = hvd.allgather_async(rows(r)[:1])
    same(hvd.synchronize(h), torch.cat([rows(q)[:1] for q in range(n)]))


def test_allgather_shapes():
    r, n = hvd.rank(), hvd.size()
    same(hvd.allgather(torch.tensor(float(r))), torch.arange(n).float())
    same(hvd.allgather(torch.ones(0, 4) if r == 0 else torch.ones(2, 4)),
         torch.ones(2 * (n - 1), 4))
    big = torch.arange(5 * 2 * 3 * 2 * 2 * 2 * 2 * 2 * 2 * 2).view(
        5, 2, 3, 2, 2, 2, 2, 2, 2, 2)
    same(hvd.allgather(big + r), torch.cat([big + q for q in range(n)]))


@pytest.mark.parametrize("dtype", NATIVE + CARRIED, ids=dname)
def test_alltoall(dtype):
    """Uneven splits with zero parts: rank r sends (r + d) % 3 rows to rank
    d; rows carry (source, destination, index), checked exactly."""
    r, n = hvd.rank(), hvd.size()
    splits = [(r + d) % 3 for d in range(n)]
    rows = []
    for d in range(n):
        for j in range(splits[d]):
            rows.append([r, d, j])
    x = torch.tensor(rows or [[0, 0, 0]], dtype=torch.int64)[:len(rows)]
    x = x.to(dtype)
    out, received = hvd.alltoall(x, splits=torch.tensor(splits),
                                 name="a2a.%s" % dname(dtype))
    assert received.dtype == torch.int32
    assert received.tolist() == [(s + r) % 3 for s in range(n)]
    want = [[s, r, j] for s in range(n) for j in range((s + r) % 3)]
    same(out, torch.tensor(want or [[0, 0, 0]],
                           dtype=torch.int64)[:len(want)].to(dtype))


def test_alltoall_equal_and_async_and_errors():
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) + 100 * r
    out = hvd.alltoall(x, name="a2a.equal")
    want = torch.cat([torch.arange(2 * n * 3, dtype=torch.float32)
                      .reshape(2 * n, 3)[2 * r:2 * r + 2] + 100 * s
                      for s in range(n)])
    same(out, want)
    h = hvd.alltoall_async(x, name="a2a.async")
    out2, received = hvd.synchronize(h)
    same(out2, want)
    assert received.tolist() == [2] * n
    # Horovod's argument errors, as ValueError.
    if n > 1:
        with pytest.raises(ValueError, match="even multiple"):
            hvd.alltoall(torch.zeros(n + 1), name="a2a.bad1")
    with pytest.raises(ValueError, match="Number of entries"):
        hvd.alltoall(torch.zeros(n), splits=[1] * (n + 1), name="a2a.bad2")
    with pytest.raises(ValueError, match="greater than"):
        hvd.alltoall(torch.zeros(n), splits=[2] * n, name="a2a.bad3")
    with pytest.raises(ValueError, match="integer"):
        hvd.alltoall(torch.zeros(n), splits=torch.ones(n), name="a2a.bad4")
    # Ranks disagreeing on the other dimensions: every rank is told.
    if n > 1:
        y = torch.zeros(n, 2 if r == 0 else 3)
        with pytest.raises(RuntimeError, match="disagree"):
            hvd.alltoall(y, name="a2a.shape")


def test_alltoall_autograd():
    r, n = hvd.rank(), hvd.size()
    x = torch.ones(n, 2, requires_grad=True)
    out = hvd.alltoall(x * (r + 1), name="a2a.grad")
    (out * torch.arange(n, dtype=torch.float32).reshape(n, 1)).sum().backward()
    # Row s of out came from rank s's row r; its gradient s goes back there.
    same(x.grad, torch.full((n, 2), float(r + 1)) *
         torch.full((n, 1), float(r)))


@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", NATIVE + CARRIED, ids=dname)
def test_reducescatter(dtype, op):
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1  # cut unevenly: the first ranks get one row more
    x = values(r, dtype, op, rows * 2).reshape(rows, 2)
    out = hvd.reducescatter(x, op=op, name="rs.%s.%d" % (dname(dtype), op))
    full = expected(dtype, op, n, rows * 2).reshape(rows, 2)
    first = sum(rows // n + (q < rows % n) for q in range(r))
    same(out, full[first:first + rows // n + (r < rows % n)])


def test_reducescatter_default_average_async_and_autograd():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((n, 3), float(2 * n), requires_grad=True)
    h = hvd.reducescatter_async(x.detach(), name="rs.async")
    same(hvd.synchronize(h), torch.full((1, 3), float(2 * n)))
    out = hvd.reducescatter(x * (r + 1), op=hvd.Sum, name="rs.grad")
    same(out.detach(), torch.full((1, 3), float(2 * n * n * (n + 1) // 2)))
    out.sum().backward()
    # As Horovod: the allgathered gradient, times the size for Sum, times
    # this rank's factor.
    same(x.grad, torch.full((n, 3), float(n * (r + 1))))


def test_grouped_allgather_and_reducescatter():
    r, n = hvd.rank(), hvd.size()
    xs = [torch.full((r + 1, 2), float(r)), torch.arange(3) + r]
    outs = hvd.grouped_allgather(xs, name="gag")
    same(outs[0], torch.cat([torch.full((q + 1, 2), float(q))
                             for q in range(n)]))
    same(outs[1], torch.cat([torch.arange(3) + q for q in range(n)]))
    h = hvd.grouped_allgather_async(xs, name="gag.async")
    assert [o.shape[0] for o in hvd.synchronize(h)] == [
        n * (n + 1) // 2, 3 * n]
    ys = [torch.ones(n, 2), torch.ones(2 * n, dtype=torch.int64)]
    outs = hvd.grouped_reducescatter(ys, op=hvd.Sum, name="grs")
    same(outs[0], torch.full((1, 2), float(n)))
    same(outs[1], torch.full((2,), n, dtype=torch.int64))


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("dtype", NATIVE + CARRIED + [torch.bool], ids=dname)
def test_broadcast(dtype, inplace):
    r, n = hvd.rank(), hvd.size()

    def data(q):
        if dtype == torch.bool:
            return (torch.arange(12) + q) % 3 == 0
        return (torch.arange(12) * (q + 1)).to(dtype)

    for root in range(n):
        x = data(r)
        name = "bc.%s.%d.%d" % (dname(dtype), inplace, root)
        if inplace:
            out = hvd.broadcast_(x, root, name=name)
            assert out is x
        else:
            h = hvd.broadcast_async(x, root, name=name)
            out = hvd.synchronize(h)
            same(x, data(r))
        same(out, data(root))
    x = data(r)
    same(hvd.synchronize(hvd.broadcast_async_(x, 0)), data(0))


def test_autograd_allreduce():
    r, n = hvd.rank(), hvd.size()
    for op, factor in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        x = torch.arange(4.0, requires_grad=True)
        y = hvd.allreduce(x * (r + 1), op=op, name="ag_ar.%d" % op)
        same(y.detach(), torch.arange(4.0) * n * (n + 1) / 2 * factor)
        # d(sum_q w_q . y)/dx_r = (r + 1) * allreduce(w, op).
        w = torch.full((4,), float(r + 1))
        (y * w).sum().backward()
        same(x.grad, (r + 1) * torch.full((4,), n * (n + 1) / 2 * factor))


def test_autograd_grouped_allreduce():
    r, n = hvd.rank(), hvd.size()
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(2, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a * (r + 1), b], op=hvd.Sum)
    (ya.sum() + 2 * yb.sum()).backward()
    same(a.grad, torch.full((3,), float(n * (r + 1))))
    same(b.grad, torch.full((2,), 2.0 * n))


def test_autograd_allgather_and_broadcast():
    r, n = hvd.rank(), hvd.size()
    x = torch.ones(r + 1, 2, requires_grad=True)
    g = hvd.allgather(x)
    weights = torch.arange(g.shape[0], dtype=torch.float32).view(-1, 1)
    (g * weights).sum().backward()
    # Every rank's gradient of g is `weights`; the average of them is too,
    # and rank r keeps its own rows.
    offset = sum(q + 1 for q in range(r))
    same(x.grad, weights[offset:offset + r + 1].repeat(1, 2))

    x = torch.full((3,), float(r), requires_grad=True)
    y = hvd.broadcast(x, 0)
    same(y.detach(), torch.zeros(3))
    (y * (r + 1)).sum().backward()
    want = (n + 1) / 2 if r == 0 else 0.0
    same(x.grad, torch.full((3,), want))


def test_fp16_compression():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((8,), 0.25 * (r + 1), dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16,
                        name="fp16")
    same(out, torch.full((8,), 0.25 * n * (n + 1) / 2))
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16
    same(hvd.Compression.fp16.decompress(c, ctx), x)
    i = torch.arange(3)
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c is i and hvd.Compression.fp16.decompress(c, ctx) is i
    # Not representable in float16: off by its rounding only.
    y = torch.full((4,), 1.0 / 3.0, dtype=torch.float64)
    out = hvd.allreduce(y, compression=hvd.Compression.fp16, name="fp16b")
    assert out.dtype == torch.float64
    assert (out - 1.0 / 3.0).abs().max() < 1e-3


# ---------------------------------------------------------------------
# DistributedOptimizer against one process with the same global batch

STEPS = 12
GLOBAL_BATCH = 48  # divisible by 1, 2, 3, 4 ranks times 1 or 2 passes


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def make_data():
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, GLOBAL_BATCH, 10, generator=gen)
    y = torch.randn(STEPS, GLOBAL_BATCH, 3, generator=gen)
    return x, y


def make_sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_reference():
    model = make_model()
    opt = make_sgd(model)
    x, y = make_data()
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s]), y[s]).backward()
        opt.step()
    return model


def train_hvd(passes=1, compression=hvd.Compression.none, perturb=True):
    r, n = hvd.rank(), hvd.size()
    model = make_model()
    if perturb and r != 0:
        # broadcast_parameters must make every rank start from rank 0's.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(float(r))
    opt = hvd.DistributedOptimizer(make_sgd(model),
                                   named_parameters=model.named_parameters(),
                                   compression=compression,
                                   backward_passes_per_step=passes)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    x, y = make_data()
    per_rank = GLOBAL_BATCH // n
    micro = per_rank // passes
    for s in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            lo = r * per_rank + k * micro
            loss = torch.nn.functional.mse_loss(model(x[s, lo:lo + micro]),
                                                y[s, lo:lo + micro])
            (loss / passes).backward()
        opt.step()
    return model, opt


def max_diff(a, b):
    return max((p - q).abs().max().item()
               for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("passes", [1, 2])
def test_distributed_optimizer_matches_one_process(passes):
    ref = train_reference()
    model, opt = train_hvd(passes)
    diff = max_diff(model, ref)
    assert diff <= 1e-5, diff
    assert type(opt).__name__ == "SGD"
    assert isinstance(opt, torch.optim.SGD)
    # Every rank holds the same weights.
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.view(1, -1), name="weights.%d" % passes)
    for q in range(hvd.size()):
        same(gathered[q], flat)


def test_distributed_optimizer_fp16():
    ref = train_reference()
    model, _ = train_hvd(1, hvd.Compression.fp16)
    for p in model.parameters():
        assert p.grad.dtype == torch.float32
    diff = max_diff(model, ref)
    assert diff <= 1e-3, diff


def test_distributed_optimizer_synchronize_and_clip():
    r, n = hvd.rank(), hvd.size()
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(), op=hvd.Sum)
    model(torch.full((1, 4), float(r + 1))).sum().backward()
    with pytest.raises(AssertionError):
        opt.zero_grad()  # allreduces in flight
    opt.synchronize()
    same(model.weight.grad, torch.full((1, 4), n * (n + 1) / 2))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with opt.skip_synchronize():
        opt.step()
    assert abs(model.weight.norm().item() - (torch.full((4,), 1.0) - 0.25)
               .norm().item()) < 1e-6


def test_distributed_optimizer_unused_parameter():
    """A parameter that one rank does not use still gets its allreduce (of
    zeros) from that rank."""
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(5)
    a = torch.nn.Linear(3, 3)
    b = torch.nn.Linear(3, 3)
    params = list(a.named_parameters(prefix="a")) + \
        list(b.named_parameters(prefix="b"))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([p for _, p in params], lr=1.0),
        named_parameters=params, op=hvd.Sum)
    x = torch.ones(1, 3)
    out = a(x)
    if r == 0:
        out = b(out)
    out.sum().backward()
    before = b.weight.detach().clone()
    opt.step()
    grad_b = b.weight.grad
    assert grad_b is not None
    # Only rank 0 contributed to b's gradient: every rank applied it.
    flat = hvd.allgather(b.weight.detach().view(1, -1), name="unused")
    for q in range(n):
        same(flat[q], b.weight.detach().view(-1))
    assert not torch.equal(b.weight.detach(), before)


def test_distributed_optimizer_argument_checks():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="duplicates"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[("w", model.weight), ("w", model.bias)])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[("w", model.weight)])
    with pytest.raises(NotImplementedError, match="process sets"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 op=hvd.Adasum, process_set=object())


def test_broadcast_optimizer_state():
    r = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    # Give each rank different Adam state.
    model(torch.full((4, 3), float(r + 1))).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    assert state["param_groups"][0]["lr"] == 0.01
    everyone = hvd.allgather_object(state)
    for other in everyone:
        assert other["param_groups"] == state["param_groups"]
        for k, v in state["state"].items():
            for key, t in v.items():
                same(torch.as_tensor(other["state"][k][key]),
                     torch.as_tensor(t))


def test_broadcast_parameters_forms():
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=n - 1)
    torch.manual_seed(n - 1)
    want = torch.nn.Linear(3, 2)
    same(model.weight.detach(), want.weight.detach())
    same(model.bias.detach(), want.bias.detach())
    t = torch.full((2,), float(r))
    hvd.broadcast_parameters([t], root_rank=0)
    same(t, torch.zeros(2))


def test_objects():
    r, n = hvd.rank(), hvd.size()
    got = hvd.broadcast_object({"r": r, "pad": "y" * r} if r == 0 else None)
    assert got == {"r": 0, "pad": ""}
    assert hvd.allgather_object("z" * (r * 50)) == ["z" * (q * 50)
                                                     for q in range(n)]
    assert hvd.allgather_object(torch.tensor([r]), name="t")[n - 1].item() \
        == n - 1


# ---------------------------------------------------------------------
# Errors


def test_mismatch_raises_runtime_error():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(RuntimeError) as info:
        hvd.allreduce(torch.ones(r + 2), name="mismatch")
    assert isinstance(info.value, hvd.MismatchError)
    assert "disagree" in str(info.value) and "mismatch" in str(info.value)
    with pytest.raises(RuntimeError, match="disagree"):
        hvd.broadcast_(torch.ones(2, dtype=torch.float32 if r else
                                  torch.float64), 0, name="mismatch_bc")
    with pytest.raises(RuntimeError, match="disagree"):
        hvd.allgather(torch.ones(1, r + 1), name="mismatch_ag")
    same(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"),
         torch.full((2,), float(n)))


def test_shape_mismatch_of_equal_counts():
    # Horovod's test_horovod_allreduce_error: [2, 3] against [3, 2] is an
    # error, not a result, also once the name is in the response cache.
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    for _ in range(3):
        same(hvd.allreduce(torch.ones(2, 3), op=hvd.Sum, name="shape"),
             torch.full((2, 3), float(n)))
    with pytest.raises(RuntimeError) as info:
        hvd.allreduce(torch.ones((2, 3) if r == 0 else (3, 2)), name="shape")
    assert isinstance(info.value, hvd.MismatchError)
    assert "shape [2, 3]" in str(info.value)
    assert "shape [3, 2]" in str(info.value)
    with pytest.raises(RuntimeError, match=r"shape \[3, 2\]"):
        hvd.broadcast_(torch.ones((2, 3) if r == 0 else (3, 2)), 0,
                       name="shape_bc")
    # A vector and a scalar of one element still compare by count.
    x = torch.ones(1) if r == 0 else torch.tensor(1.0)
    same(hvd.allreduce(x, op=hvd.Sum, name="flat"), x * n)


def test_duplicate_name_raises_value_error():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks: alone, an operation may finish before "
                    "the duplicate is submitted")
    # No other rank submits "dup.<r>" before the barrier, so this rank's
    # stays in flight until then.
    a = torch.ones(3)
    h = hvd.allreduce_async_(a, op=hvd.Sum, name="dup.%d" % r)
    with pytest.raises(ValueError, match="allreduce.dup.%d" % r) as info:
        hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="dup.%d" % r)
    assert info.value.status_name == "HVD_ERR_INVALID_ARG"
    # A failed in-place submission leaves its tensor as it was.
    b = torch.ones(3)
    with pytest.raises(ValueError):
        hvd.allreduce_async_(b, op=hvd.Sum, prescale_factor=2.0,
                             name="dup.%d" % r)
    same(b, torch.ones(3))
    hvd.barrier()
    others = [hvd.allreduce_async(torch.ones(3), op=hvd.Sum,
                                  name="dup.%d" % q)
              for q in range(n) if q != r]
    same(hvd.synchronize(h), torch.full((3,), float(n)))
    for o in others:
        same(hvd.synchronize(o), torch.full((3,), float(n)))
    # The same name for another kind of operation is allowed, as in
    # Horovod.
    h1 = hvd.allreduce_async(torch.ones(1), name="shared")
    h2 = hvd.broadcast_async(torch.ones(1), 0, name="shared")
    hvd.synchronize(h1)
    hvd.synchronize(h2)


def test_unsupported_dtype_and_arguments():
    with pytest.raises(TypeError, match="complex64"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError):
        hvd.allreduce([1.0])
    with pytest.raises(ValueError, match="root"):
        hvd.broadcast(torch.ones(2), hvd.size() + 1, name="badroot")
    with pytest.raises(ValueError, match="ProcessSet"):
        hvd.allreduce(torch.ones(1), process_set=object())
    with pytest.raises(ValueError):
        hvd.synchronize(123456789)


def test_join():
    r, n = hvd.rank(), hvd.size()
    if r == n - 1:
        last = hvd.join()
    else:
        out = hvd.allreduce(torch.full((3,), 2.0 * n), name="joined")
        # As Horovod (test_horovod_join_allreduce): the joined rank counts
        # as a zero, the average divides by the job's size.
        same(out, torch.full((3,), 2.0 * (n - 1)))
        last = hvd.join()
    assert 0 <= last < n
    hvd.barrier()


def test_join_broadcast_allgather_refused():
    # As Horovod's test_horovod_join_broadcast: while a rank is joined, a
    # broadcast or allgather fails on the others with a RuntimeError (a
    # ValueError too), and then they join; nobody is left waiting.
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        pytest.skip("needs two ranks")
    for first in range(n):
        if r == first:
            last = hvd.join()
        else:
            with pytest.raises(RuntimeError, match="hvd_join"):
                hvd.broadcast(torch.ones(3), r if n == 2 else 0,
                              name="jb.%d" % first)
            with pytest.raises(RuntimeError, match="hvd_join"):
                hvd.allgather(torch.ones(2), name="jg.%d" % first)
            last = hvd.join()
        assert last != first
        assert hvd.allgather_object(last) == [last] * n


def test_build_facts():
    # The same answers as hvd's (tests/python/test_numpy.py checks them
    # against the configure step).
    import hvd as core
    for fn in ("mpi_built", "gloo_built", "nccl_built", "cuda_built",
               "rocm_built", "is_homogeneous"):
        assert getattr(hvd, fn)() == getattr(core, fn)(), fn
    assert hvd.is_homogeneous() is True


def test_init_after_shutdown():
    """As Horovod's Gloo-flavoured suite does between tests: shutdown, then
    init again in the same process, and the job goes on (twice)."""
    r, n = hvd.rank(), hvd.size()
    for gen in range(2):
        hvd.shutdown()
        assert not hvd.is_initialized()
        hvd.init()
        assert (hvd.rank(), hvd.size()) == (r, n)
        out = hvd.allreduce(torch.tensor([float(r + gen)]), op=hvd.Sum,
                            name="reinit")
        same(out, torch.tensor([float(n * gen + n * (n - 1) // 2)]))


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "as_dense"])
def test_sparse_gradients(dense):
    """An embedding with sparse gradients under DistributedOptimizer (as
    Horovod's test_sparse_embeddings): the indices and values are
    allgathered (or, sparse_as_dense, the dense gradient allreduced) and
    the step applies the average over the ranks."""
    r, n = hvd.rank(), hvd.size()
    emb = torch.nn.Embedding(10, 3, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(30.0).reshape(10, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=dense)
    emb(torch.tensor([r, r + 1, 0])).sum().backward()
    assert emb.weight.grad.is_sparse
    opt.step()
    counts = torch.zeros(10)
    for q in range(n):
        for k in (q, q + 1, 0):
            counts[k] += 1
    want = torch.arange(30.0).reshape(10, 3) - (counts / n).reshape(10, 1)
    assert torch.allclose(emb.weight.detach(), want, atol=1e-6)
    handle = hvd.sparse_allreduce_async(
        torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([2.0]),
                                (n,)), name="sparse.direct", op=hvd.Sum)
    got = hvd.synchronize(handle).to_dense()
    same(got, torch.full((n,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32,
                                   torch.float64], ids=dname)
def test_adasum(dtype):
    """op=hvd.Adasum: equal tensors give themselves, orthogonal ones their
    sum (both exact); not a power of two of ranks: NotImplementedError
    (as Horovod's) with libhvd's sentence; reducescatter refuses it
    (RuntimeError)."""
    r, n = hvd.rank(), hvd.size()
    if n & (n - 1):
        with pytest.raises(NotImplementedError,
                           match="power-of-two number of ranks") as e:
            hvd.allreduce(torch.ones(3, dtype=dtype), op=hvd.Adasum)
        assert isinstance(e.value, hvd.UnsupportedError)
        assert "this job has %d" % n in str(e.value)
        return
    x = (torch.arange(6) % 5 - 2).to(dtype)
    same(hvd.allreduce(x, op=hvd.Adasum, name="ad.eq.%s" % dname(dtype)), x)
    y = torch.zeros(2 * n, dtype=dtype)
    y[r] = r + 1
    want = torch.zeros(2 * n, dtype=dtype)
    want[:n] = torch.arange(1, n + 1).to(dtype)
    same(hvd.allreduce(y, op=hvd.Adasum, name="ad.orth.%s" % dname(dtype)),
         want)
    with pytest.raises(RuntimeError, match="allreduce only"):
        hvd.reducescatter(torch.ones(n, dtype=dtype), op=hvd.Adasum)


def test_adasum_optimizer():
    """DistributedOptimizer(op=Adasum): with the same gradients on every
    rank, the combined step is that step (Adasum of equal deltas)."""
    n = hvd.size()
    if n & (n - 1):
        return
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.arange(6.0).reshape(2, 3) / 8)
        model.bias.zero_()
    ref = torch.nn.Linear(3, 2)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Adasum)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    inp = torch.ones(4, 3)
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(inp).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_optimizer_two_groups_without_names():
    """As Horovod's test_optimizer_no_named_parameters: two param groups
    and no named_parameters get unique names, the same on every rank."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()},
         {"params": model[1].parameters()}], lr=0.1))
    names = opt._parameter_names
    assert len(names) == len(set(names.values())) == 4
    everyone = hvd.allgather_object(sorted(names.values()))
    assert all(n == everyone[0] for n in everyone)


def test_broadcast_optimizer_state_without_state():
    """As Horovod's test_broadcast_state_no_grad: an optimizer without
    state gets it from one zero-gradient step of the wrapped optimizer (no
    allreduce), so that every trainable parameter has a gradient after."""
    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    same(model.weight.grad, torch.zeros(2, 2))
    assert model.bias.grad is None
    assert len(opt.state_dict()["state"]) == 1


@pytest.mark.parametrize("groups", [2, "lists"], ids=["number", "lists"])
def test_distributed_optimizer_groups(groups):
    """groups= (Horovod's): the gradients of a group go as one grouped
    allreduce; the averaged gradients are those of the ungrouped path."""
    r = hvd.rank()
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32)
                    .reshape(p.shape) / (8 + i))
    if groups == "lists":
        groups = [[model[0].weight, model[1].weight]]  # the biases alone
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(),
                                                   lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   groups=groups)
    inp = torch.full((2, 3), float(r + 1))
    model(inp).sum().backward()
    opt.synchronize()
    got = [p.grad.clone() for p in model.parameters()]
    # The same, ungrouped, by hand.
    for p in model.parameters():
        p.grad = None
    model(inp).sum().backward()
    for i, (p, g) in enumerate(zip(model.parameters(), got)):
        want = hvd.allreduce(p.grad, name="groups.check.%d" % i)
        assert torch.allclose(g, want, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()


def test_sync_batch_norm():
    """hvd.SyncBatchNorm on each rank's slice of a batch gives what
    torch's BatchNorm gives on the whole batch in one process: the output,
    the input's gradient (through the global statistics), the weight's and
    bias's gradients summed over the ranks, and the running statistics."""
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(7)
    full = torch.randn(4 * n, 3, 5, dtype=torch.float64)
    mine = full[4 * r:4 * r + 4].clone().requires_grad_(True)
    bn = hvd.SyncBatchNorm(3).double()
    ref = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        ref.weight.copy_(bn.weight)
    out = bn(mine)
    whole = full.clone().requires_grad_(True)
    want = ref(whole)
    weights = torch.arange(4 * n * 3 * 5, dtype=torch.float64).reshape(
        4 * n, 3, 5) / 100
    (out * weights[4 * r:4 * r + 4]).sum().backward()
    (want * weights).sum().backward()
    assert torch.allclose(out, want[4 * r:4 * r + 4], atol=1e-10)
    assert torch.allclose(mine.grad, whole.grad[4 * r:4 * r + 4], atol=1e-10)
    wgrad = hvd.allreduce(bn.weight.grad, op=hvd.Sum, name="sbn.wgrad")
    assert torch.allclose(wgrad, ref.weight.grad, atol=1e-10)
    assert torch.allclose(bn.running_mean, ref.running_mean, atol=1e-12)
    assert torch.allclose(bn.running_var, ref.running_var, atol=1e-12)
    bn.eval()
    ref.eval()
    assert torch.allclose(bn(mine.detach()), ref(mine.detach()), atol=1e-12)


def test_grouped_poll_does_not_block():
    """poll() of a grouped allgather only looks: while one rank holds back
    its part, the other's poll says False instead of waiting for it."""
    r = hvd.rank()
    if hvd.size() < 2:
        return
    if r == 0:
        h = hvd.grouped_allgather_async([torch.ones(2), torch.ones(3)],
                                        name="gpoll")
        assert hvd.poll(h) is False  # rank 1 has not submitted yet
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.grouped_allgather_async([torch.ones(2), torch.ones(3)],
                                        name="gpoll")
    outs = hvd.synchronize(h)
    assert [o.shape[0] for o in outs] == [2 * hvd.size(), 3 * hvd.size()]


# ---------------------------------------------------------------------
# Process sets


def _even_odd():
    n = hvd.size()
    even = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odd = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    return even, odd


def test_process_sets_every_op():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        # The only set of one rank is the job's own.
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set([0])
        same(hvd.allreduce(torch.ones(2), op=hvd.Sum,
                           process_set=hvd.global_process_set),
             torch.ones(2))
        return
    even, odd = _even_odd()
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    members = mine.ranks
    k, m = mine.rank(), mine.size()
    assert mine.included() and not other.included()
    assert m == len(members) and members[k] == r
    assert hvd.global_process_set.ranks == list(range(n))
    # Allreduce: sum and average, exact.
    x = torch.arange(5, dtype=torch.float64) + 10 * r
    want = sum(torch.arange(5, dtype=torch.float64) + 10 * q for q in members)
    same(hvd.allreduce(x, op=hvd.Sum, name="ps.ar", process_set=mine), want)
    same(hvd.allreduce(x * m, name="ps.avg", process_set=mine), want)
    # The same name in both sets: two operations.
    same(hvd.allreduce(torch.tensor([r]), op=hvd.Sum, name="ps.shared",
                       process_set=mine), torch.tensor([sum(members)]))
    # Allgather of uneven first dimensions.
    g = hvd.allgather(torch.full((r + 1, 2), r), name="ps.ag",
                      process_set=mine)
    same(g, torch.cat([torch.full((q + 1, 2), q) for q in members]))
    # Broadcast from every member (a rank of the job).
    for root in members:
        b = hvd.broadcast(torch.tensor([r, r]), root, name="ps.bc.%d" % root,
                          process_set=mine)
        same(b, torch.tensor([root, root]))
    # Alltoall: (k + d) % 3 rows to member d.
    splits = [(k + d) % 3 for d in range(m)]
    rows = [[r, d, j] for d in range(m) for j in range(splits[d])]
    t = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 3)
    out, received = hvd.alltoall(t, splits=torch.tensor(splits),
                                 name="ps.a2a", process_set=mine)
    assert received.tolist() == [(s + k) % 3 for s in range(m)]
    want_rows = [[members[s], k, j] for s in range(m)
                 for j in range((s + k) % 3)]
    same(out, torch.tensor(want_rows, dtype=torch.int64).reshape(-1, 3))
    # Reducescatter: the first rows % m members one more row.
    rs = hvd.reducescatter(torch.ones(2 * m + 1, 2) * (r + 1), op=hvd.Sum,
                           name="ps.rs", process_set=mine)
    mine_rows = 3 if k == 0 else 2
    same(rs, torch.ones(mine_rows, 2) * sum(q + 1 for q in members))
    # Grouped forms, barrier, objects.
    ga = hvd.grouped_allreduce([torch.tensor([r]), torch.tensor([2.0 * r])],
                               op=hvd.Sum, name="ps.gar", process_set=mine)
    same(ga[0], torch.tensor([sum(members)]))
    gg = hvd.grouped_allgather([torch.tensor([r]), torch.tensor([[r, r]])],
                               name="ps.gag", process_set=mine)
    same(gg[0], torch.tensor(members))
    grs = hvd.grouped_reducescatter([torch.ones(m, 1)], op=hvd.Sum,
                                    name="ps.grs", process_set=mine)
    same(grs[0], torch.ones(1, 1) * m)
    hvd.barrier(process_set=mine)
    assert hvd.broadcast_object({"from": r} if r == members[-1] else None,
                                root_rank=members[-1],
                                process_set=mine) == {"from": members[-1]}
    assert hvd.allgather_object(r, process_set=mine) == members
    # Unnamed operations are counted per set.
    for i in range(3):
        same(hvd.allreduce(torch.tensor([i]), op=hvd.Sum, process_set=mine),
             torch.tensor([i * m]))
    # The job's operations go on between the sets'.
    same(hvd.allreduce(torch.tensor([1]), op=hvd.Sum, name="ps.job"),
         torch.tensor([n]))
    assert hvd.remove_process_set(odd) and hvd.remove_process_set(even)
    assert not hvd.remove_process_set(even)  # no longer added
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_process_sets_autograd_and_errors():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        return
    even, odd = _even_odd()
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    m = mine.size()
    x = torch.ones(3, requires_grad=True)
    y = hvd.allreduce(x * (r + 1), op=hvd.Sum, name="ps.grad.ar",
                      process_set=mine)
    y.sum().backward()
    # The output's gradient is summed over the members again (m), then
    # times this rank's factor.
    same(x.grad, torch.ones(3) * float((r + 1) * m))
    z = torch.ones(2, 2, requires_grad=True)
    g = hvd.allgather(z, name="ps.grad.ag", process_set=mine)
    g.sum().backward()
    same(z.grad, torch.ones(2, 2))  # averaged over the set
    # Errors: a duplicate set, an operation in a set this rank is not in,
    # a set never added, a root outside the set.
    with pytest.raises(ValueError, match="duplicate"):
        hvd.add_process_set(list(even.ranks))  # every rank adds it
    with pytest.raises(ValueError, match="not a member"):
        hvd.allreduce(torch.ones(1), name="ps.outsider", process_set=other)
    with pytest.raises(ValueError, match="has not been added"):
        hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0]))
    outside = other.ranks[0]
    with pytest.raises(ValueError, match="not a member"):
        hvd.broadcast(torch.ones(1), outside, name="ps.badroot",
                      process_set=mine)
    # Members disagreeing: every member is told.
    t = torch.ones(1 if mine.rank() == 0 else 2)
    if m > 1:
        with pytest.raises(RuntimeError, match="disagree"):
            hvd.allreduce(t, name="ps.mismatch", process_set=mine)
    hvd.remove_process_set(odd)
    hvd.remove_process_set(even)


def test_process_sets_optimizer_and_init():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        return
    even, odd = _even_odd()
    torch.manual_seed(r)
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   process_set=even)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss = model(torch.randn(8, 4)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    w = hvd.allgather(model.weight.detach().reshape(1, -1), name="ps.opt.w")
    if len(even.ranks) > 1:
        # The even ranks stepped with the same averaged gradient.
        for q in even.ranks[1:]:
            same(w[q], w[0])
    hvd.remove_process_set(odd)
    hvd.remove_process_set(even)
    # hvd.init(process_sets=...) adds them in order, on every rank.
    hvd.shutdown()
    first = hvd.ProcessSet([0])
    rest = hvd.ProcessSet(range(1, n))
    hvd.init(process_sets=[first, rest])
    assert first.process_set_id is not None and rest.process_set_id is not None
    mine = first if r == 0 else rest
    same(hvd.allreduce(torch.tensor([1]), op=hvd.Sum, name="ps.init",
                       process_set=mine), torch.tensor([len(mine.ranks)]))
    hvd.remove_process_set(first)
    hvd.remove_process_set(rest)
