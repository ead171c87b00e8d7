/*
 * The backends: the only code that differs between hvd and MPI (init,
 * finalize and the collective calls), so that both run the same buffers,
 * sizes, timing and checks. The MPI backend is built only with
 * -DHVD_BENCH_WITH_MPI; it serves --backend mpi and --compare mpi, and
 * choose_backend() rejects what MPI cannot run before init.
 */
#include "tools/bench/bench.h"

#ifdef HVD_BENCH_WITH_MPI
#include <mpi.h>
#endif

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Backends: the only code that differs between hvd and MPI            */

void bench_hvd_check(const char *call, hvd_status s) {
    if (s == HVD_OK)
        return;
    fprintf(stderr, "hvd-bench: rank %d: %s failed: %s: %s\n", g_rank, call,
            hvd_strerror(s), hvd_last_error());
    exit(1);
}

static void hvdb_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    bench_hvd_check("hvd_init", hvd_init());
    g_rank = hvd_rank();
    g_size = hvd_size();
}

static void hvdb_finalize(void) {
    bench_hvd_check("hvd_shutdown", hvd_shutdown());
}

static void hvdb_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype, hvd_op op) {
    bench_hvd_check("hvd_allreduce",
                    hvd_allreduce("hvd-bench.allreduce", sendbuf, recvbuf,
                                  count, dtype, op));
}

static void hvdb_allgather(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype) {
    bench_hvd_check(
        "hvd_allgather",
        hvd_allgather("hvd-bench.allgather", sendbuf, recvbuf, count, dtype));
}

static void hvdb_broadcast(void *buf, size_t count, hvd_dtype dtype, int root) {
    bench_hvd_check("hvd_broadcast", hvd_broadcast("hvd-bench.broadcast", buf,
                                                   count, dtype, root));
}

static void hvdb_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                          hvd_dtype dtype) {
    size_t total = count * (size_t)g_size;

    bench_hvd_check("hvd_alltoall",
                    hvd_alltoall("hvd-bench.alltoall", sendbuf, total, NULL,
                                 recvbuf, total, NULL, dtype));
}

static void hvdb_reducescatter(const void *sendbuf, void *recvbuf, size_t count,
                               hvd_dtype dtype, hvd_op op) {
    bench_hvd_check("hvd_reducescatter",
                    hvd_reducescatter("hvd-bench.reducescatter", sendbuf,
                                      recvbuf, count, dtype, op));
}

static void hvdb_barrier(void) {
    bench_hvd_check("hvd_barrier", hvd_barrier());
}

const struct backend hvd_backend = {
    .name = "hvd",
    .init = hvdb_init,
    .finalize = hvdb_finalize,
    .allreduce = hvdb_allreduce,
    .allgather = hvdb_allgather,
    .broadcast = hvdb_broadcast,
    .alltoall = hvdb_alltoall,
    .reducescatter = hvdb_reducescatter,
    .barrier = hvdb_barrier,
};

#ifdef HVD_BENCH_WITH_MPI
/* MPI_DATATYPE_NULL where MPI has no such type. */
static MPI_Datatype mpi_dtype(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
        return MPI_UINT8_T;
    case HVD_INT8:
        return MPI_INT8_T;
    case HVD_INT32:
        return MPI_INT32_T;
    case HVD_INT64:
        return MPI_INT64_T;
    case HVD_FLOAT32:
        return MPI_FLOAT;
    case HVD_FLOAT64:
        return MPI_DOUBLE;
    case HVD_FLOAT16:
    case HVD_BFLOAT16:
        break;
    }
    return MPI_DATATYPE_NULL;
}

/* MPI_OP_NULL where MPI has no such operation (there is no MPI average). */
static MPI_Op mpi_op(hvd_op op) {
    switch (op) {
    case HVD_SUM:
        return MPI_SUM;
    case HVD_MIN:
        return MPI_MIN;
    case HVD_MAX:
        return MPI_MAX;
    case HVD_PRODUCT:
        return MPI_PROD;
    case HVD_AVERAGE:
    case HVD_ADASUM:
        break;
    }
    return MPI_OP_NULL;
}

