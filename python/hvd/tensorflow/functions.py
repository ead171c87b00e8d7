"""Variables and Python objects across ranks, as horovod.tensorflow's
functions."""

import tensorflow as tf

from hvd import _core
from hvd.tensorflow.mpi_ops import broadcast


def _assign_broadcasts(variables, root_rank):
    return tf.group(*[v.assign(broadcast(v, root_rank))
                      for v in variables])


@tf.function
def _broadcast_group(variables, root_rank):
    # Eagerly, one tf.function broadcasts them all, so that every variable
    # is in flight at once (retraced for each new list of variables).
    for v in variables:
        v.assign(broadcast(v, root_rank))


def broadcast_variables(variables, root_rank):
    """Assigns rank root_rank's values to variables on every rank. Eagerly
    it runs at once; in a graph it returns the op that does it."""
    variables = list(variables)
    if tf.executing_eagerly():
        return _broadcast_group(variables, root_rank)
    return _assign_broadcasts(variables, root_rank)


def broadcast_(variables, root_rank, name=None):
    """Broadcasts rank root_rank's values into variables, in place, on
    every rank; returns the variables' new values."""
    variables = list(variables)
    outs = []
    for i, v in enumerate(variables):
        vname = None if name is None else "%s.%d" % (name, i)
        outs.append(v.assign(broadcast(v, root_rank, name=vname)))
    return outs


def broadcast_object_fn(root_rank=0, session=None, name=None):
    """A function obj -> rank root_rank's obj (Horovod's TF1 form; here the
    object goes through libhvd directly, so no session is needed)."""
    del session
    return lambda obj: broadcast_object(obj, root_rank, name=name)


def broadcast_object(obj, root_rank=0, session=None, name=None):
    """Rank root_rank's picklable obj, on every rank. session is Horovod's
    argument for TF1 and not needed here: the object goes through libhvd
    directly, not through a graph."""
    del session
    return _core.broadcast_object(obj, root_rank, name)


def allgather_object(obj, session=None, name=None):
    """Every rank's picklable obj, as a list in rank order."""
    del session
    return _core.allgather_object(obj, name)
