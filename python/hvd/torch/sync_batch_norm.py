"""hvd.SyncBatchNorm: batch normalization with statistics over every rank's
batch, as horovod.torch.SyncBatchNorm (and torch's SyncBatchNorm).

In training, each rank's per-channel count, sum and sum of squares are
summed across ranks by one allreduce (differentiable: its gradient is the
allreduce of the gradients), so the mean and variance are those of the
whole global batch and the gradient flows through them to every rank's
input. Running statistics are updated with the global mean and the
unbiased global variance, the same on every rank. In eval mode (or with
track_running_stats and running statistics), it is plain batch norm. Any
device: on the CPU as on the GPU.
"""

import itertools

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hvd.torch.mpi_ops import Sum, allreduce, size

# Modules are numbered as they are made, the same way on every rank: the
# allreduce of module k is named after k (and cached from its second call).
_modules = itertools.count()


class SyncBatchNorm(_BatchNorm):
    """Synchronous N-dimensional batch norm (input (N, C, ...)); arguments
    as torch.nn.BatchNorm*d."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats)
        self._name = "sync_batch_norm.%d" % next(_modules)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)"
                             .format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        use_batch = self.training or not self.track_running_stats
        if not use_batch or size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var,
                                self.weight, self.bias, use_batch,
                                0.0 if self.momentum is None
                                else self.momentum, self.eps)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.float() if input.dtype in (torch.float16,
                                              torch.bfloat16) else input
        count = torch.full((1,), float(x.numel() // c), dtype=x.dtype,
                           device=x.device)
        stats = torch.cat([count, x.sum(dims), (x * x).sum(dims)])
        total = allreduce(stats, op=Sum, name=self._name)
        n = total[0]
        mean = total[1:1 + c] / n
        var = total[1 + c:] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked)
                     if self.momentum is None else self.momentum)
                unbiased = var * (n / (n - 1)) if n > 1 else var
                self.running_mean.mul_(1 - m).add_(m * mean.detach()
                                                   .to(self.running_mean))
                self.running_var.mul_(1 - m).add_(m * unbiased.detach()
                                                  .to(self.running_var))
        shape = [1, c] + [1] * (input.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)
