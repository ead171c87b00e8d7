"""hvd.tensorflow.keras (and hvd.keras) on Keras 2: tf_keras, which tf.keras
is with TF_USE_LEGACY_KERAS=1 (set here before TensorFlow is imported), at
np 1-2 (every rank runs the same tests in the same order):

- DistributedOptimizer under model.fit ends with the weights that one
  process gets training on the whole global batch with the plain optimizer
  (1e-5), for tf_keras' optimizers and its legacy ones, also with
  backward_passes_per_step=2 (summed or averaged); sparse gradients, with
  and without sparse_as_dense;
- the four callbacks, against Horovod's formulas;
- load_model gives the distributed optimizer with the saved state;
- the elastic KerasState on a tf_keras model.

Models are tiny and float64.
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

try:
    import tf_keras
except ImportError:
    tf_keras = None

import hvd.keras as hvd_keras  # noqa: E402
import hvd.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras  # tf_keras, as a Keras 2 user writes it
GB = 8            # global batch
STEPS = 4         # steps per epoch
EPOCHS = 2
LR = 0.1


@pytest.fixture(scope="module", autouse=True)
def hvd_and_float64():
    if tf_keras is None:
        # Exit status 77: ctest reports the test skipped, with this reason.
        pytest.exit("SKIP: this TensorFlow has no tf_keras (Keras 2; "
                    "tools/install-tf installs it)", returncode=77)
    hvd.init()
    old = keras.backend.floatx()
    keras.backend.set_floatx("float64")
    yield
    keras.backend.set_floatx(old)


def test_tf_keras_is_keras_2():
    assert tf_keras.__version__.startswith("2."), tf_keras.__version__
    assert isinstance(keras.optimizers.SGD(), tf_keras.optimizers.Optimizer)
    assert isinstance(keras.layers.Dense(1), tf_keras.layers.Layer)


def make_model(seed=0, width=3):
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(width, activation="tanh"),
                              keras.layers.Dense(1)])
    rs = np.random.RandomState(seed)
    model.set_weights([rs.uniform(-1, 1, w.shape) for w in
                       model.get_weights()])
    return model


def global_data(seed=1, steps=STEPS):
    rs = np.random.RandomState(seed)
    x = rs.uniform(-1, 1, (GB * steps, 4))
    y = np.sin(x.sum(1, keepdims=True)) + 0.1 * x[:, :1]
    return x, y


def local_data(x, y):
    """This rank's 1/size of every global batch, in step order."""
    n, r = hvd.size(), hvd.rank()
    b = GB // n
    idx = np.concatenate([np.arange(s * GB + r * b, s * GB + (r + 1) * b)
                          for s in range(len(x) // GB)])
    return x[idx], y[idx]


def reference(x, y, make_opt, passes=1, average=False):
    """One process, the whole global batch per step, the plain optimizer;
    with passes > 1 the gradients of `passes` consecutive global batches,
    taken at the same weights, applied summed (or averaged) once."""
    model = make_model()
    opt = make_opt()
    mse = keras.losses.MeanSquaredError()
    acc, k = None, 0
    for _ in range(EPOCHS):
        for s in range(len(x) // GB):
            with tf.GradientTape() as tape:
                loss = mse(y[s * GB:(s + 1) * GB],
                           model(x[s * GB:(s + 1) * GB]))
            grads = tape.gradient(loss, model.trainable_variables)
            acc = grads if acc is None else [a + g for a, g in
                                             zip(acc, grads)]
            k += 1
            if k % passes == 0:
                if average:
                    acc = [a / passes for a in acc]
                opt.apply_gradients(zip(acc, model.trainable_variables))
                acc = None
    return model.get_weights()


def fit_distributed(x, y, opt, callbacks=None, model=None, epochs=EPOCHS):
    model = model or make_model()
    model.compile(optimizer=opt, loss="mse")
    xl, yl = local_data(x, y)
    hist = model.fit(xl, yl, batch_size=GB // hvd.size(), epochs=epochs,
                     shuffle=False, verbose=0, callbacks=callbacks or [])
    return model, hist


def assert_weights_close(got, want, atol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol)


def assert_same_on_all_ranks(a):
    for o in hvd.allgather_object(np.asarray(a)):
        np.testing.assert_allclose(o, a, rtol=1e-12, atol=1e-12)


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(LR),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "legacy_sgd_momentum": lambda: keras.optimizers.legacy.SGD(
        LR, momentum=0.9),
    "legacy_adam": lambda: keras.optimizers.legacy.Adam(0.01),
}


@pytest.mark.parametrize("kind", ["sgd", "legacy_adam"])
def test_fit_matches_one_process(kind):
    make_opt = OPTIMIZERS[kind]
    x, y = global_data()
    want = reference(x, y, make_opt)
    opt = hvd.DistributedOptimizer(make_opt())
    assert isinstance(opt, type(make_opt()))
    model, _ = fit_distributed(x, y, opt)
    assert_weights_close(model.get_weights(), want)
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS


@pytest.mark.parametrize("kind,average", [("sgd", True),
                                          ("legacy_sgd_momentum", False)])
def test_fit_backward_passes_per_step(kind, average):
    # On 2 consecutive steps the weights do not change (the first only
    # accumulates), so the ranks' summed gradients, averaged, are the
    # gradients of 2 global batches at the same weights (see
    # tests/tensorflow/test_keras.py).
    make_opt = OPTIMIZERS[kind]
    x, y = global_data()
    want = reference(x, y, make_opt, passes=2, average=average)
    opt = hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    model, _ = fit_distributed(x, y, opt)
    assert_weights_close(model.get_weights(), want)
    # Horovod's: every backward pass counts as an iteration.
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS
    assert int(opt._agg_helper.counter.numpy()) == 0


@pytest.mark.parametrize("legacy", [True])
def test_sparse_as_dense_with_aggregation(legacy):
    rms = keras.optimizers.legacy.RMSprop if legacy else \
        keras.optimizers.RMSprop
    opt = hvd.DistributedOptimizer(rms(0.001), sparse_as_dense=True,
                                   backward_passes_per_step=2)
    model = keras.Sequential([keras.Input((5,), dtype="int32"),
                              keras.layers.Embedding(50, 4)])
    rs = np.random.RandomState(7 + hvd.rank())
    model.set_weights([np.full((50, 4), 0.01)])
    model.compile(loss="mse", optimizer=opt)
    x = rs.randint(50, size=(8, 5))
    y = rs.uniform(size=(8, 5, 4))
    for _ in range(3):
        model.train_on_batch(x, y)
    assert int(opt._agg_helper.counter.numpy()) == 3 % 2
    assert int(opt.iterations.numpy()) == 3
    assert_same_on_all_ranks(model.get_weights()[0])


def test_sparse_gradients_allgathered():
    r = hvd.rank()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5))
    model = keras.Sequential([keras.Input((3,), dtype="int32"),
                              keras.layers.Embedding(20, 2)])
    model.set_weights([np.zeros((20, 2))])
    model.compile(loss="mse", optimizer=opt)
    model.train_on_batch(np.array([[r, r + 1, 10]]), np.ones((1, 3, 2)))
    w = model.get_weights()[0]
    assert_same_on_all_ranks(w)
    assert w[10, 0] > 0 and np.allclose(w[10], w[10, 0])


def test_compute_then_apply_in_function_with_local_var():
    # Horovod's custom-loop form: _compute_gradients then apply_gradients
    # (with Keras 2's keyword), in a tf.function; a registered local
    # variable's gradient is divided by size, not averaged.
    n, r = hvd.size(), hvd.rank()
    a = tf.Variable([0.0, 0.0], dtype=tf.float64)
    b = tf.Variable([0.0], dtype=tf.float64)
    opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(1.0))
    opt.register_local_var(b)

    @tf.function
    def step():
        pairs = opt._compute_gradients(
            lambda: -(r + 1.0) * (tf.reduce_sum(a) + tf.reduce_sum(b)),
            var_list=[a, b])
        opt.apply_gradients(pairs, experimental_aggregate_gradients=False)

    step()
    mean = np.mean([k + 1.0 for k in range(n)])
    np.testing.assert_allclose(a.numpy(), [mean, mean])
    np.testing.assert_allclose(b.numpy(), [(r + 1.0) / n])


