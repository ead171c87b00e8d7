"""The cost of one small synchronous collective from Python: a 4-byte
hvd.torch.allreduce_ against torch.distributed.all_reduce on Gloo, in the
same run (rounds interleaved), the C blocking call through ctypes as
the floor, and allreduce_async_ followed at once by synchronize. Run under hvdrun (every rank runs it):

    hvdrun -np 2 -- python tests/python/bench_sync.py [--iters N]

Prints, on rank 0, the median and mean microseconds per call of each.
Gloo meets on 127.0.0.1 (BENCH_GLOO_PORT, default 29533).
"""

import argparse
import ctypes
import os
import statistics
import time

import torch
import torch.distributed as dist

import hvd.torch as hvd
from hvd import _lib as L


def timed(fn, iters):
    """Each call's time in ns."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(iters):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-gloo", action="store_true")
    args = ap.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    t = torch.zeros(1, dtype=torch.float32)
    lib = L.lib()
    lib.hvd_allreduce.restype = ctypes.c_int
    lib.hvd_allreduce.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_int]
    buf = ctypes.c_float(0.0)
    ptr = ctypes.addressof(buf)

    def hvd_call():
        hvd.allreduce_(t, name="x", op=hvd.Sum)

    def c_call():
        lib.hvd_allreduce(b"c.x", ptr, ptr, 1, L.FLOAT32, L.SUM)

    a = torch.zeros(1, dtype=torch.float32)

    def async_call():
        hvd.synchronize(hvd.allreduce_async_(a, name="a", op=hvd.Sum))

    cases = [("hvd.torch.allreduce_", hvd_call),
             ("hvd_allreduce (ctypes)", c_call),
             ("allreduce_async_ + synchronize", async_call)]
    if not args.no_gloo:
        dist.init_process_group(
            "gloo", rank=rank, world_size=size,
            init_method="tcp://127.0.0.1:%s" %
            os.environ.get("BENCH_GLOO_PORT", "29533"))
        g = torch.zeros(1, dtype=torch.float32)
        cases.append(("torch.distributed.all_reduce (gloo)",
                      lambda: dist.all_reduce(g)))
    times = {name: [] for name, _ in cases}
    for name, fn in cases:  # warm up
        timed(fn, 200)
    for _ in range(args.rounds):
        for name, fn in cases:
            times[name] += timed(fn, args.iters)
    if rank == 0:
        print("np %d, torch %s, %d rounds of %d calls, 4 bytes float32" %
              (size, torch.__version__, args.rounds, args.iters))
        for name, _ in cases:
            ts = times[name]
            print("%-38s median %7.2f us  mean %7.2f us" %
                  (name, statistics.median(ts) / 1e3,
                   sum(ts) / len(ts) / 1e3))
    if not args.no_gloo:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
