"""horovod.torch's helpers: broadcast_parameters, broadcast_optimizer_state,
broadcast_object, allgather_object."""

import torch

from hvd import _core
from hvd.torch.mpi_ops import broadcast_async_, rank, synchronize


def broadcast_parameters(params, root_rank):
    """Overwrites every rank's parameters with root_rank's.

    params: a state_dict (model.state_dict()), or a list or iterator of
    (name, tensor) pairs (model.named_parameters()) or of tensors. All
    broadcasts are started, then waited for.
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    else:
        params = [p if isinstance(p, tuple) else (None, p)
                  for p in list(params)]
    handles = []
    for name, p in params:
        if not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is a %s, not a "
                             "tensor" % (name, type(p).__name__))
        handles.append(broadcast_async_(p, root_rank, name))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every rank's optimizer state (its per-parameter state and its
    param_groups' options, e.g. lr) root_rank's.

    As Horovod's: an optimizer without state yet gets it first, from one
    step with zero gradients (sparse ones for SparseAdam, and for SGD on
    the parameters of model's sparse embeddings), taken by the wrapped
    optimizer alone when it is a DistributedOptimizer (no allreduce). Then
    root_rank's state_dict is pickled, broadcast, and loaded on the other
    ranks with load_state_dict(), which casts it to their parameters'
    dtype and device.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if len(optimizer.state_dict()["state"]) == 0:
        sparse = set()
        if model is not None:
            for m in model.modules():
                if isinstance(m, torch.nn.Embedding) and m.sparse:
                    sparse.update(id(p) for p in m.parameters())
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam) or \
                            (isinstance(optimizer, torch.optim.SGD) and
                             id(p) in sparse):
                        p.grad = p.grad.to_sparse()
        if type(optimizer).__module__ == "hvd.torch.optimizer":
            super(type(optimizer), optimizer).step()
        else:
            optimizer.step()
    state = _core.broadcast_object(
        optimizer.state_dict() if rank() == root_rank else None, root_rank,
        name="optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's obj (any picklable object) on every rank."""
    return _core.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's obj (any picklable object), in rank
    order; the pickles may have different lengths."""
    return _core.allgather_object(obj, name, process_set)


__all__ = ["broadcast_parameters", "broadcast_optimizer_state",
           "broadcast_object", "allgather_object"]
