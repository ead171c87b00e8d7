"""HOROVOD_TIMELINE=DYNAMIC (or HVD_TIMELINE=DYNAMIC, the variable named by
the argument): Horovod's "no timeline until start_timeline()". No file is
written at init, none named DYNAMIC appears in the working directory, and
hvd.start_timeline(path) later writes rank 0's timeline to path.

    hvdrun -np 2 python3 test_timeline_dynamic.py HOROVOD_TIMELINE
"""

import json
import os
import sys
import tempfile

import numpy as np

import hvd


def main(var):
    # Set before hvd.init reads it; the other name is cleared, so that only
    # the variable under test is seen (hvd's name wins over Horovod's).
    for name in ("HVD_TIMELINE", "HOROVOD_TIMELINE"):
        os.environ.pop(name, None)
    os.environ[var] = "DYNAMIC"
    with tempfile.TemporaryDirectory(prefix="hvd-tl-") as cwd:
        os.chdir(cwd)
        hvd.init()
        r = hvd.rank()
        x = np.ones(100, np.float32)
        hvd.allreduce(x, name="tl.before", op=hvd.Sum)
        hvd.barrier()
        assert os.listdir(cwd) == [], os.listdir(cwd)

        # Every rank names rank 0's file; only rank 0 writes it.
        path = hvd.broadcast_object(os.path.join(cwd, "timeline.json"),
                                    root_rank=0)
        hvd.start_timeline(path)
        hvd.allreduce(x, name="tl.during", op=hvd.Sum)
        hvd.stop_timeline()
        hvd.barrier()
        hvd.allreduce(x, name="tl.after", op=hvd.Sum)
        hvd.barrier()
        hvd.shutdown()
        assert not os.path.exists(os.path.join(cwd, "DYNAMIC"))
        if r != 0:
            assert os.listdir(cwd) == [], os.listdir(cwd)
        else:
            assert os.listdir(cwd) == ["timeline.json"], os.listdir(cwd)
            with open(path) as f:
                events = json.load(f)
            rows = {e["args"]["name"].split(".", 1)[-1] for e in events
                    if e.get("ph") == "M"}
            assert "tl.during" in rows and "tl.before" not in rows, rows
        os.chdir("/")
    print("rank %d: %s=DYNAMIC: ok" % (r, var))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("HVD_TIMELINE",
                                                 "HOROVOD_TIMELINE"):
        sys.exit("usage: test_timeline_dynamic.py HVD_TIMELINE|"
                 "HOROVOD_TIMELINE")
    main(sys.argv[1])
