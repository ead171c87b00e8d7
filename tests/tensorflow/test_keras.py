"""hvd.tensorflow.keras (and hvd.keras) as a drop-in for
horovod.tensorflow.keras on Keras 3, at any number of ranks (run by hvdrun;
every rank runs the same tests in the same order, so their collectives
match):

- DistributedOptimizer under model.fit ends with the weights that one
  process gets training on the whole global batch with the plain optimizer
  (1e-5), also with backward_passes_per_step=2 and with fp16 compression;
  in eager and tf.function loops (apply_gradients, apply,
  _compute_gradients); with hvd.SyncBatchNormalization in the model, the
  weights and moving statistics of one process with BatchNormalization;
- BroadcastGlobalVariablesCallback, MetricAverageCallback,
  LearningRateWarmupCallback, LearningRateScheduleCallback against
  Horovod's formulas;
- load_model wraps the loaded optimizer, keeping its state, and trains;
- examples/keras_synthetic.py runs.

Models are tiny and float64 (Keras' floatx is float64 in this module).
"""

import contextlib
import os
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import keras

import hvd.tensorflow.keras as hvd
from hvd.tensorflow.keras import _optimizer as _impl

# Several ranks share this machine's cores.
try:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
except RuntimeError:
    pass

GB = 8            # global batch
STEPS = 4         # steps per epoch
EPOCHS = 2
LR = 0.1


@pytest.fixture(scope="module", autouse=True)
def hvd_and_float64():
    hvd.init()
    old = keras.config.floatx()
    keras.config.set_floatx("float64")
    yield
    keras.config.set_floatx(old)


def n_r():
    return hvd.size(), hvd.rank()


