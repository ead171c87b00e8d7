/*
 * The MPI transport's setup and teardown (see mpi_internal.h): probe, open
 * (its own duplicate of MPI_COMM_WORLD, the heartbeat and abort receives
 * always posted) and close.
 */
#include "transport/mpi/mpi_internal.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

hvd_status hvd_mpi_probe(const hvd_transport_params *params, hvd_caps *caps) {
    int size = 0;

    memset(caps, 0, sizeof(*caps));
    caps->native_collectives = 1;
    /* Between any ranks, but last: auto takes MPI only where nothing of
     * ours can connect the job. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 0;
    caps->usable = hvd_mpi_initialized();
    if (!caps->usable) {
        snprintf(caps->reason, sizeof(caps->reason),
                 "MPI is not initialized (start the job with mpirun)");
        return HVD_OK;
    }
    /* MPI initialized by the trainer itself, as a singleton under hvdrun,
     * is not this job's world. */
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != params->size) {
        caps->usable = 0;
        snprintf(caps->reason, sizeof(caps->reason),
                 "MPI's world has %d ranks and this job %d (start the job "
                 "with mpirun to use MPI)",
                 size, params->size);
    }
    return HVD_OK;
}

void hvd_mpi_close(hvd_transport *tp) {
    mpi_tp *t = (mpi_tp *)tp;

    if (t == NULL)
        return;
    if (hvd_mpi_initialized()) {
        /* A failure can leave requests MPI has completed already (their
         * handles are null): only the others are cancelled. */
        for (int i = 0; i < t->n; i++) {
            if (t->mreqs[i] == MPI_REQUEST_NULL)
                continue;
            MPI_Cancel(&t->mreqs[i]);
            MPI_Request_free(&t->mreqs[i]);
        }
        if (t->hb_recv != MPI_REQUEST_NULL) {
            MPI_Cancel(&t->hb_recv);
            MPI_Wait(&t->hb_recv, MPI_STATUS_IGNORE);
        }
        if (t->abort_recv != MPI_REQUEST_NULL) {
            MPI_Cancel(&t->abort_recv);
            MPI_Wait(&t->abort_recv, MPI_STATUS_IGNORE);
        }
        for (int p = 0; t->hb_sends != NULL && p < t->size; p++)
            if (t->hb_sends[p] != MPI_REQUEST_NULL)
                MPI_Request_free(&t->hb_sends[p]);
        for (int p = 0; t->abort_sends != NULL && p < t->size; p++)
            if (t->abort_sends[p] != MPI_REQUEST_NULL)
                MPI_Request_free(&t->abort_sends[p]);
        if (t->comm != MPI_COMM_NULL)
            MPI_Comm_free(&t->comm);
    }
    free(t->hb_sends);
    free(t->abort_sends);
    free(t->last_rx);
    free(t->mreqs);
    free(t->entries);
    free(t->idx);
    free(t->sts);
    free(t);
}

hvd_status hvd_mpi_open(const hvd_transport_params *params,
                        hvd_transport **out) {
    mpi_tp *t;
    int err, rank, size;
    hvd_status st;

    if (!hvd_mpi_initialized())
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=mpi: MPI is not initialized; "
                             "start the job with mpirun (or hvdrun --mpi)");
    st = hvd_mpi_check_threads();
    if (st != HVD_OK)
        return st;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != params->rank || size != params->size)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=mpi: MPI says rank %d of %d but "
                             "the job is rank %d of %d: the ranks were not "
                             "started by one mpirun (use mpirun, or hvdrun "
                             "--mpi)",
                             rank, size, params->rank, params->size);
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    t->base.ops = &hvd_mpi_ops;
    t->comm = MPI_COMM_NULL;
    t->hb_recv = MPI_REQUEST_NULL;
    t->abort_recv = MPI_REQUEST_NULL;
    t->rank = rank;
    t->size = size;
    t->timeout_ns = params->timeout_ns;
    t->hb_sends = malloc((size_t)size * sizeof(*t->hb_sends));
    t->abort_sends = malloc((size_t)size * sizeof(*t->abort_sends));
    t->last_rx = calloc((size_t)size, sizeof(*t->last_rx));
    if (t->hb_sends == NULL || t->abort_sends == NULL || t->last_rx == NULL) {
        hvd_mpi_close(&t->base);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    for (int p = 0; p < size; p++)
        t->hb_sends[p] = t->abort_sends[p] = MPI_REQUEST_NULL;
    err = MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    if (err == MPI_SUCCESS)
        err = MPI_Irecv(&t->hb_in, 1, MPI_BYTE, MPI_ANY_SOURCE, TAG_HEARTBEAT,
                        t->comm, &t->hb_recv);
    if (err == MPI_SUCCESS)
        err = MPI_Irecv(&t->abort_in, (int)sizeof(t->abort_in), MPI_BYTE,
                        MPI_ANY_SOURCE, TAG_ABORT, t->comm, &t->abort_recv);
    if (err != MPI_SUCCESS) {
        st = hvd_mpi_error(HVD_ERR_TRANSPORT, err, "MPI_Comm_dup");
        hvd_mpi_close(&t->base);
        return st;
    }
    HVD_DEBUG("mpi", "MPI transport open: rank %d of %d", rank, size);
    *out = &t->base;
    return HVD_OK;
}
