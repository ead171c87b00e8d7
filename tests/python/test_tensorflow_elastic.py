"""hvd.tensorflow.elastic and hvd_keras.elastic (TF2 eager), at np 1-2:
the states' commit, restore and sync (rank 0's values, exactly), the run
loop's reading of an hvd op's TensorFlow error, the Keras callbacks."""

import numpy as np
import pytest
import tensorflow as tf

import hvd.tensorflow as hvd
import hvd.keras as hvd_keras
from hvd import _lib as L
from hvd.tensorflow.keras import elastic as kelastic


@pytest.fixture(scope="module", autouse=True)
def session():
    hvd.init()
    yield


def _model():
    model = tf.keras.Sequential([tf.keras.Input((3,)),
                                 tf.keras.layers.Dense(4),
                                 tf.keras.layers.Dense(1)])
    return model


def _step(model, opt, seed):
    rng = np.random.RandomState(seed)
    x = tf.constant(rng.randn(8, 3), tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y)
                                    for x, y in zip(a, b))


def test_names():
    assert hvd.HostsUpdatedInterrupt is L.HostsUpdatedInterrupt
    for name in ("run", "TensorFlowKerasState", "TensorFlowState"):
        assert hasattr(hvd.elastic, name)
    for name in ("run", "KerasState", "CommitStateCallback",
                 "UpdateBatchStateCallback", "UpdateEpochStateCallback"):
        assert hasattr(hvd_keras.elastic, name)


def test_tensorflow_state():
    v = tf.Variable(np.arange(4.0) + hvd.rank())
    w = tf.Variable([[1, 2]], dtype=tf.int32)
    state = hvd.elastic.TensorFlowState([v, w], epoch=hvd.rank())
    v.assign(v + 1.0)
    state.save()
    committed = _values([v, w])
    v.assign(v * 5.0)
    w.assign([[7, 7]])
    state.epoch = 99
    state.restore()
    assert _same(_values([v, w]), committed)
    assert state.epoch == hvd.rank()
    state.sync()
    assert state.epoch == 0
    np.testing.assert_array_equal(v.numpy(), np.arange(4.0) + 1.0)


def test_keras_state_commit_restore_sync():
    tf.random.set_seed(10 + hvd.rank())
    model = _model()
    opt = tf.keras.optimizers.Adam(0.01)
    _step(model, opt, hvd.rank())
    state = hvd_keras.elastic.KerasState(model, opt, epoch=0, batch=0)
    variables = list(model.variables) + list(opt.variables)
    committed = _values(variables)
    _step(model, opt, 5)
    assert not _same(_values(variables), committed)
    state.restore()
    assert _same(_values(variables), committed)
    state.sync()
    mine = _values(variables)
    every = hvd.allgather_object(mine)
    for other in every:
        assert _same(other, every[0])


def test_run_reads_hvd_errors(monkeypatch):
    class Fake:
        resets = 0

        def fn(self, name):
            if name == "reset":
                def reset():
                    self.resets += 1
                    return 0
                return reset
            return lambda: 1 if name == "enabled" else 0

    fake = Fake()
    monkeypatch.setattr(L, "elastic", fake.fn)
    v = tf.Variable([1.0])
    state = hvd.elastic.TensorFlowState([v])
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(1)
        if len(calls) == 1:
            raise tf.errors.UnavailableError(
                None, None, "hvd allreduce 'x' on rank 0: the job's ranks "
                "changed [HVD_ERR_PEERS_CHANGED]")
        return "ok"

    assert train(state) == "ok"
    assert fake.resets == 1

    @hvd.elastic.run
    def mismatch(state):
        raise tf.errors.FailedPreconditionError(
            None, None, "ranks disagree [HVD_ERR_MISMATCH]")

    with pytest.raises(tf.errors.FailedPreconditionError):
        mismatch(state)
    assert fake.resets == 1


def test_keras_callbacks():
    state = hvd.elastic.TensorFlowState([tf.Variable(0.0)], epoch=2,
                                        batch=0)
    commits = []
    state.commit = lambda: commits.append((state.epoch, state.batch))
    model = _model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((12, 3), np.float32)
    y = np.zeros((12, 1), np.float32)
    # The batch and epoch callbacks first: commits see their values.
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
        kelastic.UpdateBatchStateCallback(state),
        kelastic.UpdateEpochStateCallback(state),
        kelastic.CommitStateCallback(state, batches_per_commit=2)])
    assert state.epoch == 4 and state.batch == 0
    # 3 batches an epoch, a commit every 2 batches (counted across
    # epochs, as Horovod's) and at each epoch's end.
    assert commits == [(2, 1), (3, 0), (3, 0), (3, 2), (4, 0)]
