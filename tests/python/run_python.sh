#!/bin/sh
# Runs the Python interpreter on NP ranks under hvdrun, with the hvd package
# of this source tree and the libhvd of this build.
#
#   run_python.sh HVDRUN PYTHON LIBHVD NP MODULES ARGS...
#
# MODULES: the modules ARGS need, comma-separated (e.g. torch,numpy,pytest).
# HVD_TEST_HVDRUN_ARGS: more hvdrun options (e.g. "--min-np 2"), split on
# blanks.
# Exit status: the run's (hvdrun gives a failed rank's), or 77 (skip) when
# PYTHON or one of MODULES is missing, or libhvd is a ThreadSanitizer build.
if [ $# -lt 6 ]; then
    echo "usage: $0 HVDRUN PYTHON LIBHVD NP MODULES ARGS..." >&2
    exit 1
fi
hvdrun=$1
python=$2
lib=$3
np=$4
modules=$5
shift 5
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ -z "$python" ] || ! command -v "$python" >/dev/null 2>&1; then
    echo "SKIP: no Python interpreter (set -DHVD_PYTHON=/usr/bin/python3)"
    exit 77
fi
if ! "$python" -c "import $modules" >/dev/null 2>&1; then
    echo "SKIP: $python cannot import one of $modules (Debian:" \
         "apt-get install python3-torch python3-numpy python3-pytest," \
         "or tools/install-deps; a pyenv python3 first on PATH does not see" \
         "them: configure with -DHVD_PYTHON=/usr/bin/python3)"
    exit 77
fi
if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi

# A sanitizer build of libhvd needs its runtime loaded before Python's own
# allocations: ASan's is preloaded into the interpreter (only), with leak
# checks off, since CPython and torch keep memory until exit by design and
# those reports are not hvd's (the C tests check hvd's leaks). TSan's
# cannot be preloaded into an uninstrumented interpreter.
if ldd "$lib" 2>/dev/null | grep -q libtsan; then
    echo "SKIP: the Python tests do not run against a ThreadSanitizer build"
    exit 77
fi
# libstdc++ is preloaded after it: ASan intercepts __cxa_throw, and finds
# the real one only in a library loaded at start; torch's C++ exceptions
# (a Python error raised in an autograd hook, as when a peer is lost
# during backward) otherwise stop the process with "CHECK failed:
# real___cxa_throw".
asan=$(ldd "$lib" 2>/dev/null | awk '/libasan/ { print $3; exit }')
stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 / { print $NF; exit }')
if [ -n "$asan" ]; then
    set -- env "LD_PRELOAD=$asan${stdcxx:+ $stdcxx}" \
        "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        "$python" "$@"
else
    set -- "$python" "$@"
fi

HVD_LIBRARY=$lib
PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
# Ranks whose tests fell out of step fail within seconds instead of waiting
# for each other until the ctest timeout.
HVD_STALL_SHUTDOWN_SECONDS=${HVD_STALL_SHUTDOWN_SECONDS:-30}
HVD_START_TIMEOUT_SECONDS=${HVD_START_TIMEOUT_SECONDS:-60}
export HVD_LIBRARY PYTHONPATH PYTHONDONTWRITEBYTECODE \
    HVD_STALL_SHUTDOWN_SECONDS HVD_START_TIMEOUT_SECONDS
# shellcheck disable=SC2086
exec timeout 240 "$hvdrun" -np "$np" ${HVD_TEST_HVDRUN_ARGS:-} -- "$@"
