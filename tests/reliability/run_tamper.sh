#!/bin/sh
# An attacker on the path between two "hosts" (network namespaces joined by
# a veth pair) tampers with a job's TCP data stream.
#
#   run_tamper.sh MODE ATTACK HVDRUN TEST_TAMPER RELAY
#
# MODE     HVD_TCP_PROTECT for the job: none, integrity or encrypt.
# ATTACK   flip, replay, drop, reorder, truncate, droptail: RELAY
#          (tests/reliability/tamper_relay.py) sits on the path and does
#          that once to one direction of one connection, in the middle of a
#          large payload, past the handshake (droptail: the last 1 KiB
#          before the sender waits for the receiver); clean: the relay forwards
#          everything unchanged (the harness's own check: every result
#          exact); mangle: no relay, an nftables rule rewrites 4 bytes of
#          the TCP payload of 1 in ~PERIOD large packets leaving namespace
#          A (numgen random), as the attack of issue 31 did; all: the six
#          attacks one after the other, a job each.
#
# The job: hvdrun in namespace A with --network-interface hvdnet0,
# HVD_TAMPER_NP ranks (default 2), the first half in namespace B, the
# others in A, each side a host of its own (HVD_HOSTNAME), over TCP. A rank
# connects to each lower rank, so the data connections between the sides
# leave A towards B's address,
# and a nat rule of A's output hook redirects them (only them: the
# rendezvous is hvdrun's, on A's own address) to the relay on
# 127.0.0.1:RELAY_PORT, except the relay's own connections, which carry
# the socket mark MARK (SO_MARK). The relay reads the original destination
# (SO_ORIGINAL_DST), connects there, forwards both ways, strikes once and
# prints what it did at which stream offset.
#
# Each rank (test_tamper.c) runs allreduces of 8 B to 4 MiB, float32 and
# int32, checks every result and prints OK, FAILED (status and sentence)
# or WRONG (HVD_OK with a wrong result), with HVD_TIMEOUT_SECONDS=5.
#
# With integrity or encrypt: every rank must end FAILED, none WRONG,
# hvdrun must exit non-zero, all within LIMIT_S of the start, and the last
# rank must fail within DETECT_S of the relay's strike. For flip,
# replay, reorder and mangle every rank's sentence must say "failed
# authentication"; for drop and truncate, which may end the stream, it may
# instead be a lost-peer or protocol sentence; for droptail, which leaves
# the receiver mid-frame, the HVD_ERR_TIMEOUT one ("sent only N bytes in T
# s in the middle of a frame"), or the authentication one if the sender
# went on; every sentence must name a
# rank across the link (the other rank, with two). With none, what happens is printed (that is what
# docs/reliability.md reports): only that nothing hangs is checked. With
# clean, every rank must print OK and hvdrun exit 0.
#
# Skipped (77) without root, ip netns, nft, timeout, awk, python3, or (for
# integrity and encrypt) a library without HVD_TCP_PROTECT. Namespaces are
# named after this shell's pid and removed on exit, by a watchdog if the
# test is killed.
set -u

if [ $# -ne 5 ]; then
    echo "usage: $0 none|integrity|encrypt" \
        "flip|replay|drop|reorder|truncate|droptail|mangle|clean|all HVDRUN" \
        "TEST_TAMPER" \
        "RELAY" >&2
    exit 2
fi
mode=$1
attack=$2
hvdrun=$3
tamper=$4
relay=$5
prefix=hvd-tp
ifname=hvdnet0
addr_a=10.48.7.1
addr_b=10.48.7.2
relay_port=7433
mark=0x4856
# Ranks: the first half in namespace B, the rest in A.
np=${HVD_TAMPER_NP:-2}
case $np in
2 | 4 | 6 | 8) ;;
*)
    echo "run_tamper: HVD_TAMPER_NP must be 2, 4, 6 or 8" >&2
    exit 2
    ;;
