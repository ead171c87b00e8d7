#!/bin/sh
# tests/tensorflow/kill_rank.py on 2 ranks through run_tf.sh: hvdrun fails
# (rank 1 exits 3) and rank 0 has printed "PASS kill_rank".
#
#   run_kill.sh HVDRUN PYTHON LIBHVD LIBTF MODE
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
sh "$here/run_tf.sh" "$1" "$2" "$3" "$4" 2 "$here/kill_rank.py" "$5" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 77 ] && exit 77
if [ $rc -eq 0 ]; then
    echo "run_kill: FAIL: hvdrun exited 0 although rank 1 died"
    exit 1
fi
grep -q "^\[0\] PASS kill_rank" "$out" || { echo "run_kill: FAIL: no PASS from rank 0"; exit 1; }
echo "run_kill: PASS (hvdrun exited $rc)"
