#!/bin/sh
# A job over two "hosts": two network namespaces joined by a veth pair,
# each running its own sshd (in its own UTS namespace, so the two have
# different host names). hvdrun runs in host A: A's two ranks are forked,
# B's two are started over ssh.
#
# Usage: run_multihost.sh HVDRUN TEST_MULTIHOST [TEST_ELASTIC]
#
# Needs root, ip netns, /usr/sbin/sshd, ssh, ssh-keygen and unshare;
# without them it exits 77 (skipped). Everything it makes is named after
# its pid and removed on exit; a watchdog outside the test's process tree
# removes it too when the test is killed (ctest's timeout sends SIGKILL),
# and a later run removes what a dead run left.
#
# Besides the 4-rank job (pass: exit 0 and four PASS lines, two from each
# host), it checks the remote side of hvdrun: a remote rank's status, the
# teardown of remote ranks when a local one fails and when hvdrun is
# killed (kill -9: its ssh clients, local ranks and remote programs, all
# ignoring SIGTERM, gone within 5 s), the message when ssh cannot connect,
# and that the job secret is on no command line. With TEST_ELASTIC, an
# elastic job across the two hosts too: host B added to the discovery
# script's output grows the job from 2 to 4 workers, removed shrinks it
# back to 2, added back grows it to 4 again (docs/elastic.md).
set -u

prefix=hvd-mh
addr_a=10.47.0.1
addr_b=10.47.0.2

if [ $# -ne 2 ] && [ $# -ne 3 ]; then
    echo "usage: $0 HVDRUN TEST_MULTIHOST [TEST_ELASTIC]" >&2
    exit 2
fi
hvdrun=$1
test_prog=$2
elastic_prog=${3:-}

NETNS_LIB=$(cd "$(dirname "$0")" && pwd)/netns.sh
. "$NETNS_LIB"

skip() {
    echo "SKIP multihost: $*"
    exit 77
}
netns_require multihost unshare timeout ssh ssh-keygen pgrep mount
[ -x /usr/sbin/sshd ] || skip "/usr/sbin/sshd is not installed (openssh-server)"

# What earlier runs that were killed left behind.
netns_sweep $prefix

ns_a=$prefix-a-$$
ns_b=$prefix-b-$$
dir=$(mktemp -d /tmp/$prefix-$$.XXXXXX) || exit 1
trap 'netns_cleanup $prefix $$; rm -rf "$dir"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
netns_watchdog $prefix $$ "$dir"

fails=0
check() { # name expected actual
    if [ "$2" = "$3" ]; then
        echo "ok   $1"
    else
        echo "FAIL $1: expected '$2', got '$3'"
        fails=$((fails + 1))
    fi
}
die() {
    echo "FAIL multihost: $*"
    for log in "$dir"/sshd-*.log; do
        [ -s "$log" ] && { echo "--- $log"; tail -n 20 "$log"; }
    done
    exit 1
}

# ---- the network ----
netns_pair "$ns_a" "$ns_b" "hvd-a-$$" "hvd-b-$$" $addr_a/24 $addr_b/24 ||
    die "making the two namespaces and their veth pair"

# ---- keys and sshds ----
ssh-keygen -q -t ed25519 -N '' -C hvd-mh-client -f "$dir/client" ||
    die "ssh-keygen"
cp "$dir/client.pub" "$dir/authorized_keys"
: >"$dir/known_hosts"
mkdir -p /run/sshd # sshd's privilege separation directory
for h in a b; do
    case $h in
    a) ns=$ns_a addr=$addr_a ;;
    *) ns=$ns_b addr=$addr_b ;;
    esac
    ssh-keygen -q -t ed25519 -N '' -C "hvd-host-$h" -f "$dir/host_$h" ||
        die "ssh-keygen (host key)"
    echo "$addr $(cut -d' ' -f1,2 "$dir/host_$h.pub")" >>"$dir/known_hosts"
    cat >"$dir/sshd_$h.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $dir/host_$h
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PrintMotd no
PidFile $dir/sshd-$h.pid
EOF
    ip netns exec "$ns" unshare --uts sh -c \
        'hostname "$1" && exec /usr/sbin/sshd -f "$2" -E "$3"' \
        sh "hvd-host-$h" "$dir/sshd_$h.conf" "$dir/sshd-$h.log" ||
        die "starting sshd in $ns (see $dir/sshd-$h.log)"
