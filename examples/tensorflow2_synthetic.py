#!/usr/bin/env python3
"""A TensorFlow 2 synthetic benchmark with hvd.tensorflow, in the manner of
Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py: a model
trained data-parallel on random images with DistributedGradientTape,
printing images/s per rank and in total. Relative to a Horovod user's
script only the import line differs:

    import hvd.tensorflow as hvd   # instead of: import horovod.tensorflow as hvd

Run it with (in the source tree):

    HVD_LIBRARY=$PWD/build/libhvd.so PYTHONPATH=$PWD/python \\
        build/hvdrun -np 2 -- python3 examples/tensorflow2_synthetic.py \\
        --batch-size 8 --num-warmup-batches 1 --num-batches-per-iter 2 \\
        --num-iters 2

The default model is a small conv net on 32x32 images that a laptop CPU
trains quickly; --model NAME picks tf.keras.applications.NAME instead
(e.g. ResNet50, at 224x224 unless --image-size says otherwise).
"""

import argparse
import os
import timeit

import numpy as np
import tensorflow as tf

import hvd.tensorflow as hvd


def small_cnn(image_size, classes):
    """Three conv + pool stages and two dense layers (about 0.6 M
    parameters at 32x32)."""
    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input((image_size, image_size, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(128, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(256, activation="relu"),
        layers.Dense(classes, activation="softmax"),
    ], name="SmallCNN")


def main():
    parser = argparse.ArgumentParser(
        description="hvd.tensorflow TF2 synthetic benchmark",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", default="SmallCNN",
                        help="SmallCNN, or a tf.keras.applications model "
                             "(e.g. ResNet50)")
    parser.add_argument("--image-size", type=int, default=0,
                        help="height and width (0: 32 for SmallCNN, 224 "
                             "otherwise)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="images per rank per step")
    parser.add_argument("--num-warmup-batches", type=int, default=5,
                        help="batches that don't count towards the result")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=5,
                        help="benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true",
                        help="disables CUDA training")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads per rank (0: cores / ranks "
                             "on this host)")
    args = parser.parse_args()
    args.cuda = not args.no_cuda

    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per
    # process). A machine without GPUs lists none and runs on the CPU.
    gpus = tf.config.experimental.list_physical_devices("GPU") \
        if args.cuda else []
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(
            gpus[hvd.local_rank() % len(gpus)], "GPU")
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
        # Share this host's cores among its ranks rather than oversubscribe.
        threads = args.threads or max(1, (os.cpu_count() or 1) //
                                      hvd.local_size())
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    device = "GPU" if gpus else "CPU"

    # Set up the model.
    tf.random.set_seed(1234)
    if args.model == "SmallCNN":
        image_size = args.image_size or 32
        classes = 10
        model = small_cnn(image_size, classes)
    else:
        image_size = args.image_size or 224
        classes = 1000
        model = getattr(tf.keras.applications, args.model)(
            weights=None, input_shape=(image_size, image_size, 3),
            classes=classes)
    opt = tf.keras.optimizers.SGD(0.01)

    # Synthetic data, different on every rank.
    gen = tf.random.Generator.from_seed(hvd.rank())
    data = gen.uniform([args.batch_size, image_size, image_size, 3])
    target = gen.uniform([args.batch_size, 1], minval=0, maxval=classes,
                         dtype=tf.int64)

    # Horovod: (optional) compression algorithm.
    compression = (hvd.Compression.fp16 if args.fp16_allreduce
                   else hvd.Compression.none)

    @tf.function
    def benchmark_step(first_batch):
        with tf.GradientTape() as tape:
            probs = model(data, training=True)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(target,
                                                                probs))

        # Horovod: add Horovod DistributedGradientTape.
        tape = hvd.DistributedGradientTape(tape, compression=compression)

        gradients = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(gradients, model.trainable_variables))

        # Horovod: broadcast the initial variable states from rank 0 to all
        # other processes, after the first step so that the optimizer's
        # variables exist.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            # Keras 3 has optimizer.variables as a list, Keras 2 as a method.
            opt_vars = opt.variables() if callable(opt.variables) \
                else opt.variables
            hvd.broadcast_variables(opt_vars, root_rank=0)
        return loss

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log("Model: %s, %d parameters" % (model.name, model.count_params()))
    log("Batch size: %d per rank, images %dx%d%s"
        % (args.batch_size, image_size, image_size,
           ", fp16 allreduce" if args.fp16_allreduce else ""))
    log("Number of ranks: %d (%s)" % (hvd.size(), device))

    with tf.device(device):
        log("Running warmup...")
        benchmark_step(first_batch=True)
        timeit.timeit(lambda: benchmark_step(first_batch=False),
                      number=args.num_warmup_batches)

        log("Running benchmark...")
        img_secs = []
        for i in range(args.num_iters):
            seconds = timeit.timeit(lambda: benchmark_step(first_batch=False),
                                    number=args.num_batches_per_iter)
            img_sec = args.batch_size * args.num_batches_per_iter / seconds
            log("Iter #%d: %.1f img/sec per rank" % (i, img_sec))
            img_secs.append(img_sec)

    img_sec_mean = float(np.mean(img_secs))
    img_sec_conf = float(1.96 * np.std(img_secs))
    log("Img/sec per rank: %.1f +-%.1f" % (img_sec_mean, img_sec_conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f"
        % (hvd.size(), hvd.size() * img_sec_mean,
           hvd.size() * img_sec_conf))


if __name__ == "__main__":
    main()
