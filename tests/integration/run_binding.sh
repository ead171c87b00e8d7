#!/bin/sh
# hvdrun's thread variables (OMP_NUM_THREADS, MKL_NUM_THREADS,
# OPENBLAS_NUM_THREADS) and --bind-to, with shell programs as ranks that
# print their CPUs (Cpus_allowed_list) and the variables. hvdrun runs under
# taskset on two CPUs of its mask (one where it has only one), so the
# expected values are exact on any machine. Remote ranks are tested with a
# stand-in ssh on PATH that runs the wrapper's command here (no network):
# the wrapper computes the cores and binds with taskset on "its" host.
# --mpi is tested with a stand-in mpirun that prints its arguments.
# Usage: run_binding.sh HVDRUN
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

command -v taskset >/dev/null 2>&1 || {
    echo "SKIP binding: taskset (util-linux) is not installed"
    exit 77
}
[ -r /proc/self/status ] || {
    echo "SKIP binding: no /proc/self/status"
    exit 77
}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# The CPUs of this shell's mask, one a line.
cpus() {
    sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status |
        tr ',' '\n' | while IFS=- read -r a b; do
        seq "$a" "${b:-$a}"
    done
}
set -- $(cpus)
a=$1
b=${2:-}

# What each rank prints: "[rank] cpus=LIST omp=T mkl=T ob=T", sorted.
cat >"$dir/show" <<'EOF'
#!/bin/sh
l=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
echo "cpus=$l omp=${OMP_NUM_THREADS-unset} mkl=${MKL_NUM_THREADS-unset} ob=${OPENBLAS_NUM_THREADS-unset}"
EOF
chmod +x "$dir/show"
run() { # taskset-list hvdrun-args...
    mask=$1
    shift
    env -u OMP_NUM_THREADS -u MKL_NUM_THREADS -u OPENBLAS_NUM_THREADS \
        timeout 60 taskset -c "$mask" "$hvdrun" "$@" 2>"$dir/err" | sort
}

# One CPU: every rank gets 1 thread; core binding shares it (one warning).
out=$(run "$a" -np 2 "$dir/show")
check "1 cpu, none" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$a omp=1 mkl=1 ob=1" "$out"
out=$(run "$a" -np 3 --bind-to core "$dir/show")
check "1 cpu, core, 3 ranks" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$a omp=1 mkl=1 ob=1
[2] cpus=$a omp=1 mkl=1 ob=1" "$out"
check "1 cpu, core, 3 ranks: one warning" 1 "$(grep -c 'share cores' "$dir/err")"

if [ -n "$b" ]; then
    two="$a,$b"
    out=$(run "$two" -np 1 "$dir/show")
    check "2 cpus, 1 rank, none" "[0] cpus=$a-$b omp=2 mkl=2 ob=2" \
        "$(echo "$out" | sed "s/cpus=$a,$b/cpus=$a-$b/")"
    out=$(run "$two" -np 2 --bind-to core "$dir/show")
    check "2 cpus, core" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$b omp=1 mkl=1 ob=1" "$out"
    out=$(run "$two" -np 3 --bind-to core "$dir/show")
    check "2 cpus, core, 3 ranks round-robin" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$b omp=1 mkl=1 ob=1
[2] cpus=$a omp=1 mkl=1 ob=1" "$out"
    out=$(run "$two" -np 2 --binding-args "--bind-to core" "$dir/show")
    check "--binding-args" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$b omp=1 mkl=1 ob=1" "$out"
    # socket: each rank on the CPUs of one socket, all of one package.
    out=$(run "$two" -np 2 --bind-to socket "$dir/show")
    pa=$(cat /sys/devices/system/cpu/cpu$a/topology/physical_package_id 2>/dev/null || echo 0)
    pb=$(cat /sys/devices/system/cpu/cpu$b/topology/physical_package_id 2>/dev/null || echo 0)
    if [ "$pa" = "$pb" ]; then
        want="[0] cpus=$a-$b omp=1 mkl=1 ob=1