def needs_even_split():
    if GB % hvd.size():
        pytest.skip("the global batch of %d does not split over %d ranks"
                    % (GB, hvd.size()))


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
    """This rank's half (1/size) of every global batch, in step order, so
    that model.fit(batch_size=GB // size, shuffle=False) steps through
    them."""
    n, r = n_r()
    b = GB // n
    idx = np.concatenate([np.arange(s * GB + r * b, s * GB + (r + 1) * b)
                          for s in range(len(x) // GB)])
    return x[idx], y[idx]


def reference(x, y, make_opt, epochs=EPOCHS, passes=1, average=False):
    """One process, the whole global batch per step, the plain optimizer.
    With passes > 1 the gradients of `passes` consecutive global batches
    are taken at the same weights and applied summed (or averaged) once,
    which is what backward_passes_per_step does. Returns the weights and
    the largest gradient element seen."""
    model = make_model()
    opt = make_opt()
    mse = keras.losses.MeanSquaredError()
    gmax = 0.0
    acc = None
    k = 0
    for _ in range(epochs):
        for s in range(len(x) // GB):
            xb = tf.constant(x[s * GB:(s + 1) * GB])
            yb = tf.constant(y[s * GB:(s + 1) * GB])
            with tf.GradientTape() as tape:
                loss = mse(yb, model(xb))
            grads = tape.gradient(loss, model.trainable_variables)
            gmax = max(gmax, max(float(tf.reduce_max(tf.abs(g)))
                                 for g in grads))
            acc = grads if acc is None else [a + g for a, g in
                                             zip(acc, grads)]
            k += 1
            if k % passes == 0:
                if average:
                    acc = [a / passes for a in acc]
                opt.apply_gradients(zip(acc, model.trainable_variables))
                acc = None
    return model.get_weights(), gmax


def fit_distributed(x, y, opt, epochs=EPOCHS, callbacks=None, model=None,
                    **compile_kw):
    model = model or make_model()
    model.compile(optimizer=opt, loss="mse", **compile_kw)
    xl, yl = local_data(x, y)
    hist = model.fit(xl, yl, batch_size=GB // hvd.size(), epochs=epochs,
                     shuffle=False, verbose=0, callbacks=callbacks or [])
    return model, hist


def assert_weights_close(got, want, atol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol)


def gathered(value):
    return hvd.allgather_object(value)


def assert_same_on_all_ranks(a, exact=False):
    """Every rank's array a equal (exactly, or but for the last bits: an
    allreduce over more than 2 ranks may add in a different order on
    different ranks)."""
    a = np.asarray(a)
    for o in gathered(a):
        if exact:
            np.testing.assert_array_equal(o, a)
        else:
            np.testing.assert_allclose(o, a, rtol=1e-12, atol=1e-12)


# ---- DistributedOptimizer under model.fit --------------------------------


@pytest.mark.parametrize("kind", ["sgd", "sgd_momentum", "adam"])
def test_fit_matches_one_process(kind):
    needs_even_split()
    make_opt = {
        "sgd": lambda: keras.optimizers.SGD(LR),
        "sgd_momentum": lambda: keras.optimizers.SGD(LR, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(0.01),
    }[kind]
    x, y = global_data()
    want, _ = reference(x, y, make_opt)
    opt = hvd.DistributedOptimizer(make_opt())
    model, _ = fit_distributed(x, y, opt)
    assert_weights_close(model.get_weights(), want, 1e-5)
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS
    assert isinstance(opt, type(make_opt()))


@pytest.mark.parametrize("average", [False, True])
def test_fit_backward_passes_per_step(average):
    # Exactly equivalent reference: on 2 consecutive steps the weights do
    # not change (the first only accumulates), so rank r's accumulator
    # holds grad L(2j, r) + grad L(2j+1, r) at the same weights w, where
    # L(s, r) is the mean loss over rank r's GB/size samples of global
    # batch s. Averaged over ranks (equal shard sizes) that is grad L(2j) +
    # grad L(2j+1) for the global-batch mean losses: the plain SGD applied
    # once per 2 steps to the sum (or, with average_aggregated_gradients,
    # the mean) of the 2 global-batch gradients taken at the same w.
    needs_even_split()
    x, y = global_data()
    want, _ = reference(x, y, lambda: keras.optimizers.SGD(LR), passes=2,
                        average=average)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                   backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    model, _ = fit_distributed(x, y, opt)
    assert_weights_close(model.get_weights(), want, 1e-5)
    # Horovod's: every backward pass counts as an iteration.
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS
    assert int(opt._agg_helper.counter.numpy()) == 0


@pytest.mark.parametrize("passes", [1, 2])
def test_fit_run_eagerly(passes):
    # model.fit(run_eagerly=True): apply() runs eagerly, every step.
    needs_even_split()
    x, y = global_data()
    want, _ = reference(x, y, lambda: keras.optimizers.SGD(LR, momentum=0.5),
                        epochs=1, passes=passes)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.5),
                                   backward_passes_per_step=passes)
    model, _ = fit_distributed(x, y, opt, epochs=1, run_eagerly=True)
    assert_weights_close(model.get_weights(), want, 1e-5)


def test_fit_jit_compile_refused_clearly():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
    model = make_model()
    model.compile(optimizer=opt, loss="mse", jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.fit(*global_data(steps=1), batch_size=GB, verbose=0)


def test_fit_fp16_compression():
    needs_even_split()
    x, y = global_data()
    want, gmax = reference(x, y, lambda: keras.optimizers.SGD(LR))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                   compression=hvd.Compression.fp16)
    model, _ = fit_distributed(x, y, opt)
    # fp16 keeps 11 significant bits: a gradient element g is sent with
    # an error below |g| * 2**-11 and the average comes back with another
    # rounding, so one step moves a weight by at most about
    # LR * gmax * 2 * 2**-11 more or less than the exact step; over the
    # EPOCHS * STEPS steps (doubled for the slightly different gradients
    # that the perturbed weights give) that bounds the difference.
    tol = EPOCHS * STEPS * LR * gmax * 4 * 2.0 ** -11
    assert tol < 1e-2
    assert_weights_close(model.get_weights(), want, tol)


def test_fit_sparse_as_dense_with_aggregation():
    # Horovod's test_sparse_as_dense_with_grad_aggregation: an Embedding's
    # IndexedSlices gradient, densified, accumulated over 2 passes.
    opt = hvd.DistributedOptimizer(keras.optimizers.RMSprop(0.001),
                                   sparse_as_dense=True,
                                   backward_passes_per_step=2)
    model = keras.Sequential([keras.Input((5,), dtype="int32"),
                              keras.layers.Embedding(50, 4)])
    rs = np.random.RandomState(7)
    model.set_weights([rs.uniform(-0.05, 0.05, (50, 4))])
    model.compile(loss="mse", optimizer=opt)
    x = rs.randint(50, size=(8, 5))
    y = rs.uniform(size=(8, 5, 4))
    for _ in range(3):
        model.train_on_batch(x, y)
    assert int(opt._agg_helper.counter.numpy()) == 3 % 2
    assert int(opt.iterations.numpy()) == 3
    assert_same_on_all_ranks(model.get_weights()[0])


def test_fit_sparse_gradients_allgathered():
    # IndexedSlices gradients (no sparse_as_dense) go through allreduce's
    # allgather path; every rank ends with the same table.
    n, r = n_r()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5))
    model = keras.Sequential([keras.Input((3,), dtype="int32"),
                              keras.layers.Embedding(20, 2)])
    model.set_weights([np.zeros((20, 2))])
    model.compile(loss="mse", optimizer=opt)
    x = np.array([[r, r + 1, 10]])
    model.train_on_batch(x, np.ones((1, 3, 2)))
    w = model.get_weights()[0]
    assert_same_on_all_ranks(w)
    # Row 10 is looked up on every rank: its update is every rank's.
    assert w[10, 0] > 0 and np.allclose(w[10], w[10, 0])


# ---- DistributedOptimizer in eager and tf.function loops -----------------


def _rank_grad(n, r):
    return tf.constant([r + 1.0, 2.0 * (r + 1), -1.0], dtype=tf.float64)


def _mean_grad(n):
    return np.mean([_rank_grad(n, r).numpy() for r in range(n)], axis=0)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("call", ["apply_gradients", "apply"])
def test_apply_averages_gradients(mode, call):
    n, r = n_r()
    w = tf.Variable(tf.zeros(3, dtype=tf.float64))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))

    def step():
        g = _rank_grad(n, r)
        if call == "apply_gradients":
            opt.apply_gradients([(g, w)])
        else:
            opt.apply([g], [w])

    if mode == "function":
        step = tf.function(step)
    step()
    np.testing.assert_allclose(w.numpy(), -_mean_grad(n), rtol=0, atol=1e-12)
    step()
    np.testing.assert_allclose(w.numpy(), -2 * _mean_grad(n), rtol=0,
                               atol=1e-12)
    assert int(opt.iterations.numpy()) == 2


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_apply_backward_passes_per_step(mode):
    n, r = n_r()
    w = tf.Variable(tf.zeros(3, dtype=tf.float64))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                   backward_passes_per_step=3)

    def step():
        opt.apply_gradients([(_rank_grad(n, r), w)])

    if mode == "function":
        step = tf.function(step)
    for k in range(1, 8):
        step()
        applied = k // 3
        np.testing.assert_allclose(w.numpy(), -3 * applied * _mean_grad(n),
                                   rtol=0, atol=1e-12)
        assert int(opt.iterations.numpy()) == k
        assert int(opt._agg_helper.counter.numpy()) == k % 3


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_apply_in_process_sets(mode):
    """process_set=: the gradients are averaged among the set's ranks only
    (here rank 0 alone, and every other rank together)."""
    n, r = n_r()
    if n == 1:
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set([0])
        return
    first = hvd.add_process_set([0])
    rest = hvd.add_process_set(list(range(1, n)))
    mine = first if r == 0 else rest
    w = tf.Variable(tf.zeros(3, dtype=tf.float64))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                   process_set=mine)

    def step():
        opt.apply_gradients([(_rank_grad(n, r), w)])

    if mode == "function":
        step = tf.function(step)
    step()
    want = np.mean([_rank_grad(n, q).numpy() for q in mine.ranks], axis=0)
    np.testing.assert_allclose(w.numpy(), -want, rtol=0, atol=1e-12)
    hvd.remove_process_set(first)
    hvd.remove_process_set(rest)


