"""The collectives of the hvd package on numpy arrays, at any number of
ranks: every op and dtype, in place and out of place, exact results."""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import hvd

NATIVE = [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32,
          np.float64]
CARRIED = [np.int16, np.uint16, np.uint32]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
COUNT = 19


def values(r, dtype, op, count=COUNT):
    """Rank r's input: small integers, so that every result is exact."""
    i = np.arange(count)
    if op == hvd.Product:
        v = 1 + (i + r) % 2
    elif np.issubdtype(dtype, np.signedinteger) or \
            np.issubdtype(dtype, np.floating):
        v = ((i % 7) - 3) * (r + 1)
    else:
        v = (i % 7) + r
    return v.astype(dtype)


def expected(dtype, op, n, count=COUNT):
    xs = np.stack([values(r, dtype, op, count).astype(np.float64)
                   for r in range(n)])
    if op == hvd.Sum:
        e = xs.sum(0)
    elif op == hvd.Average:
        e = xs.sum(0) / n
        if not np.issubdtype(dtype, np.floating):
            e = np.trunc(e)  # integer average truncates, as C divides
    elif op == hvd.Min:
        e = xs.min(0)
    elif op == hvd.Max:
        e = xs.max(0)
    else:
        e = xs.prod(0)
    return e.astype(dtype)


def test_shape():
    r, n = hvd.rank(), hvd.size()
    assert hvd.is_initialized()
    assert 0 <= r < n
    assert 0 <= hvd.local_rank() < hvd.local_size()
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    assert hvd.local_size() * hvd.cross_size() == n  # one host here
    ranks = hvd.allgather(np.array([r], dtype=np.int32), name="ranks")
    assert ranks.tolist() == list(range(n))


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("op", OPS, ids=lambda o: ["sum", "avg", "min", "max",
                                                  "prod"][o])
@pytest.mark.parametrize("dtype", NATIVE + CARRIED,
                         ids=lambda d: np.dtype(d).name)
def test_allreduce(dtype, op, inplace):
    r, n = hvd.rank(), hvd.size()
    x = values(r, dtype, op)
    keep = x.copy()
    name = "ar.%s.%d.%d" % (np.dtype(dtype).name, op, inplace)
    if inplace:
        out = hvd.allreduce_(x, op=op, name=name)
        assert out is x
    else:
        out = hvd.allreduce(x, op=op, name=name)
        assert out is not x
        np.testing.assert_array_equal(x, keep)  # input untouched
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    np.testing.assert_array_equal(out, expected(dtype, op, n))


@pytest.mark.parametrize("op", OPS, ids=lambda o: ["sum", "avg", "min", "max",
                                                  "prod"][o])
def test_allreduce_unnamed(op):
    r, n = hvd.rank(), hvd.size()
    out = hvd.allreduce(values(r, np.float32, op), op=op)
    np.testing.assert_array_equal(out, expected(np.float32, op, n))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product])
def test_allreduce_bool(op):
    r, n = hvd.rank(), hvd.size()
    x = np.array([True, False, r == 0, r == n - 1, True, False])
    out = hvd.allreduce(x, op=op, name="bool.%d" % op)
    rows = [np.array([True, False, q == 0, q == n - 1, True, False])
            for q in range(n)]
    if op in (hvd.Sum, hvd.Max):
        want = np.logical_or.reduce(rows)
    else:
        want = np.logical_and.reduce(rows)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, want)
    with pytest.raises(TypeError):
        hvd.allreduce(x, op=hvd.Average)


def test_allreduce_default_is_average_and_average_arg():
    r, n = hvd.rank(), hvd.size()
    x = np.full(4, 2.0 * (r + 1))
    np.testing.assert_array_equal(hvd.allreduce(x, name="dflt"),
                                  np.full(4, float(n + 1)))
    with pytest.warns(DeprecationWarning):
        s = hvd.allreduce(x, average=False, name="avgarg")
    np.testing.assert_array_equal(s, np.full(4, float(n * (n + 1))))
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_allreduce_noncontiguous_inplace():
    r, n = hvd.rank(), hvd.size()
    a = np.zeros((6, 4), dtype=np.float32)
    a[:, ::2] = r + 1
    view = a[:, ::2]
    assert not view.flags.c_contiguous
    hvd.allreduce_(view, op=hvd.Sum, name="strided")
    assert (a[:, ::2] == n * (n + 1) / 2).all()
    assert (a[:, 1::2] == 0).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_scale_factors(dtype):
    r, n = hvd.rank(), hvd.size()
    x = np.full(5, 2 * (r + 1), dtype=dtype)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                        postscale_factor=4.0, name="scale")
    np.testing.assert_array_equal(out, np.full(5, 2 * n * (n + 1), dtype))
    np.testing.assert_array_equal(x, np.full(5, 2 * (r + 1), dtype))
    out = hvd.allreduce_(x, op=hvd.Average, postscale_factor=0.5,
                         name="scale2")
    assert out is x
    np.testing.assert_array_equal(x, np.full(5, (n + 1) / 2, dtype))