done
for h in a b; do
    n=0
    until [ -s "$dir/sshd-$h.pid" ]; do
        n=$((n + 1))
        [ $n -gt 100 ] && die "sshd of host $h wrote no pid file"
        sleep 0.1
    done
done

# Runs hvdrun in host A, which is named hvd-host-a there too.
in_a() {
    ip netns exec "$ns_a" unshare --uts sh -c \
        'hostname hvd-host-a && exec "$@"' sh "$@"
}
ssh_opts="-i $dir/client --ssh-opt UserKnownHostsFile=$dir/known_hosts
    --ssh-opt GlobalKnownHostsFile=/dev/null
    --ssh-opt StrictHostKeyChecking=yes --ssh-opt ConnectTimeout=10
    --ssh-opt GSSAPIAuthentication=no"

# ---- the job: 2 ranks forked in A, 2 over ssh in B ----
in_a timeout 120 "$hvdrun" -H $addr_a:2,$addr_b:2 $ssh_opts \
    "$test_prog" >"$dir/out" 2>&1
code=$?
cat "$dir/out"
check "4-rank job exits 0" 0 $code
check "PASS lines" 4 "$(grep -c '^\[[0-3]\] PASS multihost rank' "$dir/out")"
check "PASS lines from host A (forked)" 2 \
    "$(grep -c '^\[[01]\] PASS.*cross_rank 0 .* on hvd-host-a$' "$dir/out")"
check "PASS lines from host B (ssh)" 2 \
    "$(grep -c '^\[[23]\] PASS.*cross_rank 1 .* on hvd-host-b$' "$dir/out")"
if [ $code -ne 0 ] || [ $fails -ne 0 ]; then
    die "the 4-rank job failed"
fi

# ---- the hierarchical path over a shaped link ----
# The veth pair becomes a 1 Gbit/s link with 1 ms of delay (netem); where
# the kernel has no netem, tbf still limits the rate and the delay is left
# out (said below). With 2 ranks a host, auto must take hier (shared memory
# within each host, TCP between them) for the 4 MiB allreduce.
shaped=""
for pair in "$ns_a hvd-a-$$" "$ns_b hvd-b-$$"; do
    set -- $pair
    if ip netns exec "$1" tc qdisc add dev "$2" root netem delay 1ms \
        rate 1gbit 2>/dev/null; then
        shaped="netem delay 1ms rate 1gbit"
    elif ip netns exec "$1" tc qdisc add dev "$2" root tbf rate 1gbit \
        burst 256kb latency 50ms 2>/dev/null; then
        shaped="tbf rate 1gbit (no netem in this kernel: no added delay)"
    fi
done
echo "link: ${shaped:-unshaped (neither netem nor tbf)}"
in_a timeout 120 "$hvdrun" -H $addr_a:2,$addr_b:2 $ssh_opts \
    "$test_prog" >"$dir/out" 2>&1
code=$?
cat "$dir/out"
check "shaped 4-rank job exits 0" 0 $code
check "shaped: PASS lines" 4 "$(grep -c '^\[[0-3]\] PASS multihost rank' "$dir/out")"
check "auto takes hier for 4 MiB over two hosts" 1 \
    "$(grep -c '^\[0\] PATH allreduce 4194304: shm+tcp/hier/' "$dir/out")"
for pair in "$ns_a hvd-a-$$" "$ns_b hvd-b-$$"; do
    set -- $pair
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null
done

# ---- a remote rank's status and message ----
out=$(in_a timeout 60 "$hvdrun" -H $addr_a,$addr_b $ssh_opts \
    sh -c 'exit $((HVD_RANK * 7))' 2>&1)
code=$?
check "remote rank's status" 7 $code
case $out in
*"rank 1 on $addr_b exited with status 7"*) check "remote failure message" ok ok ;;
*) check "remote failure message" "rank 1 on $addr_b exited with status 7" "$out" ;;
esac

