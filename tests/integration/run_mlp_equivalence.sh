#!/bin/sh
# Trains examples/train_mlp on 1 rank and on 2 ranks with the same global
# batch and checks that both end with the same weights.
#
#   run_mlp_equivalence.sh HVDRUN TRAIN_MLP
#
# Each rank's loss is the mean over its half of the global batch and the
# gradients are averaged across ranks, so the 2-rank update is the 1-rank
# update up to float rounding. Pass iff both runs succeed, the saved weight
# files hold the same number of values, max |a - b| <= 1e-5, and the 2-rank
# run's final loss is below its first printed loss.
# Exit status: 0 pass, 1 fail, 77 skip.

if [ $# -ne 2 ]; then
    echo "usage: $0 HVDRUN TRAIN_MLP" >&2
    exit 1
fi
hvdrun=$1
prog=$2
steps=100
tolerance=1e-5

if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: timeout(1) is not installed"
    exit 77
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_mlp.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

HVD_START_TIMEOUT_SECONDS=${HVD_START_TIMEOUT_SECONDS:-30}
export HVD_START_TIMEOUT_SECONDS

ok=1
for np in 1 2; do
    timeout 120 "$hvdrun" -np "$np" -- "$prog" --steps "$steps" \
        --save "$dir/w$np.txt" >"$dir/out$np.txt" 2>&1
    rc=$?
    cat "$dir/out$np.txt"
    if [ "$rc" -ne 0 ]; then
        echo "run_mlp_equivalence: FAIL: the $np-rank run exited $rc"
        ok=0
    elif [ ! -s "$dir/w$np.txt" ]; then
        echo "run_mlp_equivalence: FAIL: the $np-rank run saved no weights"
        ok=0
    fi
done
if [ "$ok" -ne 1 ]; then
    exit 1
fi

# Reads both files line by line; a difference in length fails, and so does
# a value that is not a finite number ("nan", "inf": some awks read them
# as 0).
if ! awk -v tol="$tolerance" '
    $1 !~ /^-?[0-9]/ { bad++ }
    NR == FNR { a[FNR] = $1; na = FNR; next }
    { b[FNR] = $1; nb = FNR }
    END {
        max = 0
        n = na < nb ? na : nb
        for (i = 1; i <= n; i++) {
            d = a[i] - b[i]
            if (d < 0) d = -d
            if (d > max) max = d
        }
        printf "run_mlp_equivalence: %d vs %d values, max |a-b| = %.3g " \
               "(tolerance %s), %d not finite\n", na, nb, max, tol, bad
        exit !(na == nb && na > 0 && bad == 0 && max <= tol + 0)
    }' "$dir/w1.txt" "$dir/w2.txt"; then
    echo "run_mlp_equivalence: FAIL: the weights differ"
    ok=0
fi

# Rank 0's lines: "[0] step S loss L ..." and "[0] final loss L ...".
loss_after() {
    grep "^\[0\] $1 " "$dir/out2.txt" | sed -n "$2" |
        awk '{ for (i = 1; i < NF; i++) if ($i == "loss") { print $(i + 1); exit } }'
}
first=$(loss_after step 1p)
# shellcheck disable=SC2016 # '$p' is sed's "last line", not a variable.
final=$(loss_after final '$p')
if [ -z "$first" ] || [ -z "$final" ]; then
    echo "run_mlp_equivalence: FAIL: no step or final loss line in the 2-rank run"
    ok=0
elif awk -v f="$first" -v l="$final" 'BEGIN { exit !(f + 0 > l + 0) }'; then
    echo "run_mlp_equivalence: loss fell from $first to $final"
else
    echo "run_mlp_equivalence: FAIL: loss did not fall ($first, then $final)"
    ok=0
fi

if [ "$ok" -eq 1 ]; then
    echo "run_mlp_equivalence: PASS"
    exit 0
fi
exit 1
