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
- the elastic KerasState on a tf_keras model;
- hvd.tensorflow's SyncBatchNormalization is a tf_keras layer whose output
  and moving statistics are one BatchNormalization's over every rank's
  rows (eager, tf.function, a TF1 session; masked; uneven batches), and
  PartialDistributedGradientTape takes tf_keras (and Keras 3) layers.

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
import hvd.tensorflow as hvd_tf  # noqa: E402
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


# ---- hvd.tensorflow's Keras layers: tf_keras ones ---------------------------


def syncbn_data(rows_of, shape, seed=11):
    """Every rank's input (rank r has rows_of(r) rows of small integers,
    whose float64 sums are exact), the same on every rank, and their
    concatenation."""
    rs = np.random.RandomState(seed)
    parts = [rs.randint(-8, 9, (rows_of(r),) + shape).astype(np.float64) + r
             for r in range(hvd.size())]
    return parts, np.concatenate(parts)


@pytest.mark.parametrize("mode", ["eager", "function", "session"])
@pytest.mark.parametrize("case", ["dense", "conv_axis1", "uneven", "masked"])
def test_sync_batch_normalization(case, mode):
    # hvd.SyncBatchNormalization is tf_keras' (tf.keras is tf_keras here):
    # the output on each rank is its rows of one plain BatchNormalization
    # over every rank's rows, and the moving statistics are that layer's.
    r = hvd.rank()
    rows_of, shape, axis = lambda k: 4, (3,), -1
    if case == "conv_axis1":
        rows_of, shape, axis = lambda k: 2, (3, 2, 2), 1
    elif case == "uneven":  # ranks hold 1, 4, 7... rows: weighted by count
        rows_of, shape = lambda k: 1 + 3 * k, (2,)
    parts, whole = syncbn_data(rows_of, shape)
    lo = sum(len(p) for p in parts[:r])
    hi = lo + len(parts[r])
    mask = None
    if case == "masked":
        mask = np.arange(len(whole)) % 3 != 1
    kw = dict(axis=axis, momentum=0.5, epsilon=1e-3,
              gamma_initializer=keras.initializers.Constant(1.5),
              beta_initializer=keras.initializers.Constant(0.25))
    sbn = hvd_tf.SyncBatchNormalization(**kw)
    assert isinstance(sbn, tf_keras.layers.BatchNormalization)
    assert sbn.name.startswith("sync_batch_normalization")
    bn = keras.layers.BatchNormalization(**kw)

    def both():
        if mask is None:
            return bn(whole, training=True), sbn(parts[r], training=True)
        return (bn(whole, training=True, mask=tf.constant(mask)),
                sbn(parts[r], training=True, mask=tf.constant(mask[lo:hi])))

    if mode == "session":
        # Horovod's test_horovod_syncbn_cpu: a TF1 graph in a session.
        with tf.Graph().as_default():
            outs = both()
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                want, got = sess.run(outs)
        rounds = 0
    else:
        run = tf.function(both) if mode == "function" else both
        for _ in range(2):  # the moving statistics move twice
            want, got = [t.numpy() for t in run()]
        rounds = 2
    np.testing.assert_allclose(got, want[lo:hi], rtol=1e-9, atol=1e-9)
    if rounds:
        assert not np.allclose(sbn.moving_mean.numpy(), 0)
        np.testing.assert_allclose(sbn.moving_mean.numpy(),
                                   bn.moving_mean.numpy(), rtol=1e-12)
        np.testing.assert_allclose(sbn.moving_variance.numpy(),
                                   bn.moving_variance.numpy(), rtol=1e-12)
        np.testing.assert_allclose(
            sbn(parts[r], training=False).numpy(),
            bn(whole, training=False).numpy()[lo:hi], rtol=1e-9, atol=1e-9)


def test_sync_batch_normalization_gradient_and_config():
    # The loss summed over ranks: each rank's input gradient is its rows'
    # of the one-process loss on the concatenation, and gamma's and
    # beta's, averaged by a DistributedGradientTape, the one-process
    # gradients / size.
    n, r = hvd.size(), hvd.rank()
    parts, whole = syncbn_data(lambda k: 3, (2,), seed=5)
    coef = np.random.RandomState(9).randn(*whole.shape)
    lo, hi = 3 * r, 3 * r + 3
    bn = keras.layers.BatchNormalization()
    sbn = hvd_tf.SyncBatchNormalization()
    x_all, x_me = tf.constant(whole), tf.constant(parts[r])
    with tf.GradientTape() as tape:
        tape.watch(x_all)
        loss = tf.reduce_sum(bn(x_all, training=True) * coef)
    want = tape.gradient(loss, [x_all] + bn.trainable_weights)
    with tf.GradientTape() as tape:
        tape.watch(x_me)
        loss = tf.reduce_sum(sbn(x_me, training=True) * coef[lo:hi])
    dtape = hvd_tf.DistributedGradientTape(tape)
    dtape.register_local_source(x_me)
    got = dtape.gradient(loss, [x_me] + sbn.trainable_weights)
    np.testing.assert_allclose(got[0].numpy() * n, want[0].numpy()[lo:hi],
                               rtol=1e-9, atol=1e-9)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g.numpy() * n, w.numpy(), rtol=1e-9,
                                   atol=1e-9)
    with pytest.raises(ValueError, match="fused"):
        hvd_tf.SyncBatchNormalization(fused=True)
    again = keras.layers.deserialize(keras.layers.serialize(sbn))
    assert type(again) is type(sbn)
    assert again.get_config() == sbn.get_config()


@pytest.mark.parametrize("num_local_layers", [0, 1, 2])
def test_partial_distributed_gradient_tape(num_local_layers):
    # Horovod's test with tf_keras layers: the local layers' gradients are
    # this rank's / size, the others the average of every rank's.
    n, r = hvd.size(), hvd.rank()
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(
            r + 1.0), bias_initializer="ones"),
        keras.layers.Dense(3, kernel_initializer=keras.initializers.Constant(
            0.5 * (r + 1)), bias_initializer="zeros"),
        keras.layers.Dense(1, kernel_initializer="ones")])
    x = tf.constant(np.random.RandomState(r).randint(-4, 5, (4, 3)),
                    tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(tf.square(model(x, training=True) - 1.0))
    plain = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
    everyone = hvd.allgather_object(plain)
    local = model.layers[:num_local_layers]
    n_local = 2 * num_local_layers
    if num_local_layers == 1:
        local = local[0]  # one layer, not in a list
    dtape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=local)
    got = dtape.gradient(loss, model.trainable_weights)
    for i, g in enumerate(got):
        if i < n_local:
            want = plain[i] / n
        else:
            want = np.mean([e[i] for e in everyone], axis=0)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-12)
    with pytest.raises(ValueError, match="local layers"):
        hvd_tf.PartialDistributedGradientTape(tape, local_layers=[object()])


def test_keras3_layers_too():
    # A process may hold both Kerases: Keras 3's layers are local layers
    # too, and keras3_class() gives the Keras 3 SyncBatchNormalization.
    import keras as keras3
    from hvd.tensorflow import sync_batch_norm
    if not keras3.__version__.startswith("3."):
        pytest.skip("keras is not Keras 3 here")
    dense = keras3.layers.Dense(1)
    dense.build((None, 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dense(tf.ones((1, 2), tf.float64)))
    dtape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=[dense])
    assert len(dtape._local_sources) == 2
    sbn = sync_batch_norm.keras3_class()()
    assert isinstance(sbn, keras3.layers.BatchNormalization)
    assert not isinstance(sbn, tf_keras.layers.Layer)
