#!/bin/bash
# Elastic jobs end to end (docs/elastic.md): test_elastic under hvdrun's
# elastic mode while this script kills, adds and removes workers.
#
# Usage: run_elastic.sh HVDRUN TEST_ELASTIC CASE
#   kills    4 workers, 20 kill -9 at random points, each replaced; the
#            job ends when the script says so and every rank's result
#            equals a fault-free run's (checked by the workers); prints
#            the time from each kill to training again.
#   shrink   20 jobs of 4 workers, in each one killed (kill -9) at a
#            random point: no cooldown, so its slot is not used again and
#            the job goes on with 3 from the last commit (Horovod's
#            default); every rank's final state exact.
#   state-lost  2 workers, both killed at once, replacements allowed:
#            nobody holds the training state, so hvdrun ends the job at
#            once (no generation of new workers only, starting over).
#   min-np   3 workers, --min-np 3 and no replacement: one kill ends the
#            job with hvdrun's message and status 1.
#   grow     a discovery script: localhost:2, then 127.0.0.1:1 added (the
#            job grows to 3), then removed (back to 2).
#   laggard  3 workers, one stopped (SIGSTOP): the others time out on it
#            (HVD_TIMEOUT_SECONDS=3), rejoin, and after --elastic-timeout
#            hvdrun stops the one that did not; training goes on.
#   late-join  a discovery script adds a host while the 2 workers never
#            commit (so never reset): they are not stopped as laggards
#            after --elastic-timeout (they hold the only state), and when
#            they finish, the new worker still waiting to join is stopped
#            and the job exits 0.
#   no-server  a worker whose rendezvous is not there (hvdrun gone):
#            hvd_init fails once its join times out (1 s), with the
#            connect error, not after 64 joins nor as PEERS_CHANGED.
# Every wait is bounded; the job runs under timeout(1).
set -u

