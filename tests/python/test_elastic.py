"""hvd.elastic and hvd.torch.elastic.

The run loop, commits, restores and re-partitioning are checked with the
C elastic functions replaced by a fake (hvd._lib.elastic patched): the
fake says whether the job is elastic, which rank was told hosts changed,
and what hvd_elastic_reset returns. The collectives are real: every rank
runs the same tests in the same order (np 1 and 2), so TorchState.sync
and check_host_updates' allreduce are the job's.
"""

import random

import pytest
import torch

import hvd as hvd_np
import hvd.torch as hvd
from hvd import _core
from hvd import _lib as L
from hvd import elastic as E
from hvd import process_sets as PS
from hvd.torch.elastic import sampler as sampler_mod


class FakeElastic:
    """Stands in for hvd_elastic_{enabled,reset,hosts_updated,
    generation}."""

    def __init__(self, enabled=1, hosts=0, reset_status=0):
        self.flags = {"enabled": enabled, "hosts_updated": hosts}
        self.reset_status = reset_status
        self.resets = 0
        self.gen = 0

    def fn(self, name):
        if name == "reset":
            def reset():
                self.resets += 1
                if self.reset_status == 0:
                    self.gen += 1
                    self.flags["hosts_updated"] = 0
                return self.reset_status
            return reset
        if name == "generation":
            return lambda: self.gen
        return lambda: self.flags[name]


@pytest.fixture
def fake(monkeypatch):
    f = FakeElastic()
    monkeypatch.setattr(L, "elastic", f.fn)
    return f


class Recorder(E.State):
    """A State that logs what run() does to it."""

    def __init__(self):
        super().__init__(bcast_object=hvd.broadcast_object,
                         get_rank=hvd.rank)
        self.log = []

    def save(self):
        self.log.append("save")

    def restore(self):
        self.log.append("restore")

    def sync(self):
        self.log.append("sync")

    def reset(self):
        self.log.append("reset")


# ---------------------------------------------------------------------
# Names


def test_names():
    assert L.STATUS_NAMES[12] == "HVD_ERR_PEERS_CHANGED"
    assert L.HVD_ERR_PEERS_CHANGED == 12
    err = L.error_for(L.HVD_ERR_PEERS_CHANGED, "peers changed")
    assert isinstance(err, hvd.HorovodInternalError)
    assert err.status_name == "HVD_ERR_PEERS_CHANGED"
    for mod in (hvd_np, hvd, hvd.elastic, hvd_np.elastic):
        assert mod.HostsUpdatedInterrupt is L.HostsUpdatedInterrupt
        assert mod.HorovodInternalError is L.HorovodInternalError
    assert issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    assert hvd.HostsUpdatedInterrupt(True).skip_sync is True
    for name in ("run", "TorchState", "ElasticSampler"):
        assert hasattr(hvd.elastic, name)
    for name in ("run", "run_fn", "State", "ObjectState"):
        assert hasattr(hvd_np.elastic, name)


def test_not_elastic_here():
    # Under a plain hvdrun; a libhvd without elastic support says so.
    assert hvd.elastic.is_enabled() is False
    assert hvd.elastic.hosts_updated() is False
    try:
        L.elastic("reset")
    except hvd.UnsupportedError:
        with pytest.raises(hvd.UnsupportedError):
            E.reset()


# ---------------------------------------------------------------------
# The run loop


def test_run_outside_elastic_job():
    state = Recorder()

    @hvd.elastic.run
    def train(state, a, b=0):
        state.log.append("train")
        return a + b

    assert train(state, 2, b=3) == 5
    assert state.log == ["sync", "train"]

    @hvd.elastic.run
    def fails(state):
        raise hvd.HorovodInternalError(L.HVD_ERR_PEER_LOST, "lost")

    state.log = []
    with pytest.raises(hvd.HorovodInternalError):
        fails(state)
    assert state.log == ["sync"]  # no restore, no reset: not elastic


def test_run_internal_error_restores_resets_syncs(fake):
    state = Recorder()
    calls = []
    state.register_reset_callbacks([lambda: calls.append("cb1")])
    state.register_reset_callbacks([lambda: calls.append("cb2")])

    @hvd.elastic.run
    def train(state):
        state.log.append("train")
        if state.log.count("train") < 3:
            raise hvd.HorovodInternalError(L.HVD_ERR_PEERS_CHANGED, "x")
        return "done"

    assert train(state) == "done"
    assert state.log == ["sync", "train", "restore", "reset", "sync",
                         "train", "restore", "reset", "sync", "train"]
    assert fake.resets == 2
    assert calls == ["cb1", "cb2", "cb1", "cb2"]
    assert hvd.elastic.generation() == 2


