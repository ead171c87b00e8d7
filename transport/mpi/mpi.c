/*
 * The MPI transport's ops table (transport/mpi/mpi.h); its files are listed
 * in mpi_internal.h.
 */
#include "transport/mpi/mpi_internal.h"

const hvd_transport_ops hvd_mpi_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "mpi",
    .title = "MPI",
    .probe = hvd_mpi_probe,
    .open = hvd_mpi_open,
    .isend = hvd_mpi_isend,
    .irecv = hvd_mpi_irecv,
    .irecv_upto = hvd_mpi_irecv_upto,
    .progress = hvd_mpi_progress,
    .wake = hvd_mpi_wake,
    .close = hvd_mpi_close,
    .allreduce = hvd_mpi_allreduce,
    .allgather = hvd_mpi_allgather,
    .broadcast = hvd_mpi_broadcast,
    .bootstrap_open = hvd_mpi_bootstrap_open,
    .bootstrap_close = hvd_mpi_bootstrap_close,
    .at_shutdown = hvd_mpi_at_shutdown,
};
