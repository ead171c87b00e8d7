#!/bin/sh
# Kills one rank mid-job and checks that every survivor reports it.
#
#   run_peer_lost.sh HVDRUN PROG NP VICTIM AFTER [NAMES]
#
# NAMES: the allreduces cycle through that many names (cached ones), as
# test_peer_lost --names; by default every one has a new name.
# Pass iff hvdrun exits 137 (the victim's SIGKILL) within 10 s of the
# victim's death and 30 s in all, each of the NP-1 survivors printed
# "PASS peer_lost", and no shared-memory segment of the job is left.
# HVD_TRANSPORT from the environment chooses the transport. Exit status: 0 pass, 1 fail, 77 skip.

if [ $# -ne 5 ] && [ $# -ne 6 ]; then
    echo "usage: $0 HVDRUN PROG NP VICTIM AFTER [NAMES]" >&2
    exit 1
fi
hvdrun=$1
prog=$2
np=$3
victim=$4
after=$5
names=${6:-0}

if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi

out=$(mktemp "${TMPDIR:-/tmp}/hvd_peer_lost.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT

# The grace period lets survivors finish reporting after hvdrun has sent
# them SIGTERM (which they ignore); it stays below the 10 s budget.
start=$(date +%s.%N)
timeout 60 "$hvdrun" --grace-seconds 8 -np "$np" -- \
    sh -c '[ "$HVD_RANK" = 0 ] && echo "SHM $(python3 -c "if 1:
        import hashlib, hmac, os
        m = hmac.new(os.environ[\"HVD_SECRET\"].encode(),
                     (\"hvd-shm|\" + os.environ[\"HVD_JOB_ID\"]).encode(),
                     hashlib.sha256)
        print(m.hexdigest()[:32])")"
        exec "$0" "$@"' \
    "$prog" --victim "$victim" --after "$after" --names "$names" >"$out" 2>&1
rc=$?
end=$(date +%s.%N)
cat "$out"

# The victim prints its wall-clock time just before raise(SIGKILL).
death=$(sed -n 's/.*VICTIM rank [0-9]* raises SIGKILL at iteration [0-9]*, time \([0-9.]*\).*/\1/p' "$out" | head -n 1)
passes=$(grep -c 'PASS peer_lost' "$out")
want=$((np - 1))
total=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')

ok=1
if [ "$rc" -ne 137 ]; then
    echo "run_peer_lost: FAIL: hvdrun exited $rc, expected 137 (SIGKILL)"
    ok=0
fi
if [ "$passes" -ne "$want" ]; then
    echo "run_peer_lost: FAIL: $passes 'PASS peer_lost' lines, expected $want"
    ok=0
fi
if [ -z "$death" ]; then
    echo "run_peer_lost: FAIL: the victim's VICTIM line is missing"
    ok=0
else
    after_death=$(awk -v a="$death" -v b="$end" 'BEGIN { printf "%.3f", b - a }')
    echo "run_peer_lost: hvdrun ended $after_death s after the victim's death, $total s in all"
    if awk -v t="$after_death" 'BEGIN { exit !(t > 10) }'; then
        echo "run_peer_lost: FAIL: hvdrun took over 10 s after the victim's death"
        ok=0
    fi
fi
# Shared memory: nothing of the job is left in /dev/shm. Its segments are
# named by a hash keyed with the job secret (transport/shm/setup.c), which
# rank 0 printed (SHM, computed with python3's hmac).
tag=$(sed -n 's/^\[0\] SHM \([0-9a-f]\{32\}\)$/\1/p' "$out" | head -n 1)
if [ -z "$tag" ]; then
    echo "run_peer_lost: FAIL: rank 0 did not print its segments' name" \
        "(is python3 installed?)"
    ok=0
elif ls /dev/shm 2>/dev/null | grep -q "^hvd-$tag-"; then
    echo "run_peer_lost: FAIL: the job left segments in /dev/shm:" \
        $(ls /dev/shm | grep "^hvd-$tag-")
    ok=0
fi
if awk -v t="$total" 'BEGIN { exit !(t > 30) }'; then
    echo "run_peer_lost: FAIL: the job took $total s (limit 30 s)"
    ok=0
fi
if [ "$ok" -eq 1 ]; then
    echo "run_peer_lost: PASS"
    exit 0
fi
exit 1