@pytest.mark.parametrize("skip_sync", [True, False])
def test_run_hosts_updated(fake, skip_sync):
    state = Recorder()

    @hvd.elastic.run
    def train(state):
        state.log.append("train")
        if state.log.count("train") == 1:
            raise hvd.HostsUpdatedInterrupt(skip_sync)
        return 7

    assert train(state) == 7
    expect = ["sync", "train", "reset"] + ([] if skip_sync else ["sync"])
    assert state.log == expect + ["train"]
    assert fake.resets == 1


def test_reset_failure_ends_run(fake):
    # The launcher ended the job: the error leaves run() (the process
    # exits non-zero), after the restore.
    fake.reset_status = L.HVD_ERR_SHUTDOWN
    state = Recorder()

    @hvd.elastic.run
    def train(state):
        state.log.append("train")
        raise hvd.HorovodInternalError(L.HVD_ERR_PEERS_CHANGED, "x")

    with pytest.raises(hvd.HorovodInternalError) as info:
        train(state)
    assert info.value.status == L.HVD_ERR_SHUTDOWN
    assert state.log == ["sync", "train", "restore"]
    assert fake.resets == 1


def test_other_errors_propagate(fake):
    state = Recorder()

    @hvd.elastic.run
    def train(state):
        raise ValueError("bug")

    with pytest.raises(ValueError):
        train(state)
    assert fake.resets == 0


def test_reset_clears_python_state(fake):
    _core._noname_counts[("allgather", 0)] = 5
    stale = hvd.ProcessSet([0])
    stale.process_set_id = 99
    PS._added.add(stale)
    E.reset()
    assert _core._noname_counts == {}
    assert stale.process_set_id is None
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(hvd.size()))
    assert hvd.global_process_set.size() == hvd.size()
    assert fake.resets == 1


# ---------------------------------------------------------------------
# check_host_updates and commit


def test_check_host_updates_not_elastic():
    state = Recorder()
    state.check_host_updates()  # returns: no flag, no collective
    state.commit()
    assert state.log == ["save"]


def test_check_host_updates_agreed_by_every_rank(fake):
    state = Recorder()
    state.check_host_updates()  # nobody was told
    # Only rank 0 was told: every rank raises, at the same commit.
    fake.flags["hosts_updated"] = 1 if hvd.rank() == 0 else 0
    with pytest.raises(hvd.HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync is False
    assert state.log == ["save"]
    # The last rank only.
    fake.flags["hosts_updated"] = 1 if hvd.rank() == hvd.size() - 1 else 0
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.check_host_updates()


def test_run_with_commit_interrupt(fake):
    state = hvd.elastic.TorchState(epoch=0, batch=0)
    seen = []

    @hvd.elastic.run
    def train(state):
        seen.append((state.epoch, state.batch))
        while state.batch < 4:
            state.batch += 1
            if state.batch == 2 and fake.gen == 0:
                fake.flags["hosts_updated"] = 1
            state.commit()
        return state.batch

    assert train(state) == 4
    # Interrupted at the commit of batch 2 (kept: no restore), resumed
    # there after the reset.
    assert seen == [(0, 0), (0, 2)]
    assert fake.resets == 1


# ---------------------------------------------------------------------
# ObjectState


def test_object_state():
    state = hvd_np.elastic.ObjectState(hvd.broadcast_object, hvd.rank,
                                       epoch=1, names=["a"])
    assert state.epoch == 1 and state.names == ["a"]
    state.epoch = 2
    state.save()
    state.epoch = 3
    state.names = ["b"]
    state.restore()
    assert state.epoch == 2 and state.names == ["a"]
    # sync: rank 0's values everywhere
    state.epoch = 10 + hvd.rank()
    state.save()
    state.epoch = -1
    state.sync()
    assert state.epoch == 10


# ---------------------------------------------------------------------
# TorchState


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 4, generator=g)
    y = torch.randn(16, 1, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()


def _snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            _clone(opt.state_dict()))


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and \
            all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_torch_state_commit_restore_exact():
    torch.manual_seed(1)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    _step(model, opt, 0)
    state = hvd.elastic.TorchState(model, opt, epoch=3, batch=5,
                                   history=[1.0])
    assert state.model is model and state.optimizer is opt
    _step(model, opt, 1)
    state.batch = 6
    state.history = [1.0, 2.0]
    state.save()
    committed = _snapshot(model, opt)
    # The commit is a copy on the CPU, not the live tensors.
    saved = state._handlers["model"]._saved
    for k, v in model.state_dict().items():
        assert saved[k].device.type == "cpu"
        assert saved[k].data_ptr() != v.data_ptr()

    for s in range(2, 5):
        _step(model, opt, s)
    state.epoch, state.batch, state.history = 4, 0, []
    assert not _equal(_snapshot(model, opt)[0], committed[0])
    state.restore()
    now = _snapshot(model, opt)
    assert _equal(now[0], committed[0])
    assert _equal(now[1], committed[1])
    assert (state.epoch, state.batch, state.history) == (3, 6, [1.0, 2.0])
    # Training goes on from the restored state exactly as from the commit.
    _step(model, opt, 9)
    after = _snapshot(model, opt)
    state.restore()
    _step(model, opt, 9)
    assert _equal(_snapshot(model, opt), after)