# ---- more ranks on one host than sshd lets log in at once ----
out=$(in_a timeout 60 "$hvdrun" -H $addr_b:16 $ssh_opts sh -c 'echo ok' 2>&1)
check "16 ranks over ssh: status" 0 $?
check "16 ranks over ssh: output" 16 "$(echo "$out" | grep -c '^\[[0-9]*\] ok$')"

# ---- the environment and directory of a remote rank ----
out=$(cd "$dir" && in_a timeout 60 "$hvdrun" -H $addr_b:2 -x HVD_MH_X=1 \
    -x "MH_Y=it's \"quoted\" \$x" $ssh_opts \
    sh -c 'echo "$HVD_RANK/$HVD_SIZE $HVD_LOCAL_RANK/$HVD_LOCAL_SIZE $HVD_CROSS_RANK/$HVD_CROSS_SIZE $HVD_MH_X $MH_Y $(pwd) $(hostname)"' |
    sort)
check "remote environment and directory" \
    "[0] 0/2 0/2 0/1 1 it's \"quoted\" \$x $dir hvd-host-b
[1] 1/2 1/2 0/1 1 it's \"quoted\" \$x $dir hvd-host-b" "$out"

# ---- thread variables and --bind-to core on a remote host ----
# Host B's wrapper counts its cores as hvdrun counts this machine's (the
# same CPUs and cgroup here), and binds the two ranks to different cores.
show='echo "$OMP_NUM_THREADS $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"'
here=$(in_a timeout 60 "$hvdrun" -np 2 --bind-to core sh -c "$show" |
    cut -d' ' -f2 | sort -u | tr '\n' ' ')
out=$(in_a timeout 60 "$hvdrun" -H $addr_b:2 --bind-to core $ssh_opts \
    sh -c "$show" | sort)
check "remote thread variables as here" "$here" \
    "$(echo "$out" | cut -d' ' -f2 | sort -u | tr '\n' ' ')"
if [ "$(nproc)" -ge 2 ]; then
    check "remote --bind-to core: the ranks on different cores" 2 \
        "$(echo "$out" | cut -d' ' -f3 | sort -u | wc -l)"
fi

