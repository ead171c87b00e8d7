import tensorflow as tf
import hvd.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
x = tf.fill([4], float(r + 1))
out = hvd.allreduce(x, op=hvd.Sum).numpy().tolist()
assert out == [n * (n + 1) / 2] * 4, out

@tf.function
def step(v):
    return hvd.allreduce(v, op=hvd.Average)

avg = step(tf.constant([float(r)] * 3)).numpy().tolist()
assert avg == [(n - 1) / 2.0] * 3, avg
g = hvd.allgather(tf.constant([[float(r)]])).numpy().ravel().tolist()
assert g == [float(i) for i in range(n)], g
print("TensorFlow %s, rank %d of %d: allreduce, tf.function, allgather ok" % (tf.__version__, r, n))
hvd.shutdown()
