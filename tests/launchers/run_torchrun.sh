#!/usr/bin/env bash
# hvd under torchrun (PyTorch's elastic launcher), from the suite's own
# PyTorch (.venv-torch, tools/install-torch).
#
#   run_torchrun.sh MODE PYTHON LIBHVD TEST_COLLECTIVES
#
# MODE:
#   c            torchrun --standalone --nproc_per_node=2 --no-python of the
#                C test program: every rank passes with size 2
#   python       the same with the hvd.torch script torch_job.py
#   python_gloo  torch_job.py --gloo: the script also calls
#                torch.distributed.init_process_group("gloo")
#   restart      --max-restarts 1; rank 1 kills itself (SIGKILL) on the
#                first attempt: torchrun restarts both workers, the second
#                attempt passes and torchrun exits 0
#   nodes2       two "nodes", network namespaces joined by a veth pair,
#                each with its own host name: torchrun --nnodes 2
#                --nproc_per_node 1 --rdzv-backend=c10d on each (the
#                command line of examples/kubernetes/pytorchjob-torchrun.yaml)
# Exit status: 0 pass, 1 fail, 77 skip (no torch, not root for nodes2).
set -u
mode=$1
python=$2
lib=$3
collectives=$4
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)

if [ -z "$python" ] || ! "$python" -c "import torch, numpy" >/dev/null 2>&1; then
    echo "SKIP: no Python with torch for torchrun (${python:-none}): tools/install-torch" \
         "makes .venv-torch from PyPI (it could not, or was not run); or" \
         "configure with -DHVD_TORCH_PYTHON=..."
    exit 77
fi
bindir=$(dirname "$python")
if [ ! -x "$bindir/torchrun" ]; then
    echo "SKIP: $bindir has no torchrun"
    exit 77
fi
if [ "$mode" != c ] && ldd "$lib" 2>/dev/null | grep -q 'lib[at]san'; then
    echo "SKIP: the hvd.torch script does not run against a sanitizer build"
    exit 77
fi
export PATH=$bindir:$PATH
export HVD_LIBRARY=$lib PYTHONPATH=$src/python PYTHONDONTWRITEBYTECODE=1
export HVD_START_TIMEOUT_SECONDS=60 HVD_STALL_SHUTDOWN_SECONDS=30
# torchrun's own chatter (its warnings about OMP_NUM_THREADS) is not ours.
export LOGLEVEL=WARNING

out=$(mktemp /tmp/hvd-torchrun.XXXXXX)
trap 'rm -f "$out"' EXIT

# Checks that OUT has one PASS line per rank 0..N-1 with size N (and the
# extra pattern), prints OUT, and exits with the verdict.
verdict() { # RC N PATTERN
    local rc=$1 n=$2 pat=${3:-} r ok=1
    cat "$out"
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: torchrun exited with status $rc"
        exit 1
    fi
    for ((r = 0; r < n; r++)); do
        if ! grep -q "^PASS .* rank $r size $n\b.*$pat" "$out"; then
            echo "FAIL: no PASS line for rank $r of $n${pat:+ ($pat)}"
            ok=0
        fi
    done
    [ "$ok" = 1 ] || exit 1
    echo "ok: $mode"
    exit 0
}

standalone=(torchrun --standalone --nproc_per_node=2)
case $mode in
c)
    timeout 120 "${standalone[@]}" --no-python "$collectives" --quick \
        >"$out" 2>&1
    verdict $? 2
    ;;
python)
    timeout 120 "${standalone[@]}" "$here/torch_job.py" >"$out" 2>&1
    verdict $? 2 "launcher torchrun"
    ;;
python_gloo)
    timeout 120 "${standalone[@]}" "$here/torch_job.py" --gloo >"$out" 2>&1
    verdict $? 2 "launcher torchrun"
    ;;
restart)
    timeout 180 "${standalone[@]}" --max-restarts 1 "$here/torch_job.py" \
        --die-once >"$out" 2>&1
    rc=$?
    if ! grep -q "rank 1 kills itself" "$out"; then
        cat "$out"
        echo "FAIL: rank 1 did not kill itself on the first attempt"
        exit 1
    fi
    verdict $rc 2 "restart 1"
    ;;
nodes2)
    NETNS_LIB=$src/tests/integration/netns.sh
    # shellcheck source=../integration/netns.sh
    . "$NETNS_LIB"
    netns_require launchers.torchrun.nodes2 unshare timeout mount hostname
    prefix=hvd-tr
    netns_sweep "$prefix"
    dir=$(mktemp -d "/tmp/$prefix-$$.XXXXXX")
    netns_watchdog "$prefix" $$ "$dir"
    trap 'netns_cleanup "$prefix" $$; rm -rf "$dir" "$out"' EXIT
    ns_a=$prefix-a-$$
    ns_b=$prefix-b-$$
    netns_pair "$ns_a" "$ns_b" hvd0 hvd0 10.231.0.1/24 10.231.0.2/24 ||
        { echo "FAIL: could not make the namespaces"; exit 1; }
    # Each node's /etc/hosts names both, as a cluster's DNS does: the c10d
    # endpoint is node A's name, and torchrun gives the workers rank 0's
    # host name as MASTER_ADDR.
    printf '127.0.0.1 localhost\n10.231.0.1 hvd-node-a\n10.231.0.2 hvd-node-b\n' \
        >"$dir/hosts"
    # As the manifest's pods do: one secret, from outside, on every node.
    HVD_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    export HVD_SECRET
    # Runs torchrun on both nodes, as pytorchjob-torchrun.yaml does on
    # each pod, with SCRIPT ARGS; node N's output in $dir/nodeN.
    run_nodes() { # SCRIPT ARGS...
        local node ns name p rc=0 pids=()
        for node in 0 1; do
            ns=$ns_a name=hvd-node-a
            [ $node = 1 ] && ns=$ns_b name=hvd-node-b
            # shellcheck disable=SC2016 # expanded by that sh
            ip netns exec "$ns" unshare --uts sh -c \
                'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 &&
                 exec "$@"' sh "$name" "$dir/hosts" \
                timeout 120 torchrun --nnodes 2 --nproc_per_node 1 \
                --node_rank $node --rdzv-backend=c10d \
                --rdzv-endpoint=hvd-node-a:29500 --rdzv-id=hvd-job \
                "$@" >"$dir/node$node" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do
            wait "$p" || rc=$?
        done
        return $rc
    }
    # The example trainer with the manifest's arguments, then the script
    # with exact results.
    run_nodes "$src/examples/pytorch_synthetic.py" --batch-size 8 \
        --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2
    rc=$?
    cat "$dir/node0" "$dir/node1" | sed 's/^/[trainer] /'
    if [ $rc -ne 0 ] || ! grep -q "Total img/sec on 2" "$dir/node0" "$dir/node1"; then
        echo "FAIL: the trainer on two nodes: status $rc"
        exit 1
    fi
    run_nodes "$here/torch_job.py"
    rc=$?
    cat "$dir/node0" "$dir/node1" >"$out"
    verdict $rc 2 "launcher torchrun"
    ;;
*)
    echo "usage: $0 c|python|python_gloo|restart|nodes2 PYTHON LIBHVD TEST_COLLECTIVES" >&2
    exit 2
    ;;
esac