void bench_mpi_check(const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;

    if (rc == MPI_SUCCESS)
        return;
    text[0] = '\0';
    MPI_Error_string(rc, text, &len);
    fprintf(stderr, "hvd-bench: rank %d: %s failed: %s\n", g_rank, call, text);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static int mpi_count(size_t count) {
    if (count > INT_MAX) {
        fprintf(stderr,
                "hvd-bench: rank %d: %zu elements exceed MPI's int count; "
                "lower --maxbytes\n",
                g_rank, count);
        MPI_Abort(MPI_COMM_WORLD, 1);
        exit(1);
    }
    return (int)count;
}

static void mpib_init(int *argc, char ***argv) {
    bench_mpi_check("MPI_Init", MPI_Init(argc, argv));
    /* Return errors to mpi_check, which prints MPI's text. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    bench_mpi_check("MPI_Comm_rank", MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    bench_mpi_check("MPI_Comm_size", MPI_Comm_size(MPI_COMM_WORLD, &g_size));
}

static void mpib_finalize(void) {
    bench_mpi_check("MPI_Finalize", MPI_Finalize());
}

static void mpib_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype, hvd_op op) {
    bench_mpi_check("MPI_Allreduce",
                    MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf,
                                  recvbuf, mpi_count(count), mpi_dtype(dtype),
                                  mpi_op(op), MPI_COMM_WORLD));
}

static void mpib_allgather(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype) {
    const char *mine =
        (const char *)recvbuf + (size_t)g_rank * count * hvd_dtype_size(dtype);
    int n = mpi_count(count);

    if (sendbuf == mine)
        bench_mpi_check("MPI_Allgather",
                        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                      recvbuf, n, mpi_dtype(dtype),
                                      MPI_COMM_WORLD));
    else
        bench_mpi_check("MPI_Allgather",
                        MPI_Allgather(sendbuf, n, mpi_dtype(dtype), recvbuf, n,
                                      mpi_dtype(dtype), MPI_COMM_WORLD));
}

static void mpib_broadcast(void *buf, size_t count, hvd_dtype dtype, int root) {
    bench_mpi_check("MPI_Bcast",
                    MPI_Bcast(buf, mpi_count(count), mpi_dtype(dtype), root,
                              MPI_COMM_WORLD));
}

/* Counts and displacements for MPI's v-collectives (g_size entries). */
static int *mpi_ints(void) {
    int *v = malloc(4 * (size_t)g_size * sizeof(*v));

    if (v == NULL) {
        fprintf(stderr, "hvd-bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return v;
}

static void mpib_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                          hvd_dtype dtype) {
    int *v = mpi_ints(), *counts = v, *displs = v + g_size;

    for (int r = 0; r < g_size; r++) {
        counts[r] = mpi_count(count);
        displs[r] = mpi_count(count * (size_t)r);
    }
    bench_mpi_check("MPI_Alltoallv",
                    MPI_Alltoallv(sendbuf, counts, displs, mpi_dtype(dtype),
                                  recvbuf, counts, displs, mpi_dtype(dtype),
                                  MPI_COMM_WORLD));
    free(v);
}

static void mpib_reducescatter(const void *sendbuf, void *recvbuf, size_t count,
                               hvd_dtype dtype, hvd_op op) {
    int *counts = mpi_ints();

    for (int r = 0; r < g_size; r++)
        counts[r] = mpi_count(hvd_reducescatter_count(count, g_size, r));
    bench_mpi_check("MPI_Reduce_scatter",
                    MPI_Reduce_scatter(sendbuf, recvbuf, counts,
                                       mpi_dtype(dtype), mpi_op(op),
                                       MPI_COMM_WORLD));
    free(counts);
}

static void mpib_barrier(void) {
    bench_mpi_check("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
}

static const struct backend mpi_backend = {
    .name = "mpi",
    .init = mpib_init,
    .finalize = mpib_finalize,
    .allreduce = mpib_allreduce,
    .allgather = mpib_allgather,
    .broadcast = mpib_broadcast,
    .alltoall = mpib_alltoall,
    .reducescatter = mpib_reducescatter,
    .barrier = mpib_barrier,
};
#endif /* HVD_BENCH_WITH_MPI */

/* MPI's backend when --compare mpi, else NULL. */
const struct backend *compare_backend(const struct options *o) {
#ifdef HVD_BENCH_WITH_MPI
    if (o->compare != NULL)
        return &mpi_backend;
#else
    (void)o;
#endif
    return NULL;
}

static int mpi_can_run(const struct options *o);

/* Picks the backend and rejects what it cannot run, before init. */
const struct backend *choose_backend(const struct options *o) {
    if (o->compare != NULL) {
#ifdef HVD_BENCH_WITH_MPI
        if (strcmp(o->backend, "hvd") != 0 || o->model != NULL) {
            fprintf(stderr, "hvd-bench: --compare mpi compares the hvd "
                            "backend's sweep with MPI's\n");
            return NULL;
        }
        return mpi_can_run(o) ? &hvd_backend : NULL;
#else
        fprintf(stderr, "hvd-bench: this hvd-bench was built without MPI, "
                        "so --compare mpi is not available\n");
        return NULL;
#endif
    }
    if (strcmp(o->backend, "hvd") == 0)
        return &hvd_backend;
    if (o->model != NULL) {
        fprintf(stderr,
                "hvd-bench: --model measures hvd's engine (per-tensor "
                "fusion, response cache) and runs only with --backend hvd\n");
        return NULL;
    }
#ifdef HVD_BENCH_WITH_MPI
    return mpi_can_run(o) ? &mpi_backend : NULL;
#else
    fprintf(stderr, "hvd-bench: this hvd-bench was built without MPI "
                    "(rebuild with -DHVD_BENCH_WITH_MPI for --backend mpi)\n");
    return NULL;
#endif
}

/* 1 if MPI has the dtype and op; else 0 after saying so. */
static int mpi_can_run(const struct options *o) {
#ifdef HVD_BENCH_WITH_MPI
    if (mpi_dtype(o->dtype->dtype) == MPI_DATATYPE_NULL) {
        fprintf(stderr,
                "hvd-bench: --dtype %s is not supported by MPI (it has no "
                "such type); use --backend hvd without --compare\n",
                o->dtype->name);
        return 0;
    }
    if ((o->run[COLL_ALLREDUCE] || o->run[COLL_REDUCESCATTER]) && !o->inplace &&
        mpi_op(o->redop->op) == MPI_OP_NULL) {
        fprintf(stderr,
                "hvd-bench: --redop %s is not supported by MPI (it has no "
                "average); use sum\n",
                o->redop->name);
        return 0;
    }
    return 1;
#else
    (void)o;
    return 0;
#endif
}
