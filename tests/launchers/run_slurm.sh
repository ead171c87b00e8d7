#!/usr/bin/env bash
# hvd under a real Slurm: Debian's slurmctld, slurmd and munged, started
# by this test on this machine as a one-node cluster (NodeName=localhost
# CPUs=2), inside namespaces of its own (mount, network, pid) so that the
# system is untouched: tmpfs over /run (munge's default socket, which
# libmunge clients use), every Slurm path in a tmpfs, its own loopback, and
# every daemon gone with the namespace's first process.
#
#   run_slurm.sh PYTHON LIBHVD TEST_COLLECTIVES
#
# Then, each bounded: srun -n 2 of the C test program and of the hvd.torch
# script torch_job.py (exact results, size 2); srun --mpi=list, and when it
# lists pmix, the MPI build under srun --mpi=pmix -n 2; and the singleton
# trap: HVD_TRANSPORT=mpi under plain srun must fail hvd_init at once,
# saying why, never run as jobs of one. Needs root; skips (77) when Slurm or munge is not
# installed (tools/install-deps installs them) or the daemons cannot start.
set -u
if [ "${1:-}" != --inside ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "SKIP: needs root (runs slurmctld, slurmd and munged)"
        exit 77
    fi
    for tool in slurmctld slurmd srun sinfo munged unshare timeout ip; do
        if ! command -v "$tool" >/dev/null 2>&1 &&
            [ ! -x "/usr/sbin/$tool" ]; then
            echo "SKIP: $tool is not installed (Debian: apt-get install" \
                 "slurm-wlm slurmctld slurmd munge, or tools/install-deps)"
            exit 77
        fi
    done
    # --kill-child: a killed test takes the namespace, and so every daemon,
    # with it.
    exec timeout -s KILL 120 unshare --mount --net --pid --fork \
        --mount-proc --propagation private --kill-child \
        bash "$0" --inside "$@"
fi
shift
python=$1
lib=$2
collectives=$3
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
export PATH=$PATH:/usr/sbin

# Besides lo, an interface with an address: getaddrinfo's AI_ADDRCONFIG,
# which Slurm uses to bind its ports, finds nothing on loopback alone.
if ! { ip link set lo up && ip link add hvd0 type veth peer name hvd1 &&
    ip addr add 10.232.0.1/24 dev hvd0 && ip link set hvd0 up; }; then
    echo "FAIL: cannot set up the test's network namespace"
    exit 1
fi
mount -t tmpfs -o mode=0755 hvd-run /run || { echo "FAIL: tmpfs /run"; exit 1; }
dir=/run/hvd-slurm
mkdir -m 0700 "$dir" && mkdir "$dir/ctld" "$dir/d" "$dir/tmp" &&
    mkdir -m 0755 /run/munge || { echo "FAIL: mkdir in /run"; exit 1; }
# slurmctld and munged find nothing of the system's: the configuration is
# this one, in the tmpfs.
export SLURM_CONF=$dir/slurm.conf

daemons_log() {
    for f in munged.log ctld.log ctld.out d.log d.out sinfo.err; do
        [ -s "$dir/$f" ] && { echo "---- $f (last lines)"; tail -15 "$dir/$f"; }
    done
}
# Daemons are stopped at the end, whatever the outcome (the pid namespace
# would end them anyway when this shell exits).
pids=()
stop_daemons() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap stop_daemons EXIT
skip_daemons() {
    daemons_log
    echo "SKIP: $1"
    exit 77
}

dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge.key"
munged -F --force --key-file="$dir/munge.key" --log-file="$dir/munged.log" \
    --seed-file="$dir/munged.seed" --pid-file=/run/munge/munged.pid \
    --num-threads=2 &
pids+=($!)

cat >"$SLURM_CONF" <<CONF
ClusterName=hvdtest
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/ctld.pid
SlurmdPidFile=$dir/d.pid
SlurmctldLogFile=$dir/ctld.log
SlurmdLogFile=$dir/d.log
TmpFS=$dir/tmp
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

# munged is up when its socket answers.
for ((i = 0; i < 100; i++)); do
    [ -S /run/munge/munge.socket.2 ] && break
    sleep 0.1
done
[ -S /run/munge/munge.socket.2 ] || skip_daemons "munged did not start"

slurmctld -D -i >>"$dir/ctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost >>"$dir/d.out" 2>&1 &
pids+=($!)
state=
# Bounded by the clock: an sinfo that cannot reach slurmctld takes seconds.
end=$((SECONDS + 40))
while [ $SECONDS -lt $end ]; do
    state=$(timeout 5 sinfo -h -n localhost -o %T 2>>"$dir/sinfo.err")
    [ "$state" = idle ] && break
    sleep 0.2
done
[ "$state" = idle ] ||
    skip_daemons "the one-node Slurm did not come up (node state '${state:-none}')"
echo "slurm: $(sinfo -V), node localhost idle"

export HVD_START_TIMEOUT_SECONDS=30 HVD_STALL_SHUTDOWN_SECONDS=30
fail=0
out=$dir/out
# Runs srun ARGS..., bounded; expects exit 0, a PASS line of each of 2
# ranks with size 2 (and PATTERN in it), and no warning that the job is
# not authenticated.
expect_pass() { # WHAT PATTERN SRUN-ARGS...
    local what=$1 pat=$2 r rc
    shift 2
    timeout 60 srun "$@" >"$out" 2>&1
    rc=$?
    sed "s/^/[$what] /" "$out"
    if [ $rc -ne 0 ]; then
        echo "FAIL $what: srun exited with status $rc"
        fail=1
        return
    fi
    for r in 0 1; do
        if ! grep -q "^PASS .* rank $r size 2\b.*$pat" "$out"; then
            echo "FAIL $what: no PASS line for rank $r of 2"
            fail=1
            return
        fi
    done
    # munged runs: rank 0 hands the secret out in munge credentials, and
    # the job is authenticated.
    if grep -q "not authenticated" "$out"; then
        echo "FAIL $what: the job was not authenticated, with munged running"
        fail=1
        return
    fi
    echo "ok: $what"
}

expect_pass "srun -n 2 C" "" -n 2 "$collectives" --quick

if [ -n "$python" ] && "$python" -c "import torch" >/dev/null 2>&1 &&
    ! ldd "$lib" 2>/dev/null | grep -q 'lib[at]san'; then
    HVD_LIBRARY=$lib PYTHONPATH=$src/python PYTHONDONTWRITEBYTECODE=1 \
        expect_pass "srun -n 2 hvd.torch" "launcher srun" \
        -n 2 "$python" "$here/torch_job.py"
else
    echo "note: the hvd.torch run is left out: ${python:-no Python} cannot" \
         "import torch, or libhvd is a sanitizer build"
fi

# (libhvd loads libmpi at run time: its name is in the library, not in ldd.)
if grep -qa "libmpi\.so" "$lib"; then
    mpis=$(srun --mpi=list 2>&1)
    echo "srun --mpi=list: $(echo "$mpis" | tr '\n' ' ')"
    if echo "$mpis" | grep -q pmix; then
        expect_pass "srun --mpi=pmix -n 2 C" "" --mpi=pmix -n 2 \
            "$collectives" --quick
    else
        echo "note: this Slurm has no pmix plugin: the MPI run is left out"
    fi
    # The singleton trap: MPI asked for, but plain srun gives it no PMI.
    # Open MPI 5 would start each task as a job of one; Debian's 4.1
    # aborts in MPI_Init. hvd, seeing no PMI, does not initialize MPI and
    # must fail at once with the trap's sentence (naming singletons and
    # srun --mpi=pmix).
    HVD_TRANSPORT=mpi timeout 60 srun -n 2 "$collectives" --quick \
        >"$out" 2>&1
    rc=$?
    sed 's/^/[singleton] /' "$out"
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || grep -q "^PASS" "$out" ||
        ! grep -q "singleton.*srun --mpi=pmix" "$out"; then
        echo "FAIL singleton: HVD_TRANSPORT=mpi under plain srun gave status" \
             "$rc without failing hvd_init with a sentence"
        fail=1
    else
        echo "ok: HVD_TRANSPORT=mpi under plain srun fails hvd_init, saying why"
    fi
else
    echo "note: libhvd is not an MPI build: the MPI runs are left out"
fi

if [ $fail -ne 0 ]; then
    daemons_log
    exit 1
fi
echo "ok: slurm"
