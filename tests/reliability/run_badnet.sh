#!/bin/sh
# A job over two "hosts" (network namespaces joined by a veth pair) whose
# network misbehaves.
#
#   run_badnet.sh netem|loss|linkcut|latency HVDRUN TEST_SOAK TEST_FAULT
#                 LINKEM [TEST_LATENCY]
#
# netem    tc netem on both ends of the link: 20 ms delay with 5 ms jitter,
#          2 % loss, 10 % reordering. A 4-rank job runs 300 mixed
#          operations (allreduce, broadcast, allgather; up to 64 KiB) and
#          every result must be exact (test_soak without its first part,
#          an operation of every kind, dtype and power-of-two size: 870
#          more operations, most of two minutes over this link; the loss
#          mode keeps it). Where the kernel has no sch_netem, the link is
#          a TUN device in each namespace and LINKEM
#          (tests/reliability/linkem.c) forwards between them with the same
#          delay, jitter, loss and reordering, in user space; skipped (77)
#          only when neither can be had (no /dev/net/tun either).
# loss     The same job with 2 % of the TCP packets leaving either end of
#          the link dropped at random by nftables (numgen), for kernels
#          without sch_netem: no delay, no reordering, 400 operations up
#          to 1 MiB. Skipped (77) without nft.
# latency  The netem link (or hvd_linkem's), measured: the link's round-trip
#          time by a UDP ping (TEST_LATENCY --ping, no TCP, no hvd), then
#          small allreduces (4 B to 4 KiB, one at a time, every result
#          exact) by TEST_LATENCY: 300 with a name per size (cached: the
#          fast path) and 150 with a new name each (negotiated through
#          rank 0) at np 2, one rank per namespace, and 200 cached in the
#          4-rank layout below. Prints each run's median and p90 and their
#          ratio to the link's median RTT; asserts no time (they are
#          figures for docs/benchmarks.md), only that every result is
#          exact.
# linkcut  A 4-rank job of mixed allreduces (test_fault) runs with
#          HVD_TIMEOUT_SECONDS=3; at a random moment the link goes down
#          (ip link set down). Every rank must end with HVD_ERR_PEER_LOST or
#          HVD_ERR_TIMEOUT (prints PASS) within 10 s, and hvdrun must exit
#          non-zero within 15 s: no hang.
#
# hvdrun runs in namespace A with --network-interface hvdnet0 (the veth
# end has that name in both namespaces); ranks 0 and 1 run in A, ranks 2
# and 3 are moved to namespace B by `ip netns exec` before they start, so
# every pair of ranks but (0,1) and (2,3) talks over the link. While the
# job runs (once every rank's hvd_init has returned), the listening
# sockets of both namespaces are checked: only on A's link address (hvdrun's rendezvous; the ranks' own listeners are
# closed once the mesh is up). Each namespace is a host of its own to hvd
# (HVD_HOSTNAME), so its two ranks share memory and only the traffic
# between the hosts crosses the link. Needs root, ip netns and, for netem, tc;
# skipped (77) without them. Namespaces are named after this shell's pid
# and removed on exit, by a watchdog if the test is killed.
set -u

if [ $# -ne 5 ] && [ $# -ne 6 ]; then
    echo "usage: $0 netem|loss|linkcut|latency HVDRUN TEST_SOAK TEST_FAULT" \
        "LINKEM [TEST_LATENCY]" >&2
    exit 2
fi
mode=$1
hvdrun=$2
soak=$3
fault=$4
linkem=$5
latency=${6:-}
prefix=hvd-bn
ifname=hvdnet0
case $mode in
netem) addr_a=10.48.1.1 addr_b=10.48.1.2 ;;
linkcut) addr_a=10.48.2.1 addr_b=10.48.2.2 ;;
loss) addr_a=10.48.3.1 addr_b=10.48.3.2 ;;
latency) addr_a=10.48.4.1 addr_b=10.48.4.2 ;;
*)
    echo "run_badnet: unknown mode $mode" >&2
    exit 2
    ;;
esac

NETNS_LIB=$(cd "$(dirname "$0")/../integration" && pwd)/netns.sh
. "$NETNS_LIB"
if [ $mode = netem ] || [ $mode = latency ]; then
    netns_require "badnet $mode" timeout awk ss
