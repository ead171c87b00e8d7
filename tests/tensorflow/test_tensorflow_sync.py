"""hvd.tensorflow's eager calls of CPU tensors (allreduce, grouped
allreduce, broadcast, reducescatter; allgather and alltoall, whose two
steps are two blocking calls; grouped reducescatter, its parts one after
the other) run libhvd's blocking calls
on the calling thread (the ops' blocking attr); inside a tf.function the
kernels stay asynchronous. Both ways give the same results, the same
errors and use the same names, so ranks may mix them on one name. Run
under hvdrun (tests/tensorflow/run_tf.sh, tensorflow.sync.*)."""

import re

import numpy as np
import pytest
import tensorflow as tf

import hvd.tensorflow as hvd
from hvd.tensorflow import mpi_ops

hvd.init()
R, N = hvd.rank(), hvd.size()

REDUCIBLE = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16,
             tf.float32, tf.float64]
MOVABLE = REDUCIBLE + [tf.uint16, tf.int16, tf.bool]


def value(r, count, dtype):
    """Rank r's input: small integers (their sum is exact in every type),
    0/1 for bool."""
    v = (np.arange(count) + r) % 3
    if dtype != tf.bool:
        v = v + 1
    return tf.cast(tf.constant(v), dtype)


def total(count, dtype):
    return tf.cast(tf.constant(sum(
        (np.arange(count) + q) % 3 + 1 for q in range(N))), dtype)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    assert np.array_equal(a.numpy(), b.numpy()), (a, b)


def raw(kind, tensor, blocking, name, **attrs):
    """The op itself, with its blocking attr chosen (the eager wrappers set
    it; blocking=False is what they did before)."""
    op = getattr(mpi_ops.MPI_LIB, kind)
    return op(tensor, tensor_name=name, blocking=blocking, **attrs)


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=lambda d: d.name)
def test_eager_exact(dtype):
    for count in (0, 1, 7, 1000):
        key = "%s.%d" % (dtype.name, count)
        same(hvd.allreduce(value(R, count, dtype), op=hvd.Sum,
                           name="ar." + key), total(count, dtype))
        same(hvd.allreduce(value(R, count, dtype), op=hvd.Sum),
             total(count, dtype))  # unnamed: matched by order
        outs = hvd.grouped_allreduce(
            [value(R, count, dtype), value(R, 3, dtype)], op=hvd.Sum,
            name="gar." + key)
        same(outs[0], total(count, dtype))
        same(outs[1], total(3, dtype))
        same(hvd.broadcast(value(R, count, dtype), N - 1, name="bc." + key),
             value(N - 1, count, dtype))
        # Reducescatter of 2N rows: this rank's two rows of the sum.
        rows = tf.reshape(value(R, 2 * N * 3, dtype), (2 * N, 3))
        want = tf.reshape(total(2 * N * 3, dtype), (2 * N, 3))
        same(hvd.reducescatter(rows, op=hvd.Sum, name="rs." + key),
             want[2 * R:2 * R + 2])


@pytest.mark.parametrize("dtype", [tf.uint16, tf.int16, tf.bool],
                         ids=lambda d: d.name)
def test_eager_broadcast_as_bytes(dtype):
    same(hvd.broadcast(value(R, 9, dtype), 0, name="bcb." + dtype.name),
         value(0, 9, dtype))


def test_eager_shaped_and_scaled():
    x = tf.reshape(tf.range(6, dtype=tf.float64) + R, (2, 3))
    want = tf.reshape(sum(tf.range(6, dtype=tf.float64) + q
                          for q in range(N)), (2, 3))
    same(hvd.allreduce(x, op=hvd.Sum, name="shaped"), want)
    same(hvd.allreduce(x, op=hvd.Sum, name="scaled", prescale_factor=2.0,
                       postscale_factor=0.5), want)
    same(hvd.allreduce(x, name="avg"), want / N)


def test_ways_mixed_on_one_name():
    """Each rank picks its way for the same name, changing every round:
    the blocking kernel (eager), the asynchronous kernel (eager), the
    asynchronous kernel inside a tf.function (a graph)."""

    @tf.function
    def in_graph(t):
        return hvd.allreduce(t, op=hvd.Sum, name="mix",
                             ignore_name_scope=True)

    @tf.function
    def bc_in_graph(t):
        return hvd.broadcast(t, 0, name="mixbc", ignore_name_scope=True)

    for i in range(4 * N + 2):
        way = (R + i) % 3
        x = tf.fill([5], float(R + i))
        want = tf.fill([5], float(sum(q + i for q in range(N))))
        if way == 0:
            got = hvd.allreduce(x, op=hvd.Sum, name="mix")
            b = hvd.broadcast(x, 0, name="mixbc")
        elif way == 1:
            got = raw("hvd_allreduce", x, False, "mix", reduce_op=hvd.Sum)
            b = raw("hvd_broadcast", x, False, "mixbc", root_rank=0)
        else:
            got = in_graph(x)
            b = bc_in_graph(x)
        same(got, want)
        same(b, tf.fill([5], float(i)))
        rs = raw("hvd_reducescatter", tf.fill([2 * N, 2], float(R + i)),
                 way == 0, "mixrs", reduce_op=hvd.Sum)
        same(rs, tf.fill([2, 2], float(sum(q + i for q in range(N)))))
        # Grouped, the blocking and the asynchronous kernel.
        outs = mpi_ops.MPI_LIB.hvd_grouped_allreduce(
            [x, tf.ones([2])], reduce_op=hvd.Sum, tensor_name="mixg",
            blocking=way == 0)
        same(outs[0], want)
        same(outs[1], tf.fill([2], float(N)))


