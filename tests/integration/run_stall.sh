#!/bin/sh
# Stops one rank mid-collective and checks that every other rank times out.
#
#   run_stall.sh HVDRUN PROG NP VICTIM
#
# Pass iff hvdrun exits 3 (a survivor's pass status) and each of the NP-1
# survivors printed "PASS stall". Exit status: 0 pass, 1 fail, 77 skip.

if [ $# -ne 4 ]; then
    echo "usage: $0 HVDRUN PROG NP VICTIM" >&2
    exit 1
fi
hvdrun=$1
prog=$2
np=$3
victim=$4

if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi

out=$(mktemp "${TMPDIR:-/tmp}/hvd_stall.XXXXXX") || exit 1
# Where the survivors say they have their verdict (test_stall.c).
HVD_TEST_SYNC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hvd_stall_sync.XXXXXX") || exit 1
export HVD_TEST_SYNC_DIR
trap 'rm -f "$out"; rm -rf "$HVD_TEST_SYNC_DIR"' EXIT

HVD_TIMEOUT_SECONDS=3
export HVD_TIMEOUT_SECONDS
# The grace period lets the other survivors report after the first one has
# exited and hvdrun has sent them SIGTERM (which they ignore).
timeout 60 "$hvdrun" --grace-seconds 5 -np "$np" -- "$prog" \
    --victim "$victim" >"$out" 2>&1
rc=$?
cat "$out"

passes=$(grep -c 'PASS stall' "$out")
want=$((np - 1))
ok=1
if [ "$rc" -ne 3 ]; then
    echo "run_stall: FAIL: hvdrun exited $rc, expected 3"
    ok=0
fi
if [ "$passes" -ne "$want" ]; then
    echo "run_stall: FAIL: $passes 'PASS stall' lines, expected $want"
    ok=0
fi
if [ "$ok" -eq 1 ]; then
    echo "run_stall: PASS"
    exit 0
fi
exit 1