# ---- callbacks ------------------------------------------------------------


def test_callbacks_implement_keras2_hooks():
    bcast = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    avg = hvd.callbacks.MetricAverageCallback()
    assert bcast._implements_train_batch_hooks()
    assert not avg._implements_train_batch_hooks()
    assert not bcast._implements_test_batch_hooks()
    assert not bcast._implements_predict_batch_hooks()
    assert hvd_keras.callbacks.MetricAverageCallback is type(avg)


def test_broadcast_global_variables_callback():
    # Different weights and learning rates of 0: after fit every rank has
    # the root's weights and optimizer state.
    root = hvd.size() - 1
    model = make_model(seed=10 + hvd.rank())
    want = make_model(seed=10 + root).get_weights()
    opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(
        0.0, momentum=0.5))
    x, y = global_data(steps=1)
    fit_distributed(x, y, opt, model=model, epochs=1, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(root)])
    assert_weights_close(model.get_weights(), want, 0)
    for v in opt.variables():
        assert_same_on_all_ranks(v.numpy())


def test_metric_average_callback():
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.0)), loss="mse")
    x, y = global_data(steps=1)
    xl, yl = local_data(x, y)
    own = float(model.evaluate(xl, yl, verbose=0))
    hist = model.fit(xl, yl, batch_size=len(xl), epochs=1, verbose=0,
                     callbacks=[hvd.callbacks.MetricAverageCallback()])
    want = np.mean(hvd.allgather_object(own))
    np.testing.assert_allclose(hist.history["loss"][0], want, rtol=1e-12)


