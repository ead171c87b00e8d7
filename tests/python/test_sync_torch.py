"""hvd.torch's synchronous calls run libhvd's blocking forms on the
calling thread (no handle, no hand-off to the engine thread): exact
results for every dtype, from two threads at once, mixed on one name with
the _async form and with the general path on another rank, mismatches
raised on every rank with hvd's sentence, join, and the timeline's names.
Run under hvdrun (tests/python/CMakeLists.txt, python.sync.*)."""

import json
import threading

import pytest
import torch

import hvd.torch as hvd
from hvd import _core

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.bool]


def same(a, b):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.equal(a, b), (a, b)


def value(r, shape, dtype):
    """Rank r's input: small integers (exact in every dtype, their sum
    too), 0/1 for bool."""
    base = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64)
    base = (base + r) % 3 + (0 if dtype == torch.bool else 1)
    return base.reshape(shape).to(dtype)


def total(n, shape, dtype):
    if dtype == torch.bool:  # Sum of bools is logical or
        out = value(0, shape, dtype)
        for q in range(1, n):
            out = out | value(q, shape, dtype)
        return out
    out = torch.zeros(shape, dtype=torch.int64)
    for q in range(n):
        out += value(q, shape, dtype).to(torch.int64)
    return out.to(dtype)


def no_handles():
    """A synchronous call leaves no operation registered."""
    assert not _core._requests, _core._requests


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_every_call(dtype):
    r, n = hvd.rank(), hvd.size()
    tag = str(dtype).split(".")[-1]
    for shape in [(5,), (2, 3)]:
        key = "%s.%d" % (tag, len(shape))
        x = value(r, shape, dtype)
        expect = total(n, shape, dtype)
        # In place (the fast path for a 1-D tensor) and out of place.
        y = x.clone()
        assert hvd.allreduce_(y, op=hvd.Sum, name="ar_." + key) is y
        same(y, expect)
        same(hvd.allreduce(x, op=hvd.Sum, name="ar." + key), expect)
        same(x, value(r, shape, dtype))
        # Unnamed: the k-th of every rank.
        y = x.clone()
        hvd.allreduce_(y, op=hvd.Sum)
        same(y, expect)
        outs = hvd.grouped_allreduce([x, x.clone()], op=hvd.Sum,
                                     name="gar." + key)
        same(outs[0], expect)
        same(outs[1], expect)
        # Broadcast from the last rank.
        b = x.clone()
        same(hvd.broadcast_(b, n - 1, name="bc." + key),
             value(n - 1, shape, dtype))
        same(hvd.broadcast(x, 0, name="bc2." + key), value(0, shape, dtype))
        # Allgather of uneven first dimensions: rank q gives q + 1 rows.
        rows = (r + 1,) + shape[1:]
        g = hvd.allgather(value(r, rows, dtype), name="ag." + key)
        same(g, torch.cat([value(q, (q + 1,) + shape[1:], dtype)
                           for q in range(n)]))
        if dtype != torch.bool:
            # Reducescatter of n rows per rank: this rank's row of the sum.
            big = (2 * n,) + shape[1:]
            rs = hvd.reducescatter(value(r, big, dtype), op=hvd.Sum,
                                   name="rs." + key)
            same(rs, total(n, big, dtype)[2 * r:2 * r + 2])
        # Alltoall: two rows to every rank.
        a = value(r, (2 * n,) + shape[1:], dtype)
        got = hvd.alltoall(a, name="a2a." + key)
        same(got, torch.cat([value(q, (2 * n,) + shape[1:], dtype)
                             [2 * r:2 * r + 2] for q in range(n)]))
    no_handles()


def test_average_and_factors():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((4,), float(r + 1), dtype=torch.float64)
    expect = sum(range(1, n + 1)) / n
    y = x.clone()
    hvd.allreduce_(y, name="avg")
    same(y, torch.full((4,), expect, dtype=torch.float64))
    y = x.clone()
    hvd.allreduce_(y, name="avg.f", op=hvd.Sum, prescale_factor=2.0,
                   postscale_factor=0.5)
    same(y, torch.full((4,), float(sum(range(1, n + 1))),
                       dtype=torch.float64))
    same(hvd.allreduce(x.half(), name="avg.c", op=hvd.Sum,
                       compression=hvd.Compression.fp16),
         torch.full((4,), float(sum(range(1, n + 1))), dtype=torch.float16))
    for op, want in [(hvd.Min, 1.0), (hvd.Max, float(n)),
                     (hvd.Product, float(torch.arange(1, n + 1).prod()))]:
        y = x.clone()
        hvd.allreduce_(y, op=op, name="op.%d" % op)
        same(y, torch.full((4,), want, dtype=torch.float64))
    no_handles()


