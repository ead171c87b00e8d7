/*
 * The MPI transport's native collectives (see mpi_internal.h): MPI's own
 * allreduce, allgather and broadcast, in their non-blocking forms so that
 * a wait stays bounded by the timeout and watches the peers.
 */
#include "transport/mpi/mpi_internal.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "transport/base/clock.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"

static int mpi_type(hvd_dtype dtype, MPI_Datatype *out) {
    switch (dtype) {
    case HVD_UINT8:
        *out = MPI_UINT8_T;
        return 0;
    case HVD_INT8:
        *out = MPI_INT8_T;
        return 0;
    case HVD_INT32:
        *out = MPI_INT32_T;
        return 0;
    case HVD_INT64:
        *out = MPI_INT64_T;
        return 0;
    case HVD_FLOAT32:
        *out = MPI_FLOAT;
        return 0;
    case HVD_FLOAT64:
        *out = MPI_DOUBLE;
        return 0;
    default:
        return -1; /* MPI has no float16/bfloat16 */
    }
}

static int mpi_op(hvd_op op, MPI_Op *out) {
    switch (op) {
    case HVD_SUM:
        *out = MPI_SUM;
        return 0;
    case HVD_MIN:
        *out = MPI_MIN;
        return 0;
    case HVD_MAX:
        *out = MPI_MAX;
        return 0;
    case HVD_PRODUCT:
        *out = MPI_PROD;
        return 0;
    default:
        return -1; /* average: the caller sums and divides */
    }
}

/* Waits for a non-blocking collective, bounded by the timeout. */
static hvd_status wait_collective(mpi_tp *t, MPI_Request *r, const char *call) {
    int64_t start = hvd_now_ns(), step = 1000;

    for (;;) {
        int flag = 0;
        int err = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS)
            return hvd_mpi_fail_call(t, err, call);
        if (flag)
            return HVD_OK;
        int64_t now = hvd_now_ns();
        hvd_status st = hvd_mpi_heartbeats(t, now);
        if (st != HVD_OK)
            return st;
        if (now - start > t->timeout_ns) {
            char text[256];
            snprintf(text, sizeof(text),
                     "%s did not complete within %.0f s: a rank is stopped "
                     "or far behind (HVD_TIMEOUT_SECONDS)",
                     call, (double)t->timeout_ns / 1e9);
            return hvd_mpi_fail(t, HVD_ERR_TIMEOUT, text);
        }
        if (now - start < SPIN_NS) {
            sched_yield();
        } else {
            hvd_mpi_nap(step);
            if (step < SLEEP_MAX_NS)
                step *= 2;
        }
    }
}

static hvd_status unsupported(hvd_dtype dtype, const char *what) {
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "MPI's native %s does not take dtype %d", what,
                         (int)dtype);
}

hvd_status hvd_mpi_allreduce(hvd_transport *tp, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype,
                             hvd_op op) {
    mpi_tp *t = (mpi_tp *)tp;
    MPI_Datatype type;
    MPI_Op mop;
    size_t esize = hvd_dtype_size(dtype);

    if (mpi_type(dtype, &type) != 0 || mpi_op(op, &mop) != 0)
        return unsupported(dtype, "allreduce");
    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    for (size_t off = 0; off < count || count == 0;) {
        size_t n = count - off < (size_t)INT_MAX ? count - off : INT_MAX;
        MPI_Request r;
        const void *src = sendbuf == recvbuf
                              ? MPI_IN_PLACE
                              : (const char *)sendbuf + off * esize;
        int err = MPI_Iallreduce(src, (char *)recvbuf + off * esize, (int)n,
                                 type, mop, t->comm, &r);
        if (err != MPI_SUCCESS)
            return hvd_mpi_fail_call(t, err, "MPI_Iallreduce");
        hvd_status st = wait_collective(t, &r, "MPI_Iallreduce");
        if (st != HVD_OK || count == 0)
            return st;
        off += n;
    }
    return HVD_OK;
}

hvd_status hvd_mpi_allgather(hvd_transport *tp, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype) {
    mpi_tp *t = (mpi_tp *)tp;
    size_t bytes = count * hvd_dtype_size(dtype);
    char *mine = (char *)recvbuf + (size_t)t->rank * bytes;
    MPI_Request r;

    if (bytes > INT_MAX)
        return unsupported(dtype, "allgather of more than 2 GiB per rank");
    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    /* Bytes: every dtype travels, and in place is MPI_IN_PLACE. */
    if (sendbuf != mine && bytes > 0)
        memmove(mine, sendbuf, bytes);
    int err = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, recvbuf, (int)bytes,
                             MPI_BYTE, t->comm, &r);
    if (err != MPI_SUCCESS)
        return hvd_mpi_fail_call(t, err, "MPI_Iallgather");
    return wait_collective(t, &r, "MPI_Iallgather");
}

hvd_status hvd_mpi_broadcast(hvd_transport *tp, void *buf, size_t count,
                             hvd_dtype dtype, int root) {
    mpi_tp *t = (mpi_tp *)tp;
    size_t bytes = count * hvd_dtype_size(dtype);

    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    for (size_t off = 0; off < bytes || bytes == 0;) {
        size_t n = bytes - off < PART_MAX ? bytes - off : PART_MAX;
        MPI_Request r;
        int err =
            MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, t->comm, &r);
        if (err != MPI_SUCCESS)
            return hvd_mpi_fail_call(t, err, "MPI_Ibcast");
        hvd_status st = wait_collective(t, &r, "MPI_Ibcast");
        if (st != HVD_OK || bytes == 0)
            return st;
        off += n;
    }
    return HVD_OK;
}
