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
 * hvdrun, or HVD_TRANSPORT=mpi) and then finalizes it at exit, after an
 * orderly hvd_shutdown; if
 * the application initialized MPI, hvd uses that and never finalizes it.
 * The engine thread makes hvd's MPI calls, so the MPI transport needs
 * MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (the application must then
 * not call MPI concurrently with hvd unless it has MULTIPLE); bootstrapping
 * needs no thread support (it runs in hvd_init).
 */
#ifndef HVD_TRANSPORT_MPI_MPI_H
#define HVD_TRANSPORT_MPI_MPI_H

#include "transport/transport.h"

/* The ops table, with the registry hooks bootstrap_open/bootstrap_close
 * (the job's bootstrap under mpirun) and at_shutdown (MPI finalized at
 * exit after an orderly end). */
extern const hvd_transport_ops hvd_mpi_ops;

/*
 * libmpi is loaded at run time (transport/mpi/lib.h), not linked: loads it
 * (once; with only_loaded, only if the process has it already) and returns
 * 1, or 0 with hvd_mpi_lib_why() saying why (hvdrun --check-build prints
 * it).
 */
int hvd_mpi_lib_load(int only_loaded);
const char *hvd_mpi_lib_why(void);

#endif
