"""The c10d backend "hvd" (hvd.torch.distributed): torch.distributed's
collectives and DistributedDataParallel over hvd, on 1 to 3 ranks, under
hvdrun (run_python.sh) and under torchrun (run_c10d_torchrun.sh).

Every expected result is computed exactly on each rank from every rank's
input (each rank can make any rank's input): small integers, whose sums,
products and halves are exact in every dtype used; and every
collective's result is also compared with Gloo's for the same call on a
Gloo group. DDP on N ranks is
checked against the same model trained in this process on the global
batch, without DDP.
"""

import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import hvd.torch  # noqa: F401  registers the backend

if not hvd.torch.distributed.register():
    pytest.skip("this torch (%s) cannot take a Python ProcessGroup as a "
                "backend" % torch.__version__, allow_module_level=True)

torch.set_num_threads(1)
dist.init_process_group(backend="hvd")
RANK, SIZE = dist.get_rank(), dist.get_world_size()
R = dist.ReduceOp

ALL = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
       torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def data(r, dtype, n=6):
    """Rank r's input: (r + 1) times 1, 2, 1, 2, ..."""
    base = torch.tensor([1 + i % 2 for i in range(n)], dtype=torch.int64)
    return (base * (r + 1)).to(dtype)


def reduce_all(op, dtype, n=6):
    xs = [data(r, torch.float64, n) for r in range(SIZE)]
    out = xs[0].clone()
    for x in xs[1:]:
        if op == R.SUM:
            out = out + x
        elif op == R.PRODUCT:
            out = out * x
        elif op == R.MIN:
            out = torch.minimum(out, x)
        elif op == R.MAX:
            out = torch.maximum(out, x)
    if op == R.AVG:
        out = sum(xs) / SIZE
    return out.to(dtype)


def test_backend():
    assert dist.get_backend() == "hvd"
    assert (RANK, SIZE) == (hvd.torch.rank(), hvd.torch.size())


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("op", [R.SUM, R.PRODUCT, R.MIN, R.MAX],
                         ids=lambda o: str(o).split(".")[-1])
def test_allreduce(op, dtype):
    x = data(RANK, dtype)
    dist.all_reduce(x, op=op)
    assert torch.equal(x, reduce_all(op, dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_allreduce_avg_premul(dtype):
    x = data(RANK, dtype)
    dist.all_reduce(x, op=R.AVG)
    assert torch.equal(x, reduce_all(R.AVG, dtype))
    x = data(RANK, dtype)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    assert torch.equal(x, (reduce_all(R.SUM, torch.float64) * 0.5).to(dtype))


def test_allreduce_bool():
    every = [torch.tensor([True, r % 2 == 0, False, r == 0])
             for r in range(SIZE)]
    for op, expect in ((R.SUM, any), (R.MAX, any), (R.BOR, any),
                       (R.MIN, all), (R.BAND, all)):
        x = every[RANK].clone()
        dist.all_reduce(x, op=op)
        want = torch.tensor([expect(bool(e[i]) for e in every)
                             for i in range(4)])
        assert torch.equal(x, want), op


def test_allreduce_noncontiguous_in_place():
    m = torch.stack([data(RANK, torch.float32), torch.full((6,), -7.0)], 1)
    col = m[:, 0]
    assert not col.is_contiguous()
    dist.all_reduce(col)
    assert torch.equal(m[:, 0], reduce_all(R.SUM, torch.float32))
    assert torch.equal(m[:, 1], torch.full((6,), -7.0))
    t = data(RANK, torch.int32, 12).view(3, 4).t()  # a transposed view
    dist.all_reduce(t)
    assert torch.equal(t, reduce_all(R.SUM, torch.int32, 12).view(3, 4).t())


def test_allreduce_coalesced_and_async_future():
    xs = [data(RANK, torch.float32), data(RANK, torch.float32, 3)]
    with warnings.catch_warnings():  # torch says it will go
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced(xs)
    assert torch.equal(xs[0], reduce_all(R.SUM, torch.float32))
    assert torch.equal(xs[1], reduce_all(R.SUM, torch.float32, 3))
    x = data(RANK, torch.float64)
    work = dist.all_reduce(x, async_op=True)
    value = work.get_future().wait()
    assert value[0] is x or torch.equal(value[0], x)
    assert work.is_completed()
    assert torch.equal(x, reduce_all(R.SUM, torch.float64))
    futures = []
    for _ in range(4):
        y = data(RANK, torch.float32)
        futures.append((y, dist.all_reduce(y, async_op=True).get_future()
                        .then(lambda f: f.value()[0] * 2)))
    for y, f in futures:
        assert torch.equal(f.wait(), reduce_all(R.SUM, torch.float32) * 2)


def test_beside_hvd_torch():
    """hvd.torch's own calls in the same script, interleaved."""
    x = data(RANK, torch.float32)
    work = dist.all_reduce(x, async_op=True)
    y = hvd.torch.allreduce(data(RANK, torch.float32), op=hvd.torch.Sum,
                            name="beside")
    work.wait()
    assert torch.equal(x, y)
    assert torch.equal(y, reduce_all(R.SUM, torch.float32))
    assert hvd.torch.broadcast_object(RANK, root_rank=0) == 0


def test_group_called_by_hand():
    """The group's own methods, as torch's other forms call them."""
    group = dist.group.WORLD
    x = data(RANK, torch.float32)
    group.allreduce([x], R.MAX).wait()
    assert torch.equal(x, reduce_all(R.MAX, torch.float32))
    x = data(RANK, torch.float32)
    group.allreduce(x).wait()
    assert torch.equal(x, reduce_all(R.SUM, torch.float32))
    assert group.name() == "hvd" and group.size() == SIZE


@pytest.mark.parametrize("dtype", ALL + [torch.bool], ids=str)
def test_broadcast(dtype):
    for root in range(SIZE):
        x = data(RANK, dtype) if dtype != torch.bool else \
            torch.tensor([RANK % 2 == 0, True, False])
        dist.broadcast(x, src=root)
        want = data(root, dtype) if dtype != torch.bool else \
            torch.tensor([root % 2 == 0, True, False])
        assert torch.equal(x, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bool,
                                   torch.bfloat16], ids=str)
def test_allgathers(dtype):
    mine = data(RANK, torch.int64, 4).to(dtype)
    outs = [torch.empty(4, dtype=dtype) for _ in range(SIZE)]
    dist.all_gather(outs, mine)
    for r in range(SIZE):
        assert torch.equal(outs[r], data(r, torch.int64, 4).to(dtype))
    flat = torch.empty(4 * SIZE, dtype=dtype)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat(
        [data(r, torch.int64, 4).to(dtype) for r in range(SIZE)]))


