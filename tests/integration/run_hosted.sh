#!/bin/sh
# The rendezvous rank 0 hosts, under torchrun's variables (no torchrun
# needed: this script starts the ranks as torchrun would, on 127.0.0.1).
#
#   run_hosted.sh PROG CASE
#
# PROG is test_collectives. CASE is one of:
#   np2, np3     a job of 2 or 3 passes; exactly one warning that it is
#                not authenticated, from rank 0
#   reinit       hvd_init again after hvd_shutdown (twice): passes
#   norank0      rank 0 never starts: rank 1 fails at the start timeout,
#                naming the address and ports it tried
#   unresolved   MASTER_ADDR does not resolve: tried until the start
#                timeout, then a sentence naming it
#   secret       HVD_SECRET on every rank: passes, no warning
#   badsecret    HVD_SECRET differs on rank 1: rank 1 is refused with a
#                sentence naming HVD_SECRET, no rank hangs
#   taken        the range's first port is held by another program: passes
#   twojobs      two jobs of 2 at once, other run ids, one MASTER_PORT:
#                both pass
#   slurm        srun's variables, munged out of reach: passes; one
#                warning, naming why munge is not used
#   munge        srun's variables and a munged the test starts: passes, the
#                secret handed over in a munge credential; no warning
#   mungemixed   munge works on one rank's node only, either way round:
#                the rank that cannot join says why
#   singleton    (an MPI build) a task of srun --mpi=pmix that MPI sees
#                as a job of 1 while Slurm started 4: hvd_init fails at
#                once, naming the trap
#   restart      a job whose rank 1 died, its rank 0 still up, and the
#                same job restarted (TORCHELASTIC_RESTART_COUNT=1): the
#                restarted job passes
# Exit status: 0 pass, 1 fail, 77 skip.

