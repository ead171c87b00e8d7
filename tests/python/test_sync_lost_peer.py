"""A rank is lost (killed, or gone without leaving the job) while the
others make synchronous hvd.torch calls (and an _async call synchronized
at once, and a numpy call): each survivor's next calls raise
hvd's error (HorovodInternalError, the lost rank named) instead of
hanging, whether the call is blocked on this thread when the rank goes
(the express way's wait) or starts after. Run under hvdrun at 2 or more
ranks, as a script (not pytest); exit status 0 when every survivor raised
on every call (each prints PASS), 1 otherwise.

    test_sync_lost_peer.py [kill|exit]

kill: the last rank is SIGKILLed; exit: it calls os._exit(0). hvdrun
stops the whole job when a rank dies by a signal, so with kill the last
rank runs hvd in a child process that its parent (what hvdrun started)
waits for, then exits 0 (its status is not the test's).
"""

import os
import signal
import sys
import time

how = sys.argv[1] if len(sys.argv) > 1 else "kill"
if how == "kill" and \
        os.environ.get("HVD_RANK") == str(int(os.environ["HVD_SIZE"]) - 1):
    child = os.fork()
    if child != 0:
        _, status = os.waitpid(child, 0)
        print("the last rank's process ended: signal %d" %
              (os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0),
              flush=True)
        os._exit(0)

import torch  # noqa: E402  (after the fork)

import numpy  # noqa: E402

import hvd as hnp  # noqa: E402
import hvd.torch as hvd  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
x = torch.ones(4)
for _ in range(50):  # the name is cached: the express way from now on
    x.fill_(1.0)
    hvd.allreduce_(x, op=hvd.Sum, name="w")
    assert torch.equal(x, torch.full((4,), float(size)))
if rank == size - 1:
    sys.stdout.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)  # gone, without hvd's shutdown


def raises(what, call):
    """Whether call (bounded: 10000 tries) raises hvd's error for the lost
    peer."""
    start = time.monotonic()
    try:
        for _ in range(10000):
            call()
    except hvd.HorovodInternalError as e:
        print("rank %d: %s raised after %.1f s: %s" %
              (rank, what, time.monotonic() - start, e), flush=True)
        return True
    except hvd.HvdError as e:
        print("FAIL: rank %d: %s raised %s, not HorovodInternalError: %s" %
              (rank, what, type(e).__name__, e), flush=True)
        return False
    print("FAIL: rank %d: %s: no error after rank %d was lost" %
          (rank, what, size - 1), flush=True)
    return False


ok = raises("allreduce_ (express)", lambda: hvd.allreduce_(x, name="w"))
ok = raises("allreduce_ again", lambda: hvd.allreduce_(x, name="w")) and ok
ok = raises("allreduce", lambda: hvd.allreduce(torch.ones(2, 2),
                                               name="w2")) and ok
ok = raises("broadcast_", lambda: hvd.broadcast_(x, 0, name="b")) and ok
ok = raises("allgather", lambda: hvd.allgather(x, name="g")) and ok
ok = raises("allreduce_async_ + synchronize", lambda: hvd.synchronize(
    hvd.allreduce_async_(x, name="a"))) and ok
ok = raises("numpy allreduce", lambda: hnp.allreduce(numpy.ones(3),
                                                     name="n")) and ok
if not ok:
    sys.exit(1)
print("PASS rank %d" % rank, flush=True)