def test_torch_state_new_model_is_saved():
    model = torch.nn.Linear(2, 2)
    state = hvd.elastic.TorchState(model=model)
    other = torch.nn.Linear(2, 2)
    with torch.no_grad():
        other.weight.fill_(7.0)
    state.model = other
    with torch.no_grad():
        other.weight.fill_(0.0)
    state.restore()
    assert state.model is other
    assert torch.all(other.weight == 7.0)


def test_torch_state_distributed_optimizer_restore():
    torch.manual_seed(2)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt)
    _step_lin = lambda s: _step_linear(model, opt, s)  # noqa: E731
    _step_lin(0)
    state.commit()
    committed = _snapshot(model, opt)
    _step_lin(1)
    state.restore()
    assert _equal(_snapshot(model, opt), committed)


def _step_linear(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 3, generator=g)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


def test_torch_state_sync_is_rank0s():
    # Every rank starts elsewhere; sync makes all of it rank 0's, exactly.
    torch.manual_seed(100 + hvd.rank())
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (1 + hvd.rank()))
    _step(model, opt, hvd.rank())
    sampler = hvd.elastic.ElasticSampler(list(range(50)), seed=4)
    sampler.set_epoch(hvd.rank())
    sampler.record_batch(0, 3 + hvd.rank())
    state = hvd.elastic.TorchState(model, opt, sampler=sampler,
                                   epoch=hvd.rank(), tag="r%d" % hvd.rank())
    state.sync()
    mine = (_snapshot(model, opt), sampler.state_dict(), state.epoch,
            state.tag)
    theirs = hvd.allgather_object(mine)
    for other in theirs:
        assert _equal(other[0], theirs[0][0])
        assert other[1:] == theirs[0][1:]
    assert state.epoch == 0 and state.tag == "r0"
    assert sampler.epoch == 0 and sampler.processed_num == 3 * hvd.size()
    # The sync is the state a restore comes back to.
    _step(model, opt, 50)
    state.restore()
    assert _equal(_snapshot(model, opt), theirs[0][0])


def test_torch_state_reset_callbacks_after_handlers(fake, monkeypatch):
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    seen = []
    monkeypatch.setattr(sampler_mod, "_shape", lambda: (5, 0))
    state.register_reset_callbacks([lambda: seen.append(sampler.num_replicas)])

    @hvd.elastic.run
    def train(state):
        if not seen:
            raise hvd.HostsUpdatedInterrupt(True)
        return len(state.sampler)

    assert train(state) == 2  # 10 samples over 5 ranks
    assert seen == [5]


# ---------------------------------------------------------------------
# ElasticSampler


def _samplers(dataset, n, monkeypatch, **kw):
    """n samplers, as ranks 0..n-1 of n would build them."""
    out = []
    for r in range(n):
        monkeypatch.setattr(sampler_mod, "_shape", lambda r=r: (n, r))
        out.append(hvd.elastic.ElasticSampler(dataset, **kw))
    return out


def _reshape(samplers_state, n, monkeypatch, dataset, **kw):
    out = []
    for r in range(n):
        monkeypatch.setattr(sampler_mod, "_shape", lambda r=r: (n, r))
        s = hvd.elastic.ElasticSampler(dataset, **kw)
        s.load_state_dict(samplers_state)
        out.append(s)
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("length,batch,done,old_n,new_n",
                         [(23, 2, 2, 3, 2), (40, 4, 1, 2, 3),
                          (17, 1, 5, 3, 1), (9, 2, 1, 2, 4)])