# ---- the secret is on no command line, on either host ----
# printf is a shell builtin: the secret reaches grep on its stdin only.
# Each rank looks while the other is surely running: both say they have
# started, and neither ends before both have looked (files in the
# directory both hosts share, bounded polls).
sync_both='both() { i=0; while { [ ! -e "$1.0" ] || [ ! -e "$1.1" ]; } && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done; }; '
out=$(in_a timeout 60 "$hvdrun" -H $addr_a,$addr_b $ssh_opts sh -c "$sync_both"'
    : >"'"$dir"'/secret-up.$HVD_RANK"; both "'"$dir"'/secret-up"
    test -n "$HVD_SECRET" || echo "no secret"; printf "%s\n" "$HVD_SECRET" | grep -lF -f - /proc/[0-9]*/cmdline 2>/dev/null
    : >"'"$dir"'/secret-seen.$HVD_RANK"; both "'"$dir"'/secret-seen"' 2>&1)
check "secret on no command line" "" "$out"

# Does a process of host B run command line $1?
runs_in_b() {
    for pid in $(pgrep -x -f "$1"); do
        [ "$(ip netns identify "$pid" 2>/dev/null)" = "$ns_b" ] && return 0
    done
    return 1
}
# Polls for 5 s until no process of host B runs command line $1; prints 1
# if none does.
gone() {
    n=0
    while runs_in_b "$1"; do
        n=$((n + 1))
        [ $n -gt 50 ] && break
        sleep 0.1
    done
    echo $((n <= 50))
}

# ---- a failing local rank tears the remote one down ----
start=$(date +%s)
in_a timeout 60 "$hvdrun" --grace-seconds 1 -H $addr_a,$addr_b $ssh_opts \
    sh -c 'if [ $HVD_RANK = 0 ]; then
               i=0; while [ ! -e "'"$dir"'/remote-up" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
               exit 5
           fi
           : >"'"$dir"'/remote-up"; exec sleep 101' \
    >/dev/null 2>&1
check "local failure's status" 5 $?
check "remote rank stopped quickly" 1 $(($(date +%s) - start < 15))
check "no remote program left" 1 "$(gone "sleep 101")"

# ---- a remote program that ignores SIGTERM gets SIGKILL ----
start=$(date +%s)
in_a timeout 60 "$hvdrun" --grace-seconds 1 -H $addr_a,$addr_b $ssh_opts \
    sh -c 'trap "" TERM; [ $HVD_RANK = 0 ] && exit 3; exec sleep 103' \
    >/dev/null 2>&1
check "stubborn remote: status" 3 $?
check "stubborn remote: stopped quickly" 1 $(($(date +%s) - start < 15))
check "stubborn remote: killed" 1 "$(gone "sleep 103")"

# ---- a directory that host B does not have ----
# A tmpfs mounted in a mount namespace of host A's only.
mkdir "$dir/m"
out=$(ip netns exec "$ns_a" unshare --uts --mount sh -c \
    'hostname hvd-host-a && mount -t tmpfs hvd-mh "$1" && mkdir "$1/only-a" &&
     cd "$1/only-a" && shift && exec "$@"' \
    sh "$dir/m" timeout 60 "$hvdrun" -H $addr_a,$addr_b $ssh_opts true 2>&1)
check "missing remote directory: status" 127 $?
case $out in
*"cannot start rank 1 on $addr_b: there is no directory $dir/m/only-a there"*)
    check "missing remote directory: message" ok ok ;;
*) check "missing remote directory: message" "cannot start rank 1 ... no directory" "$out" ;;
esac

# The pid of hvdrun running command line $1: hvdrun's watchdog, a fork of
# it, has the same command line but another name.
hvdrun_of() {
    for pid in $(pgrep -x -f "$1"); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = hvdrun ] && echo "$pid"
    done | head -n 1
}

# ---- killing hvdrun kills the remote rank ----
in_a timeout 60 "$hvdrun" -H $addr_b $ssh_opts sleep 102 >/dev/null 2>&1 &
job=$!
n=0
until runs_in_b "sleep 102"; do
    n=$((n + 1))
    [ $n -gt 100 ] && break
    sleep 0.1
done
check "remote program started" 1 $((n <= 100))
hvdrun_pid=$(hvdrun_of "$hvdrun -H $addr_b .*")
[ -n "$hvdrun_pid" ] && kill -9 "$hvdrun_pid"
wait $job
check "remote program gone after kill -9 hvdrun" 1 "$(gone "sleep 102")"

# ---- kill -9 of hvdrun: no rank, ssh client or remote program is left ----
# Two ranks forked in A, two over ssh in B, every one ignoring SIGTERM:
# the local ranks get SIGKILL from hvdrun's watchdog after the grace
# period, the ssh clients go on their parent-death signal, and the remote
# wrapper sees its stdin close and kills the program after the grace
# period. All must be gone within 5 s (the time is printed).
in_a timeout 60 "$hvdrun" --grace-seconds 2 -H $addr_a:2,$addr_b:2 \
    $ssh_opts sh -c 'trap "" TERM; : >"'"$dir"'/orphan-up.$HVD_RANK"
        exec sleep 104' >/dev/null 2>&1 &
job=$!
n=0
until [ -e "$dir/orphan-up.0" ] && [ -e "$dir/orphan-up.1" ] &&
    [ -e "$dir/orphan-up.2" ] && [ -e "$dir/orphan-up.3" ]; do
    n=$((n + 1))
    [ $n -gt 300 ] && break
    sleep 0.1
