"""DistributedOptimizer: horovod.torch's, over libhvd.

It wraps a torch optimizer. A hook on each parameter's gradient accumulator
starts that gradient's allreduce (allreduce_async_, named
"allreduce.<parameter name>") as soon as backward has produced it, so the
communication of the last layers overlaps the backward pass of the first;
step() (or synchronize()) waits for all of them, then updates the weights.
With backward_passes_per_step=N the gradients of N backward passes are
accumulated locally and allreduced after the N-th.
"""

import contextlib
import warnings

import torch

from hvd.torch.compression import Compression
from hvd.torch.mpi_ops import (Adasum, Average, allreduce_async_,
                               grouped_allreduce_async_, resolve_op,
                               sparse_allreduce_async,
                               synchronize)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression,
                 backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=None):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self.process_set = process_set

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            # Numbered by group and place, as Horovod's (unique across
            # several param groups).
            named_parameters = [
                ("allreduce.noname.%d.%d" % (gi, i), v)
                for gi, param_group in enumerate(self.param_groups)
                for i, v in enumerate(param_group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of "
                             "tuples (name, parameter), usually produced by "
                             "model.named_parameters().")
        dups = _find_duplicates([k for k, _ in named_parameters])
        if dups:
            raise ValueError("Parameter names in named_parameters must be "
                             "unique. Found duplicates: %s" %
                             ", ".join(dups))
        all_param_ids = {id(v) for group in self.param_groups
                         for v in group["params"]}
        named_param_ids = {id(v) for _, v in named_parameters}
        unnamed = all_param_ids - named_param_ids
        if unnamed:
            raise ValueError("named_parameters was specified, but one or "
                             "more model parameters were not named. Python "
                             "object ids: %s" %
                             ", ".join(str(i) for i in sorted(unnamed)))

        self._parameter_names = {v: k for k, v in sorted(named_parameters)}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step
                                 for _, v in sorted(named_parameters)}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._p_to_group = self._make_groups(groups)
        self._group_ready = {g: set() for g in set(self._p_to_group.values())}
        # Horovod skips the hooks on one rank (and allreduces everything in
        # step()); hvd keeps them, so that one rank runs the same path. A
        # rank outside the process set steps with its own gradients.
        if process_set is None or process_set.included():
            self._register_hooks()

    def _make_groups(self, groups):
        """Parameter -> its group (a tuple, reduced as one grouped
        allreduce once all of its gradients are ready), as Horovod's
        groups=: a number of groups the trainable parameters are cut into
        in order, or lists of parameters (the others stay alone)."""
        if groups is None:
            return {}
        trainable = [p for g in self.param_groups for p in g["params"]
                     if p.requires_grad]
        if isinstance(groups, list):
            seen, cut = set(), []
            for group in groups:
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of "
                                         "torch.Tensor.")
                    if id(p) in seen:
                        raise ValueError("A parameter can only appear once "
                                         "in groups.")
                    seen.add(id(p))
                cut.append(tuple(group))
        elif isinstance(groups, int) and groups > 0:
            n = min(groups, len(trainable)) or 1
            size, extra = divmod(len(trainable), n)
            cut, at = [], 0
            for i in range(n):
                k = size + (i < extra)
                cut.append(tuple(trainable[at:at + k]))
                at += k
        else:
            raise ValueError("groups should be a non-negative integer or a "
                             "list of list of torch.Tensor.")
        return {p: group for group in cut if group for p in group}

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        return _find_duplicates(lst)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _register_hooks(self):
        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                # As Horovod: the indices and values are allgathered.
                return sparse_allreduce_async(
                    tensor, name=name, op=self.op,
                    process_set=self.process_set), None
            tensor = tensor.to_dense()
        if self.op == Average:
            # Split the average between the factors; libhvd divides by
            # the number of ranks.
            prescale_factor = 1.0 / self.gradient_predivide_factor
            postscale_factor = self.gradient_predivide_factor
        else:
            prescale_factor = 1.0
            postscale_factor = 1.0
        tensor_compressed, ctx = self._compression.compress(tensor)
        handle = allreduce_async_(tensor_compressed, name=name, op=self.op,
                                  prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor,
                                  process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        """One grouped allreduce of a group's gradients (named by its
        first parameter's name)."""
        tensors, ctxs = zip(*[self._compression.compress(q.grad)
                              for q in group])
        if self.op == Average:
            pre = 1.0 / self.gradient_predivide_factor
            post = self.gradient_predivide_factor
        else:
            pre = post = 1.0
        handle = grouped_allreduce_async_(
            list(tensors), name="group.%s" % self._parameter_names[group[0]],
            op=self.op, prescale_factor=pre, postscale_factor=post,
            process_set=self.process_set)
        return handle, ctxs

    def _group_done(self, p):
        """p's gradient is ready: its group goes when all of them are."""
        group = self._p_to_group[p]
        ready = self._group_ready[group]
        ready.add(p)
        if len(ready) == len(group):
            self._handles[group] = self._grouped_allreduce_grad_async(group)
            for q in group:
                self._handles.pop(q, None)
            ready.clear()

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than "
                        "backward_passes_per_step times before call "
                        "to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0 and p in self._p_to_group and \
                    not p.grad.is_sparse:
                self._group_done(p)
                return
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those whose hook
        has not run: a parameter this rank did not use gets zeros)."""
        if self.process_set is not None and not self.process_set.included():
            self._synchronized = True
            return
        done = set()
        for key in self._handles:
            done.update(key if isinstance(key, tuple) else (key,))
        missing_p = self._requires_update - done
        for p in sorted(missing_p, key=lambda q: self._parameter_names[q]):
            if p.grad is None:
                # Another rank may have computed it (dynamic graphs): it
                # still needs this rank's contribution.
                p.grad = p.data.new(p.size()).zero_()
            if p in self._p_to_group and not p.grad.is_sparse:
                self._group_done(p)
                continue
            handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                handle, ctx = self._allreduce_grad_async(p)
                self._handles[p] = (handle, ctx)
        try:
            for p, (handle, ctx) in self._handles.items():
                if isinstance(p, tuple):  # a group
                    outputs = synchronize(handle)
                    with torch.no_grad():
                        for q, out, qctx in zip(p, outputs, ctx):
                            self._allreduce_delay[q] = \
                                self.backward_passes_per_step
                            q.grad.set_(self._compression.decompress(out,
                                                                     qctx))
                    continue
                output = synchronize(handle)
                self._allreduce_delay[p] = self.backward_passes_per_step
                with torch.no_grad():
                    if p.grad.is_sparse:
                        reduced = output if ctx is None else \
                            self._compression.decompress(output, ctx)
                        if not reduced.is_sparse:  # sparse_as_dense
                            reduced = reduced.to_sparse()
                        # Sparse tensors have no set_: the same in two.
                        p.grad.zero_().add_(reduced)
                    else:
                        p.grad.set_(self._compression.decompress(output,
                                                                 ctx))
        finally:
            self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For a step() after an explicit synchronize() (e.g. to clip the
        reduced gradients in between)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause "
                              "training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context "
                              "if you use optimizer.synchronize() in your "
                              "code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after "
                                 "loss.backward() but before "
                                 "optimizer.step() or "
                                 "optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race "
                                 "condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """op=Adasum, as Horovod's: each rank takes its optimizer's step with
    its own gradients, and the steps (the parameters' deltas) are combined
    across ranks by Adasum, then applied from where the step started."""

    def __init__(self, params, named_parameters, compression):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            names = {v: k for k, v in named_parameters}
        else:
            names = {}
        self._names = {}
        for gi, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                self._names[p] = names.get(p, "adasum.noname.%d.%d" % (gi, i))

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]
                  if p.grad is not None]
        starts = [p.detach().clone() for p in params]
        loss = super(self.__class__, self).step(closure)
        handles = []
        with torch.no_grad():
            for p, start in zip(params, starts):
                delta = p.detach() - start
                compressed, ctx = self._compression.compress(delta)
                handles.append((p, start, ctx, allreduce_async_(
                    compressed, name="adasum.%s" % self._names[p],
                    op=Adasum)))
            for p, start, ctx, h in handles:
                delta = self._compression.decompress(synchronize(h), ctx)
                p.copy_(start + delta)
        return loss


def _find_duplicates(lst):
    seen, dups = set(), set()
    for el in lst:
        if el in seen:
            dups.add(el)
        seen.add(el)
    return sorted(dups)


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=Compression.none,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False,
                         process_set=None):
    """Wraps optimizer so that gradients are averaged (op) across ranks
    before each step.

    named_parameters: model.named_parameters(), which names each
    gradient's allreduce (recommended; without it they are numbered).
    compression: Compression.none or Compression.fp16.
    backward_passes_per_step: backward passes accumulated locally before
    the allreduce (divide the loss by it to average them).
    op: Average (default), Sum, Min, Max, Product, or Adasum (each rank
    steps with its own gradients and the steps are combined by Adasum, as
    Horovod's Adasum optimizer).
    gradient_predivide_factor: with Average, the gradients are multiplied
    by 1/f before the sum and by f/size after it.
    groups: as Horovod's, a number of groups the trainable parameters are
    cut into (in order), or lists of parameters; each group's gradients go
    as one grouped allreduce once all of them are ready (num_groups is the
    deprecated name). hvd fuses small allreduces by itself either way.
    process_set: the gradients are averaged among its ranks only (call
    the optimizer's step on its members).
    """
    op = resolve_op(op, None)
    if op == Adasum:
        if process_set is not None:
            raise NotImplementedError("Adasum does not support non-global "
                                      "process sets yet.")
        ns = {k: v for k, v in _DistributedAdasumOptimizer.__dict__.items()
              if k not in ("__dict__", "__weakref__")}
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), ns)
        return cls(optimizer.param_groups, named_parameters, compression)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with "
                         "op != Average")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` "
                      "and will be removed", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    ns = {k: v for k, v in _DistributedOptimizer.__dict__.items()
          if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), ns)
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, gradient_predivide_factor,
               groups, sparse_as_dense, process_set)
