#!/bin/sh
# HVD_TRANSPORT=auto under mpirun, with TCP unable to start (a network
# interface that does not exist): every rank must say once why it uses MPI
# instead, and the collectives must still pass. Each rank names its own
# host (HVD_HOSTNAME), or auto would use shared memory, not the network.
# Usage: run_mpi_fallback.sh "MPIRUN FLAGS..." TEST_COLLECTIVES
set -u
mpirun=$1
prog=$2
out=$(timeout 120 $mpirun -np 2 -x HVD_TRANSPORT=auto -x HVD_IFACE=nonexistent0 \
    sh -c 'HVD_HOSTNAME=host$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
    "$prog" --max-count 1009 2>&1)
rc=$?
echo "$out"
n=$(echo "$out" | grep -c "using MPI instead")
p=$(echo "$out" | grep -c "PASS test_collectives")
if [ $rc -eq 0 ] && [ "$n" -eq 2 ] && [ "$p" -eq 2 ]; then
    echo "run_mpi_fallback: PASS"
    exit 0
fi
echo "run_mpi_fallback: FAIL (exit $rc, $n fallback lines, $p PASS lines)"
exit 1
