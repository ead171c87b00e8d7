#!/bin/sh
# A full /dev/shm (docs/reliability.md, "A full /dev/shm"): hvd_init must
# fail with a sentence, or auto go on over TCP, never a rank be killed by
# SIGBUS.
#
#   run_shmfull.sh HVDRUN TEST_SHMFULL HVD_BENCH
#
# As root, in a mount namespace of its own (unshare -m), with a tmpfs of
# its own on /dev/shm for each case:
#  a) HVD_TRANSPORT=shm, np 2 and 3, /dev/shm of 100 KiB and of 300 KiB
#     (a segment is 1.1 MiB at np 2, 1.6 MiB at np 3): every rank's
#     hvd_init fails with "/dev/shm has N KiB free but rank R's segment
#     needs M MiB (HVD_TRANSPORT=shm); free space in /dev/shm or use
#     HVD_TRANSPORT=tcp", exit status 1;
#  b) HVD_TRANSPORT=auto on the same: the job runs over TCP (hvd_path says
#     tcp/), every result exact, with a warning on each rank whose segment
#     did not fit and at most one per rank; at 4 MiB, room for two of np
#     3's three segments: two warnings (the rank that failed, and one
#     other on the host), or three when the ranks' fallocate calls raced
#     and two or three of them ran out of room part way; ranks named on two hosts (HVD_HOSTNAME), TCP
#     between them and shared memory within each, which fails on some or
#     all ranks: the job runs on TCP alone; and hvd-bench's rows up to
#     4 MiB;
#  c) HVD_TRANSPORT=shm with room for the segments (8 MiB), filled to the
#     last byte by this script once every rank has passed hvd_init: the
#     job runs to the end in shared memory (its segments were backed at
#     setup).
# Every rank runs under a wrapper that writes its output and exit status
# to files: no rank may end by a signal (status 128 or more), and hvdrun
# must not report one; no segment is left in /dev/shm. Exit status: 0
# pass, 1 fail, 77 skip.
set -u

