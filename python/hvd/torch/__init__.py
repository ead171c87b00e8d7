"""hvd.torch: a drop-in for horovod.torch over libhvd.

    import hvd.torch as hvd      # instead of: import horovod.torch as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

docs/python.md lists what is there and what differs from Horovod (no
Adasum, no process sets yet).
"""

from hvd._core import (ccl_built, cuda_built, ddl_built, gloo_built,
                       is_homogeneous, mpi_built, mpi_threads_supported,
                       nccl_built, rocm_built, start_timeline,
                       stop_timeline)
from hvd._lib import (HorovodInternalError, HostsUpdatedInterrupt, HvdError,
                      HvdMemoryError, InvalidArgumentError, MismatchError,
                      UnsupportedError, library_path)
from hvd.torch.compression import Compression
from hvd.torch.functions import (allgather_object,
                                 broadcast_object, broadcast_optimizer_state,
                                 broadcast_parameters)
from hvd.torch.mpi_ops import (Adasum, Average, Max, Min,
                               Product, Sum, allgather, allgather_async,
                               alltoall, alltoall_async, grouped_allgather,
                               grouped_allgather_async, grouped_reducescatter,
                               grouped_reducescatter_async, reducescatter,
                               reducescatter_async, sparse_allreduce_async,
                               mpi_enabled, gloo_enabled,
                               allreduce, allreduce_, allreduce_async,
                               allreduce_async_, barrier, broadcast,
                               broadcast_, broadcast_async, broadcast_async_,
                               cross_rank, cross_size, grouped_allreduce,
                               grouped_allreduce_, grouped_allreduce_async,
                               grouped_allreduce_async_, init,
                               is_initialized, join, local_rank, local_size,
                               poll, rank, shutdown, size, synchronize)
from hvd.torch.optimizer import DistributedOptimizer
from hvd.process_sets import (ProcessSet, add_process_set,
                              global_process_set, remove_process_set)
from hvd.torch.sync_batch_norm import SyncBatchNorm
from hvd.torch import elastic
from hvd.torch import distributed  # registers the c10d backend "hvd"


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "Sum", "Average", "Min", "Max",
    "Product", "Adasum", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "synchronize", "poll", "join", "barrier",
    "DistributedOptimizer", "Compression", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "HvdError", "HorovodInternalError", "HostsUpdatedInterrupt",
    "MismatchError",
    "InvalidArgumentError", "UnsupportedError", "HvdMemoryError",
    "library_path", "mpi_threads_supported", "nccl_built", "cuda_built",
    "rocm_built", "mpi_built", "gloo_built", "ddl_built", "ccl_built",
    "is_homogeneous", "start_timeline", "stop_timeline", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "sparse_allreduce_async", "mpi_enabled",
    "gloo_enabled", "SyncBatchNorm", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set",
]
