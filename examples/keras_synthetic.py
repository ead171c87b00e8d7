#!/usr/bin/env python3
"""A small CNN trained data-parallel on synthetic images with Keras
(model.fit) and hvd.tensorflow.keras, printing images/s per rank and in
total, in the manner of Horovod's tensorflow2_keras_synthetic_benchmark.py:
only the import differs from what a Horovod user writes.

    hvdrun -np 2 python3 examples/keras_synthetic.py

hvd.tensorflow.keras must be importable (PYTHONPATH=python in the source
tree, or the installed package) and find libhvd and the TensorFlow op
library (HVD_LIBRARY=build/libhvd.so HVD_TF_LIBRARY=
build/libhvd_tensorflow.so in the source tree).

Epoch 0 is the warm-up (tracing the train function) and is not timed
unless it is the only one.
"""

import argparse
import os
import timeit

import numpy as np
import tensorflow as tf
import keras

import hvd.tensorflow.keras as hvd


def small_cnn(image_size, classes=10):
    """Two conv + pool stages and two dense layers."""
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(classes),
    ])


class TimingCallback(keras.callbacks.Callback):
    """Images/s of every epoch on this rank."""

    def __init__(self, images_per_epoch):
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.rates = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = timeit.default_timer()

    def on_epoch_end(self, epoch, logs=None):
        seconds = timeit.default_timer() - self.start
        self.rates.append(self.images_per_epoch / seconds)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="hvd.tensorflow.keras synthetic benchmark",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per rank per step")
    parser.add_argument("--num-batches", type=int, default=10,
                        help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=5,
                        help="epochs (the first is the untimed warm-up)")
    parser.add_argument("--image-size", type=int, default=32,
                        help="height and width (a multiple of 4)")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16")
    parser.add_argument("--no-cuda", action="store_true",
                        help="do not use a GPU")
    args = parser.parse_args(argv)

    # Horovod: initialize.
    hvd.init()

    # Horovod: pin one GPU per process (by local rank), if there are GPUs.
    if args.no_cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    else:
        gpus = tf.config.experimental.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.experimental.set_visible_devices(
                gpus[hvd.local_rank() % len(gpus)], "GPU")

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    model = small_cnn(args.image_size)
    # Horovod: scale the learning rate by the number of ranks.
    opt = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
    compression = (hvd.Compression.fp16 if args.fp16_allreduce
                   else hvd.Compression.none)
    # Horovod: average the gradients over the ranks.
    opt = hvd.DistributedOptimizer(opt, compression=compression)
    # jit_compile=False: hvd's allreduce has no XLA kernel, and Keras 3
    # compiles with XLA by default when it sees a GPU.
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=opt, jit_compile=False)

    # Synthetic data, different on every rank.
    rs = np.random.RandomState(1234 + hvd.rank())
    n = args.batch_size * args.num_batches
    data = rs.uniform(size=(n, args.image_size, args.image_size, 3)).astype(
        np.float32)
    target = rs.randint(0, 10, size=(n,))
    dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache() \
        .repeat().batch(args.batch_size)

    timing = TimingCallback(n)
    callbacks = [
        # Horovod: every rank starts from rank 0's weights.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average the epoch's metrics over the ranks.
        hvd.callbacks.MetricAverageCallback(),
        timing,
    ]

    log("Model: small CNN, %d parameters; batch size %d per rank; %d "
        "rank(s)%s" % (model.count_params(), args.batch_size, hvd.size(),
                       "; fp16 allreduce" if args.fp16_allreduce else ""))
    hist = model.fit(dataset, steps_per_epoch=args.num_batches,
                     epochs=args.epochs, callbacks=callbacks, verbose=0)

    timed = timing.rates[1:] or timing.rates
    for i, rate in enumerate(timing.rates):
        log("Epoch #%d: %.1f images/s on rank 0" % (i, rate))
    rate = float(np.mean(timed))
    everyone = hvd.allgather([rate]).numpy()
    for r, v in enumerate(everyone):
        log("images/s on rank %d: %.1f" % (r, v))
    total = float(hvd.allreduce(rate, op=hvd.Sum).numpy())
    log("loss (averaged over ranks): %.4f" % hist.history["loss"][-1])
    log("images/s per rank: %.1f" % (total / hvd.size()))
    log("total images/s on %d ranks: %.1f" % (hvd.size(), total))
    return total


if __name__ == "__main__":
    main()