def test_scale_factor_integer_truncates():
    x = np.full(3, 3, dtype=np.int32)
    out = hvd.allreduce(x, op=hvd.Max, postscale_factor=0.5, name="iscale")
    np.testing.assert_array_equal(out, np.full(3, 1, np.int32))


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
def test_grouped_allreduce(inplace):
    r, n = hvd.rank(), hvd.size()
    xs = [values(r, np.float32, hvd.Sum, 5), values(r, np.int64, hvd.Sum, 7),
          values(r, np.float32, hvd.Sum, 0), values(r, np.int16, hvd.Sum, 3),
          values(r, np.float32, hvd.Sum, 300)]
    fn = hvd.grouped_allreduce_ if inplace else hvd.grouped_allreduce
    outs = fn(xs, op=hvd.Sum, name="grouped.%d" % inplace)
    assert len(outs) == len(xs)
    for x, out, count in zip(xs, outs, [5, 7, 0, 3, 300]):
        assert (out is x) == inplace
        np.testing.assert_array_equal(
            out, expected(x.dtype.type, hvd.Sum, n, count))
    outs = hvd.grouped_allreduce([np.full(3, r + 1.0), np.full(2, r + 1.0)],
                                 op=hvd.Average)
    for out in outs:
        np.testing.assert_array_equal(out, np.full(out.shape, (n + 1) / 2))


