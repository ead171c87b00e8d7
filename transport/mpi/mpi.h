/*
 * The MPI transport (built when MPI is found) and hvd's use of MPI as a
 * bootstrap under mpirun.
 *
 * The transport sends hvd's messages as MPI messages on its own duplicate
 * of MPI_COMM_WORLD, the channel as the tag, and offers MPI's own
 * allreduce, allgather and broadcast (non-blocking forms, so that waits
 * stay bounded) as native collectives. MPI has no descriptor to sleep on:
 * an idle progress call polls, spinning briefly and then sleeping in
 * growing steps of at most 1 ms.
 *
 * hvd initializes MPI only when it needs it (started by mpirun without
 * hvdrun, or HVD_TRANSPORT=mpi) and then finalizes it at hvd_shutdown; if
 * the application initialized MPI, hvd uses that and never finalizes it.
 * The engine thread makes hvd's MPI calls, so the MPI transport needs
 * MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (the application must then
 * not call MPI concurrently with hvd unless it has MULTIPLE); bootstrapping
 * needs no thread support (it runs in hvd_init).
 */
#ifndef HVD_TRANSPORT_MPI_MPI_H
#define HVD_TRANSPORT_MPI_MPI_H

#include "transport/transport.h"

extern const hvd_transport_ops hvd_mpi_ops;

/* 1 if MPI is initialized (by the application or by hvd). */
int hvd_mpi_initialized(void);

/*
 * Initializes MPI unless it already is, asking for MPI_THREAD_SERIALIZED.
 * *rank_out and *size_out get MPI_COMM_WORLD's.
 */
hvd_status hvd_mpi_env_init(int *rank_out, int *size_out);

/* HVD_ERR_UNSUPPORTED with a sentence unless MPI gives the engine thread
 * leave to call it (SERIALIZED or MULTIPLE). */
hvd_status hvd_mpi_check_threads(void);

/* Finalizes MPI if hvd initialized it. */
void hvd_mpi_env_finalize(void);

/* A bootstrap whose allgather is MPI_Allgather (in hvd_init's thread). */
hvd_status hvd_mpi_bootstrap_open(hvd_bootstrap **out);
void hvd_mpi_bootstrap_close(hvd_bootstrap *bs);

/* Every rank passes ok; *all_ok_out is 1 if all passed 1. */
hvd_status hvd_mpi_agree(int ok, int *all_ok_out);

#endif
