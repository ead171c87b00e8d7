"""DistributedOptimizer for Keras 2: tf_keras (what tf.keras is with
TF_USE_LEGACY_KERAS=1) and the ``keras`` 2.x of older TensorFlow, both its
optimizers (``tf_keras.optimizers.*``) and the legacy ones
(``tf_keras.optimizers.legacy.*``, OptimizerV2).

Keras 2's model.fit calls ``optimizer.minimize(loss, vars, tape=tape)``,
which computes the gradients (``compute_gradients`` in the optimizers,
``_compute_gradients`` in the legacy ones) and hands them to
``apply_gradients``; a user's loop calls either, and TF1 graphs call
``get_gradients``. The gradients are allreduced where they are computed
(as Horovod does), and ``apply_gradients`` allreduces those it did not
compute itself, so that ``apply_gradients(zip(tape.gradient(...), vars))``
averages as it does on Keras 3. With ``backward_passes_per_step`` > 1 the
gradients are summed locally, allreduced every backward_passes_per_step-th
pass and applied then; the other passes only count the iteration.

The class is made at run time as a subclass of the user's optimizer class,
with its name, as Horovod's, so a saved model loads without hvd."""

import tensorflow as tf

from hvd.tensorflow._reduce import ref as _ref
from hvd.tensorflow.keras._optimizer import _HvdState


class CallableList(list):
    """A list that is also callable (returns itself), so that
    ``opt.variables`` and Keras 2's ``opt.variables()`` both work."""

    def __call__(self):
        return self


class _Keras2DistributedMixin(_HvdState):
    """Placed before the user's Keras 2 optimizer class in the dynamic
    subclass."""

    def _hvd_more_state(self):
        object.__setattr__(self, "_hvd_index", {})
        object.__setattr__(self, "_hvd_seen", [])

    @property
    def variables(self):
        # Horovod's shim: opt.variables and opt.variables() alike, for the
        # legacy optimizers (a method) and the others (a property).
        v = super().variables
        return CallableList(v() if callable(v) else v)

    # -- reducing ------------------------------------------------------

    def _hvd_indices(self, variables):
        """Each variable's number among all those this optimizer has seen
        (the accumulators' keys), making the accumulators of new ones."""
        index = self.__dict__["_hvd_index"]
        seen = self.__dict__["_hvd_seen"]
        out = []
        for v in variables:
            key = _ref(v)
            if key not in index:
                index[key] = len(seen)
                seen.append(v)
            out.append(index[key])
        self.__dict__["_hvd_agg"].build(seen)
        return out

    def _hvd_mark(self, reduced):
        object.__setattr__(self, "_hvd_reduced", list(reduced))
        return reduced

    # -- Keras 2 hooks ---------------------------------------------------

    def _hvd_base_gradients(self, loss, var_list, grad_loss, tape):
        base = super(_Keras2DistributedMixin, self)
        if hasattr(base, "_compute_gradients"):  # the legacy OptimizerV2
            return base._compute_gradients(loss, var_list,
                                           grad_loss=grad_loss, tape=tape)
        if grad_loss is None:
            return base.compute_gradients(loss, var_list, tape=tape)
        if callable(var_list):
            var_list = var_list()
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        return list(zip(tape.gradient(loss, var_list, grad_loss), var_list))

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's: the gradients of loss (a tensor, with tape, or a
        callable) for var_list, allreduced (or aggregated), as a list of
        (gradient, variable). Passing them to apply_gradients does not
        reduce them again."""
        pairs = list(self._hvd_base_gradients(loss, var_list, grad_loss,
                                              tape))
        if not pairs:
            return pairs
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        reduced = self._hvd_mark(self._hvd_reduce(grads, variables))
        return list(zip(reduced, variables))

    def get_gradients(self, loss, params):
        """Horovod's (TF1 graphs): the gradients, allreduced."""
        grads = super().get_gradients(loss, params)
        params = tf.nest.flatten(params)
        return self._hvd_mark(self._hvd_reduce(list(grads), params))

    def _hvd_build(self, variables):
        """Makes the optimizer's variables (slots, iterations) now, outside
        the tf.cond that applies on communicating passes only."""
        with tf.init_scope():
            if hasattr(self, "_create_all_weights"):  # OptimizerV2
                self._create_all_weights(variables)
            else:
                self.build(variables)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        self._hvd_state()
        pairs = list(grads_and_vars)
        base_apply = super().apply_gradients
        if not pairs:
            return base_apply(pairs, *args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        already = self.__dict__["_hvd_reduced"]
        object.__setattr__(self, "_hvd_reduced", None)
        if already is not None and len(already) == len(grads) and all(
                a is b for a, b in zip(already, grads)):
            reduced = grads  # from our compute_gradients: reduced already
        else:
            reduced = self._hvd_reduce(grads, variables)
        pairs = list(zip(reduced, variables))
        helper = self.__dict__["_hvd_agg"]
        if helper is None:
            return base_apply(pairs, *args, **kwargs)
        self._hvd_build([v for g, v in pairs if g is not None])
        return tf.autograph.experimental.do_not_convert(
            helper.apply_gradients)(
            lambda: base_apply(pairs, *args, **kwargs),
            lambda: self.iterations.assign_add(1))


def keras2_optimizer_classes(keras2):
    """The optimizer base classes of a Keras 2 module: the optimizers' and,
    where it has them, the legacy ones'."""
    opts = keras2.optimizers
    out = [opts.Optimizer]
    legacy = getattr(opts, "legacy", None)
    if legacy is not None and getattr(legacy, "Optimizer", None) is not None:
        out.append(legacy.Optimizer)
    return tuple(out)


def distributed_class(base, options):
    """The dynamic subclass of a Keras 2 optimizer class base."""
    return type(base.__name__, (_Keras2DistributedMixin, base),
                {"_hvd_options": options, "__module__": base.__module__,
                 "__qualname__": base.__qualname__, "__doc__": base.__doc__})


def copy_state(src, dst, var_list=None):
    """Keeps src's state in dst (same class and config): with var_list (the
    variables src was built on, e.g. the loaded model's trainable ones) dst
    is built on them and takes every optimizer variable (slots, iterations,
    learning rate); without, the iteration count only (the slots are then
    made afresh on the first step)."""
    if var_list:
        with tf.init_scope():
            if hasattr(dst, "_create_all_weights"):  # OptimizerV2
                dst._create_all_weights(var_list)
            else:
                dst.build(var_list)
        got, want = list(dst.variables()), list(src.variables())
        if len(got) == len(want) and all(
                tuple(g.shape) == tuple(w.shape) for g, w in zip(got, want)):
            for g, w in zip(got, want):
                g.assign(w)
            return
    try:
        it = int(src.iterations.numpy())
    except Exception:  # pragma: no cover - no iterations variable yet
        return
    if it:
        dst.iterations.assign(it)
