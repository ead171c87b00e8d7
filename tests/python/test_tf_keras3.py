"""hvd.tensorflow on Keras 3 (``import keras``, TF_USE_LEGACY_KERAS unset),
at np 1-2: hvd.broadcast_variables(model.variables, root_rank) called
eagerly on a Keras 3 model (its keras.Variables, not tf.Variables) gives
every rank root_rank's values, exactly, and so does the same call inside a
tf.function and on the optimizer's variables; a tf_keras model and a Keras
3 model trained in one process each get the DistributedOptimizer of their
own Keras (the choice is made per optimizer, not per process)."""

import os

import numpy as np
import pytest
import tensorflow as tf
import keras

import hvd.tensorflow as hvd
import hvd.tensorflow.keras as hvd_keras

pytestmark = pytest.mark.skipif(
    os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True"),
    reason="this file tests Keras 3; TF_USE_LEGACY_KERAS is set")


@pytest.fixture(scope="module", autouse=True)
def session():
    hvd.init()
    yield


def _model(seed):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.Dense(2)])
    rs = np.random.RandomState(seed)
    model.set_weights([rs.uniform(-1, 1, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def _root_weights(root):
    return _model(100 + root).get_weights()


@pytest.mark.parametrize("root", [0, "last"])
def test_broadcast_variables_eager_keras3_model(root):
    root = hvd.size() - 1 if root == "last" else root
    model = _model(100 + hvd.rank())
    assert not isinstance(model.variables[0], tf.Variable)
    hvd.broadcast_variables(model.variables, root_rank=root)
    for got, want in zip(model.get_weights(), _root_weights(root)):
        np.testing.assert_array_equal(got, want)


def test_broadcast_variables_in_function_keras3_model():
    model = _model(100 + hvd.rank())

    @tf.function
    def bcast():
        hvd.broadcast_variables(model.variables, root_rank=0)

    bcast()
    for got, want in zip(model.get_weights(), _root_weights(0)):
        np.testing.assert_array_equal(got, want)


def test_broadcast_variables_eager_keras3_optimizer():
    model = _model(1)
    opt = keras.optimizers.Adam(0.1)
    opt.build(model.trainable_variables)
    for v in opt.variables:
        v.assign(np.full(v.shape, hvd.rank() + 1, dtype=v.dtype))
    hvd.broadcast_variables(opt.variables, root_rank=0)
    for v in opt.variables:
        np.testing.assert_array_equal(np.asarray(v), np.ones(v.shape))


def _same_on_all_ranks(arrays):
    for other in hvd.allgather_object([np.asarray(a) for a in arrays]):
        for o, a in zip(other, arrays):
            np.testing.assert_allclose(o, a, rtol=1e-6, atol=1e-7)


def test_keras2_and_keras3_side_by_side():
    # One process, a tf_keras (Keras 2) model and a Keras 3 one: each
    # optimizer gets the DistributedOptimizer of its own Keras, each model
    # the callbacks, and both end the same on every rank.
    tf_keras = pytest.importorskip("tf_keras")
    rs = np.random.RandomState(hvd.rank())
    x = rs.uniform(-1, 1, (4, 3)).astype(np.float32)
    y = rs.uniform(-1, 1, (4, 2)).astype(np.float32)
    k2 = tf_keras.Sequential([tf_keras.Input((3,)),
                              tf_keras.layers.Dense(2)])
    k3 = _model(hvd.rank())
    for model, opt, base in (
            (k2, tf_keras.optimizers.legacy.SGD(0.1),
             tf_keras.optimizers.legacy.Optimizer),
            (k3, keras.optimizers.SGD(0.1), keras.optimizers.Optimizer)):
        dist = hvd_keras.DistributedOptimizer(opt,
                                              backward_passes_per_step=1)
        assert isinstance(dist, base) and type(dist).__name__ == "SGD"
        model.compile(optimizer=dist, loss="mse")
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
            hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd_keras.callbacks.MetricAverageCallback()])
        _same_on_all_ranks(model.get_weights())