def test_compute_gradients_then_apply_reduces_once():
    # Horovod's flow: _compute_gradients allreduces, apply_gradients of
    # those very gradients must not reduce them again (op=Sum shows it).
    n, r = n_r()
    w = tf.Variable(tf.zeros(3, dtype=tf.float64))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Sum)
    g = _rank_grad(n, r)
    gv = opt._compute_gradients(lambda: tf.reduce_sum(w * g), [w])
    np.testing.assert_allclose(gv[0][0].numpy(), n * _mean_grad(n),
                               rtol=0, atol=1e-12)
    opt.apply_gradients(gv)
    np.testing.assert_allclose(w.numpy(), -n * _mean_grad(n), rtol=0,
                               atol=1e-12)
    # Gradients not from _compute_gradients are reduced.
    opt.apply_gradients([(g, w)])
    np.testing.assert_allclose(w.numpy(), -2 * n * _mean_grad(n), rtol=0,
                               atol=1e-12)


def test_groups_and_predivide():
    n, r = n_r()
    a = tf.Variable(tf.zeros(2, dtype=tf.float64))
    b = tf.Variable(tf.zeros(3, dtype=tf.float64))
    c = tf.Variable(tf.zeros(1, dtype=tf.float64))
    ga = tf.constant([1.0, 2.0], tf.float64) * (r + 1)
    gb = tf.constant([3.0, 4.0, 5.0], tf.float64) * (r + 1)
    gc = tf.constant([6.0], tf.float64) * (r + 1)
    mean = (n + 1) / 2.0
    for kw in ({"groups": 2}, {"groups": [[a, c]]}, {"num_groups": 1},
               {"gradient_predivide_factor": 2.0}):
        for v in (a, b, c):
            v.assign(tf.zeros_like(v))
        with pytest.warns(DeprecationWarning) if "num_groups" in kw else \
                contextlib.nullcontext():
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), **kw)
        opt.apply_gradients([(ga, a), (gb, b), (gc, c)])
        for v, g in ((a, ga), (b, gb), (c, gc)):
            np.testing.assert_allclose(v.numpy(), -g.numpy() / (r + 1) * mean,
                                       rtol=1e-12)