elif [ $mode = loss ]; then
    netns_require "badnet $mode" timeout awk ss nft
else
    netns_require "badnet $mode" timeout awk ss
fi
netns_sweep $prefix

ns_a=$prefix-a-$$
ns_b=$prefix-b-$$
dir=$(mktemp -d /tmp/$prefix-$$.XXXXXX) || exit 1
trap 'netns_cleanup $prefix $$; rm -rf "$dir"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
netns_watchdog $prefix $$ "$dir"

fail() {
    echo "run_badnet: FAIL $mode: $*"
    [ -f "$dir/out" ] && cat "$dir/out"
    exit 1
}

# The netem mode's emulation in user space: a TUN device named $ifname in
# each namespace, point to point, and hvd_linkem between them.
linkem_pair() {
    ip netns add "$ns_a" && ip netns add "$ns_b" || return 1
    for side in a b; do
        if [ $side = a ]; then
            ns=$ns_a me=$addr_a peer=$addr_b
        else
            ns=$ns_b me=$addr_b peer=$addr_a
        fi
        ip -n "$ns" link set lo up &&
            ip -n "$ns" tuntap add dev $ifname mode tun &&
            ip -n "$ns" addr add $me peer $peer dev $ifname &&
            ip -n "$ns" link set $ifname mtu 1500 up || return 1
    done
    "$linkem" "$ns_a" "$ns_b" $ifname --delay-ms 20 --jitter-ms 5 \
        --loss-pct 2 --reorder-pct 10 --seconds 400 --seed $$ \
        >"$dir/linkem" 2>&1 &
    linkem_pid=$!
    # Up once both devices have a reader (the carrier comes on).
    n=0
    until ip -n "$ns_b" link show $ifname | grep -q LOWER_UP &&
        ip -n "$ns_a" link show $ifname | grep -q LOWER_UP; do
        n=$((n + 1))
        if [ $n -gt 100 ] || ! kill -0 $linkem_pid 2>/dev/null; then
            cat "$dir/linkem"
            return 1
        fi
        sleep 0.05
    done
}

emulator=none
if [ $mode = netem ] || [ $mode = latency ]; then
    if command -v tc >/dev/null 2>&1; then
        netns_pair "$ns_a" "$ns_b" $ifname $ifname $addr_a/24 $addr_b/24 ||
            fail "could not make the namespaces"
        for ns in "$ns_a" "$ns_b"; do
            if ! err=$(ip netns exec "$ns" tc qdisc add dev $ifname root \
                netem delay 20ms 5ms loss 2% reorder 10% 50% 2>&1); then
                echo "run_badnet: tc netem is not available ($err): the" \
                    "kernel lacks sch_netem (CONFIG_NET_SCH_NETEM);" \
                    "emulating the link in user space (hvd_linkem)"
                emulator=linkem
                break
            fi
        done
    else
        echo "run_badnet: no tc: emulating the link in user space (hvd_linkem)"
        emulator=linkem
    fi
    if [ $emulator = linkem ]; then
        netns_cleanup $prefix $$
        if [ ! -c /dev/net/tun ]; then
            echo "SKIP badnet netem: neither sch_netem nor /dev/net/tun"
            exit 77
        fi
        linkem_pair || fail "could not set up the user-space link"
        cat "$dir/linkem"
    else
        emulator=netem
        ip netns exec "$ns_a" tc qdisc show dev $ifname
    fi
    ops="--ops 300 --max-bytes 64K --first-part no"
else
    netns_pair "$ns_a" "$ns_b" $ifname $ifname $addr_a/24 $addr_b/24 ||
        fail "could not make the namespaces"
fi
if [ $mode = loss ]; then
    for ns in "$ns_a" "$ns_b"; do
        ip netns exec "$ns" nft -f - <<EOF || fail "nft could not load the loss rule"
table inet hvd_loss {
    chain out {
        type filter hook output priority 0; policy accept;
        oifname "$ifname" meta l4proto tcp numgen random mod 100 < 2 counter drop
    }
}
EOF
    done
    ops="--ops 400 --max-bytes 1M"
fi

# Ranks 2 and 3 start in namespace B. Each side counts as a host of its
# own (HVD_HOSTNAME): ranks of one side share memory, the two sides talk
# over the link, as two machines would.
wrapper='case $HVD_RANK in
    2|3) ns=$1; shift; HVD_HOSTNAME=hvd-host-b exec ip netns exec "$ns" "$@";;
    *) shift; HVD_HOSTNAME=hvd-host-a exec "$@";; esac'

