"""hvd.tensorflow under hvdrun at np 1 and 2 (tests/tensorflow/run_tf.sh).

Every rank runs the same tests in the same order. Inputs are small
integers (in every type), so that sums, averages, products, minima and
maxima are exact and compared with ==; the training equivalences compare
2 ranks with half the global batch each against this process training
alone on the whole batch (within 1e-5).
"""

import numpy as np
import pytest
import tensorflow as tf

import hvd.tensorflow as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()

REDUCIBLE = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16,
             tf.float32, tf.float64]
MOVABLE = REDUCIBLE + [tf.uint16, tf.int16, tf.bool]
SIZES = [0, 1, 7, 1000, 65537]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
OP_NAMES = {hvd.Sum: "sum", hvd.Average: "average", hvd.Min: "min",
            hvd.Max: "max", hvd.Product: "product"}


def f64(t):
    return tf.cast(t, tf.float64).numpy()


def base(count):
    return (np.arange(count) % 5 + 1).astype(np.float64)


def contribution(op, count, r):
    """Rank r's input for op (as float64), chosen so that every result is
    exact in every type at N <= 2."""
    b = base(count)
    if op in (hvd.Sum, hvd.Average):
        return b * (2 * r + 1)  # sum b*N^2, average b*N
    if op == hvd.Product:
        return (np.arange(count) % 2 + 1).astype(np.float64)  # <= 2^N
    sign = np.where(np.arange(count) % 2 == 0, 1.0, -1.0)
    return b + 10 + sign * r  # stays positive for uint8


def expected(op, count):
    parts = [contribution(op, count, r) for r in range(N)]
    if op == hvd.Sum:
        return np.sum(parts, axis=0)
    if op == hvd.Average:
        return np.sum(parts, axis=0) / N
    if op == hvd.Min:
        return np.min(parts, axis=0)
    if op == hvd.Max:
        return np.max(parts, axis=0)
    return np.prod(parts, axis=0)


# ---------------------------------------------------------------------
# Allreduce


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", OPS, ids=lambda o: OP_NAMES[o])
@pytest.mark.parametrize("dtype", REDUCIBLE, ids=lambda d: d.name)
def test_allreduce(dtype, op, mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    for count in SIZES:
        x = tf.cast(contribution(op, count, R), dtype)
        got = run(lambda: hvd.allreduce(x, op=op))
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_array_equal(f64(got), expected(op, count))


def test_allreduce_shapes_and_default_average():
    x = tf.reshape(tf.range(24, dtype=tf.float32) * (R + 1), [2, 3, 4])
    got = hvd.allreduce(x)
    assert got.shape == (2, 3, 4)
    np.testing.assert_array_equal(
        got.numpy(), np.arange(24).reshape(2, 3, 4) * (N + 1) / 2)
    scalar = hvd.allreduce(tf.constant(float(R)), op=hvd.Sum)
    assert scalar.shape == () and scalar.numpy() == N * (N - 1) / 2


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64,
                                   tf.int32], ids=lambda d: d.name)
def test_prescale_postscale(dtype):
    x = tf.cast(base(257) * (R + 1), dtype)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5 if dtype.is_floating else 1.0)
    want = base(257) * N * (N + 1) / 2 * (2.0 * (0.5 if dtype.is_floating
                                                 else 1.0))
    np.testing.assert_array_equal(f64(got), want)


def test_allreduce_variable_and_names():
    v = tf.Variable(tf.ones([5]) * (R + 1))
    np.testing.assert_array_equal(hvd.allreduce(v, op=hvd.Sum, name="v.sum"),
                                  np.full(5, N * (N + 1) / 2))


def test_allreduce_indexed_slices():
    values = tf.constant([[1.0 + R, 2.0], [3.0, 4.0]])
    sl = tf.IndexedSlices(values, tf.constant([R, 3]),
                          dense_shape=tf.constant([5, 2]))
    out = hvd.allreduce(sl, op=hvd.Sum)
    assert isinstance(out, tf.IndexedSlices)
    assert out.values.shape == (2 * N, 2)
    dense = tf.convert_to_tensor(out).numpy()
    want = np.zeros((5, 2))
    for r in range(N):
        want[r] += [1.0 + r, 2.0]
        want[3] += [3.0, 4.0]
    np.testing.assert_array_equal(dense, want)
    avg = tf.convert_to_tensor(hvd.allreduce(sl)).numpy()
    np.testing.assert_array_equal(avg, want / N)
    with pytest.raises(NotImplementedError):
        hvd.allreduce(sl, op=hvd.Max)


def test_compression_fp16():
    x = tf.constant(base(100) * (R + 1), tf.float32)
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert got.dtype == tf.float32
    np.testing.assert_array_equal(got.numpy(), base(100) * N * (N + 1) / 2)
    i = tf.constant([1, 2, 3])
    np.testing.assert_array_equal(
        hvd.allreduce(i, op=hvd.Sum, compression=hvd.Compression.fp16),
        np.array([1, 2, 3]) * N)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_grouped_allreduce(mode):
    xs = [tf.constant(base(n) * (R + 1), tf.float32) for n in (0, 3, 1000)]
    xs.append(tf.constant(base(9) * (R + 1), tf.float64))
    xs.append(tf.constant((base(4) * (R + 1)).astype(np.int32)))
    fn = lambda: hvd.grouped_allreduce(xs, op=hvd.Sum)  # noqa: E731
    outs = fn() if mode == "eager" else tf.function(fn)()
    assert len(outs) == len(xs)
    for x, o in zip(xs, outs):
        assert o.dtype == x.dtype and o.shape == x.shape
        np.testing.assert_array_equal(
            f64(o), f64(x) / (R + 1) * N * (N + 1) / 2)
    avg = hvd.grouped_allreduce([xs[1]])
    np.testing.assert_array_equal(avg[0].numpy(),
                                  base(3) * (N + 1) / 2)


