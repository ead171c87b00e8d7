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

# A failing rank: its status is hvdrun's, and the sibling is stopped
# (it would otherwise sleep for 100 s).
start=$(date +%s)
timeout 60 "$hvdrun" --grace-seconds 1 -np 2 \
    sh -c 'if [ $HVD_RANK = 1 ]; then exit 5; fi; sleep 100' 2>/dev/null
check "failing rank's status" 5 $?
check "sibling stopped quickly" 1 $(( $(date +%s) - start < 10 ))

timeout 60 "$hvdrun" -np 2 sh -c 'kill -9 $$' 2>/dev/null
check "killed rank gives 128+9" 137 $?

timeout 60 "$hvdrun" -np 1 /nonexistent/program 2>/dev/null
check "program not found gives 127" 127 $?

msg=$(timeout 60 "$hvdrun" -np 2 sh -c 'exit $((HVD_RANK * 3))' 2>&1 >/dev/null)
case $msg in
*"rank 1"*"exited with status 3"*) check "failure message" ok ok ;;
*) check "failure message" "rank 1 ... exited with status 3" "$msg" ;;
esac

# SIGTERM to hvdrun reaches the ranks and hvdrun exits 128+15.
timeout 60 "$hvdrun" -np 2 sleep 100 &
pid=$!
sleep 1
kill -TERM $pid
wait $pid
check "SIGTERM forwarded" 143 $?

[ $fails -eq 0 ] && echo "run_hvdrun: PASS" && exit 0
echo "run_hvdrun: $fails FAILED"
exit 1
