#!/bin/sh
# The collectives on a host whose cores other processes hold: one busy
# loop per core runs beside 2 ranks, over shared memory and over TCP. The
# waits then pause and sleep instead of yielding the core
# (transport/base/hostload.h); every result must still be exact. Times
# are not asserted (docs/benchmarks.md has them).
#
#   run_busy_host.sh HVDRUN TEST_COLLECTIVES
set -u
hvdrun=$1
prog=$2
ncpu=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
hogs=""
trap 'for p in $hogs; do kill "$p" 2>/dev/null; done' EXIT INT TERM
for _ in $(seq 1 "$ncpu"); do
    # Each loop ends by itself after 5 minutes should the trap not run.
    timeout 300 sh -c 'while :; do :; done' &
    hogs="$hogs $!"
done
sleep 0.2
echo "run_busy_host: $ncpu busy loops beside the ranks; /proc/loadavg: $(cat /proc/loadavg)"
rc=0
for transport in shm tcp; do
    if ! HVD_TRANSPORT=$transport HVD_START_TIMEOUT_SECONDS=60 \
        timeout 240 "$hvdrun" -np 2 -- "$prog" --max-count 65536; then
        echo "run_busy_host: FAIL over $transport"
        rc=1
    fi
done
[ $rc -eq 0 ] && echo "run_busy_host: PASS"
exit $rc
