/*
 * hvd-bench: bandwidth of the collectives, in the format of nccl-tests.
 *
 *     hvdrun -np 2 hvd-bench [options]
 *     mpirun -np 2 --mca btl tcp,self hvd-bench --backend mpi [options]
 *
 * Both backends run exactly the same code (buffers, sizes, timing, checks);
 * only init, finalize and the four collective calls differ (struct backend
 * in bench.h), so that hvd and MPI can be compared in one session. The MPI
 * backend is built only with -DHVD_BENCH_WITH_MPI.
 *
 * Inputs are small non-negative integers, so every result is exact in every
 * dtype; after the timed iterations every element is checked and #wrong
 * counts the wrong ones over all ranks. Exit status: 0, or 1 on an error or
 * a wrong value.
 *
 * --compare mpi (hvd backend, under mpirun) runs MPI's collective on the
 * same buffers right after hvd's for each size and prints MPI's busbw and
 * the ratio hvd/MPI; --csv writes the rows to a file, --plot draws busbw
 * against size with gnuplot.
 *
 * --model NAME replaces the sweep (hvd backend only) with what a trainer
 * sees: a step of one async allreduce per gradient tensor of a real model,
 * in backward order, against one pre-fused allreduce of the same size;
 * then the latency of a cached 4-byte allreduce against the bare collective
 * the engine runs under it (timed on the engine thread through
 * hvd_internal_call, hence the internal headers and the static library).
 *
 * The files of tools/bench/: options.c (the command line and the tables
 * of collectives, dtypes and operations), backend.c (the hvd and MPI
 * backends, and which one runs), sweep.c (the sweep over sizes: inputs,
 * expected values, timing, the table, --csv and --plot) and model.c
 * (--model) and membw.c (--memcpy); bench.h holds what they share. This file
 * holds main(), which runs the sweep or the model, and the line printed for
 * each rank.
 */
#include "tools/bench/bench.h"

#ifdef HVD_BENCH_WITH_MPI
#include <mpi.h>
#endif

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* This process's place in the job, set by the backend's init. */
int g_rank = -1;
int g_size = -1;

/* One line per rank, as nccl-tests prints: pid and host. */
static void print_ranks(const struct backend *be) {
    struct where {
        char host[56];
        int64_t pid;
    } me, *all;
    int q;

    memset(&me, 0, sizeof(me));
    if (gethostname(me.host, sizeof(me.host) - 1) != 0)
        snprintf(me.host, sizeof(me.host), "?");
    me.pid = (int64_t)getpid();
    all = malloc(sizeof(*all) * (size_t)g_size);
    if (all == NULL) {
        fprintf(stderr, "hvd-bench: out of memory\n");
        exit(1);
    }
    be->allgather(&me, all, sizeof(me), HVD_UINT8);
    if (g_rank == 0)
        for (q = 0; q < g_size; q++)
            printf("#  Rank %3d Pid %7lld on %s\n", q, (long long)all[q].pid,
                   all[q].host);
    free(all);
}

/* The backend's init; with --compare mpi, MPI's first (hvd then uses the
 * application's MPI to bootstrap and leaves it to the application to
 * finalize). Returns main's exit status on failure, else 0. */
