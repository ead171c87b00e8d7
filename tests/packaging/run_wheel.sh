#!/bin/sh
# The binary wheel (tools/build-wheel): built, its file list checked (one
# copy of the package, at the root; the bundled libraries; no sources),
# then installed into a new virtual environment by a pip that may not build
# anything (--only-binary=:all: --no-index --no-build-isolation), with a
# PATH that holds no compiler and no cmake and with CC/CXX unset. The
# installed hvdrun then says what it has (--check-build) and runs a 2-rank
# hvd.torch job from outside the source tree.
#
#   run_wheel.sh BUILD_DIR PYTHON [MPIRUN [TF_PYTHON]]
#
# PYTHON is an interpreter with torch and numpy (Debian's python3 with
# python3-torch); the new environment sees its packages
# (--system-site-packages) instead of downloading them again. With MPIRUN
# (the suite's mpirun command line), the same job also runs under mpirun
# over the MPI transport, which libhvd loads at run time; as root, the job
# and --check-build run once more with libmpi and libibverbs hidden.
#
# Exit status: 0, 1 (failed), or 77 (skip) when PYTHON lacks venv, torch
# or numpy, or when the wheel's tools cannot be fetched from a package
# index.
set -eu
build=$1
python=$2
mpirun=${3:-}
tf_python=${4:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$python" -c "import torch, numpy" >/dev/null 2>&1; then
    echo "SKIP: $python cannot import torch and numpy"
    exit 77
fi
if ! "$python" -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    echo "SKIP: $python -m venv failed (Debian: apt-get install python3-venv)"
    cat "$tmp/venv.log"
    exit 77
fi
# The tools the wheel is built with come from the package index once.
tools=$build/wheel-tools
if ! "$tools/bin/python" -c "import scikit_build_core, auditwheel" \
        >/dev/null 2>&1 && ! timeout 300 "$tmp/venv/bin/pip" download -q \
        --no-deps -d "$tmp/probe" auditwheel >"$tmp/probe.log" 2>&1; then
    echo "SKIP: pip cannot fetch the wheel's tools (no package index here)"
    cat "$tmp/probe.log"
    exit 77
fi

# The wheel, built from this tree into the build's own folders
# (BUILD_DIR/wheel-*), so that a second run compiles only what changed.
# With TF_PYTHON (an interpreter that imports TensorFlow: the suite's
# .venv-tf), the wheel has the op library, and a second new environment
# sees that TensorFlow (a .pth file naming its site folders, as in
# run_pip_install.sh; its numpy is not the one Debian's torch wants).
tf_define=-DHVD_TF_PYTHON=$build/wheel-tools/bin/python
with_tf=0
if [ -n "$tf_python" ] && "$tf_python" -I -c "import tensorflow" >/dev/null 2>&1; then
    tf_define=-DHVD_TF_PYTHON=$tf_python
    with_tf=1
    "$python" -m venv "$tmp/venv-tf"
    tf_site=$("$tmp/venv-tf/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$tf_python" -I -c "import sys; print('\n'.join(p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))))" \
        >"$tf_site/hvd-test-tensorflow.pth"
else
    echo "packaging: no TensorFlow (${tf_python:-no TF_PYTHON}): the TensorFlow part is not checked"
fi
start=$(date +%s)
HVD_BUILD_DIR=$build timeout 900 "$src/tools/build-wheel" "$tmp/dist" "$tf_define" \
    >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; echo "FAIL: tools/build-wheel"; exit 1; }
whl=$(tail -1 "$tmp/build.log")
echo "packaging: $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB) built in $(( $(date +%s) - start )) s"
case $(basename "$whl") in
hvd-*-py3-none-manylinux_*_x86_64.whl | hvd-*-py3-none-manylinux_*_aarch64.whl) ;;
*) echo "FAIL: not a py3-none manylinux wheel: $whl"; exit 1 ;;
esac

# What is in it: the package once, at the root (never a second copy under
# lib/python3.X/dist-packages), libhvd inside it, the tools, the bundled
# libraries, and no sources.
"$tmp/venv/bin/python" - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
bad = [n for n in names if "dist-packages" in n or "site-packages" in n
       or n.startswith("lib/") or "/_ops/" in n
       or n.endswith((".c", ".cc", ".h", ".cmake"))]