def test_in_place_when_forwarded():
    """Inputs only the op reads (fresh tensors in a tf.function) are
    reduced in place (TensorFlow forwards their buffer); the inputs a
    caller still holds are not touched."""
    x = tf.constant(base(1001) * (R + 1), tf.float32)

    @tf.function
    def f(v):
        return (hvd.allreduce(v * 1.0, op=hvd.Sum),
                hvd.broadcast(v + 0.0, N - 1),
                hvd.grouped_allreduce([v * 1.0, v * 2.0], op=hvd.Sum))

    for _ in range(2):
        a, b, (g1, g2) = f(x)
        total = base(1001) * N * (N + 1) / 2
        np.testing.assert_array_equal(a.numpy(), total)
        np.testing.assert_array_equal(b.numpy(), base(1001) * N)
        np.testing.assert_array_equal(g1.numpy(), total)
        np.testing.assert_array_equal(g2.numpy(), 2 * total)
        np.testing.assert_array_equal(x.numpy(), base(1001) * (R + 1))


def test_many_in_flight_in_one_function():
    """Fifty allreduces of one tf.function are in flight together."""
    xs = [tf.fill([i + 1], float(R + i)) for i in range(50)]

    @tf.function
    def step():
        return [hvd.allreduce(x, op=hvd.Sum) for x in xs]

    for _ in range(3):
        for i, o in enumerate(step()):
            np.testing.assert_array_equal(
                o.numpy(), np.full(i + 1, N * i + N * (N - 1) / 2))


def test_graph_mode_session():
    """TF1: the ops in a tf.compat.v1 graph, run by a Session."""
    with tf.Graph().as_default():
        a = tf.constant(base(11) * (R + 1), tf.float32)
        s = hvd.allreduce(a, op=hvd.Sum)
        g = hvd.allgather(tf.fill([R + 1, 2], R))
        b = hvd.broadcast(tf.fill([3], float(R)), 0)
        assert g.shape.as_list() == [None, 2]
        with tf.compat.v1.Session() as sess:
            for _ in range(2):
                sv, gv, bv = sess.run([s, g, b])
                np.testing.assert_array_equal(sv,
                                              base(11) * N * (N + 1) / 2)
                np.testing.assert_array_equal(
                    gv, np.concatenate([np.full([r + 1, 2], r)
                                        for r in range(N)]))
                np.testing.assert_array_equal(bv, np.zeros(3))


