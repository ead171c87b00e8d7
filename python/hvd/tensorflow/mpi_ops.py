"""The TensorFlow ops of libhvd_tensorflow.so (python/tensorflow/hvd_tf_ops.c)
and their Python faces, with horovod.tensorflow.mpi_ops' names.

The ops are asynchronous TensorFlow kernels: each hands its tensors' memory
to libhvd and completes when libhvd calls back, so TensorFlow runs other
ops meanwhile and the gradients of a step are in flight together.

Names: inside a graph (tf.function, TF1) an operation is keyed by a name
unique in that graph, derived from its input's tensor name as Horovod does
(the graph is built the same way on every rank); eagerly, an op without an
explicit name is matched by order (eager ops run one at a time, in program
order).

The library is looked for in this order: ``HVD_TF_LIBRARY``; next to this
package (a pip install puts it there); next to the libhvd the hvd package
loaded (a build tree, or ``cmake --install``'s library folder).
"""

import ctypes
import os
import re

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops

from hvd import _lib as L
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
               postscale_factor=1.0, ignore_name_scope=False):
    """Reduces tensor over every rank (default: sum). The shape and type
    must be the same on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdAllreduce", tensor, name, ignore_name_scope)
    out = MPI_LIB.hvd_allreduce(_scale(tensor, prescale_factor),
                                reduce_op=int(op), tensor_name=key)
    return _scale(out, postscale_factor)


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0,
                       postscale_factor=1.0, ignore_name_scope=False):
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
        tensor_name=key)
    return [_scale(o, postscale_factor) for o in outs]


def allgather(tensor, name=None, ignore_name_scope=False):
    """Concatenates every rank's tensor along the first dimension, which
    may differ between ranks; the other dimensions must agree."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdAllgather", tensor, name, ignore_name_scope)
    out = MPI_LIB.hvd_allgather(tensor, tensor_name=key)
    if not _executing_eagerly() and tensor.shape.rank is not None:
        out.set_shape([None] + tensor.shape.as_list()[1:])
    return out


def grouped_allgather(tensors, name=None, ignore_name_scope=False):
    """allgather of each tensor of a list; in a graph they are all in
    flight together."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    return [allgather(t, name=None if name is None else "%s.%d" % (name, i),
                      ignore_name_scope=ignore_name_scope)
            for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False):
    """Rank root_rank's tensor, on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    key = _key("HvdBroadcast", tensor, name, ignore_name_scope)
    return MPI_LIB.hvd_broadcast(tensor, root_rank=int(root_rank),
                                 tensor_name=key)


def join():
    """Blocks until every rank has joined; allreduces of the others go on
    without this rank meanwhile. Returns the last rank to join."""
    return MPI_LIB.hvd_join()


def barrier():
    """Returns once every rank has entered it."""
    return MPI_LIB.hvd_barrier()


def size_op():
    """The number of ranks, as a tensor computed when it runs."""
    return MPI_LIB.hvd_size()


def rank_op():
    return MPI_LIB.hvd_rank()


def local_size_op():
    return MPI_LIB.hvd_local_size()


def local_rank_op():
    return MPI_LIB.hvd_local_rank()


# ---------------------------------------------------------------------
# Gradients, as Horovod defines them


@_tf_ops.RegisterGradient("HvdAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of a reduction is the same reduction of the gradient."""
    return _allreduce(grad, op=op.get_attr("reduce_op"))


@_tf_ops.RegisterGradient("HvdGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), op=op.get_attr("reduce_op"))


@_tf_ops.RegisterGradient("HvdAllgather")
def _allgather_grad(op, grad):
    """The average of the gradients, this rank's slice of it."""
    grad = _allreduce(grad, op=Average)
    with tf.device("/cpu:0"):
        first = tf.reshape(tf.shape(op.inputs[0])[0], [1])
        firsts = tf.reshape(allgather(first), [size()])
    return tf.split(grad, num_or_size_splits=firsts, axis=0)[rank()]


@_tf_ops.RegisterGradient("HvdBroadcast")
def _broadcast_grad(op, grad):
    """Every rank's gradient averaged reaches the root; the others' input
    had no effect."""
    reduced = _allreduce(grad, op=Average)
    if rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


__all__ = [
    "MPI_LIB", "init", "shutdown", "is_initialized", "size", "rank",
    "local_size", "local_rank", "cross_size", "cross_rank", "allgather",
    "grouped_allgather",
    "broadcast", "join", "barrier", "size_op", "rank_op", "local_size_op",
    "local_rank_op", "Sum", "Average", "Min", "Max", "Product", "Adasum",
]
