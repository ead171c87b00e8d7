"""hvd: data-parallel collectives for deep-learning training, from Python.

A pure-Python binding of libhvd (through ctypes). This module has the job's
shape and the collectives on numpy arrays; ``hvd.torch`` is a drop-in for
``horovod.torch``::

    import numpy as np
    import hvd

    hvd.init()
    total = hvd.allreduce(np.arange(4.0), op=hvd.Sum)
    hvd.shutdown()

Start the processes with ``hvdrun -np N python3 train.py``. docs/python.md
describes every function.
"""

from hvd import _core
from hvd._core import (Adasum, Average, Max, Min, Product, Sum,
                       allgather_object, barrier, broadcast_object,
                       ccl_built, cross_rank, cross_size, cuda_built,
                       ddl_built, gloo_built, init, is_homogeneous,
                       is_initialized, join, local_rank, local_size,
                       mpi_built, mpi_threads_supported, nccl_built, poll,
                       rank, resolve_op, rocm_built, shutdown, size,
                       start_timeline, stop_timeline, synchronize)
from hvd.process_sets import (ProcessSet, add_process_set,
                              global_process_set, remove_process_set)
from hvd._lib import (HorovodInternalError, HostsUpdatedInterrupt,
                      HvdError, HvdMemoryError, InvalidArgumentError,
                      MismatchError, UnsupportedError, library_path)
from hvd import elastic

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "Sum", "Average", "Min", "Max",
    "Product", "Adasum", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "synchronize", "poll", "join", "barrier",
    "broadcast_object", "allgather_object", "HvdError",
    "HorovodInternalError", "HostsUpdatedInterrupt", "MismatchError",
    "InvalidArgumentError",
    "UnsupportedError", "HvdMemoryError", "library_path", "mpi_threads_supported",
    "mpi_built", "gloo_built", "nccl_built", "cuda_built", "rocm_built",
    "ddl_built", "ccl_built", "is_homogeneous", "start_timeline",
    "stop_timeline", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "elastic",
]


def _np():
    from hvd._numpy import NumpyBackend
    return NumpyBackend


# Collectives on numpy arrays. Names and arguments are those of
# horovod.torch; an out-of-place op accepts anything np.asarray takes and
# returns a new array, an in-place op (trailing _) writes into its array.
# The synchronous ones run libhvd's blocking calls on the calling thread
# (sync=True: no handle, no hand-off to the engine thread), as hvd.torch's.


def _ps(process_set):
    from hvd.process_sets import ps_id
    return ps_id(process_set)


def allreduce_async(array, average=None, name=None, op=None,
                    prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    return _core.allreduce_async(_np(), array, name,
                                 resolve_op(op, average), prescale_factor,
                                 postscale_factor, False, _ps(process_set))


def allreduce_async_(array, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    return _core.allreduce_async(_np(), array, name,
                                 resolve_op(op, average), prescale_factor,
                                 postscale_factor, True, _ps(process_set))


def allreduce(array, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Reduces array across ranks (default op: Average, as Horovod's)."""
    return _core.allreduce_async(_np(), array, name,
                                 resolve_op(op, average), prescale_factor,
                                 postscale_factor, False, _ps(process_set),
                                 sync=True)


def allreduce_(array, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    return _core.allreduce_async(_np(), array, name,
                                 resolve_op(op, average), prescale_factor,
                                 postscale_factor, True, _ps(process_set),
                                 sync=True)


def grouped_allreduce_async(arrays, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0,
                            process_set=None):
    return _core.grouped_allreduce_async(_np(), list(arrays), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         False, _ps(process_set))


def grouped_allreduce_async_(arrays, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=None):
    return _core.grouped_allreduce_async(_np(), list(arrays), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         True, _ps(process_set))


def grouped_allreduce(arrays, average=None, name=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None):
    return _core.grouped_allreduce_async(_np(), list(arrays), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         False, _ps(process_set), sync=True)


def grouped_allreduce_(arrays, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None):
    return _core.grouped_allreduce_async(_np(), list(arrays), name,
                                         resolve_op(op, average),
                                         prescale_factor, postscale_factor,
                                         True, _ps(process_set), sync=True)


def allgather_async(array, name=None, process_set=None):
    return _core.allgather_async(_np(), array, name, ps=_ps(process_set))


def allgather(array, name=None, process_set=None):
    """Concatenates every rank's array along the first dimension (which
    may differ between ranks)."""
    return _core.allgather_async(_np(), array, name, False,
                                 _ps(process_set), sync=True)[0]


def broadcast_async(array, root_rank, name=None, process_set=None):
    return _core.broadcast_async(_np(), array, root_rank, name, False,
                                 _ps(process_set))


def broadcast_async_(array, root_rank, name=None, process_set=None):
    return _core.broadcast_async(_np(), array, root_rank, name, True,
                                 _ps(process_set))


def broadcast(array, root_rank, name=None, process_set=None):
    """root_rank's array on every rank (of process_set; root_rank is a
    rank of the job, as in Horovod)."""
    return _core.broadcast_async(_np(), array, root_rank, name, False,
                                 _ps(process_set), sync=True)


def broadcast_(array, root_rank, name=None, process_set=None):
    return _core.broadcast_async(_np(), array, root_rank, name, True,
                                 _ps(process_set), sync=True)


def alltoall_async(array, splits=None, name=None, process_set=None):
    return _core.alltoall_async(_np(), array, splits, name, with_splits=True,
                                ps=_ps(process_set))


def alltoall(array, splits=None, name=None, process_set=None):
    """Sends splits[r] rows of array (first dimension; equal parts without
    splits) to rank r and returns what every rank sent this one, in rank
    order, with splits also the rows received from each rank."""
    out = _core.alltoall_async(_np(), array, splits, name, eager=False,
                               with_splits=True, ps=_ps(process_set),
                               sync=True)
    return out if splits is not None else out[0]


def reducescatter_async(array, name=None, op=Average, prescale_factor=1.0,
                        postscale_factor=1.0, process_set=None):
    return _core.reducescatter_async(_np(), array, name,
                                     resolve_op(op, None), prescale_factor,
                                     postscale_factor, _ps(process_set))


def reducescatter(array, name=None, op=Average, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=None):
    """Reduces array across ranks and returns this rank's rows of the
    result (the first ranks get one more when they do not divide)."""
    return _core.reducescatter_async(_np(), array, name,
                                     resolve_op(op, None), prescale_factor,
                                     postscale_factor, _ps(process_set),
                                     sync=True)


def grouped_allgather(arrays, name=None, process_set=None):
    ps = _ps(process_set)
    return synchronize(_core.grouped_async(
        lambda a, n: _core.allgather_async(_np(), a, n, ps=ps), arrays, name,
        "hvd.grouped_allgather"))


def grouped_reducescatter(arrays, name=None, op=Average, process_set=None):
    op = resolve_op(op, None)
    ps = _ps(process_set)
    return synchronize(_core.grouped_async(
        lambda a, n: _core.reducescatter_async(_np(), a, n, op, 1.0, 1.0,
                                               ps),
        arrays, name, "hvd.grouped_reducescatter"))


__all__ += ["alltoall", "alltoall_async", "reducescatter",
            "reducescatter_async", "grouped_allgather",
            "grouped_reducescatter"]
