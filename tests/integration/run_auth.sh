#!/bin/sh
# Starts one rank with a wrong job secret and checks that it is refused.
#
#   run_auth.sh HVDRUN PROG NP INTRUDER
#
# Pass iff hvdrun exits 3 (the intruder's pass status), the intruder printed
# "PASS auth" and a line of another rank (a server's log; hvdrun prefixes
# each line with "[rank] ") says it "refused" the connection.
# Exit status: 0 pass, 1 fail, 77 skip.

if [ $# -ne 4 ]; then
    echo "usage: $0 HVDRUN PROG NP INTRUDER" >&2
    exit 1
fi
hvdrun=$1
prog=$2
np=$3
intruder=$4

if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi

out=$(mktemp "${TMPDIR:-/tmp}/hvd_auth.XXXXXX") || exit 1
# Where the intruder leaves its pid for the others (test_auth.c).
HVD_TEST_SYNC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hvd_auth_sync.XXXXXX") || exit 1
export HVD_TEST_SYNC_DIR
trap 'rm -f "$out"; rm -rf "$HVD_TEST_SYNC_DIR"' EXIT

# Bound hvd_init on the honest ranks, in case hvdrun does not end them.
HVD_START_TIMEOUT_SECONDS=${HVD_START_TIMEOUT_SECONDS:-20}
export HVD_START_TIMEOUT_SECONDS
timeout 60 "$hvdrun" -np "$np" -- "$prog" --intruder "$intruder" >"$out" 2>&1
rc=$?
cat "$out"

ok=1
if [ "$rc" -ne 3 ]; then
    echo "run_auth: FAIL: hvdrun exited $rc, expected 3"
    ok=0
fi
if ! grep -q 'PASS auth' "$out"; then
    echo "run_auth: FAIL: no 'PASS auth' line"
    ok=0
fi
if ! grep -v "^\[$intruder\] " "$out" | grep -q 'refused'; then
    echo "run_auth: FAIL: no server-side 'refused' log line"
    ok=0
fi
if [ "$ok" -eq 1 ]; then
    echo "run_auth: PASS"
    exit 0
fi
exit 1