def test_register_local_var():
    n, r = n_r()
    w = tf.Variable(tf.zeros(2, dtype=tf.float64))
    loc = tf.Variable(tf.zeros(2, dtype=tf.float64))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    opt.register_local_var(loc)
    g = tf.constant([1.0, 2.0], tf.float64) * (r + 1)
    opt.apply_gradients([(g, w), (g, loc)])
    np.testing.assert_allclose(w.numpy(), -np.array([1.0, 2.0]) * (n + 1) / 2)
    # Horovod's scale_local_gradients: the local gradient divided by size.
    np.testing.assert_allclose(loc.numpy(), -g.numpy() / n)


@pytest.mark.parametrize("passes", [1, 2])
def test_partial_distributed_optimizer(passes):
    # Horovod's test_partial_distributed_optimizer, on Keras 3: the
    # gradients of the local layers' weights stay this rank's (divided by
    # size), the others are averaged.
    n, r = n_r()
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(
            r + 1.0)),
        keras.layers.Dense(3)])
    model.set_weights([w if i < 2 else np.full(w.shape, 0.5)
                       for i, w in enumerate(model.get_weights())])
    x = tf.constant(np.random.RandomState(r).uniform(size=(2, 3)))
    y = tf.constant(np.ones((2, 3)))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape_grads = tape.gradient(loss, model.trainable_weights)
    local = model.layers[0]
    opt = hvd.PartialDistributedOptimizer(
        keras.optimizers.SGD(1.0), local_layers=local,
        backward_passes_per_step=passes)
    got = [None] * 4
    for _ in range(passes):
        gv = opt._compute_gradients(loss, model.trainable_weights, tape=tape)
        got = [g.numpy() for g, _ in gv]
    everyone = gathered([g.numpy() for g in tape_grads])
    for i, g in enumerate(got):
        if i < 2:   # local
            np.testing.assert_allclose(
                g, passes * tape_grads[i].numpy() / n, rtol=1e-12)
        else:
            np.testing.assert_allclose(
                g, passes * np.mean([e[i] for e in everyone], axis=0),
                rtol=1e-12)


