#!/bin/sh
# hvdrun's own behaviour, with shell programs as ranks.
# Usage: run_hvdrun.sh HVDRUN
set -u
hvdrun=$1
fails=0

check() { # name expected actual
    if [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        echo "FAIL $1: expected '$2', got '$3'"
        fails=$((fails + 1))
    fi
}

out=$("$hvdrun" --version); check "--version" "hvdrun (hvd) 0.1.0" "$out"
"$hvdrun" --help >/dev/null; check "--help exits 0" 0 $?
"$hvdrun" --bogus true 2>/dev/null; check "unknown option exits 2" 2 $?
"$hvdrun" -np 2 2>/dev/null; check "missing program exits 2" 2 $?

out=$(timeout 30 "$hvdrun" -np 3 sh -c 'echo "hi $HVD_RANK of $HVD_SIZE"' | sort)
check "prefixed lines" "[0] hi 0 of 3
[1] hi 1 of 3
[2] hi 2 of 3" "$out"

out=$(timeout 30 "$hvdrun" --no-prefix -np 2 sh -c 'echo plain' | sort | uniq -c | tr -s ' ')
check "--no-prefix" " 2 plain" "$out"

out=$(timeout 30 "$hvdrun" -np 2 sh -c 'printf "no newline"' | sort)
check "partial last line" "[0] no newline
[1] no newline" "$out"

out=$(timeout 30 "$hvdrun" -np 2 -x HVD_TEST_VAR=42 sh -c 'echo $HVD_TEST_VAR' | sort -u)
check "-x NAME=VALUE" "[0] 42
[1] 42" "$out"

# Files the ranks and this script wait for (bounded polls), not sleeps.
sync=$(mktemp -d)
trap 'rm -rf "$sync"' EXIT
# await FILE...: waits up to 30 s for every FILE to exist.
await() {
    for f in "$@"; do
        i=0
        while [ ! -e "$f" ] && [ $i -lt 300 ]; do
            sleep 0.1
            i=$((i + 1))
        done
    done
}

# A failing rank: its status is hvdrun's, and the sibling is stopped
# (it would otherwise sleep for 100 s). Rank 1 fails only once rank 0
# has written its pid, so the sibling is surely running by then.
timeout 60 "$hvdrun" --grace-seconds 1 -np 2 -x HVD_TEST_SYNC="$sync" \
    sh -c 'if [ $HVD_RANK = 1 ]; then
               i=0; while [ ! -s "$HVD_TEST_SYNC/sibling" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
               exit 5
           fi
           echo $$ >"$HVD_TEST_SYNC/sibling.tmp" && mv "$HVD_TEST_SYNC/sibling.tmp" "$HVD_TEST_SYNC/sibling"
           exec sleep 100' 2>/dev/null
check "failing rank's status" 5 $?
sibling=$(cat "$sync/sibling" 2>/dev/null)
check "sibling started" 1 "$([ -n "$sibling" ] && echo 1 || echo 0)"
check "sibling stopped" 1 "$([ -n "$sibling" ] && ! kill -0 "$sibling" 2>/dev/null && echo 1 || echo 0)"

timeout 60 "$hvdrun" -np 2 sh -c 'kill -9 $$' 2>/dev/null
check "killed rank gives 128+9" 137 $?

timeout 60 "$hvdrun" -np 1 /nonexistent/program 2>/dev/null
check "program not found gives 127" 127 $?

msg=$(timeout 60 "$hvdrun" -np 2 sh -c 'exit $((HVD_RANK * 3))' 2>&1 >/dev/null)
case $msg in
*"rank 1"*"exited with status 3"*) check "failure message" ok ok ;;
*) check "failure message" "rank 1 ... exited with status 3" "$msg" ;;
esac

# SIGTERM to hvdrun reaches the ranks and hvdrun exits 128+15 (sent once
# both ranks have started).
timeout 60 "$hvdrun" -np 2 -x HVD_TEST_SYNC="$sync" \
    sh -c 'touch "$HVD_TEST_SYNC/term.$HVD_RANK"; exec sleep 100' &
