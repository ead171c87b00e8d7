"""The TensorFlow ops of libhvd_tensorflow.so (built from
python/hvd/tensorflow/_ops/) and their Python faces, with
horovod.tensorflow.mpi_ops' names.

The ops are asynchronous TensorFlow kernels: each hands its tensors' memory
to libhvd and completes when libhvd calls back, so TensorFlow runs other
ops meanwhile and the gradients of a step are in flight together. Executed
eagerly, every collective of CPU tensors runs libhvd's blocking calls
instead (the op's blocking attr), on the calling thread, which runs hvd's
engine as a C caller's does: allgather's and alltoall's two steps one
after the other, a grouped reducescatter's parts too; inside a graph an
inter-op thread must not block, and the kernels stay asynchronous.

Names: inside a graph (tf.function, TF1) an operation is keyed by a name
unique in that graph, derived from its input's tensor name as Horovod does
(the graph is built the same way on every rank); eagerly, an op without an
explicit name is matched by order (eager ops run one at a time, in program
order).

Every collective takes process_set= (default global_process_set, every
rank), as Horovod's: the op's process_set_id attr, libhvd's hvd_ps_ calls.

The library is looked for in this order: ``HVD_TF_LIBRARY``; next to this
package (a pip install puts it there); next to the libhvd the hvd package
loaded (a build tree, or ``cmake --install``'s library folder).
"""

import ctypes
import numbers
import os
import re

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops

from hvd import _lib as L
from hvd import process_sets as _ps
from hvd.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                              global_process_set, remove_process_set)
from hvd._core import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                       ccl_built, cross_rank, cross_size, cuda_built,
                       ddl_built, gloo_built, init, is_homogeneous,
                       is_initialized, local_rank, local_size, mpi_built,
                       mpi_threads_supported, nccl_built, rank, resolve_op,
                       rocm_built, shutdown, size, start_timeline,
                       stop_timeline)

LIBRARY_NAME = "libhvd_tensorflow.so"


def _library_candidates():
    env = os.environ.get("HVD_TF_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, LIBRARY_NAME),
            os.path.join(os.path.dirname(L.library_path()), LIBRARY_NAME)]


def _load():
    # The ops call libhvd without linking it: make the libhvd this package
    # uses global first, so that both share one runtime (one hvd_init).
    ctypes.CDLL(L.library_path(), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    tried = []
    for path in _library_candidates():
        if os.path.exists(path):
            return tf.load_op_library(path)
        tried.append(path)
    raise ImportError(
        "hvd.tensorflow: the TensorFlow ops are not built (no %s at %s). "
        "They are built when TensorFlow is importable at build time: "
        "pip install tensorflow-cpu (or tensorflow), then reinstall hvd "
        "(pip install --no-build-isolation . or pip install .), or in a "
        "source tree run tools/install-tf and tools/build; HVD_TF_LIBRARY "
        "may name the file" % (LIBRARY_NAME, ", ".join(tried)))


MPI_LIB = _load()


def _executing_eagerly():
    return tf.executing_eagerly()


def _normalize_name(name):
    """An operation name by TensorFlow's rules."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _key(prefix, tensor, name, ignore_name_scope=False):
    """libhvd's name for an operation: "" (matched by order) eagerly
    without a name; in a graph one unique there and the same on every
    rank."""
    if _executing_eagerly():
        return name or ""
    if name is None:
        name = "%s_%s" % (prefix, _normalize_name(tensor.name))
    if ignore_name_scope:
        return name
    return tf.compat.v1.get_default_graph().unique_name(_normalize_name(name))


def _psid(process_set):
    """The id of process_set: a ProcessSet (added), None (every rank) or
    an id already (the gradients pass their op's attr). A ProcessSet whose
    id names no set raises ValueError here, as Horovod's does (through
    ProcessSet.size()), rather than when the op runs."""
    if isinstance(process_set, int):
        return process_set
    ps = _ps.ps_id(process_set)
    if ps != 0:
        _ps.set_size(ps)
    return ps


def _op_psid(process_set_id):
    """size_op's and process_set_included_op's process_set_id: an int, as
    Horovod's (a ProcessSet is taken too)."""
    if isinstance(process_set_id, ProcessSet):
        return _ps.ps_id(process_set_id)
    if isinstance(process_set_id, bool) or not isinstance(
            process_set_id, numbers.Integral):
        raise ValueError("process_set_id must be an int (a "
                         "ProcessSet.process_set_id), got %r" %
                         (process_set_id,))
    return int(process_set_id)


def _set_size(ps):
    """The members of set ps (an id): the job's size for 0."""
    return size() if ps == 0 else _ps.set_size(ps)


def _set_rank(ps):
    """This rank's place in set ps (an id): its rank for 0."""
    return rank() if ps == 0 else _ps.set_rank(ps)


def _scale(tensor, factor):
    """tensor * factor, in float32 for 16-bit floats and in float64 for
    integers (as Horovod scales), in the tensor's type otherwise."""
    if factor == 1.0:
        return tensor
    if tensor.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(tensor, tf.float32) * float(factor),
                       tensor.dtype)
    if tensor.dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * float(factor),
                       tensor.dtype)
    return tensor * tf.cast(factor, tensor.dtype)


