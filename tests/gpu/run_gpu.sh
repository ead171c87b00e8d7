#!/bin/sh
# Runs test_gpu under hvdrun with one HVD_TRANSPORT and checks the path
# device tensors took.
#
#   run_gpu.sh HVDRUN TEST_GPU NP TRANSPORT PATHS [ARGS...]
#
# PATHS: the path every rank must log ("device tensors: CUDA device D,
# path P"), alternatives separated by commas ("nccl,staged over tcp": a
# machine with one GPU per rank takes NCCL, one with a single GPU stages).
# Exit status: 0 pass, 1 fail, 77 skip (no GPU; fewer GPUs than ranks
# where NCCL needs one each; TRANSPORT not built into this hvd).
if [ $# -lt 5 ]; then
    echo "usage: $0 HVDRUN TEST_GPU NP TRANSPORT PATHS [ARGS...]" >&2
    exit 1
fi
hvdrun=$1
prog=$2
np=$3
transport=$4
paths=$5
shift 5

out=$(mktemp "${TMPDIR:-/tmp}/hvd_gpu.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
trap 'exit 1' HUP INT TERM

unset HVD_GPU_DEVICE
HVD_TRANSPORT=$transport HVD_LOG_LEVEL=info \
    "$hvdrun" -np "$np" -- "$prog" "$@" >"$out" 2>&1
rc=$?
if [ $rc -eq 77 ] || grep -q "that transport is not built into this hvd" "$out"; then
    grep -m1 -E "SKIP|not built" "$out"
    exit 77
fi
if [ $rc -ne 0 ]; then
    cat "$out"
    echo "run_gpu: FAIL: hvdrun exited with $rc"
    exit 1
fi
passes=$(grep -c "PASS gpu rank" "$out")
if [ "$passes" -ne "$np" ]; then
    cat "$out"
    echo "run_gpu: FAIL: $passes of $np ranks passed"
    exit 1
fi
# Every rank logs its path once, at its first device tensor.
found=0
old_ifs=$IFS
IFS=,
for p in $paths; do
    n=$(grep -c "device tensors: CUDA device [0-9]*, path $p\$" "$out")
    [ "$n" -eq "$np" ] && found=1
done
IFS=$old_ifs
if [ $found -ne 1 ]; then
    cat "$out"
    echo "run_gpu: FAIL: not every rank logged path '$paths'"
    exit 1
fi
grep "device tensors: CUDA device" "$out" | head -n "$np"
grep "PASS gpu rank" "$out"
exit 0