def test_fit_sync_batch_normalization():
    # A model with hvd.SyncBatchNormalization trained by model.fit on 1/size
    # of each global batch ends with the weights and moving statistics of
    # one process training the same model with BatchNormalization on the
    # whole global batch.
    import hvd.tensorflow as hvd_tf
    needs_even_split()

    def bn_model(layer_cls):
        model = keras.Sequential([keras.Input((4,)),
                                  keras.layers.Dense(3, activation="tanh"),
                                  layer_cls(momentum=0.5),
                                  keras.layers.Dense(1)])
        rs = np.random.RandomState(4)
        model.set_weights([rs.uniform(-1, 1, w.shape) if w.ndim == 2
                           else w for w in model.get_weights()])
        return model

    x, y = global_data(seed=6)
    ref = bn_model(keras.layers.BatchNormalization)
    opt = keras.optimizers.SGD(LR)
    mse = keras.losses.MeanSquaredError()
    for _ in range(EPOCHS):
        for s in range(len(x) // GB):
            xb = tf.constant(x[s * GB:(s + 1) * GB])
            yb = tf.constant(y[s * GB:(s + 1) * GB])
            with tf.GradientTape() as tape:
                loss = mse(yb, ref(xb, training=True))
            grads = tape.gradient(loss, ref.trainable_variables)
            opt.apply_gradients(zip(grads, ref.trainable_variables))
    model, _ = fit_distributed(
        x, y, hvd.DistributedOptimizer(keras.optimizers.SGD(LR)),
        model=bn_model(hvd_tf.SyncBatchNormalization))
    assert isinstance(model.layers[1], hvd_tf.SyncBatchNormalization)
    # The moving mean and variance are in get_weights() too.
    assert_weights_close(model.get_weights(), ref.get_weights(), 1e-8)


def test_options_and_errors():
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(keras.optimizers.SGD(),
                                 backward_passes_per_step=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD())
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(opt)
    assert opt._agg_helper is None
    # Horovod's test_from_config.
    hopt = hvd.DistributedOptimizer(keras.optimizers.Adam())
    cfg = hopt.get_config()
    assert hopt.from_config(cfg).get_config() == cfg
    copy = hopt.__class__.from_config(cfg)
    assert copy.get_config() == cfg
    assert isinstance(copy, _impl._DistributedMixin)
    assert type(hopt).__name__ == "Adam"


def test_wrapping_keeps_built_state():
    v = tf.Variable(tf.ones(2, dtype=tf.float64))
    plain = keras.optimizers.Adam(0.01)
    plain.apply_gradients([(tf.constant([1.0, 2.0], tf.float64), v)])
    opt = hvd.DistributedOptimizer(plain)
    assert opt.built and int(opt.iterations.numpy()) == 1
    for a, b in zip(opt.variables, plain.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---- callbacks ------------------------------------------------------------


def test_broadcast_global_variables_callback():
    n, r = n_r()
    x, y = global_data()
    model = make_model(seed=100 + r)
    local = model.layers[1].bias
    local_before = local.numpy().copy()
    if n > 1:
        w0 = gathered(model.get_weights()[0])
        assert not np.array_equal(w0[0], w0[1])
    # Learning rate 0: the weights after fit are exactly rank 0's initial
    # ones, but for the bias registered as local, which stays this rank's.
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.0, momentum=0.9))
    cb = hvd.callbacks.BroadcastGlobalVariablesCallback(
        0, local_variables=[local])
    fit_distributed(x, y, opt, epochs=1, callbacks=[cb], model=model)
    assert cb.broadcast_done
    # Every rank checks every rank's weights (a failure is seen by all,
    # and no rank skips the collectives that follow).
    want = make_model(seed=100).get_weights()
    everyone = gathered((model.get_weights(), local_before))
    for r_got, (got, loc) in enumerate(everyone):
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(g, loc if i == 3 else w,
                                          err_msg="rank %d" % r_got)
    # The optimizer's variables (iterations, momenta) too.
    for v in opt.variables:
        assert_same_on_all_ranks(v.numpy(), exact=True)