# ---------------------------------------------------------------------
# Allgather, broadcast


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", MOVABLE, ids=lambda d: d.name)
def test_allgather(dtype, mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    # Ranks differ in the first dimension (rank r: r + 1 rows; rank 0 also
    # once with none).
    for rows_of in (lambda r: r + 1, lambda r: 3, lambda r: 0 if r == 0 else 2):
        x = tf.cast(tf.fill([rows_of(R), 3, 2], R + 1), dtype)
        got = run(lambda: hvd.allgather(x))
        want = np.concatenate([np.full([rows_of(r), 3, 2], r + 1)
                               for r in range(N)])
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(f64(got), want.astype(np.float64)
                                      if dtype != tf.bool else want != 0)


def test_allgather_vector_and_large():
    x = tf.range(100003, dtype=tf.int64) + R * 100003
    np.testing.assert_array_equal(hvd.allgather(x).numpy(),
                                  np.arange(100003 * N))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", MOVABLE, ids=lambda d: d.name)
def test_broadcast(dtype, mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    for root in range(N):
        for count in (0, 1, 17, 70001):
            x = tf.cast(tf.fill([count], R + 1), dtype)
            got = run(lambda: hvd.broadcast(x, root))
            assert got.dtype == dtype and got.shape == x.shape
            want = 1.0 if dtype == tf.bool else float(root + 1)
            np.testing.assert_array_equal(f64(got), np.full(count, want))


# ---------------------------------------------------------------------
# Gradients


def test_allreduce_gradient():
    for op, factor in ((hvd.Sum, N), (hvd.Average, 1)):
        x = tf.Variable(tf.ones([4, 3]) * (R + 1))
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(hvd.allreduce(x, op=op) * 3.0)
        np.testing.assert_array_equal(tape.gradient(y, x).numpy(),
                                      np.full([4, 3], 3.0 * factor))


def test_allgather_gradient():
    x = tf.Variable(tf.ones([R + 1, 2]))
    with tf.GradientTape() as tape:
        g = hvd.allgather(x)
        # Row k of the gathered tensor has weight k + 1 on every rank.
        w = tf.reshape(tf.range(1, g.shape[0] + 1, dtype=tf.float32), [-1, 1])
        y = tf.reduce_sum(g * w)
    grad = tape.gradient(y, x).numpy()
    first = sum(r + 1 for r in range(R))
    want = np.repeat(np.arange(first + 1, first + R + 2,
                               dtype=np.float32).reshape(-1, 1), 2, axis=1)
    np.testing.assert_array_equal(grad, want)


def test_broadcast_gradient():
    x = tf.Variable(tf.ones([3]) * (R + 1))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.broadcast(x, 0) * (R + 2.0))
    grad = tape.gradient(y, x).numpy()
    want = np.full(3, sum(r + 2.0 for r in range(N)) / N if R == 0 else 0.0)
    np.testing.assert_array_equal(grad, want)


# ---------------------------------------------------------------------
# Variables, objects


def test_broadcast_variables_and_objects():
    vs = [tf.Variable(tf.fill([3], float(R))),
          tf.Variable(tf.constant([R, R + 1], tf.int64))]
    hvd.broadcast_variables(vs, root_rank=N - 1)
    np.testing.assert_array_equal(vs[0].numpy(), np.full(3, N - 1.0))
    np.testing.assert_array_equal(vs[1].numpy(), [N - 1, N])
    obj = hvd.broadcast_object({"rank": R, "list": [R] * 3}, root_rank=0)
    assert obj == {"rank": 0, "list": [0, 0, 0]}
    assert hvd.allgather_object(("r", R)) == [("r", r) for r in range(N)]


def test_size_rank_ops():
    assert int(hvd.size_op()) == N and int(hvd.rank_op()) == R
    assert int(hvd.local_size_op()) == hvd.local_size()
    assert int(hvd.local_rank_op()) == hvd.local_rank()
    assert hvd._executing_eagerly() and hvd.util._executing_eagerly()
    assert not tf.function(lambda: tf.constant(hvd._executing_eagerly()))()


def test_grouped_allgather_and_broadcast_in_place():
    xs = [tf.fill([R + 1, 2], R), tf.fill([2], float(R))]
    outs = hvd.grouped_allgather(xs)
    np.testing.assert_array_equal(
        outs[0].numpy(), np.concatenate([np.full([r + 1, 2], r)
                                         for r in range(N)]))
    np.testing.assert_array_equal(outs[1].numpy(),
                                  np.repeat(np.arange(N, dtype=float), 2))
    vs = [tf.Variable(tf.fill([3], float(R))), tf.Variable([R, R])]
    hvd.broadcast_(vs, root_rank=N - 1)
    np.testing.assert_array_equal(vs[0].numpy(), np.full(3, N - 1.0))
    np.testing.assert_array_equal(vs[1].numpy(), [N - 1, N - 1])
    assert hvd.broadcast_object_fn(root_rank=0)([R]) == [0]


# ---------------------------------------------------------------------
# Alltoall, reducescatter, grouped reducescatter and allgather


def a2a_rows(src, dst):
    """Rows rank src sends rank dst: 0 to 2, zero for some pairs."""
    return (src + 2 * dst) % 3


def a2a_block(src, dst):
    """Those rows, [rows, 3]: 10*src + 3*dst + row index + column, small
    enough to be exact in every type."""
    rows = a2a_rows(src, dst)
    return (10 * src + 3 * dst + np.arange(rows).reshape(-1, 1) +
            np.arange(3).reshape(1, -1)).astype(np.float64)


def as_type(a, dtype):
    return tf.cast(a % 2 if dtype == tf.bool else a, dtype)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", MOVABLE, ids=lambda d: d.name)
def test_alltoall(dtype, mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    x = as_type(np.concatenate([a2a_block(R, d) for d in range(N)]).reshape(
        -1, 3), dtype)
    splits = [a2a_rows(R, d) for d in range(N)]
    got, rsplits = run(lambda: hvd.alltoall(x, splits=splits))
    want = np.concatenate([a2a_block(s, R) for s in range(N)]).reshape(-1, 3)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_array_equal(
        f64(got), want if dtype != tf.bool else want % 2)
    assert rsplits.dtype == tf.int32
    assert rsplits.numpy().tolist() == [a2a_rows(s, R) for s in range(N)]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_alltoall_even_empty_and_splits_types(mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    # No splits: the rows evenly; one output only (as Horovod).
    x = tf.reshape(tf.range(2 * N * 4, dtype=tf.int32), [2 * N, 2, 2]) + \
        1000 * R
    got = run(lambda: hvd.alltoall(x))
    assert not isinstance(got, tuple) and got.shape == (2 * N, 2, 2)
    want = np.concatenate([np.arange(2 * N * 4).reshape(2 * N, 2, 2)
                           [2 * R:2 * R + 2] + 1000 * s for s in range(N)])
    np.testing.assert_array_equal(got.numpy(), want)
    # Empty, with and without splits; a vector; splits as int64 tensors.
    e = run(lambda: hvd.alltoall(tf.zeros([0, 4], tf.float16)))
    assert e.shape == (0, 4)
    e, rs = run(lambda: hvd.alltoall(tf.zeros([0]), splits=[0] * N))
    assert e.shape == (0,) and rs.numpy().tolist() == [0] * N
    v, rs = run(lambda: hvd.alltoall(
        tf.range(N, dtype=tf.float64) + 10 * R,
        splits=tf.ones([N], tf.int64)))
    np.testing.assert_array_equal(v.numpy(), [R + 10.0 * s for s in range(N)])
    assert rs.numpy().tolist() == [1] * N
    # Rank 0 sends everything to the last rank, the others nothing.
    n_rows = 5 if R == 0 else 0
    only = [0] * (N - 1) + [n_rows]
    g, rs = run(lambda: hvd.alltoall(tf.fill([n_rows, 2], 7.0),
                                     splits=only))
    assert g.shape == ((5, 2) if R == N - 1 else (0, 2))
    assert rs.numpy().tolist() == ([5] + [0] * (N - 1) if R == N - 1
                                   else [0] * N)


def test_alltoall_graph_shape():
    @tf.function
    def f(x):
        out, rs = hvd.alltoall(x, splits=[1] * N)
        assert out.shape.as_list() == [None, 3]
        assert rs.shape.as_list() == [None]
        return out
    assert f(tf.ones([N, 3])).shape == (N, 3)


def test_alltoall_and_reducescatter_in_session():
    """TF1: a graph run twice by a Session, gradients by tf.gradients."""
    with tf.Graph().as_default():
        x = tf.constant(np.arange(2 * N, dtype=np.float32) + 10 * R)
        out, rs = hvd.alltoall(x, splits=tf.constant([2] * N))
        y = hvd.reducescatter(tf.reshape(x, [2 * N, 1]), op=hvd.Sum)
        g = tf.gradients(tf.reduce_sum(y) + tf.reduce_sum(out), x)[0]
        with tf.compat.v1.Session() as sess:
            for _ in range(2):
                ov, rv, yv, gv = sess.run([out, rs, y, g])
                np.testing.assert_array_equal(
                    ov, np.concatenate([[2 * R + 10 * s, 2 * R + 1 + 10 * s]
                                        for s in range(N)]))
                assert rv.tolist() == [2] * N
                np.testing.assert_array_equal(
                    yv.ravel(), [N * (2 * R + k) + 10 * sum(range(N))
                                 for k in range(2)])
                np.testing.assert_array_equal(gv, np.full(2 * N, N + 1.0))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_alltoall_gradient(mode):
    splits = [a2a_rows(R, d) for d in range(N)]
    x = tf.Variable(tf.ones([sum(splits), 2], tf.float64))

    def step():
        with tf.GradientTape() as tape:
            out, _ = hvd.alltoall(x, splits=splits)
            # Row k received weighs (this rank + 1) * (k + 1).
            w = tf.cast(tf.reshape(tf.range(1, tf.shape(out)[0] + 1),
                                   [-1, 1]), tf.float64) * (R + 1)
            y = tf.reduce_sum(out * w)
        return tape.gradient(y, x)
    grad = step() if mode == "eager" else tf.function(step)()
    # Row j of the block for rank d lands at row (rows from ranks < R) + j
    # of d's output.
    want = []
    for d in range(N):
        before = sum(a2a_rows(s, d) for s in range(R))
        for j in range(a2a_rows(R, d)):
            want.append([(d + 1.0) * (before + j + 1)] * 2)
    np.testing.assert_array_equal(grad.numpy(),
                                  np.array(want).reshape(-1, 2))


@pytest.mark.skipif(N < 2, reason="a mismatch needs two ranks")
def test_alltoall_errors():
    # As Horovod raises them: a disagreement fails every rank with
    # FailedPrecondition, invalid splits with InvalidArgument.
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="ranks disagree on the type"):
        hvd.alltoall(tf.ones([N], tf.int32 if R % 2 else tf.float32))
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="HVD_ERR_MISMATCH"):
        hvd.alltoall(tf.ones([2 * N, 10 * (R + 1), 2]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="not an even multiple"):
        hvd.alltoall(tf.ones([N + 1]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="greater than the first dimension"):
        hvd.alltoall(tf.ones([N - 1]), splits=[1] * N)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Number of entries in splits"):
        hvd.alltoall(tf.ones([N]), splits=[1] * (N + 1))
    # Only rank 0's splits are wrong: every rank fails, none waits.
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        hvd.alltoall(tf.ones([N]), splits=[-1] + [1] * (N - 1) if R == 0
                     else [1] * N)
    assert ("must not be negative" if R == 0 else "rank 0 of the set") in \
        str(e.value)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        hvd.alltoall(tf.constant(1.0))
    out, _ = hvd.alltoall(tf.ones([N]), splits=[1] * N)  # the job goes on
    np.testing.assert_array_equal(out.numpy(), np.ones(N))


def scatter_rows(rows, r):
    """Horovod's cut: the first rows % N ranks one row more."""
    return rows // N + (1 if r < rows % N else 0)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", OPS, ids=lambda o: OP_NAMES[o])
@pytest.mark.parametrize("dtype", REDUCIBLE, ids=lambda d: d.name)
def test_reducescatter(dtype, op, mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    # Even, uneven, fewer rows than ranks, none.
    for rows in (2 * N, 2 * N + 1, 3 * N - 1, 1, 0):
        x = tf.cast(contribution(op, rows * 3, R).reshape(rows, 3), dtype)
        got = run(lambda: hvd.reducescatter(x, op=op))
        start = sum(scatter_rows(rows, r) for r in range(R))
        mine = scatter_rows(rows, R)
        want = expected(op, rows * 3).reshape(rows, 3)[start:start + mine]
        assert got.dtype == dtype and got.shape == (mine, 3)
        np.testing.assert_array_equal(f64(got), want)


def test_reducescatter_default_average_and_scaling():
    x = tf.reshape(tf.range(4 * N, dtype=tf.float32), [2 * N, 2]) * (R + 1)
    total = np.arange(4 * N, dtype=np.float32).reshape(2 * N, 2) * \
        sum(r + 1 for r in range(N))
    mine = total[2 * R:2 * R + 2]
    np.testing.assert_allclose(hvd.reducescatter(x).numpy(), mine / N)
    got = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5,
                            postscale_factor=4.0)
    np.testing.assert_array_equal(got.numpy(), mine * 2.0)
    h = hvd.reducescatter(tf.cast(x, tf.float16), op=hvd.Sum,
                          compression=hvd.Compression.fp16)
    assert h.dtype == tf.float16
    np.testing.assert_array_equal(f64(h), mine)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op,factor", [(hvd.Sum, N), (hvd.Average, 1)],
                         ids=["sum", "average"])
def test_reducescatter_gradient(op, factor, mode):
    rows = 2 * N + 1
    x = tf.Variable(tf.ones([rows, 2]) * (R + 1))

    def step():
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(hvd.reducescatter(x, op=op) * (R + 1.0))
        return tape.gradient(y, x)
    grad = step() if mode == "eager" else tf.function(step)()
    # Horovod's: the rows' gradients allgathered, times size for Sum.
    want = np.concatenate([np.full([scatter_rows(rows, r), 2],
                                   (r + 1.0) * factor) for r in range(N)])
    np.testing.assert_array_equal(grad.numpy(), want)


@pytest.mark.skipif(N < 2, reason="a mismatch needs two ranks")
def test_reducescatter_errors():
    # Horovod's test_horovod_reducescatter_error and _type_error.
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.reducescatter(tf.ones([17 + R] * 3))
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="HVD_ERR_MISMATCH"):
        hvd.reducescatter(tf.ones([17, 23 * 57] if R == 0 else [17, 23, 57]))
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.reducescatter(tf.ones([17] * 3, tf.int32 if R % 2 == 0
                                  else tf.float32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        hvd.reducescatter(tf.constant(float(R)))
    with pytest.raises(ValueError):
        tf.function(lambda: hvd.reducescatter(tf.constant(1.0)))()
    np.testing.assert_array_equal(
        hvd.reducescatter(tf.ones([N]), op=hvd.Sum).numpy(), [N])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_grouped_reducescatter(op, mode):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    shapes = [(2 * N + 1, 2), (N,), (1, 3), (0, 2)]
    types = [tf.float32, tf.float32, tf.int32, tf.float64]
    xs = [tf.cast(contribution(op, int(np.prod(s)), R).reshape(s), t)
          for s, t in zip(shapes, types)]
    outs = run(lambda: hvd.grouped_reducescatter(xs, op=op))
    for s, t, got in zip(shapes, types, outs):
        start = sum(scatter_rows(s[0], r) for r in range(R))
        mine = scatter_rows(s[0], R)
        want = expected(op, int(np.prod(s))).reshape(s)[start:start + mine]
        assert got.dtype == t and got.shape == want.shape
        np.testing.assert_array_equal(f64(got), want)
    assert hvd.grouped_reducescatter([]) == []


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_grouped_reducescatter_gradient(mode):
    xs = [tf.Variable(tf.ones([N + 1, 2])), tf.Variable(tf.ones([2 * N]))]

    def step():
        with tf.GradientTape() as tape:
            outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
            y = tf.add_n([tf.reduce_sum(o) * (R + 1.0) for o in outs])
        return tape.gradient(y, xs)
    grads = step() if mode == "eager" else tf.function(step)()
    for x, g in zip(xs, grads):
        rows = x.shape[0]
        want = np.concatenate([np.full([scatter_rows(rows, r)] +
                                       x.shape.as_list()[1:], (r + 1.0) * N)
                               for r in range(N)])
        np.testing.assert_array_equal(g.numpy(), want)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_grouped_allgather_gradient(mode):
    xs = [tf.Variable(tf.ones([R + 1, 2])), tf.Variable(tf.ones([2]))]

    def step():
        with tf.GradientTape() as tape:
            outs = hvd.grouped_allgather(xs)
            y = tf.add_n([tf.reduce_sum(o) * (R + 1.0) for o in outs])
        return tape.gradient(y, xs)
    grads = step() if mode == "eager" else tf.function(step)()
    # Horovod's: the average of every rank's gradient, this rank's slice.
    avg = sum(r + 1.0 for r in range(N)) / N
    np.testing.assert_array_equal(grads[0].numpy(), np.full([R + 1, 2], avg))
    np.testing.assert_array_equal(grads[1].numpy(), np.full([2], avg))


# ---------------------------------------------------------------------
# Training: 2 ranks with half the global batch == 1 rank with all of it

BATCH = 8  # global


def data():
    rng = np.random.RandomState(7)
    x = rng.randint(-4, 5, size=(BATCH * 6, 5)).astype(np.float32) / 4
    y = rng.randint(-4, 5, size=(BATCH * 6, 1)).astype(np.float32) / 4
    return x, y


def shard(a, step):
    """This rank's part of the global batch of step."""
    batch = a[step * BATCH:(step + 1) * BATCH]
    per = BATCH // N
    return batch[R * per:(R + 1) * per]


def init_weights():
    rng = np.random.RandomState(3)
    return [rng.randn(5, 4).astype(np.float32) / 3,
            np.zeros(4, np.float32), rng.randn(4, 1).astype(np.float32) / 2]


def loss_fn(ws, x, y):
    h = tf.tanh(tf.matmul(x, ws[0]) + ws[1])
    return tf.reduce_mean(tf.square(tf.matmul(h, ws[2]) - y))


def train_reference(steps, lr, accumulate=1):
    """This process alone on the global batches (no hvd)."""
    x, y = data()
    ws = [tf.Variable(w) for w in init_weights()]
    opt = tf.keras.optimizers.SGD(lr)
    pending = None
    for step in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn(ws, x[step * BATCH:(step + 1) * BATCH],
                           y[step * BATCH:(step + 1) * BATCH])
        grads = tape.gradient(loss, ws)
        pending = grads if pending is None else [a + b for a, b in
                                                 zip(pending, grads)]
        if (step + 1) % accumulate == 0:
            opt.apply_gradients(zip(pending, ws))
            pending = None
    return [w.numpy() for w in ws]


@pytest.mark.parametrize("compression", ["none", "fp16"])
@pytest.mark.parametrize("in_function", [False, True])
def test_distributed_gradient_tape_matches_one_rank(compression, in_function):
    comp = getattr(hvd.Compression, compression)
    x, y = data()
    ws = [tf.Variable(w) for w in init_weights()]
    opt = tf.keras.optimizers.SGD(0.1)

    def step_fn(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(ws, xb, yb)
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        opt.apply_gradients(zip(tape.gradient(loss, ws), ws))

    step = tf.function(step_fn) if in_function else step_fn
    for s in range(4):
        step(shard(x, s), shard(y, s))
    ref = train_reference(4, 0.1)
    # fp16 rounds every gradient to 11 bits on the wire: its tolerance is
    # that rounding, not 1e-5.
    tol = 1e-5 if compression == "none" else 2e-3
    for got, want in zip(ws, ref):
        np.testing.assert_allclose(got.numpy(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("bpps", [1, 2])
def test_tf1_distributed_optimizer_matches_one_rank(bpps):
    x, y = data()
    steps = 4
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, [None, 5])
        yp = tf.compat.v1.placeholder(tf.float32, [None, 1])
        ws = [tf.compat.v1.Variable(w) for w in init_weights()]
        loss = loss_fn(ws, xp, yp)
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            backward_passes_per_step=bpps)
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.local_variables_initializer())
            for s in range(steps):
                sess.run(train, {xp: shard(x, s), yp: shard(y, s)})
            got = sess.run(ws)
    ref = train_reference(steps, 0.1, accumulate=bpps)
    for g, w in zip(got, ref):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def test_broadcast_global_variables_hook():
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(tf.fill([4], float(R + 5)))
        step = tf.compat.v1.train.get_or_create_global_step()
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=hooks, checkpoint_dir=None) as sess:
            got = sess.run(v)
            sess.run(step)
    np.testing.assert_array_equal(got, np.full(4, 5.0))
    with pytest.raises(RuntimeError):
        hvd.broadcast_global_variables(0)  # eagerly


# ---------------------------------------------------------------------
# Errors carry the sentence


@pytest.mark.skipif(N < 2, reason="a mismatch needs two ranks")
def test_mismatch_raises_with_sentence():
    x = tf.zeros([10 + R])
    with pytest.raises(tf.errors.FailedPreconditionError) as e:
        hvd.allreduce(x, op=hvd.Sum, name="tf.mismatch")
    msg = str(e.value)
    assert "ranks disagree on 'tf.mismatch'" in msg
    assert "rank 0" in msg and "rank 1" in msg and "HVD_ERR_MISMATCH" in msg
    with pytest.raises(tf.errors.FailedPreconditionError) as e:
        hvd.allgather(tf.zeros([2, 3 + R]), name="tf.agmismatch")
    assert "dimensions after the first" in str(e.value)
    # Then the job goes on.
    np.testing.assert_array_equal(hvd.allreduce(tf.ones([3]), op=hvd.Sum),
                                  np.full(3, N))


@pytest.mark.skipif(N < 2, reason="a mismatch needs two ranks")
def test_shape_mismatch_of_equal_counts():
    # Horovod's test_horovod_allreduce_error: the same count in another
    # shape is a mismatch, eager and in a tf.function.
    x = tf.ones([2, 3] if R == 0 else [3, 2])
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"shape \[3, 2\]"):
        hvd.allreduce(x, name="tf.shape")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"shape \[2, 3\]"):
        tf.function(lambda t: hvd.broadcast(t, 0, name="tf.shape_bc"))(x)
    np.testing.assert_array_equal(
        hvd.allreduce(tf.ones([2, 3]), op=hvd.Sum, name="tf.shape"),
        np.full((2, 3), N))


