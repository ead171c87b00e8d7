#!/bin/sh
# hvdrun --check-build against this build: the transports and GPU parts
# the configure step found (BUILT, comma-separated), and hvd.torch as a
# framework when PYTHON imports torch.
#
#   run_check_build.sh HVDRUN PYTHON LIBHVD BUILT
set -eu
hvdrun=$1
python=$2
lib=$3
built=$4
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(HVD_PYTHON=$python HVD_LIBRARY=$lib PYTHONPATH=$src/python \
      "$hvdrun" --check-build)
echo "$out"
check() { # yes|no NAME
    mark=" "
    [ "$1" = yes ] && mark=X
    echo "$out" | grep -q "^    \[$mark\] $2\b" ||
        { echo "FAIL: expected [$mark] $2"; exit 1; }
}
for part in tcp shm mpi verbs; do
    case ",$built," in *",$part,"*) check yes "$part" ;; *) check no "$part" ;; esac
done
case ",$built," in *,cuda,*) check yes CUDA ;; *) check no CUDA ;; esac
case ",$built," in *,nccl,*) check yes NCCL ;; *) check no NCCL ;; esac
if "$python" -c "import torch" >/dev/null 2>&1; then
    check yes PyTorch
else
    check no PyTorch
fi
# A Python that lacks the hvd package says so.
HVD_PYTHON=$python "$hvdrun" --check-build | grep -q "hvd package is not importable" ||
    { echo "FAIL: no note for a Python without hvd"; exit 1; }
echo "check-build: ok"