if [ $# -ne 2 ]; then
    echo "usage: $0 PROG CASE" >&2
    exit 1
fi
prog=$1
case=$2

for tool in timeout python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool is not installed"
        exit 77
    fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_hosted.XXXXXX") || exit 1
pids=""
# Each pid is a timeout(1) (or python3): SIGTERM reaches the program it
# runs too, where SIGKILL would leave that program behind.
cleanup() {
    for p in $pids; do
        kill "$p" 2>/dev/null
    done
    rm -rf "$dir"
}
trap cleanup EXIT

# A MASTER_PORT whose rendezvous range (the next 8 ports) is free now.
master=$(python3 - <<'EOF'
import random, socket
for _ in range(200):
    p = random.randrange(20000, 30000)
    try:
        held = []
        for q in range(p, p + 9):
            s = socket.socket()
            s.bind(("127.0.0.1", q))
            held.append(s)
        print(p)
        break
    except OSError:
        pass
    finally:
        for s in held:
            s.close()
EOF
)
if [ -z "$master" ]; then
    echo "SKIP: no free range of ports found on 127.0.0.1"
    exit 77
fi
first=$((master + 1))

HVD_START_TIMEOUT_SECONDS=${HVD_START_TIMEOUT_SECONDS:-30}
export HVD_START_TIMEOUT_SECONDS
unset HVD_RANK HVD_SIZE HVD_RENDEZVOUS_ADDR HVD_RENDEZVOUS_PORT HVD_JOB_ID \
    HVD_SECRET OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE SLURM_PROCID \
    SLURM_NTASKS PMI_RANK PMI_SIZE

progargs=--quick
launcher=torchrun
# start NAME RANK SIZE RUNID RESTART [VAR=VALUE...]: one rank in the
# background with torchrun's variables (launcher=slurm: srun's, RUNID the
# job id and RESTART the step id), its output in $dir/NAME.RANK.log, its
# pid in $dir/NAME.RANK.pid.
start() {
    name=$1 r=$2 n=$3 run=$4 restart=$5
    shift 5
    if [ "$launcher" = slurm ]; then
        # srun's variables for step RESTART of job RUNID on this host.
        set -- SLURM_PROCID="$r" SLURM_NTASKS="$n" SLURM_STEP_NUM_TASKS="$n" \
            SLURM_LOCALID="$r" SLURM_NODEID=0 SLURM_STEP_NODELIST=localhost \
            SLURM_STEP_TASKS_PER_NODE="$n" SLURM_JOB_ID="$run" \
            SLURM_STEP_ID="$restart" HVD_RENDEZVOUS_PORT="$first" "$@"
    else
        set -- RANK="$r" WORLD_SIZE="$n" LOCAL_RANK="$r" \
            LOCAL_WORLD_SIZE="$n" GROUP_RANK=0 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT="$master" TORCHELASTIC_RUN_ID="$run" \
            TORCHELASTIC_RESTART_COUNT="$restart" "$@"
    fi
    env "$@" timeout -k 5 90 "$prog" $progargs >"$dir/$name.$r.log" 2>&1 &
    echo $! >"$dir/$name.$r.pid"
    pids="$pids $!"
}

# job NAME SIZE RUNID RESTART [VAR=VALUE...]: starts every rank.
job() {
    name=$1 n=$2 run=$3 restart=$4
    shift 4
    r=0
    while [ "$r" -lt "$n" ]; do
        start "$name" "$r" "$n" "$run" "$restart" "$@"
        r=$((r + 1))
    done
}

# finish NAME SIZE: waits for every rank; fails unless each passed.
ok=1
finish() {
    name=$1 n=$2
    r=0
    while [ "$r" -lt "$n" ]; do
        wait "$(cat "$dir/$name.$r.pid")"
        rc=$?
        echo "--- $name rank $r (exit $rc)"
        cat "$dir/$name.$r.log"
        if [ "$rc" -ne 0 ] || ! grep -q "^PASS" "$dir/$name.$r.log"; then
            echo "run_hosted: FAIL: $name rank $r did not pass"
            ok=0
        fi
        r=$((r + 1))
    done
}

# warnings NAME SIZE WANT: the "not authenticated" warnings of a job.
warnings() {
    name=$1 n=$2 want=$3
    got=$(cat "$dir/$name".*.log | grep -c "this job is not authenticated")
    if [ "$got" -ne "$want" ]; then
        echo "run_hosted: FAIL: $name: $got warnings that the job is not" \
            "authenticated, expected $want"
        ok=0
    fi
    if [ "$want" -eq 1 ] &&
        ! grep -q "rank 0 .*this job is not authenticated" "$dir/$name.0.log"; then
        echo "run_hosted: FAIL: $name: the warning is not rank 0's"
        ok=0
    fi
}

# start_munged: a munged of the test's own, on $dir/m/sock (skips the
# test when munged is not installed or cannot start here).
start_munged() {
    if ! command -v munged >/dev/null 2>&1; then
        echo "SKIP: munged is not installed (Debian package munge)"
        exit 77
    fi
    chmod 711 "$dir"
    mkdir "$dir/m" && chmod 755 "$dir/m"
    dd if=/dev/urandom of="$dir/munge.key" bs=128 count=1 2>/dev/null
    chmod 600 "$dir/munge.key"
    timeout -k 5 100 munged -F --socket="$dir/m/sock" --key-file="$dir/munge.key" \
        --log-file="$dir/munged.log" --pid-file="$dir/munged.pid" \
        --seed-file="$dir/munged.seed" >"$dir/munged.out" 2>&1 &
    pids="$pids $!"
    i=0
    while [ ! -S "$dir/m/sock" ] && [ "$i" -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if [ ! -S "$dir/m/sock" ]; then
        cat "$dir/munged.out"
        echo "SKIP: munged did not start here (see above)"
        exit 77
    fi
}

# wait_log FILE TEXT: waits (bounded) until FILE holds TEXT.
wait_log() {
    i=0
    while [ "$i" -lt 300 ]; do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
        i=$((i + 1))
    done
    echo "run_hosted: FAIL: '$2' never appeared in $1"
    cat "$1"
    ok=0
    return 1
}

case $case in
np2 | np3)
    n=${case#np}
    job a "$n" run-a 0
    finish a "$n"
    warnings a "$n" 1
    ;;
reinit)
    # hvd_init again after hvd_shutdown, twice: a fresh hosted rendezvous
    # each time.
    progargs="--quick --restarts 2"
    job a 2 run-a 0
    finish a 2
    ;;
norank0)
    # Rank 0 never comes: rank 1 gives up at the start timeout, saying
    # where it looked.
    start a 1 2 run-a 0 HVD_START_TIMEOUT_SECONDS=2
    wait "$(cat "$dir/a.1.pid")"
    rc=$?
    cat "$dir/a.1.log"
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
        echo "run_hosted: FAIL: rank 1 exited $rc, expected a failure"
        ok=0
    fi
    want="no rendezvous of this job on 127.0.0.1 ports $first-$((first + 31))"
    if ! grep -q "$want after [0-9]* s.*; rank 0 hosts it" "$dir/a.1.log"; then
        echo "run_hosted: FAIL: rank 1 does not say where it looked"
        ok=0
    fi
    ;;
