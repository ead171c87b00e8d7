"""An hvd.torch job with exact results, for the launcher tests.

    torch_job.py [--gloo] [--die-once] [--steps N]

Every rank checks that hvd's rank and size are the launcher's (RANK and
WORLD_SIZE under torchrun, SLURM_PROCID and SLURM_NTASKS under srun,
HVD_RANK and HVD_SIZE under hvdrun, OMPI_COMM_WORLD_* under mpirun), then
runs allreduce (sum and average), allgather and broadcast on small
integers, whose results are exact, and prints one PASS line.

--gloo: also torch.distributed.init_process_group("gloo") first, as a
script that uses torch's own collectives beside hvd does, and one
all_reduce through it.
--die-once: under torchrun, rank 1 kills itself with SIGKILL after its
first allreduce on the first attempt (TORCHELASTIC_RESTART_COUNT 0), so
that torchrun restarts every worker.
"""

import argparse
import os
import signal
import sys

import torch

import hvd.torch as hvd


def launcher_rank_size():
    """The rank and size the launcher gave, and its name."""
    for name, rank, size in (("torchrun", "RANK", "WORLD_SIZE"),
                             ("hvdrun", "HVD_RANK", "HVD_SIZE"),
                             ("mpirun", "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_SIZE"),
                             ("srun", "SLURM_PROCID", "SLURM_NTASKS")):
        if rank in os.environ and size in os.environ:
            return name, int(os.environ[rank]), int(os.environ[size])
    return "none", 0, 1


def check(what, got, want):
    if not torch.equal(got, want):
        print(f"FAIL {what} rank {hvd.rank()}: got {got.tolist()} "
              f"want {want.tolist()}", flush=True)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gloo", action="store_true")
    ap.add_argument("--die-once", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    launcher, lrank, lsize = launcher_rank_size()
    if args.gloo:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([lrank + 1], dtype=torch.int64)
        dist.all_reduce(t)
        if t.item() != lsize * (lsize + 1) // 2:
            print(f"FAIL gloo all_reduce: {t.item()}", flush=True)
            sys.exit(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if (rank, size) != (lrank, lsize):
        print(f"FAIL {launcher} gave rank {lrank} of {lsize}, hvd says "
              f"{rank} of {size}", flush=True)
        sys.exit(1)

    n = 1000
    idx = torch.arange(n, dtype=torch.float64)
    for step in range(args.steps):
        x = idx * (rank + 1) + step
        want = idx * (size * (size + 1) // 2) + step * size
        check(f"allreduce.sum.{step}",
              hvd.allreduce(x, op=hvd.Sum, name=f"sum.{step}"), want)
        check(f"allreduce.average.{step}",
              hvd.allreduce(x, op=hvd.Average, name=f"avg.{step}"),
              want / size)
        if (args.die_once and step == 0 and rank == 1 and
                os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
            print("rank 1 kills itself (first attempt)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        # Rank r gives r + 1 rows of r.
        g = hvd.allgather(torch.full((rank + 1, 2), rank, dtype=torch.int32),
                          name=f"gather.{step}")
        wantg = torch.cat([torch.full((r + 1, 2), r, dtype=torch.int32)
                           for r in range(size)])
        check(f"allgather.{step}", g, wantg)
        root = step % size
        b = hvd.broadcast(torch.full((5,), rank * 10 + step,
                                     dtype=torch.int64),
                          root_rank=root, name=f"bcast.{step}")
        check(f"broadcast.{step}", b,
              torch.full((5,), root * 10 + step, dtype=torch.int64))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "-")
    print(f"PASS torch_job rank {rank} size {size} launcher {launcher} "
          f"restart {restart}", flush=True)
    hvd.shutdown()
    if args.gloo:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