def test_gradients_still_flow():
    n = hvd.size()
    w = torch.ones(3, requires_grad=True)
    out = hvd.allreduce(w * 2, op=hvd.Sum, name="grad")
    out.sum().backward()
    same(w.grad, torch.full((3,), 2.0 * n))


def test_process_set():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks (a set other than the job's)")
    members = list(range(1, n))  # every rank but 0
    ps = hvd.add_process_set(members)
    try:
        if r in members:
            y = torch.ones(2, 2)
            hvd.allreduce_(y, op=hvd.Sum, name="ps", process_set=ps)
            same(y, torch.full((2, 2), float(n - 1)))
            z = torch.ones(3)
            hvd.allreduce_(z, op=hvd.Sum, name="ps.1", process_set=ps)
            same(z, torch.full((3,), float(n - 1)))
            same(hvd.broadcast(torch.full((3,), float(r)), n - 1,
                               name="ps.bc", process_set=ps),
                 torch.full((3,), float(n - 1)))
    finally:
        hvd.remove_process_set(ps)


def test_mixed_ways_on_one_name():
    """Each rank picks its own way for the same name: the fast path, the
    general path (a non-contiguous tensor), or _async + synchronize."""
    r, n = hvd.rank(), hvd.size()
    for i in range(3 * n):
        way = (r + i) % 3
        if way == 0:
            y = torch.ones(4)
            hvd.allreduce_(y, op=hvd.Sum, name="mixed")
        elif way == 1:
            y = torch.ones(4, 2)[:, 0]  # not contiguous
            hvd.allreduce_(y, op=hvd.Sum, name="mixed")
        else:
            y = torch.ones(4)
            hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum,
                                                 name="mixed"))
        same(y.contiguous(), torch.full((4,), float(n)))
        # And a tensor of two dimensions (compared by its shape).
        if way == 0:
            z = hvd.allreduce(torch.ones(2, 3), op=hvd.Sum, name="mixed2")
        elif way == 1:
            z = hvd.allreduce(torch.ones(3, 2).t(), op=hvd.Sum,
                              name="mixed2")  # not contiguous
        else:
            z = hvd.synchronize(hvd.allreduce_async(torch.ones(2, 3),
                                                    op=hvd.Sum,
                                                    name="mixed2"))
        same(z.contiguous(), torch.full((2, 3), float(n)))


def test_two_threads():
    """Two threads of every rank make synchronous calls at once (their
    own names): the GIL is released while one waits, and both get exact
    results."""
    r, n = hvd.rank(), hvd.size()
    errors = []
    start = threading.Barrier(2, timeout=60)

    def worker(t):
        try:
            start.wait()
            for i in range(200):
                y = torch.full((3,), float(r + t + i))
                hvd.allreduce_(y, op=hvd.Sum, name="th%d" % t)
                want = float(sum(q + t + i for q in range(n)))
                same(y, torch.full((3,), want))
                if i % 20 == 0:
                    g = hvd.allgather(torch.full((1, 2), float(r)),
                                      name="thg%d.%d" % (t, i))
                    same(g, torch.arange(n, dtype=torch.float32)
                         .repeat_interleave(2).reshape(n, 2))
                    b = hvd.broadcast(torch.full((2, 2), float(r + i)), 0,
                                      name="thb%d" % t)
                    same(b, torch.full((2, 2), float(i)))
        except Exception as e:  # raised below, on the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
        assert not th.is_alive(), "a thread hung"
    assert not errors, errors
    no_handles()


def test_mismatch_raises_on_every_rank():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    for _ in range(2):  # the second time the name is cached
        y = torch.ones(2)
        hvd.allreduce_(y, op=hvd.Sum, name="mm")
    with pytest.raises(hvd.MismatchError) as info:
        hvd.allreduce_(torch.ones(r + 2), op=hvd.Sum, name="mm")
    text = str(info.value)
    # The blocking call's sentence: the call, the name, each rank's values.
    assert text.startswith("hvd_allreduce('allreduce.mm') on rank %d" % r)
    assert "disagree" in text and "count 2" in text and "count 3" in text
    with pytest.raises(hvd.MismatchError, match="int32"):
        hvd.allreduce_(torch.ones(2, dtype=torch.float32 if r else
                                  torch.int32), op=hvd.Sum, name="mm.dt")
    with pytest.raises(hvd.MismatchError, match=r"shape \[3, 2\]"):
        hvd.allreduce(torch.ones((2, 3) if r == 0 else (3, 2)),
                      name="mm.shape")
    with pytest.raises(hvd.MismatchError, match=r"shape \[%d, 2\]" % n):
        hvd.reducescatter(torch.ones((n, 2) if r == 0 else (2 * n, 1)),
                          name="mm.rs")
    # The job goes on.
    y = torch.ones(2)
    hvd.allreduce_(y, op=hvd.Sum, name="mm")
    same(y, torch.full((2,), float(n)))
    no_handles()