[1] cpus=$a-$b omp=1 mkl=1 ob=1"
    else
        want="[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$b omp=1 mkl=1 ob=1"
    fi
    check "2 cpus, socket" "$want" "$(echo "$out" | sed "s/cpus=$a,$b/cpus=$a-$b/")"
fi

# The user's values win, from the environment or -x; the rest are set.
out=$(OMP_NUM_THREADS=7 timeout 60 taskset -c "$a" "$hvdrun" -np 1 \
    -x MKL_NUM_THREADS=3 "$dir/show" 2>/dev/null)
check "user's values" "[0] cpus=$a omp=7 mkl=3 ob=1" "$out"

# --verbose says it per host.
run "$a" -v -np 2 "$dir/show" >/dev/null
check "--verbose line" 1 "$(grep -c "^hvdrun: host localhost: 2 ranks, 1 core, --bind-to none: OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1" "$dir/err")"

"$hvdrun" --bind-to numa true 2>/dev/null
check "--bind-to numa exits 2" 2 $?
"$hvdrun" --binding-args "--map-by slot" true 2>/dev/null
check "--binding-args other exits 2" 2 $?

# Remote ranks: a stand-in ssh runs the wrapper's command here.
mkdir "$dir/bin"
cat >"$dir/bin/ssh" <<'EOF'
#!/bin/sh
while [ $# -gt 1 ]; do
    case $1 in -o|-p|-i) shift 2 ;; -*) shift ;; *) shift; break ;; esac
done
exec sh -c "$1"
EOF
chmod +x "$dir/bin/ssh"
remote() { # taskset-list slots hvdrun-args...
    mask=$1
    slots=$2
    shift 2
    PATH="$dir/bin:$PATH" run "$mask" -H "hvd-test-remote.invalid:$slots" \
        --network-interface lo "$@"
}
out=$(remote "$a" 2 -np 2 --bind-to core "$dir/show")
check "remote, 1 cpu, core" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$a omp=1 mkl=1 ob=1" "$out"
if [ -n "$b" ]; then
    out=$(remote "$a,$b" 2 -np 2 --bind-to core "$dir/show")
    check "remote, 2 cpus, core" "[0] cpus=$a omp=1 mkl=1 ob=1
[1] cpus=$b omp=1 mkl=1 ob=1" "$out"
    out=$(remote "$a,$b" 1 -np 1 --bind-to none "$dir/show" | sed "s/cpus=$a,$b/cpus=$a-$b/")
    check "remote, 2 cpus, 1 rank, none" "[0] cpus=$a-$b omp=2 mkl=2 ob=2" "$out"
    out=$(remote "$a,$b" 2 -np 2 --bind-to socket "$dir/show" |
        sed "s/cpus=$a,$b/cpus=$a-$b/")
    check "remote, 2 cpus, socket" "$want" "$out"
fi
out=$(OMP_NUM_THREADS=5 PATH="$dir/bin:$PATH" timeout 60 taskset -c "$a" \
    "$hvdrun" -H hvd-test-remote.invalid:1 --network-interface lo -np 1 \
    "$dir/show" 2>/dev/null)
check "remote, user's value" "[0] cpus=$a omp=5 mkl=1 ob=1" "$out"

# Elastic: the workers get them too, per host by its slots. The discovery
# script prints both forms of Kubeflow's MPI Operator: a bare host (taking
# --slots) and host:slots. Each worker waits (bounded) until all three have
# started, so none ends the job before the others are placed.
printf '#!/bin/sh\necho localhost\necho 127.0.0.1:1\n' >"$dir/discover"
chmod +x "$dir/discover"
mkdir "$dir/started"
mask=$a
[ -n "$b" ] && mask="$a,$b"
out=$(env -u OMP_NUM_THREADS -u MKL_NUM_THREADS -u OPENBLAS_NUM_THREADS \
    timeout 60 taskset -c "$mask" "$hvdrun" \
    --host-discovery-script "$dir/discover" --slots 2 -np 3 --max-np 3 \
    sh -c ': >'"$dir"'/started/$HVD_ELASTIC_WORKER; i=0
     while [ "$(ls '"$dir"'/started | wc -l)" -lt 3 ] && [ $i -lt 300 ]; do
         sleep 0.1; i=$((i + 1))
     done
     echo "$HVD_HOSTNAME omp=$OMP_NUM_THREADS"' 2>"$dir/err" |
    sed 's/^\[w[0-9]*\] //' | sort)
