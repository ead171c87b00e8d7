#!/bin/sh
# hvdrun's elastic policy (tools/hvdrun/elastic.c), with shell programs as
# workers: they never join the rendezvous, so only hvdrun's side is tested
# (worker ids, environment, replacement, blacklist, discovery, the end of
# the job). Every run is bounded by timeout; no check is about timings.
# Usage: run_elastic_hvdrun.sh HVDRUN
set -u
hvdrun=$1
fails=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

check() { # name expected actual
    if [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        echo "FAIL $1: expected '$2', got '$3'"
        fails=$((fails + 1))
    fi
}

contains() { # name text pattern
    case $2 in
    *"$3"*) echo "ok   $1" ;;
    *)
        echo "FAIL $1: no '$3' in:"
        printf '%s\n' "$2" | sed 's/^/    /'
        fails=$((fails + 1))
        ;;
    esac
}

# A worker's wait, up to 30 s, for a line in hvdrun's messages ($dir/err).
await='await() { i=0; while ! grep -q "$1" '"$dir"'/err && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done; }; '

# Usage errors.
"$hvdrun" --min-np 3 --max-np 2 true 2>/dev/null
check "--min-np above --max-np is a usage error" 2 $?
"$hvdrun" -np 1 --min-np 2 true 2>/dev/null
check "-np below --min-np is a usage error" 2 $?
"$hvdrun" -np 3 --max-np 2 true 2>/dev/null
check "-np above --max-np is a usage error" 2 $?
"$hvdrun" -np 2 --reset-limit 1 true 2>/dev/null
check "--reset-limit without an elastic job is a usage error" 2 $?
"$hvdrun" --min-np 1 --blacklist-cooldown-range 5 1 true 2>/dev/null
check "cooldown MIN above MAX is a usage error" 2 $?
"$hvdrun" --min-np 1 -x HVD_ELASTIC_WORKER=3 true 2>/dev/null
check "-x of an elastic variable is a usage error" 2 $?
msg=$(timeout 30 "$hvdrun" --host-discovery-script 'echo broken >&2; exit 3' \
    true 2>&1)
check "a failing discovery script at the start exits 1" 1 $?
contains "its message is shown" "$msg" "broken"

# (1) The environment of a worker.
out=$(timeout 30 "$hvdrun" --min-np 2 -np 2 sh -c \
    'echo "$HVD_ELASTIC $HVD_ELASTIC_WORKER $HVD_HOSTNAME ${HVD_RANK-unset}" \
          "${HVD_SIZE-unset} $HVD_ELASTIC_TIMEOUT_SECONDS"' 2>/dev/null | sort)
