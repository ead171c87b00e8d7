#!/bin/sh
# A connection flood at hvdrun's rendezvous while a rank starts late
# (hvd_flooder, flooder.c: one process, tens of thousands of connections
# a second on 127.0.0.1).
#
#   run_flood.sh start|elastic HVDRUN TEST_SOAK FLOODER RUNS
#   run_flood.sh timeout HVDRUN TEST_SOAK FLOODER
#
# start: RUNS jobs of 3 ranks. Rank 0 writes the rendezvous's address and
# the job id (from its environment) to a file, the flooder starts on that
# port, and rank 2 starts only once the flood has made 20,000
# connections; the flood goes on until the job ends. As root, every other
# run floods as the unprivileged user nobody. Pass: every job exits 0
# with exact results (3 "PASS soak rank" lines), the lines about strangers
# stay under 64 KiB per job, and hvdrun's summary ("the rendezvous was
# flooded by N unauthenticated connections") is there.
#
# elastic: the same against an elastic job's rendezvous (3 workers,
# --min-np 3; worker ids stand for ranks).
#
# timeout: a process of the job's user that read the job id holds the
# rendezvous's table full of well-formed hellos for rank 2 while rank 2
# starts, with HVD_START_TIMEOUT_SECONDS=4 for rank 2 (the others wait
# longer, so that rank 2 is the one to give up): rank 2 must fail saying that
# its connection was closed before the handshake finished and that the
# rendezvous may be flooded, not that it was refused ("wrong job or
# HVD_SECRET?").
#
# Exit status: 0 pass, 1 fail, 77 skip.
set -u

mode=${1:-}
if [ "$mode" != start ] && [ "$mode" != timeout ] && [ "$mode" != elastic ]; then
    echo "usage: $0 start|elastic|timeout HVDRUN TEST_SOAK FLOODER [RUNS]" >&2
    exit 2
fi
hvdrun=$2
soak=$3
flooder=$4
runs=${5:-1}
for tool in timeout; do
    if ! command -v $tool >/dev/null 2>&1; then
        echo "SKIP flood: $tool is not installed"
        exit 77
    fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_flood.XXXXXX") || exit 1
