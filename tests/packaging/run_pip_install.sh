#!/bin/sh
# pip install of a fresh clone into a new virtual environment, then a
# 2-rank job from outside the source tree with the installed hvdrun and
# package only (no HVD_LIBRARY, no PYTHONPATH). With TF_PYTHON (an
# interpreter that imports TensorFlow: the suite's .venv-tf), the new
# environment sees that TensorFlow (a .pth file naming its site-packages,
# instead of a second download), so the wheel gets the TensorFlow ops, and
# examples/tensorflow_seed.py runs on 2 ranks from outside the tree too.
#
#   run_pip_install.sh PYTHON [TF_PYTHON]
#
# Exit status: 0, 1 (failed), or 77 (skip) when PYTHON has no venv module
# or pip cannot reach a package index for the build backend.
set -eu
python=$1
tf_python=${2:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$python" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    echo "SKIP: $python -m venv failed (Debian: apt-get install python3-venv)"
    cat "$tmp/venv.log"
    exit 77
fi
pip="$tmp/venv/bin/pip"
with_tf=0
if [ -n "$tf_python" ] && "$tf_python" -I -c "import tensorflow" >/dev/null 2>&1; then
    # Its site folders: the venv's and those it sees (Debian's, for six).
    site=$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$tf_python" -I -c "import sys; print('\n'.join(p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))))" \
        >"$site/hvd-test-tensorflow.pth"
    with_tf=1
else
    echo "packaging: no TensorFlow (${tf_python:-no TF_PYTHON}): the TensorFlow part is not checked"
fi
if ! timeout 300 "$pip" download -q --no-deps -d "$tmp/probe" \
        scikit-build-core >"$tmp/probe.log" 2>&1; then
    echo "SKIP: pip cannot fetch scikit-build-core (no package index here)"
    cat "$tmp/probe.log"
    exit 77
fi

# A fresh clone, as a user has it (the committed tree), or the tree itself
# where it is no git checkout (an unpacked sdist).
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    git clone -q "$src" "$tmp/src"
else
    cp -r "$src" "$tmp/src"
    rm -rf "$tmp/src"/build "$tmp/src"/build-*
fi
echo "pip install $tmp/src"
# On every core, as a user's CMAKE_BUILD_PARALLEL_LEVEL would (CMake builds
# serially by default).
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 900 "$pip" install -q "$tmp/src"
# The installed package is Python and libraries: the TensorFlow op
# library's sources (python/hvd/tensorflow/_ops) are not in it.
pkg=$(echo "$tmp"/venv/lib/python*/site-packages/hvd)
if find "$pkg" -name _ops -o -name '*.c' -o -name '*.cc' -o -name '*.h' \
        -o -name '*.cmake' | grep .; then
    echo "FAIL: the installed package holds sources (above)"
    exit 1
fi
# The sdist, which pip builds a wheel from elsewhere, has them.
if timeout 300 "$pip" install -q scikit-build-core >"$tmp/sk.log" 2>&1; then
    (cd "$tmp/src" && "$tmp/venv/bin/python" -c \
        "from scikit_build_core.build import build_sdist; build_sdist('$tmp/sdist')" \
        >"$tmp/sdist.log" 2>&1) ||
        { cat "$tmp/sdist.log"; echo "FAIL: no sdist"; exit 1; }
    tar tzf "$tmp"/sdist/hvd-*.tar.gz >"$tmp/sdist.txt"
    for f in ops.h register.c reduce.c allgather.c alltoall.c twostep.c \
            glue.c keep_done.cc device_sync.cc tensorflow.cmake; do
        grep -q "/python/hvd/tensorflow/_ops/$f\$" "$tmp/sdist.txt" ||
            { echo "FAIL: the sdist lacks python/hvd/tensorflow/_ops/$f"; exit 1; }
    done
    echo "packaging: the sdist has the op library's sources, the installed package none"
else
    echo "packaging: could not install scikit-build-core: the sdist is not checked"
    tail -3 "$tmp/sk.log"
fi

cat >"$tmp/job.py" <<'PY'
import os
import numpy as np
import hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
out = hvd.allreduce(np.full(5, float(r + 1)), op=hvd.Sum, name="sum")
assert out.tolist() == [n * (n + 1) / 2] * 5, out
lib = hvd.library_path()
assert lib.startswith(os.environ["VENV"]), lib
print("rank", r, "of", n, "ok with", lib)
hvd.shutdown()
PY
cd "$tmp"
env -u HVD_LIBRARY -u PYTHONPATH VENV="$tmp/venv" \
    PATH="$tmp/venv/bin:$PATH" HVD_START_TIMEOUT_SECONDS=60 \
    timeout 120 hvdrun -np 2 python "$tmp/job.py"
[ "$(command -v "$tmp/venv/bin/hvdrun")" = "$tmp/venv/bin/hvdrun" ]
# The installed hvdrun reports the installed package (the venv's python).
env -u HVD_LIBRARY -u PYTHONPATH PATH="$tmp/venv/bin:$PATH" \
    hvdrun --check-build | tee "$tmp/check.txt"
grep -q "^    \[X\] tcp" "$tmp/check.txt"
if grep -q "hvd package is not importable" "$tmp/check.txt"; then
    echo "FAIL: the installed hvdrun does not see the installed package"
    exit 1
fi
[ -x "$tmp/venv/bin/hvd-bench" ] && [ -x "$tmp/venv/bin/hvd-tune" ]
if [ $with_tf -eq 1 ]; then
    grep -q "^    \[X\] TensorFlow" "$tmp/check.txt" ||
        { echo "FAIL: --check-build does not show TensorFlow"; exit 1; }
    ls "$tmp"/venv/lib/python*/site-packages/hvd/tensorflow/libhvd_tensorflow.so
    cp "$src/examples/tensorflow_seed.py" "$tmp/seed.py"
    env -u HVD_LIBRARY -u HVD_TF_LIBRARY -u PYTHONPATH \
        PATH="$tmp/venv/bin:$PATH" HVD_START_TIMEOUT_SECONDS=60 \
        TF_CPP_MIN_LOG_LEVEL=2 timeout 180 hvdrun -np 2 python "$tmp/seed.py" \
        --steps 20 | tee "$tmp/seed.txt"
    grep -q "tensorflow_seed: .* on 2 ranks" "$tmp/seed.txt"
    echo "packaging: the wheel's TensorFlow ops ran examples/tensorflow_seed.py on 2 ranks"
fi
echo "packaging: pip install, hvdrun on PATH, 2 ranks from outside the tree: ok"
