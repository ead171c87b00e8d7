#!/bin/sh
# Strangers knock on a running job (intruder.py against test_intruder):
# they must be refused or dropped, each one logged by the server it tried,
# and the job's results must not change.
#
#   run_intruder.sh HVDRUN TEST_INTRUDER INTRUDER_PY
#
# A 3-rank job on 127.0.0.1. Its last rank holds back twice in hvd_init
# (see test_intruder.c): while it has not joined the rendezvous, the
# intruder attacks hvdrun's rendezvous port ("rdv"); while its data
# connections are not made, it attacks rank 0's data listener ("data"),
# and the listening sockets of hvdrun and the ranks are listed (ss): every
# one must be on 127.0.0.1, the interface chosen, none on a wildcard
# address. Once the job runs, the rendezvous is attacked again and the
# data port must be closed ("late"). Pass: every attack turned away, a
# server log line for each (by the attacker's port), and the job exits 0
# with every result exact. Exit status: 0 pass, 1 fail, 77 skip.
set -u

if [ $# -ne 3 ]; then
    echo "usage: $0 HVDRUN TEST_INTRUDER INTRUDER_PY" >&2
    exit 2
fi
hvdrun=$1
prog=$2
intruder=$3
for tool in timeout python3 ss pgrep; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "SKIP intruder: $tool is not installed"
        exit 77
    fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_intruder.XXXXXX") || exit 1
job=""
cleanup() {
    [ -n "$job" ] && kill "$job" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fail() {
    echo "run_intruder: FAIL: $*"
    [ -f "$dir/out" ] && { echo "--- the job's output"; cat "$dir/out"; }
    exit 1
}
wait_for() { # FILE: bounded 60 s
    n=0
    until [ -e "$1" ]; do
        n=$((n + 1))
        [ $n -gt 1200 ] && fail "timed out waiting for $(basename "$1")"
        kill -0 "$job" 2>/dev/null || fail "the job ended early"
        sleep 0.05
    done
}

: >"$dir/out"
timeout -k 5 120 "$hvdrun" --grace-seconds 2 -np 3 -- "$prog" --dir "$dir" \
    >"$dir/out" 2>&1 &
job=$!

fails=0
for stage in rdv data late; do
    if [ $stage = late ]; then
        n=0
        while [ "$(grep -c 'READY rank' "$dir/out")" -lt 3 ]; do
            n=$((n + 1))
            [ $n -gt 1200 ] && fail "the ranks did not all start"
            sleep 0.05
        done
    else
        wait_for "$dir/$stage.addr"
    fi
    if [ $stage = data ]; then
        # Every listening socket of hvdrun and its ranks, now that all of
        # them listen: on 127.0.0.1 only.
        hvdrun_pid=$(pgrep -P "$job" | head -n 1)
        pids="$hvdrun_pid $(pgrep -P "$hvdrun_pid" | tr '\n' ' ')"
        ss -ltnpH >"$dir/ss"
        mine=""
        for p in $pids; do
            mine="$mine$(grep "pid=$p," "$dir/ss" | awk '{ print $4 }')
"
        done
        mine=$(echo "$mine" | grep -v '^$')
        echo "run_intruder: the job's listening sockets:" $mine
        [ "$(echo "$mine" | wc -l)" -ge 4 ] ||
            fail "expected hvdrun's rendezvous and 3 data listeners in: $mine"
        if echo "$mine" | grep -v '^127\.0\.0\.1:' >/dev/null; then
            fail "a socket of the job listens beyond 127.0.0.1: $mine"
        fi
    fi
    echo "run_intruder: attacking ($stage)"
    python3 "$intruder" $stage "$dir" >"$dir/attacks.$stage" 2>&1 ||
        fails=$((fails + 1))
    cat "$dir/attacks.$stage"
done

wait $job
rc=$?
job=""
[ $rc -eq 0 ] || fail "the job exited $rc"
[ "$(grep -c 'PASS intruder rank' "$dir/out")" -eq 3 ] ||
    fail "not every rank printed PASS"
[ $fails -eq 0 ] || fail "an attack was not turned away (see FAIL above)"

# A log line for every attack that reached a server, found by its port.
missing=""
for port in $(cat "$dir"/attacks.* | awk '$1 == "ATTACK" && $2 != "closed-port" { print $3 }'); do
    grep -q "127\.0\.0\.1:$port[^0-9]" "$dir/out" || missing="$missing $port"
done
[ -z "$missing" ] || fail "no server log line for the attacks from ports$missing"
echo "run_intruder: server log lines:"
grep -E 'refused|dropped' "$dir/out" | sed 's/^/    /' | head -n 60
echo "run_intruder: PASS: $(cat "$dir"/attacks.* | grep -c '^ATTACK') attacks" \
    "turned away and logged, the job's results exact"
exit 0
