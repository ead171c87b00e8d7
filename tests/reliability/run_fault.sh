#!/bin/sh
# Hurts one rank of a running job from outside, again and again, and checks
# that every other rank learns it in time, naming it.
#
#   run_fault.sh MODE LAUNCHER PROG NP REPS
#
# MODE      kill: SIGKILL the victim; survivors must get HVD_ERR_PEER_LOST
#           naming it within 5 s.
#           stop: SIGSTOP the victim (HVD_TIMEOUT_SECONDS=5); survivors must
#           get HVD_ERR_TIMEOUT naming it within 10 s.
# LAUNCHER  the path of hvdrun, or "mpirun ARGS..." (one word list): the
#           job is then started by Open MPI with HVD_TRANSPORT=tcp.
# PROG      test_fault.
#
# Each repetition starts a job of NP ranks, waits for every rank's READY
# line, waits a random 0-1 s more, picks a random victim and strikes.
# It passes when NP-1 ranks print "PASS fault", each DETECT line comes
# within the limit of the strike, the launcher exits non-zero within 10 s
# of it, and no process of the job and no /dev/shm entry is left behind
# (as root the job runs in a mount namespace of its own with a private
# /dev/shm, which must be empty at the end). HVD_FAULT_SEED fixes the
# random choices (the seed is printed). Worst-case detection and exit times
# are printed at the end. Exit status: 0 pass, 1 fail, 77 skip.
set -u

if [ "${1:-}" = "--in-namespace" ]; then
    # Re-executed by the code below inside `unshare --mount`: a private
    # /dev/shm for the job.
    shift
    mount -t tmpfs -o size=64m hvd-fault-shm /dev/shm || exit 1
    HVD_FAULT_PRIVATE_SHM=1
    export HVD_FAULT_PRIVATE_SHM
elif [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null 2>&1 &&
    unshare --mount --propagation private true 2>/dev/null; then
    exec unshare --mount --propagation private sh "$0" --in-namespace "$@"
fi

if [ $# -ne 5 ]; then
    echo "usage: $0 kill|stop LAUNCHER PROG NP REPS" >&2
    exit 2
fi
mode=$1
launcher=$2
prog=$3
np=$4
reps=$5

for tool in timeout awk date sleep; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "SKIP: $tool is not installed"
        exit 77
    fi
done

case $mode in
kill)
    sig=KILL
    expect=peer_lost
    detect_limit=5
    linger=200
    ;;
stop)
    sig=STOP
    expect=timeout
    detect_limit=10
    linger=1000
    HVD_TIMEOUT_SECONDS=5
    export HVD_TIMEOUT_SECONDS
    ;;
*)
    echo "run_fault: MODE must be kill or stop" >&2
    exit 2
    ;;
esac
exit_limit=10
case $launcher in
mpirun* | */mpirun* | */mpiexec* | mpiexec*) kind=mpirun ;;
*) kind=hvdrun ;;
esac

seed=${HVD_FAULT_SEED:-$(($$ + $(date +%s)))}
dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_fault.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
echo "run_fault: $mode under $kind, np $np, $reps repetitions, HVD_FAULT_SEED=$seed"

# The victims and moments, drawn up front from the seed.
awk -v seed="$seed" -v reps="$reps" -v np="$np" 'BEGIN {
    srand(seed)
    for (i = 0; i < reps; i++)
        printf "%d %.3f\n", int(rand() * np), rand()
}' >"$dir/plan"

shm_before() {
    ls -A /dev/shm 2>/dev/null | sort >"$dir/shm.before"
}
# New /dev/shm entries: with a private /dev/shm, any entry; else those
# with "hvd" in the name (other jobs of the machine may come and go).
shm_left() {
    if [ "${HVD_FAULT_PRIVATE_SHM:-0}" = 1 ]; then
        ls -A /dev/shm 2>/dev/null
    else
        ls -A /dev/shm 2>/dev/null | sort | comm -13 "$dir/shm.before" - |
            grep -i hvd
    fi
}

