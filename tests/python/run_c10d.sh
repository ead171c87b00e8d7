#!/bin/sh
# The c10d backend's tests (test_c10d.py) under the launchers DDP users
# run, with the suite's own PyTorch (.venv-torch, tools/install-torch):
#
#   run_c10d.sh torchrun PYTHON LIBHVD NP
#       torchrun --standalone --nproc_per_node=NP -m pytest
#   run_c10d.sh mpirun PYTHON LIBHVD NP MPIRUN
#       MPIRUN -np NP python -m pytest (an MPI build of libhvd; Open MPI
#       gives no MASTER_ADDR: the backend's env:// starts torch's store)
#
# Exit status: 0 pass, 1 fail, 77 skip (no Python with torch, pytest and
# torchrun; no mpirun or not an MPI build; a sanitizer build of libhvd).
set -u
mode=$1
python=$2
lib=$3
np=$4
mpirun=${5:-}
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ -z "$python" ] || ! "$python" -c "import torch, numpy, pytest" \
        >/dev/null 2>&1; then
    echo "SKIP: no Python with torch, numpy and pytest (${python:-none}):" \
         "tools/install-torch makes .venv-torch from PyPI; or configure" \
         "with -DHVD_TORCH_PYTHON=..."
    exit 77
fi
bindir=$(dirname "$python")
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
pytest="-m pytest -q -x -p no:cacheprovider $src/tests/python/test_c10d.py"
case $mode in
torchrun)
    if [ ! -x "$bindir/torchrun" ]; then
        echo "SKIP: $bindir has no torchrun"
        exit 77
    fi
    # shellcheck disable=SC2086
    exec timeout 240 "$bindir/torchrun" --standalone \
        --nproc_per_node="$np" $pytest
    ;;
mpirun)
    # (libhvd loads libmpi at run time: its name is in the library, not in ldd.)
    if [ -z "$mpirun" ] || ! grep -qa "libmpi\.so" "$lib"; then
        echo "SKIP: no mpirun (${mpirun:-none}) or libhvd is not an MPI build"
        exit 77
    fi
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
    export OMPI_MCA_oob_tcp_if_include=lo
    # shellcheck disable=SC2086
    exec timeout 240 "$mpirun" -np "$np" --oversubscribe --bind-to none \
        -x HVD_LIBRARY -x PYTHONPATH -x PYTHONDONTWRITEBYTECODE \
        -x HVD_STALL_SHUTDOWN_SECONDS -x HVD_START_TIMEOUT_SECONDS \
        "$python" $pytest
    ;;
*)
    echo "usage: $0 torchrun|mpirun PYTHON LIBHVD NP [MPIRUN]" >&2
    exit 1
    ;;
esac