if [ -n "$b" ]; then
    want="127.0.0.1 omp=2
localhost omp=1
localhost omp=1"
else
    want="127.0.0.1 omp=1
localhost omp=1
localhost omp=1"
fi
check "elastic, discovery with both forms" "$want" "$out"

# A CPU quota (a container's CPU limit) caps the threads: 1 CPU of quota
# with 2 CPUs in the mask gives 1 thread, here and on a "remote" host.
# Needs root, 2 CPUs and a writable cgroup hierarchy with the cpu
# controller (v1 or v2); else this part is skipped (said).
cg=
if [ "$(id -u)" = 0 ] && [ -n "$b" ]; then
    if [ -w /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
        cg=/sys/fs/cgroup/cpu/hvd-binding-$$
        mkdir "$cg" 2>/dev/null && echo 100000 >"$cg/cpu.cfs_period_us" &&
            echo 100000 >"$cg/cpu.cfs_quota_us" || cg=
    elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
        cg=/sys/fs/cgroup/hvd-binding-$$
        mkdir "$cg" 2>/dev/null && echo "100000 100000" >"$cg/cpu.max" || cg=
    fi
fi
if [ -n "$cg" ]; then
    trap 'rm -rf "$dir"; rmdir "$cg" 2>/dev/null' EXIT
    in_cg() { # runs the rest in the cgroup
        sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg" "$@"
    }
    out=$(in_cg env -u OMP_NUM_THREADS -u MKL_NUM_THREADS \
        -u OPENBLAS_NUM_THREADS timeout 60 taskset -c "$a,$b" "$hvdrun" \
        -np 1 "$dir/show" 2>/dev/null | sed "s/cpus=$a,$b/cpus=$a-$b/")
    check "cpu quota 1, 2 cpus" "[0] cpus=$a-$b omp=1 mkl=1 ob=1" "$out"
    out=$(in_cg env -u OMP_NUM_THREADS -u MKL_NUM_THREADS \
        -u OPENBLAS_NUM_THREADS PATH="$dir/bin:$PATH" timeout 60 \
        taskset -c "$a,$b" "$hvdrun" -H hvd-test-remote.invalid:1 \
        --network-interface lo -np 1 "$dir/show" 2>/dev/null |
        sed "s/cpus=$a,$b/cpus=$a-$b/")
    check "remote, cpu quota 1, 2 cpus" "[0] cpus=$a-$b omp=1 mkl=1 ob=1" "$out"
    rmdir "$cg" 2>/dev/null
else
    echo "skip cpu quota: needs root, 2 CPUs and a writable cgroup cpu controller"
fi

# --mpi: mpirun gets --bind-to and the thread variables with -x.
cat >"$dir/bin/mpirun" <<'EOF'
#!/bin/sh
echo "$*"
EOF
chmod +x "$dir/bin/mpirun"
out=$(PATH="$dir/bin:$PATH" run "$a" --mpi -np 2 --bind-to core true)
check "--mpi --bind-to core" 1 "$(echo "$out" | grep -c -- '--bind-to core .*-x OMP_NUM_THREADS=1 -x MKL_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 true$')"
out=$(PATH="$dir/bin:$PATH" OMP_NUM_THREADS=4 timeout 60 taskset -c "$a" \
    "$hvdrun" --mpi -np 1 true)
check "--mpi keeps the user's" 0 "$(echo "$out" | grep -c -- '-x OMP_NUM_THREADS')"

if [ $fails -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all binding checks passed"
