#!/bin/sh
# The TensorFlow op library built against one TensorFlow (the build's,
# HVD_TF_PYTHON) loads in another TensorFlow 2.x and runs a 2-rank
# allreduce (eager and in a tf.function) and allgather there: it uses
# TensorFlow's C API only (docs/tensorflow.md, "The binary wheel and the
# op library").
#
#   run_tf_versions.sh HVDRUN LIBHVD OP_LIBRARY BUILT_WITH OTHER_TF_PYTHON
#
# OTHER_TF_PYTHON is an interpreter with another TensorFlow (e.g. a
# virtual environment with tensorflow-cpu==2.17.*; -DHVD_TF_OTHER_PYTHON).
# Exit status: 0, 1 (failed), or 77 (skip) without one.
set -eu
hvdrun=$1
libhvd=$2
oplib=$3
built=$4
other=$5
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "$other" ] || ! "$other" -c "import tensorflow" >/dev/null 2>&1; then
    echo "SKIP: no second TensorFlow (-DHVD_TF_OTHER_PYTHON=an interpreter with one)"
    exit 77
fi
[ -f "$oplib" ] || { echo "SKIP: no op library ($oplib)"; exit 77; }
version=$("$other" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null)
echo "packaging: the op library (built with TensorFlow $built) under TensorFlow $version"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
HVD_LIBRARY=$libhvd HVD_TF_LIBRARY=$oplib PYTHONPATH=$src/python \
    TF_CPP_MIN_LOG_LEVEL=2 HVD_START_TIMEOUT_SECONDS=120 \
    timeout 300 "$hvdrun" -np 2 "$other" "$src/tests/packaging/tf_versions_job.py" |
    tee "$tmp/out.txt"
[ "$(grep -c "TensorFlow $version, rank .* ok" "$tmp/out.txt")" -eq 2 ]
echo "packaging: ok"
