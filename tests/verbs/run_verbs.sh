#!/bin/sh
# The verbs transport's integration tests, which depend on whether this
# machine has a usable RDMA device (verbs_probe decides, with the HVD_IB_*
# settings of the environment).
#
#   run_verbs.sh PROBE run CMD...
#       Runs CMD with HVD_TRANSPORT=verbs where a device is usable;
#       SKIP (77) where none is. Never PASS without a device.
#   run_verbs.sh PROBE refuse HVDRUN PROG
#       Where no device is usable: hvdrun -np 2 PROG (test_verbs_refusal)
#       with HVD_TRANSPORT=verbs must fail hvd_init with the refusal on both
#       ranks. SKIP (77) where a device is usable (nothing to refuse).
#   run_verbs.sh PROBE auto HVDRUN PROG
#       HVD_TRANSPORT=auto in a one-host job never picks RDMA, device or
#       not: shared memory carries it.
set -u
probe=$1
mode=$2
shift 2

why=$("$probe")
usable=$?
echo "verbs_probe: $why"

case $mode in
run)
    if [ $usable -ne 0 ]; then
        echo "SKIP: no usable RDMA device here ($why)"
        exit 77
    fi
    HVD_TRANSPORT=verbs
    export HVD_TRANSPORT
    exec "$@"
    ;;
refuse)
    if [ $usable -eq 0 ]; then
        echo "SKIP: an RDMA device is usable here, so there is nothing to refuse"
        exit 77
    fi
    out=$(HVD_TRANSPORT=verbs timeout 120 "$1" -np 2 -- "$2" 2>&1)
    rc=$?
    echo "$out"
    n=$(echo "$out" | grep -c "PASS verbs_refusal")
    if [ $rc -eq 0 ] && [ "$n" -eq 2 ]; then
        echo "run_verbs refuse: PASS"
        exit 0
    fi
    echo "run_verbs refuse: FAIL (exit $rc, $n PASS lines of 2)"
    exit 1
    ;;
auto)
    out=$(HVD_TRANSPORT=auto HVD_LOG_LEVEL=info timeout 120 "$1" -np 2 -- \
        "$2" --max-count 64 2>&1)
    rc=$?
    echo "$out" | grep -E "transport|PASS|FAIL"
    n=$(echo "$out" | grep -cE "transport shm( |$)")
    if [ $rc -eq 0 ] && [ "$n" -eq 2 ]; then
        echo "run_verbs auto: PASS"
        exit 0
    fi
    echo "run_verbs auto: FAIL (exit $rc, $n ranks on shm of 2)"
    exit 1
    ;;
*)
    echo "usage: $0 PROBE run|refuse|auto ..." >&2
    exit 2
    ;;
esac
