"""ElasticSampler: horovod.torch.elastic.ElasticSampler over hvd."""

import math
import random

import torch.utils.data

from hvd.torch import mpi_ops


def _shape():
    """(size, rank) now; None while hvd is not initialized (between a
    failure and the re-formation)."""
    try:
        return mpi_ops.size(), mpi_ops.rank()
    except ValueError:
        return None


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset across the ranks, as DistributedSampler does,
    and re-partitions what is left of the epoch after the job is
    re-formed.

    Each epoch orders every index of the dataset (shuffled with
    seed + epoch when shuffle), and rank r of n takes the r-th of every n
    of them (the list padded with its first indices to a multiple of n).
    record_batch(batch_idx, batch_size) after each batch counts
    batch_size * n indices of that order as processed: the first ones,
    since every rank takes its batches in the same steps. Indices recorded
    with record_indices() are left out as well (every rank's, after a
    sync). reset() (which TorchState calls after a re-formation, and
    load_state_dict) partitions the indices not yet processed among the
    new ranks. set_epoch(e) at the end of an epoch starts the next one
    with nothing processed.

    Held by a TorchState, its epoch and progress are committed, restored
    and synced with the rest of the state.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed

        self.epoch = 0
        self.processed_num = 0
        self.processed_indices = set()

        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = None

        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch: nothing processed, the order of epoch (shuffle).
        Call it at the end of an epoch (for the next one), so that a
        re-formation in the middle of an epoch does not process its
        samples again."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records a batch of batch_size samples as processed on every
        rank (batch_idx is Horovod's argument; the count is what
        matters)."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        """Records the dataset indices this rank processed (Horovod's
        older form; use it or record_batch, not both in one epoch). A sync
        gathers every rank's."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's dataset indices of batch batch_idx (of batch_size)
        in the current partition."""
        indices = self._my_indices()
        start = batch_idx * batch_size
        return indices[start:min(start + batch_size, len(indices))]

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num,
                    processed_indices=set(self.processed_indices))

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.processed_indices = set(state_dict.get("processed_indices",
                                                    ()))
        self.reset()

    def _order(self):
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def reset(self):
        """Partitions the indices not processed yet among hvd.size()
        ranks (keeping the last partition while hvd is not
        initialized)."""
        shape = _shape()
        if shape is not None:
            self.num_replicas, self.rank = shape
        remaining = self._order()
        if self.processed_indices:
            remaining = [i for i in remaining
                         if i not in self.processed_indices]
        remaining = remaining[self.processed_num:]
        self.remaining_indices = remaining
        self.num_samples = int(math.ceil(len(remaining) /
                                         float(self.num_replicas)))
        self.total_size = self.num_samples * self.num_replicas
        self.indices = None

    def _my_indices(self):
        if self.indices is None:
            indices = list(self.remaining_indices)
            while indices and len(indices) < self.total_size:
                indices += indices[:self.total_size - len(indices)]
            self.indices = indices[self.rank:self.total_size:
                                   self.num_replicas]
        return self.indices

    def __iter__(self):
        self.indices = None
        return iter(list(self._my_indices()))

    def __len__(self):
        return self.num_samples


__all__ = ["ElasticSampler"]