@pytest.mark.parametrize("dtype", NATIVE + CARRIED + [np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_allgather(dtype):
    r, n = hvd.rank(), hvd.size()
    x = (np.arange(6).reshape(3, 2) + 10 * r).astype(dtype)
    out = hvd.allgather(x, name="ag." + np.dtype(dtype).name)
    want = np.concatenate([(np.arange(6).reshape(3, 2) + 10 * q).astype(dtype)
                           for q in range(n)])
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, want)


def test_allgather_variable_first_dimension():
    r, n = hvd.rank(), hvd.size()
    x = np.full((r + 1, 2, 3), r, dtype=np.int32)
    out = hvd.allgather(x)
    want = np.concatenate([np.full((q + 1, 2, 3), q, np.int32)
                           for q in range(n)])
    np.testing.assert_array_equal(out, want)
    # A rank with no rows at all.
    y = np.arange(r * 2, dtype=np.float64)
    out = hvd.allgather(y, name="empty_rows")
    np.testing.assert_array_equal(
        out, np.concatenate([np.arange(q * 2.0) for q in range(n)]))
    # A scalar counts as one row.
    np.testing.assert_array_equal(hvd.allgather(np.float32(r)),
                                  np.arange(n, dtype=np.float32))


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("dtype", NATIVE + CARRIED + [np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_broadcast(dtype, inplace):
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        x = ((np.arange(10) + r) % 2 == 0 if dtype == np.bool_
             else np.arange(10) * (r + 1)).astype(dtype)
        keep = x.copy()
        name = "bc.%s.%d.%d" % (np.dtype(dtype).name, inplace, root)
        if inplace:
            out = hvd.broadcast_(x, root, name=name)
            assert out is x
        else:
            out = hvd.broadcast(x, root, name=name)
            np.testing.assert_array_equal(x, keep)
        want = ((np.arange(10) + root) % 2 == 0 if dtype == np.bool_
                else np.arange(10) * (root + 1)).astype(dtype)
        np.testing.assert_array_equal(out, want)


def test_async_and_poll():
    r, n = hvd.rank(), hvd.size()
    arrays = [np.full(1000 * (i + 1), float(r + i)) for i in range(5)]
    handles = [hvd.allreduce_async_(a, op=hvd.Sum, name="async.%d" % i)
               for i, a in enumerate(arrays)]
    hb = hvd.broadcast_async(np.arange(4) + r, 0, name="async.b")
    hg = hvd.allgather_async(np.full((r + 1,), r), name="async.g")
    for _ in range(100000):  # bounded: every one finishes quickly
        if all(hvd.poll(h) for h in handles):
            break
    for i in reversed(range(5)):
        out = hvd.synchronize(handles[i])
        assert out is arrays[i]
        np.testing.assert_array_equal(
            out, np.full(1000 * (i + 1), float(sum(q + i for q in range(n)))))
    np.testing.assert_array_equal(hvd.synchronize(hb), np.arange(4))
    np.testing.assert_array_equal(
        hvd.synchronize(hg),
        np.concatenate([np.full((q + 1,), q) for q in range(n)]))
    with pytest.raises(ValueError):
        hvd.synchronize(handles[0])  # synchronized already


def test_allgather_async_proceeds_by_itself():
    """An allgather_async completes without its rank synchronizing it: here
    rank 0 waits for it before the allreduce that the other ranks do
    before they synchronize it (as Horovod allows)."""
    r, n = hvd.rank(), hvd.size()
    h = hvd.allgather_async(np.full((r + 1, 2), r), name="eager")
    if r == 0:
        gathered = hvd.synchronize(h)
        total = hvd.allreduce(np.ones(2), op=hvd.Sum, name="eager.after")
    else:
        total = hvd.allreduce(np.ones(2), op=hvd.Sum, name="eager.after")
        gathered = hvd.synchronize(h)
    np.testing.assert_array_equal(total, np.full(2, float(n)))
    np.testing.assert_array_equal(
        gathered, np.concatenate([np.full((q + 1, 2), q) for q in range(n)]))


def test_async_keeps_buffers_alive():
    r, n = hvd.rank(), hvd.size()
    # The input array is dropped before the operation is waited for.
    h = hvd.allreduce_async(np.full(100000, r + 1.0), op=hvd.Sum,
                            name="alive")
    junk = [np.full(100000, -1.0) for _ in range(10)]
    out = hvd.synchronize(h)
    del junk
    np.testing.assert_array_equal(out, np.full(100000, n * (n + 1) / 2))


def test_objects():
    r, n = hvd.rank(), hvd.size()
    obj = {"rank": r, "data": "x" * (100 * r + 1), "list": list(range(r))}
    got = hvd.broadcast_object(obj if r == n - 1 else None, root_rank=n - 1)
    assert got == {"rank": n - 1, "data": "x" * (100 * (n - 1) + 1),
                   "list": list(range(n - 1))}
    everyone = hvd.allgather_object(obj)
    assert everyone == [{"rank": q, "data": "x" * (100 * q + 1),
                         "list": list(range(q))} for q in range(n)]


def test_barrier():
    """What every rank writes before a barrier, every rank reads after it:
    in each round each rank writes the round's number into its own file
    (in a folder rank 0 makes), and after the barrier finds that number in
    every rank's file; a second barrier keeps the next round's writes after
    every rank's reads. A barrier that let a rank through early would show
    it an earlier round's number (or no file)."""
    r, n = hvd.rank(), hvd.size()
    folder = hvd.broadcast_object(
        tempfile.mkdtemp(prefix="hvd-barrier-") if r == 0 else None,
        root_rank=0, name="barrier.folder")
    try:
        for k in range(3):
            mine = os.path.join(folder, "rank%d" % r)
            with open(mine + ".tmp", "w") as f:
                f.write(str(k))
            os.replace(mine + ".tmp", mine)  # whole, as the others read it
            assert hvd.barrier() is None
            seen = []
            for q in range(n):
                with open(os.path.join(folder, "rank%d" % q)) as f:
                    seen.append(int(f.read()))
            assert seen == [k] * n, (k, seen)
            hvd.barrier()
    finally:
        if r == 0:
            shutil.rmtree(folder, ignore_errors=True)


def test_mismatch_raises_runtime_error():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(RuntimeError) as info:
        hvd.allreduce(np.ones(r + 1, dtype=np.float32), op=hvd.Sum,
                      name="mismatch")
    assert isinstance(info.value, hvd.MismatchError)
    assert info.value.status_name == "HVD_ERR_MISMATCH"
    assert "disagree" in str(info.value)
    assert "allreduce.mismatch" in str(info.value)
    # The runtime goes on.
    np.testing.assert_array_equal(
        hvd.allreduce(np.ones(3), op=hvd.Sum, name="after_mismatch"),
        np.full(3, float(n)))
    with pytest.raises(RuntimeError, match="disagree"):
        hvd.allgather(np.ones((2, r + 1)), name="ag_mismatch")


def test_shape_mismatch_of_equal_counts():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(hvd.MismatchError, match=r"shape \[4, 1\]"):
        hvd.allreduce(np.ones((1, 4) if r else (4, 1), dtype=np.float32),
                      name="shape")
    np.testing.assert_array_equal(
        hvd.allreduce(np.ones((4, 1)), op=hvd.Sum, name="shape"),
        np.full((4, 1), float(n)))


def test_duplicate_name_raises_value_error():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks: alone, an operation may finish before "
                    "the duplicate is submitted")
    # No other rank submits "dup.<r>" before the barrier, so this rank's
    # stays in flight until then.
    h = hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="dup.%d" % r)
    with pytest.raises(ValueError) as info:
        hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="dup.%d" % r)
    assert isinstance(info.value, hvd.InvalidArgumentError)
    assert "allreduce.dup.%d" % r in str(info.value)
    hvd.barrier()
    others = [hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="dup.%d" % q)
              for q in range(n) if q != r]
    np.testing.assert_array_equal(hvd.synchronize(h), np.full(4, float(n)))
    for o in others:
        np.testing.assert_array_equal(hvd.synchronize(o),
                                      np.full(4, float(n)))