def test_reduce_scatters():
    n = 2 * SIZE
    full = reduce_all(R.SUM, torch.float32, n)
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, data(RANK, torch.float32, n))
    assert torch.equal(out, full[2 * RANK:2 * RANK + 2])
    out = torch.empty(2, dtype=torch.int32)
    parts = list(data(RANK, torch.int32, n).split(2))
    dist.reduce_scatter(out, parts, op=R.MAX)
    assert torch.equal(out, reduce_all(R.MAX, torch.int32, n)
                       [2 * RANK:2 * RANK + 2])


def test_alltoall():
    # Rank r sends r + d + 1 rows of 2 to rank d, each row (r, d).
    sends = [torch.tensor([[RANK, d]] * (RANK + d + 1), dtype=torch.int64)
             for d in range(SIZE)]
    inp = torch.cat(sends)
    want = torch.cat([torch.tensor([[s, RANK]] * (s + RANK + 1))
                      for s in range(SIZE)])
    out = torch.empty_like(want)
    dist.all_to_all_single(out, inp,
                           output_split_sizes=[s + RANK + 1
                                               for s in range(SIZE)],
                           input_split_sizes=[RANK + d + 1
                                              for d in range(SIZE)])
    assert torch.equal(out, want)
    even = torch.arange(SIZE * 3, dtype=torch.float32) + 100 * RANK
    out = torch.empty_like(even)
    dist.all_to_all_single(out, even)
    assert torch.equal(out, torch.cat(
        [torch.arange(3 * RANK, 3 * RANK + 3, dtype=torch.float32) + 100 * s
         for s in range(SIZE)]))
    outs = [torch.empty(s + RANK + 1, 2, dtype=torch.int64)
            for s in range(SIZE)]
    dist.all_to_all(outs, sends)
    assert torch.equal(torch.cat(outs), want)


def test_reduce_gather_scatter():
    root = SIZE - 1
    x = data(RANK, torch.float32)
    dist.reduce(x, dst=root)
    want = reduce_all(R.SUM, torch.float32) if RANK == root else \
        data(RANK, torch.float32)
    assert torch.equal(x, want)
    outs = [torch.empty(6) for _ in range(SIZE)] if RANK == 0 else None
    dist.gather(data(RANK, torch.float32), outs, dst=0)
    if RANK == 0:
        for r in range(SIZE):
            assert torch.equal(outs[r], data(r, torch.float32))
    out = torch.empty(3, dtype=torch.int32)
    parts = [torch.full((3,), 10 + r, dtype=torch.int32)
             for r in range(SIZE)] if RANK == root else None
    dist.scatter(out, parts, src=root)
    assert torch.equal(out, torch.full((3,), 10 + RANK, dtype=torch.int32))
    dist.barrier()