# The pids among $@ of processes still running (zombies do not count: the
# job's ranks may be reparented to an init that reaps them late).
alive() {
    for p in "$@"; do
        if [ -r "/proc/$p/stat" ] &&
            [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
            printf ' %s' "$p"
        fi
    done
}

fails=0
worst_detect=0
worst_exit=0
rep=0
while read -r victim delay; do
    rep=$((rep + 1))
    out=$dir/out.$rep
    : >"$out"
    # Where the survivors say they have their verdict (test_fault.c).
    HVD_TEST_SYNC_DIR=$dir/sync.$rep
    export HVD_TEST_SYNC_DIR
    mkdir -p "$HVD_TEST_SYNC_DIR"
    shm_before
    if [ $kind = hvdrun ]; then
        timeout -k 5 60 "$launcher" --grace-seconds 8 -np "$np" -- "$prog" \
            --victim "$victim" --expect $expect --linger-ms $linger --threads 2 \
            >"$out" 2>&1 &
    else
        # shellcheck disable=SC2086
        timeout -k 5 60 $launcher -np "$np" -x HVD_TRANSPORT=tcp \
            ${HVD_TIMEOUT_SECONDS:+-x HVD_TIMEOUT_SECONDS} -x HVD_TEST_SYNC_DIR \
            "$prog" \
            --victim "$victim" --expect $expect --linger-ms $linger --threads 2 \
            >"$out" 2>&1 &
    fi
    job=$!

    # Every rank's READY line (bounded: 30 s).
    n=0
    while [ "$(grep -c 'READY rank' "$out")" -lt "$np" ]; do
        n=$((n + 1))
        if [ $n -gt 600 ] || ! kill -0 $job 2>/dev/null; then
            break
        fi
        sleep 0.05
    done
    pids=$(sed -n 's/.*READY rank [0-9]* pid \([0-9]*\).*/\1/p' "$out")
    vpid=$(sed -n "s/.*READY rank $victim pid \([0-9]*\).*/\1/p" "$out")
    if [ -z "$vpid" ] || [ "$(echo "$pids" | wc -w)" -ne "$np" ]; then
        echo "run_fault: FAIL rep $rep: the ranks did not all start"
        kill $job 2>/dev/null
        wait $job
        cat "$out"
        fails=$((fails + 1))
        continue
    fi
    sleep "$delay"
    t_fault=$(date +%s.%N)
    kill -$sig "$vpid"
    wait $job
    rc=$?
    t_end=$(date +%s.%N)

    # Survivors' verdicts and detection times.
    passes=$(grep -c 'PASS fault rank' "$out")
    detect=$(grep 'DETECT rank' "$out" | grep -v "DETECT rank $victim " |
        sed -n 's/.*wall \([0-9.]*\).*/\1/p' |
        awk -v t="$t_fault" 'BEGIN { m = -1 } { d = $1 - t; if (d > m) m = d }
            END { printf "%.3f", m }')
    exit_s=$(awk -v a="$t_fault" -v b="$t_end" 'BEGIN { printf "%.3f", b - a }')
    ok=1
    why=""
    if [ "$passes" -ne $((np - 1)) ]; then
        ok=0
        why="$why; $passes PASS lines, expected $((np - 1))"
    fi
    if [ "$(grep 'DETECT rank' "$out" | grep -vc "DETECT rank $victim ")" -ne $((np - 1)) ]; then
        ok=0
        why="$why; not every survivor reported"
    elif awk -v d="$detect" -v l=$detect_limit 'BEGIN { exit !(d < 0 || d > l) }'; then
        ok=0
        why="$why; detection took $detect s (limit $detect_limit s)"
    fi
    if [ "$rc" -eq 0 ]; then
        ok=0
        why="$why; the launcher exited 0"
    fi
    if awk -v e="$exit_s" -v l=$exit_limit 'BEGIN { exit !(e > l) }'; then
        ok=0
        why="$why; the launcher exited $exit_s s after the strike (limit $exit_limit s)"
    fi
    # The ranks may outlive the launcher by a moment (mpirun does not wait
    # for them); 5 s more, then whatever is left is killed and reported.
    n=0
    while [ -n "$(alive $pids)" ] && [ $n -lt 50 ]; do
        n=$((n + 1))
        sleep 0.1
    done
    left=$(alive $pids)
    [ -n "$left" ] && kill -KILL $left 2>/dev/null
    if [ -n "$left" ]; then
        ok=0
        why="$why; processes left behind 5 s after the launcher:$left"
    fi
    shm=$(shm_left)
    if [ -n "$shm" ]; then
        ok=0
        why="$why; /dev/shm entries left behind: $(echo $shm)"
    fi
    if [ "${HVD_FAULT_PRIVATE_SHM:-0}" = 1 ]; then
        rm -rf /dev/shm/* 2>/dev/null
    fi

    echo "run_fault: rep $rep: $sig rank $victim after ${delay} s: survivors" \
        "reported within $detect s, $kind exited $rc after $exit_s s"
    if [ $ok -eq 0 ]; then
        echo "run_fault: FAIL rep $rep${why}"
        cat "$out"
        fails=$((fails + 1))
    fi
    worst_detect=$(awk -v a="$worst_detect" -v b="$detect" 'BEGIN { print (b > a ? b : a) }')
    worst_exit=$(awk -v a="$worst_exit" -v b="$exit_s" 'BEGIN { print (b > a ? b : a) }')
done <"$dir/plan"

echo "run_fault: worst case over $reps repetitions: survivors reported" \
    "within $worst_detect s (limit $detect_limit s), $kind exited within" \
    "$worst_exit s (limit $exit_limit s)"
if [ $fails -eq 0 ]; then
    echo "run_fault: PASS"
    exit 0
fi
echo "run_fault: $fails of $reps repetitions FAILED (HVD_FAULT_SEED=$seed)"
exit 1