static int start_backend(const struct backend *be, const struct options *o,
                         int *argc, char ***argv) {
#ifdef HVD_BENCH_WITH_MPI
    if (o->compare != NULL) {
        int provided, mpi_size;
        bench_mpi_check(
            "MPI_Init_thread",
            MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        bench_mpi_check("MPI_Comm_size",
                        MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
        be->init(argc, argv);
        if (mpi_size != g_size) {
            fprintf(stderr,
                    "hvd-bench: --compare mpi: MPI sees %d ranks and hvd %d; "
                    "start the job with mpirun\n",
                    mpi_size, g_size);
            be->finalize();
            MPI_Finalize();
            return 1;
        }
        return 0;
    }
#else
    (void)o;
#endif
    be->init(argc, argv);
    return 0;
}

/* Whether the sweep can run here: --root is a rank, and the dtype holds
 * every result exactly. Returns main's exit status on failure, else 0. */
static int check_sweep(const struct backend *be, const struct options *o) {
    long bound;

    if (o->root >= g_size) {
        if (g_rank == 0)
            fprintf(stderr, "hvd-bench: --root %d but only %d ranks\n", o->root,
                    g_size);
        be->finalize();
        return 1;
    }
    /* Results reach 2 * size (sums) or 10 (inputs); past what the dtype
     * holds exactly, the checks would fail. */
    bound = 2L * g_size > 10 ? 2L * g_size : 10;
    if (o->check && bound > o->dtype->max_exact) {
        if (g_rank == 0)
            fprintf(stderr,
                    "hvd-bench: %s cannot hold this benchmark's results "
                    "exactly at %d ranks; use --check 0 or a wider dtype\n",
                    o->dtype->name, g_size);
        be->finalize();
        return 1;
    }
    return 0;
}

/* The sweep over every collective asked for, with --csv and --plot;
 * returns whether the plot failed. */
static int run_sweep(const struct backend *be, const struct options *o,
                     unsigned char *sendbuf, unsigned char *recvbuf,
                     struct totals *t) {
    char csv_tmp[] = "/tmp/hvd-bench-csv.XXXXXX";
    const char *csv_path = o->csv;
    int plot_failed = 0;

    if (g_rank == 0 && (o->csv != NULL || o->plot != NULL)) {
        if (o->csv != NULL) {
            g_csv = fopen(o->csv, "w");
        } else {
            int fd = mkstemp(csv_tmp);
            g_csv = fd >= 0 ? fdopen(fd, "w") : NULL;
            csv_path = csv_tmp;
        }
        if (g_csv == NULL) {
            fprintf(stderr, "hvd-bench: cannot write %s: %s\n", csv_path,
                    strerror(errno));
            exit(1);
        }
        fprintf(g_csv,
                "op,bytes,count,dtype,time_us,algbw,busbw,wrong,path%s\n",
                o->compare != NULL ? ",mpi_busbw,ratio" : "");
    }
    for (int c = 0; c < NUM_COLLS; c++)
        if (o->run[c])
            bench_coll(be, o, (enum coll)c, sendbuf, recvbuf, t);
    if (g_csv != NULL) {
        fclose(g_csv);
        g_csv = NULL;
        if (o->plot != NULL)
            plot_failed = plot(o, csv_path);
        if (o->csv == NULL)
            unlink(csv_tmp);
    }
    return plot_failed;
}

int main(int argc, char **argv) {
    struct options o = {
        .run = {1, 0, 0},
        .minbytes = 8,
        .maxbytes = (size_t)256 << 20,
        .stepfactor = 4,
        .dtype = &dtypes[6],
        .redop = &redops[0],
        .iters = -1, /* parse_args sets the default of the mode */
        .warmup = -1,
        .root = 0,
        .check = 1,
        .backend = "hvd",
    };
    const struct backend *be;
    struct model model = {0};
    struct totals t = {0};
    unsigned char *sendbuf = NULL, *recvbuf;
    const char *env_size;
    int c, plot_failed;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_args(argc, argv, &o) != 0)
        return 1;
    if (o.memcpy)
        return bench_memcpy(&o);
    be = choose_backend(&o);
    if (be == NULL)
        return 1;
    if (o.model != NULL && model_load(&o, &model) != 0)
        return 1;
    if (start_backend(be, &o, &argc, &argv) != 0)
        return 1;

    /* hvdrun's ranks each see an MPI job of one: say so instead of
     * benchmarking N unrelated singletons. */
    env_size = getenv("HVD_SIZE");
    if (env_size != NULL && atoi(env_size) != g_size) {
        fprintf(stderr,
                "hvd-bench: HVD_SIZE is %s but backend %s sees %d ranks; "
                "run --backend mpi under mpirun, --backend hvd under "
                "hvdrun\n",
                env_size, be->name, g_size);
        be->finalize();
        return 1;
    }

    if (o.model != NULL) {
        if (g_rank == 0)
            printf("# hvd-bench %s: backend %s, %d ranks\n", HVD_VERSION_STRING,
                   be->name, g_size);
        print_ranks(be);
        c = bench_model(&o, &model);
        model_free(&model);
        be->finalize();
        return c;
    }

    if (check_sweep(be, &o) != 0)
        return 1;
    recvbuf = malloc(o.maxbytes);
    if (!o.inplace)
        sendbuf = malloc(o.maxbytes);
    if (recvbuf == NULL || (!o.inplace && sendbuf == NULL)) {
        fprintf(stderr, "hvd-bench: rank %d: cannot allocate 2 x %zu bytes\n",
                g_rank, o.maxbytes);
        exit(1);
    }

    if (g_rank == 0) {
        printf("# hvd-bench %s: backend %s, %d ranks\n", HVD_VERSION_STRING,
               be->name, g_size);
        printf("#  minbytes %zu maxbytes %zu stepfactor %zu dtype %s redop %s "
               "iters %d warmup %d inplace %d root %d check %d\n",
               o.minbytes, o.maxbytes, o.stepfactor, o.dtype->name,
               o.redop->name, o.iters, o.warmup, o.inplace, o.root, o.check);
    }
    print_ranks(be);
    plot_failed = run_sweep(be, &o, sendbuf, recvbuf, &t);
    if (g_rank == 0) {
        printf("# Out of bounds values : %lld %s\n", t.wrong,
               t.wrong == 0 ? "OK" : "FAILED");
        printf("# Avg bus bandwidth : %.3f GB/s\n",
               t.rows > 0 ? t.busbw_sum / t.rows : 0.0);
        printf("#\n");
    }
    free(sendbuf);
    free(recvbuf);
    be->finalize();
#ifdef HVD_BENCH_WITH_MPI
    if (o.compare != NULL)
        MPI_Finalize();
#endif
    return t.wrong == 0 && !plot_failed ? 0 : 1;
}
