"""DistributedOptimizer for Keras 3 (the Keras that TensorFlow 2.16+ ships);
_optimizer2.py has Keras 2's (tf_keras), and create_distributed_optimizer
picks by the optimizer's own class.

Keras 3's TensorFlow trainer computes the gradients itself
(``tape.gradient`` in ``train_step``) and hands them to
``optimizer.apply_gradients(zip(grads, vars))``, which calls
``optimizer.apply(grads, vars)``; a user's loop calls either. The Keras 2
hooks that Horovod overrides (``get_gradients``, ``_compute_gradients``,
``_aggregate_gradients``) are never called by Keras 3. So the class built
here overrides ``apply``, the one method both paths go through: the
gradients are allreduced there (or accumulated locally, and allreduced and
applied every ``backward_passes_per_step``-th call) before the wrapped
optimizer's own ``apply`` updates the weights. ``apply_gradients`` is
overridden only to accept (and ignore) Keras 2 keyword arguments such as
``experimental_aggregate_gradients``.

As Horovod's, the class is made at run time as a subclass of the user's
optimizer class, with the same name, so ``isinstance`` and
``get_config``/``from_config`` behave as the user's optimizer, and a model
saved with it loads without hvd as the plain optimizer.
"""

import tensorflow as tf

import hvd.tensorflow as _hvd
from hvd.tensorflow import _keras_compat as _compat
from hvd.tensorflow._reduce import (GradientReducer, LocalAggregation,
                                    reduce_but_local)
from hvd.tensorflow._reduce import ref as _ref


def _check_not_xla():
    """hvd's collectives have no XLA kernels: say so clearly, and how to
    avoid it, instead of TensorFlow's 'unsupported operations'."""
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(
            tf.compat.v1.get_default_graph())
    except Exception:  # pragma: no cover - private API moved
        return
    if in_xla:
        raise ValueError(
            "hvd DistributedOptimizer: the gradients' allreduce cannot be "
            "compiled by XLA; pass jit_compile=False to model.compile() "
            "(Keras 3 turns XLA on by default when a GPU is visible) or to "
            "tf.function()")


class _Reducer(GradientReducer):
    """GradientReducer, refusing XLA with a sentence that says what to do."""

    def __call__(self, grads, variables):
        _check_not_xla()
        return super().__call__(grads, variables)


class _HvdState:
    """What DistributedOptimizer adds to an optimizer of either Keras (the
    Keras 3 mixin below, the Keras 2 one in _optimizer2.py): the Horovod
    options on the class (``_hvd_options``), so that ``from_config`` copies
    distribute the same way, and the per-instance state, made on first
    use."""

    _hvd_options = None

    def _hvd_state(self):
        d = self.__dict__
        if "_hvd_reducer" not in d:
            o = self._hvd_options
            reducer = _Reducer(o["name"], o["device_dense"],
                               o["device_sparse"], o["compression"],
                               o["sparse_as_dense"], o["op"],
                               o["gradient_predivide_factor"], o["groups"],
                               o["process_set"])
            helper = None
            if o["backward_passes_per_step"] > 1:
                helper = LocalAggregation(
                    o["backward_passes_per_step"], self._hvd_allreduce,
                    o["sparse_as_dense"], o["average_aggregated_gradients"])
            # object.__setattr__: neither tracked by Keras nor taken for a
            # hyperparameter by Keras 2's OptimizerV2.__setattr__.
            object.__setattr__(self, "_hvd_reducer", reducer)
            object.__setattr__(self, "_hvd_agg", helper)
            object.__setattr__(self, "_hvd_local_vars", set())
            object.__setattr__(self, "_hvd_reduced", None)
            self._hvd_more_state()
        return self.__dict__["_hvd_reducer"]

    def _hvd_more_state(self):
        """A Keras's own additions to the per-instance state."""

    @property
    def _agg_helper(self):
        """Horovod's name for the gradient aggregation helper (None when
        backward_passes_per_step is 1); its ``counter`` is the number of
        backward passes since the last allreduce."""
        self._hvd_state()
        return self.__dict__["_hvd_agg"]

    def register_local_var(self, var):
        """Registers a variable as worker local: its gradient is not
        allreduced (it is divided by size, as Horovod's
        scale_local_gradients=True does)."""
        self._hvd_state()
        self.__dict__["_hvd_local_vars"].add(_ref(var))

    # Not converted by AutoGraph when a tf.function calls it: it has no
    # Python control flow on tensors (tf.cond is explicit), and converting
    # hvd's call graph made the first trace take seconds.
    @tf.autograph.experimental.do_not_convert
    def _hvd_reduce(self, grads, variables):
        """This step's gradients as they are to be applied: allreduced, or
        (backward_passes_per_step > 1) accumulated and allreduced on every
        backward_passes_per_step-th pass (_hvd_indices: each variable's
        number for the accumulators, a Keras's own)."""
        self._hvd_state()
        helper = self.__dict__["_hvd_agg"]
        if helper is not None:
            indices = self._hvd_indices(variables)
            return helper.compute_gradients(grads, variables, indices)
        return self._hvd_allreduce(grads, variables)

    def _hvd_allreduce(self, grads, variables):
        """Allreduces grads (among the process set's ranks) but those of
        registered local variables, which are divided by the set's size
        (Horovod's scale_local_gradients)."""
        reducer = self._hvd_state()
        ps = self._hvd_options["process_set"]
        n = _hvd.size() if ps is None else ps.size()
        return reduce_but_local(
            reducer, grads, variables, self.__dict__["_hvd_local_vars"],
            self._hvd_options["scale_local_gradients"], n)


