#!/bin/sh
# Two jobs side by side on one host, same user: they must never talk to
# each other, and busy ports or ports in TIME_WAIT must not fail a start.
#
#   run_neighbours.sh HVDRUN TEST_SOAK
#
# HVD_NEIGHBOUR_ROUNDS rounds (8; the sanitizer builds run 3); in each,
# two 3-rank jobs start at the same moment and run
# 300 mixed operations each (allreduce, broadcast, allgather), from
# different seeds: the two jobs use the same names for different
# operations, so a connection across the jobs would fail a job or a check.
# Job B uses two sockets per pair of ranks (HVD_TCP_NSOCKS=2).
#
# As root, the jobs run in a network namespace of their own (a veth
# address, so that the kernel does not reuse TIME_WAIT ports as it does on
# loopback) whose ephemeral port range is only 64 ports wide
# (ip_local_port_range 40000-40063), so the two jobs draw their listening
# and connecting ports from the same few: before the first round 16 ports
# of the range are held by other listeners and 16 more are left in
# TIME_WAIT, and every round leaves its own connections in TIME_WAIT for
# the next: by the fifth round every port of the range is busy or has
# connections in TIME_WAIT (about 180 of them at the end), which is where
# bind(port 0) and connect() alone give up (transport/bootstrap/net.c then
# takes a port in TIME_WAIT itself). Without root the jobs share the host's
# loopback and its usual range. Pass: every job exits 0 with every rank's PASS. Exit status: 0
# pass, 1 fail, 77 skip.
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 HVDRUN TEST_SOAK" >&2
    exit 2
fi
hvdrun=$1
soak=$2
prefix=hvd-nb
ifname=hvdnb0
addr=10.48.4.1
rounds=${HVD_NEIGHBOUR_ROUNDS:-8}

for tool in timeout python3; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "SKIP neighbours: $tool is not installed"
        exit 77
    fi
done

dir=$(mktemp -d /tmp/$prefix-$$.XXXXXX) || exit 1
helper=""
fail() {
    echo "run_neighbours: FAIL: $*"
    exit 1
}

in_ns=""
iface_opt=""
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null 2>&1 &&
    ip netns add "hvd-probe-$$" 2>/dev/null; then
    ip netns del "hvd-probe-$$"
    NETNS_LIB=$(cd "$(dirname "$0")/../integration" && pwd)/netns.sh
    . "$NETNS_LIB"
    netns_sweep $prefix
    trap 'netns_cleanup $prefix $$; rm -rf "$dir"' EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    netns_watchdog $prefix $$ "$dir"
    ns=$prefix-a-$$
    netns_pair "$ns" "$prefix-b-$$" $ifname $ifname $addr/24 10.48.4.2/24 ||
        fail "could not make the namespace"
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="40000 40063" ||
        fail "could not narrow the port range"
    in_ns="ip netns exec $ns"
    iface_opt="--network-interface $ifname"

    # 16 ports held by listeners, 16 left in TIME_WAIT (the side that
    # closes first keeps it), until this script ends.
    $in_ns python3 - "$addr" "$dir/helper.ready" <<'EOF' &
import socket, sys, time
addr, ready = sys.argv[1], sys.argv[2]
held = []
for port in range(40000, 40032, 2):
    s = socket.socket()
    s.bind((addr, port))
    s.listen()
    held.append(s)
for port in range(40033, 40064, 2):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen()
    cli = socket.create_connection((addr, port))
    conn, _ = srv.accept()
    conn.close()  # this side closes first: TIME_WAIT on addr:port
    # The client closes only once the FIN has arrived (recv returns b"").
    cli.settimeout(10)
    cli.recv(1)
    cli.close()
    srv.close()
open(ready, "w").close()
time.sleep(600)
EOF
    helper=$!
    trap 'kill $helper 2>/dev/null; netns_cleanup $prefix $$; rm -rf "$dir"' EXIT
    n=0
    until [ -e "$dir/helper.ready" ]; do
        n=$((n + 1))
        [ $n -gt 200 ] && fail "the port helper did not start"
        kill -0 $helper 2>/dev/null || fail "the port helper failed"
        sleep 0.05
    done
    echo "run_neighbours: namespace $ns, ports 40000-40063: $($in_ns ss -ltnH | wc -l)" \
        "held by listeners, $($in_ns ss -tanH state time-wait | wc -l) in TIME_WAIT"
else
    trap 'rm -rf "$dir"' EXIT
    echo "run_neighbours: not root: both jobs on loopback, the host's port range"
fi

for round in $(seq 1 $rounds); do
    # shellcheck disable=SC2086
    $in_ns timeout -k 5 120 "$hvdrun" $iface_opt -np 3 -- "$soak" \
        --ops 300 --kinds mixed --max-bytes 256K --seed $((round * 2)) \
        >"$dir/a.$round" 2>&1 &
    job_a=$!
    # shellcheck disable=SC2086
    HVD_TCP_NSOCKS=2 $in_ns timeout -k 5 120 "$hvdrun" $iface_opt -np 3 -- \
        "$soak" --ops 300 --kinds mixed --max-bytes 256K \
        --seed $((round * 2 + 1)) >"$dir/b.$round" 2>&1 &
    job_b=$!
    wait $job_a
    rc_a=$?
    wait $job_b
    rc_b=$?
    tw=""
    [ -n "$in_ns" ] && tw=", $($in_ns ss -tanH state time-wait | wc -l) connections in TIME_WAIT after it"
    echo "run_neighbours: round $round: job A exited $rc_a, job B $rc_b$tw"
    for j in a b; do
        rc=$rc_a
        [ $j = b ] && rc=$rc_b
        if [ "$rc" -ne 0 ] || [ "$(grep -c 'PASS soak rank' "$dir/$j.$round")" -ne 3 ]; then
            cat "$dir/$j.$round"
            fail "job $j of round $round failed"
        fi
    done
    refused=$(cat "$dir/a.$round" "$dir/b.$round" | grep -c 'another job')
    [ "$refused" -eq 0 ] ||
        echo "run_neighbours: round $round: $refused connections refused as another job's"
done
echo "run_neighbours: PASS: $rounds rounds of two jobs side by side, every" \
    "result exact"
exit 0
