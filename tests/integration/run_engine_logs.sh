#!/bin/sh
# Runs one subtest of test_engine with the environment it needs and checks
# what it logs.
#
#   run_engine_logs.sh HVDRUN TEST_ENGINE NP SUBTEST
#
# Every run must exit 0 with NP "PASS engine SUBTEST" lines. Besides:
#   fusion          run with HVD_FUSION_THRESHOLD=0 and with the default;
#                   rank 0's CHECKSUM lines must be the same.
#   cache           HVD_LOG_LEVEL=debug: some "cycle N: K cached" line has
#                   K > 0; with HVD_CACHE_CAPACITY=0 there are such lines
#                   and every K is 0; HVD_CACHE_CAPACITY=4 (evictions) passes.
#   stall           HVD_STALL_CHECK_SECONDS=1: rank 0 warns
#                   "stall: 'late' waits ... for rank(s) 1".
#   stall_cached    the same for a cached name ('late.cached').
#   stall_shutdown  HVD_STALL_SHUTDOWN_SECONDS=2, HVD_STALL_CHECK_SECONDS=1.
#   timeline        HVD_TIMELINE=file, then check_timeline.py on the file.
#   callback        completion through hvd_on_done (no extra checks).
# The runs of one call take 120 s at most in all. Exit status: 0 pass,
# 1 fail, 77 skip. The output of every run is printed on failure.

if [ $# -ne 4 ]; then
    echo "usage: $0 HVDRUN TEST_ENGINE NP SUBTEST" >&2
    exit 1
fi
hvdrun=$1
prog=$2
np=$3
subtest=$4
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd) || exit 1

if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi
if [ "$subtest" = timeline ] && ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP: python3 is not installed (check_timeline.py needs it)"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hvd_engine.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

# Only what a run sets below may change the engine's behaviour.
unset HVD_FUSION_THRESHOLD HVD_CACHE_CAPACITY HVD_LOG_LEVEL HVD_TIMELINE \
    HVD_STALL_CHECK_SECONDS HVD_STALL_SHUTDOWN_SECONDS HVD_CYCLE_TIME_MS

ok=1

fail() {
    echo "run_engine_logs: FAIL: $*"
    ok=0
}

# run LOG SECONDS [NAME=VALUE...]: runs the subtest with those variables,
# output in $tmp/LOG; checks the exit status and the PASS lines.
run() {
    name=$1
    log=$tmp/$1
    limit=$2
    shift 2
    label="$name${*:+ ($*)}"
    # HVD_TEST_LOG: the ranks of the stall subtests wait for lines in it.
    env HVD_TEST_LOG="$log" "$@" timeout "$limit" "$hvdrun" -np "$np" -- \
        "$prog" "$subtest" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 77 ]; then
        cat "$log"
        echo "run_engine_logs: SKIP ($name: the program exited 77)"
        exit 77
    fi
    if [ "$rc" -ne 0 ]; then
        fail "$label: hvdrun exited $rc"
    fi
    passes=$(grep -c "PASS engine $subtest rank " "$log")
    if [ "$passes" -ne "$np" ]; then
        fail "$label: $passes 'PASS engine $subtest' lines, expected $np"
    fi
}

# cached_counts LOG: the K of every "cycle N: K cached" line, one a line.
cached_counts() {
    sed -n 's/.*cycle [0-9]*: \([0-9]*\) cached.*/\1/p' "$1"
}

case $subtest in
order | threads | mismatch | join | callback | left)
    run run.log 120
    ;;
fusion)
    run unfused.log 60 HVD_FUSION_THRESHOLD=0
    run fused.log 60
    grep '^\[0\] CHECKSUM ' "$tmp/unfused.log" >"$tmp/unfused.sum"
    grep '^\[0\] CHECKSUM ' "$tmp/fused.log" >"$tmp/fused.sum"
    n=$(wc -l <"$tmp/fused.sum")
    if [ "$n" -eq 0 ]; then
        fail "no CHECKSUM lines from rank 0"
    elif ! diff "$tmp/unfused.sum" "$tmp/fused.sum"; then
        fail "checksums differ between HVD_FUSION_THRESHOLD=0 (<) and the default (>)"
    else
        echo "run_engine_logs: $n checksums agree, fused and not"
    fi
    ;;
cache)
    run debug.log 40 HVD_LOG_LEVEL=debug
    run nocache.log 40 HVD_LOG_LEVEL=debug HVD_CACHE_CAPACITY=0
    run evict.log 40 HVD_CACHE_CAPACITY=4
    cached_counts "$tmp/debug.log" >"$tmp/debug.counts"
    cached_counts "$tmp/nocache.log" >"$tmp/nocache.counts"
    if ! awk '$1 > 0 { found = 1 } END { exit !found }' "$tmp/debug.counts"; then
        fail "HVD_LOG_LEVEL=debug: no 'cycle N: K cached' line with K > 0"
    fi
    if [ ! -s "$tmp/nocache.counts" ]; then
        fail "HVD_CACHE_CAPACITY=0: no 'cycle N: K cached' line at all"
    elif ! awk '$1 != 0 { bad = 1 } END { exit bad }' "$tmp/nocache.counts"; then
        fail "HVD_CACHE_CAPACITY=0: a 'cycle N: K cached' line has K > 0"
    fi
    echo "run_engine_logs: cycles with cached operations:" \
        "$(awk '$1 > 0' "$tmp/debug.counts" | wc -l) of" \
        "$(wc -l <"$tmp/debug.counts") (default capacity)," \
        "$(awk '$1 > 0' "$tmp/nocache.counts" | wc -l) of" \
        "$(wc -l <"$tmp/nocache.counts") (HVD_CACHE_CAPACITY=0)"
    ;;
stall)
    run run.log 120 HVD_STALL_CHECK_SECONDS=1
    # The list of missing ranks must be exactly "1".
    if ! grep -E "^\[0\] .*stall: 'late' waits .*for rank\(s\) 1([^0-9,]|$)" \
        "$tmp/run.log" >/dev/null; then
        fail "rank 0 did not warn \"stall: 'late' waits ... for rank(s) 1\""
    fi
    ;;
stall_cached)
    run run.log 120 HVD_STALL_CHECK_SECONDS=1
    if ! grep -E "^\[0\] .*stall: 'late.cached' waits .*for rank\(s\) 1([^0-9,]|$)" \
        "$tmp/run.log" >/dev/null; then
        fail "rank 0 did not warn \"stall: 'late.cached' waits ... for rank(s) 1\""
    fi
    ;;
stall_shutdown)
    run run.log 120 HVD_STALL_CHECK_SECONDS=1 HVD_STALL_SHUTDOWN_SECONDS=2
    ;;
timeline)
    run run.log 120 HVD_TIMELINE="$tmp/tl.json"
    if [ ! -f "$tmp/tl.json" ]; then
        fail "HVD_TIMELINE=$tmp/tl.json: no file written"
    elif ! python3 "$here/check_timeline.py" "$tmp/tl.json" >"$tmp/check.log" 2>&1; then
        fail "check_timeline.py found problems"
    else
        cat "$tmp/check.log"
    fi
    ;;
*)
    echo "run_engine_logs: unknown subtest '$subtest'" >&2
    exit 1
    ;;
esac

if [ "$ok" -eq 1 ]; then
    echo "run_engine_logs: PASS engine $subtest np $np"
    exit 0
fi
for log in "$tmp"/*.log; do
    [ -f "$log" ] || continue
    echo "===== $(basename "$log") ====="
    cat "$log"
done
exit 1