unresolved)
    # MASTER_ADDR does not resolve (yet: a Kubernetes service's name
    # resolves once its pod runs): tried again until the start timeout.
    env RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid \
        MASTER_PORT="$master" HVD_START_TIMEOUT_SECONDS=2 \
        timeout -k 5 60 "$prog" --quick >"$dir/u.log" 2>&1
    rc=$?
    cat "$dir/u.log"
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
        echo "run_hosted: FAIL: exit $rc, expected a failure of hvd_init"
        ok=0
    fi
    if ! grep -q "no-such-host.invalid does not resolve.*until the start timeout" \
        "$dir/u.log"; then
        echo "run_hosted: FAIL: no sentence naming the host that does not resolve"
        ok=0
    fi
    ;;
secret)
    job a 2 run-a 0 HVD_SECRET=s3cret-from-a-kubernetes-secret
    finish a 2
    warnings a 2 0
    ;;
badsecret)
    start a 0 2 run-a 0 HVD_SECRET=right HVD_START_TIMEOUT_SECONDS=8
    start a 1 2 run-a 0 HVD_SECRET=wrong HVD_START_TIMEOUT_SECONDS=8
    for r in 0 1; do
        wait "$(cat "$dir/a.$r.pid")"
        rc=$?
        echo "--- rank $r (exit $rc)"
        cat "$dir/a.$r.log"
        if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
            echo "run_hosted: FAIL: rank $r exited $rc, expected a failure"
            ok=0
        fi
    done
    if ! grep -q "did not accept this rank.*HVD_SECRET" "$dir/a.1.log"; then
        echo "run_hosted: FAIL: rank 1 does not say HVD_SECRET differs"
        ok=0
    fi
    ;;
taken)
    # Another program holds the first port of the range (and answers
    # nothing there): rank 0 takes the next one, and the others skip it.
    python3 -c "
import socket, sys, time
s = socket.socket()
s.bind(('127.0.0.1', $first))
s.listen(16)
open('$dir/held', 'w').close()
time.sleep(120)
" &
    pids="$pids $!"
    i=0
    while [ ! -e "$dir/held" ] && [ "$i" -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    job a 2 run-a 0 HVD_LOG_LEVEL=info
    finish a 2
    if ! grep -q "listening on 127.0.0.1:$((first + 1))" "$dir/a.0.log"; then
        echo "run_hosted: FAIL: rank 0 did not take port $((first + 1))"
        ok=0
    fi
    ;;
twojobs)
    # Both rank 0s are up before any other rank starts: job b's rank 0
    # takes the next port, and its rank 1 skips job a's server.
    start a 0 2 run-a 0 HVD_LOG_LEVEL=info
    wait_log "$dir/a.0.log" "listening on 127.0.0.1:$first"
    start b 0 2 run-b 0 HVD_LOG_LEVEL=info
    wait_log "$dir/b.0.log" "listening on 127.0.0.1:$((first + 1))"
    # Job a cannot end before its rank 1 starts: its server is up while
    # job b's rank 1 looks for its own.
    start b 1 2 run-b 0 HVD_LOG_LEVEL=debug
    finish b 2
    start a 1 2 run-a 0 HVD_LOG_LEVEL=info
    finish a 2
    if ! grep -q "$first is another job's rendezvous" "$dir/b.1.log"; then
        echo "run_hosted: FAIL: job b's rank 1 did not skip job a's server"
        ok=0
    fi
    ;;
