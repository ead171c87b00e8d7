"""A rank of a job on the c10d backend "hvd" is lost (it exits without
leaving the job): every other rank's next collectives raise hvd's
sentence, through Work.wait() and through the future DDP's hooks use,
instead of hanging. Run under hvdrun at 2 or more ranks; exit status 0
when every survivor raised (each prints PASS), 1 otherwise."""

import os
import sys
import time

import torch
import torch.distributed as dist

import hvd.torch

dist.init_process_group(backend="hvd")
rank, size = dist.get_rank(), dist.get_world_size()
x = torch.ones(8)
dist.all_reduce(x)
assert torch.equal(x, torch.full((8,), float(size)))
if rank == size - 1:
    sys.stdout.flush()
    os._exit(0)  # gone, without hvd's shutdown


def raises(via):
    """Whether collectives raise hvd's error (bounded: hvd notices a lost
    peer at its next collective, or at once once it has)."""
    start = time.monotonic()
    try:
        for _ in range(1000):
            work = dist.all_reduce(torch.ones(1024), async_op=True)
            if via == "future":
                work.get_future().wait()
            else:
                work.wait()
    except hvd.torch.HvdError as e:
        print("rank %d raised (%s) after %.1f s: %s" %
              (rank, via, time.monotonic() - start, e), flush=True)
        return True
    print("FAIL: rank %d: no error (%s) after rank %d was lost" %
          (rank, via, size - 1), flush=True)
    return False


if not (raises("future") and raises("wait")):
    sys.exit(1)
print("PASS rank %d" % rank, flush=True)
