#!/usr/bin/env python3
"""A small CNN trained data-parallel on synthetic images with hvd.torch,
printing images/s per rank and in total (in the manner of Horovod's
pytorch_synthetic_benchmark.py, which runs unchanged but for its import).

    hvdrun -np 2 /usr/bin/python3 examples/pytorch_synthetic.py

hvd.torch must be importable (PYTHONPATH=python in the source tree, or the
installed package) and find libhvd (HVD_LIBRARY=build/libhvd.so in the
source tree; the installed package finds the installed library).

Each rank uses --threads intra-op threads (default: this machine's cores
divided by the ranks on it): torch's default of one thread per core for
every rank oversubscribes the cores and makes every rank slower.
"""

import argparse
import os
import statistics
import timeit

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvd.torch as hvd


class SmallCNN(nn.Module):
    """Three conv + pool stages and two dense layers: about 0.6 M
    parameters (2.4 MB of float32 gradients a step) in 10 tensors."""

    def __init__(self, image_size, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        side = image_size // 8
        self.fc1 = nn.Linear(128 * side * side, 256)
        self.fc2 = nn.Linear(256, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def main():
    parser = argparse.ArgumentParser(
        description="hvd.torch synthetic benchmark",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=32,
                        help="height and width (a multiple of 8)")
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads per rank (0: cores / "
                             "ranks on this host)")
    args = parser.parse_args()

    hvd.init()
    threads = args.threads or max(1, (os.cpu_count() or 1) //
                                  hvd.local_size())
    torch.set_num_threads(threads)
    torch.manual_seed(1234)

    model = SmallCNN(args.image_size)
    # Horovod's convention: the learning rate grows with the global batch.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(),
                                momentum=0.9)
    compression = (hvd.Compression.fp16 if args.fp16_allreduce
                   else hvd.Compression.none)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(hvd.rank())
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                       generator=gen)
    target = torch.randint(0, 10, (args.batch_size,), generator=gen)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    nparams = sum(p.numel() for p in model.parameters())
    log("Model: SmallCNN, %d parameters; batch size %d per rank; %d rank(s), "
        "%d thread(s) each%s" % (nparams, args.batch_size, hvd.size(),
                                 threads,
                                 "; fp16 allreduce" if args.fp16_allreduce
                                 else ""))
    log("Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)

    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log("Iter #%d: %.1f img/sec per rank" % (i, rate))
        rates.append(rate)

    mean = statistics.mean(rates)
    conf = 1.96 * (statistics.stdev(rates) if len(rates) > 1 else 0.0)
    everyone = hvd.allgather_object((hvd.rank(), mean, conf), name="rates")
    for rank, rank_mean, rank_conf in everyone:
        log("Img/sec on rank %d: %.1f +-%.1f" % (rank, rank_mean, rank_conf))
    total = sum(m for _, m, _ in everyone)
    total_conf = sum(c for _, _, c in everyone)
    log("Img/sec per rank: %.1f" % (total / hvd.size()))
    log("Total img/sec on %d rank(s): %.1f +-%.1f" % (hvd.size(), total,
                                                      total_conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
