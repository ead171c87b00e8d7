/*
 * MPI itself, for the job rather than an open instance (see
 * mpi_internal.h): initializing it when hvd needs it, finalizing it at
 * exit after an orderly end, and the job's bootstrap through it under
 * mpirun (the registry's bootstrap_open, at_shutdown hooks).
 */
#include "transport/mpi/mpi_internal.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

/* 1 when hvd initialized MPI (and so finalizes it). */
static int we_initialized;

int hvd_mpi_initialized(void) {
    int flag = 0;

    /* MPI cannot be initialized in a process that has no libmpi: then it
     * is not loaded just to ask. */
    if (!hvd_mpi_lib_load(1))
        return 0;
    MPI_Initialized(&flag);
    if (flag) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        flag = !finalized;
    }
    return flag;
}

hvd_status hvd_mpi_env_init(int *rank_out, int *size_out) {
    int provided = 0, err;

    if (!hvd_mpi_lib_load(0))
        return hvd_error_set(HVD_ERR_UNSUPPORTED, "MPI cannot be used: %s",
                             hvd_mpi_lib_why());
    if (!hvd_mpi_initialized()) {
        err = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (err != MPI_SUCCESS)
            return hvd_mpi_error(HVD_ERR_TRANSPORT, err, "MPI_Init_thread");
        we_initialized = 1;
        HVD_DEBUG("mpi", "initialized MPI (thread level %d)", provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank_out);
    MPI_Comm_size(MPI_COMM_WORLD, size_out);
    return HVD_OK;
}

hvd_status hvd_mpi_check_threads(void) {
    int level = MPI_THREAD_SINGLE;

    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "the application initialized MPI with thread "
                             "level %d, and hvd's engine thread needs "
                             "MPI_THREAD_SERIALIZED to use MPI: call "
                             "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, "
                             "...) (or MULTIPLE), or use HVD_TRANSPORT=tcp",
                             level);
    return HVD_OK;
}

void hvd_mpi_env_finalize(void) {
    if (we_initialized && hvd_mpi_initialized())
        MPI_Finalize();
    we_initialized = 0;
}

/* ------------------------------------------------------------------ */
/* Bootstrap and agreement                                             */

typedef struct mpi_bootstrap {
    hvd_bootstrap bs;
    MPI_Comm comm;
} mpi_bootstrap;

static hvd_status bs_allgather(hvd_bootstrap *bs, const void *mine, size_t len,
                               void *all_out) {
    mpi_bootstrap *m = bs->ctx;
    int err;

    if (len > INT_MAX)
        return hvd_error_set(HVD_ERR_INTERNAL, "bootstrap blob of %zu bytes",
                             len);
    err = MPI_Allgather(mine, (int)len, MPI_BYTE, all_out, (int)len, MPI_BYTE,
                        m->comm);
    return err == MPI_SUCCESS
               ? HVD_OK
               : hvd_mpi_error(HVD_ERR_TRANSPORT, err, "MPI_Allgather");
}

hvd_status hvd_mpi_bootstrap_open(hvd_bootstrap **out) {
    mpi_bootstrap *m;
    int rank, size, err;
    hvd_status st = hvd_mpi_env_init(&rank, &size);

    if (st != HVD_OK)
        return st;
    m = calloc(1, sizeof(*m));

    if (m == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    err = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (err != MPI_SUCCESS) {
        free(m);
        return hvd_mpi_error(HVD_ERR_TRANSPORT, err, "MPI_Comm_dup");
    }
    MPI_Comm_rank(m->comm, &m->bs.rank);
    MPI_Comm_size(m->comm, &m->bs.size);
    m->bs.allgather = bs_allgather;
    m->bs.ctx = m;
    *out = &m->bs;
    return HVD_OK;
}

void hvd_mpi_bootstrap_close(hvd_bootstrap *bs) {
    mpi_bootstrap *m;

    if (bs == NULL)
        return;
    m = bs->ctx;
    MPI_Comm_free(&m->comm);
    free(m);
}

/* Whether the last hvd_shutdown ended in order (then MPI is finalized at
 * exit, if hvd initialized it). */
static int orderly_end;

static void finalize_at_exit(void) {
    if (orderly_end)
        hvd_mpi_env_finalize();
}

/*
 * MPI, if hvd initialized it, is finalized when the process exits, so
 * that hvd_init may start the job again in the same process (MPI can be
 * initialized once only); and only after an orderly end: MPI_Finalize
 * waits for every rank, so after a lost or stopped rank it would never
 * return. MPI is then left as it is; the process is about to report the
 * failure and exit.
 */
void hvd_mpi_at_shutdown(int orderly) {
    static int registered;

    orderly_end = orderly;
    if (!registered && atexit(finalize_at_exit) == 0)
        registered = 1;
    if (!orderly)
        HVD_INFO("api", "not finalizing MPI: the job failed, and "
                        "MPI_Finalize would wait for the rank it lost");
}
