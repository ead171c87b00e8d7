#!/bin/sh
# DDP on hvd against DDP on Gloo (issue 33; docs/benchmarks.md): the same
# trainer (examples/pytorch_ddp.py) under torchrun at np 2 with
# backend="gloo", backend="hvd", without communication (--no-comm, the
# bound) and with a comm hook that communicates nothing (--noop-hook: DDP's
# own cost), for the small CNN and resnet18 at 32x32, one thread a rank,
# ROUNDS interleaved rounds (default 3). Not a test: prints one line a run,
# "MODEL CONFIG ROUND img/s", then the medians.
#
#   tests/python/bench_ddp.sh PYTHON LIBHVD [ROUNDS]
#
# PYTHON needs torch and torchrun, and torchvision for resnet18.
set -u
python=$1
lib=$2
rounds=${3:-3}
src=$(cd "$(dirname "$0")/../.." && pwd)
torchrun=$(dirname "$python")/torchrun
export HVD_LIBRARY=$lib PYTHONPATH=$src/python LOGLEVEL=WARNING
out=$(mktemp /tmp/hvd-bench-ddp.XXXXXX)
trap 'rm -f "$out"' EXIT
for round in $(seq 1 "$rounds"); do
    for model in cnn resnet18; do
        for config in gloo hvd nocomm noop; do
            case $config in
            nocomm) args="--backend hvd --no-comm" ;;
            noop) args="--backend hvd --noop-hook" ;;
            *) args="--backend $config" ;;
            esac
            # shellcheck disable=SC2086
            rate=$(timeout 600 "$torchrun" --standalone --nproc_per_node=2 \
                "$src/examples/pytorch_ddp.py" --model "$model" $args \
                --batch-size 32 --num-warmup-batches 3 \
                --num-batches-per-iter 10 --num-iters 3 2>&1 |
                sed -n 's/^Total img\/sec on 2 rank(s): //p')
            echo "$model $config $round ${rate:-FAILED}" | tee -a "$out"
        done
    done
done
echo "medians (img/s, total of 2 ranks):"
for model in cnn resnet18; do
    for config in gloo hvd nocomm noop; do
        awk -v m="$model" -v c="$config" '$1 == m && $2 == c { print $4 }' \
            "$out" | sort -n | awk -v m="$model" -v c="$config" \
            '{ v[NR] = $1 } END { printf "%s %s %s\n", m, c, v[int((NR + 1) / 2)] }'
    done
done