def test_graph_calls_stay_asynchronous():
    """Inside a tf.function the ops are built with blocking false."""
    @tf.function
    def f(t):
        return hvd.allreduce(t, op=hvd.Sum, name="g.async")

    graph = f.get_concrete_function(tf.ones([3])).graph
    ops = [op for op in graph.get_operations() if op.type == "HvdAllreduce"]
    assert ops and not any(op.get_attr("blocking") for op in ops)
    same(f(tf.ones([3])), tf.fill([3], float(N)))


def _error_of(call):
    with pytest.raises(tf.errors.OpError) as info:
        call()
    return info.value


def test_errors_are_the_same_either_way():
    """A mismatch fails on every rank with the same TensorFlow error and
    the same message, whichever kernel ran (the blocking call's own
    prefix is not repeated)."""
    if N < 2:
        pytest.skip("needs 2 ranks")
    errors = []
    for blocking in (True, False):
        name = "mm.%d" % blocking
        errors.append(_error_of(lambda: raw(
            "hvd_allreduce", tf.ones([R + 2]), blocking, name,
            reduce_op=hvd.Sum)))
    kinds = [type(e) for e in errors]
    texts = [re.sub(r"mm\.[01]", "mm", e.message) for e in errors]
    assert kinds[0] is kinds[1], kinds
    assert texts[0] == texts[1], texts
    assert "hvd allreduce 'mm' on rank %d: " % R in texts[0], texts[0]
    assert "HVD_ERR_MISMATCH" in texts[0] and "hvd_ps_" not in texts[0]
    # Through the wrappers too, and the job goes on.
    rs = [_error_of(lambda: raw(
        "hvd_reducescatter", tf.ones([N, R + 1]), blocking, "mm.rs.%d" %
        blocking, reduce_op=hvd.Sum)) for blocking in (True, False)]
    assert type(rs[0]) is type(rs[1])
    assert re.sub(r"mm\.rs\.[01]", "x", rs[0].message) == \
        re.sub(r"mm\.rs\.[01]", "x", rs[1].message)
    e = _error_of(lambda: hvd.broadcast(
        tf.ones([2], tf.float32 if R else tf.int32), 0, name="mm.bc"))
    assert "HVD_ERR_MISMATCH" in e.message
    same(hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="mm.after"),
         tf.fill([2], float(N)))


# ---- allgather, alltoall, grouped reducescatter: two steps or parts ------


def gathered(count_of, dtype):
    """Every rank's value(q, count_of(q)), concatenated: an allgather's
    result."""
    return tf.concat([value(q, count_of(q), dtype) for q in range(N)], 0)


def a2a_splits(r):
    """Rank r sends (r + d) % 3 rows to rank d (zero parts included)."""
    return [(r + d) % 3 for d in range(N)]


def a2a_want(dtype, cols=2):
    """The rows every rank sends this one, in rank order: rank q's rows
    are value(q, ...) reshaped (rows, cols)."""
    parts = []
    for q in range(N):
        sp = a2a_splits(q)
        rows = tf.reshape(value(q, sum(sp) * cols, dtype), (sum(sp), cols))
        lo = sum(sp[:R])
        parts.append(rows[lo:lo + sp[R]])
    return tf.concat(parts, 0), tf.constant([a2a_splits(q)[R]
                                             for q in range(N)], tf.int32)


@pytest.mark.parametrize("dtype", MOVABLE, ids=lambda d: d.name)
def test_eager_two_steps_exact(dtype):
    for count in (0, 1, 7):
        key = "%s.%d" % (dtype.name, count)
        same(hvd.allgather(value(R, count, dtype), name="ag." + key),
             gathered(lambda q: count, dtype))
    # Uneven first dimensions (rank q has q + 1 rows of 3), unnamed.
    x = tf.reshape(value(R, 3 * (R + 1), dtype), (R + 1, 3))
    same(hvd.allgather(x), tf.reshape(gathered(lambda q: 3 * (q + 1), dtype),
                                      (-1, 3)))
    sp = a2a_splits(R)
    rows = tf.reshape(value(R, sum(sp) * 2, dtype), (sum(sp), 2))
    out, rsplits = hvd.alltoall(rows, splits=sp, name="a2a." + dtype.name)
    want, want_splits = a2a_want(dtype)
    same(out, want)
    same(rsplits, want_splits)
    # Even cut, unnamed.
    even = tf.reshape(value(R, 2 * N, dtype), (2 * N, 1))
    same(hvd.alltoall(even), tf.reshape(tf.concat(
        [value(q, 2 * N, dtype)[2 * R:2 * R + 2] for q in range(N)], 0),
        (2 * N, 1)))


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=lambda d: d.name)
def test_eager_grouped_reducescatter_exact(dtype):
    a = tf.reshape(value(R, 2 * N * 3, dtype), (2 * N, 3))
    b = value(R, N + 1, dtype)  # N + 1 rows: rank 0 gets two
    want_a = tf.reshape(total(2 * N * 3, dtype), (2 * N, 3))
    lo = R + (1 if R > 0 else 0)
    for name in ("grs." + dtype.name, None):
        outs = hvd.grouped_reducescatter([a, b], op=hvd.Sum, name=name)
        same(outs[0], want_a[2 * R:2 * R + 2])
        same(outs[1], total(N + 1, dtype)[lo:lo + (2 if R == 0 else 1)])


