#!/bin/sh
# Runs the TensorFlow interpreter on NP ranks with the hvd package of this
# source tree, the libhvd and the TensorFlow op library of this build.
#
#   run_tf.sh HVDRUN PYTHON LIBHVD LIBTF NP ARGS...
#   run_tf.sh --mpirun "MPIRUN ARGS" PYTHON LIBHVD LIBTF NP ARGS...
#
# Exit status: the run's, or 77 (skip) when PYTHON cannot import
# tensorflow and pytest.
mpirun=""
if [ "$1" = --mpirun ]; then
    mpirun=$2
    shift 2
    set -- mpirun "$@"
fi
if [ $# -lt 6 ]; then
    echo "usage: $0 HVDRUN|--mpirun CMD PYTHON LIBHVD LIBTF NP ARGS..." >&2
    exit 1
fi
hvdrun=$1
python=$2
lib=$3
tflib=$4
np=$5
shift 5
src=$(cd "$(dirname "$0")/../.." && pwd)

if ! "$python" -c "import tensorflow, pytest" >/dev/null 2>&1; then
    echo "SKIP: $python cannot import tensorflow and pytest (tools/install-tf" \
         "makes .venv-tf with them)"
    exit 77
fi
if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi
HVD_LIBRARY=$lib
HVD_TF_LIBRARY=$tflib
PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
# TensorFlow's start-up chatter (oneDNN, CPU features) is not the test's.
TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# Two cores: one TensorFlow thread pool per rank of each kind.
TF_NUM_INTEROP_THREADS=${TF_NUM_INTEROP_THREADS:-2}
TF_NUM_INTRAOP_THREADS=${TF_NUM_INTRAOP_THREADS:-1}
HVD_STALL_SHUTDOWN_SECONDS=${HVD_STALL_SHUTDOWN_SECONDS:-30}
HVD_START_TIMEOUT_SECONDS=${HVD_START_TIMEOUT_SECONDS:-60}
export HVD_LIBRARY HVD_TF_LIBRARY PYTHONPATH PYTHONDONTWRITEBYTECODE \
    TF_CPP_MIN_LOG_LEVEL TF_NUM_INTEROP_THREADS TF_NUM_INTRAOP_THREADS \
    HVD_STALL_SHUTDOWN_SECONDS HVD_START_TIMEOUT_SECONDS
if [ -n "$mpirun" ]; then
    # shellcheck disable=SC2086
    exec timeout 240 $mpirun -np "$np" -x HVD_LIBRARY -x HVD_TF_LIBRARY \
        -x PYTHONPATH -x PYTHONDONTWRITEBYTECODE -x TF_CPP_MIN_LOG_LEVEL \
        -x TF_NUM_INTEROP_THREADS -x TF_NUM_INTRAOP_THREADS \
        -x HVD_STALL_SHUTDOWN_SECONDS -x HVD_START_TIMEOUT_SECONDS \
        "$python" "$@"
fi
exec timeout 240 "$hvdrun" -np "$np" -- "$python" "$@"
