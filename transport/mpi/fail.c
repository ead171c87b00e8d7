/*
 * The MPI transport's failures (see mpi_internal.h): MPI's errors as
 * hvd's, and the first failure of an instance, told to every peer.
 */
#include "transport/mpi/mpi_internal.h"

#include <mpi.h>
#include <stdio.h>

#include "transport/base/error.h"

/* One wrapper turns MPI's errors into ours, with MPI's text. */
hvd_status hvd_mpi_error(hvd_status status, int err, const char *call) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;

    MPI_Error_string(err, text, &len);
    return hvd_error_set(status, "%s failed: %s", call, text);
}

/*
 * The transport's fail function (transport/bootstrap/failure.h): the first
 * failure wins; every request in flight completes with it; when this rank found
 * it (origin is this rank), every peer is told, so that none waits for a
 * rank that has stopped.
 */
hvd_status hvd_mpi_fail_with(void *arg, hvd_status status, int culprit,
                             int origin, const char *text) {
    mpi_tp *t = arg;

    (void)culprit;
    if (!hvd_tp_failure_set(&t->failure, "mpi", status, t->rank, origin, text))
        return hvd_tp_failure_error(&t->failure);
    for (int i = 0; i < t->n; i++) {
        t->entries[i].req->status = status;
        t->entries[i].req->done = 1;
    }
    if (origin == t->rank && t->abort_sends != NULL) {
        t->abort_out.status = (int32_t)status;
        snprintf(t->abort_out.text, sizeof(t->abort_out.text), "%s", text);
        for (int p = 0; p < t->size; p++)
            if (p != t->rank)
                MPI_Isend(&t->abort_out, (int)sizeof(t->abort_out), MPI_BYTE, p,
                          TAG_ABORT, t->comm, &t->abort_sends[p]);
    }
    return hvd_tp_failure_error(&t->failure);
}

hvd_status hvd_mpi_fail(mpi_tp *t, hvd_status status, const char *text) {
    return hvd_mpi_fail_with(t, status, -1, t->rank, text);
}

hvd_status hvd_mpi_fail_call(mpi_tp *t, int err, const char *call) {
    hvd_mpi_error(HVD_ERR_TRANSPORT, err, call);
    char text[HVD_ERROR_MAX];
    snprintf(text, sizeof(text), "%s", hvd_error_get());
    return hvd_mpi_fail(t, HVD_ERR_TRANSPORT, text);
}
