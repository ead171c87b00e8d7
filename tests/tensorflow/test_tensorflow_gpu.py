"""hvd.tensorflow with tensors on a real GPU: the allreduce, grouped
allreduce and broadcast kernels run on the GPU and hand their device memory
to libhvd's device path (NCCL, or its staging pipeline) after waiting for
TensorFlow's stream; allgather runs on the CPU kernel. Run as a script
under hvdrun; exits 77 (skip) where TensorFlow sees no GPU or libhvd was
built without CUDA.
"""

import sys

import numpy as np
import pytest
import tensorflow as tf

import hvd.tensorflow as hvd

TYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16,
         tf.float32, tf.float64]


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    yield


def inputs(count, dtype, r):
    return tf.cast(tf.range(count, dtype=tf.int64) % 5 + r, dtype)


def summed(count):
    n = hvd.size()
    return (np.arange(count) % 5 * n + n * (n - 1) // 2).astype(np.float64)


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: t.name)
def test_allreduce_on_gpu(dtype):
    for count in (1, 7, 1 << 20):
        with tf.device("/GPU:0"):
            x = inputs(count, dtype, hvd.rank()) * 1  # made on the GPU
            out = hvd.allreduce(x, op=hvd.Sum)
        assert "GPU" in out.device
        np.testing.assert_array_equal(
            tf.cast(out, tf.float64).numpy(), summed(count))


def test_in_a_function_grouped_and_broadcast():
    @tf.function
    def step(a, b, c):
        s = hvd.grouped_allreduce([a * 2.0, b], op=hvd.Sum)
        return s, hvd.broadcast(c, 0)

    with tf.device("/GPU:0"):
        a = tf.fill([1000], float(hvd.rank()))
        b = tf.ones([3, 3])
        c = tf.fill([4, 5], float(hvd.rank() + 1))
        (sa, sb), bc = step(a, b, c)
    n = hvd.size()
    np.testing.assert_array_equal(sa.numpy(), np.full(1000, n * (n - 1.0)))
    np.testing.assert_array_equal(sb.numpy(), np.full((3, 3), float(n)))
    np.testing.assert_array_equal(bc.numpy(), np.ones((4, 5)))


def test_gradient_tape_step():
    with tf.device("/GPU:0"):
        w = tf.Variable(tf.ones([8, 4]))
        hvd.broadcast_variables([w], root_rank=0)
        x = tf.fill([16, 8], float(hvd.rank() + 1))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        tape = hvd.DistributedGradientTape(tape)
        (g,) = tape.gradient(loss, [w])
    n = hvd.size()
    np.testing.assert_allclose(g.numpy(),
                               np.full((8, 4), 16 * (n + 1) / 2.0))


if __name__ == "__main__":
    if not tf.config.list_physical_devices("GPU"):
        print("SKIP: TensorFlow sees no GPU")
        sys.exit(77)
    if not hvd.cuda_built():
        print("SKIP: this libhvd was built without CUDA")
        sys.exit(77)
    sys.exit(pytest.main([__file__, "-q", "-x", "-p", "no:cacheprovider"]))
