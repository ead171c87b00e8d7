"""A rank dies in the middle of training: the others' next collective
raises a TensorFlow error carrying hvd's sentence, within seconds.

Rank 1 leaves abruptly (os._exit) after a few steps; rank 0 ignores
hvdrun's SIGTERM (so that it lives to report) and must get an error
naming the lost peer from the allreduce it is in, eagerly or in a
tf.function. Prints "PASS kill_rank: <message>" on rank 0.
"""

import os
import signal
import sys
import time

import tensorflow as tf

import hvd.tensorflow as hvd

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
hvd.init()
r = hvd.rank()
if r == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
x = tf.ones([1000])
step = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
run = step if mode == "function" else (lambda t: hvd.allreduce(t, op=hvd.Sum))
for i in range(3):
    run(x)
if r == 1:
    sys.stdout.flush()
    os._exit(3)
start = time.time()
try:
    for i in range(1000):
        run(x)
except tf.errors.OpError as e:
    took = time.time() - start
    msg = e.message
    ok = ("HVD_ERR_PEER_LOST" in msg or "HVD_ERR_TIMEOUT" in msg
          or "HVD_ERR_TRANSPORT" in msg)
    print("%s kill_rank %s: %s after %.1f s: %s" % (
        "PASS" if ok and took < 30 else "FAIL", mode, type(e).__name__,
        took, msg), flush=True)
    os._exit(0 if ok else 1)
print("FAIL kill_rank %s: 1000 allreduces went through with rank 1 gone"
      % mode, flush=True)
os._exit(1)
