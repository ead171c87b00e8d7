"""The cost of one small eager hvd.tensorflow.allreduce, or allgather
with --op allgather (not a test: the
figures of docs/benchmarks.md, issue 35): the wrapper as it is (the
blocking kernel, on the calling thread), the op itself with blocking=True
and with blocking=False (the asynchronous kernel, what every eager call
ran before), the C
blocking call through ctypes as the floor; rounds interleaved. Run under
hvdrun (every rank runs it):

    hvdrun -np 2 -- python tests/tensorflow/bench_sync_tf.py [--iters N]
        [--op allreduce|allgather]

Prints, on rank 0, the median and mean microseconds per call of each.
"""

import argparse
import ctypes
import statistics
import time

import tensorflow as tf

import hvd.tensorflow as hvd
from hvd import _lib as L
from hvd.tensorflow import mpi_ops


def timed(fn, iters):
    """Each call's time in ns."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(iters):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def allgather_cases(x, lib):
    """The allgather's cases (its op, in two steps: the shapes, then the
    data) and the call that fails without the blocking attr (the op's
    blocking case); the C floor is one hvd_allgather of the data."""
    lib.hvd_allgather.restype = ctypes.c_int
    lib.hvd_allgather.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int]
    send = ctypes.c_float(0.0)
    recv = (ctypes.c_float * 64)()
    sptr, rptr = ctypes.addressof(send), ctypes.addressof(recv)
    op = mpi_ops.MPI_LIB.hvd_allgather
    cases = [
        ("hvd.tensorflow.allgather", lambda: hvd.allgather(x, name="w")),
        ("HvdAllgather blocking=True",
         lambda: op(x, tensor_name="b", blocking=True)),
        ("HvdAllgather blocking=False (async)",
         lambda: op(x, tensor_name="a", blocking=False)),
        # The buffers stay alive with the lambda (their addresses alone
        # would not keep them).
        ("hvd_allgather (ctypes)",
         lambda bufs=(send, recv): lib.hvd_allgather(b"c", sptr, rptr, 1,
                                                     L.FLOAT32)),
    ]
    return cases, cases[1][1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--op", choices=["allreduce", "allgather"],
                    default="allreduce")
    args = ap.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = tf.zeros([1], tf.float32)
    lib = L.lib()
    lib.hvd_allreduce.restype = ctypes.c_int
    lib.hvd_allreduce.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_int]
    buf = ctypes.c_float(0.0)
    ptr = ctypes.addressof(buf)
    op = mpi_ops.MPI_LIB.hvd_allreduce
    cases = [
        ("hvd.tensorflow.allreduce",
         lambda: hvd.allreduce(x, op=hvd.Sum, name="w")),
        ("HvdAllreduce blocking=True",
         lambda: op(x, reduce_op=hvd.Sum, tensor_name="b", blocking=True)),
        ("HvdAllreduce blocking=False (async)",
         lambda: op(x, reduce_op=hvd.Sum, tensor_name="a", blocking=False)),
        ("hvd_allreduce (ctypes)",
         lambda: lib.hvd_allreduce(b"c", ptr, ptr, 1, L.FLOAT32, L.SUM)),
    ]
    probe = cases[1][1]
    if args.op == "allgather":
        cases, probe = allgather_cases(x, lib)
    try:
        probe()
    except TypeError:  # an op library without the blocking attr (before)
        cases = [cases[0], cases[-1]]
    times = {name: [] for name, _ in cases}
    for name, fn in cases:  # warm up
        timed(fn, 200)
    for _ in range(args.rounds):
        for name, fn in cases:
            times[name] += timed(fn, args.iters)
    if rank == 0:
        print("np %d, tensorflow %s, %d rounds of %d calls, %s of 4 bytes "
              "float32" % (size, tf.__version__, args.rounds, args.iters,
                           args.op))
        for name, _ in cases:
            ts = times[name]
            print("%-38s median %7.2f us  mean %7.2f us" %
                  (name, statistics.median(ts) / 1e3,
                   sum(ts) / len(ts) / 1e3))
    hvd.shutdown()


if __name__ == "__main__":
    main()