def test_staged_through_host(monkeypatch):
    """Reduce-scatter, alltoall and scatter of CUDA tensors go through
    host memory (libhvd has them in host memory only): the staging, shown
    on CPU tensors taken for CUDA ones."""
    monkeypatch.setattr(hvd.torch.distributed, "_on_gpu", lambda *t: True)
    test_reduce_scatters()
    test_alltoall()
    test_reduce_gather_scatter()


def test_objects():
    """torch's object collectives (checkpointing and trainers use them)."""
    every = [None] * SIZE
    dist.all_gather_object(every, {"rank": RANK, "pad": "x" * RANK})
    assert every == [{"rank": r, "pad": "x" * r} for r in range(SIZE)]
    objs = [("from", SIZE - 1)] if RANK == SIZE - 1 else [None]
    dist.broadcast_object_list(objs, src=SIZE - 1)
    assert objs == [("from", SIZE - 1)]
    got = [None] * SIZE if RANK == 0 else None
    dist.gather_object(RANK * 10, got, dst=0)
    if RANK == 0:
        assert got == [r * 10 for r in range(SIZE)]
    out = [None]
    dist.scatter_object_list(out, [str(r) * (r + 1) for r in range(SIZE)]
                             if RANK == 0 else None, src=0)
    assert out == [str(RANK) * (RANK + 1)]


def test_send_recv_say_unsupported():
    if SIZE < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(NotImplementedError, match="point-to-point"):
        dist.send(torch.ones(1), dst=1 - min(RANK, 1))
    # ... and a Gloo group of the same job has them (made by every rank).
    group = gloo()
    if RANK == 0:
        dist.send(torch.arange(3.0), dst=1, group=group)
    elif RANK == 1:
        x = torch.zeros(3)
        dist.recv(x, src=0, group=group)
        assert torch.equal(x, torch.arange(3.0))


def test_subgroup():
    members = [r for r in range(SIZE) if r != 1] if SIZE > 2 else [0]
    group = dist.new_group(members)
    # Every rank asks (torch counts groups, a Gloo group's name is its
    # count: a rank that skipped this would name the next one differently).
    with pytest.raises(NotImplementedError, match="every rank"):
        dist.new_group([RANK], use_local_synchronization=True)
    if RANK not in members:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        return
    x = data(RANK, torch.float32)
    dist.all_reduce(x, group=group)
    want = sum(data(r, torch.float64) for r in members).float()
    assert torch.equal(x, want)
    b = torch.full((2,), float(RANK))
    dist.broadcast(b, src=members[-1], group=group)
    assert torch.equal(b, torch.full((2,), float(members[-1])))
    assert dist.get_world_size(group) == len(members)


# ---------------------------------------------------------------------
# The same calls on a Gloo group: hvd's results are Gloo's


GLOO_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
_gloo = []


def gloo():
    """A Gloo group of every rank, made once, beside the hvd world."""
    if not _gloo:
        _gloo.append(dist.new_group(list(range(SIZE)), backend="gloo"))
    return _gloo[0]


def rand_ints(r, dtype, n, seed):
    """Rank r's input: small integers, exact in every dtype and in any
    sum, product, min or max of a few ranks."""
    g = torch.Generator().manual_seed(seed * 100 + r)
    return torch.randint(-2, 3, (n,), generator=g).to(dtype)


def both(call):
    """call(group) on hvd's world and on Gloo's group: their outputs."""
    return call(dist.group.WORLD), call(gloo())


def assert_same(ours, theirs):
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


