#!/bin/sh
# kill -9 of hvdrun leaves no rank behind (docs/launching.md, "When hvdrun
# dies").
#
#   run_orphans.sh HVDRUN RANK [mpi]
#
# RANK is orphan_rank (orphan_rank.c). Cases, each with 3 ranks that run
# small allreduces and write nothing to stdout (so no broken pipe ends
# them):
#   plain        hvdrun -np 3
#   ignore-term  the same, the ranks ignoring SIGTERM (SIGKILL must come)
#   wrapped      each rank a shell that runs the program as its child and
#                ignores SIGTERM too (the parent-death signal reaches only
#                the shell; the rest of its process group must go too)
#   elastic      hvdrun --min-np 3 -np 3
#   elastic-late workers hvdrun starts while the job runs: of 2 sleeping
#                workers (ignoring SIGTERM) one is killed and hvdrun starts
#                a new one in its slot
#   mpi          hvdrun --mpi -np 3 (with the argument "mpi")
# Each case waits until every rank has written its up file (bounded
# poll), kills hvdrun with SIGKILL and polls: every rank (and the shell or
# mpirun above it) must be gone within 5 s (the time it took is printed),
# and no new hvd entry may be left in /dev/shm (as root the job gets a
# private /dev/shm in a mount namespace, which must end empty).
# Exit status: 0 pass, 1 fail, 77 skip.
set -u

if [ "${1:-}" = "--in-namespace" ]; then
    shift
    mount -t tmpfs -o size=64m hvd-orphans-shm /dev/shm || exit 1
    HVD_ORPHANS_PRIVATE_SHM=1
