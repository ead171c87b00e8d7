"""Reducing a list of gradients across ranks, and accumulating them
locally over several backward passes: what DistributedGradientTape, the
TF1 DistributedOptimizer and the Keras DistributedOptimizer share."""

import tensorflow as tf

from hvd.tensorflow.mpi_ops import Average


def is_sparse(grad):
    return isinstance(grad, tf.IndexedSlices)


def ref(v):
    """A hashable key for a tf.Variable or a keras.Variable (whose
    tf.Variable is its .value in the TensorFlow backend; keras.Variable has
    no .ref())."""
    inner = getattr(v, "value", None)
    if not isinstance(inner, tf.Variable):
        inner = getattr(v, "_value", None)
    if isinstance(inner, tf.Variable):
        v = inner
    return v.ref() if hasattr(v, "ref") else id(v)


def split_evenly(items, n):
    """n consecutive groups of items whose sizes differ by at most one."""
    n = max(1, min(int(n), len(items))) if items else 1
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + q + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return [g for g in out if g]


def divide_sparse_or_dense(grad, divisor):
    """grad / divisor for a tensor or the values of an IndexedSlices."""
    if is_sparse(grad):
        return tf.IndexedSlices(grad.values / divisor, grad.indices,
                                grad.dense_shape)
    return grad / divisor


def reduce_but_local(reduce_fn, grads, variables, local_refs,
                     scale_local_gradients, set_size):
    """Horovod's filtered reduction of worker-local variables
    (register_local_source, register_local_var, local_layers): the
    gradients of variables whose ref() is in local_refs are not
    reduced; reduce_fn(grads, variables) reduces the others in one call.
    With scale_local_gradients a local gradient is divided by set_size
    (a number; Horovod's pull/3695: an averaged gradient and a local one
    then weigh alike in a step of the global batch); None stays None."""
    grads = list(grads)
    variables = list(variables)
    if not local_refs:
        return reduce_fn(grads, variables)
    is_local = [ref(v) in local_refs for v in variables]
    keep = [k for k, local in enumerate(is_local) if not local]
    out = list(grads)
    reduced = []
    if keep:
        reduced = reduce_fn([grads[k] for k in keep],
                            [variables[k] for k in keep])
    for k, r in zip(keep, reduced):
        out[k] = r
    if scale_local_gradients:
        for k, local in enumerate(is_local):
            if local and out[k] is not None:
                out[k] = divide_sparse_or_dense(out[k], float(set_size))
    return out


class GradientReducer:
    """Allreduces a list of gradients (None entries stay None), as
    Horovod's _make_allreduce_grads_fn: Average is split into a prescale of
    1/gradient_predivide_factor and a postscale of gradient_predivide_factor
    (the runtime divides by size), sparse_as_dense densifies IndexedSlices,
    groups asks for grouped allreduces, process_set (None: every rank)
    the ranks they run among."""

    def __init__(self, name, device_dense, device_sparse, compression,
                 sparse_as_dense, op, gradient_predivide_factor, groups,
                 process_set=None):
        self.name = name
        self.process_set = process_set
        self.device_dense = device_dense
        self.device_sparse = device_sparse
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        if op == Average:
            self.prescale = 1.0 / gradient_predivide_factor
            self.postscale = gradient_predivide_factor
        else:
            self.prescale = 1.0
            self.postscale = 1.0
        # A list of lists of variables is kept as lists of refs.
        if isinstance(groups, list):
            self.groups = [[ref(v) for v in g] for g in groups]
        else:
            self.groups = groups

    def _one(self, grad):
        from hvd.tensorflow import allreduce  # it imports this module
        return allreduce(grad, device_dense=self.device_dense,
                         device_sparse=self.device_sparse,
                         compression=self.compression, op=self.op,
                         prescale_factor=self.prescale,
                         postscale_factor=self.postscale,
                         process_set=self.process_set)

    def _group(self, grads):
        from hvd.tensorflow import grouped_allreduce
        return grouped_allreduce(grads, device_dense=self.device_dense,
                                 device_sparse=self.device_sparse,
                                 compression=self.compression, op=self.op,
                                 prescale_factor=self.prescale,
                                 postscale_factor=self.postscale,
                                 process_set=self.process_set)

    def __call__(self, grads, variables):
        grads = list(grads)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if is_sparse(g) else g
                     for g in grads]
        ps = self.process_set
        if ps is not None and ps.process_set_id != 0 and not ps.included():
            # Horovod's _allreduce_cond: a rank outside the set keeps its
            # own gradients (only the set's members may call its
            # collectives).
            return grads
        out = [None] * len(grads)
        with tf.name_scope(self.name + "_Allreduce"):
            if self.groups is None or self.groups == 0:
                for i, g in enumerate(grads):
                    if g is not None:
                        out[i] = self._one(g)
                return out
            present = [i for i, g in enumerate(grads) if g is not None]
            if isinstance(self.groups, list):
                index_of = {}
                for i in present:
                    index_of[ref(variables[i])] = i
                split = []
                for group in self.groups:
                    idx = [index_of.pop(r) for r in group if r in index_of]
                    if idx:
                        split.append(idx)
                # A variable in no group forms a group of its own.
                split.extend([i] for i in sorted(index_of.values()))
            else:
                split = split_evenly(present, self.groups)
            for idx in split:
                dense = [i for i in idx if not is_sparse(grads[i])]
                for i in idx:
                    if is_sparse(grads[i]):
                        out[i] = self._one(grads[i])
                if dense:
                    for i, r in zip(dense, self._group([grads[i]
                                                        for i in dense])):
                        out[i] = r
        return out