esac
half=$((np / 2))
# One large packet in PERIOD is rewritten in the mangle mode.
period=${HVD_TAMPER_PERIOD:-300}
# The relay's chunk (bytes replayed, dropped, swapped). A drop is small by
# default: when it falls at the end of what the sender sends before it
# waits for the receiver, the receiver waits for the missing bytes, and
# only heartbeats (24 B each, 40 B with a tag, one a second) come to fill
# them. Such a trickle does not keep the frame alive: mid-frame, only a
# completed frame or 64 KiB count as life, so the receiver fails with
# HVD_ERR_TIMEOUT ("sent only N bytes in 5 s in the middle of a frame")
# within HVD_TIMEOUT_SECONDS. droptail cuts the end of a burst on purpose.
if [ "$attack" = drop ]; then
    chunk=${HVD_TAMPER_CHUNK:-64}
else
    chunk=${HVD_TAMPER_CHUNK:-1024}
fi
# The whole job, attack and verdicts included, must end within this.
limit_s=30
# The last rank must fail within this of the relay's strike: twice
# HVD_TIMEOUT_SECONDS.
detect_s=10
case $mode in
none | integrity | encrypt) ;;
*)
    echo "run_tamper: unknown mode $mode" >&2
    exit 2
    ;;
esac
# all: each of the six attacks in turn, one job each (for none: what each
# does, printed, and that none of them hangs).
if [ "$attack" = all ]; then
    for a in flip replay drop reorder truncate mangle; do
        sh "$0" "$mode" $a "$hvdrun" "$tamper" "$relay"
        rc=$?
        [ $rc -eq 0 ] || exit $rc
    done
    echo "run_tamper: PASS (all six attacks, $mode)"
    exit 0
fi
case $attack in
flip | replay | drop | reorder | truncate | droptail | clean) use_relay=1 ;;
mangle) use_relay=0 ;;
*)
    echo "run_tamper: unknown attack $attack" >&2
    exit 2
    ;;
esac
name="tamper $mode $attack"

NETNS_LIB=$(cd "$(dirname "$0")/../integration" && pwd)/netns.sh
. "$NETNS_LIB"
netns_require "$name" timeout awk nft python3
netns_sweep $prefix

dir=$(mktemp -d /tmp/$prefix-$$.XXXXXX) || exit 1
ns_a=$prefix-a-$$
ns_b=$prefix-b-$$
trap 'netns_cleanup $prefix $$; rm -rf "$dir"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
netns_watchdog $prefix $$ "$dir"

fail() {
    echo "run_tamper: FAIL $name: $*"
    [ -f "$dir/out" ] && cat "$dir/out"
    [ -f "$dir/relay" ] && cat "$dir/relay"
    exit 1
}

HVD_TRANSPORT=tcp
HVD_TIMEOUT_SECONDS=5
export HVD_TRANSPORT HVD_TIMEOUT_SECONDS

# A library that does not know HVD_TCP_PROTECT ignores it: it would let
# everything through and the test would say nothing about protection.
if [ $mode != none ]; then
    HVD_TCP_PROTECT=no-such-mode timeout -k 5 30 "$hvdrun" -np 2 -- \
        "$tamper" --ops 1 >"$dir/probe" 2>&1
    if [ $? -eq 0 ]; then
        echo "SKIP $name: this build ignores HVD_TCP_PROTECT (a job with" \
            "HVD_TCP_PROTECT=no-such-mode ran): no frame protection to test"
        exit 77
    fi
fi
HVD_TCP_PROTECT=$mode
export HVD_TCP_PROTECT
# Where the ranks say they are ready (the relay strikes only then) and
# that they have their verdict (test_tamper.c).
HVD_TEST_SYNC_DIR=$dir/sync
export HVD_TEST_SYNC_DIR
mkdir -p "$HVD_TEST_SYNC_DIR"

netns_pair "$ns_a" "$ns_b" $ifname $ifname $addr_a/24 $addr_b/24 ||
    fail "could not make the namespaces"

