"""hvd.torch with CUDA tensors on a real GPU: they go to libhvd's device
path as they are (NCCL, or the staging pipeline), after torch's current
stream has been synchronized. Run as a script under hvdrun; exits 77
(skip) where torch sees no GPU or libhvd was built without CUDA.
"""

import sys

import pytest
import torch

import hvd.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    yield


def inputs(count, dtype, r):
    return (torch.arange(count, dtype=torch.int64, device="cuda") % 5 +
            r).to(dtype)


def summed(count, dtype):
    n = hvd.size()
    return (torch.arange(count, dtype=torch.int64, device="cuda") % 5 * n +
            n * (n - 1) // 2).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce(dtype):
    for count in (0, 1, 7, 1 << 20):
        x = inputs(count, dtype, hvd.rank())
        out = hvd.allreduce(x, op=hvd.Sum, name="cuda.%s.%d" % (dtype, count))
        assert out.is_cuda and torch.equal(out, summed(count, dtype))
        hvd.allreduce_(x, op=hvd.Sum, name="cuda_.%s.%d" % (dtype, count))
        assert torch.equal(x, summed(count, dtype))


def test_produced_on_a_side_stream():
    # The input is written by a kernel on a stream of the caller's just
    # before the call: hvd.torch synchronizes the current stream first.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(1 << 22, device="cuda")
        for _ in range(20):
            x.mul_(1.0).add_(0.0)
        x.fill_(float(hvd.rank() + 1))
        out = hvd.allreduce(x, op=hvd.Sum, name="cuda.side")
    n = hvd.size()
    assert torch.equal(out, torch.full_like(out, float(n * (n + 1) // 2)))


def test_grouped_broadcast_allgather():
    r, n = hvd.rank(), hvd.size()
    xs = [inputs(c, torch.float32, r) for c in (3, 1000, 1)]
    for out, c in zip(hvd.grouped_allreduce(xs, op=hvd.Sum), (3, 1000, 1)):
        assert torch.equal(out, summed(c, torch.float32))
    b = torch.full((4, 5), float(r), device="cuda")
    hvd.broadcast_(b, 0)
    assert torch.equal(b, torch.zeros_like(b))
    g = hvd.allgather(torch.full((r + 1, 2), float(r), device="cuda"))
    assert g.is_cuda and g.shape == (n * (n + 1) // 2, 2)
    # Scaled, and a dtype carried in a wider one, stay on the device.
    h = hvd.allreduce(torch.ones(6, dtype=torch.float16, device="cuda"),
                      op=hvd.Sum, prescale_factor=0.5)
    assert h.is_cuda and torch.equal(h, torch.full_like(h, 0.5 * n))
    i = hvd.allreduce(torch.ones(6, dtype=torch.int16, device="cuda"),
                      op=hvd.Sum)
    assert i.is_cuda and i.dtype == torch.int16 and int(i[0]) == n


def test_optimizer_step():
    model = torch.nn.Linear(8, 4).cuda()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(),
                                                   lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.full((16, 8), float(hvd.rank() + 1), device="cuda")
    model(x).sum().backward()
    opt.step()
    w = model.weight.detach().clone()
    w0 = hvd.broadcast(w, 0, name="cuda.w")
    assert torch.equal(w, w0)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA GPU")
        sys.exit(77)
    import hvd as _hvd
    if not _hvd.cuda_built():
        print("SKIP: this libhvd was built without CUDA")
        sys.exit(77)
    sys.exit(pytest.main([__file__, "-q", "-x", "-p", "no:cacheprovider"]))