class LocalAggregation:
    """Horovod's LocalGradientAggregationHelper(Eager) for Keras 3: each
    call adds the local gradients into accumulators; every
    backward_passes_per_step-th call allreduces the sums (divided by
    backward_passes_per_step if average_aggregated_gradients), clears the
    accumulators and sets ``counter`` back to 0. The optimizer applies only
    when ``counter`` is 0 and otherwise just counts the iteration.

    The accumulators and the counter are plain tf.Variables on this plain
    object: they are not optimizer variables, so a saved model's optimizer
    state is that of the wrapped optimizer and loads into it."""

    def __init__(self, backward_passes_per_step, reduce_fn, sparse_as_dense,
                 average_aggregated_gradients):
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.reduce_fn = reduce_fn  # (grads, variables) -> reduced grads
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False,
                                       name="aggregation_counter")
        self.locally_aggregated_grads = {}  # variable index -> tf.Variable

    def build(self, variables):
        with tf.init_scope():
            for i, v in enumerate(variables):
                if i not in self.locally_aggregated_grads:
                    self.locally_aggregated_grads[i] = tf.Variable(
                        tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                        name="aggregated_grad_%d" % i)

    def _dense(self, grad):
        if is_sparse(grad):
            if not self.sparse_as_dense:
                raise ValueError(
                    "IndexedSlices are not supported when "
                    "`backward_passes_per_step` > 1 and "
                    "`sparse_as_dense` is False.")
            return tf.convert_to_tensor(grad)
        return grad

    def compute_gradients(self, grads, variables, indices):
        """grads[k] is the gradient of variables[k], which is the
        optimizer's variable number indices[k]. Returns the allreduced sums
        on a communicating step, the local sums on the others."""
        accs, adds = [], []
        for g, i in zip(grads, indices):
            if g is None:
                accs.append(None)
                continue
            acc = self.locally_aggregated_grads[i]
            adds.append(acc.assign_add(tf.cast(self._dense(g), acc.dtype)))
            accs.append(acc)
        # Ordered explicitly, for TF1 graphs too (no automatic control
        # dependencies there): the sums are read after this step's adds.
        with tf.control_dependencies(adds):
            count = self.counter.assign_add(1)
            summed = [a.read_value() if a is not None else None
                      for a in accs]
        present = [k for k, s in enumerate(summed) if s is not None]

        def reduce_and_clear():
            reduced = self.reduce_fn([summed[k] for k in present],
                                     [variables[k] for k in present])
            if self.average_aggregated_gradients:
                reduced = [r / self.backward_passes_per_step for r in reduced]
            with tf.control_dependencies([tf.identity(r) for r in reduced]):
                clears = [accs[k].assign(tf.zeros_like(accs[k]))
                          for k in present]
            with tf.control_dependencies(clears):
                reset = self.counter.assign(0)
            with tf.control_dependencies([reset]):
                return [tf.identity(r) for r in reduced]

        def keep():
            return [tf.identity(summed[k]) for k in present]

        if present:
            result = tf.cond(
                tf.equal(count, self.backward_passes_per_step),
                reduce_and_clear, keep)
            if not isinstance(result, (list, tuple)):
                result = [result]
        else:
            result = []
        out = [None] * len(summed)
        for k, r in zip(present, result):
            out[k] = r
        return out

    def apply_gradients(self, apply_fn, count_fn, after=()):
        """Runs apply_fn on the step that just communicated, count_fn
        (which only counts the iteration) on the others; after: what the
        decision must follow (this step's gradients, in a TF1 graph)."""
        def ops_of(result):
            return [r for r in tf.nest.flatten(result)
                    if isinstance(r, (tf.Operation, tf.Tensor))]

        def run_apply():
            with tf.control_dependencies(ops_of(apply_fn())):
                return tf.constant(True)

        def run_count():
            with tf.control_dependencies(ops_of(count_fn())):
                return tf.constant(False)

        with tf.control_dependencies(ops_of(list(after))):
            return tf.cond(tf.equal(self.counter, 0), run_apply, run_count)