if [ $use_relay -eq 1 ]; then
    arm_args=
    r=0
    while [ $r -lt $np ]; do
        arm_args="$arm_args --arm-file $HVD_TEST_SYNC_DIR/ready.$r"
        r=$((r + 1))
    done
    relay_attack=$attack
    : >"$dir/relay"
    [ $attack = clean ] && relay_attack=none
    ip netns exec "$ns_a" timeout -k 2 $((limit_s + 20)) python3 "$relay" \
        --attack $relay_attack --port $relay_port --mark $mark --chunk $chunk \
        --seed "${HVD_FAULT_SEED:-$$}" --seconds $((limit_s + 10)) \
        $arm_args >"$dir/relay" 2>&1 &
    relay_pid=$!
    n=0
    until grep -q '^relay: listening' "$dir/relay"; do
        n=$((n + 1))
        if [ $n -gt 200 ] || ! kill -0 $relay_pid 2>/dev/null; then
            fail "the relay did not start"
        fi
        sleep 0.05
    done
    ip netns exec "$ns_a" nft -f - <<EOF || {
table ip hvd_tamper {
    chain out {
        type nat hook output priority -100; policy accept;
        ip daddr $addr_b meta l4proto tcp meta mark != $mark counter redirect to :$relay_port
    }
}
EOF
        echo "SKIP $name: nft cannot load a nat redirect here (no nf_nat?)"
        exit 77
    }
else
    # Bytes 256-259 of the TCP segment (past any header with options) of
    # a large packet; in the output hook a packet can be a GSO
    # super-packet of up to 64 KiB, rewritten once.
    ip netns exec "$ns_a" nft -f - <<EOF || {
table ip hvd_tamper {
    chain out {
        type filter hook output priority 0; policy accept;
        oifname "$ifname" ip daddr $addr_b meta l4proto tcp meta length > 1000 numgen random mod $period == 0 counter @th,2048,32 set 0x5a5aa5a5
    }
}
EOF
        echo "SKIP $name: nft cannot rewrite TCP payloads here"
        exit 77
    }
fi

# Ranks below HALF run in namespace B, the others in A; each side is a
# host of its own. (A rank connects to each lower rank: every connection
# between the sides leaves A.)
wrapper='if [ "$HVD_RANK" -lt '$half' ]; then
    ns=$1; shift; HVD_HOSTNAME=hvd-host-b exec ip netns exec "$ns" "$@"
    else shift; HVD_HOSTNAME=hvd-host-a exec "$@"; fi'
ops=${HVD_TAMPER_OPS:-60}
[ $attack = mangle ] && ops=${HVD_TAMPER_OPS:-200}

start=$(date +%s.%N)
ip netns exec "$ns_a" timeout -k 5 $((limit_s + 10)) "$hvdrun" \
    --no-prefix --grace-seconds 3 --network-interface $ifname -np $np -- \
    sh -c "$wrapper" sh "$ns_b" "$tamper" --ops $ops --max-seconds $limit_s \
    >"$dir/out" 2>&1
rc=$?
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
if [ $use_relay -eq 1 ]; then
    kill $relay_pid 2>/dev/null
    wait $relay_pid 2>/dev/null
    cat "$dir/relay"
    grep -q '^relay: conn [0-9]*: ' "$dir/relay" ||
        fail "no connection went through the relay"
else
    echo "run_tamper: packets rewritten by nft:" $(ip netns exec "$ns_a" \
        nft list ruleset | sed -n 's/.*counter packets \([0-9]*\).*/\1/p')
fi
cat "$dir/out"

# The verdict of rank R: OK, FAILED, WRONG or none.
verdict() {
    awk -v r="$1" '{ sub(/:$/, "", $4) }
        $2 == "tamper" && $3 == "rank" && $4 == r &&
        ($1 == "OK" || $1 == "FAILED" || $1 == "WRONG") {
        if ($1 == "WRONG") w = 1; else v = $1 }
        END { print w ? "WRONG" : (v != "" ? v : "none") }' "$dir/out"
}

# The sentence of rank R's FAILED line, and what kind it is.
sentence() {
    sed -n "s/^FAILED tamper rank $1 op -\{0,1\}[0-9]* status \([A-Z_]*\) wall [0-9.]*: /\1: /p" \
        "$dir/out" | head -n 1
}
kind_of() {
    case $1 in
    *"failed authentication"*) echo auth ;;
    HVD_ERR_PEER_LOST:*) echo lost ;;
    HVD_ERR_PROTOCOL:*) echo protocol ;;
    HVD_ERR_TIMEOUT:*) echo timeout ;;
    *) echo other ;;
    esac
}