# ---------------------------------------------------------------------
# Process sets


@pytest.mark.skipif(N < 2, reason="a proper subset needs two ranks")
def test_process_set():
    ranks = list(range(1, N))  # every rank but 0
    ps = hvd.add_process_set(ranks)
    try:
        M = len(ranks)
        if R in ranks:
            me = ranks.index(R)
            got = hvd.allreduce(tf.fill([3], float(R)), op=hvd.Sum,
                                process_set=ps)
            np.testing.assert_array_equal(got.numpy(),
                                          np.full(3, float(sum(ranks))))
            got = hvd.grouped_allreduce([tf.ones([2]), tf.ones([1])],
                                        op=hvd.Average, process_set=ps)
            assert [g.numpy().tolist() for g in got] == [[1, 1], [1]]
            got = hvd.allgather(tf.fill([R, 2], R), process_set=ps)
            np.testing.assert_array_equal(
                got.numpy(), np.concatenate([np.full([r, 2], r)
                                             for r in ranks]))
            got = hvd.broadcast(tf.fill([2], R), root_rank=N - 1,
                                process_set=ps)
            assert got.numpy().tolist() == [N - 1] * 2
            x = tf.reshape(tf.range(M * 2) + 100 * R, [M * 2, 1])
            out, rs = hvd.alltoall(x, splits=[2] * M, process_set=ps)
            np.testing.assert_array_equal(
                out.numpy().ravel(),
                np.concatenate([np.arange(2 * me, 2 * me + 2) + 100 * r
                                for r in ranks]))
            assert rs.numpy().tolist() == [2] * M
            rows = 2 * M + 1
            got = hvd.reducescatter(tf.ones([rows, 2]), op=hvd.Sum,
                                    process_set=ps)
            cut = rows // M + (1 if me < rows % M else 0)
            np.testing.assert_array_equal(got.numpy(),
                                          np.full([cut, 2], float(M)))
            got = hvd.grouped_reducescatter([tf.ones([M])], op=hvd.Average,
                                            process_set=ps)
            np.testing.assert_array_equal(got[0].numpy(), [1.0])

            @tf.function
            def f(v):
                with tf.GradientTape() as tape:
                    y = tf.reduce_sum(hvd.reducescatter(
                        v, op=hvd.Sum, process_set=ps)) + tf.reduce_sum(
                        hvd.alltoall(v, splits=[1] * M, process_set=ps)[0])
                return tape.gradient(y, v)
            v = tf.Variable(tf.ones([M]))
            # reducescatter: M (Horovod's times size); alltoall: 1.
            np.testing.assert_array_equal(f(v).numpy(), np.full(M, M + 1.0))
            # A DistributedGradientTape averages over the set's members.
            w = tf.Variable(tf.ones([2]))
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(w * float(R))
            g = hvd.DistributedGradientTape(tape, process_set=ps).gradient(
                y, [w])[0]
            np.testing.assert_array_equal(g.numpy(),
                                          np.full(2, sum(ranks) / M))
        else:
            # Not a member: refused at once, as in Horovod.
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="not a member"):
                hvd.alltoall(tf.ones([M]), process_set=ps)
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="not a member"):
                hvd.reducescatter(tf.ones([M]), process_set=ps)
    finally:
        hvd.remove_process_set(ps)
    with pytest.raises(ValueError, match="has not been added"):
        hvd.alltoall(tf.ones([N]), process_set=hvd.ProcessSet(ranks))


