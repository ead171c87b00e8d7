#!/bin/bash
# examples/pytorch_elastic.py under hvdrun's elastic mode (3 workers,
# --min-np 2), run twice: without faults, and with rank 0's worker killed
# (kill -9) once epoch 1 is done. The killed run must report the same
# losses as the fault-free one up to the kill (the survivors restore the
# last commit, the oldest of them becomes rank 0), go on with 2 ranks,
# and converge as far: its final loss within a factor 3 of the fault-free
# run's (the two differ after the kill: 2 ranks see other batches).
#
#   run_elastic_torch.sh HVDRUN PYTHON LIBHVD
set -u
if [ $# -ne 3 ]; then
    echo "usage: $0 HVDRUN PYTHON LIBHVD" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
example=$here/../../examples/pytorch_elastic.py
dir=$(mktemp -d /tmp/hvd-elastic-torch-$$.XXXXXX) || exit 1
trap 'pkill -KILL -P $$ 2>/dev/null; rm -rf "$dir"' EXIT
export HVD_TEST_HVDRUN_ARGS="--min-np 2 --max-np 3 --elastic-timeout 60"
args="--epochs 6 --batch-sleep 0.05"

fail() {
    echo "FAIL elastic torch: $*"
    for f in "$dir"/*.out; do echo "---- $f"; tail -n 40 "$f"; done
    exit 1
}

# shellcheck disable=SC2086
sh "$here/run_python.sh" "$1" "$2" "$3" 3 torch "$example" $args \
    >"$dir/ref.out" 2>&1
code=$?
[ $code = 77 ] && { cat "$dir/ref.out"; exit 77; }
[ $code = 0 ] || fail "the fault-free run exited with $code"

# shellcheck disable=SC2086
sh "$here/run_python.sh" "$1" "$2" "$3" 3 torch "$example" $args \
    >"$dir/kill.out" 2>&1 &
runner=$!
end=$(($(date +%s) + 120))
until grep -q "epoch 1 loss" "$dir/kill.out"; do
    [ "$(date +%s)" -le "$end" ] || fail "epoch 1 never ended"
    kill -0 $runner 2>/dev/null || fail "the run ended before epoch 1"
    sleep 0.05
done
# Rank 0 is worker 0, the first python3 hvdrun started.
victim=
for p in $(pgrep -f "python3.*$(basename "$example")"); do
    if grep -qz "^HVD_ELASTIC_WORKER=0$" "/proc/$p/environ" 2>/dev/null; then
        victim=$p
    fi
done
[ -n "$victim" ] || fail "worker 0 not found"
kill -KILL "$victim"
wait $runner
code=$?
[ $code = 0 ] || fail "the run with a kill exited with $code"

grep -q "reset: 2 ranks" "$dir/kill.out" || fail "no reset to 2 ranks"
ref_before=$(grep -o "epoch [01] loss [0-9.]*" "$dir/ref.out")
kill_before=$(grep -o "epoch [01] loss [0-9.]*" "$dir/kill.out")
[ "$ref_before" = "$kill_before" ] ||
    fail "losses before the kill differ: '$ref_before' vs '$kill_before'"
ref=$(grep -o "final loss [0-9.]*" "$dir/ref.out" | awk '{ print $3 }')
got=$(grep -o "final loss [0-9.]*" "$dir/kill.out" | awk '{ print $3 }')
[ -n "$ref" ] && [ -n "$got" ] || fail "no final loss"
awk -v r="$ref" -v g="$got" 'BEGIN { exit !(g <= 3 * r && g >= r / 3) }' ||
    fail "final loss $got is not within a factor 3 of $ref"
echo "fault-free:"
grep -E "epoch|final" "$dir/ref.out"
echo "rank 0 killed after epoch 1:"
grep -E "epoch|final|reset" "$dir/kill.out"
echo "PASS elastic torch: final loss $got (fault-free $ref)"