def test_bad_arguments():
    n = hvd.size()
    with pytest.raises(TypeError, match="complex"):
        hvd.allreduce(np.ones(2, dtype=np.complex64))
    with pytest.raises(TypeError):
        hvd.allreduce_([1.0, 2.0])
    with pytest.raises(ValueError, match="root"):
        hvd.broadcast(np.ones(2), n + 3, name="badroot")
    with pytest.raises(ValueError):
        hvd.allreduce(np.ones(2), op=17)
    # Adasum of integers (or on a rank count not a power of two).
    with pytest.raises(NotImplementedError):
        hvd.allreduce(np.ones(2, dtype=np.int32), op=hvd.Adasum)


def test_read_only_array():
    a = np.ones(3)
    a.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        hvd.allreduce_(a, op=hvd.Sum, name="ro")
    np.testing.assert_array_equal(hvd.allreduce(a, op=hvd.Sum, name="ro2"),
                                  np.full(3, float(hvd.size())))


def test_not_initialized_in_a_fresh_process():
    code = ("import numpy as np, hvd\n"
            "assert not hvd.is_initialized()\n"
            "try:\n"
            "    hvd.allreduce(np.ones(2))\n"
            "except ValueError as e:\n"
            "    assert e.status_name == 'HVD_ERR_NOT_INITIALIZED', e\n"
            "    print('ok', e)\n"
            "try:\n"
            "    hvd.rank()\n"
            "except ValueError as e:\n"
            "    print('ok', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=os.environ,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("ok") == 2, out.stdout


def test_join():
    r, n = hvd.rank(), hvd.size()
    if r == 0:
        last = hvd.join()
    else:
        # Rank 0 has joined: the others' allreduces complete without it.
        out = hvd.allreduce(np.full(3, 2.0), op=hvd.Sum, name="joined")
        np.testing.assert_array_equal(out, np.full(3, 2.0 * (n - 1)))
        last = hvd.join()
    assert 0 <= last < n
    if n > 1:
        assert last != 0


def _job_of_one_env(**extra):
    """The environment of a fresh job of one: this test's, less the
    launcher's variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HVD_", "HOROVOD_", "OMPI_", "PMI_",
                                "PMIX_", "SLURM_"))
           or k == "HVD_LIBRARY"}
    env.update(extra)
    return env


def test_horovod_variables_are_honoured():
    # A bad value in Horovod's name fails init with a sentence naming it.
    code = ("import hvd\n"
            "try:\n"
            "    hvd.init()\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code],
                         env=_job_of_one_env(HOROVOD_CACHE_CAPACITY="many"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout, out.stdout
    assert "HOROVOD_CACHE_CAPACITY=many" in out.stdout, out.stdout
    # A good one is taken, and hvd's own name wins over it.
    code = ("import hvd, numpy as np\n"
            "hvd.init()\n"
            "print(hvd.allreduce(np.ones(2), op=hvd.Sum).tolist())\n"
            "hvd.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code],
                         env=_job_of_one_env(HOROVOD_CACHE_CAPACITY="many",
                                             HVD_CACHE_CAPACITY="16",
                                             HOROVOD_FUSION_THRESHOLD="1048576"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "[1.0, 1.0]" in out.stdout, out.stdout


def test_build_facts():
    # HVD_TEST_BUILT (set by ctest from the configure step) lists the parts
    # this build has; the functions must say the same.
    built = set(os.environ.get("HVD_TEST_BUILT", "").split(","))
    if not os.environ.get("HVD_TEST_BUILT"):
        pytest.skip("HVD_TEST_BUILT is not set (run through ctest)")
    assert hvd.mpi_built() == ("mpi" in built)
    # Horovod's: the NCCL version code (>= 2.14 here), 0 without NCCL.
    if "nccl" in built:
        assert hvd.nccl_built() >= 21400
    else:
        assert hvd.nccl_built() == 0
    assert hvd.cuda_built() == ("cuda" in built)
    assert hvd.gloo_built() is False
    assert hvd.rocm_built() is False
    # One host here: every host runs the same number of ranks.
    assert hvd.is_homogeneous() is True


def test_start_stop_timeline(tmp_path_factory):
    """start_timeline/stop_timeline on a running job: rank 0's file is a
    complete JSON array with the operations started meanwhile, and
    CYCLE_START marks when asked for; nothing after the stop."""
    import json
    r, n = hvd.rank(), hvd.size()
    # Every rank names the same file; only rank 0 writes it.
    path = hvd.broadcast_object(
        str(tmp_path_factory.mktemp("tl") / "timeline.json"), root_rank=0)
    x = np.ones(1000, np.float32)
    hvd.allreduce(x, name="tl.before", op=hvd.Sum)
    hvd.start_timeline(path, mark_cycles=True)
    for i in range(3):
        hvd.allreduce(x, name="tl.during.%d" % i, op=hvd.Sum)
    hvd.stop_timeline()
    hvd.barrier()
    hvd.allreduce(x, name="tl.after", op=hvd.Sum)
    hvd.barrier()
    if r != 0:
        assert not os.path.exists(path) or os.path.getsize(path) >= 0
        return
    with open(path) as f:
        events = json.load(f)
    # Rows are the operations' names as libhvd sees them ("allreduce.<name>").
    rows = {e["args"]["name"].split(".", 1)[-1] for e in events
            if e.get("ph") == "M"}
    assert {"tl.during.0", "tl.during.1", "tl.during.2"} <= rows, rows
    assert "tl.before" not in rows and "tl.after" not in rows, rows
    assert any(e.get("name") == "CYCLE_START" for e in events)
    with pytest.raises(hvd.InvalidArgumentError, match="cannot open"):
        hvd.start_timeline(os.path.join(path, "no", "such", "dir.json"))


def test_tables_match_the_c_library():
    # hvd/_lib.py's status, dtype and op tables are the C header's, in its
    # order, and the sizes libhvd's (one source of truth: hvd/types.h).
    import re
    from hvd import _lib as L
    header = open(os.path.join(os.path.dirname(__file__), os.pardir,
                               os.pardir, "transport", "base", "hvd",
                               "types.h")).read()
    # X(NAME, "text") or X(NAME, \<newline> "part " \<newline> "part").
    entries = re.findall(r"X\((HVD_\w+),((?:[\s\\]*\"[^\"]*\")+)[\s\\]*\)",
                         header)
    statuses = [name for name, _ in entries]
    assert tuple(statuses) == L.STATUS_NAMES
    for code, (name, literals) in enumerate(entries):
        text = "".join(re.findall(r"\"([^\"]*)\"", literals))
        assert L.lib().hvd_strerror(code).decode() == text
    dtypes = re.search(r"typedef enum \{([^}]*)\} hvd_dtype;", header)
    names = re.findall(r"HVD_(\w+)", dtypes.group(1))
    assert tuple(n.lower() for n in names) == L.DTYPE_NAMES
    for code in range(len(names)):
        assert L.lib().hvd_dtype_size(code) == L.DTYPE_SIZES[code]
    assert L.lib().hvd_dtype_size(len(names)) == 0
    ops = re.search(r"typedef enum \{([^}]*)\} hvd_op;", header)
    assert tuple(n.lower() for n in re.findall(r"HVD_(\w+)", ops.group(1))) \
        == L.OP_NAMES


@pytest.mark.parametrize("dtype", NATIVE + CARRIED)
def test_alltoall(dtype):
    """rank r sends (r + d) % 3 rows to rank d, rows of (source,
    destination, index); equal parts without splits."""
    r, n = hvd.rank(), hvd.size()
    splits = [(r + d) % 3 for d in range(n)]
    x = np.array([[r, d, j] for d in range(n) for j in range(splits[d])],
                 dtype=dtype).reshape(-1, 3)
    out, received = hvd.alltoall(x, splits=np.array(splits),
                                 name="a2a.%s" % np.dtype(dtype).name)
    assert received.dtype == np.int32
    assert received.tolist() == [(s + r) % 3 for s in range(n)]
    want = np.array([[s, r, j] for s in range(n) for j in range((s + r) % 3)],
                    dtype=dtype).reshape(-1, 3)
    assert out.dtype == np.dtype(dtype) and out.shape == want.shape
    assert np.array_equal(out, want)
    eq = hvd.alltoall(np.arange(2 * n, dtype=dtype) + r, name="a2a.eq")
    assert np.array_equal(eq, np.array([[2 * r + s, 2 * r + 1 + s]
                                        for s in range(n)],
                                       dtype=dtype).reshape(-1))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", NATIVE + CARRIED)
def test_reducescatter(dtype, op):
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    x = values(r, dtype, op, rows * 2).reshape(rows, 2)
    out = hvd.reducescatter(x, op=op, name="rs.%s.%d" %
                            (np.dtype(dtype).name, op))
    full = expected(dtype, op, n, rows * 2).reshape(rows, 2)
    first = sum(rows // n + (q < rows % n) for q in range(r))
    mine = full[first:first + rows // n + (r < rows % n)]
    assert out.dtype == np.dtype(dtype) and out.shape == mine.shape
    assert np.array_equal(out, mine)


def test_grouped_allgather_and_reducescatter():
    r, n = hvd.rank(), hvd.size()
    outs = hvd.grouped_allgather([np.full((r + 1,), r), np.arange(2) + r],
                                 name="gag")
    assert np.array_equal(outs[0], np.concatenate(
        [np.full((q + 1,), q) for q in range(n)]))
    assert np.array_equal(outs[1], np.concatenate(
        [np.arange(2) + q for q in range(n)]))
    outs = hvd.grouped_reducescatter([np.ones((n, 2)), np.ones(n)],
                                     op=hvd.Sum, name="grs")
    assert np.array_equal(outs[0], np.full((1, 2), float(n)))
    assert np.array_equal(outs[1], np.full((1,), float(n)))


def test_process_sets():
    """hvd (numpy) takes process_set= as hvd.torch does."""
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        return
    even = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    odd = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    mine = even if r % 2 == 0 else odd
    m = mine.size()
    out = hvd.allreduce(np.array([r, 1], dtype=np.int32), op=hvd.Sum,
                        name="ps.np", process_set=mine)
    assert out.tolist() == [sum(mine.ranks), m]
    g = hvd.allgather(np.full((1, 2), r), name="ps.np.ag", process_set=mine)
    assert g[:, 0].tolist() == mine.ranks
    b = hvd.broadcast(np.array([r]), mine.ranks[-1], name="ps.np.bc",
                      process_set=mine)
    assert b.tolist() == [mine.ranks[-1]]
    out, received = hvd.alltoall(np.arange(m) + 10 * r, splits=[1] * m,
                                 name="ps.np.a2a", process_set=mine)
    assert out.tolist() == [10 * q + mine.rank() for q in mine.ranks]
    assert list(received) == [1] * m
    rs = hvd.reducescatter(np.ones((m, 3)), op=hvd.Sum, name="ps.np.rs",
                           process_set=mine)
    assert rs.tolist() == [[m] * 3]
    hvd.barrier(process_set=mine)
    assert hvd.remove_process_set(even) and hvd.remove_process_set(odd)
