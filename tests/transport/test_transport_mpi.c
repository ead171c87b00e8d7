/*
 * The transport suite (suite.h) for the MPI transport: started by mpirun,
 * one process per rank, with MPI's own allgather as the bootstrap. Every
 * case opens the transport afresh (a new communicator).
 *
 *   mpirun -np NP test_transport_mpi [CASE...]
 *
 * The kill case is not run: a rank that exits without MPI_Finalize makes
 * mpirun end the whole job, so under MPI the launcher, not the transport,
 * deals with a lost rank (docs/design.md, "MPI").
 *
 * Exit 0 when every case passes on every rank, 77 when MPI cannot start
 * the job, 1 on a failure (mpirun then ends the other ranks).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "suite.h"
#include "transport/base/error.h"

/* Under mpirun a process cannot leave without ending the job. */
static void leave(suite_rank *r) {
    suite_fail("rank %d cannot leave an MPI job", r->rank);
}

int main(int argc, char **argv) {
    int rank, size, ran = 0;
    hvd_bootstrap *bs = NULL;
    const hvd_transport_ops *ops;

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(600);
    /* The registry's entry: its ops table with the stubs filled in. */
    if (hvd_transport_lookup("mpi", &ops) != HVD_OK) {
        printf("SKIP transport mpi: %s\n", hvd_error_get());
        return 77;
    }
    /* MPI itself through the registry's hooks, as hvd_init under mpirun:
     * initialized for the bootstrap, finalized at exit. */
    if (ops->bootstrap_open == NULL || ops->bootstrap_open(&bs) != HVD_OK) {
        printf("SKIP transport mpi: %s\n", hvd_error_get());
        return 77;
    }
    rank = bs->rank;
    size = bs->size;
    for (int i = 0; i < suite_ncases; i++) {
        const suite_case *tc = &suite_cases[i];
        suite_rank r = {.transport = "mpi",
                        .rank = rank,
                        .size = size,
                        .ops = ops,
                        .leave = leave};
        hvd_transport_params params;
        hvd_caps caps;

        if (!suite_wanted(i, size, argv + 1, argc - 1))
            continue;
        if (strcmp(tc->name, "kill") == 0) {
            if (rank == 0)
                printf("not run: transport mpi kill (mpirun ends the job "
                       "when a rank exits)\n");
            continue;
        }
        suite_params(&params, rank, size, bs, NULL, NULL, 4711);
        if (r.ops->probe(&params, &caps) != HVD_OK || !caps.usable) {
            printf("SKIP transport mpi: not usable here: %s\n", caps.reason);
            return 77;
        }
        if (r.ops->open(&params, &r.tp) != HVD_OK)
            suite_fail("open: %s", hvd_error_get());
        suite_run(&r, tc);
        ran++;
    }
    ops->bootstrap_close(bs);
    ops->at_shutdown(1);
    if (rank == 0)
        printf("PASS transport mpi np %d: %d cases\n", size, ran);
    return 0;
}