def test_join():
    r, n = hvd.rank(), hvd.size()
    if r == n - 1:
        last = hvd.join()
    else:
        y = torch.full((3,), 2.0)
        hvd.allreduce_(y, op=hvd.Sum, name="sync.joined")
        same(y, torch.full((3,), 2.0 * (n - 1)))
        last = hvd.join()
    assert 0 <= last < n
    hvd.barrier()


def test_timeline_names(tmp_path_factory):
    r = hvd.rank()
    path = _core.broadcast_object(
        str(tmp_path_factory.mktemp("tl") / "timeline.json"), root_rank=0)
    hvd.start_timeline(path)
    for i in range(3):
        hvd.allreduce_(torch.ones(8), op=hvd.Sum, name="tl.sync.%d" % i)
    hvd.broadcast_(torch.ones(2, 2), 0, name="tl.sync.bc")
    hvd.stop_timeline()
    hvd.barrier()
    if r != 0:
        return
    with open(path) as f:
        events = json.load(f)
    rows = {e["args"]["name"] for e in events if e.get("ph") == "M"}
    assert {"allreduce.tl.sync.0", "allreduce.tl.sync.2",
            "broadcast.tl.sync.bc"} <= rows, rows


def test_c_blocking_shaped_forms():
    """The C API's blocking shaped calls of the job (the Python calls use
    the hvd_ps_ forms): results, and a shape mismatch on every rank."""
    import ctypes
    from hvd import _lib as L
    r, n = hvd.rank(), hvd.size()
    lib = L.lib()
    vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    c_int, name_t = ctypes.c_int, ctypes.c_char_p
    lib.hvd_allreduce_shaped.argtypes = [name_t, vp, vp, c_int, i64p, c_int,
                                         c_int]
    lib.hvd_broadcast_shaped.argtypes = [name_t, vp, c_int, i64p, c_int,
                                         c_int]
    lib.hvd_reducescatter_shaped.argtypes = [name_t, vp, vp, c_int, i64p,
                                             c_int, c_int]
    dims = _core._dims((n, 3))
    x = torch.full((n, 3), float(r + 1), dtype=torch.float64)
    assert lib.hvd_allreduce_shaped(b"c.ar", x.data_ptr(), x.data_ptr(), 2,
                                    dims, 7, hvd.Sum) == 0
    same(x, torch.full((n, 3), float(sum(range(1, n + 1))),
                       dtype=torch.float64))
    b = torch.full((n, 3), float(r), dtype=torch.float64)
    assert lib.hvd_broadcast_shaped(b"c.bc", b.data_ptr(), 2, dims, 7,
                                    n - 1) == 0
    same(b, torch.full((n, 3), float(n - 1), dtype=torch.float64))
    src = torch.ones((n, 3), dtype=torch.float64)
    mine = torch.zeros((1, 3), dtype=torch.float64)
    assert lib.hvd_reducescatter_shaped(b"c.rs", src.data_ptr(),
                                        mine.data_ptr(), 2, dims, 7,
                                        hvd.Sum) == 0
    same(mine, torch.full((1, 3), float(n), dtype=torch.float64))
    if n > 1:
        bad = _core._dims((1, 3 * n) if r == 0 else (n, 3))
        st = lib.hvd_allreduce_shaped(b"c.mm", x.data_ptr(), x.data_ptr(), 2,
                                      bad, 7, hvd.Sum)
        assert L.STATUS_NAMES[st] == "HVD_ERR_MISMATCH"
        assert "hvd_allreduce('c.mm')" in L.last_error()


def test_synchronize_at_once():
    """_async then synchronize at once: the waiter runs the engine for a
    request the engine thread has not taken in yet (or leaves it to the
    engine thread, HVD_CALLER_PROGRESS=0): exact results for every
    collective, every time."""
    r, n = hvd.rank(), hvd.size()
    for i in range(100):
        y = torch.full((5,), float(r + i))
        hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, name="now"))
        same(y, torch.full((5,), float(sum(q + i for q in range(n)))))
    for i in range(5):
        key = "now.%d" % i
        g = hvd.synchronize(hvd.allgather_async(
            torch.full((r + 1, 2), float(r)), name="ag." + key))
        same(g, torch.cat([torch.full((q + 1, 2), float(q))
                           for q in range(n)]))
        b = hvd.synchronize(hvd.broadcast_async(
            torch.full((3,), float(r + i)), n - 1, name="bc." + key))
        same(b, torch.full((3,), float(n - 1 + i)))
        rs = hvd.synchronize(hvd.reducescatter_async(
            torch.ones(2 * n, 3), op=hvd.Sum, name="rs." + key))
        same(rs, torch.full((2, 3), float(n)))
        a, _ = hvd.synchronize(hvd.alltoall_async(
            torch.full((n,), float(r)), name="a2a." + key))
        same(a, torch.arange(n, dtype=torch.float32))
        outs = hvd.synchronize(hvd.grouped_allreduce_async(
            [torch.ones(2), torch.ones(3, dtype=torch.int64)], op=hvd.Sum,
            name="gar." + key))
        same(outs[0], torch.full((2,), float(n)))
        same(outs[1], torch.full((3,), n, dtype=torch.int64))
    no_handles()


