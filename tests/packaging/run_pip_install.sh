#!/bin/sh
# pip install of a fresh clone into a new virtual environment, then a
# 2-rank job from outside the source tree with the installed hvdrun and
# package only (no HVD_LIBRARY, no PYTHONPATH).
#
#   run_pip_install.sh PYTHON
#
# Exit status: 0, 1 (failed), or 77 (skip) when PYTHON has no venv module
# or pip cannot reach a package index for the build backend.
set -eu
python=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$python" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    echo "SKIP: $python -m venv failed (Debian: apt-get install python3-venv)"
    cat "$tmp/venv.log"
    exit 77
fi
pip="$tmp/venv/bin/pip"
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
timeout 900 "$pip" install -q "$tmp/src"

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
echo "packaging: pip install, hvdrun on PATH, 2 ranks from outside the tree: ok"