pid=$!
await "$sync/term.0" "$sync/term.1"
kill -TERM $pid
wait $pid
check "SIGTERM forwarded" 143 $?

# HOROVOD_RANK and friends, as horovodrun's Gloo mode sets them (Horovod's
# code then expects to init again after shutdown, which hvd does).
out=$(timeout 30 "$hvdrun" -np 1 sh -c \
    'echo $HOROVOD_RANK/$HOROVOD_SIZE/$HOROVOD_LOCAL_SIZE/$HOROVOD_CROSS_SIZE')
check "HOROVOD_RANK and friends" "[0] 0/1/1/1" "$out"

# --config-file: horovodrun's YAML keys become HVD_* variables; hvdrun's
# environment and -x win over it; a bad key or value is refused by name.
cfg=$(mktemp)
trap 'rm -f "$cfg"; rm -rf "$sync"' EXIT
cat >"$cfg" <<'YAML'
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2
  cache_capacity: 512
  hierarchical_allreduce: true
timeline:
  filename: /tmp/hvd-config-test.json
  mark_cycles: true
stall_check:
  warning_time_seconds: 30
  shutdown_time_seconds: 90
logging:
  level: FATAL
YAML
vars='echo $HVD_FUSION_THRESHOLD $HVD_CYCLE_TIME_MS $HVD_CACHE_CAPACITY $HVD_ALGORITHM $HVD_TIMELINE $HVD_TIMELINE_MARK_CYCLES $HVD_STALL_CHECK_SECONDS $HVD_STALL_SHUTDOWN_SECONDS $HVD_LOG_LEVEL'
out=$(env -u HVD_LOG_LEVEL timeout 30 "$hvdrun" --config-file "$cfg" -np 1 sh -c "$vars")
check "--config-file" "[0] 33554432 2 512 hier /tmp/hvd-config-test.json 1 30 90 error" "$out"
out=$(HOROVOD_CACHE_CAPACITY=7 timeout 30 "$hvdrun" --config-file "$cfg" -np 1 \
    -x HVD_CYCLE_TIME_MS=9 sh -c 'echo ${HVD_CACHE_CAPACITY:-unset} $HOROVOD_CACHE_CAPACITY $HVD_CYCLE_TIME_MS')
check "--config-file below the environment and -x" "[0] unset 7 9" "$out"
printf 'stall_check:\n  enabled: false\n' >"$cfg"
out=$(timeout 30 "$hvdrun" --config-file "$cfg" -np 1 sh -c 'echo $HVD_STALL_CHECK_SECONDS')
check "--config-file stall_check.enabled false" "[0] 0" "$out"
printf 'params:\n  fusion_treshold_mb: 3\n' >"$cfg"
msg=$(timeout 30 "$hvdrun" --config-file "$cfg" -np 1 true 2>&1)
check "--config-file unknown key exits 1" 1 $?
check "--config-file unknown key named" "hvdrun: --config-file $cfg: params.fusion_treshold_mb: not a key of horovodrun's configuration file" "$msg"
printf 'params:\n  cache_capacity: lots\n' >"$cfg"
msg=$(timeout 30 "$hvdrun" --config-file "$cfg" -np 1 true 2>&1)
check "--config-file bad value named" "hvdrun: --config-file $cfg: params.cache_capacity: 'lots' is not a whole number of entries" "$msg"
# --mpi passes the file's variables to mpirun's ranks (-x).
if command -v mpirun >/dev/null 2>&1; then
    printf 'params:\n  cache_capacity: 64\n' >"$cfg"
    out=$(env -u HVD_CACHE_CAPACITY timeout 60 "$hvdrun" --mpi --config-file "$cfg" -np 1 sh -c 'echo $HVD_CACHE_CAPACITY' 2>/dev/null)
    check "--mpi --config-file" "64" "$out"
fi
msg=$(timeout 30 "$hvdrun" --config-file /nonexistent.yaml -np 1 true 2>&1)
check "--config-file missing file" "hvdrun: --config-file /nonexistent.yaml: cannot open it: No such file or directory" "$msg"

[ $fails -eq 0 ] && echo "run_hvdrun: PASS" && exit 0
echo "run_hvdrun: $fails FAILED"
exit 1