# Listening TCP sockets of namespace $1, as "address:port" lines.
listeners() {
    ip netns exec "$1" ss -ltnH 2>/dev/null | awk '{ print $4 }'
}

# Checks that every listener of both namespaces is on A's link address.
check_listeners() {
    bad=$( (listeners "$ns_a"; listeners "$ns_b") | grep -v "^$addr_a:")
    if [ -n "$bad" ]; then
        echo "run_badnet: listeners:"
        listeners "$ns_a"
        listeners "$ns_b"
        fail "a socket listens elsewhere than on $addr_a: $bad"
    fi
    echo "run_badnet: listening sockets: $(listeners "$ns_a" | tr '\n' ' ')" \
        "in A, none in B: only the rendezvous, on the chosen interface"
}

# ---- latency ----
if [ $mode = latency ]; then
    [ -n "$latency" ] && [ -x "$latency" ] || fail "no TEST_LATENCY given"
    # The link's own round trip: UDP, no TCP, no hvd.
    ip netns exec "$ns_b" timeout 60 "$latency" --echo $addr_b 47000 5 \
        >"$dir/echo" 2>&1 &
    n=0
    until grep -q 'ECHO ready' "$dir/echo"; do
        n=$((n + 1))
        [ $n -le 100 ] || fail "the UDP echo did not start: $(cat "$dir/echo")"
        sleep 0.05
    done
    ping_line=$(ip netns exec "$ns_a" timeout 60 "$latency" --ping $addr_b \
        47000 100) || fail "UDP ping: $ping_line"
    echo "run_badnet: link: $ping_line"
    rtt=$(echo "$ping_line" | awk '{ print $7 }')
    # One rank per namespace for np 2; the 4-rank layout for np 4.
    wrapper2='case $HVD_RANK in
        1) ns=$1; shift; HVD_HOSTNAME=hvd-host-b exec ip netns exec "$ns" "$@";;
        *) shift; HVD_HOSTNAME=hvd-host-a exec "$@";; esac'
    # Runs TEST_LATENCY ARGS... as an NP-rank job with WRAPPER; prints its
    # figures and their ratios to the link's median RTT.
    latency_run() { # LABEL NP WRAPPER ARGS...
        label=$1 np=$2 wr=$3
        shift 3
        : >"$dir/out"
        ip netns exec "$ns_a" timeout -k 5 120 "$hvdrun" \
            --network-interface $ifname -np "$np" -- sh -c "$wr" sh "$ns_b" \
            "$latency" "$@" >"$dir/out" 2>&1
        rc=$?
        [ $rc -eq 0 ] || fail "$label: hvdrun exited $rc"
        [ "$(grep -c 'PASS latency rank' "$dir/out")" -eq "$np" ] ||
            fail "$label: not every rank printed PASS"
        sed -n 's/^\[0\] LATENCY //p' "$dir/out" |
            awk -v l="$label" -v r="$rtt" '{ printf "run_badnet: %s: %s" \
                " (median %.2f x RTT, p90 %.2f x RTT)\n", l, $0, $4 / r,
                $7 / r }'
    }
    start=$(date +%s)
    latency_run "np 2, cached" 2 "$wrapper2" --ops 150
    latency_run "np 2, a new name each" 2 "$wrapper2" --ops 80 --unique
    latency_run "np 4, cached" 4 "$wrapper" --ops 100
    if [ $emulator = linkem ]; then
        kill $linkem_pid 2>/dev/null
        wait $linkem_pid
        cat "$dir/linkem"
    fi
    echo "run_badnet: small allreduces (4 B to 4 KiB) over the bad link," \
        "every result exact, in $(($(date +%s) - start)) s"
    echo "run_badnet: PASS"
    exit 0
fi

