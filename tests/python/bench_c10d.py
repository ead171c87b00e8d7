"""Each torch.distributed collective on one backend, timed at a list of
sizes (not a test: the figures of docs/benchmarks.md, issue 33).

    torchrun --standalone --nproc_per_node=2 tests/python/bench_c10d.py \\
        --backend gloo
    torchrun ... tests/python/bench_c10d.py --backend hvd

Size is the bytes of float32 a rank gives: all_reduce's and broadcast's
tensor, all_gather_into_tensor's input, reduce_scatter_tensor's output,
all_to_all_single's input (at least one element per rank where the
collective cuts it). Each is timed from its call to its wait() (the
synchronous form) over repeats scaled to the size, after a warm-up;
rank 0 prints one line per collective and size: the median of the
ranks' median microseconds, and the repeats.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

SIZES = [4, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def collectives(n):
    def allreduce(k):
        x = torch.ones(k)
        return lambda: dist.all_reduce(x)

    def broadcast(k):
        x = torch.ones(k)
        return lambda: dist.broadcast(x, src=0)

    def allgather(k):
        x, out = torch.ones(k), torch.empty(n * k)
        return lambda: dist.all_gather_into_tensor(out, x)

    def reduce_scatter(k):
        x, out = torch.ones(n * k), torch.empty(k)
        return lambda: dist.reduce_scatter_tensor(out, x)

    def alltoall(k):
        k = max(k, n) // n * n
        x, out = torch.ones(k), torch.empty(k)
        return lambda: dist.all_to_all_single(out, x)

    return [("all_reduce", allreduce), ("broadcast", broadcast),
            ("all_gather_into_tensor", allgather),
            ("reduce_scatter_tensor", reduce_scatter),
            ("all_to_all_single", alltoall)]


def label(size):
    if size >= 1 << 20:
        return "%d MiB" % (size >> 20)
    if size >= 1 << 10:
        return "%d KiB" % (size >> 10)
    return "%d B" % size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="hvd")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--budget", type=float, default=0.5,
                        help="seconds to aim at per collective and size")
    args = parser.parse_args()
    if args.backend == "hvd":
        import hvd.torch  # noqa: F401
    dist.init_process_group(backend=args.backend)
    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    for name, make in collectives(n):
        for size in [int(s) for s in args.sizes.split(",")]:
            run = make(max(1, size // 4))
            for _ in range(3):
                run()
            # Every rank runs as many repeats as rank 0 found fit.
            start = time.perf_counter()
            run()
            probe = torch.tensor([time.perf_counter() - start],
                                 dtype=torch.float64)
            dist.broadcast(probe, src=0)
            reps = int(min(1000, max(5, args.budget / max(probe.item(),
                                                          1e-6))))
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            mine = torch.tensor([statistics.median(times) * 1e6],
                                dtype=torch.float64)
            every = [torch.empty(1, dtype=torch.float64) for _ in range(n)]
            dist.all_gather(every, mine)
            if rank == 0:
                print("%s %s %s %.1f us (%d repeats)" %
                      (args.backend, name, label(size),
                       statistics.median(t.item() for t in every), reps),
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
