"""Keras callbacks of horovod.tensorflow.keras.callbacks, for Keras 3 and
Keras 2 (tf_keras): each is a Keras 3 callback that also answers what
Keras 2's model.fit asks of one (``_implements_train_batch_hooks`` and
friends, ``_supports_tf_logs``, a settable ``model``), so the same object
serves whichever Keras the model it is given to comes from.

Each rank must pass the same callbacks in the same order: they run
collectives (a broadcast, allreduces) that every rank joins.
"""

import numpy as np
import tensorflow as tf
import keras

import hvd.tensorflow as _hvd
from hvd.tensorflow.keras._optimizer import _ref


def _value(x):
    # A float, a tf.Variable (Keras 2) or a keras.Variable (Keras 3).
    if hasattr(x, "numpy"):
        return float(x.numpy())
    return float(np.asarray(x))


def _is_default(method):
    # Both Kerases mark the base class's empty hooks so.
    return getattr(method, "_is_default", False)


class _Callback(keras.callbacks.Callback):
    """keras.callbacks.Callback (Keras 3) with what Keras 2 (tf_keras)
    reads of a callback, so that either Keras' model.fit takes it."""

    # Keras 2: the logs passed are plain numbers, not tensors.
    _supports_tf_logs = False
    # Keras 2: runs on every worker of a multi-worker strategy.
    _chief_worker_only = None
    validation_data = None

    @property
    def model(self):
        return self.__dict__.get("_model")

    @model.setter
    def model(self, model):
        self._model = model

    def set_model(self, model):
        self._model = model

    def _implements_train_batch_hooks(self):
        return not (_is_default(self.on_batch_begin) and
                    _is_default(self.on_batch_end) and
                    _is_default(self.on_train_batch_begin) and
                    _is_default(self.on_train_batch_end))

    def _implements_test_batch_hooks(self):
        return not (_is_default(self.on_test_batch_begin) and
                    _is_default(self.on_test_batch_end))

    def _implements_predict_batch_hooks(self):
        return not (_is_default(self.on_predict_batch_begin) and
                    _is_default(self.on_predict_batch_end))


def _variables_of(obj):
    v = getattr(obj, "variables", None)
    if callable(v):  # Keras 2 spelling, a method
        v = v()
    return list(v or [])


_VARIABLE_TYPES = (tf.Variable,) + (
    (keras.Variable,) if hasattr(keras, "Variable") else ())


class BroadcastGlobalVariablesCallback(_Callback):
    """Broadcasts the model's variables and its optimizer's from root_rank
    to every other rank at the end of the first batch (as Horovod's), so
    that every rank continues from the same state when training starts from
    random weights or a checkpoint read on one rank."""

    def __init__(self, root_rank, device='', local_variables=None):
        """
        Args:
            root_rank: the rank whose values every rank takes.
            device: device for the broadcasts ('' lets hvd choose).
            local_variables: a tf.Variable or a collection of them that are
                not broadcast.
        """
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_vars = set()
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, _VARIABLE_TYPES):
            local_variables = [local_variables]
        for var in local_variables:
            if not isinstance(var, _VARIABLE_TYPES):
                raise ValueError(
                    "All local variables must be of tf.Variable type.")
            self.register_local_var(var)

    def register_local_var(self, var):
        """Registers a variable as worker local: it is not broadcast."""
        self._local_vars.add(_ref(var))

    def _broadcast(self):
        variables = [v for v in _variables_of(self.model)
                     if _ref(v) not in self._local_vars]
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            variables += _variables_of(opt)
        with tf.device(self.device):
            # One traced function, every broadcast in flight at once.
            _hvd.broadcast_variables(variables, self.root_rank)

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        self._broadcast()
        self.broadcast_done = True


class MetricAverageCallback(_Callback):
    """Averages the epoch's logged metrics over all ranks at the end of
    every epoch, in place, so the callbacks after it (and the History
    model.fit returns) see the averages. Put it before ReduceLROnPlateau,
    TensorBoard and other callbacks that read metrics."""

    def __init__(self, device=''):
        super().__init__()
        self.device = device

    def _average_metrics_in_place(self, logs):
        if not logs:
            return
        reduced = {}
        # Sorted: every rank reduces the metrics in the same order.
        for metric, value in sorted(logs.items()):
            with tf.device(self.device):
                t = tf.constant(value, dtype=tf.float64)
                reduced[metric] = float(
                    _hvd.allreduce(t, op=_hvd.Average).numpy())
        logs.update(reduced)

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


class LearningRateScheduleCallback(_Callback):
    """Sets the optimizer's learning rate to ``initial_lr * multiplier``
    from start_epoch until end_epoch (exclusive).

    multiplier is a constant (then the rate is initial_lr * multiplier **
    (epoch - start_epoch)) or a function of the epoch. With
    staircase=True the rate is set at the first batch of every epoch, from
    the integer epoch; with staircase=False at every batch, from
    ``epoch + batch / steps_per_epoch``.

    momentum_correction: while a batch runs with a changed rate, an
    optimizer's ``momentum`` is scaled by new_lr / old_lr (and restored
    after the batch), as in Goyal et al. 2017.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True,
                 steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError('Parameter `initial_lr` is required')
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.restore_momentum = None
        self.current_epoch = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self):
        params = self.params or {}
        if params.get('steps'):
            return params['steps']
        if params.get('samples') and params.get('batch_size'):
            return params['samples'] // params['batch_size']
        raise ValueError('Could not autodetect the number of steps per epoch. '
                         'Please specify the steps_per_epoch parameter to the '
                         '%s().' % self.__class__.__name__)

    def _adjust_learning_rate(self, epoch):
        opt = self.model.optimizer
        old_lr = _value(opt.learning_rate)
        new_lr = self.initial_lr * self.multiplier(epoch)
        opt.learning_rate = new_lr
        if hasattr(opt, 'momentum') and self.momentum_correction \
                and old_lr != 0:
            momentum = opt.momentum
            if hasattr(momentum, 'assign'):
                self.restore_momentum = _value(momentum)
                momentum.assign(self.restore_momentum * new_lr / old_lr)
            else:
                self.restore_momentum = momentum
                opt.momentum = momentum * new_lr / old_lr

    def _restore_momentum_if_needed(self):
        if self.restore_momentum:
            opt = self.model.optimizer
            if hasattr(opt.momentum, 'assign'):
                opt.momentum.assign(self.restore_momentum)
            else:
                opt.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _value(self.model.optimizer.learning_rate)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch or
                (self.end_epoch is not None and
                 self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(
                self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs['lr'] = _value(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual learning rate warmup (Goyal et al. 2017,
    https://arxiv.org/abs/1706.02677): from ``initial_lr / size`` at the
    start to ``initial_lr`` at the end of warmup_epochs, at every batch::

        epoch' = epoch + (batch + 1) / steps_per_epoch
        lr = initial_lr / size * (epoch' * (size - 1) / warmup_epochs + 1)
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Round numbers at the end of every epoch (Horovod's).
            epoch += 1. / self.steps_per_epoch
            n = _hvd.size()
            return 1. / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and \
                _hvd.rank() == 0:
            print('\nEpoch %d: finished gradual learning rate warmup to %g.'
                  % (epoch + 1, _value(self.model.optimizer.learning_rate)))


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
