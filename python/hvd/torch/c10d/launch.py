"""torch's env:// (init_process_group's default) under hvdrun and mpirun,
which give no MASTER_ADDR: hvd's ranks, and torch's store on rank 0."""

import importlib
import os
import socket

import torch.distributed as dist

from hvd import _core

_LAUNCHED_BY = ("HVD_RANK", "HVD_ELASTIC", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                "PMIX_RANK")


def _store_address():
    """The address rank 0's store listens on, as the other ranks reach it:
    the one this host routes hvdrun's rendezvous through (no packet is
    sent), else the host's name."""
    peer = os.environ.get("HVD_RENDEZVOUS_ADDR")
    if peer:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, int(os.environ.get("HVD_RENDEZVOUS_PORT",
                                                    "9"))))
                return s.getsockname()[0]
        except (OSError, ValueError):
            pass
    return socket.gethostname()


def _hvd_rendezvous(timeout):
    """torch's env:// where the launcher is hvd's (hvdrun, mpirun) and
    gives no MASTER_ADDR: hvd's ranks, and a TCPStore on rank 0 whose
    address hvd broadcasts."""
    if not _core.is_initialized():
        _core.init()
    rank, size = _core.rank(), _core.size()
    store = None
    if rank == 0:
        addr = _store_address()
        store = dist.TCPStore(addr, 0, size, True, timeout,
                              wait_for_workers=False)
        where = (addr, store.port)
    else:
        where = None
    addr, port = _core.broadcast_object(where, 0, name="hvd.c10d.store")
    if store is None:
        store = dist.TCPStore(addr, port, size, False, timeout)
    return store, rank, size


def _wrap_env_rendezvous():
    """Makes env:// (init_process_group's default) work under hvdrun and
    mpirun, where torch's own would fail for want of MASTER_ADDR; with
    MASTER_ADDR set, or under another launcher, torch's runs unchanged."""
    # (torch.distributed.rendezvous is also the name of a function.)
    rdv = importlib.import_module("torch.distributed.rendezvous")
    from torch.distributed.constants import default_pg_timeout
    handlers = getattr(rdv, "_rendezvous_handlers", None)
    torch_env = handlers.get("env") if handlers is not None else None
    if torch_env is None or getattr(torch_env, "_hvd", False):
        return

    def env_handler(url, timeout=default_pg_timeout, **kwargs):
        if os.environ.get("MASTER_ADDR") or \
                not any(v in os.environ for v in _LAUNCHED_BY):
            yield from torch_env(url, timeout=timeout, **kwargs)
            return
        yield _hvd_rendezvous(timeout)
        raise RuntimeError("Unable to perform re-rendezvous using env:// "
                           "method")

    env_handler._hvd = True
    handlers["env"] = env_handler