def test_synchronize_a_burst_out_of_order():
    """Several _async calls in flight, synchronized last first: whoever
    runs the engine finishes them all."""
    r, n = hvd.rank(), hvd.size()
    for rnd in range(10):
        ys = [torch.full((k + 1,), float(r + k)) for k in range(8)]
        hs = [hvd.allreduce_async_(y, op=hvd.Sum, name="burst.%d" % k)
              for k, y in enumerate(ys)]
        for k in reversed(range(8)):
            hvd.synchronize(hs[k])
            same(ys[k], torch.full((k + 1,), float(sum(
                q + k for q in range(n)))))
    no_handles()


def test_synchronize_two_threads():
    """Two threads of every rank each submit and synchronize at once
    (their own names): one runs the engine, the other waits or takes it
    next; both exact."""
    r, n = hvd.rank(), hvd.size()
    errors = []
    start = threading.Barrier(2, timeout=60)

    def worker(t):
        try:
            start.wait()
            for i in range(200):
                y = torch.full((3,), float(r + t + i))
                hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum,
                                                     name="tha%d" % t))
                want = float(sum(q + t + i for q in range(n)))
                same(y, torch.full((3,), want))
        except Exception as e:  # raised below, on the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
        assert not th.is_alive(), "a thread hung"
    assert not errors, errors
    no_handles()


NP_DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64",
             "float16", "float32", "float64", "bool"]


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_numpy_calls(dt):
    """hvd's numpy calls (blocking forms): exact results for every dtype,
    no handle left."""
    import numpy as np
    import hvd as hnp
    r, n = hvd.rank(), hvd.size()

    def val(q, shape):
        base = (np.arange(int(np.prod(shape))) + q) % 3
        if dt != "bool":
            base = base + 1
        return base.reshape(shape).astype(dt)

    def tot(shape):
        if dt == "bool":
            return np.logical_or.reduce([val(q, shape) for q in range(n)])
        return sum(val(q, shape).astype(np.int64)
                   for q in range(n)).astype(dt)

    def eq(a, b):
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert np.array_equal(a, b), (a, b)

    for shape in [(5,), (2, 3), (0,)]:
        key = "np.%s.%d.%d" % (dt, len(shape), shape[0])
        x = val(r, shape)
        eq(hnp.allreduce(x, op=hnp.Sum, name="ar." + key), tot(shape))
        y = x.copy()
        assert hnp.allreduce_(y, op=hnp.Sum, name="ar_." + key) is y
        eq(y, tot(shape))
        for out in hnp.grouped_allreduce([x, x.copy()], op=hnp.Sum,
                                         name="gar." + key):
            eq(out, tot(shape))
        y = x.copy()
        hnp.grouped_allreduce_([y], op=hnp.Sum, name="gar_." + key)
        eq(y, tot(shape))
        eq(hnp.broadcast(x, n - 1, name="bc." + key), val(n - 1, shape))
        y = x.copy()
        hnp.broadcast_(y, 0, name="bc_." + key)
        eq(y, val(0, shape))
        rows = (r + 1,) + shape[1:]
        eq(hnp.allgather(val(r, rows), name="ag." + key),
           np.concatenate([val(q, (q + 1,) + shape[1:]) for q in range(n)]))
        big = (2 * n,) + shape[1:]
        if dt != "bool":
            eq(hnp.reducescatter(val(r, big), op=hnp.Sum, name="rs." + key),
               tot(big)[2 * r:2 * r + 2])
        eq(hnp.alltoall(val(r, big), name="a2a." + key),
           np.concatenate([val(q, big)[2 * r:2 * r + 2] for q in range(n)]))
    no_handles()


def test_numpy_mismatch_raises_on_every_rank():
    import numpy as np
    import hvd as hnp
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(hnp.MismatchError) as info:
        hnp.allreduce(np.ones(r + 2), op=hnp.Sum, name="np.mm")
    assert str(info.value).startswith(
        "hvd_allreduce('allreduce.np.mm') on rank %d" % r)
    with pytest.raises(hnp.MismatchError, match="int32"):
        hnp.broadcast(np.ones(2, dtype=np.float32 if r else np.int32), 0,
                      name="np.mm.bc")
    eq = hnp.allreduce(np.ones(2), op=hnp.Sum, name="np.mm")
    assert np.array_equal(eq, np.full(2, float(n)))
    no_handles()
