"""hvd.tensorflow's process-set ops, as Horovod's: size_op(process_set_id=),
process_set_included_op, the job's ops with name=, and ValueError for a
process set id that names no set (under hvdrun at np 2: the even ranks and
the odd ones, each a set given to hvd.init)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import hvd.tensorflow as hvd

# The sets are given to hvd.init, so the job's size comes from hvdrun.
N = int(os.environ.get("HVD_SIZE", "1"))
EVEN = hvd.ProcessSet([r for r in range(N) if r % 2 == 0])
ODD = hvd.ProcessSet([r for r in range(N) if r % 2 == 1])
hvd.init(process_sets=[EVEN, ODD] if N > 1 else None)
R = hvd.rank()
UNKNOWN_SET = -3  # Horovod's HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET

pytestmark = pytest.mark.skipif(N < 2, reason="two sets need two ranks")


def run(mode, fn):
    """fn() eagerly, in a tf.function, or in a TF1 graph run by a
    session."""
    if mode == "eager":
        return fn()
    if mode == "function":
        return tf.function(fn)()
    with tf.Graph().as_default():
        out = fn()
        with tf.compat.v1.Session() as sess:
            return sess.run(out)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_size_op_of_a_set(mode):
    sizes = run(mode, lambda: [
        hvd.size_op(), hvd.size_op(process_set_id=0),
        hvd.size_op(process_set_id=EVEN.process_set_id),
        hvd.size_op(process_set_id=ODD.process_set_id, name="odd_size"),
        hvd.size_op(process_set_id=99)])
    assert [int(s) for s in sizes] == [N, N, EVEN.size(), ODD.size(),
                                       UNKNOWN_SET]
    assert EVEN.size() == (N + 1) // 2 and ODD.size() == N // 2


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_process_set_included_op(mode):
    got = run(mode, lambda: [
        hvd.process_set_included_op(),
        hvd.process_set_included_op(process_set_id=EVEN.process_set_id),
        hvd.process_set_included_op(process_set_id=ODD.process_set_id,
                                    name="in_odd"),
        hvd.process_set_included_op(process_set_id=99)])
    assert [int(g) for g in got] == [1, int(R % 2 == 0), int(R % 2 == 1),
                                     UNKNOWN_SET]


def test_job_ops_take_a_name():
    assert int(hvd.rank_op(name="my_rank")) == R
    assert int(hvd.local_size_op(name="ls")) == hvd.local_size()
    assert int(hvd.local_rank_op(name="lr")) == hvd.local_rank()
    with tf.Graph().as_default():
        assert hvd.rank_op(name="my_rank").op.name == "my_rank"
        assert hvd.size_op(process_set_id=1, name="s1").op.name == "s1"


def test_ops_are_not_differentiable():
    x = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        y = x * tf.cast(hvd.size_op(process_set_id=EVEN.process_set_id),
                        tf.float32) * tf.cast(
                            hvd.process_set_included_op(), tf.float32)
    assert float(tape.gradient(y, x)) == EVEN.size()


def test_process_set_id_must_be_an_int():
    with pytest.raises(ValueError):
        hvd.size_op(process_set_id="1")
    # A ProcessSet is taken too.
    assert int(hvd.size_op(process_set_id=EVEN)) == EVEN.size()


def fake_set():
    """Horovod's test: a set whose id was never given by hvd."""
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10
    return fake


COLLECTIVES = {
    "allreduce": lambda t, ps: hvd.allreduce(t, process_set=ps),
    "allreduce_sum": lambda t, ps: hvd.allreduce(t, op=hvd.Sum,
                                                 process_set=ps),
    "grouped_allreduce": lambda t, ps: hvd.grouped_allreduce(
        [t, t], process_set=ps),
    "allgather": lambda t, ps: hvd.allgather(t, process_set=ps),
    "grouped_allgather": lambda t, ps: hvd.grouped_allgather(
        [t], process_set=ps),
    "broadcast": lambda t, ps: hvd.broadcast(t, 0, process_set=ps),
    "alltoall": lambda t, ps: hvd.alltoall(t, process_set=ps),
    "reducescatter": lambda t, ps: hvd.reducescatter(t, process_set=ps),
    "grouped_reducescatter": lambda t, ps: hvd.grouped_reducescatter(
        [t], process_set=ps),
    "indexed_slices": lambda t, ps: hvd.allreduce(
        tf.IndexedSlices(t, tf.constant([0, 1, 2, 3]),
                         tf.constant([4], tf.int64)), process_set=ps),
}


# (Inside a tf.function the op is made as in a graph: graph mode covers it.)
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_unknown_set_raises_value_error(name, mode):
    with pytest.raises(ValueError, match="does not exist"):
        run(mode, lambda: COLLECTIVES[name](tf.ones(4), fake_set()))


def test_process_set_size_of_an_unknown_set():
    with pytest.raises(ValueError, match="does not exist"):
        fake_set().size()
    assert hvd.ProcessSet([0]).size() is None  # never added


def test_removed_set():
    ps_id = ODD.process_set_id
    assert hvd.remove_process_set(ODD)
    assert int(hvd.size_op(process_set_id=ps_id)) == UNKNOWN_SET
    assert int(hvd.process_set_included_op(process_set_id=ps_id)) == \
        UNKNOWN_SET
    stale = hvd.ProcessSet(ODD.ranks)
    stale.process_set_id = ps_id
    with pytest.raises(ValueError, match="does not exist"):
        hvd.allreduce(tf.ones(2), process_set=stale)
    hvd.add_process_set(ODD)
    assert ODD.process_set_id != ps_id
    assert int(hvd.size_op(process_set_id=ODD.process_set_id)) == ODD.size()


def test_members_still_reduce():
    ps = EVEN if R % 2 == 0 else ODD
    got = hvd.allreduce(tf.fill([2], float(R)), op=hvd.Sum, process_set=ps)
    np.testing.assert_array_equal(got.numpy(),
                                  np.full(2, float(sum(ps.ranks))))


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_tape_outside_the_set_keeps_its_gradient(mode):
    """Horovod's: a DistributedGradientTape over a set averages among its
    members; a rank outside it keeps its own gradient."""
    def grad():
        x = tf.constant(float(R))
        with tf.GradientTape() as g:
            g.watch(x)
            y = x * x
        return hvd.DistributedGradientTape(g, process_set=ODD).gradient(
            y, [x])[0]
    got = float(run(mode, grad))
    if R % 2 == 1:
        assert got == 2.0 * sum(ODD.ranks) / ODD.size()
    else:
        assert got == 2.0 * R
