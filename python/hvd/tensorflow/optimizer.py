"""TF1-style training through tf.compat.v1: DistributedOptimizer,
broadcast_global_variables and BroadcastGlobalVariablesHook, as
horovod.tensorflow's."""

import tensorflow as tf

from hvd.tensorflow._reduce import LocalAggregation, reduce_but_local, ref
from hvd.tensorflow.compression import Compression
from hvd.tensorflow.functions import broadcast_variables
from hvd.tensorflow.gradient_tape import make_allreduce_grads_fn
from hvd.tensorflow.mpi_ops import Average, _psid, _set_size, size

_v1 = tf.compat.v1


def broadcast_global_variables(root_rank):
    """The op that assigns rank root_rank's values to every global
    variable (TF1 graphs; eagerly use broadcast_variables)."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager "
            "execution. Please use `hvd.broadcast_variables(<model/optimizer "
            "variables>)` instead.")
    return broadcast_variables(_v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(_v1.train.SessionRunHook):
    """Broadcasts rank root_rank's global variables once the session is
    made (after their initialization or restore), so that every rank
    starts from the same state. device: where the broadcasts run."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        if not self.bcast_op or self.bcast_op.graph != _v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


class _DistributedOptimizer(_v1.train.Optimizer):
    """Wraps a tf.compat.v1.train.Optimizer: compute_gradients returns the
    gradients averaged over every rank; the rest is the wrapped
    optimizer's."""

    def __init__(self, optimizer, name=None, use_locking=False,
                 device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False,
                 op=Average, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1,
                 average_aggregated_gradients=False, num_groups=0,
                 groups=None, process_set=None, scale_local_gradients=True):
        if name is None:
            name = "Distributed{}".format(type(optimizer).__name__)
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._allreduce_grads = make_allreduce_grads_fn(
            name, device_dense, device_sparse, compression, sparse_as_dense,
            op, gradient_predivide_factor, num_groups, groups, process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_vars = set()
        self._agg = None
        if backward_passes_per_step > 1:
            self._agg = LocalAggregation(backward_passes_per_step,
                                         self._reduce_but_local,
                                         sparse_as_dense,
                                         average_aggregated_gradients)

    def register_local_var(self, var):
        """Registers a variable as worker local: its gradient is not
        reduced (divided by the process set's size when
        scale_local_gradients), as Horovod's."""
        self._local_vars.add(ref(var))

    def _reduce_but_local(self, grads, variables):
        set_size = 1
        if self._local_vars:
            set_size = size() if self.process_set is None else _set_size(
                _psid(self.process_set))
        return reduce_but_local(self._allreduce_grads, grads, variables,
                                self._local_vars, self.scale_local_gradients,
                                set_size)

    def compute_gradients(self, *args, **kwargs):
        gradients = self._optimizer.compute_gradients(*args, **kwargs)
        if not gradients:
            return gradients
        grads, variables = zip(*gradients)
        if self._agg is not None:
            self._agg.build(variables)
            reduced = self._agg.compute_gradients(
                list(grads), list(variables), list(range(len(variables))))
        else:
            reduced = self._reduce_but_local(list(grads), list(variables))
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        if self._agg is not None:
            grads_and_vars = list(args[0] if args
                                  else kwargs["grads_and_vars"])
            return self._agg.apply_gradients(
                lambda: self._optimizer.apply_gradients(*args, **kwargs),
                tf.no_op, after=[g for g, _ in grads_and_vars
                                 if g is not None])
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False,
                         device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=None,
                         scale_local_gradients=True):
    """Horovod's DistributedOptimizer: a TF1 optimizer
    (tf.compat.v1.train.Optimizer) is wrapped here (its gradients reduced
    over process_set, None for every rank, but those of variables
    registered with register_local_var); a Keras optimizer is handed to
    hvd.tensorflow.keras.DistributedOptimizer (global set only)."""
    if isinstance(optimizer, _v1.train.Optimizer):
        return _DistributedOptimizer(
            optimizer, name, use_locking, device_dense, device_sparse,
            compression, sparse_as_dense, op, gradient_predivide_factor,
            backward_passes_per_step, average_aggregated_gradients,
            num_groups, groups, process_set, scale_local_gradients)
    from hvd.tensorflow import keras as hvd_keras
    return hvd_keras.DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense,
        device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups, groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