check "worker environment" "[w0] 1 0 localhost unset unset 1210
[w1] 1 1 localhost unset unset 1210" "$out"
out=$(timeout 30 "$hvdrun" --min-np 1 -np 1 --elastic-timeout 7 sh -c \
    'test -n "$HVD_SECRET" && test -n "$HVD_JOB_ID" &&
     test -n "$HVD_RENDEZVOUS_ADDR" && test -n "$HVD_RENDEZVOUS_PORT" &&
     echo "rdv ok $HVD_ELASTIC_TIMEOUT_SECONDS"' 2>/dev/null)
check "rendezvous variables and --elastic-timeout" "[w0] rdv ok 24" "$out"

# (6) A worker exiting 0 ends the job with 0, the others included.
# The other worker exits 0 once hvdrun has said the job is finishing
# (so surely after worker 0's success).
timeout 60 "$hvdrun" --min-np 1 -np 2 sh -c "$await"'
    if [ "$HVD_ELASTIC_WORKER" = 0 ]; then exit 0; fi
    await "the job is finishing"' 2>"$dir/err"
check "a worker exiting 0 ends the job with 0" 0 $?
timeout 60 "$hvdrun" --min-np 1 -np 2 sh -c "$await"'
    if [ "$HVD_ELASTIC_WORKER" = 0 ]; then exit 0; fi
    await "the job is finishing"; exit 6' 2>"$dir/err"
check "a failure after the success gives its status" 6 $?

# (2) A failed worker: by default its slot is not used again and the job
# goes on smaller; with --blacklist-cooldown-range 0 0 it is replaced.
out=$(timeout 60 "$hvdrun" --min-np 1 -np 2 --grace-seconds 1 sh -c "$await"'
     echo "start $HVD_ELASTIC_WORKER"
     if [ "$HVD_ELASTIC_WORKER" = 1 ]; then exit 3; fi
     await "worker 1 on"; echo "done $HVD_ELASTIC_WORKER"' 2>"$dir/err")
rc=$?
check "default: the job goes on smaller and ends 0" 0 $rc
check "default: the failed worker is not replaced" "[w0] done 0
[w0] start 0
[w1] start 1" "$(printf '%s\n' "$out" | sort)"
contains "default: the failure is said" "$(cat "$dir/err")" \
    "worker 1 on localhost exited with status 3; its slot is not used again"

out=$(timeout 60 "$hvdrun" --min-np 1 -np 2 --blacklist-cooldown-range 0 0 \
    --host-failures 100 sh -c \
    'if [ "$HVD_ELASTIC_WORKER" = 1 ]; then exit 3; fi
     if [ "$HVD_ELASTIC_WORKER" = 0 ]; then
         i=0
         while [ ! -f '"$dir"'/replaced ] && [ $i -lt 300 ]; do
             sleep 0.1; i=$((i + 1))
         done
     fi
     if [ "$HVD_ELASTIC_WORKER" = 2 ]; then : >'"$dir"'/replaced; fi
     echo "done $HVD_ELASTIC_WORKER"' 2>"$dir/err")
rc=$?
check "cooldown 0 0: ends 0" 0 $rc
check "cooldown 0 0: worker 2 replaces worker 1" "[w0] done 0
[w2] done 2" "$(printf '%s\n' "$out" | sort)"
contains "cooldown 0 0: said" "$(cat "$dir/err")" \
    "its slot is free again in 0 s"

# (3) A flapping host: two names of this machine from a discovery script;
# the workers on 127.0.0.1 fail. After --host-failures 2 it is
# blacklisted and nothing more starts there: the localhost workers go on
# until the discovery script has run twice more after the blacklisting
# (each run adds a line to $dir/runs; the first of the two may still be
# read, the second starts only once it was), then finish.
printf 'localhost:2\n127.0.0.1:2\n' >"$dir/hosts"
printf '#!/bin/sh\necho run >>"%s/runs"\ncat "%s/hosts"\n' "$dir" "$dir" \
    >"$dir/discover"
chmod +x "$dir/discover"
runs='runs() { wc -l <'"$dir"'/runs 2>/dev/null || echo 0; }; '
out=$(timeout 60 "$hvdrun" --host-discovery-script "$dir/discover" \
    --min-np 1 --host-failures 2 --grace-seconds 1 sh -c "$await$runs"'
     echo "start $HVD_HOSTNAME"
     if [ "$HVD_HOSTNAME" = 127.0.0.1 ]; then exit 4; fi
     await "is blacklisted"
     want=$(($(runs) + 2)); i=0
     while [ "$(runs)" -lt $want ] && [ $i -lt 300 ]; do
         sleep 0.1; i=$((i + 1))
     done
     echo done' 2>"$dir/err")
rc=$?
check "flapping host: the job ends 0" 0 $rc
check "flapping host: two workers started there" 2 \
    "$(printf '%s\n' "$out" | grep -c 'start 127.0.0.1')"
check "flapping host: both localhost workers finished" 2 \
    "$(printf '%s\n' "$out" | grep -c '] done')"
contains "flapping host: blacklisted" "$(cat "$dir/err")" \
    "host 127.0.0.1 is blacklisted after 2 failed workers (--host-failures 2)"

# (4) Below --min-np for --elastic-timeout ends the job with status 1. The
# failed slot comes back only after 100 s.
timeout 60 "$hvdrun" --min-np 2 -np 2 --elastic-timeout 2 \
    --blacklist-cooldown-range 100 100 --grace-seconds 1 sh -c \
    'if [ "$HVD_ELASTIC_WORKER" = 1 ]; then exit 3; fi; sleep 50' \
    2>"$dir/err"
check "below --min-np: exit status 1" 1 $?
contains "below --min-np: said" "$(cat "$dir/err")" \
    "only 1 worker left, fewer than --min-np 2, for 2 s (--elastic-timeout): ending the job"
# No slot can ever come back: the job ends at once.
timeout 60 "$hvdrun" --min-np 2 -np 2 --grace-seconds 1 sh -c \
    'if [ "$HVD_ELASTIC_WORKER" = 1 ]; then exit 3; fi; sleep 50' \
    2>"$dir/err"
check "below --min-np, no slot left: exit status 1" 1 $?
contains "below --min-np, no slot left: said" "$(cat "$dir/err")" \
    "and no slot can come back: ending the job"

# (5) Discovery: a host added gets workers; removed, they are stopped.
# Workers run until $dir/stop exists (each loop bounded).
printf 'localhost:1\n' >"$dir/hosts"
rm -f "$dir/stop"
timeout 60 "$hvdrun" --host-discovery-script "$dir/discover" --min-np 1 \
    --grace-seconds 1 sh -c \
    'echo "start $HVD_HOSTNAME"; i=0
     while [ ! -f '"$dir"'/stop ] && [ $i -lt 400 ]; do
         sleep 0.1; i=$((i + 1))
     done
     echo "done $HVD_HOSTNAME"' >"$dir/out" 2>"$dir/err" &
pid=$!
wait_for() { # file pattern: up to 30 s
    i=0
    while ! grep -q "$2" "$1" 2>/dev/null && [ $i -lt 300 ]; do
        sleep 0.1
        i=$((i + 1))
    done
}
wait_for "$dir/out" "start localhost"
printf 'localhost:1\n127.0.0.1:2\n' >"$dir/hosts"
i=0
while [ "$(grep -c 'start 127.0.0.1' "$dir/out")" -lt 2 ] && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
printf 'localhost:1\n' >"$dir/hosts"
wait_for "$dir/err" "host 127.0.0.1 left the discovery output"
: >"$dir/stop"
wait $pid
check "discovery: the job ends 0" 0 $?
out=$(cat "$dir/out")
check "discovery: two workers started on the new host" 2 \
    "$(printf '%s\n' "$out" | grep -c '^\[w[12]\] start 127.0.0.1$')"
check "discovery: the stopped workers did not finish" 0 \
    "$(printf '%s\n' "$out" | grep -c 'done 127.0.0.1')"
contains "discovery: host joined" "$(cat "$dir/err")" \
    "host 127.0.0.1 (2 slots) joined the discovery output"
contains "discovery: host left" "$(cat "$dir/err")" \
    "host 127.0.0.1 left the discovery output: stopping its 2 workers"

# --timeout still ends an elastic job (124).
timeout 60 "$hvdrun" --min-np 1 -np 1 --timeout 1 --grace-seconds 1 \
    sleep 50 2>/dev/null
check "--timeout gives 124" 124 $?

if [ $fails -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all checks passed"