# ---------------------------------------------------------------------
# Local sources, PartialDistributedGradientTape, SyncBatchNormalization


def gathered_numpy(arr):
    """Every rank's numpy array arr, in rank order."""
    return hvd.allgather_object(np.asarray(arr))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("scale", [True, False])
def test_register_local_source(mode, scale):
    # w is shared (averaged), loc and the watched tensor t are this
    # rank's: their gradients stay its own, divided by size when
    # scale_local_gradients (Horovod's).
    w = tf.Variable([1.0, 2.0], dtype=tf.float64)
    loc = tf.Variable([3.0, 4.0, 5.0], dtype=tf.float64)
    t = tf.constant([1.0], dtype=tf.float64)
    k = float(R + 1)

    def grads():
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = (tf.reduce_sum(w * w) * k + tf.reduce_sum(loc) * k * k +
                 tf.reduce_sum(t) * 7.0 * k)
        tape = hvd.DistributedGradientTape(tape,
                                           scale_local_gradients=scale)
        tape.register_local_source(loc)
        tape.register_local_source(t)
        return tape.gradient(y, {"w": w, "rest": [loc, t]})

    g = tf.function(grads)() if mode == "function" else grads()
    div = N if scale else 1
    mean_k = (N + 1) / 2.0
    np.testing.assert_array_equal(g["w"].numpy(), 2 * w.numpy() * mean_k)
    np.testing.assert_array_equal(g["rest"][0].numpy(),
                                  np.full(3, k * k) / div)
    np.testing.assert_array_equal(g["rest"][1].numpy(), [7.0 * k / div])