assert not bad, "unexpected files in the wheel: %s" % bad[:5]
for need in ("hvd/__init__.py", "hvd/libhvd.so", "hvd/torch/__init__.py",
             "hvd-0.1.0.data/scripts/hvdrun"):
    assert need in names, "the wheel lacks %s" % need
record = [n for n in names if n.endswith(".dist-info/RECORD")]
assert len(record) == 1, record
inits = [n for n in names if n.endswith("hvd/__init__.py")]
assert inits == ["hvd/__init__.py"], inits
libs = sorted(n.split("/")[-1] for n in names
              if n.startswith("hvd.libs/") and not n.endswith("/"))
assert any(n.startswith("libprotobuf-c") for n in libs), libs
for linked in ("libmpi", "libibverbs", "libnccl", "libcuda"):
    assert not any(n.startswith(linked) for n in libs), (linked, libs)
print("packaging: %d files; bundled: %s" % (len(names), ", ".join(libs)))
PY

# The install: no compiler, no cmake, no index, no building.
mkdir "$tmp/sysbin"
for tool in sh env cat grep sed ls rm mkdir uname id hostname timeout tee \
        readlink dirname basename ldconfig; do
    p=$(command -v "$tool" 2>/dev/null) && ln -s "$p" "$tmp/sysbin/$tool"
done
clean_path=$tmp/venv/bin:$tmp/sysbin
for tool in cc gcc c++ g++ clang cmake ninja make nvcc; do
    if PATH=$clean_path command -v "$tool" >/dev/null 2>&1; then
        echo "FAIL: $tool is on the install's PATH"
        exit 1
    fi
done
start=$(date +%s)
env -u CC -u CXX -u PYTHONPATH -u HVD_LIBRARY PATH="$clean_path" \
    timeout 120 "$tmp/venv/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation --only-binary=:all: --no-index "$whl"
echo "packaging: installed in $(( $(date +%s) - start )) s with no compiler or cmake on PATH"
site=$(echo "$tmp"/venv/lib/python*/site-packages)
copies=$(find "$site" -path '*/hvd/__init__.py' | sed "s|^$site/||")
if [ "$copies" != "hvd/__init__.py" ]; then
    echo "FAIL: the package is installed as: $copies"
    exit 1
fi

cat >"$tmp/job.py" <<'PY'
import os
import torch
import hvd.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
out = hvd.allreduce(torch.full((4,), float(r + 1)), op=hvd.Sum, name="sum")
assert out.tolist() == [n * (n + 1) / 2] * 4, out
lib = hvd.library_path()
assert lib.startswith(os.environ["VENV"]), lib
line = "rank %d of %d ok with %s" % (r, n, lib)
print(line)
if os.environ.get("OKDIR"):
    # mpirun forwards its ranks' output in pieces that may interleave
    # mid-line: there each rank also leaves its line in a file.
    with open(os.path.join(os.environ["OKDIR"], "rank%d" % r), "w") as f:
        f.write(line + "\n")
hvd.shutdown()
PY
cd "$tmp"
env -u CC -u CXX -u PYTHONPATH -u HVD_LIBRARY PATH="$clean_path" \
    timeout 60 hvdrun --check-build | tee "$tmp/check.txt"
grep -q "^    \[X\] tcp" "$tmp/check.txt"
grep -q "^    \[X\] PyTorch" "$tmp/check.txt" ||
    { echo "FAIL: --check-build does not show PyTorch"; exit 1; }
env -u CC -u CXX -u PYTHONPATH -u HVD_LIBRARY PATH="$clean_path" \
    VENV="$tmp/venv" HVD_START_TIMEOUT_SECONDS=60 \
    timeout 120 hvdrun -np 2 python "$tmp/job.py" | tee "$tmp/job.txt"
[ "$(grep -c "ok with $tmp/venv" "$tmp/job.txt")" -eq 2 ]
echo "packaging: the wheel installed without building and ran hvd.torch on 2 ranks"