restart)
    # The first try: rank 1 died before it joined; rank 0 stays, waiting
    # for it on the range's first port.
    start old 0 2 run-r 0 HVD_LOG_LEVEL=info
    wait_log "$dir/old.0.log" "listening on 127.0.0.1:$first"
    # torchrun's restart, while the old rank 0 still holds its port: the
    # new rank 0 takes the next, and the new rank 1 skips the old one.
    job new 2 run-r 1 HVD_LOG_LEVEL=info
    finish new 2
    if ! grep -q "listening on 127.0.0.1:$((first + 1))" "$dir/new.0.log"; then
        echo "run_hosted: FAIL: the restarted rank 0 did not take port" \
            "$((first + 1))"
        ok=0
    fi
    kill "$(cat "$dir/old.0.pid")" 2>/dev/null
    ;;
slurm)
    # srun without MPI, munged out of reach: one warning, naming munge.
    launcher=slurm
    job a 2 4242 0 HVD_MUNGE_SOCKET="$dir/no-munged"
    finish a 2
    warnings a 2 1
    if ! grep -q "munge cannot be used" "$dir/a.0.log"; then
        echo "run_hosted: FAIL: the warning does not say why munge is not used"
        ok=0
    fi
    ;;
munge)
    # srun without MPI, with a munged of the test's own: rank 0 hands the
    # secret to rank 1 in a munge credential; the job is authenticated.
    start_munged
    launcher=slurm
    job a 2 4243 0 HVD_MUNGE_SOCKET="$dir/m/sock" HVD_LOG_LEVEL=info
    finish a 2
    warnings a 2 0
    if ! grep -q "gave .* a munge credential" "$dir/a.0.log"; then
        echo "run_hosted: FAIL: rank 0 gave no munge credential"
        ok=0
    fi
    ;;
mungemixed)
    # munge works on one rank's node and not on the other's: the rank
    # that cannot join says why, in either order.
    start_munged
    launcher=slurm
    start a 0 2 4244 0 HVD_MUNGE_SOCKET="$dir/m/sock" \
        HVD_START_TIMEOUT_SECONDS=6
    start a 1 2 4244 0 HVD_MUNGE_SOCKET="$dir/none" \
        HVD_START_TIMEOUT_SECONDS=6
    start b 0 2 4245 0 HVD_MUNGE_SOCKET="$dir/none" \
        HVD_START_TIMEOUT_SECONDS=6 HVD_RENDEZVOUS_PORT=$((first + 4))
    start b 1 2 4245 0 HVD_MUNGE_SOCKET="$dir/m/sock" \
        HVD_START_TIMEOUT_SECONDS=6 HVD_RENDEZVOUS_PORT=$((first + 4))
    for j in a.0 a.1 b.0 b.1; do
        wait "$(cat "$dir/$j.pid")"
        rc=$?
        echo "--- $j (exit $rc)"
        cat "$dir/$j.log"
        if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
            echo "run_hosted: FAIL: $j exited $rc, expected a failure"
            ok=0
        fi
    done
    if ! grep -q "this rank cannot use munge" "$dir/a.1.log"; then
        echo "run_hosted: FAIL: job a's rank 1 does not say munge is missing"
        ok=0
    fi
    if ! grep -q "gives no munge credential" "$dir/b.1.log"; then
        echo "run_hosted: FAIL: job b's rank 1 does not say rank 0 has no" \
            "munge"
        ok=0
    fi
    ;;
singleton)
    # An MPI build under srun --mpi=pmix bootstraps through MPI; a task
    # that MPI starts as a singleton (srun without PMIx) sees a job of 1
    # where Slurm started 4: hvd_init fails at once naming the trap.
    env PMIX_RANK=0 SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_LOCALID=0 \
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo \
        OMPI_MCA_oob_tcp_if_include=lo \
        timeout 60 "$prog" --quick >"$dir/s.log" 2>&1
    rc=$?
    cat "$dir/s.log"
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
        echo "run_hosted: FAIL: exit $rc, expected a failure of hvd_init"
        ok=0
    fi
    if ! grep -q "MPI sees a job of 1 rank but Slurm started 4" "$dir/s.log"; then
        echo "run_hosted: FAIL: no sentence naming the singleton trap"
        ok=0
    fi
    ;;
*)
    echo "run_hosted: unknown case $case" >&2
    exit 1
    ;;
esac

if [ "$ok" -eq 1 ]; then
    echo "run_hosted: PASS ($case)"
    exit 0
fi
exit 1