def test_register_local_source_sparse_and_unconnected():
    # An IndexedSlices gradient of a local source stays sparse (values
    # divided by size); a source without a gradient stays None.
    emb = tf.Variable(tf.ones([5, 2]))
    other = tf.Variable(tf.ones([2]))
    unused = tf.Variable(tf.ones([1]))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tf.gather(emb, [R % 5, 4]) * float(R + 1)) + \
            tf.reduce_sum(other) * float(R + 1)
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(emb)
    ge, go, gu = tape.gradient(y, [emb, other, unused])
    assert isinstance(ge, tf.IndexedSlices) and gu is None
    want = np.zeros([5, 2])
    want[R % 5] += (R + 1.0) / N
    want[4] += (R + 1.0) / N
    np.testing.assert_allclose(tf.convert_to_tensor(ge).numpy(), want,
                               rtol=1e-6)
    np.testing.assert_allclose(go.numpy(), np.full(2, (N + 1) / 2.0),
                               rtol=1e-6)


@pytest.mark.parametrize("num_local_layers", [0, 1, 2])
def test_partial_distributed_gradient_tape(num_local_layers):
    # Horovod's test_partial_distributed_gradient_tape, checked exactly:
    # the local layers' gradients are this rank's / size, the others the
    # average of every rank's.
    import keras
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(
            R + 1.0), bias_initializer="ones"),
        keras.layers.Dense(3, kernel_initializer=keras.initializers.Constant(
            0.5 * (R + 1)), bias_initializer="zeros"),
        keras.layers.Dense(1, kernel_initializer="ones")])
    x = tf.constant(np.random.RandomState(R).uniform(size=(4, 3)),
                    tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - 1.0))
    plain = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
    everyone = gathered_numpy(np.array(plain, dtype=object))
    local = model.layers[:num_local_layers]
    n_local = 2 * num_local_layers
    dtape = hvd.PartialDistributedGradientTape(tape, local_layers=local)
    got = dtape.gradient(loss, model.trainable_weights)
    local_pairs, global_pairs = dtape.get_local_and_global_gradients(
        loss, model.trainable_weights)
    assert [id(v) for v, _ in local_pairs] == [
        id(v) for v in model.trainable_weights[:n_local]]
    assert len(global_pairs) == len(plain) - n_local
    pairs = [g for _, g in local_pairs] + [g for _, g in global_pairs]
    for i, (g, g2) in enumerate(zip(got, pairs)):
        if i < n_local:
            want = plain[i] / N
        else:
            want = np.mean([e[i] for e in everyone], axis=0)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(g2.numpy(), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="local layers"):
        hvd.PartialDistributedGradientTape(tape, local_layers=[object()])