def test_broadcast_then_train_stays_in_step():
    n, r = n_r()
    x, y = global_data()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9))
    model, _ = fit_distributed(
        x, y, opt, model=make_model(seed=200 + r),
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for w in model.get_weights():
        assert_same_on_all_ranks(w)


class _Recorder(keras.callbacks.Callback):
    """Copies what it sees: epoch logs, and the optimizer's learning rate
    and momentum at every batch begin/end."""

    def __init__(self):
        super().__init__()
        self.epoch_logs, self.begin, self.end = [], [], []

    def _lr_m(self):
        opt = self.model.optimizer
        return (float(opt.learning_rate.numpy()),
                float(getattr(opt, "momentum", 0.0)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))

    def on_train_batch_begin(self, batch, logs=None):
        self.begin.append(self._lr_m())

    def on_train_batch_end(self, batch, logs=None):
        self.end.append(self._lr_m())


def test_metric_average_callback():
    n, r = n_r()
    x, y = global_data()
    raw = _Recorder()
    model = make_model()
    # Different data on every rank (plain optimizer): different losses.
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse",
                  metrics=["mae"])
    xl, yl = x[r::n][:8], y[r::n][:8] * (r + 1)
    hist = model.fit(xl, yl, batch_size=4, epochs=2, shuffle=False,
                     verbose=0, validation_data=(xl, yl),
                     callbacks=[raw, hvd.callbacks.MetricAverageCallback()])
    everyone_raw = gathered(raw.epoch_logs)
    everyone_hist = gathered(hist.history)
    assert set(hist.history) == {"loss", "mae", "val_loss", "val_mae"}
    for key, values in hist.history.items():
        for h in everyone_hist:
            np.testing.assert_allclose(h[key], values, rtol=1e-12)
        for e, v in enumerate(values):
            mean = np.mean([logs[e][key] for logs in everyone_raw])
            assert np.isclose(v, mean, rtol=1e-6, atol=0), (key, e)
    if n > 1:
        assert everyone_raw[0][0]["loss"] != everyone_raw[1][0]["loss"]


def test_learning_rate_warmup_callback():
    n, r = n_r()
    x, y = global_data()
    initial_lr = 0.1 * n
    warmup = 2
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    rec = _Recorder()
    cb = hvd.callbacks.LearningRateWarmupCallback(initial_lr,
                                                  warmup_epochs=warmup,
                                                  verbose=0)
    _, hist = fit_distributed(x, y, opt, epochs=3, callbacks=[cb, rec])
    assert cb.steps_per_epoch == STEPS  # autodetected from fit's params
    prev = 0.05
    for k, (lr, momentum) in enumerate(rec.begin):
        epoch, batch = divmod(k, STEPS)
        if epoch < warmup:
            e = epoch + float(batch) / STEPS + 1.0 / STEPS
            want = initial_lr / n * (e * (n - 1) / warmup + 1)
            # Momentum correction for the batch: 0.9 * new / old.
            assert np.isclose(momentum, 0.9 * want / prev, rtol=1e-12)
        else:
            want = prev  # warmup over: left as it ended
            assert momentum == 0.9
        assert np.isclose(lr, want, rtol=1e-12), (epoch, batch, lr, want)
        prev = want
    assert np.isclose(prev, initial_lr, rtol=1e-12)
    # Restored after every batch.
    assert all(m == 0.9 for _, m in rec.end)
    assert np.allclose(hist.history["lr"], [rec.begin[STEPS - 1][0],
                                            initial_lr, initial_lr])


def test_learning_rate_schedule_callback():
    x, y = global_data()
    initial_lr = 0.4
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.2))
    rec = _Recorder()
    callbacks = [
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr, multiplier=0.5, start_epoch=1, end_epoch=3),
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr, multiplier=lambda epoch: 1.0 / (1 + epoch),
            start_epoch=4, staircase=False),
        rec]
    _, hist = fit_distributed(x, y, opt, epochs=6, callbacks=callbacks)
    for k, (lr, momentum) in enumerate(rec.begin):
        epoch, batch = divmod(k, STEPS)
        if epoch == 0:
            want = 0.2                          # before start_epoch
        elif epoch < 3:
            want = initial_lr * 0.5 ** (epoch - 1)   # staircase
        elif epoch == 3:
            want = initial_lr * 0.5             # end_epoch is exclusive
        else:
            want = initial_lr / (1 + epoch + float(batch) / STEPS)
        assert np.isclose(lr, want, rtol=1e-12), (epoch, batch, lr, want)
    assert np.isclose(hist.history["lr"][2], initial_lr * 0.5)