if [ $# -ne 3 ]; then
    echo "usage: $0 HVDRUN TEST_SHMFULL HVD_BENCH" >&2
    exit 2
fi
hvdrun=$1
prog=$2
bench=$3

if [ "${HVD_SHMFULL_INNER:-0}" != 1 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "SKIP shmfull: needs root (a tmpfs of its own on /dev/shm)"
        exit 77
    fi
    for tool in timeout unshare mount; do
        if ! command -v $tool >/dev/null 2>&1; then
            echo "SKIP shmfull: $tool is not installed"
            exit 77
        fi
    done
    if ! unshare -m --propagation private sh -c \
        'mount -t tmpfs -o size=100k hvd-shmfull /dev/shm' 2>/dev/null; then
        echo "SKIP shmfull: cannot mount a tmpfs in a mount namespace here"
        exit 77
    fi
    HVD_SHMFULL_INNER=1 exec timeout 120 unshare -m --propagation private \
        sh "$0" "$@"
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd-shmfull.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fails=0
ncase=0
bad() {
    echo "run_shmfull: FAIL ($cname): $*"
    fails=$((fails + 1))
}

# A new case, $1, on a tmpfs of size $2 on /dev/shm (in place of the
# last one); its files go to $out.
begin() {
    cname=$1
    ncase=$((ncase + 1))
    out=$dir/$ncase
    mkdir "$out" || exit 1
    umount /dev/shm 2>/dev/null
    mount -t tmpfs -o "size=$2" hvd-shmfull /dev/shm || {
        echo "run_shmfull: FAIL: mount of a $2 tmpfs on /dev/shm"
        exit 1
    }
}

# Runs hvdrun NP with the environment in $2 (NAME=VALUE ...), each rank
# wrapped to write out.R and rc.R under $out; hvdrun's own output goes to
# hvdrun.out. The rest is the program and its arguments.
run_job() {
    np=$1
    envs=$2
    shift 2
    xs=""
    for e in $envs; do
        xs="$xs -x $e"
    done
    # shellcheck disable=SC2086
    # The warnings are counted: the log level is the default one.
    timeout 60 "$hvdrun" -np "$np" $xs -x HVD_LOG_LEVEL=warn \
        -x HVD_SHMFULL_OUT="$out" -- \
        sh -c 'if [ -n "${HVD_SHMFULL_HOSTS:-}" ]; then
                   HVD_HOSTNAME=h$((HVD_RANK * HVD_SHMFULL_HOSTS / HVD_SIZE))
                   export HVD_HOSTNAME
               fi
               "$@" >"$HVD_SHMFULL_OUT/out.$HVD_RANK" 2>&1
               echo $? >"$HVD_SHMFULL_OUT/rc.$HVD_RANK"' sh "$@" \
        >"$out/hvdrun.out" 2>&1
}

# Every rank ended by itself with a status below 128, hvdrun reported no
# signal, and nothing is left in /dev/shm but the files named in $1.
check_no_signal() {
    for r in $(seq 0 $((np - 1))); do
        if [ ! -f "$out/rc.$r" ]; then
            bad "rank $r did not end by itself"
            continue
        fi
        rc=$(cat "$out/rc.$r")
        [ "$rc" -lt 128 ] || bad "rank $r ended with status $rc (a signal)"
    done
    if grep -q "signal" "$out/hvdrun.out"; then
        bad "hvdrun reported a signal: $(grep signal "$out/hvdrun.out")"
    fi
    left=$(ls -A /dev/shm | grep -v "^${1:-none}\$")
    [ -z "$left" ] || bad "left in /dev/shm: $left"
}

show() {
    echo "--- $cname"
    for f in "$out"/out.* "$out/hvdrun.out"; do
        [ -f "$f" ] && sed "s|^|$(basename "$f"): |" "$f" | head -n 20
    done
}

sentence="/dev/shm has [0-9.]* [KM]iB free but rank [0-9]*'s segment needs [0-9.]* MiB (HVD_TRANSPORT=shm); free space in /dev/shm or use HVD_TRANSPORT=tcp"
warning="HVD_TRANSPORT=auto: shared memory could not be set up\|shared memory is not used"

# a) HVD_TRANSPORT=shm: a sentence on every rank, at hvd_init.
for size in 100k 300k; do
    for np in 2 3; do
        begin "shm np $np /dev/shm $size" $size
        run_job $np "HVD_TRANSPORT=shm" "$prog"
        show
        check_no_signal
        for r in $(seq 0 $((np - 1))); do
            rc=$(cat "$out/rc.$r" 2>/dev/null || echo none)
            [ "$rc" = 1 ] || bad "rank $r exited $rc, not 1"
            grep "FAIL shmfull rank $r: hvd_init" "$out/out.$r" |
                grep -q "$sentence" ||
                bad "rank $r: no hvd_init failure with the sentence"
        done
    done
done

# The same seen from hvdrun, the ranks not wrapped: a failure, no signal.
begin "shm np 3 /dev/shm 100k, as hvdrun sees it" 100k
timeout 60 "$hvdrun" -np 3 -x HVD_TRANSPORT=shm -- "$prog" \
    >"$out/hvdrun.out" 2>&1
rc=$?
show
{ [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ]; } || bad "hvdrun exited $rc"
if grep -q "signal" "$out/hvdrun.out"; then
    bad "hvdrun reported a signal: $(grep signal "$out/hvdrun.out")"
fi
grep -q "$sentence" "$out/hvdrun.out" || bad "no rank gave the sentence"

# The job passed over TCP: every rank's PASS and a tcp/ path; at most one
# warning per rank, and $1 to ${2:-$1} warnings in all (each naming the
# room left where a rank's own segment did not fit).
check_tcp_pass() {
    check_no_signal
    total=0
    for r in $(seq 0 $((np - 1))); do
        grep -q "PASS shmfull rank $r\$" "$out/out.$r" ||
            bad "rank $r did not pass"
        grep -q "PATH shmfull rank $r tcp/" "$out/out.$r" ||
            bad "rank $r's path is not tcp"
        n=$(grep -c "$warning" "$out/out.$r")
        [ "$n" -le 1 ] || bad "rank $r warned $n times"
        total=$((total + n))
        if [ "$n" -eq 1 ] &&
            ! grep "$warning" "$out/out.$r" | grep -q "free but"; then
            bad "rank $r's warning does not say why"
        fi
    done
    { [ "$total" -ge "$1" ] && [ "$total" -le "${2:-$1}" ]; } ||
        bad "$total warnings, expected $1 to ${2:-$1}"
}

# b) auto: the job goes on over TCP.
for size in 100k 300k; do
    for np in 2 3; do
        begin "auto np $np /dev/shm $size" $size
        run_job $np "HVD_TRANSPORT=auto" "$prog"
        show
        check_tcp_pass $np
    done
done
# Room for two of the three segments: one rank fails, the others do not;
# or, when the ranks back their segments at the same moment, two or all
# three run out of room part way (each a warning of its own).
begin "auto np 3 /dev/shm 4m" 4m
run_job 3 "HVD_TRANSPORT=auto" "$prog"
show
check_tcp_pass 2 3
# Two hosts by name: shared memory within h0 (ranks 0 and 1) beside TCP;
# its failure leaves TCP alone (a warning on ranks 0, 1 and on h1).
begin "auto np 3 two hosts /dev/shm 100k" 100k
run_job 3 "HVD_TRANSPORT=auto HVD_SHMFULL_HOSTS=2" "$prog"
show
check_tcp_pass 3
# Two hosts by name, two ranks each, room for two of the four segments:
# shared memory fails on some ranks of a host, or on both of one host,
# and not on the others; every rank must drop it. Warnings: the two that
# failed, and the first other rank of each host where one did not.
begin "auto np 4 two hosts /dev/shm 3m" 3m
run_job 4 "HVD_TRANSPORT=auto HVD_SHMFULL_HOSTS=2" "$prog"
show
check_tcp_pass 3 4
# hvd-bench's rows to 4 MiB, every result checked.
begin "auto np 2 hvd-bench /dev/shm 300k" 300k
run_job 2 "HVD_TRANSPORT=auto" "$bench" --minbytes 4 --maxbytes 4M --iters 2 --warmup 1
show
check_no_signal
for r in 0 1; do
    [ "$(cat "$out/rc.$r" 2>/dev/null)" = 0 ] ||
        bad "hvd-bench rank $r failed"
done
grep -q "^ *4194304 " "$out/out.0" || bad "no 4 MiB row"

# c) Room at setup, none after it.
begin "shm np 3 /dev/shm 8m filled after hvd_init" 8m
go="$dir/go"
rm -f "$go"
np=3
run_job 3 "HVD_TRANSPORT=shm" "$prog" "$go" &
job=$!
ready=0
for _ in $(seq 1 300); do
    ready=$(cat "$out"/out.* 2>/dev/null | grep -c "READY shmfull")
    [ "$ready" -eq 3 ] && break
    sleep 0.1
done
[ "$ready" -eq 3 ] || bad "only $ready ranks passed hvd_init"
dd if=/dev/zero of=/dev/shm/filler bs=64k 2>/dev/null
free=$(df -k /dev/shm | awk 'NR == 2 { print $4 }')
[ "$free" -eq 0 ] || bad "/dev/shm still has $free KiB free"
touch "$go"
wait $job
show
check_no_signal filler
for r in 0 1 2; do
    grep -q "PASS shmfull rank $r\$" "$out/out.$r" ||
        bad "rank $r did not pass"
    grep -q "PATH shmfull rank $r shm/" "$out/out.$r" ||
        bad "rank $r's path is not shm"
done

if [ "$fails" -ne 0 ]; then
    echo "run_shmfull: FAIL ($fails checks)"
    exit 1
fi
echo "run_shmfull: PASS"
exit 0