def test_tf_keras_layers_are_local_layers_too():
    # A process may hold both Kerases: tf_keras' layers are local layers
    # too, while hvd.SyncBatchNormalization stays Keras 3's (tf.keras is
    # Keras 3 here) and keras2_class() gives tf_keras' one.
    import keras
    tf_keras = pytest.importorskip("tf_keras")
    from hvd.tensorflow import sync_batch_norm
    dense = tf_keras.layers.Dense(1)
    dense.build((None, 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dense(tf.ones((1, 2))))
    dtape = hvd.PartialDistributedGradientTape(tape, local_layers=dense)
    assert len(dtape._local_sources) == 2
    assert isinstance(hvd.SyncBatchNormalization(),
                      keras.layers.BatchNormalization)
    sbn = sync_batch_norm.keras2_class()()
    assert isinstance(sbn, tf_keras.layers.BatchNormalization)


def test_tf1_optimizer_register_local_var():
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable([0.0, 0.0], dtype=tf.float64)
        loc = tf.compat.v1.Variable([0.0, 0.0], dtype=tf.float64)
        k = float(R + 1)
        loss = tf.reduce_sum(w) * k + tf.reduce_sum(loc) * k
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1.0))
        opt.register_local_var(loc)
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            gw, gl = sess.run([w, loc])
    np.testing.assert_array_equal(gw, np.full(2, -(N + 1) / 2.0))
    np.testing.assert_array_equal(gl, np.full(2, -k / N))