if [ $# -ne 3 ]; then
    echo "usage: $0 HVDRUN TEST_ELASTIC kills|min-np|grow" >&2
    exit 2
fi
hvdrun=$1
prog=$2
case_name=$3
dir=$(mktemp -d /tmp/hvd-elastic-$$.XXXXXX) || exit 1
out=$dir/out
job=
cleanup() {
    if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then
        kill -TERM "$job" 2>/dev/null
        # Up to 5 s for it to end on SIGTERM, then SIGKILL.
        local i=0
        while kill -0 "$job" 2>/dev/null && [ $i -lt 100 ]; do
            sleep 0.05
            i=$((i + 1))
        done
        kill -KILL "$job" 2>/dev/null
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

fail() {
    echo "FAIL elastic.$case_name: $*"
    echo "---- job output ----"
    tail -n 80 "$out"
    exit 1
}

now_ms() { date +%s%3N; }

# Waits (at most $2 s) until the output has more than $1 lines matching
# $3; 0 if it did.
wait_lines() {
    local have=$1 limit=$2 pattern=$3 n
    local end=$(($(date +%s) + limit))
    while [ "$(date +%s)" -le "$end" ]; do
        n=$(grep -c -- "$pattern" "$out" 2>/dev/null)
        [ "${n:-0}" -gt "$have" ] && return 0
        kill -0 "$job" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

count() { grep -c -- "$1" "$out" 2>/dev/null || true; }

# The job's live workers (hvdrun forks them directly).
workers() { pgrep -P "$job" -x "$(basename "$prog")"; }

start_job() { # hvdrun arguments...
    timeout -k 10 240 "$hvdrun" "$@" >"$out" 2>&1 &
    job=$!
    # timeout(1) forks hvdrun: find it, the workers' parent.
    local end=$(($(date +%s) + 10)) child
    while [ "$(date +%s)" -le "$end" ]; do
        child=$(pgrep -P "$job" -x hvdrun)
        if [ -n "$child" ]; then
            timeout_pid=$job
            job=$child
            return 0
        fi
        sleep 0.05
    done
    fail "hvdrun did not start"
}

finish_job() { # expected status
    local end=$(($(date +%s) + 120))
    while kill -0 "$job" 2>/dev/null && [ "$(date +%s)" -le "$end" ]; do
        sleep 0.1
    done
    wait "$timeout_pid"
    status=$?
    [ "$status" = "$1" ] || fail "hvdrun exited with $status, expected $1"
}

case $case_name in
kills)
    start_job -np 4 --min-np 2 --max-np 4 --elastic-timeout 60 \
        --blacklist-cooldown-range 0 0 --host-failures 1000 \
        -- "$prog" --stop-file "$dir/stop" --pace-us 2000 --commit 10
    wait_lines 3 60 "^\[w[0-9]*\] ELASTIC" || fail "the job did not start"
    times=()
    for k in $(seq 1 20); do
        sleep "0.$((RANDOM % 5 + 1))"
        mapfile -t pids < <(workers)
        [ "${#pids[@]}" -ge 2 ] || fail "kill $k: only ${#pids[@]} workers"
        victim=${pids[$((RANDOM % ${#pids[@]}))]}
        before=$(count "^\[w[0-9]*\] ELASTIC")
        t0=$(now_ms)
        kill -KILL "$victim"
        wait_lines "$before" 60 "^\[w[0-9]*\] ELASTIC" ||
            fail "kill $k (pid $victim): training did not resume"
        t1=$(now_ms)
        times+=($((t1 - t0)))
        echo "kill $k: pid $victim, training again after $((t1 - t0)) ms"
    done
    touch "$dir/stop"
    finish_job 0
    npass=$(count "^\[w[0-9]*\] PASS elastic")
    [ "$npass" -ge 2 ] || fail "$npass PASS lines"
    grep -q "^\[w[0-9]*\] FAIL" "$out" && fail "a worker failed"
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    median=$(echo "$sorted" | sed -n "$(((${#times[@]} + 1) / 2))p")
    worst=$(echo "$sorted" | tail -n 1)
    echo "kill to training again: median $median ms, worst $worst ms" \
        "(20 kills, 4 workers)"
    grep "PASS elastic" "$out"
    ;;
shrink)
    for k in $(seq 1 20); do
        out=$dir/out.$k
        rm -f "$dir/stop"
        start_job -np 4 --min-np 2 --max-np 4 --elastic-timeout 60 \
            -- "$prog" --stop-file "$dir/stop" --pace-us 2000 --commit 10
        wait_lines 3 60 "^\[w[0-9]*\] ELASTIC" ||
            fail "job $k did not start"
        sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
        mapfile -t pids < <(workers)
        kill -KILL "${pids[$((RANDOM % ${#pids[@]}))]}"
        wait_lines 2 60 "ELASTIC .* size 3 " ||
            fail "job $k did not go on with 3"
        touch "$dir/stop"
        finish_job 0
        npass=$(count "PASS elastic .* size 3 ")
        [ "$npass" -eq 3 ] || fail "job $k: $npass PASS lines of size 3"
        echo "job $k: $(grep -o "killed by SIGKILL; its slot is not used again" "$out"), went on with 3, $(grep -o "steps [0-9]*" "$out" | head -n 1), exact"
    done
    ;;
state-lost)
    start_job -np 2 --min-np 1 --max-np 2 --elastic-timeout 60 \
        --blacklist-cooldown-range 0 0 --host-failures 100 \
        -- "$prog" --stop-file "$dir/never" --pace-us 2000
    wait_lines 1 60 "^\[w[0-9]*\] ELASTIC" || fail "the job did not start"
    mapfile -t pids < <(workers)
    kill -KILL "${pids[@]}"
    finish_job 1
    grep -q "nobody holds the training state" "$out" ||
        fail "no message about the lost state"
    grep "nobody holds" "$out"
    ;;
min-np)
    start_job -np 3 --min-np 3 --elastic-timeout 3 \
        -- "$prog" --stop-file "$dir/never" --pace-us 2000
    wait_lines 2 60 "^\[w[0-9]*\] ELASTIC" || fail "the job did not start"
    mapfile -t pids < <(workers)
    kill -KILL "${pids[0]}"
    finish_job 1
    grep -q "fewer than --min-np" "$out" || fail "no --min-np message"
    grep "fewer than --min-np" "$out"
    ;;
grow)
    printf 'localhost:2\n' >"$dir/hosts"
    printf '#!/bin/sh\ncat %s\n' "$dir/hosts" >"$dir/discover.sh"
    chmod +x "$dir/discover.sh"
    start_job -np 2 --min-np 2 --max-np 3 --elastic-timeout 60 \
        --host-discovery-script "$dir/discover.sh" --discovery-interval 1 \
        -- "$prog" --stop-file "$dir/stop" --pace-us 2000 --commit 10
    wait_lines 1 60 "ELASTIC .* size 2 " || fail "the job did not start"
    printf 'localhost:2\n127.0.0.1:1\n' >"$dir/hosts"
    wait_lines 0 60 "ELASTIC .* size 3 " || fail "the job did not grow to 3"
    echo "grew to 3 workers"
    before=$(count "ELASTIC .* size 2 ")
    printf 'localhost:2\n' >"$dir/hosts"
    wait_lines "$before" 60 "ELASTIC .* size 2 " ||
        fail "the job did not shrink back to 2"
    echo "shrank to 2 workers"
    touch "$dir/stop"
    finish_job 0
    npass=$(count "PASS elastic .* size 2 ")
    [ "$npass" -eq 2 ] || fail "$npass PASS lines of size 2"
    grep "PASS elastic" "$out"
    ;;
laggard)
    HVD_TIMEOUT_SECONDS=3 start_job -np 3 --min-np 2 --max-np 3 \
        --elastic-timeout 3 \
        -- "$prog" --stop-file "$dir/stop" --pace-us 2000 --commit 10
    wait_lines 2 60 "^\[w[0-9]*\] ELASTIC" || fail "the job did not start"
    mapfile -t pids < <(workers)
    before=$(count "^\[w[0-9]*\] ELASTIC")
    kill -STOP "${pids[1]}"
    wait_lines "$before" 60 "^\[w[0-9]*\] ELASTIC" ||
        fail "training did not resume without the stopped worker"
    grep -q "did not rejoin within --elastic-timeout" "$out" ||
        fail "no message about the worker that did not rejoin"
    grep "did not rejoin" "$out"
    touch "$dir/stop"
    finish_job 0
    grep -q "^\[w[0-9]*\] PASS elastic" "$out" || fail "no PASS line"
    grep "PASS elastic" "$out"
    ;;
late-join)
    printf 'localhost:2\n' >"$dir/hosts"
    printf '#!/bin/sh\ncat %s\n' "$dir/hosts" >"$dir/discover.sh"
    chmod +x "$dir/discover.sh"
    start_job -np 2 --min-np 2 --max-np 3 --elastic-timeout 2 \
        --host-discovery-script "$dir/discover.sh" --discovery-interval 1 \
        -- "$prog" --stop-file "$dir/stop" --pace-us 2000 --commit 100000000
    wait_lines 1 60 "ELASTIC .* size 2 " || fail "the job did not start"
    printf 'localhost:2\n127.0.0.1:1\n' >"$dir/hosts"
    wait_lines 0 30 "127.0.0.1 (1 slot) joined" ||
        fail "the host was not added"
    mapfile -t members < <(workers)
    # The property is about hvdrun's clock: for three times
    # --elastic-timeout (past the twice at which it would end the job) the
    # members are neither stopped as laggards nor gone. A bounded poll
    # that fails as soon as either happens; at its end both members must
    # still be running (they never commit, so print nothing more).
    end=$(($(now_ms) + 6000))
    while [ "$(now_ms)" -lt "$end" ]; do
        grep -q "did not rejoin" "$out" &&
            fail "the training members were stopped as laggards"
        kill -0 "$job" 2>/dev/null || fail "the job ended"
        sleep 0.1
    done
    grep -q "did not rejoin" "$out" &&
        fail "the training members were stopped as laggards"
    for m in "${members[@]}"; do
        kill -0 "$m" 2>/dev/null || fail "member $m is gone"
    done
    touch "$dir/stop"
    finish_job 0
    npass=$(count "PASS elastic .* size 2 ")
    [ "$npass" -eq 2 ] || fail "$npass PASS lines of size 2"
    grep "PASS elastic" "$out"
    grep -q "stopping worker 2 " "$out" || fail "worker 2 was not stopped"
    grep "stopping worker 2 " "$out"
    ;;
no-server)
    # A port nobody listens on: bind one, then let it go.
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    t0=$(now_ms)
    HVD_ELASTIC=1 HVD_ELASTIC_WORKER=0 HVD_ELASTIC_TIMEOUT_SECONDS=1 \
        HVD_RENDEZVOUS_ADDR=127.0.0.1 HVD_RENDEZVOUS_PORT=$port \
        HVD_SECRET=elastic-test HVD_JOB_ID=00112233445566778899aabbccddeeff \
        timeout -k 5 30 "$prog" --stop-file "$dir/never" >"$out" 2>&1
    status=$?
    t1=$(now_ms)
    [ "$status" = 1 ] || fail "the worker exited with $status, expected 1"
    [ $((t1 - t0)) -lt 10000 ] || fail "hvd_init took $((t1 - t0)) ms"
    grep -q "FAIL elastic worker 0: hvd_init: HVD_ERR_TRANSPORT" "$out" ||
        fail "no HVD_ERR_TRANSPORT from hvd_init"
    grep "FAIL elastic" "$out"
    echo "hvd_init failed after $((t1 - t0)) ms"
    ;;
*)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
echo "PASS elastic.$case_name"