def test_learning_rate_warmup_and_schedule_callbacks():
    # Horovod's formulas: warmup at every batch over 2 epochs from
    # lr / size to lr, then lr * 0.5 ** (epoch - 2) set at each epoch's
    # first batch.
    n = hvd.size()
    lr = 0.2
    seen = []

    class Record(tf_keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.lr.numpy()))

    x, y = global_data(steps=2)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr))
    _, hist = fit_distributed(x, y, opt, epochs=4, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=2),
        hvd.callbacks.LearningRateScheduleCallback(lr, 0.5, start_epoch=2),
        Record()])
    want = []
    for epoch in range(4):
        for batch in range(2):
            if epoch < 2:
                e = epoch + float(batch) / 2 + 1.0 / 2
                want.append(lr / n * (e * (n - 1) / 2 + 1))
            else:
                want.append(lr * 0.5 ** (epoch - 2))
    np.testing.assert_allclose(seen, want, rtol=1e-6)
    np.testing.assert_allclose(hist.history["lr"], [want[1], want[3],
                                                    want[5], want[7]],
                               rtol=1e-6)


# ---- load_model, elastic ----------------------------------------------------


@pytest.mark.parametrize("suffix,legacy", [(".keras", False), (".h5", True)])
def test_load_model_wraps_optimizer(tmp_path, suffix, legacy):
    x, y = global_data()
    make_opt = OPTIMIZERS["legacy_adam" if legacy else "adam"]
    model = make_model()
    model.compile(optimizer=make_opt(), loss="mse")
    model.fit(x, y, batch_size=GB, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / ("m%d%s" % (hvd.rank(), suffix)))
    model.save(path)
    loaded = hvd.load_model(path, legacy_opts=legacy)
    opt = loaded.optimizer
    assert opt.__class__.__name__ == "Adam"
    assert hasattr(opt, "_hvd_options"), type(opt).__mro__
    assert int(opt.iterations.numpy()) == STEPS
    want = model.optimizer.variables()
    got = opt.variables()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    loaded.fit(*local_data(x, y), batch_size=GB // hvd.size(), epochs=1,
               shuffle=False, verbose=0)
    assert_same_on_all_ranks(loaded.get_weights()[0])


def test_elastic_keras_state():
    model = make_model(seed=20 + hvd.rank())
    root = make_model(seed=20).get_weights()
    state = hvd.elastic.KerasState(model, keras.optimizers.Adam(0.01),
                                   epoch=3 + hvd.rank())
    state.sync()
    assert_weights_close(model.get_weights(), root, 0)
    assert state.epoch == 3
    model.set_weights([w + 1 for w in root])
    state.restore()
    assert_weights_close(model.get_weights(), root, 0)
    assert isinstance(hvd.elastic.CommitStateCallback(state),
                      hvd.callbacks._Callback)