# Every rank's verdict and sentence; how many of each verdict.
summary=
n_ok=0 n_failed=0 n_wrong=0 n_none=0
r=0
while [ $r -lt $np ]; do
    v=$(verdict $r)
    st=$(sentence $r)
    summary="$summary; rank $r $v${st:+ ($(kind_of "$st"): $st)}"
    case $v in
    OK) n_ok=$((n_ok + 1)) ;;
    FAILED) n_failed=$((n_failed + 1)) ;;
    WRONG) n_wrong=$((n_wrong + 1)) ;;
    *) n_none=$((n_none + 1)) ;;
    esac
    r=$((r + 1))
done
echo "run_tamper: $name: hvdrun exited $rc after $elapsed s$summary"
attack_wall=$(sed -n 's/^relay: ATTACK .* wall \([0-9.]*\):.*/\1/p' \
    "$dir/relay" 2>/dev/null)
detect=
if [ -n "$attack_wall" ]; then
    last=$(sed -n 's/^FAILED tamper rank .* wall \([0-9.]*\):.*/\1/p' \
        "$dir/out" | sort -n | tail -n 1)
    if [ -n "$last" ]; then
        detect=$(awk -v a="$attack_wall" -v b="$last" \
            'BEGIN { printf "%.3f", b - a }')
        echo "run_tamper: $name: the last rank failed $detect s after the" \
            "attack"
    fi
fi

if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    fail "the job did not end within $((limit_s + 10)) s"
fi
[ $n_none -eq 0 ] || fail "a rank printed no verdict"
# In the sanitizer builds a report does not always change a verdict.
if grep -q 'WARNING: ThreadSanitizer\|ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' \
    "$dir/out"; then
    fail "a sanitizer reported an error"
fi
if [ $attack = clean ]; then
    [ $n_ok -eq $np ] && [ $rc -eq 0 ] ||
        fail "a clean relay must change nothing"
    echo "run_tamper: PASS"
    exit 0
fi
if [ $use_relay -eq 1 ] && ! grep -q '^relay: ATTACK' "$dir/relay"; then
    fail "the relay never struck (no large read past the handshake)"
fi
if [ $mode = none ]; then
    echo "run_tamper: PASS (unprotected: recorded, not judged)"
    exit 0
fi

[ $n_wrong -eq 0 ] ||
    fail "a call returned HVD_OK with a tampered result"
[ $n_failed -eq $np ] || fail "not every rank failed"
[ $rc -ne 0 ] || fail "hvdrun exited 0"
awk -v e="$elapsed" -v l=$limit_s 'BEGIN { exit !(e <= l) }' ||
    fail "the job took $elapsed s (limit $limit_s s)"
if [ -n "$detect" ]; then
    awk -v d="$detect" -v l=$detect_s 'BEGIN { exit !(d <= l) }' ||
        fail "the last rank failed $detect s after the strike (limit" \
            "$detect_s s)"
fi
# 0 if sentence $1 names a rank of the side that rank $2 is not on (with
# two ranks: the other rank).
names_other_side() {
    if [ "$2" -lt $half ]; then p=$half q=$np; else p=0 q=$half; fi
    while [ $p -lt $q ]; do
        echo "$1" | grep -Eq "rank $p([^0-9]|$)" && return 0
        p=$((p + 1))
    done
    return 1
}
r=0
while [ $r -lt $np ]; do
    st=$(sentence $r)
    k=$(kind_of "$st")
    case $attack:$k in
    *:auth | drop:lost | drop:protocol | truncate:lost | truncate:protocol) ;;
    droptail:timeout) ;;
    *) fail "rank $r's sentence is not the expected one ($k): $st" ;;
    esac
    names_other_side "$st" $r ||
        fail "rank $r's sentence names no rank across the link: $st"
    r=$((r + 1))
done
echo "run_tamper: PASS"
exit 0
