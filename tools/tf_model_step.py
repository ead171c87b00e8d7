"""One training step's gradient allreduces of a model (by default
ResNet-50's 161 tensors, shared/data/resnet50_params.tsv) through
hvd.tensorflow's ops in one tf.function: every tensor float32, Average,
submitted in backward order, as DistributedGradientTape does. Prints the
median and minimum step time (the slowest rank's) over --iters steps.
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
grads = [tf.fill([n], float(hvd.rank() + 1)) for n in counts]


@tf.function
def step(gs):
    return [hvd.allreduce(g, op=hvd.Average) for g in gs]


times = []
for i in range(args.warmup + args.iters):
    t0 = time.perf_counter()
    out = step(grads)
    out[-1].numpy()  # every output is ready when the function returns
    dt = time.perf_counter() - t0
    times.append(float(hvd.allreduce(tf.constant(dt), op=hvd.Max)))
want = (hvd.size() + 1) / 2.0
wrong = sum(int(np.count_nonzero(o.numpy() != want)) for o in out)
t = np.array(times[args.warmup:]) * 1e3
if hvd.rank() == 0:
    print("tf %s step: %d tensors, %.1f MB, median %.2f ms, min %.2f ms, "
          "%d wrong" % (os.path.basename(args.model_file).split("_")[0],
                        len(counts), sum(counts) * 4 / 1e6, np.median(t),
                        t.min(), wrong), flush=True)
