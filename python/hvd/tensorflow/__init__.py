"""hvd.tensorflow: a drop-in for horovod.tensorflow over libhvd.

    import hvd.tensorflow as hvd   # instead of: import horovod.tensorflow as hvd

    hvd.init()
    tape = hvd.DistributedGradientTape(tape)            # TF2
    opt = hvd.DistributedOptimizer(opt)                 # TF1 (tf.compat.v1)
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]

The collectives are TensorFlow ops (the op library built from
python/hvd/tensorflow/_ops/), asynchronous kernels over libhvd; they run
eagerly, in tf.function and in TF1 graphs. docs/tensorflow.md lists what is
there and what differs from Horovod.
"""

import tensorflow as tf

from hvd._lib import (HorovodInternalError, HostsUpdatedInterrupt,
                      HvdError, HvdMemoryError, InvalidArgumentError,
                      MismatchError, UnsupportedError, library_path)
from hvd.tensorflow.compression import Compression
from hvd.tensorflow import util
from hvd.tensorflow.functions import (allgather_object, broadcast_,
                                      broadcast_object, broadcast_object_fn,
                                      broadcast_variables)
from hvd.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum,
                                    ProcessSet, _allreduce,
                                    _grouped_allreduce,
                                    _grouped_reducescatter, _reducescatter,
                                    _set_size, add_process_set, allgather,
                                    alltoall, barrier, broadcast,
                                    global_process_set, grouped_allgather,
                                    remove_process_set,
                                    ccl_built, cross_rank, cross_size,
                                    cuda_built, ddl_built, gloo_built, init,
                                    is_homogeneous, is_initialized, join,
                                    local_rank, local_rank_op, local_size,
                                    local_size_op, mpi_built,
                                    mpi_threads_supported, nccl_built,
                                    process_set_included_op, rank,
                                    rank_op, resolve_op, rocm_built,
                                    shutdown, size, size_op,
                                    start_timeline, stop_timeline)
