"""Variables and Python objects across ranks, as horovod.tensorflow's
functions."""

import tensorflow as tf

from hvd import _core
from hvd.tensorflow.mpi_ops import _psid, broadcast


def _tf_variable(v):
    """The tf.Variable that holds a Keras 3 variable's value (a
    keras.Variable of the TensorFlow backend is no tf.Variable: passed to a
    tf.function it becomes a read-only tensor), or v itself."""
    if isinstance(v, tf.Variable):
        return v
    for attr in ("_value", "value"):
        inner = getattr(v, attr, None)
        if isinstance(inner, tf.Variable):
            return inner
    return v


def _assign_broadcasts(variables, root_rank, process_set=None):
    return tf.group(*[v.assign(broadcast(v, root_rank,
                                         process_set=process_set))
                      for v in variables])


@tf.function
def _broadcast_group(variables, root_rank, ps):
    # Eagerly, one tf.function broadcasts them all, so that every variable
    # is in flight at once (retraced for each new list of variables).
    for v in variables:
        v.assign(broadcast(v, root_rank, process_set=ps))


def broadcast_variables(variables, root_rank, process_set=None):
    """Assigns rank root_rank's values to variables on every rank (of
    process_set). Eagerly it runs at once; in a graph it returns the op
    that does it. Keras 3 variables (model.variables) are assigned through
    the tf.Variable that holds each one's value."""
    variables = [_tf_variable(v) for v in variables]
    ps = _psid(process_set)
    if tf.executing_eagerly():
        return _broadcast_group(variables, root_rank, ps)
    return _assign_broadcasts(variables, root_rank, ps)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """Broadcasts rank root_rank's values into variables, in place, on
    every rank (of process_set); returns the variables' new values."""
    variables = [_tf_variable(v) for v in variables]
    outs = []
    for i, v in enumerate(variables):
        vname = None if name is None else "%s.%d" % (name, i)
        outs.append(v.assign(broadcast(v, root_rank, name=vname,
                                       process_set=process_set)))
    return outs


def broadcast_object_fn(root_rank=0, session=None, name=None,
                        process_set=None):
    """A function obj -> rank root_rank's obj (Horovod's TF1 form; here the
    object goes through libhvd directly, so no session is needed)."""
    del session
    return lambda obj: broadcast_object(obj, root_rank, name=name,
                                        process_set=process_set)


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=None):
    """Rank root_rank's picklable obj, on every rank (of process_set).
    session is Horovod's argument for TF1 and not needed here: the object
    goes through libhvd directly, not through a graph."""
    del session
    return _core.broadcast_object(obj, root_rank, name,
                                  process_set=process_set)


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every rank's (of process_set) picklable obj, as a list in rank
    order."""
    del session
    return _core.allgather_object(obj, name, process_set=process_set)
