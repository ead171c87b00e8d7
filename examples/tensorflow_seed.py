#!/usr/bin/env python3
"""Horovod's classic TensorFlow v1 recipe (README "Usage" and
examples/tensorflow/tensorflow_mnist.py) on a small synthetic problem,
through tf.compat.v1 and hvd.tensorflow. Relative to what a Horovod user
writes, only the import line differs:

    import hvd.tensorflow as hvd   # instead of: import horovod.tensorflow as hvd

Run it with (in the source tree):

    HVD_LIBRARY=$PWD/build/libhvd.so PYTHONPATH=$PWD/python \\
        build/hvdrun -np 2 -- python3 examples/tensorflow_seed.py --steps 40

The model is a two-layer dense net classifying random features whose labels
come from a fixed random "teacher" matrix, so the loss goes down. Every rank
draws its own shard of the data from a fixed seed. Nothing is written to
disk unless --checkpoint-dir is given (then rank 0 alone saves there).
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

import hvd.tensorflow as hvd

FEATURES = 64
HIDDEN = 128
CLASSES = 10
SAMPLES_PER_RANK = 4096


def synthetic_data(rank, seed):
    """Features and labels for one rank: the teacher is the same on every
    rank (drawn from seed alone), the features differ per rank."""
    teacher = np.random.RandomState(seed).randn(FEATURES, CLASSES)
    rng = np.random.RandomState(seed + 1 + rank)
    x = rng.randn(SAMPLES_PER_RANK, FEATURES).astype(np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int64)
    return x, y


def batches(x, y, batch_size):
    """Cycles over (x, y) in batches of batch_size, forever."""
    index = 0
    while True:
        if index + batch_size > len(x):
            index = 0
        yield x[index:index + batch_size], y[index:index + batch_size]
        index += batch_size


def dense_model(image, label, seed):
    """Two dense layers (plain tf.compat.v1 variables: tf.compat.v1.layers
    needs Keras 2); returns (logits, mean cross-entropy loss)."""
    init = tf.compat.v1.glorot_uniform_initializer
    with tf.compat.v1.variable_scope("hidden"):
        w1 = tf.compat.v1.get_variable("kernel", [FEATURES, HIDDEN],
                                       initializer=init(seed=seed))
        b1 = tf.compat.v1.get_variable("bias", [HIDDEN],
                                       initializer=tf.zeros_initializer())
        hidden = tf.nn.relu(tf.matmul(image, w1) + b1)
    with tf.compat.v1.variable_scope("logits"):
        w2 = tf.compat.v1.get_variable("kernel", [HIDDEN, CLASSES],
                                       initializer=init(seed=seed + 1))
        b2 = tf.compat.v1.get_variable("bias", [CLASSES],
                                       initializer=tf.zeros_initializer())
        logits = tf.matmul(hidden, w2) + b2
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label,
                                                       logits=logits))
    return logits, loss


def main():
    parser = argparse.ArgumentParser(
        description="hvd.tensorflow TF1 (tf.compat.v1) training example",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=200,
                        help="global steps; each rank runs steps // ranks")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="samples per rank per step")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--checkpoint-dir", default=None,
                        help="rank 0 saves checkpoints here (default: none)")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads per rank (0: cores / ranks "
                             "on this host)")
    args = parser.parse_args()

    tf.compat.v1.disable_eager_execution()

    # Horovod: initialize Horovod.
    hvd.init()

    x_train, y_train = synthetic_data(hvd.rank(), args.seed)

    # Build model...
    tf.compat.v1.set_random_seed(args.seed)
    with tf.name_scope("input"):
        image = tf.compat.v1.placeholder(tf.float32, [None, FEATURES],
                                         name="image")
        label = tf.compat.v1.placeholder(tf.int64, [None], name="label")
    _, loss = dense_model(image, label, args.seed)

    # Horovod: scale the learning rate by the number of workers.
    opt = tf.compat.v1.train.AdagradOptimizer(0.01 * hvd.size())

    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)

    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = opt.minimize(loss, global_step=global_step)

    hooks = [
        # Horovod: BroadcastGlobalVariablesHook broadcasts the initial
        # variables from rank 0 to all other processes, so that every worker
        # starts from the same weights (random or restored).
        hvd.BroadcastGlobalVariablesHook(0),

        # Horovod: adjust the number of steps to the number of workers.
        tf.compat.v1.train.StopAtStepHook(last_step=args.steps // hvd.size()),
    ]

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    config = tf.compat.v1.ConfigProto()
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())
    # Share this host's cores among its ranks rather than oversubscribe them.
    config.intra_op_parallelism_threads = args.threads or max(
        1, (os.cpu_count() or 1) // hvd.local_size())
    config.inter_op_parallelism_threads = 2

    # Horovod: save checkpoints only on worker 0 to prevent other workers
    # from corrupting them.
    checkpoint_dir = args.checkpoint_dir if hvd.rank() == 0 else None

    feed = batches(x_train, y_train, args.batch_size)
    steps = 0
    last_loss = float("nan")
    start = None
    # The MonitoredTrainingSession takes care of session initialization,
    # restoring from a checkpoint, saving to a checkpoint, and closing when
    # done or an error occurs.
    with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=checkpoint_dir, config=config,
            hooks=hooks) as mon_sess:
        while not mon_sess.should_stop():
            image_, label_ = next(feed)
            _, last_loss = mon_sess.run([train_op, loss],
                                        feed_dict={image: image_,
                                                   label: label_})
            steps += 1
            if start is None:
                # The first step builds and warms up; time the others.
                start = time.perf_counter()
    elapsed = time.perf_counter() - start if start is not None else 0.0
    timed = steps - 1
    rate = timed * args.batch_size / elapsed if timed > 0 and elapsed > 0 \
        else 0.0

    if hvd.rank() == 0:
        print("tensorflow_seed: %d steps on %d ranks, final loss %.4f"
              % (steps, hvd.size(), last_loss), flush=True)
    print("tensorflow_seed rank %d: images/s %.1f" % (hvd.rank(), rate),
          flush=True)


if __name__ == "__main__":
    main()