class _DistributedMixin(_HvdState):
    """Placed before the user's Keras 3 optimizer class in the dynamic
    subclass."""

    @property
    def lr(self):
        """Keras 2's alias of learning_rate, which Horovod users read."""
        return self.learning_rate

    @lr.setter
    def lr(self, value):
        self.learning_rate = value

    # -- Keras 3 hooks ----------------------------------------------------

    def build(self, variables):
        super().build(variables)
        helper = self._agg_helper
        if helper is not None:
            helper.build(list(self._trainable_variables))

    def apply_gradients(self, grads_and_vars, **kwargs):
        # Keras 2 callers pass experimental_aggregate_gradients= and
        # friends, which mean nothing here; the base method calls apply().
        for key in kwargs:
            if key not in ("experimental_aggregate_gradients", "name",
                           "skip_gradients_aggregation"):
                raise TypeError("apply_gradients() got an unexpected "
                                "keyword argument %r" % key)
        return super().apply_gradients(grads_and_vars)

    def apply(self, grads, trainable_variables=None):
        self._hvd_state()
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                return super().apply(grads, trainable_variables)  # errors
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                # Built here, outside any tf.cond below.
                self.build(variables)
                self.built = True
        already = self.__dict__["_hvd_reduced"]
        object.__setattr__(self, "_hvd_reduced", None)
        if already is not None and len(already) == len(grads) and all(
                a is b for a, b in zip(already, grads)):
            reduced = grads  # from our compute_gradients: reduced already
        else:
            reduced = self._hvd_reduce(grads, variables)
        base_apply = super().apply
        helper = self.__dict__["_hvd_agg"]
        if helper is None:
            return base_apply(reduced, trainable_variables)
        tf.autograph.experimental.do_not_convert(helper.apply_gradients)(
            lambda: base_apply(reduced, trainable_variables),
            lambda: self._iterations.assign_add(1))
        return None

    # -- Horovod's API ------------------------------------------------------

    def _hvd_indices(self, variables):
        return [self._get_variable_index(v) for v in variables]

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's: the gradients of loss (a tensor, with tape, or a
        callable) for var_list, allreduced (or aggregated), as a list of
        (gradient, variable). Passing them to apply_gradients does not
        reduce them again."""
        if callable(var_list):
            var_list = var_list()
        var_list = list(var_list)
        if tape is None:
            if not callable(loss):
                raise ValueError("`tape` is required when a `Tensor` loss "
                                 "is passed.")
            tape = tf.GradientTape()
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        grads = tape.gradient(loss, var_list, grad_loss)
        if not self.built:
            self.build(var_list)
            self.built = True
        reduced = self._hvd_reduce(list(grads), var_list)
        object.__setattr__(self, "_hvd_reduced", list(reduced))
        return list(zip(reduced, var_list))


def hvd_options(name, device_dense, device_sparse, compression,
                sparse_as_dense, gradient_predivide_factor, op,
                backward_passes_per_step, average_aggregated_gradients,
                groups, scale_local_gradients, process_set):
    """The options DistributedOptimizer keeps on the class it makes (name:
    None for "Distributed" + the class name, set when the class is made)."""
    return dict(
        name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=int(backward_passes_per_step),
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups, scale_local_gradients=scale_local_gradients,
        process_set=process_set)


def is_distributed(optimizer):
    from hvd.tensorflow.keras._optimizer2 import _Keras2DistributedMixin
    return isinstance(optimizer, (_DistributedMixin,
                                  _Keras2DistributedMixin))


def distributed_class(base, options):
    """The dynamic subclass of base (a Keras 3 or a Keras 2 optimizer
    class) that distributes with options."""
    from hvd.tensorflow.keras import _optimizer2
    options = dict(options)
    options["name"] = options["name"] or "Distributed%s" % base.__name__
    keras2 = _compat.keras2_module()
    if keras2 is not None and issubclass(
            base, _optimizer2.keras2_optimizer_classes(keras2)):
        return _optimizer2.distributed_class(base, options)
    cls = type(base.__name__, (_DistributedMixin, base),
               {"_hvd_options": options, "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "__doc__": base.__doc__})
    # A registered custom optimizer keeps its registered name in configs.
    try:
        from keras.src.saving import object_registration
        reg = object_registration.GLOBAL_CUSTOM_NAMES.get(base)
        if reg is not None:
            object_registration.GLOBAL_CUSTOM_NAMES[cls] = reg
    except Exception:  # pragma: no cover - private module moved
        pass
    return cls


def create_distributed_optimizer(optimizer, name, device_dense, device_sparse,
                                 compression, sparse_as_dense,
                                 gradient_predivide_factor, op,
                                 backward_passes_per_step,
                                 average_aggregated_gradients, groups,
                                 scale_local_gradients=True,
                                 process_set=None):
    if is_distributed(optimizer):
        raise ValueError("the optimizer is a DistributedOptimizer already")
    options = hvd_options(name, device_dense, device_sparse, compression,
                          sparse_as_dense, gradient_predivide_factor, op,
                          backward_passes_per_step,
                          average_aggregated_gradients, groups,
                          scale_local_gradients, process_set)
    # Per optimizer, not per process: a tf_keras (Keras 2) optimizer and a
    # Keras 3 one may live side by side.
    if _compat.is_keras2(optimizer):
        from hvd.tensorflow.keras import _optimizer2
        keras2 = _compat.keras_of(optimizer)
        if not isinstance(optimizer,
                          _optimizer2.keras2_optimizer_classes(keras2)):
            raise TypeError("DistributedOptimizer wraps a Keras optimizer; "
                            "got %r" % type(optimizer))
        cls = distributed_class(optimizer.__class__, options)
        new = cls.from_config(optimizer.get_config())
        _optimizer2.copy_state(optimizer, new)
        return new
    keras = _compat.keras3()
    if keras is None or not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer wraps a keras.optimizers."
                        "Optimizer (Keras 3) or a tf_keras one (Keras 2); "
                        "got %r" % type(optimizer))
    cls = distributed_class(optimizer.__class__, options)
    new = cls.from_config(optimizer.get_config())
    _copy_state(optimizer, new)
    return new


def _copy_state(src, dst):
    """Keeps src's state in dst (same class and config, so the same
    variables in the same order once built on the same variables): slots,
    iterations, learning rate. An optimizer built on no variables (what
    Keras 3 makes of an .h5 file's) gives its iterations and learning rate
    only, and dst is left to build on first use."""
    if src.built and list(src._trainable_variables):
        dst.build(list(src._trainable_variables))
        dst.built = True
    pairs = list(zip(dst.variables, src.variables))
    if len(dst.variables) != len(src.variables):
        pairs = [(dst._iterations, src._iterations)]
        if hasattr(dst._learning_rate, "assign") and \
                hasattr(src._learning_rate, "assign"):
            pairs.append((dst._learning_rate, src._learning_rate))
    for d, s in pairs:
        if tuple(d.shape) == tuple(s.shape):
            d.assign(s)
