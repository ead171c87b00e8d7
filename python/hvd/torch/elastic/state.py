"""TorchState: horovod.torch.elastic.TorchState over hvd."""

import copy

import torch

from hvd.elastic import ObjectState
from hvd.torch.elastic.sampler import ElasticSampler
from hvd.torch.functions import (allgather_object, broadcast_object,
                                 broadcast_optimizer_state,
                                 broadcast_parameters)
from hvd.torch.mpi_ops import rank


def _host_copy(obj):
    """A deep copy of obj with every tensor copied to the CPU (a commit
    must not live in GPU memory only, and must not share storage with the
    live model)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps an OrderedDict's type and metadata
        for k, v in obj.items():
            out[k] = _host_copy(v)
        return out
    if isinstance(obj, list):
        return [_host_copy(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_host_copy(v) for v in obj)
    return copy.deepcopy(obj)


class StateHandler(object):
    """How TorchState saves, restores and syncs one kind of object."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """After a re-formation, before the sync."""
        pass

    def set_value(self, value):
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A torch.nn.Module: its state_dict (parameters and buffers)."""

    def __init__(self, model):
        super().__init__(model)
        self.save()

    def save(self):
        self._saved = _host_copy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)
        self.save()


class OptimizerStateHandler(StateHandler):
    """A torch.optim.Optimizer (a DistributedOptimizer too): its
    state_dict (per-parameter state and param_groups' options)."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.save()

    def save(self):
        self._saved = _host_copy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)
        self.save()


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: its epoch and what it has processed; synced
    from rank 0, with the indices every rank recorded (record_indices)
    gathered."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def reset(self):
        self.value.reset()

    def sync(self):
        state = self.value.state_dict()
        indices = set().union(*allgather_object(state["processed_indices"]))
        state = broadcast_object(state)
        state["processed_indices"] = indices
        self.value.load_state_dict(state)
        self.save()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs TorchState looks through, in
    order, for each of its keyword arguments."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for kind, handler_cls in _handler_registry:
        if isinstance(value, kind):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch trainer: a model, an optimizer, and any
    other keyword argument as an attribute (state.epoch, state.sampler).

    A model (torch.nn.Module), optimizer (torch.optim.Optimizer) or
    ElasticSampler, under any name, is handled by its handler: save()
    copies its state_dict to host memory, restore() loads it back,
    sync() broadcasts rank 0's (broadcast_parameters,
    broadcast_optimizer_state). Other values are plain Python objects,
    saved by reference and synced with broadcast_object: assign new
    values (state.epoch = 3) rather than changing them in place.
    Assigning a new model or optimizer to an attribute saves it at once.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _get_handler(value)
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super(TorchState, self).__init__(bcast_object=broadcast_object,
                                         get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super(TorchState, self).save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super(TorchState, self).restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super(TorchState, self).sync()

    def reset(self):
        for handler in self._handlers.values():
            handler.reset()
        super(TorchState, self).reset()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["TorchState", "StateHandler", "ModelStateHandler",
           "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry"]
