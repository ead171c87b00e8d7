# Shell helpers for tests that make "hosts" out of network namespaces.
# Sourced (". netns.sh") by run_multihost.sh and the reliability network
# tests; POSIX sh.
#
# Every namespace a test makes is named PREFIX-SIDE-PID, PID being the
# test shell's pid, so that what a killed run left behind can be found and
# removed by a later run (netns_sweep) or by the run's watchdog, a process
# in its own session that outlives the test's process tree
# (netns_watchdog): ctest's timeout kills that tree with SIGKILL, and no
# trap runs then.

# Prints "SKIP <name>: <why>" and exits 77 unless this shell can make
# network namespaces: root, ip(8) with netns support, and the listed tools.
netns_require() { # NAME TOOL...
    _name=$1
    shift
    if [ "$(id -u)" -ne 0 ]; then
        echo "SKIP $_name: needs root (network namespaces)"
        exit 77
    fi
    for _tool in ip "$@"; do
        if ! command -v "$_tool" >/dev/null 2>&1; then
            echo "SKIP $_name: $_tool is not installed"
            exit 77
        fi
    done
    if ! _err=$(ip netns add "hvd-probe-$$" 2>&1); then
        echo "SKIP $_name: ip netns add failed: $_err"
        exit 77
    fi
    ip netns del "hvd-probe-$$"
}

# Removes the namespaces PREFIX-*-PID (and their processes). Quiet and
# idempotent.
netns_cleanup() { # PREFIX PID
    for _ns in $(ip netns list 2>/dev/null |
        sed -n "s/^\($1-[a-z0-9]*-$2\)\( .*\)\{0,1\}$/\1/p"); do
        _pids=$(ip netns pids "$_ns" 2>/dev/null)
        [ -n "$_pids" ] && kill -9 $_pids 2>/dev/null
        ip netns del "$_ns" 2>/dev/null
    done
}

# Removes what earlier runs with PREFIX that are gone left behind:
# namespaces PREFIX-*-PID and directories /tmp/PREFIX-PID.* of dead pids.
netns_sweep() { # PREFIX
    for _pid in $(ip netns list 2>/dev/null |
        sed -n "s/^$1-[a-z0-9]*-\([0-9][0-9]*\)\( .*\)\{0,1\}$/\1/p" | sort -u); do
        kill -0 "$_pid" 2>/dev/null || netns_cleanup "$1" "$_pid"
    done
    for _dir in /tmp/"$1"-[0-9]*.*; do
        [ -d "$_dir" ] || continue
        _pid=${_dir#/tmp/"$1"-}
        _pid=${_pid%%.*}
        kill -0 "$_pid" 2>/dev/null || rm -rf "$_dir"
    done
}

# Starts a watchdog in a session of its own: once process PID is gone it
# removes the namespaces PREFIX-*-PID and directory DIR.
netns_watchdog() { # PREFIX PID DIR
    command -v setsid >/dev/null 2>&1 || return 0
    (setsid sh -c '
        NETNS_LIB=$1
        . "$1"
        while kill -0 "$3" 2>/dev/null; do sleep 1; done
        netns_cleanup "$2" "$3"
        [ -n "$4" ] && rm -rf "$4"
    ' sh "$NETNS_LIB" "$1" "$2" "$3" </dev/null >/dev/null 2>&1 &)
}

# Makes namespaces NS_A and NS_B joined by a veth pair whose ends are
# IF_A in NS_A and IF_B in NS_B (the names may be equal: they live in
# different namespaces), with addresses ADDR_A and ADDR_B (CIDR), lo and
# both ends up. Returns non-zero, with a message, on failure.
netns_pair() { # NS_A NS_B IF_A IF_B ADDR_A ADDR_B
    ip netns add "$1" || return 1
    ip netns add "$2" || return 1
    ip link add "$3" netns "$1" type veth peer name "$4" netns "$2" ||
        { echo "netns_pair: ip link add veth failed"; return 1; }
    ip -n "$1" addr add "$5" dev "$3" || return 1
    ip -n "$2" addr add "$6" dev "$4" || return 1
    for _ns in "$1" "$2"; do
        ip -n "$_ns" link set lo up || return 1
    done
    ip -n "$1" link set "$3" up || return 1
    ip -n "$2" link set "$4" up || return 1
}

# The path of this file, for the watchdog (set by the sourcing script
# before sourcing: NETNS_LIB=/path/to/netns.sh).
: "${NETNS_LIB:?set NETNS_LIB to the path of netns.sh before sourcing it}"