done
check "killed hvdrun: all four ranks started" 1 $((n <= 300))
# The ssh clients hvdrun started, in host A.
ssh_clients() {
    for pid in $(pgrep -f "^ssh -T -o BatchMode=yes .* $addr_b "); do
        [ "$(ip netns identify "$pid" 2>/dev/null)" = "$ns_a" ] &&
            printf ' %s' "$pid"
    done
}
check "killed hvdrun: ssh clients running" 1 $(($(ssh_clients | wc -w) == 2))
hvdrun_pid=$(hvdrun_of "$hvdrun --grace-seconds 2 -H $addr_a:2,$addr_b:2 .*")
t_kill=$(date +%s.%N)
[ -n "$hvdrun_pid" ] && kill -9 "$hvdrun_pid"
n=0
while { [ -n "$(pgrep -x -f "sleep 104")" ] || [ -n "$(ssh_clients)" ]; } &&
    [ $n -lt 100 ]; do
    n=$((n + 1))
    sleep 0.05
done
took=$(awk -v a="$t_kill" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
wait $job
check "killed hvdrun: no ssh client left" "" "$(ssh_clients)"
check "killed hvdrun: no local or remote program left" "" \
    "$(pgrep -x -f "sleep 104")"
echo "     (kill -9 of hvdrun: local ranks, ssh clients and remote programs" \
    "gone after $took s, grace period 2 s)"

# ---- ssh cannot connect ----
out=$(in_a timeout 60 "$hvdrun" -H $addr_a,$addr_b -p 2 $ssh_opts true 2>&1)
check "ssh failure's status" 255 $?
case $out in
*"cannot start rank 1 on $addr_b: ssh exited with status 255 (ssh: connect to host $addr_b port 2: Connection refused)"*)
    check "ssh failure message" ok ok ;;
*) check "ssh failure message" "cannot start rank 1 on $addr_b: ssh exited with status 255 (...)" "$out" ;;
esac

# ---- an elastic job: host B joins the discovery output, then leaves ----
# Polls (at most 60 s) until the job's output has more than $1 lines
# matching $2.
more_lines() {
    n=0
    while [ "$(grep -c -- "$2" "$dir/elastic.out")" -le "$1" ]; do
        n=$((n + 1))
        [ $n -gt 600 ] && return 1
        sleep 0.1
    done
    return 0
}
if [ -n "$elastic_prog" ]; then
    printf '%s:2\n' $addr_a >"$dir/hosts"
    printf '#!/bin/sh\ncat %s\n' "$dir/hosts" >"$dir/discover.sh"
    chmod +x "$dir/discover.sh"
    in_a timeout 200 "$hvdrun" --min-np 2 --max-np 4 --elastic-timeout 60 \
        --host-discovery-script "$dir/discover.sh" \
        --network-interface "hvd-a-$$" $ssh_opts \
        "$elastic_prog" --stop-file "$dir/stop" --pace-us 2000 \
        >"$dir/elastic.out" 2>&1 &
    job=$!
    ok=1
    more_lines 1 "ELASTIC .* size 2 " || ok=0
    check "elastic: 2 workers on host A" 1 $ok
    printf '%s:2\n%s:2\n' $addr_a $addr_b >"$dir/hosts"
    more_lines 3 "ELASTIC .* size 4 " || ok=0
    check "elastic: host B added, 4 workers" 1 $ok
    before=$(grep -c "ELASTIC .* size 2 " "$dir/elastic.out")
    printf '%s:2\n' $addr_a >"$dir/hosts"
    more_lines $((before + 1)) "ELASTIC .* size 2 " || ok=0
    check "elastic: host B removed, 2 workers" 1 $ok
    before=$(grep -c "ELASTIC .* size 4 " "$dir/elastic.out")
    printf '%s:2\n%s:2\n' $addr_a $addr_b >"$dir/hosts"
    more_lines $((before + 3)) "ELASTIC .* size 4 " || ok=0
    check "elastic: host B back, 4 workers" 1 $ok
    touch "$dir/stop"
    wait $job
    check "elastic job's status" 0 $?
    check "elastic: PASS lines of size 4" 4 \
        "$(grep -c "PASS elastic .* size 4 " "$dir/elastic.out")"
    check "elastic: no remote worker left" 1 "$(gone "$elastic_prog.*")"
    [ $fails -eq 0 ] || tail -n 60 "$dir/elastic.out"
fi

[ $fails -eq 0 ] && echo "run_multihost: PASS" && exit 0
echo "run_multihost: $fails FAILED"
exit 1
