#!/bin/sh
# Installs the build into a scratch prefix and runs the installed package
# with the installed libhvd (found through hvd/_install.py, with no
# HVD_LIBRARY and no LD_LIBRARY_PATH) under the installed hvdrun.
#
#   run_install.sh BUILD_DIR PYTHON PYTHON_INSTALL_DIR
#
# Exit status: 0 pass, 1 fail, 77 when PYTHON or numpy is missing.
set -eu
build=$1
python=$2
pydir=$3
if [ -z "$python" ] || ! "$python" -c "import numpy" >/dev/null 2>&1; then
    echo "SKIP: $python cannot import numpy"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hvd_pyinstall.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
case $pydir in
/*) echo "SKIP: HVD_PYTHON_INSTALL_DIR is absolute ($pydir)"; exit 77 ;;
esac
pkg=$tmp/prefix/$pydir
for f in hvd/__init__.py hvd/_install.py hvd/torch/__init__.py; do
    [ -e "$pkg/$f" ] || { echo "missing after install: $pydir/$f"; exit 1; }
done

cat >"$tmp/check.py" <<'PY'
import sys
import numpy as np
import hvd

hvd.init()
where = hvd.library_path()
assert where.startswith(sys.argv[1]), where
out = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum)
n = hvd.size()
assert (out == n * (n + 1) / 2).all(), out
print("rank %d: %s from %s" % (hvd.rank(), out, where))
hvd.shutdown()
PY
unset HVD_LIBRARY LD_LIBRARY_PATH
# An ASan build's libhvd needs its runtime first (see run_python.sh).
asan=$(ldd "$build/libhvd.so" 2>/dev/null | awk '/libasan/ { print $3; exit }')
stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 / { print $NF; exit }')
if [ -n "$asan" ]; then
    set -- env "LD_PRELOAD=$asan${stdcxx:+ $stdcxx}" \
        "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$python"
else
    set -- "$python"
fi
PYTHONPATH=$pkg PYTHONDONTWRITEBYTECODE=1 timeout 120 \
    "$tmp/prefix/bin/hvdrun" -np 2 -- "$@" "$tmp/check.py" "$tmp/prefix/"
echo "python install test: PASS"
