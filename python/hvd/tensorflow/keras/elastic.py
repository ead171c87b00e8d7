"""hvd.tensorflow.keras.elastic (and hvd.keras.elastic): Horovod's
horovod.keras.elastic on the Kerases TensorFlow ships (Keras 3, and Keras 2
through tf_keras): KerasState, the callbacks that commit and track the
state, run."""

from hvd.tensorflow.elastic import TensorFlowKerasState, run
from hvd.tensorflow import _keras_compat as _compat
from hvd.tensorflow.keras.callbacks import _Callback


class KerasState(TensorFlowKerasState):
    """A Keras model and optimizer (compiled into the model by default),
    and other attributes (e.g. epoch=0, batch=0 for the callbacks)."""

    def __init__(self, model, optimizer=None, **kwargs):
        keras = _compat.keras_of(model)
        super(KerasState, self).__init__(
            model, optimizer=optimizer,
            backend=getattr(keras, "backend", None), **kwargs)


class CommitStateCallback(_Callback):
    """Commits state every batches_per_commit batches, and at the end of
    each epoch."""

    def __init__(self, state, batches_per_commit=1):
        super(CommitStateCallback, self).__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # Every rank counts from here after a re-formation.
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    on_train_batch_end = on_batch_end

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(_Callback):
    """Keeps state.batch at the last finished batch (0 at the end of an
    epoch). With steps_per_epoch, the first epoch after a re-formation is
    shortened by the batches already done."""

    def __init__(self, state):
        super(UpdateBatchStateCallback, self).__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        params = self.params or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params.get("steps")
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    on_train_batch_end = on_batch_end

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(_Callback):
    """Keeps state.epoch at the number of finished epochs, counted across
    re-formations (Keras counts from 0 at each fit())."""

    def __init__(self, state):
        super(UpdateEpochStateCallback, self).__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
