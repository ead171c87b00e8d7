"""hvd.tensorflow.elastic: horovod.tensorflow.elastic over hvd (TF2,
eager): run, TensorFlowKerasState, TensorFlowState (docs/elastic.md)."""

import re

import tensorflow as tf

from hvd import _lib as L
from hvd.elastic import ObjectState, reset, run_fn
from hvd.tensorflow.functions import broadcast_object, broadcast_variables
from hvd.tensorflow.mpi_ops import rank
from hvd.tensorflow.util import _executing_eagerly

_STATUS = re.compile(r"\[(HVD_[A-Z_]+)\]")


def _as_hvd_error(e):
    """The HorovodInternalError an hvd op's tf.errors.OpError stands for
    (its message ends with "[HVD_ERR_...]"), or None."""
    m = _STATUS.search(e.message or "")
    if m is None or m.group(1) not in L.STATUS_NAMES:
        return None
    err = L.error_for(L.STATUS_NAMES.index(m.group(1)), e.message)
    return err if isinstance(err, L.HorovodInternalError) else None


def run(func):
    """Decorator: func(state, ...) runs elastically (see hvd.elastic.run);
    an hvd op failing inside TensorFlow because a peer was lost (a
    tf.errors.OpError naming an HVD_ERR_ status such as
    HVD_ERR_PEERS_CHANGED) counts as a HorovodInternalError."""

    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            err = _as_hvd_error(e)
            if err is None:
                raise
            raise err from e

    return run_fn(wrapper, _reset)


def _reset():
    reset()


def _model_built(model):
    return model.built if hasattr(model, "build") else True


def _tf_variable(v):
    """The tf.Variable behind a Keras 3 variable (the broadcast assigns
    into it inside a tf.function)."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "_value", None)
    return inner if isinstance(inner, tf.Variable) else v


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


class TensorFlowKerasState(ObjectState):
    """A Keras model and its optimizer (model.optimizer by default), and
    other attributes: save() copies the variables' values, restore()
    assigns them back, sync() broadcasts rank 0's. TF2 eager only (the
    backend argument, Horovod's for TF1, is accepted and unused)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        if not _model_built(model):
            raise ValueError("Model must be built first. Run "
                             "`model.build(input_shape)`.")
        self.optimizer = optimizer or getattr(model, "optimizer", None)
        self.backend = backend
        self._save_model()
        super(TensorFlowKerasState, self).__init__(
            bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self):
        return [_tf_variable(v) for v in
                list(self.model.variables) +
                _optimizer_variables(self.optimizer)]

    def save(self):
        self._save_model()
        super(TensorFlowKerasState, self).save()

    def restore(self):
        self._load_model()
        super(TensorFlowKerasState, self).restore()

    def sync(self):
        variables = self._variables()
        if variables:
            broadcast_variables(variables, root_rank=0)
        self._save_model()
        super(TensorFlowKerasState, self).sync()

    def _save_model(self):
        # Copies on the host: a commit must not alias the live variables.
        self._saved = [v.numpy().copy() for v in self._variables()]

    def _load_model(self):
        variables = self._variables()
        if len(variables) != len(self._saved):
            # The optimizer made its slots after the commit (it had not
            # stepped yet): restore the model, leave the new slots.
            variables = [_tf_variable(v) for v in self.model.variables]
        for var, value in zip(variables, self._saved):
            var.assign(value)


class TensorFlowState(ObjectState):
    """A list of tf.Variable (TF2 eager), and other attributes: save()
    copies their values, restore() assigns them, sync() broadcasts rank
    0's. session is Horovod's TF1 argument and must be None here."""

    def __init__(self, variables=None, session=None, **kwargs):
        if not _executing_eagerly() or session is not None:
            raise NotImplementedError(
                "hvd.tensorflow.elastic.TensorFlowState: TF2 eager only "
                "(no TF1 session)")
        if variables is None:
            raise ValueError("TensorFlowState: pass variables= (TF2 has "
                             "no global variable collection)")
        self.variables = [_tf_variable(v) for v in variables]
        self.session = None
        self._save_model()
        super(TensorFlowState, self).__init__(
            bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        self._save_model()
        super(TensorFlowState, self).save()

    def restore(self):
        for var, value in zip(self.variables, self._values):
            var.assign(value)
        super(TensorFlowState, self).restore()

    def sync(self):
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super(TensorFlowState, self).sync()

    def _save_model(self):
        self._values = [v.numpy().copy() for v in self.variables]


__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]
