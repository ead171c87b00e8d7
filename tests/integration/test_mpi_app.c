/*
 * A trainer that initializes MPI itself, then hvd: hvd must use that MPI
 * (rank and size agree), run its collectives, and leave MPI initialized at
 * hvd_shutdown for the application to finalize. Run under mpirun.
 * Argument: "serialized" (MPI_THREAD_SERIALIZED) or "single"
 * (MPI_THREAD_SINGLE: HVD_TRANSPORT=mpi must then be refused with
 * HVD_ERR_UNSUPPORTED, while tcp works). Exit 0 pass, 1 fail.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include <hvd/hvd.h>

#include "testutil.h"

static int fail_line(int rank, const char *what) {
    printf("FAIL mpi_app rank %d: %s: %s\n", rank, what, hvd_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int want = argc > 1 && strcmp(argv[1], "single") == 0
                   ? MPI_THREAD_SINGLE
                   : MPI_THREAD_SERIALIZED;
    int provided, mrank, msize, finalized = 0, flag = 0;
    const char *transport = getenv("HVD_TRANSPORT");

    MPI_Init_thread(&argc, &argv, want, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    MPI_Comm_size(MPI_COMM_WORLD, &msize);

    hvd_status st = hvd_init();
    if (want == MPI_THREAD_SINGLE && provided < MPI_THREAD_SERIALIZED &&
        transport != NULL && strcmp(transport, "mpi") == 0) {
        /* hvd's engine thread may not call an MPI initialized like this. */
        if (st != HVD_ERR_UNSUPPORTED ||
            strstr(hvd_last_error(), "MPI_THREAD_SERIALIZED") == NULL)
            return fail_line(mrank, "expected HVD_ERR_UNSUPPORTED");
        printf("PASS mpi_app rank %d: refused: %s\n", mrank, hvd_last_error());
        MPI_Finalize();
        return 0;
    }
    if (st != HVD_OK)
        return fail_line(mrank, "hvd_init");
    if (hvd_rank() != mrank || hvd_size() != msize)
        return fail_line(mrank, "rank/size differ from MPI's");

    int64_t v[1000], got[1000];
    for (int i = 0; i < 1000; i++)
        v[i] = i + mrank;
    st = hvd_allreduce("mpi_app.sum", v, got, 1000, HVD_INT64, HVD_SUM);
    if (st != HVD_OK)
        return fail_line(mrank, "hvd_allreduce");
    for (int i = 0; i < 1000; i++) {
        int64_t want_v = (int64_t)i * msize + (int64_t)msize * (msize - 1) / 2;
        if (got[i] != want_v) {
            printf("FAIL mpi_app rank %d: [%d] = %lld, expected %lld\n", mrank,
                   i, (long long)got[i], (long long)want_v);
            return 1;
        }
    }
    if (hvd_shutdown() != HVD_OK)
        return fail_line(mrank, "hvd_shutdown");

    /* MPI is still the application's. */
    MPI_Finalized(&finalized);
    MPI_Initialized(&flag);
    if (finalized || !flag) {
        printf("FAIL mpi_app rank %d: hvd finalized the application's MPI\n",
               mrank);
        return 1;
    }
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != msize) {
        printf("FAIL mpi_app rank %d: MPI_Allreduce after hvd_shutdown\n",
               mrank);
        return 1;
    }
    printf("PASS mpi_app rank %d of %d: thread level %d, transport %s\n", mrank,
           msize, provided, transport ? transport : "auto");
    MPI_Finalize();
    return 0;
}