def test_sampler_repartitions_remaining(monkeypatch, shuffle, length, batch,
                                        done, old_n, new_n):
    dataset = list(range(length))
    ranks = _samplers(dataset, old_n, monkeypatch, shuffle=shuffle, seed=3)
    parts = [list(s) for s in ranks]
    # A partition: every index, each rank's share alike in length; only
    # the padding repeats indices.
    assert set().union(*map(set, parts)) == set(dataset)
    assert all(len(p) == len(ranks[0]) for p in parts)
    assert sum(map(len, parts)) - length < old_n
    # Each rank processes `done` batches (in the same steps).
    processed = set()
    for s, part in zip(ranks, parts):
        for b in range(done):
            assert s.get_indices(b, batch) == part[b * batch:(b + 1) * batch]
            processed.update(s.get_indices(b, batch))
            s.record_batch(b, batch)
    assert len(processed) == min(length, done * batch * old_n)
    state = ranks[0].state_dict()
    assert all(s.state_dict() == state for s in ranks)
    # Re-formed at new_n ranks: the rest, without loss or repeat.
    new = _reshape(state, new_n, monkeypatch, dataset, shuffle=shuffle,
                   seed=3)
    rest = [list(s) for s in new]
    remaining = set().union(*map(set, rest))
    assert remaining == set(dataset) - processed
    assert remaining.isdisjoint(processed)
    assert sum(map(len, rest)) - len(remaining) < new_n
    assert all(len(p) == len(new[0]) for p in rest)


def test_sampler_record_indices_union(monkeypatch):
    dataset = list(range(20))
    ranks = _samplers(dataset, 2, monkeypatch, seed=1)
    processed = set()
    for s in ranks:
        list(s)
        got = s.get_indices(0, 3) + s.get_indices(1, 3)
        s.record_indices(got)
        processed.update(got)
    union = set().union(*(s.processed_indices for s in ranks))
    state = dict(ranks[0].state_dict(), processed_indices=union)
    new = _reshape(state, 3, monkeypatch, dataset, seed=1)
    rest = set().union(*(set(s) for s in new))
    assert rest == set(dataset) - processed


def test_sampler_epochs(monkeypatch):
    monkeypatch.setattr(sampler_mod, "_shape", lambda: (1, 0))
    s = hvd.elastic.ElasticSampler(list(range(30)), shuffle=True, seed=5)
    first = list(s)
    assert sorted(first) == list(range(30))
    assert first == list(hvd.elastic.ElasticSampler(range(30), seed=5))
    s.record_batch(0, 10)
    assert len(s) == 30  # the partition changes at reset() only
    s.reset()
    assert len(s) == 20 and list(s) == first[10:]
    s.set_epoch(1)
    second = list(s)
    assert len(s) == 30 and sorted(second) == list(range(30))
    assert second != first
    unshuffled = hvd.elastic.ElasticSampler(list(range(5)), shuffle=False)
    assert list(unshuffled) == [0, 1, 2, 3, 4]


def test_sampler_in_state_commit_restore(monkeypatch):
    monkeypatch.setattr(sampler_mod, "_shape", lambda: (2, 1))
    sampler = hvd.elastic.ElasticSampler(list(range(12)), shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler)
    assert list(sampler) == [1, 3, 5, 7, 9, 11]
    sampler.record_batch(0, 2)
    state.save()
    sampler.record_batch(1, 2)
    assert list(sampler) == [1, 3, 5, 7, 9, 11]  # until reset
    state.restore()
    assert sampler.processed_num == 4
    assert list(sampler) == [5, 7, 9, 11]
    monkeypatch.setattr(sampler_mod, "_shape", lambda: (3, 2))
    state.on_reset()
    assert list(sampler) == [6, 9, 4]  # 8 left over 3: one repeats


def test_sampler_with_data_loader(monkeypatch):
    data = torch.arange(24, dtype=torch.float32)
    dataset = torch.utils.data.TensorDataset(data)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4,
                                         sampler=sampler)
    for i, (x,) in enumerate(loader):
        assert x.long().tolist() == sampler.get_indices(i, 4)
        sampler.record_batch(i, 4)
    assert sampler.processed_num >= 24
