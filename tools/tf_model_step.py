"""One training step's gradient allreduces of a model (by default
ResNet-50's 161 tensors, shared/data/resnet50_params.tsv) through
hvd.tensorflow's ops in one tf.function: every tensor float32, Average, in
place, submitted in backward order, as DistributedGradientTape does.
Prints the median and minimum step time (the slowest rank's) over --iters
steps.
Run under hvdrun; tools/bench-tf compares it with hvd-bench --model.
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

import hvd.tensorflow as hvd

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--model-file", default=os.path.join(
    here, "..", "..", "shared", "data", "resnet50_params.tsv"))
p.add_argument("--iters", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
args = p.parse_args()

counts = []
with open(args.model_file) as f:
    for line in f:
        if line.startswith("#") or not line.strip():
            continue
        counts.append(int(line.split("\t")[2]))
counts.reverse()  # gradients arrive in backward order

hvd.init()
# An argument, not a Python constant, so that grappler does not fold the
# fills into constants (which no op may write into).
value = tf.constant(float(hvd.rank() + 1))


# As in a training step, each gradient is a fresh tensor that only its
# allreduce reads, so the op reduces it in place (TensorFlow forwards its
# buffer to the output). Making them (fill) is timed alone too and taken
# off, so what is left is the allreduces'.
@tf.function
def make(v):
    return [tf.fill([n], v) for n in counts]


@tf.function
def step(v):
    return [hvd.allreduce(tf.fill([n], v), op=hvd.Average) for n in counts]


def timed(fn):
    times = []
    for i in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        out = fn(value)
        out[-1].numpy()  # every output is ready when the function returns
        dt = time.perf_counter() - t0
        times.append(float(hvd.allreduce(tf.constant(dt), op=hvd.Max)))
    return out, np.array(times[args.warmup:]) * 1e3


_, t_make = timed(make)
out, t_step = timed(step)
want = (hvd.size() + 1) / 2.0
wrong = sum(int(np.count_nonzero(o.numpy() != want)) for o in out)
t = t_step - np.median(t_make)
if hvd.rank() == 0:
    print("tf %s step: %d tensors, %.1f MB, median %.2f ms, min %.2f ms "
          "(making the gradients, %.2f ms, taken off), %d wrong" % (
              os.path.basename(args.model_file).split("_")[0], len(counts),
              sum(counts) * 4 / 1e6, np.median(t), t.min(),
              np.median(t_make), wrong), flush=True)
