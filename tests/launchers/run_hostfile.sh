#!/usr/bin/env bash
# The launcher lines of examples/kubernetes/mpijob-*.yaml, with the
# hostfile the Kubeflow MPI Operator writes (/etc/mpi/hostfile), here with
# this machine as the one host of two slots.
#
#   run_hostfile.sh FORMAT HVDRUN PYTHON LIBHVD MPIRUN
#
# FORMAT slots: "localhost slots=2" (the Operator's Open MPI format):
#   hvdrun --hostfile F (the C test program, exact results, and the
#   example trainer as the manifest runs it), and mpirun --hostfile F as
#   mpijob-mpirun.yaml runs it (when this is an MPI build).
# FORMAT colon: "localhost:2" (its MPICH and Intel MPI format): hvdrun
#   only (Open MPI's mpirun does not read that format).
# Exit status: 0 pass, 1 fail, 77 skip.
set -u
fmt=$1
hvdrun=$2
python=$3
lib=$4
mpirun=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
collectives=$(dirname "$hvdrun")/tests/test_collectives
[ -x "$collectives" ] || collectives=$(dirname "$lib")/tests/test_collectives

dir=$(mktemp -d /tmp/hvd-hostfile.XXXXXX)
trap 'rm -rf "$dir"' EXIT
case $fmt in
slots) echo "localhost slots=2" >"$dir/hostfile" ;;
colon) echo "localhost:2" >"$dir/hostfile" ;;
*) echo "usage: $0 slots|colon HVDRUN PYTHON LIBHVD MPIRUN" >&2; exit 2 ;;
esac
export HVD_START_TIMEOUT_SECONDS=60 HVD_STALL_SHUTDOWN_SECONDS=30
fail=0

# Expects exit 0 and PASS lines of ranks 0 and 1 of size 2.
check() { # WHAT RC
    local r
    sed "s/^/[$1] /" "$dir/out"
    if [ "$2" -ne 0 ]; then
        echo "FAIL $1: exited with status $2"
        fail=1
        return
    fi
    for r in 0 1; do
        if ! grep -q "PASS .* rank $r size 2\b" "$dir/out"; then
            echo "FAIL $1: no PASS line for rank $r of 2"
            fail=1
            return
        fi
    done
    echo "ok: $1"
}

timeout 120 "$hvdrun" --hostfile "$dir/hostfile" "$collectives" --quick \
    >"$dir/out" 2>&1
check "hvdrun --hostfile ($fmt) C" $?

# The manifests' trainer, with the manifests' arguments.
trainer=("$src/examples/pytorch_synthetic.py" --batch-size 8
         --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2)
have_torch=0
if [ -n "$python" ] && "$python" -c "import torch" >/dev/null 2>&1 &&
    ! ldd "$lib" 2>/dev/null | grep -q 'lib[at]san'; then
    have_torch=1
    export HVD_LIBRARY=$lib PYTHONPATH=$src/python PYTHONDONTWRITEBYTECODE=1
else
    echo "note: the trainer runs are left out: ${python:-no Python} cannot" \
         "import torch, or libhvd is a sanitizer build"
fi
if [ $have_torch = 1 ]; then
    timeout 180 "$hvdrun" --hostfile "$dir/hostfile" -x PATH \
        "$python" "${trainer[@]}" >"$dir/out" 2>&1
    rc=$?
    sed "s/^/[hvdrun trainer] /" "$dir/out"
    if [ $rc -ne 0 ] || ! grep -q "Total img/sec on 2" "$dir/out"; then
        echo "FAIL hvdrun --hostfile ($fmt) trainer: status $rc"
        fail=1
    else
        echo "ok: hvdrun --hostfile ($fmt) trainer"
    fi
fi

# (libhvd loads libmpi at run time: its name is in the library, not in ldd.)
if [ "$fmt" = slots ] && [ -n "$mpirun" ] &&
    grep -qa "libmpi\.so" "$lib"; then
    # As the Operator's images do: root allowed, and here the loopback.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
    export OMPI_MCA_oob_tcp_if_include=lo
    timeout 120 "$mpirun" --hostfile "$dir/hostfile" -np 2 --bind-to none \
        "$collectives" --quick >"$dir/out" 2>&1
    check "mpirun --hostfile C" $?
    if [ $have_torch = 1 ]; then
        timeout 180 "$mpirun" --hostfile "$dir/hostfile" -np 2 --bind-to none \
            -x PATH "$python" "${trainer[@]}" >"$dir/out" 2>&1
        rc=$?
        sed "s/^/[mpirun trainer] /" "$dir/out"
        if [ $rc -ne 0 ] || ! grep -q "Total img/sec on 2" "$dir/out"; then
            echo "FAIL mpirun --hostfile trainer: status $rc"
            fail=1
        else
            echo "ok: mpirun --hostfile trainer"
        fi
    fi
fi
[ $fail = 0 ] && echo "ok: hostfile $fmt"
exit $fail
