#!/bin/sh
# hvd-tune at np 3 writes a tuning file; the collectives then run exact
# with HVD_TUNING_FILE pointing at it; a malformed file fails hvd_init
# with the line it could not read.
#
#   run_tune.sh HVDRUN HVD_TUNE TEST_COLLECTIVES
set -u
hvdrun=$1
tune=$2
prog=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_tune.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fails=0
check() { # name expected actual
    if [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        echo "FAIL $1: expected '$2', got '$3'"
        fails=$((fails + 1))
    fi
}

timeout 200 "$hvdrun" -np 3 "$tune" --maxbytes 1M --out "$dir/t.txt"
check "hvd-tune exits 0" 0 $?
check "tuning file has measured allreduce lines" yes \
    "$(grep -q '^allreduce same-host [0-9]* \(net\|shm\) [a-z]* [0-9]*$' \
        "$dir/t.txt" && echo yes)"
cat "$dir/t.txt"

out=$(HVD_TUNING_FILE="$dir/t.txt" timeout 200 "$hvdrun" -np 3 "$prog" \
    --max-count 65536 2>&1)
check "collectives with the tuning file" 3 \
    "$(echo "$out" | grep -c 'PASS test_collectives')"

printf 'allreduce same-host 4096 shm fastest 65536\n' >"$dir/bad.txt"
out=$(HVD_TUNING_FILE="$dir/bad.txt" timeout 60 "$hvdrun" -np 2 "$prog" \
    --max-count 1 2>&1)
# Every rank fails alike; hvdrun stops the others once the first exits.
check "malformed tuning file fails init" yes \
    "$(echo "$out" | grep -q "FAIL init rank .*HVD_TUNING_FILE=$dir/bad.txt: line 1: unknown algorithm 'fastest'" && echo yes)"

[ $fails -eq 0 ] && echo "run_tune: PASS" && exit 0
echo "run_tune: $fails FAILED"
exit 1