from hvd.tensorflow.util import _executing_eagerly
from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
from hvd.tensorflow import mpi_ops as _mpi_ops


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None,
              process_set=global_process_set, ignore_name_scope=False):
    """Reduces a tf.Tensor, tf.Variable or tf.IndexedSlices over every
    rank of process_set (default op: Average). An IndexedSlices is
    allgathered (values and indices) instead, as Horovod does; then only
    Sum and Average are possible. device_dense and device_sparse place the
    op, as Horovod's."""
    op = resolve_op(op, average)
    if type(tensor) is _EagerTensor and device_dense == "" and \
            compression is Compression.none and prescale_factor == 1.0 and \
            postscale_factor == 1.0 and process_set is global_process_set \
            and tf.executing_eagerly():
        # The commonest eager call, straight to the op (what _allreduce
        # would make of it: the blocking kernel for a CPU tensor).
        return _mpi_ops.MPI_LIB.hvd_allreduce(
            tensor, reduce_op=int(op), tensor_name=name or "", blocking=True)
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Sum, Average):
            raise NotImplementedError(
                "Only Sum and Average ops are supported with tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError(
                "Pre/postscale_factor are not supported with tf.IndexedSlices")
        with tf.device(device_sparse):
            values = allgather(tensor.values,
                               ignore_name_scope=ignore_name_scope,
                               process_set=process_set)
            indices = allgather(tensor.indices,
                                ignore_name_scope=ignore_name_scope,
                                process_set=process_set)
            if op == Average:
                values = values / tf.cast(
                    _set_size(_mpi_ops._psid(process_set)), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    with tf.device(device_dense):
        compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
        reduced = _allreduce(compressed, name=name, op=op,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor,
                             ignore_name_scope=ignore_name_scope,
                             process_set=process_set)
        return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="",
                      device_sparse="", compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces a list of tensors as one operation per element type (one
    negotiation, fused whatever the fusion threshold). IndexedSlices are
    allgathered one by one, as allreduce does."""
    op = resolve_op(op, average)
    tensors = list(tensors)
    results = [None] * len(tensors)
    by_type = {}
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = allreduce(t, device_dense=device_dense,
                                   device_sparse=device_sparse,
                                   compression=compression, op=op,
                                   prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor,
                                   process_set=process_set,
                                   ignore_name_scope=ignore_name_scope)
        else:
            t, ctx = compression.compress(tf.convert_to_tensor(t))
            by_type.setdefault(t.dtype, []).append((i, t, ctx))
    with tf.device(device_dense):
        for k, (dtype, group) in enumerate(sorted(by_type.items(),
                                                  key=lambda kv: kv[0].name)):
            gname = None
            if name is not None:
                gname = name if len(by_type) == 1 else "%s.%s" % (name,
                                                                  dtype.name)
            outs = _grouped_allreduce([t for _, t, _ in group], name=gname,
                                      op=op, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor,
                                      ignore_name_scope=ignore_name_scope,
                                      process_set=process_set)
            for (i, _, ctx), o in zip(group, outs):
                results[i] = compression.decompress(o, ctx)
    return results


def reducescatter(tensor, device_dense="", compression=Compression.none,
                  op=Average, name=None, process_set=global_process_set,
                  ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces a tf.Tensor over the ranks of process_set (default op:
    Average, as Horovod's) and returns this rank's rows of the result: the
    first dimension is cut in rank order, the first rows % size ranks
    getting one row more. Ranks must agree on the whole shape and type."""
    if op is None:
        op = Average
    with tf.device(device_dense):
        compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
        reduced = _reducescatter(compressed, name=name, op=op,
                                 ignore_name_scope=ignore_name_scope,
                                 process_set=process_set,
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor)
        return compression.decompress(reduced, ctx)


def grouped_reducescatter(tensors, device_dense="",
                          compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None,
                          ignore_name_scope=False):
    """reducescatter of each tensor of a list, one kernel per element type
    (Horovod requires one type; several are accepted here)."""
    if op is None:
        op = Average
    tensors = list(tensors)
    if not tensors:
        return tensors
    results = [None] * len(tensors)
    by_type = {}
    for i, t in enumerate(tensors):
        t, ctx = compression.compress(tf.convert_to_tensor(t))
        by_type.setdefault(t.dtype, []).append((i, t, ctx))
    with tf.device(device_dense):
        for dtype, group in sorted(by_type.items(),
                                   key=lambda kv: kv[0].name):
            gname = None
            if name is not None:
                gname = name if len(by_type) == 1 else "%s.%s" % (name,
                                                                  dtype.name)
            outs = _grouped_reducescatter(
                [t for _, t, _ in group], name=gname, op=op,
                ignore_name_scope=ignore_name_scope, process_set=process_set,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor)
            for (i, _, ctx), o in zip(group, outs):
                results[i] = compression.decompress(o, ctx)
    return results


from hvd.tensorflow.gradient_tape import (  # noqa: E402
    DistributedGradientTape, PartialDistributedGradientTape)
from hvd.tensorflow.optimizer import (  # noqa: E402
    BroadcastGlobalVariablesHook, DistributedOptimizer,
    broadcast_global_variables)
from hvd.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: E402

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "size_op", "rank_op",
    "local_size_op", "local_rank_op", "Sum", "Average", "Min", "Max",
    "Product", "Adasum", "Compression", "allreduce", "grouped_allreduce",
    "allgather", "grouped_allgather", "broadcast", "broadcast_", "join",
    "alltoall", "reducescatter", "grouped_reducescatter", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set",
    "process_set_included_op", "barrier", "broadcast_variables", "broadcast_object_fn", "util",
    "broadcast_global_variables", "broadcast_object", "allgather_object",
    "DistributedGradientTape", "PartialDistributedGradientTape",
    "SyncBatchNormalization", "DistributedOptimizer",
    "BroadcastGlobalVariablesHook", "HvdError", "HorovodInternalError",
    "HostsUpdatedInterrupt", "elastic",
    "MismatchError", "InvalidArgumentError", "UnsupportedError",
    "HvdMemoryError", "library_path", "mpi_threads_supported", "mpi_built",
    "gloo_built", "nccl_built", "cuda_built", "rocm_built", "ddl_built",
    "ccl_built", "is_homogeneous", "start_timeline", "stop_timeline",
]

from hvd.tensorflow import elastic  # noqa: E402
