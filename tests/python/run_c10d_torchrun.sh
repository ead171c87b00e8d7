#!/bin/sh
# The c10d backend's tests (test_c10d.py) under torchrun, the launcher
# DDP users run: torchrun --standalone --nproc_per_node=NP -m pytest, with
# the suite's own PyTorch (.venv-torch, tools/install-torch).
#
#   run_c10d_torchrun.sh PYTHON LIBHVD NP
#
# Exit status: 0 pass, 1 fail, 77 skip (no Python with torch, pytest and
# torchrun; a sanitizer build of libhvd).
set -u
python=$1
lib=$2
np=$3
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ -z "$python" ] || ! "$python" -c "import torch, numpy, pytest" \
        >/dev/null 2>&1; then
    echo "SKIP: no Python with torch, numpy and pytest (${python:-none}):" \
         "tools/install-torch makes .venv-torch from PyPI; or configure" \
         "with -DHVD_TORCH_PYTHON=..."
    exit 77
fi
bindir=$(dirname "$python")
if [ ! -x "$bindir/torchrun" ]; then
    echo "SKIP: $bindir has no torchrun"
    exit 77
fi
if ldd "$lib" 2>/dev/null | grep -q 'lib[at]san'; then
    echo "SKIP: the torch tests do not run against a sanitizer build"
    exit 77
fi
HVD_LIBRARY=$lib
PYTHONPATH=$src/python
PYTHONDONTWRITEBYTECODE=1
HVD_STALL_SHUTDOWN_SECONDS=30
HVD_START_TIMEOUT_SECONDS=60
# torchrun's own chatter (its warning about OMP_NUM_THREADS) is not ours.
LOGLEVEL=WARNING
export HVD_LIBRARY PYTHONPATH PYTHONDONTWRITEBYTECODE LOGLEVEL \
    HVD_STALL_SHUTDOWN_SECONDS HVD_START_TIMEOUT_SECONDS
exec timeout 240 "$bindir/torchrun" --standalone --nproc_per_node="$np" \
    -m pytest -q -x -p no:cacheprovider "$src/tests/python/test_c10d.py"
