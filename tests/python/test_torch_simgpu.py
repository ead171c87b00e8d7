"""hvd.torch over libhvd's device path, on the simulated GPU of the C
tests (tests/gpu/sim_gpu.c as libhvd_simgpu's GPU, tests/gpu/fake_libcuda.c
as the CUDA driver): the memory of CPU tensors is declared device memory of
this rank's (simulated) GPU, so hvd.torch's pointers go to libhvd as they
are and take its device path (negotiation as device tensors, the device
executor, the staging pipeline over the transport). Results are exact.

What this cannot show: torch's CUDA side (the stream synchronized before a
CUDA tensor is handed over), which test_torch_cuda.py checks on a GPU.
Run by tests/python/CMakeLists.txt with HVD_LIBRARY=libhvd_simgpu.so and the
stand-in driver first on LD_LIBRARY_PATH.
"""

import contextlib
import ctypes

import numpy as np
import pytest
import torch

import hvd.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
# The stand-in driver hvd opened; two "devices", this rank uses
# local_rank % 2 (HVD_GPU_DEVICE unset).
_cuda = ctypes.CDLL("libcuda.so.1")
_cuda.fake_cuda_add_range.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_int]
_cuda.fake_cuda_remove_range.argtypes = [ctypes.c_void_p]
DEVICE = hvd.local_rank() % 2

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]


@contextlib.contextmanager
def on_device(*tensors):
    """Declares the tensors' memory this rank's GPU memory meanwhile."""
    ptrs = []
    try:
        for t in tensors:
            if t.numel():
                _cuda.fake_cuda_add_range(t.data_ptr(),
                                          t.numel() * t.element_size(),
                                          DEVICE)
                ptrs.append(t.data_ptr())
        yield
    finally:
        for p in ptrs:
            _cuda.fake_cuda_remove_range(p)


def inputs(count, dtype, r):
    """Small integers: every sum, min, max and average is exact."""
    return (torch.arange(count, dtype=torch.int64) % 5 + r).to(dtype)


def expected(count, dtype, op):
    ranks = np.stack([inputs(count, torch.float64, r).numpy()
                      for r in range(N)])
    value = {hvd.Sum: ranks.sum(0), hvd.Min: ranks.min(0),
             hvd.Max: ranks.max(0), hvd.Average: ranks.sum(0) / N}[op]
    if not dtype.is_floating_point:
        value = np.trunc(value)
    return torch.from_numpy(value).to(dtype)


def test_takes_the_device_path(capfd):
    # First in the file: libhvd logs the device path once, with the first
    # device tensor (HVD_LOG_LEVEL=info, set by tests/python/CMakeLists.txt).
    x = inputs(5, torch.float32, R)
    with on_device(x):
        hvd.allreduce_(x, op=hvd.Sum, name="sim.first")
    assert torch.equal(x, expected(5, torch.float32, hvd.Sum))
    want = "device tensors: CUDA device %d, path %s" % (
        DEVICE, "local" if N == 1 else "staged over")
    assert want in capfd.readouterr().err


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_in_place(dtype):
    for count in (1, 7, 4099):
        for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Average):
            x = inputs(count, dtype, R)
            with on_device(x):
                out = hvd.allreduce_(x, op=op,
                                     name="sim.%s.%d.%d" % (dtype, count, op))
            assert out is x
            assert torch.equal(x, expected(count, dtype, op)), (count, op)


def test_grouped_allreduce_in_place():
    xs = [inputs(c, torch.float32, R) for c in (3, 1, 1000)]
    with on_device(*xs):
        hvd.grouped_allreduce_(xs, op=hvd.Sum, name="sim.grouped")
    for x, c in zip(xs, (3, 1, 1000)):
        assert torch.equal(x, expected(c, torch.float32, hvd.Sum))


def test_scaled_allreduce_on_device():
    # A prescale factor: hvd.torch scales a copy on the tensor's device,
    # and the copy is what libhvd reduces.
    x = inputs(9, torch.float64, R)
    with on_device(x):
        hvd.allreduce_(x, op=hvd.Sum, prescale_factor=2.0,
                       postscale_factor=0.5, name="sim.scaled")
    assert torch.equal(x, expected(9, torch.float64, hvd.Sum))


def test_broadcast_in_place():
    root = 1 % N
    x = torch.full((2, 513), float(R), dtype=torch.float32)
    with on_device(x):
        hvd.broadcast_(x, root, name="sim.bcast")
    assert torch.equal(x, torch.full((2, 513), float(root)))


def test_output_must_be_on_the_same_device():
    # The input's pointer reaches libhvd unchanged (no copy through host
    # memory in Python): a host output next to it is refused there.
    x = inputs(4, torch.float32, R)
    with on_device(x), pytest.raises(hvd.InvalidArgumentError) as info:
        hvd.allreduce(x, name="sim.mixed")
    assert "CUDA device %d memory" % DEVICE in str(info.value)
    assert "host memory" in str(info.value)


@pytest.mark.skipif(N < 2, reason="a mismatch needs two ranks")
def test_device_and_host_disagree():
    x = inputs(4, torch.float32, R)
    with on_device(*([x] if R == 0 else [])), \
            pytest.raises(hvd.MismatchError, match="on the GPU"):
        hvd.allreduce_(x, name="sim.where")
    # The job goes on, on the device path too.
    y = inputs(4, torch.float32, R)
    with on_device(y):
        hvd.allreduce_(y, op=hvd.Sum, name="sim.after")
    assert torch.equal(y, expected(4, torch.float32, hvd.Sum))