if [ $mode != linkcut ]; then
    start=$(date +%s)
    : >"$dir/out"
    ip netns exec "$ns_a" timeout -k 5 280 "$hvdrun" \
        --network-interface $ifname -np 4 -- sh -c "$wrapper" sh "$ns_b" \
        "$soak" $ops --kinds mixed --seed $$ \
        >"$dir/out" 2>&1 &
    job=$!
    # Once every rank's hvd_init has returned (the mesh is up, the ranks'
    # own listeners closed; over a lossy link a SYN may be resent after a
    # second or more), and while the job still runs: who listens where.
    n=0
    until [ "$(grep -c 'READY soak rank' "$dir/out")" -ge 4 ] ||
        ! kill -0 $job 2>/dev/null || [ $n -gt 600 ]; do
        n=$((n + 1))
        sleep 0.1
    done
    if kill -0 $job 2>/dev/null; then
        [ "$(grep -c 'READY soak rank' "$dir/out")" -ge 4 ] ||
            fail "the ranks' hvd_init had not all returned after 60 s"
        check_listeners
    fi
    wait $job
    rc=$?
    cat "$dir/out"
    [ $rc -eq 0 ] || fail "hvdrun exited $rc"
    [ "$(grep -c 'PASS soak rank' "$dir/out")" -eq 4 ] ||
        fail "not every rank printed PASS"
    if [ $emulator = linkem ]; then
        kill $linkem_pid 2>/dev/null
        wait $linkem_pid
        cat "$dir/linkem"
        grep -q 'A->B packets [1-9]' "$dir/linkem" ||
            fail "no packet crossed the emulated link"
    fi
    if [ $mode = loss ]; then
        echo "run_badnet: packets dropped:" $(for ns in "$ns_a" "$ns_b"; do
            ip netns exec "$ns" nft list ruleset | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
        done) "(A, B)"
    fi
    echo "run_badnet: $(echo "$ops" | awk '{ print $2 }') mixed operations" \
        "over the bad link, every result exact, in $(($(date +%s) - start)) s"
    echo "run_badnet: PASS"
    exit 0
fi

# ---- linkcut ----
# Where the survivors say they have their verdict (test_fault.c).
HVD_TEST_SYNC_DIR=$dir/sync
export HVD_TEST_SYNC_DIR
mkdir -p "$HVD_TEST_SYNC_DIR"
delay=$(awk -v s="${HVD_FAULT_SEED:-$$}" 'BEGIN { srand(s); printf "%.3f", rand() * 1.5 }')
HVD_TIMEOUT_SECONDS=3
export HVD_TIMEOUT_SECONDS
: >"$dir/out"
ip netns exec "$ns_a" timeout -k 5 120 "$hvdrun" --grace-seconds 8 \
    --network-interface $ifname -np 4 -- sh -c "$wrapper" sh "$ns_b" \
    "$fault" --victim -1 --expect any >"$dir/out" 2>&1 &
job=$!
n=0
while [ "$(grep -c 'READY rank' "$dir/out")" -lt 4 ]; do
    n=$((n + 1))
    if [ $n -gt 600 ] || ! kill -0 $job 2>/dev/null; then
        wait $job
        fail "the ranks did not all start"
    fi
    sleep 0.05
done
check_listeners
sleep "$delay"
t_cut=$(date +%s.%N)
ip -n "$ns_a" link set $ifname down || fail "ip link set down"
wait $job
rc=$?
t_end=$(date +%s.%N)
cat "$dir/out"

detect=$(sed -n 's/.*DETECT rank .* wall \([0-9.]*\).*/\1/p' "$dir/out" |
    awk -v t="$t_cut" 'BEGIN { m = -1 } { d = $1 - t; if (d > m) m = d }
        END { printf "%.3f", m }')
exit_s=$(awk -v a="$t_cut" -v b="$t_end" 'BEGIN { printf "%.3f", b - a }')
echo "run_badnet: link cut ${delay} s into the loop: every rank reported" \
    "within $detect s, hvdrun exited $rc after $exit_s s"
[ "$(grep -c 'PASS fault rank' "$dir/out")" -eq 4 ] ||
    fail "not every rank ended with HVD_ERR_PEER_LOST or HVD_ERR_TIMEOUT"
[ $rc -ne 0 ] || fail "hvdrun exited 0"
awk -v d="$detect" 'BEGIN { exit !(d >= 0 && d <= 10) }' ||
    fail "detection took $detect s (limit 10 s)"
awk -v e="$exit_s" 'BEGIN { exit !(e <= 15) }' ||
    fail "hvdrun exited $exit_s s after the cut (limit 15 s)"
echo "run_badnet: PASS"
exit 0