if [ $with_tf -eq 1 ]; then
    tf_path=$tmp/venv-tf/bin:$tmp/sysbin
    env -u CC -u CXX -u PYTHONPATH PATH="$tf_path" timeout 120 \
        "$tmp/venv-tf/bin/pip" install -q --disable-pip-version-check \
        --no-build-isolation --only-binary=:all: --no-index "$whl"
    ls "$tf_site"/hvd/tensorflow/libhvd_tensorflow.so \
        "$tf_site"/hvd/tensorflow/libhvd_tensorflow_gpu.so
    env -u PYTHONPATH PATH="$tf_path" timeout 60 hvdrun --check-build |
        grep -q "^    \[X\] TensorFlow" ||
        { echo "FAIL: --check-build does not show TensorFlow"; exit 1; }
    env -u CC -u CXX -u PYTHONPATH -u HVD_LIBRARY -u HVD_TF_LIBRARY \
        PATH="$tf_path" TF_CPP_MIN_LOG_LEVEL=2 HVD_START_TIMEOUT_SECONDS=120 \
        timeout 300 hvdrun -np 2 python "$src/tests/packaging/tf_versions_job.py" |
        tee "$tmp/tf.txt"
    [ "$(grep -c "rank .* ok" "$tmp/tf.txt")" -eq 2 ]
    echo "packaging: the wheel's TensorFlow ops ran on 2 ranks"
fi

# MPI and verbs are loaded at run time: present here, the transports are
# there; the same job under mpirun goes over the MPI transport.
for lib in libmpi.so.40 libibverbs.so.1; do
    real=$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')
    [ -n "$real" ] || continue
    case $lib in libmpi*) name=mpi ;; *) name=verbs ;; esac
    grep -q "^    \[X\] $name\$" "$tmp/check.txt" ||
        { echo "FAIL: $lib is here ($real) and --check-build lacks $name"; exit 1; }
done
if [ -n "$mpirun" ] && grep -q "^    \[X\] mpi\$" "$tmp/check.txt"; then
    mkdir "$tmp/mpi-ok"
    # (mpirun itself wants ssh on its PATH, even for local ranks.)
    # shellcheck disable=SC2086
    env -u CC -u CXX -u PYTHONPATH -u HVD_LIBRARY timeout 120 $mpirun -np 2 \
        -x PATH="$clean_path" -x VENV="$tmp/venv" -x HVD_TRANSPORT=mpi \
        -x OKDIR="$tmp/mpi-ok" "$tmp/venv/bin/python" "$tmp/job.py"
    [ "$(cat "$tmp"/mpi-ok/rank* | grep -c "ok with $tmp/venv")" -eq 2 ]
    echo "packaging: the wheel's hvd.torch ran on 2 ranks under mpirun over the MPI transport"
fi

# Without them (each hidden behind /dev/null in a mount namespace of this
# test's own, which needs root): libhvd still loads, --check-build says
# why in a sentence, and a job runs over TCP.
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
    echo "packaging: not root: the check without libmpi and libibverbs is skipped"
    exit 0
fi
{
    for lib in libmpi.so.40 libibverbs.so.1; do
        real=$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')
        [ -z "$real" ] || echo "mount --bind /dev/null '$(readlink -f "$real")'"
    done
    echo "export PATH='$clean_path' VENV='$tmp/venv' HVD_START_TIMEOUT_SECONDS=60"
    echo "hvdrun --check-build"
    echo "hvdrun -np 2 python '$tmp/job_np.py'"
} >"$tmp/hidden.sh"
# (Debian's torch itself links libibverbs: this job is hvd's numpy API.)
sed -e 's/^import torch$/import numpy as np/' -e 's/hvd.torch as hvd/hvd/' \
    -e 's/torch.full((4,), /np.full(4, /' "$tmp/job.py" >"$tmp/job_np.py"
env -u CC -u CXX -u PYTHONPATH -u HVD_LIBRARY timeout 120 \
    unshare -m sh -e "$tmp/hidden.sh" | tee "$tmp/hidden.txt"
grep -q "^    \[ \] mpi (built in, but libmpi.so.40 cannot be loaded" "$tmp/hidden.txt"
grep -q "^    \[ \] verbs (built in, but libibverbs.so.1 cannot be loaded" "$tmp/hidden.txt"
[ "$(grep -c "ok with $tmp/venv" "$tmp/hidden.txt")" -eq 2 ]
echo "packaging: without libmpi and libibverbs the wheel's hvd runs, and --check-build says why"
