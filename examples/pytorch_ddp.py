#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on synthetic images, over hvd: a
plain DDP trainer whose only hvd line is the backend's name (and the
import that registers it). Prints images/s per rank and in total.

    torchrun --standalone --nproc_per_node=2 examples/pytorch_ddp.py
    hvdrun -np 2 python examples/pytorch_ddp.py
    torchrun ... examples/pytorch_ddp.py --backend gloo   # the same on Gloo

hvd.torch must be importable (PYTHONPATH=python in the source tree, or the
installed package) and find libhvd (HVD_LIBRARY=build/libhvd.so in the
source tree). --model resnet18 needs torchvision. --no-comm runs the same
per-rank step without DDP (no communication at all): the bound DDP can
approach on these cores.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    """Three conv + pool stages and two dense layers (about 0.6 M
    parameters at 32x32), as examples/pytorch_synthetic.py's."""

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


def make_model(name, image_size):
    if name == "cnn":
        return SmallCNN(image_size)
    import torchvision
    return getattr(torchvision.models, name)(num_classes=10)


def main():
    parser = argparse.ArgumentParser(
        description="DistributedDataParallel synthetic benchmark",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--backend", default="hvd",
                        help="torch.distributed backend (hvd, gloo)")
    parser.add_argument("--model", default="cnn",
                        help="cnn, or a torchvision model (resnet18)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per rank")
    parser.add_argument("--fp16-hook", action="store_true",
                        help="DDP's fp16 compression comm hook")
    parser.add_argument("--bucket-view", action="store_true",
                        help="DDP's gradient_as_bucket_view=True: the "
                             "gradients are views of DDP's buckets, which "
                             "saves a copy in and out of them each step")
    parser.add_argument("--no-comm", action="store_true",
                        help="no DDP: the per-rank step alone (the bound)")
    parser.add_argument("--noop-hook", action="store_true",
                        help="DDP whose comm hook communicates nothing: "
                             "DDP's own cost without the collectives")
    args = parser.parse_args()

    if args.backend == "hvd":
        import hvd.torch  # noqa: F401  registers the backend "hvd"
    dist.init_process_group(backend=args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)

    model = make_model(args.model, args.image_size)
    if not args.no_comm:
        model = nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=args.bucket_view)
        if args.noop_hook:
            def noop(state, bucket):
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done
            model.register_comm_hook(None, noop)
        elif args.fp16_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import \
                default_hooks
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size,
                                momentum=0.9)

    gen = torch.Generator().manual_seed(rank)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                       generator=gen)
    target = torch.randint(0, 10, (args.batch_size,), generator=gen)

    def steps(n):
        start = time.perf_counter()
        for _ in range(n):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
        return time.perf_counter() - start

    def log(text):
        if rank == 0:
            print(text, flush=True)

    nparams = sum(p.numel() for p in model.parameters())
    log("Model: %s, %d parameters; batch size %d per rank; %d rank(s) on "
        "%s%s, %d thread(s) each" %
        (args.model, nparams, args.batch_size, size, args.backend,
         " (no communication)" if args.no_comm else
         " (a comm hook that communicates nothing)" if args.noop_hook else
         " with the fp16 hook" if args.fp16_hook else "", args.threads))
    steps(args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        rate = args.batch_size * args.num_batches_per_iter / steps(
            args.num_batches_per_iter)
        log("Iter #%d: %.1f img/sec per rank" % (i, rate))
        rates.append(rate)
    mean = statistics.mean(rates)
    everyone = [None] * size
    dist.all_gather_object(everyone, mean)
    log("Img/sec per rank: %.1f" % mean)
    log("Total img/sec on %d rank(s): %.1f" % (size, sum(everyone)))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("LOGLEVEL", "WARNING")
    main()
