#!/bin/sh
# hvdrun --check-build asks the Python of the environment it is installed
# in: a virtual environment's bin/hvdrun, run by its path without
# activating the environment (its bin/ is not on PATH, and the python3 on
# PATH is a decoy that imports nothing), finds the hvd package and the
# frameworks that only that environment's python3 sees.
#
#   run_check_build_venv.sh HVDRUN PYTHON LIBHVD
#
# Exit status: 0, 1 on a failed check, 77 (skip) when PYTHON cannot make a
# virtual environment.
set -eu
hvdrun=$1
python=$2
lib=$3
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ -z "$python" ] || ! command -v "$python" >/dev/null 2>&1; then
    echo "SKIP: no Python interpreter (set -DHVD_PYTHON=/usr/bin/python3)"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hvd-venv-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The system's packages (torch, where installed) are the environment's too;
# the hvd package is the environment's alone, through a .pth file.
if ! "$python" -m venv --without-pip --system-site-packages "$tmp/venv" \
    >"$tmp/venv.log" 2>&1; then
    cat "$tmp/venv.log"
    echo "SKIP: $python cannot make a virtual environment (Debian:" \
         "apt-get install python3-venv)"
    exit 77
fi
venv_python=$tmp/venv/bin/python3
site=$("$venv_python" -c \
       'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site"
echo "$src/python" >"$site/hvd_source_tree.pth"
cp "$hvdrun" "$tmp/venv/bin/hvdrun"
mkdir "$tmp/decoy"
printf '#!/bin/sh\nexit 1\n' >"$tmp/decoy/python3"
chmod +x "$tmp/decoy/python3"

out=$(env -u HVD_PYTHON -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME \
      PATH="$tmp/decoy:/usr/bin:/bin" HVD_LIBRARY="$lib" \
      "$tmp/venv/bin/hvdrun" --check-build)
echo "$out"
fail() {
    echo "FAIL: $1"
    exit 1
}
echo "$out" | grep -qF "Available Frameworks (with $venv_python)" ||
    fail "hvdrun did not ask the environment's python3 ($venv_python)"
if echo "$out" | grep -q "hvd package is not importable"; then
    fail "the environment's hvd package was not found"
fi
if "$venv_python" -c "import torch" >/dev/null 2>&1; then
    echo "$out" | grep -q '^    \[X\] PyTorch' ||
        fail "the environment imports torch, but PyTorch is not marked"
else
    echo "$out" | grep -q '^    \[ \] PyTorch (torch is not installed)' ||
        fail "PyTorch should say torch is not installed"
fi
# An environment's python3 without the hvd package is not the one hvd was
# installed for: python3 on PATH (the decoy) is asked instead.
rm "$site/hvd_source_tree.pth"
out=$(env -u HVD_PYTHON -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME \
      PATH="$tmp/decoy:/usr/bin:/bin" HVD_LIBRARY="$lib" \
      "$tmp/venv/bin/hvdrun" --check-build)
echo "$out" | grep -qF "Available Frameworks (with python3)" ||
    fail "an environment without hvd should leave python3 on PATH"
# HVD_PYTHON still wins over the environment's interpreter.
out=$(env -u VIRTUAL_ENV -u PYTHONPATH PATH="$tmp/decoy:/usr/bin:/bin" \
      HVD_PYTHON="$tmp/decoy/python3" HVD_LIBRARY="$lib" \
      "$tmp/venv/bin/hvdrun" --check-build)
echo "$out" | grep -qF "Available Frameworks (with $tmp/decoy/python3)" ||
    fail "HVD_PYTHON was not used"
echo "check-build in a virtual environment: ok"