def syncbn_data(rows_of, channels_last_shape, seed=11):
    """Every rank's input (rank r has rows_of(r) rows), the same on every
    rank, and their concatenation."""
    rng = np.random.RandomState(seed)
    parts = [(rng.randn(rows_of(r), *channels_last_shape) * 3 + 2 + r)
             .astype(np.float32) for r in range(N)]
    return parts, np.concatenate(parts)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("case", ["dense", "conv_axis1", "uneven"])
def test_sync_batch_normalization(case, mode):
    import keras
    if case == "dense":
        parts, whole = syncbn_data(lambda r: 4, (3,))
        axis = -1
    elif case == "conv_axis1":
        parts, whole = syncbn_data(lambda r: 2, (3, 4, 5))
        axis = 1
    else:  # ranks hold 1, 4, 7... rows: weighted by count
        parts, whole = syncbn_data(lambda r: 1 + 3 * r, (2,))
        axis = -1
    kw = dict(axis=axis, momentum=0.5, epsilon=1e-3,
              gamma_initializer=keras.initializers.Constant(1.5),
              beta_initializer=keras.initializers.Constant(0.25))
    bn = keras.layers.BatchNormalization(**kw)
    sbn = hvd.SyncBatchNormalization(**kw)
    assert sbn.name.startswith("sync_batch_normalization")
    mine = tf.constant(parts[R])
    whole_t = tf.constant(whole)

    def both():
        return bn(whole_t, training=True), sbn(mine, training=True)

    run = tf.function(both) if mode == "function" else both
    for _ in range(2):  # the moving statistics move twice
        want, got = run()
    lo = sum(len(p) for p in parts[:R])
    np.testing.assert_allclose(got.numpy(), want.numpy()[lo:lo + len(mine)],
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sbn.moving_mean.numpy(),
                               bn.moving_mean.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sbn.moving_variance.numpy(),
                               bn.moving_variance.numpy(), rtol=1e-4,
                               atol=1e-5)
    # Inference uses the moving statistics, as the plain layer.
    np.testing.assert_allclose(
        sbn(mine, training=False).numpy(),
        bn(whole_t, training=False).numpy()[lo:lo + len(mine)],
        rtol=1e-4, atol=1e-4)


def test_sync_batch_normalization_gradient_and_errors():
    # The loss summed over ranks, through the global statistics: each
    # rank's input gradient is its rows' gradient of the one-process loss
    # on the concatenation; gamma's and beta's, averaged by a
    # DistributedGradientTape, are the one-process gradients / N.
    import keras
    parts, whole = syncbn_data(lambda r: 3, (2,), seed=5)
    coef = np.random.RandomState(9).randn(*whole.shape).astype(np.float32)
    lo, hi = 3 * R, 3 * R + 3
    bn = keras.layers.BatchNormalization()
    sbn = hvd.SyncBatchNormalization()
    x_all, x_me = tf.constant(whole), tf.constant(parts[R])
    bn.build(x_all.shape)
    sbn.build(x_me.shape)
    with tf.GradientTape() as tape:
        tape.watch(x_all)
        loss = tf.reduce_sum(bn(x_all, training=True) * coef)
    want = tape.gradient(loss, [x_all] + bn.trainable_weights)
    with tf.GradientTape() as tape:
        tape.watch(x_me)
        loss = tf.reduce_sum(sbn(x_me, training=True) * coef[lo:hi])
    dtape = hvd.DistributedGradientTape(tape)
    dtape.register_local_source(x_me)
    got = dtape.gradient(loss, [x_me] + sbn.trainable_weights)
    # x's gradient is local (divided by N by scale_local_gradients).
    np.testing.assert_allclose(got[0].numpy() * N, want[0].numpy()[lo:hi],
                               rtol=1e-4, atol=1e-4)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g.numpy() * N, w.numpy(), rtol=1e-4,
                                   atol=1e-4)
    with pytest.raises(ValueError, match="fused"):
        hvd.SyncBatchNormalization(fused=True)
    cfg = sbn.get_config()
    assert keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(sbn)).get_config() == cfg


def test_join():
    assert int(hvd.join()) in range(N)
    hvd.barrier()


def test_gpu_kernels_are_registered():
    # The GPU kernels exist for the types libhvd has (they run where
    # TensorFlow has a GPU: test_tensorflow_gpu.py); allgather, alltoall
    # and the reduce-scatters have none.
    from tensorflow.python.framework import kernels
    want = {tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16,
            tf.float32, tf.float64}
    for op in ("HvdAllreduce", "HvdGroupedAllreduce", "HvdBroadcast"):
        ks = kernels.get_registered_kernels_for_op(op).kernel
        gpu = {tf.as_dtype(k.constraint[0].allowed_values.list.type[0])
               for k in ks if k.device_type == "GPU"}
        assert gpu == want, op
        assert any(k.device_type == "CPU" for k in ks), op
    for op in ("HvdAllgather", "HvdAlltoall", "HvdReducescatter",
               "HvdGroupedReducescatter"):
        # libhvd takes host memory only for alltoall and reducescatter.
        ks = kernels.get_registered_kernels_for_op(op).kernel
        assert {k.device_type for k in ks} == {"CPU"}, op