def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0,
               postscale_factor=1.0, ignore_name_scope=False,
               process_set=global_process_set):
    """Reduces tensor over every rank (default: sum). The shape and type
    must be the same on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdAllreduce", tensor, name, ignore_name_scope)
    out = MPI_LIB.hvd_allreduce(_scale(tensor, prescale_factor),
                                reduce_op=int(op), tensor_name=key,
                                process_set_id=_psid(process_set),
                                blocking=_executing_eagerly())
    return _scale(out, postscale_factor)


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0,
                       postscale_factor=1.0, ignore_name_scope=False,
                       process_set=global_process_set):
    """Reduces a list of tensors of one type as one operation."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if name is None and not _executing_eagerly():
        name = _normalize_name("HvdGroupedAllreduce_%s_%s" %
                               (tensors[0].name, tensors[-1].name))
    key = _key("HvdGroupedAllreduce", tensors[0], name, ignore_name_scope)
    outs = MPI_LIB.hvd_grouped_allreduce(
        [_scale(t, prescale_factor) for t in tensors], reduce_op=int(op),
        tensor_name=key, process_set_id=_psid(process_set),
        blocking=_executing_eagerly())
    return [_scale(o, postscale_factor) for o in outs]


def allgather(tensor, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Concatenates every rank's tensor along the first dimension, which
    may differ between ranks; the other dimensions must agree."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdAllgather", tensor, name, ignore_name_scope)
    out = MPI_LIB.hvd_allgather(tensor, tensor_name=key,
                                process_set_id=_psid(process_set),
                                blocking=_executing_eagerly())
    if not _executing_eagerly() and tensor.shape.rank is not None:
        out.set_shape([None] + tensor.shape.as_list()[1:])
    return out


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather of each tensor of a list (Horovod's grouped_allgather);
    in a graph, and eagerly inside a tf.function, they are all in flight
    together."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    return [allgather(t, name=None if name is None else "%s.%d" % (name, i),
                      ignore_name_scope=ignore_name_scope,
                      process_set=process_set)
            for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Rank root_rank's tensor, on every rank (of process_set: root_rank
    is a rank of the job that is a member, as in Horovod)."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdBroadcast", tensor, name, ignore_name_scope)
    return MPI_LIB.hvd_broadcast(tensor, root_rank=int(root_rank),
                                 tensor_name=key,
                                 process_set_id=_psid(process_set),
                                 blocking=_executing_eagerly())


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends splits[r] rows of tensor (along its first dimension, in rank
    order) to each rank r of process_set and concatenates, in rank order,
    the rows every rank sends this one, as Horovod's alltoall. Without
    splits the rows are cut evenly (their number must then be a multiple
    of the set's size). The ranks must agree on the type and on the
    dimensions after the first.

    Returns the output tensor; with splits, (output, received_splits): an
    int32 tensor of the rows received from each rank."""
    tensor = tf.convert_to_tensor(tensor)
    if splits is None:
        splits_ = tf.constant([], dtype=tf.int32)
    else:
        splits_ = tf.convert_to_tensor(splits)
        if splits_.dtype.is_integer and splits_.dtype != tf.int32:
            splits_ = tf.cast(splits_, tf.int32)
    key = _key("HvdAlltoall", tensor, name, ignore_name_scope)
    output, rsplits = MPI_LIB.hvd_alltoall(
        tensor, splits_, tensor_name=key, process_set_id=_psid(process_set),
        blocking=_executing_eagerly())
    return (output, rsplits) if splits is not None else output


def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False,
                   process_set=global_process_set, prescale_factor=1.0,
                   postscale_factor=1.0):
    """Reduces tensor over the ranks of process_set (default: sum) and
    returns this rank's rows of the result: the first dimension is cut
    in rank order, the first rows % size ranks one row more, as Horovod
    cuts it. The shape and type must be the same on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdReducescatter", tensor, name, ignore_name_scope)
    out = MPI_LIB.hvd_reducescatter(_scale(tensor, prescale_factor),
                                    reduce_op=int(op), tensor_name=key,
                                    process_set_id=_psid(process_set),
                                    blocking=_executing_eagerly())
    return _scale(out, postscale_factor)


def _grouped_reducescatter(tensors, name=None, op=Sum,
                           ignore_name_scope=False,
                           process_set=global_process_set,
                           prescale_factor=1.0, postscale_factor=1.0):
    """_reducescatter of each tensor of a list of one type, as one kernel
    (its parts are submitted together)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if name is None and not _executing_eagerly():
        name = _normalize_name("HvdGroupedReducescatter_%s_%s" %
                               (tensors[0].name, tensors[-1].name))
    key = _key("HvdGroupedReducescatter", tensors[0], name,
               ignore_name_scope)
    outs = MPI_LIB.hvd_grouped_reducescatter(
        [_scale(t, prescale_factor) for t in tensors], reduce_op=int(op),
        tensor_name=key, process_set_id=_psid(process_set),
        blocking=_executing_eagerly())
    return [_scale(o, postscale_factor) for o in outs]


def join():
    """Blocks until every rank has joined; allreduces of the others go on
    without this rank meanwhile. Returns the last rank to join."""
    return MPI_LIB.hvd_join()


def barrier():
    """Returns once every rank has entered it."""
    return MPI_LIB.hvd_barrier()


def size_op(process_set_id=0, name=None):
    """The number of ranks (of process set process_set_id, an id as
    ProcessSet.process_set_id; 0: the job), as a tensor computed when it
    runs. For a set that does not exist then, Horovod's code -3
    (HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET)."""
    return MPI_LIB.hvd_size(process_set_id=_op_psid(process_set_id),
                            name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank is a member of process set process_set_id (an id; 0:
    the job), else 0, as a tensor computed when it runs; -3
    (HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET) for a set that does not exist
    then, as Horovod's."""
    return MPI_LIB.hvd_process_set_included(
        process_set_id=_op_psid(process_set_id), name=name)


def rank_op(name=None):
    """This process's rank, as a tensor computed when it runs."""
    return MPI_LIB.hvd_rank(name=name)


def local_size_op(name=None):
    """The number of ranks on this host, as a tensor computed when it
    runs."""
    return MPI_LIB.hvd_local_size(name=name)


def local_rank_op(name=None):
    """This process's rank on its host, as a tensor computed when it
    runs."""
    return MPI_LIB.hvd_local_rank(name=name)


for _op in ("HvdSize", "HvdProcessSetIncluded", "HvdRank", "HvdLocalSize",
            "HvdLocalRank", "HvdJoin", "HvdBarrier"):
    _tf_ops.NotDifferentiable(_op)


# ---------------------------------------------------------------------
# Gradients, as Horovod defines them


@_tf_ops.RegisterGradient("HvdAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of a reduction is the same reduction of the gradient."""
    return _allreduce(grad, op=op.get_attr("reduce_op"),
                      process_set=op.get_attr("process_set_id"))


@_tf_ops.RegisterGradient("HvdGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), op=op.get_attr("reduce_op"),
                              process_set=op.get_attr("process_set_id"))


@_tf_ops.RegisterGradient("HvdAllgather")
def _allgather_grad(op, grad):
    """The average of the gradients, this rank's slice of it."""
    ps = op.get_attr("process_set_id")
    grad = _allreduce(grad, op=Average, process_set=ps)
    with tf.device("/cpu:0"):
        first = tf.reshape(tf.shape(op.inputs[0])[0], [1])
        firsts = tf.reshape(allgather(first, process_set=ps),
                            [_set_size(ps)])
    return tf.split(grad, num_or_size_splits=firsts, axis=0)[_set_rank(ps)]


@_tf_ops.RegisterGradient("HvdBroadcast")
def _broadcast_grad(op, grad):
    """Every rank's gradient averaged reaches the root; the others' input
    had no effect."""
    reduced = _allreduce(grad, op=Average,
                         process_set=op.get_attr("process_set_id"))
    # The same ops on every rank: eagerly, a rank that made more tensors
    # than the others would name the tensors a tf.function captures later
    # differently, and so the operations keyed by those names.
    return reduced * (1 if rank() == op.get_attr("root_rank") else 0)


@_tf_ops.RegisterGradient("HvdAlltoall")
def _alltoall_grad(op, grad_wrt_output, grad_wrt_received_splits):
    """Each row's gradient goes back to the rank that sent the row: the
    alltoall of the gradient with the received splits. The splits are
    integers: no gradient."""
    del grad_wrt_received_splits
    grad, _ = alltoall(grad_wrt_output, splits=op.outputs[1],
                       process_set=op.get_attr("process_set_id"))
    return [grad, None]


@_tf_ops.RegisterGradient("HvdReducescatter")
def _reducescatter_grad(op, grad):
    """Horovod's: every rank's gradient rows allgathered, times the set's
    size for a sum (the scale factors are multiplies of their own, which
    TensorFlow differentiates)."""
    ps = op.get_attr("process_set_id")
    if op.get_attr("reduce_op") == Sum:
        grad *= _set_size(ps)
    return allgather(grad, process_set=ps)


@_tf_ops.RegisterGradient("HvdGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    ps = op.get_attr("process_set_id")
    if op.get_attr("reduce_op") == Sum:
        grads = [g * _set_size(ps) for g in grads]
    return [allgather(g, process_set=ps) for g in grads]


__all__ = [
    "MPI_LIB", "init", "shutdown", "is_initialized", "size", "rank",
    "local_size", "local_rank", "cross_size", "cross_rank", "allgather",
    "grouped_allgather", "alltoall", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set",
    "broadcast", "join", "barrier", "size_op", "process_set_included_op",
    "rank_op", "local_size_op", "local_rank_op", "Sum", "Average", "Min", "Max", "Product", "Adasum",
]