# ---- load_model -------------------------------------------------------------


class MySGD(keras.optimizers.SGD):
    pass


def _tmpdir():
    return tempfile.TemporaryDirectory(prefix="hvd_keras_%d_" % hvd.rank())


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_load_model_wraps_optimizer(suffix):
    n, r = n_r()
    x, y = global_data()
    model = make_model()
    # A loss object: Keras 3.15 cannot read loss="mse" back from .h5.
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.MeanSquaredError())
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, shuffle=False, verbose=0)
    saved_iterations = int(model.optimizer.iterations.numpy())
    saved_vars = [v.numpy() for v in model.optimizer.variables]
    with _tmpdir() as d:
        path = os.path.join(d, "model" + suffix)
        model.save(path)
        loaded = hvd.load_model(path, compression=hvd.Compression.fp16)
    opt = loaded.optimizer
    assert isinstance(opt, _impl._DistributedMixin)
    assert isinstance(opt, keras.optimizers.Adam)
    assert opt._hvd_options["compression"] is hvd.Compression.fp16
    assert int(opt.iterations.numpy()) == saved_iterations
    if suffix == ".keras":  # Keras 3 keeps no slots in .h5
        for v, s in zip(opt.variables, saved_vars):
            np.testing.assert_array_equal(v.numpy(), s)
    # It trains, averaging: different data on every rank, same weights.
    loaded.fit(x[r::n][:8], y[r::n][:8], batch_size=4, epochs=1,
               shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == saved_iterations + 2
    for w in loaded.get_weights():
        assert_same_on_all_ranks(w)


def test_load_model_custom_optimizer_and_plain_reload():
    x, y = global_data()
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(MySGD(0.05)),
                  loss="mse")
    model.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0)
    with _tmpdir() as d:
        path = os.path.join(d, "model.keras")
        model.save(path)
        # Saved with a DistributedOptimizer, read back without hvd: the
        # plain class.
        plain = keras.models.load_model(
            path, custom_objects={"MySGD": MySGD})
        assert type(plain.optimizer) is MySGD
        loaded = hvd.load_model(path, custom_optimizers=[MySGD])
    assert isinstance(loaded.optimizer, MySGD)
    assert isinstance(loaded.optimizer, _impl._DistributedMixin)
    loaded.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0)


# ---- module surface ------------------------------------------------------------


def test_hvd_keras_is_the_same_module():
    import hvd.keras as hk
    import hvd.keras.callbacks as hkc
    for name in ["init", "shutdown", "size", "rank", "local_rank",
                 "local_size", "cross_rank", "cross_size", "is_initialized",
                 "allreduce", "allgather", "broadcast",
                 "broadcast_global_variables", "Compression", "Average",
                 "Sum", "mpi_built", "nccl_built", "DistributedOptimizer",
                 "load_model"]:
        assert getattr(hk, name) is getattr(hvd, name), name
    for name in ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
                 "LearningRateWarmupCallback",
                 "LearningRateScheduleCallback"]:
        assert getattr(hkc, name) is getattr(hvd.callbacks, name)
    assert hk.size() == hvd.size()


def test_value_collectives():
    n, r = n_r()
    np.testing.assert_allclose(hvd.allreduce([1.0 * r, 2.0]).numpy(),
                               [(n - 1) / 2.0, 2.0])
    np.testing.assert_allclose(hvd.allreduce([1.0], op=hvd.Sum).numpy(), [n])
    np.testing.assert_array_equal(hvd.allgather([[r]]).numpy(),
                                  [[i] for i in range(n)])
    assert hvd.broadcast(float(r + 5), root_rank=0).numpy() == 5.0


# ---- the example --------------------------------------------------------------


def test_example_keras_synthetic(capsys):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "examples"))
    try:
        import keras_synthetic
    finally:
        sys.path.pop(0)
    keras.config.set_floatx("float32")
    try:
        keras_synthetic.main(["--batch-size", "4", "--num-batches", "2",
                              "--epochs", "2", "--image-size", "8"])
    finally:
        keras.config.set_floatx("float64")
    out = capsys.readouterr().out
    if hvd.rank() == 0:
        assert "images/s per rank:" in out
        assert "total images/s on %d ranks:" % hvd.size() in out