elif [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null 2>&1 &&
    unshare --mount --propagation private true 2>/dev/null; then
    exec unshare --mount --propagation private sh "$0" --in-namespace "$@"
fi

if [ $# -lt 2 ]; then
    echo "usage: $0 HVDRUN RANK [mpi]" >&2
    exit 2
fi
hvdrun=$1
rank=$2
with_mpi=${3:-}
np=3
limit=5

for tool in timeout awk date sleep pgrep; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "SKIP: $tool is not installed"
        exit 77
    fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_orphans.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fails=0
worst=0

# The pids among $@ of processes still running (zombies do not count: an
# init may reap the orphans late).
alive() {
    for p in "$@"; do
        if [ -r "/proc/$p/stat" ] &&
            [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
            printf ' %s' "$p"
        fi
    done
}

# New /dev/shm entries: any in a private /dev/shm, else new ones named hvd.
shm_left() {
    if [ "${HVD_ORPHANS_PRIVATE_SHM:-0}" = 1 ]; then
        ls -A /dev/shm 2>/dev/null
    else
        ls -A /dev/shm 2>/dev/null | sort | comm -13 "$dir/shm.before" - |
            grep -i hvd
    fi
}

# How many up files (orphan_rank.c) are in $1.
count_up() {
    c=0
    for f in "$1"/up.*; do
        [ -e "$f" ] && c=$((c + 1))
    done
    echo $c
}

fail() {
    echo "run_orphans: FAIL $case: $*"
    fails=$((fails + 1))
}

# start_job NAME HVDRUN-ARGS...: the job is started under timeout(1)
# (hvdrun is timeout's only child), its ranks writing up files in $run.
start_job() {
    case=$1
    shift
    run=$dir/$case
    mkdir -p "$run"
    ls -A /dev/shm 2>/dev/null | sort >"$dir/shm.before"
    timeout -k 5 120 "$hvdrun" "$@" >"$run.out" 2>&1 &
    job=$!
}

# wait_up N: until N up files are in $run (bounded: 60 s); 1 if not.
wait_up() {
    n=0
    while [ "$(count_up "$run")" -lt "$1" ]; do
        n=$((n + 1))
        if [ $n -gt 1200 ] || ! kill -0 $job 2>/dev/null; then
            fail "the ranks did not all start"
            kill $job 2>/dev/null
            wait $job
            cat "$run.out"
            return 1
        fi
        sleep 0.05
    done
    return 0
}

# run_case NAME HVDRUN-ARGS...: starts the job, waits for its np ranks,
# kills hvdrun and checks.
run_case() {
    start_job "$@"
    wait_up $np && kill_and_check
}

# kill_and_check: kill -9 of hvdrun; every process named in the up files
# (each rank and its parent but hvdrun) must be gone within the limit.
kill_and_check() {
    launcher=$(pgrep -P $job)
    # Each rank and its parent (hvdrun itself, the wrapping shell, mpirun),
    # hvdrun excepted.
    pids=$(cat "$run"/up.* | awk -v h="$launcher" \
        '{ print $4; if ($6 != h) print $6 }' | sort -u)
    if [ -z "$launcher" ]; then
        fail "hvdrun is not running"
        return
    fi

    t_kill=$(date +%s.%N)
    kill -KILL "$launcher"
    n=0
    while [ -n "$(alive $pids)" ] && [ $n -lt 200 ]; do
        n=$((n + 1))
        sleep 0.025
    done
    t_gone=$(date +%s.%N)
    left=$(alive $pids)
    took=$(awk -v a="$t_kill" -v b="$t_gone" 'BEGIN { printf "%.3f", b - a }')
    wait $job
    if [ -n "$left" ]; then
        fail "processes alive 5 s after kill -9 of hvdrun:$left"
        ps -o pid,ppid,pgid,stat,args -p "$(echo $left | tr ' ' ,)"
        kill -KILL $left 2>/dev/null
        cat "$run.out"
        return
    fi
    if awk -v t="$took" -v l=$limit 'BEGIN { exit !(t > l) }'; then
        fail "the ranks took $took s to go (limit $limit s)"
    fi
    # The watchdog removes what it finds after the ranks are gone.
    n=0
    while [ -n "$(shm_left)" ] && [ $n -lt 100 ]; do
        n=$((n + 1))
        sleep 0.05
    done
    if [ -n "$(shm_left)" ]; then
        fail "/dev/shm entries left behind: $(echo $(shm_left))"
    fi
    if [ "${HVD_ORPHANS_PRIVATE_SHM:-0}" = 1 ]; then
        rm -rf /dev/shm/* 2>/dev/null
    fi
    errs=$(cat "$run"/err.* 2>/dev/null | head -3)
    echo "run_orphans: $case: $(echo $pids | wc -w) processes gone $took s" \
        "after kill -9 of hvdrun (limit $limit s)${errs:+; the library said: $errs}"
    worst=$(awk -v a="$worst" -v b="$took" 'BEGIN { print (b > a ? b : a) }')
}

marker=hvd-orphan-$$
run_case plain -np $np "$rank" --dir "$dir/plain" $marker
run_case ignore-term -np $np "$rank" --dir "$dir/ignore-term" --ignore-term \
    $marker
# The shell runs the program as a child (not exec: a command follows) and
# ignores SIGTERM, as the program does.
run_case wrapped -np $np sh -c 'trap "" TERM; "$@"; exit $?' sh "$rank" \
    --dir "$dir/wrapped" --ignore-term $marker
run_case elastic --min-np $np -np $np "$rank" --dir "$dir/elastic" $marker
# Workers hvdrun starts later: worker 0 of 2 is killed, hvdrun starts
# worker 2 in its slot (no cooldown), then hvdrun is killed. The workers
# only sleep (--no-hvd: they never join the rendezvous), ignoring SIGTERM.
start_job elastic-late --min-np 1 -np 2 --blacklist-cooldown-range 0 0 \
    "$rank" --dir "$dir/elastic-late" --no-hvd --ignore-term $marker
if wait_up 2; then
    kill -KILL "$(awk '$2 == 0 { print $4 }' "$run"/up.*)"
    wait_up 3 && kill_and_check
fi
if [ "$with_mpi" = mpi ]; then
    run_case mpi --mpi -np $np --oversubscribe --network-interface lo \
        "$rank" --dir "$dir/mpi" --ignore-term $marker
fi

echo "run_orphans: worst case: the processes were gone $worst s after kill -9" \
    "of hvdrun (limit $limit s)"
if [ $fails -eq 0 ]; then
    echo "run_orphans: PASS"
    exit 0
fi
echo "run_orphans: $fails cases FAILED"
exit 1
