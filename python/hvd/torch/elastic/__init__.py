"""hvd.torch.elastic: horovod.torch.elastic over hvd (docs/elastic.md).

    import hvd.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0,
                                   sampler=sampler)

    @hvd.elastic.run
    def train(state):
        ...

run re-forms the job in the same process (hvd_elastic_reset), where
Horovod shuts down and initializes again.
"""

from hvd._lib import HorovodInternalError, HostsUpdatedInterrupt
from hvd.elastic import (ObjectState, State, generation, hosts_updated,
                         is_enabled, reset, run_fn)
from hvd.torch.elastic.sampler import ElasticSampler
from hvd.torch.elastic.state import TorchState


def run(func):
    """Decorator: func(state, *args, **kwargs) runs elastically: the
    state is synced from rank 0 first; after a lost peer the state is
    restored to its last commit, the job re-formed and synced, and func
    called again; after a HostsUpdatedInterrupt (from state.commit()) the
    job is re-formed and synced without a restore. The first collectives
    of func must not come before state.sync() (run calls it)."""
    return run_fn(func, _reset)


def _reset():
    reset()


__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState",
           "run_fn", "HorovodInternalError", "HostsUpdatedInterrupt",
           "is_enabled", "hosts_updated", "generation"]