@pytest.mark.parametrize("dtype", GLOO_DTYPES, ids=str)
def test_same_as_gloo(dtype):
    n = 7  # odd: uneven rows, remainders
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    for k, op in enumerate(ops):
        def allreduce(group, op=op, k=k):
            x = rand_ints(RANK, dtype, n, k)
            dist.all_reduce(x, op=op, group=group)
            return [x]
        assert_same(*both(allreduce))

        def reduce(group, op=op, k=k):
            x = rand_ints(RANK, dtype, n, 10 + k)
            dist.reduce(x, dst=SIZE - 1, op=op, group=group)
            return [x] if RANK == SIZE - 1 else []
        assert_same(*both(reduce))

        def reduce_scatter(group, op=op, k=k):
            x = rand_ints(RANK, dtype, n * SIZE, 20 + k)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, x, op=op, group=group)
            return [out]
        assert_same(*both(reduce_scatter))

    def broadcast(group):
        x = rand_ints(RANK, dtype, n, 30)
        dist.broadcast(x, src=SIZE - 1, group=group)
        return [x]

    def allgather(group):
        x = rand_ints(RANK, dtype, n, 31)
        out = torch.empty(n * SIZE, dtype=dtype)
        dist.all_gather_into_tensor(out, x, group=group)
        outs = [torch.empty(n, dtype=dtype) for _ in range(SIZE)]
        dist.all_gather(outs, x, group=group)
        return [out] + outs

    def alltoall(group):
        # Rank r sends r + 1 + j elements to rank j (uneven splits).
        send = [RANK + 1 + j for j in range(SIZE)]
        recv = [r + 1 + RANK for r in range(SIZE)]
        x = rand_ints(RANK, dtype, sum(send), 32)
        out = torch.empty(sum(recv), dtype=dtype)
        dist.all_to_all_single(out, x, recv, send, group=group)
        return [out]

    def gather_scatter(group):
        x = rand_ints(RANK, dtype, n, 33)
        root = SIZE - 1
        gathered = ([torch.empty(n, dtype=dtype) for _ in range(SIZE)]
                    if RANK == root else None)
        dist.gather(x, gathered, dst=root, group=group)
        pieces = ([rand_ints(100 + r, dtype, n, 34) for r in range(SIZE)]
                  if RANK == 0 else None)
        got = torch.empty(n, dtype=dtype)
        dist.scatter(got, pieces, src=0, group=group)
        return (gathered or []) + [got]

    for call in (broadcast, allgather, alltoall, gather_scatter):
        assert_same(*both(call))


# ---------------------------------------------------------------------
# DistributedDataParallel against one process on the global batch


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batch(step, micro=0):
    """The global batch of a step: 4 samples a rank."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    return (torch.randn(4 * SIZE, 8, generator=g),
            torch.randn(4 * SIZE, 4, generator=g))


def train_reference(steps, micro_steps):
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro_steps):
            x, y = batch(step, m)
            nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return net


def train_ddp(steps, micro_steps, hook=None):
    net = nn.parallel.DistributedDataParallel(model())
    if hook is not None:
        net.register_comm_hook(None, hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mine = slice(4 * RANK, 4 * RANK + 4)
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro_steps):
            x, y = batch(step, m)
            if m < micro_steps - 1:
                with net.no_sync():
                    nn.functional.mse_loss(net(x[mine]), y[mine]).backward()
            else:
                nn.functional.mse_loss(net(x[mine]), y[mine]).backward()
        opt.step()
    return net.module


def close(a, b, tol):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=tol, atol=tol), (p - q).abs().max()


def test_ddp_equals_global_batch():
    close(train_ddp(4, 1), train_reference(4, 1), 1e-5)


def test_ddp_no_sync_accumulation():
    close(train_ddp(3, 2), train_reference(3, 2), 1e-5)


def test_ddp_fp16_compress_hook():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    # The gradients travel in float16: about 3 significant digits.
    close(train_ddp(3, 1, default_hooks.fp16_compress_hook),
          train_reference(3, 1), 2e-3)


def test_fsdp_full_shard_equals_global_batch():
    """FSDP2 (fully_shard, CPU): its all_gather_into_tensor and
    reduce_scatter_tensor on hvd."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        pytest.skip("this torch has no torch.distributed.fsdp.fully_shard")
    net = model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mine = slice(4 * RANK, 4 * RANK + 4)
    for step in range(3):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(net(x[mine]), y[mine]).backward()
        opt.step()
    ref = train_reference(3, 1)
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p.full_tensor(), q, rtol=1e-5, atol=1e-5)


def test_mismatch_raises():
    """Ranks disagreeing on a shape: every rank raises hvd's sentence."""
    if SIZE < 2:
        pytest.skip("needs 2 ranks")
    x = torch.ones(4 + RANK, 2)
    with pytest.raises(Exception, match="(?i)shape|mismatch|disagree"):
        dist.all_reduce(x)
    y = torch.ones(2)  # and the group goes on
    dist.all_reduce(y)
    assert torch.equal(y, torch.full((2,), float(SIZE)))


def teardown_module():
    if os.environ.get("HVD_TEST_C10D_DESTROY", "1") == "1":
        dist.destroy_process_group()