def test_two_steps_and_parts_mixed_on_one_name():
    """Each rank picks its way for the same names, changing every round:
    blocking (eager), asynchronous (eager), inside a tf.function."""

    @tf.function
    def in_graph(x, rows, a, b):
        return (hvd.allgather(x, name="mixag", ignore_name_scope=True),
                hvd.alltoall(rows, splits=a2a_splits(R), name="mixa2a",
                             ignore_name_scope=True),
                hvd.grouped_reducescatter([a, b], op=hvd.Sum, name="mixgrs",
                                          ignore_name_scope=True))

    lib = mpi_ops.MPI_LIB
    sp = a2a_splits(R)
    for i in range(4 * N + 2):
        way = (R + i) % 3
        x = tf.fill([R + 1, 2], float(R + i))
        rows = tf.reshape(value(R, sum(sp) * 2, tf.float32), (sum(sp), 2))
        a = tf.fill([2 * N, 2], float(R + i))
        b = tf.fill([N], float(R))
        if way == 2:
            ag, (out, rsplits), (ra, rb) = in_graph(x, rows, a, b)
        else:
            blocking = way == 0
            ag = lib.hvd_allgather(x, tensor_name="mixag", blocking=blocking)
            out, rsplits = lib.hvd_alltoall(rows, sp, tensor_name="mixa2a",
                                            blocking=blocking)
            ra, rb = lib.hvd_grouped_reducescatter(
                [a, b], reduce_op=hvd.Sum, tensor_name="mixgrs",
                blocking=blocking)
        same(ag, tf.concat([tf.fill([q + 1, 2], float(q + i))
                            for q in range(N)], 0))
        want, want_splits = a2a_want(tf.float32)
        same(out, want)
        same(rsplits, want_splits)
        same(ra, tf.fill([2, 2], float(sum(q + i for q in range(N)))))
        same(rb, tf.fill([1], float(N * (N - 1) // 2)))


def test_two_steps_in_graph_stay_asynchronous():
    @tf.function
    def f(t):
        return (hvd.allgather(t, name="g.ag"), hvd.alltoall(t, name="g.a2a"),
                hvd.grouped_reducescatter([t, t], op=hvd.Sum, name="g.grs"))

    graph = f.get_concrete_function(tf.ones([N])).graph
    ops = [op for op in graph.get_operations() if op.type in (
        "HvdAllgather", "HvdAlltoall", "HvdGroupedReducescatter")]
    assert len(ops) == 3 and not any(op.get_attr("blocking") for op in ops)
    ag, a2a, (r0, r1) = f(tf.ones([N]))
    same(ag, tf.ones([N * N]))
    same(a2a, tf.ones([N]))
    same(r0, tf.fill([1], float(N)))


def test_two_step_errors_are_the_same_either_way():
    """An allgather whose ranks disagree after the first dimension, an
    alltoall whose splits do not add up, a grouped reducescatter whose
    second part's shapes differ: the same error either way, on every
    rank, and the job goes on."""
    if N < 2:
        pytest.skip("needs 2 ranks")
    lib = mpi_ops.MPI_LIB

    def texts(make):
        errs = [_error_of(lambda: make(b, "e.%d" % b)) for b in (True, False)]
        assert type(errs[0]) is type(errs[1]), errs
        got = [re.sub(r"e\.[01]", "e", e.message) for e in errs]
        assert got[0] == got[1], got
        return got[0]

    t = texts(lambda b, n: lib.hvd_allgather(
        tf.ones([2, R + 1]), tensor_name=n + ".ag", blocking=b))
    assert "disagree" in t, t
    t = texts(lambda b, n: lib.hvd_alltoall(
        tf.ones([3]), [1] * N if R else [2] * N, tensor_name=n + ".a2a",
        blocking=b))
    t = texts(lambda b, n: lib.hvd_grouped_reducescatter(
        [tf.ones([N]), tf.ones([N, R + 1])], reduce_op=hvd.Sum,
        tensor_name=n + ".grs", blocking=b))
    assert "HVD_ERR_MISMATCH" in t, t
    same(hvd.allgather(tf.ones([1]), name="e.after"), tf.ones([N]))
