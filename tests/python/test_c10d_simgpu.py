"""The c10d backend "hvd" on libhvd's device path, with the simulated GPU
of the C tests (as test_torch_simgpu.py: the memory of CPU tensors is
declared this rank's GPU memory, so the backend's pointers go to libhvd
as they are and take its device path). Results are exact. (Reduce-scatter and
alltoall are not on libhvd's device path yet: the backend stages CUDA
tensors through host memory for them, which a simulated GPU cannot show.)
Run with
HVD_LIBRARY=libhvd_simgpu.so, the stand-in driver first on
LD_LIBRARY_PATH and HVD_LOG_LEVEL=info."""

import contextlib
import ctypes

import pytest
import torch
import torch.distributed as dist

import hvd.torch as hvd

if not hvd.distributed.register():
    pytest.skip("this torch (%s) cannot take a Python ProcessGroup as a "
                "backend" % torch.__version__, allow_module_level=True)

torch.set_num_threads(1)
dist.init_process_group(backend="hvd")
R, N = dist.get_rank(), dist.get_world_size()
_cuda = ctypes.CDLL("libcuda.so.1")
_cuda.fake_cuda_add_range.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_int]
_cuda.fake_cuda_remove_range.argtypes = [ctypes.c_void_p]
DEVICE = hvd.local_rank() % 2


@contextlib.contextmanager
def on_device(*tensors):
    """Declares the tensors' memory this rank's GPU memory meanwhile."""
    ptrs = []
    try:
        for t in tensors:
            _cuda.fake_cuda_add_range(t.data_ptr(),
                                      t.numel() * t.element_size(), DEVICE)
            ptrs.append(t.data_ptr())
        yield
    finally:
        for p in ptrs:
            _cuda.fake_cuda_remove_range(p)


def mine(r, n=6, dtype=torch.float32):
    return (torch.arange(n) % 5 + r).to(dtype)


def test_allreduce_takes_the_device_path(capfd):
    x = mine(R)
    with on_device(x):
        dist.all_reduce(x)
    assert torch.equal(x, sum(mine(r, dtype=torch.float64)
                              for r in range(N)).float())
    want = "device tensors: CUDA device %d, path %s" % (
        DEVICE, "local" if N == 1 else "staged over")
    assert want in capfd.readouterr().err


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32,
                                   torch.bfloat16], ids=str)
def test_collectives_on_device(dtype):
    x = mine(R, dtype=dtype)
    with on_device(x):
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    assert torch.equal(x, mine(N - 1, dtype=dtype))
    out = torch.empty(6 * N, dtype=dtype)
    x = mine(R, dtype=dtype)
    with on_device(x, out):
        dist.all_gather_into_tensor(out, x)
    assert torch.equal(out, torch.cat([mine(r, dtype=dtype)
                                       for r in range(N)]))
    x = mine(R, dtype=dtype)
    with on_device(x):
        dist.broadcast(x, src=N - 1)
    assert torch.equal(x, mine(N - 1, dtype=dtype))


def teardown_module():
    dist.destroy_process_group()