chmod 755 "$dir"
job=""
fl=""
cleanup() {
    [ -n "$fl" ] && kill "$fl" 2>/dev/null
    [ -n "$job" ] && kill "$job" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fail() {
    echo "run_flood: FAIL: $*"
    exit 1
}

# The unprivileged user, when this runs as root and one exists.
as_nobody=""
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1; then
    if command -v setpriv >/dev/null 2>&1; then
        as_nobody="setpriv --reuid=nobody --regid=$(id -g nobody) --clear-groups"
    elif command -v runuser >/dev/null 2>&1; then
        as_nobody="runuser -u nobody --"
    fi
fi

# The ranks' wrapper: rank 0 tells where the rendezvous is, the last rank
# waits for the flood (bounded: 60 s).
cat >"$dir/rank.sh" <<'EOF'
d=$1
shift
me=${HVD_RANK:-${HVD_ELASTIC_WORKER:-}}
if [ "$me" = 0 ]; then
    echo "$HVD_RENDEZVOUS_ADDR $HVD_RENDEZVOUS_PORT $HVD_JOB_ID" >"$d/rdv.tmp"
    mv "$d/rdv.tmp" "$d/rdv.addr"
fi
if [ "$me" = 2 ]; then
    [ -n "${FLOOD_RANK2_TIMEOUT:-}" ] &&
        export HVD_START_TIMEOUT_SECONDS=$FLOOD_RANK2_TIMEOUT
    n=0
    until [ -e "$d/f/flooding" ]; do
        n=$((n + 1))
        [ $n -gt 1200 ] && { echo "rank 2: the flood did not start"; exit 1; }
        sleep 0.05
    done
fi
exec "$@"
EOF

# Waits (bounded, 60 s) for the job to write rdv.addr; reads it.
wait_rdv() {
    n=0
    until [ -e "$dir/rdv.addr" ]; do
        n=$((n + 1))
        [ $n -gt 1200 ] && fail "run $1: rank 0 did not start"
        kill -0 "$job" 2>/dev/null || fail "run $1: the job ended early"
        sleep 0.05
    done
    read -r addr port jobid <"$dir/rdv.addr"
}

# One job under a flood: $1 run, $2 who floods ("" or $as_nobody), then
# the flooder's arguments after the port (and --hello JOB $hello_rank when
# that is set); leaves the job's status in rc.
flood_job() {
    i=$1
    who=$2
    shift 2
    rm -rf "$dir/rdv.addr" "$dir/f"
    mkdir "$dir/f" && chmod 777 "$dir/f"
    # shellcheck disable=SC2086
    timeout -k 5 90 "$hvdrun" -np 3 $job_args -- sh "$dir/rank.sh" "$dir" \
        "$soak" --ops 200 --max-bytes 64K --warmup 20 \
        >"$dir/out.$i" 2>&1 &
    job=$!
    wait_rdv "$i"
    hello=""
    [ -n "$hello_rank" ] && hello="--hello $jobid $hello_rank"
    # shellcheck disable=SC2086
    timeout -k 5 90 $who "$flooder" "$addr" "$port" --seconds 60 \
        --stop "$dir/f/stop" "$@" $hello >"$dir/flood.$i" 2>&1 &
    fl=$!
    wait $job
    rc=$?
    job=""
    : >"$dir/f/stop"
    wait $fl
    fl=""
}

if [ "$mode" = timeout ]; then
    # 40 connections, each with a hello for rank 2, held: the table (2
    # ranks + 20) stays full of connections the server must keep.
    hello_rank=2
    job_args=""
    export FLOOD_RANK2_TIMEOUT=4
    flood_job 1 "" --hold 40 --keep --mark 40 "$dir/f/flooding"
    echo "run_flood: $(cat "$dir/flood.1")"
    if grep -q 'wrong job or HVD_SECRET' "$dir/out.1" ||
        ! grep -q 'rank 2: could not reach the rendezvous at .* its connection was closed [0-9]* times before the handshake finished -- the rendezvous may be flooded by unauthenticated connections' "$dir/out.1"; then
        cat "$dir/out.1"
        fail "rank 2 did not fail with the flood's sentence"
    fi
    [ "$rc" -ne 0 ] || fail "the job succeeded although rank 2 could not join"
    grep 'could not reach' "$dir/out.1" | head -n 1 | sed 's/^/    /'
    echo "run_flood: PASS: a flood past the start timeout fails rank 2 with" \
        "the flood's sentence"
    exit 0
fi

hello_rank=""
job_args=""
[ "$mode" = elastic ] && job_args="--min-np 3 --max-np 3 --elastic-timeout 60"
total=0
for i in $(seq 1 "$runs"); do
    who=""
    [ -n "$as_nobody" ] && [ $((i % 2)) -eq 0 ] && who=$as_nobody
    flood_job "$i" "$who" --hold 64 --mark 20000 "$dir/f/flooding"
    user=root-or-self
    [ -n "$who" ] && user=nobody
    if [ "$rc" -ne 0 ] || [ "$(grep -c 'PASS soak rank' "$dir/out.$i")" -ne 3 ]; then
        cat "$dir/out.$i"
        cat "$dir/flood.$i"
        fail "run $i (flood as $user): the job exited $rc"
    fi
    bytes=$(grep -E 'rdv\] WARN (refused|dropped)' "$dir/out.$i" | wc -c)
    [ "$bytes" -lt 65536 ] ||
        fail "run $i: $bytes bytes of lines about strangers (at most 64 KiB)"
    grep -q 'the rendezvous was flooded by [0-9]* unauthenticated connections' \
        "$dir/out.$i" || {
        cat "$dir/out.$i"
        fail "run $i: no summary line from the rendezvous"
    }
    total=$((total + bytes))
    echo "run_flood: run $i (flood as $user): exit 0, exact;" \
        "$(cat "$dir/flood.$i"); $bytes bytes about strangers;" \
        "$(grep -o 'flooded by [0-9]* unauthenticated connections' "$dir/out.$i")"
done
echo "run_flood: PASS: $runs $mode jobs under a flood, every result exact," \
    "$total bytes of lines about strangers in all"
exit 0
