/*
 * hvd-bench: bandwidth of the collectives, in the format of nccl-tests.
 *
 *     hvdrun -np 2 hvd-bench [options]
 *     mpirun -np 2 --mca btl tcp,self hvd-bench --backend mpi [options]
 *
 * Both backends run exactly the same code (buffers, sizes, timing, checks);
 * only init, finalize and the four collective calls differ (struct backend
 * below), so that hvd and MPI can be compared in one session. The MPI
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
 */
#include <hvd/hvd.h>

#include "api/hvd_internal.h"
#include "collectives/coll.h"

#ifdef HVD_BENCH_WITH_MPI
#include <mpi.h>
#endif

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum coll { COLL_ALLREDUCE, COLL_ALLGATHER, COLL_BROADCAST, NUM_COLLS };

static const char *const coll_names[NUM_COLLS] = {"allreduce", "allgather",
                                                  "broadcast"};

struct dtype_info {
    hvd_dtype dtype;
    const char *name;
    const char *alias;
    /* The largest integer the type holds exactly, with all smaller ones. */
    long max_exact;
};

static const struct dtype_info dtypes[] = {
    {HVD_UINT8, "uint8", "uint8", 255},
    {HVD_INT8, "int8", "int8", 127},
    {HVD_INT32, "int32", "int", 1L << 30},
    {HVD_INT64, "int64", "int64", 1L << 30},
    {HVD_FLOAT16, "float16", "half", 2048},
    {HVD_BFLOAT16, "bfloat16", "bf16", 256},
    {HVD_FLOAT32, "float32", "float", 1L << 24},
    {HVD_FLOAT64, "float64", "double", 1L << 30},
};
#define NUM_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

struct op_info {
    hvd_op op;
    const char *name;
    const char *alias;
};

static const struct op_info redops[] = {
    {HVD_SUM, "sum", "sum"},          {HVD_AVERAGE, "avg", "average"},
    {HVD_MIN, "min", "min"},          {HVD_MAX, "max", "max"},
    {HVD_PRODUCT, "prod", "product"},
};
#define NUM_REDOPS (sizeof(redops) / sizeof(redops[0]))

struct options {
    int run[NUM_COLLS];
    size_t minbytes;
    size_t maxbytes;
    size_t stepfactor;
    const struct dtype_info *dtype;
    const struct op_info *redop;
    int iters;
    int warmup;
    int inplace;
    int root;
    int check;
    const char *backend;
    const char *compare;    /* "mpi": MPI's collective after hvd's, or NULL */
    const char *csv;        /* --csv FILE, or NULL */
    const char *plot;       /* --plot FILE.png, or NULL */
    const char *model;      /* NULL: the sweep */
    const char *model_file; /* NULL: the model's file in shared/data */
};

/* This process's place in the job, set by the backend's init. */
static int g_rank = -1;
static int g_size = -1;

/* ------------------------------------------------------------------ */
/* Backends: the only code that differs between hvd and MPI            */

/*
 * Each member either succeeds or prints why (the library's own text) and
 * exits 1; the benchmark has nothing to clean up that exit does not.
 */
struct backend {
    const char *name;
    /** Joins the job and sets g_rank and g_size. */
    void (*init)(int *argc, char ***argv);
    void (*finalize)(void);
    /** sendbuf == recvbuf means in place. */
    void (*allreduce)(const void *sendbuf, void *recvbuf, size_t count,
                      hvd_dtype dtype, hvd_op op);
    /** In place when sendbuf == recvbuf + g_rank * count elements. */
    void (*allgather)(const void *sendbuf, void *recvbuf, size_t count,
                      hvd_dtype dtype);
    void (*broadcast)(void *buf, size_t count, hvd_dtype dtype, int root);
    void (*barrier)(void);
};

static void hvd_check(const char *call, hvd_status s) {
    if (s == HVD_OK)
        return;
    fprintf(stderr, "hvd-bench: rank %d: %s failed: %s: %s\n", g_rank, call,
            hvd_strerror(s), hvd_last_error());
    exit(1);
}

static void hvdb_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    hvd_check("hvd_init", hvd_init());
    g_rank = hvd_rank();
    g_size = hvd_size();
}

static void hvdb_finalize(void) { hvd_check("hvd_shutdown", hvd_shutdown()); }

static void hvdb_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype, hvd_op op) {
    hvd_check("hvd_allreduce", hvd_allreduce("hvd-bench.allreduce", sendbuf,
                                             recvbuf, count, dtype, op));
}

static void hvdb_allgather(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype) {
    hvd_check("hvd_allgather", hvd_allgather("hvd-bench.allgather", sendbuf,
                                             recvbuf, count, dtype));
}

static void hvdb_broadcast(void *buf, size_t count, hvd_dtype dtype, int root) {
    hvd_check("hvd_broadcast",
              hvd_broadcast("hvd-bench.broadcast", buf, count, dtype, root));
}

static void hvdb_barrier(void) { hvd_check("hvd_barrier", hvd_barrier()); }

static const struct backend hvd_backend = {
    .name = "hvd",
    .init = hvdb_init,
    .finalize = hvdb_finalize,
    .allreduce = hvdb_allreduce,
    .allgather = hvdb_allgather,
    .broadcast = hvdb_broadcast,
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
        break;
    }
    return MPI_OP_NULL;
}

static void mpi_check(const char *call, int rc) {
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
    mpi_check("MPI_Init", MPI_Init(argc, argv));
    /* Return errors to mpi_check, which prints MPI's text. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_check("MPI_Comm_rank", MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    mpi_check("MPI_Comm_size", MPI_Comm_size(MPI_COMM_WORLD, &g_size));
}

static void mpib_finalize(void) { mpi_check("MPI_Finalize", MPI_Finalize()); }

static void mpib_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                           hvd_dtype dtype, hvd_op op) {
    mpi_check("MPI_Allreduce",
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
        mpi_check("MPI_Allgather",
                  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuf, n,
                                mpi_dtype(dtype), MPI_COMM_WORLD));
    else
        mpi_check("MPI_Allgather",
                  MPI_Allgather(sendbuf, n, mpi_dtype(dtype), recvbuf, n,
                                mpi_dtype(dtype), MPI_COMM_WORLD));
}

static void mpib_broadcast(void *buf, size_t count, hvd_dtype dtype, int root) {
    mpi_check("MPI_Bcast", MPI_Bcast(buf, mpi_count(count), mpi_dtype(dtype),
                                     root, MPI_COMM_WORLD));
}

static void mpib_barrier(void) {
    mpi_check("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
}

static const struct backend mpi_backend = {
    .name = "mpi",
    .init = mpib_init,
    .finalize = mpib_finalize,
    .allreduce = mpib_allreduce,
    .allgather = mpib_allgather,
    .broadcast = mpib_broadcast,
    .barrier = mpib_barrier,
};
#endif /* HVD_BENCH_WITH_MPI */

/* ------------------------------------------------------------------ */
/* Values                                                              */

/* float16 bits of an integer 0 <= v <= 2048 (exact there). */
static uint16_t int_to_half(long v) {
    unsigned long m = (unsigned long)v;
    unsigned long mant;
    int e = 0;

    if (m == 0)
        return 0;
    while ((m >> (e + 1)) != 0)
        e++;
    mant = e <= 10 ? m << (10 - e) : m >> (e - 10);
    return (uint16_t)((unsigned)((e + 15) << 10) | (mant & 0x3ff));
}

/* The bit pattern of a small integer v in dtype. */
static uint64_t encode(hvd_dtype dtype, long v) {
    switch (dtype) {
    case HVD_UINT8:
    case HVD_INT8:
        return (uint8_t)v;
    case HVD_INT32:
        return (uint32_t)v;
    case HVD_INT64:
        return (uint64_t)v;
    case HVD_FLOAT16:
        return int_to_half(v);
    case HVD_BFLOAT16:
    case HVD_FLOAT32: {
        float f = (float)v;
        uint32_t bits;

        memcpy(&bits, &f, sizeof(bits));
        /* bfloat16 is the top half of float32, exact for v <= 256. */
        return dtype == HVD_BFLOAT16 ? bits >> 16 : bits;
    }
    case HVD_FLOAT64: {
        double d = (double)v;
        uint64_t bits;

        memcpy(&bits, &d, sizeof(bits));
        return bits;
    }
    }
    return 0;
}

static void put_bits(void *buf, size_t elem_size, size_t i, uint64_t bits) {
    switch (elem_size) {
    case 1:
        ((uint8_t *)buf)[i] = (uint8_t)bits;
        break;
    case 2:
        ((uint16_t *)buf)[i] = (uint16_t)bits;
        break;
    case 4:
        ((uint32_t *)buf)[i] = (uint32_t)bits;
        break;
    default:
        ((uint64_t *)buf)[i] = bits;
        break;
    }
}

static uint64_t get_bits(const void *buf, size_t elem_size, size_t i) {
    switch (elem_size) {
    case 1:
        return ((const uint8_t *)buf)[i];
    case 2:
        return ((const uint16_t *)buf)[i];
    case 4:
        return ((const uint32_t *)buf)[i];
    default:
        return ((const uint64_t *)buf)[i];
    }
}

/*
 * Input element i of rank r (of the root, for broadcast). It depends on i
 * only through i % 3, i % 7, i % 11 and i % g_size, so results repeat with
 * period 231 * g_size. Results are at most max(2 * g_size, 10).
 */
static long input_value(enum coll coll, hvd_op op, int r, size_t i) {
    size_t ur = (size_t)r;

    switch (coll) {
    case COLL_ALLREDUCE:
        switch (op) {
        case HVD_SUM:
            return (long)((i + ur) % 3);
        case HVD_AVERAGE:
            /* The same on every rank, so the average is exact. */
            return (long)(i % 3);
        case HVD_MIN:
        case HVD_MAX:
            return (long)((i + ur) % 7);
        case HVD_PRODUCT:
            return i % (size_t)g_size == ur ? 2 : 1;
        }
        return 0;
    case COLL_ALLGATHER:
        return (long)((i + 3 * ur) % 11);
    case COLL_BROADCAST:
    case NUM_COLLS:
        break;
    }
    return (long)((i + ur) % 11);
}

static long allreduce_expected(hvd_op op, size_t i) {
    long acc = input_value(COLL_ALLREDUCE, op, 0, i);
    int r;

    for (r = 1; r < g_size; r++) {
        long v = input_value(COLL_ALLREDUCE, op, r, i);

        switch (op) {
        case HVD_SUM:
        case HVD_AVERAGE:
            acc += v;
            break;
        case HVD_MIN:
            acc = v < acc ? v : acc;
            break;
        case HVD_MAX:
            acc = v > acc ? v : acc;
            break;
        case HVD_PRODUCT:
            acc *= v;
            break;
        }
    }
    return op == HVD_AVERAGE ? acc / g_size : acc;
}

/* ------------------------------------------------------------------ */
/* One row of the table                                                */

struct run {
    enum coll coll;
    hvd_op op;
    size_t count; /* per rank */
    void *send;
    void *recv;
};

struct row {
    size_t bytes;
    double seconds;
    long long wrong;
};

/* Where the rows go besides stdout (rank 0). */
static FILE *g_csv;

static double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run_once(const struct backend *be, const struct options *o,
                     const struct run *run) {
    hvd_dtype dtype = o->dtype->dtype;

    switch (run->coll) {
    case COLL_ALLREDUCE:
        be->allreduce(run->send, run->recv, run->count, dtype, run->op);
        break;
    case COLL_ALLGATHER:
        be->allgather(run->send, run->recv, run->count, dtype);
        break;
    case COLL_BROADCAST:
    case NUM_COLLS:
        be->broadcast(run->recv, run->count, dtype, o->root);
        break;
    }
}

static void fill(const struct options *o, void *buf, enum coll coll, hvd_op op,
                 int r, size_t count) {
    size_t es = hvd_dtype_size(o->dtype->dtype);
    size_t i;

    for (i = 0; i < count; i++)
        put_bits(buf, es, i,
                 encode(o->dtype->dtype, input_value(coll, op, r, i)));
}

/* Points run->send/recv into the buffers and fills them. Outputs start as
 * 0xff bytes, which no result has, so an element never written counts as
 * wrong. */
static void prepare(const struct options *o, struct run *run,
                    unsigned char *sendbuf, unsigned char *recvbuf) {
    size_t es = hvd_dtype_size(o->dtype->dtype);
    size_t bytes = run->count * es;

    run->recv = recvbuf;
    switch (run->coll) {
    case COLL_ALLREDUCE:
        run->send = o->inplace ? recvbuf : sendbuf;
        if (!o->inplace)
            memset(recvbuf, 0xff, bytes);
        fill(o, run->send, run->coll, run->op, g_rank, run->count);
        break;
    case COLL_ALLGATHER:
        memset(recvbuf, 0xff, bytes * (size_t)g_size);
        run->send =
            o->inplace ? recvbuf + (size_t)g_rank * bytes : (void *)sendbuf;
        fill(o, run->send, run->coll, run->op, g_rank, run->count);
        break;
    case COLL_BROADCAST:
    case NUM_COLLS:
        run->send = recvbuf;
        if (g_rank == o->root)
            fill(o, recvbuf, run->coll, run->op, o->root, run->count);
        else
            memset(recvbuf, 0xff, bytes);
        break;
    }
}

/* The number of wrong elements in this rank's result. */
static long long count_wrong(const struct options *o, const struct run *run) {
    hvd_dtype dtype = o->dtype->dtype;
    size_t es = hvd_dtype_size(dtype);
    long long wrong = 0;
    size_t i, period;
    uint64_t *table;
    int q;

    switch (run->coll) {
    case COLL_ALLREDUCE:
        /* The expected result repeats; compute one period. */
        period = 231 * (size_t)g_size;
        table = malloc(period * sizeof(*table));
        if (table == NULL) {
            fprintf(stderr, "hvd-bench: out of memory\n");
            exit(1);
        }
        for (i = 0; i < period; i++)
            table[i] = encode(dtype, allreduce_expected(run->op, i));
        for (i = 0; i < run->count; i++)
            wrong += get_bits(run->recv, es, i) != table[i % period];
        free(table);
        break;
    case COLL_ALLGATHER:
        for (q = 0; q < g_size; q++) {
            const unsigned char *block =
                (const unsigned char *)run->recv + (size_t)q * run->count * es;

            for (i = 0; i < run->count; i++)
                wrong += get_bits(block, es, i) !=
                         encode(dtype, input_value(run->coll, run->op, q, i));
        }
        break;
    case COLL_BROADCAST:
    case NUM_COLLS:
        for (i = 0; i < run->count; i++)
            wrong += get_bits(run->recv, es, i) !=
                     encode(dtype, input_value(run->coll, run->op, o->root, i));
        break;
    }
    return wrong;
}

static void measure(const struct backend *be, const struct options *o,
                    struct run *run, unsigned char *sendbuf,
                    unsigned char *recvbuf, struct row *row_out) {
    double t0, local, slowest;
    long long wrong = 0, total_wrong = 0;
    int it;

    prepare(o, run, sendbuf, recvbuf);
    for (it = 0; it < o->warmup; it++)
        run_once(be, o, run);
    be->barrier();
    t0 = now_s();
    for (it = 0; it < o->iters; it++)
        run_once(be, o, run);
    local = (now_s() - t0) / o->iters;

    /* A collective is as slow as its slowest rank. */
    be->allreduce(&local, &slowest, 1, HVD_FLOAT64, HVD_MAX);
    if (o->check) {
        wrong = count_wrong(o, run);
        be->allreduce(&wrong, &total_wrong, 1, HVD_INT64, HVD_SUM);
    }
    row_out->seconds = slowest;
    row_out->wrong = total_wrong;
}

/* algbw (bytes / time) times this gives the bus bandwidth. */
static double bus_factor(enum coll coll) {
    double n = g_size;

    switch (coll) {
    case COLL_ALLREDUCE:
        return 2 * (n - 1) / n;
    case COLL_ALLGATHER:
        return (n - 1) / n;
    case COLL_BROADCAST:
    case NUM_COLLS:
        break;
    }
    return 1;
}

struct totals {
    double busbw_sum;
    int rows;
    long long wrong;
};

static const struct backend *compare_backend(const struct options *o);

static void bench_coll(const struct backend *be, const struct options *o,
                       enum coll coll, unsigned char *sendbuf,
                       unsigned char *recvbuf, struct totals *t) {
    size_t es = hvd_dtype_size(o->dtype->dtype);
    hvd_op op = o->redop->op;
    const char *opname = o->redop->name;
    const struct backend *other = compare_backend(o);
    size_t bytes;

    /* Repeated in place, only min and max keep the inputs' result. */
    if (coll == COLL_ALLREDUCE && o->inplace && op != HVD_MIN &&
        op != HVD_MAX) {
        op = HVD_MAX;
        opname = "max";
    }
    if (coll != COLL_ALLREDUCE)
        opname = "none";
    if (g_rank == 0) {
        printf("#\n# %s, %s\n#\n", coll_names[coll],
               coll == COLL_BROADCAST ? "one buffer"
               : o->inplace           ? "in place"
                                      : "out of place");
        printf("#%12s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw",
               "#wrong");
        if (other != NULL)
            printf("  %6s  %6s", "mpibw", "ratio");
        printf("  %s\n", be == &hvd_backend ? "path" : "");
        printf("#%12s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
        if (other != NULL)
            printf("  %6s  %6s", "(GB/s)", "hvd/mpi");
        printf("\n");
    }
    for (bytes = o->minbytes; bytes <= o->maxbytes;) {
        struct run run = {.coll = coll, .op = op};
        struct row row = {0}, orow = {0};
        double algbw, busbw, obusbw = 0;
        char wrong[24], path[64] = "";

        /* nccl-tests: for allgather the size is what each rank receives. */
        run.count =
            coll == COLL_ALLGATHER ? bytes / es / (size_t)g_size : bytes / es;
        row.bytes =
            run.count * es * (coll == COLL_ALLGATHER ? (size_t)g_size : 1);
        if (run.count > 0) {
            measure(be, o, &run, sendbuf, recvbuf, &row);
            algbw = row.seconds > 0 ? (double)row.bytes / row.seconds / 1e9 : 0;
            busbw = algbw * bus_factor(coll);
            if (other != NULL) {
                struct run orun = run;
                orow.bytes = row.bytes;
                measure(other, o, &orun, sendbuf, recvbuf, &orow);
                obusbw = orow.seconds > 0 ? (double)orow.bytes / orow.seconds /
                                                1e9 * bus_factor(coll)
                                          : 0;
                row.wrong += orow.wrong;
            }
            if (be == &hvd_backend)
                hvd_check("hvd_path",
                          hvd_path(coll_names[coll], row.bytes, o->dtype->dtype,
                                   path, sizeof(path)));
            t->busbw_sum += busbw;
            t->rows++;
            t->wrong += row.wrong;
            if (o->check)
                snprintf(wrong, sizeof(wrong), "%lld", row.wrong);
            else
                snprintf(wrong, sizeof(wrong), "N/A");
            if (g_rank == 0) {
                printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6s",
                       row.bytes, run.count, o->dtype->name, opname,
                       coll == COLL_BROADCAST ? o->root : -1, row.seconds * 1e6,
                       algbw, busbw, wrong);
                if (other != NULL)
                    printf("  %6.2f  %6.2f", obusbw,
                           obusbw > 0 ? busbw / obusbw : 0.0);
                printf("  %s\n", path);
            }
            if (g_rank == 0 && g_csv != NULL) {
                fprintf(g_csv, "%s,%zu,%zu,%s,%.3f,%.4f,%.4f,%lld,%s",
                        coll_names[coll], row.bytes, run.count, o->dtype->name,
                        row.seconds * 1e6, algbw, busbw, row.wrong, path);
                if (other != NULL)
                    fprintf(g_csv, ",%.4f,%.4f", obusbw,
                            obusbw > 0 ? busbw / obusbw : 0.0);
                fprintf(g_csv, "\n");
            }
        }
        if (bytes > o->maxbytes / o->stepfactor)
            break;
        bytes *= o->stepfactor;
    }
}

/* Draws busbw against size from the CSV at csv_path into png (rank 0).
 * Returns 0, or 1 after printing why. */
static int plot(const struct options *o, const char *csv_path) {
    char script[] = "/tmp/hvd-bench-plot.XXXXXX";
    int fd = mkstemp(script), rc;
    FILE *f;
    char cmd[PATH_MAX + 64];

    if (fd < 0 || (f = fdopen(fd, "w")) == NULL) {
        fprintf(stderr, "hvd-bench: cannot write a gnuplot script: %s\n",
                strerror(errno));
        return 1;
    }
    fprintf(f,
            "set terminal pngcairo size 900,560 noenhanced\n"
            "set output '%s'\n"
            "set datafile separator ','\n"
            "set logscale x 2\n"
            "set format x '%%.0b%%B'\n"
            "set xlabel 'size per rank (bytes)'\n"
            "set ylabel 'bus bandwidth (GB/s)'\n"
            "set key top left\n"
            "set grid\n"
            "set title 'hvd-bench, %d ranks, %s'\n"
            "plot ",
            o->plot, g_size, o->dtype->name);
    int first = 1;
    for (int c = 0; c < NUM_COLLS; c++) {
        if (!o->run[c])
            continue;
        fprintf(f,
                "%s'%s' using ($2):(strcol(1) eq '%s' ? $7 : 1/0) with "
                "linespoints title 'hvd %s'",
                first ? "" : ", ", csv_path, coll_names[c], coll_names[c]);
        first = 0;
        if (o->compare != NULL)
            fprintf(f,
                    ", '%s' using ($2):(strcol(1) eq '%s' ? $10 : 1/0) with "
                    "linespoints dashtype 2 title 'Open MPI %s'",
                    csv_path, coll_names[c], coll_names[c]);
    }
    fprintf(f, "\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", script);
    rc = system(cmd);
    unlink(script);
    if (rc != 0) {
        fprintf(stderr,
                "hvd-bench: gnuplot failed (status %d); --plot needs gnuplot "
                "(Debian: apt-get install gnuplot-nox)\n",
                rc);
        return 1;
    }
    printf("# plot: %s\n", o->plot);
    return 0;
}

/* ------------------------------------------------------------------ */
/* --model: one training step's gradients, and small-message latency   */

#define MODEL_DEFAULT_DIR HVD_SOURCE_DIR "/../shared/data"
#define LAT_WARMUP 20
#define LAT_ITERS 200

struct tensor {
    char *name; /* "grad.<name>", the operation's name */
    size_t count;
    float *buf; /* the gradient, reduced in place */
};

struct model {
    char *path;
    struct tensor *t; /* forward order; backward is t[n - 1] .. t[0] */
    int n;
    size_t total; /* elements over all tensors */
};

static void model_free(struct model *m) {
    int j;

    for (j = 0; j < m->n; j++) {
        free(m->t[j].name);
        free(m->t[j].buf);
    }
    free(m->t);
    free(m->path);
    memset(m, 0, sizeof(*m));
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL) {
        fprintf(stderr, "hvd-bench: rank %d: cannot allocate %zu bytes\n",
                g_rank, bytes);
        exit(1);
    }
    return p;
}

/* The product of a shape such as "64x3x7x7"; 0 if it is not one. */
static size_t shape_elements(const char *shape) {
    size_t product = 1;
    const char *s = shape;

    for (;;) {
        unsigned long long d;
        char *end;

        if (*s < '0' || *s > '9')
            return 0;
        errno = 0;
        d = strtoull(s, &end, 10);
        if (errno != 0 || d == 0 || product > SIZE_MAX / d)
            return 0;
        product *= (size_t)d;
        if (*end == '\0')
            return product;
        if (*end != 'x')
            return 0;
        s = end + 1;
    }
}

/* One "name<TAB>shape<TAB>elements" line (newline stripped) into t.
 * Returns 0, or -1 after printing why. */
static int parse_tensor(const char *path, long lineno, char *line,
                        struct tensor *t) {
    char *name = line, *shape, *elems, *end;
    unsigned long long count;

    shape = strchr(name, '\t');
    elems = shape != NULL ? strchr(shape + 1, '\t') : NULL;
    if (shape == NULL || elems == NULL || strchr(elems + 1, '\t') != NULL ||
        shape == name) {
        fprintf(stderr,
                "hvd-bench: %s:%ld: expected name<TAB>shape<TAB>elements, "
                "got \"%s\"\n",
                path, lineno, line);
        return -1;
    }
    *shape++ = '\0';
    *elems++ = '\0';
    errno = 0;
    count = strtoull(elems, &end, 10);
    if (*elems < '0' || *elems > '9' || *end != '\0' || errno != 0 ||
        count == 0 || count > SIZE_MAX / sizeof(float)) {
        fprintf(stderr,
                "hvd-bench: %s:%ld: tensor %s: bad element count \"%s\"\n",
                path, lineno, name, elems);
        return -1;
    }
    if (shape_elements(shape) != count) {
        fprintf(stderr,
                "hvd-bench: %s:%ld: tensor %s: shape %s does not have %llu "
                "elements\n",
                path, lineno, name, shape, count);
        return -1;
    }
    t->count = (size_t)count;
    t->name = xmalloc(strlen(name) + sizeof("grad."));
    sprintf(t->name, "grad.%s", name);
    return 0;
}

/* Reads the tensor list (before hvd_init: every rank reads its own copy,
 * and the engine reports a mismatch if they differ). Returns 0, or -1
 * after printing why. */
static int model_load(const struct options *o, struct model *m) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int capn = 0, rc = -1;
    FILE *f;

    memset(m, 0, sizeof(*m));
    if (o->model_file != NULL) {
        m->path = xmalloc(strlen(o->model_file) + 1);
        strcpy(m->path, o->model_file);
    } else {
        m->path = xmalloc(sizeof(MODEL_DEFAULT_DIR) + strlen(o->model) +
                          sizeof("/_params.tsv"));
        sprintf(m->path, "%s/%s_params.tsv", MODEL_DEFAULT_DIR, o->model);
    }
    f = fopen(m->path, "r");
    if (f == NULL) {
        fprintf(stderr,
                "hvd-bench: --model %s: cannot open its tensor list %s: %s; "
                "give the file with --model-file PATH\n",
                o->model, m->path, strerror(errno));
        goto out_free;
    }
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (m->n == capn) {
            struct tensor *grown;

            capn = capn > 0 ? 2 * capn : 64;
            grown = realloc(m->t, sizeof(*grown) * (size_t)capn);
            if (grown == NULL) {
                fprintf(stderr, "hvd-bench: out of memory\n");
                goto out_close;
            }
            m->t = grown;
        }
        memset(&m->t[m->n], 0, sizeof(m->t[m->n]));
        if (parse_tensor(m->path, lineno, line, &m->t[m->n]) != 0)
            goto out_close;
        m->total += m->t[m->n].count;
        m->n++;
    }
    if (ferror(f)) {
        fprintf(stderr, "hvd-bench: reading %s: %s\n", m->path,
                strerror(errno));
        goto out_close;
    }
    if (m->n == 0) {
        fprintf(stderr, "hvd-bench: %s lists no tensors\n", m->path);
        goto out_close;
    }
    rc = 0;
out_close:
    fclose(f);
out_free:
    free(line);
    if (rc != 0)
        model_free(m);
    return rc;
}

/*
 * Gradient element i of tensor j on rank r: g_size * (r + 1 + k) with
 * k = (7 j + i) % 13, so that a misplaced tensor or offset shows. The sum
 * over ranks is g_size * (g_size (g_size + 1) / 2 + g_size k), the
 * average model_expected(j, i): small integers, exact in float32 (and an
 * in-place average of equal inputs gives them back).
 */
static void model_fill(float *buf, size_t count, int j) {
    float base = (float)g_size * (float)(g_rank + 1);
    float step = (float)g_size;
    size_t i, k = (7 * (size_t)j) % 13;

    for (i = 0; i < count; i++) {
        buf[i] = base + step * (float)k;
        k = k == 12 ? 0 : k + 1;
    }
}

static long long model_wrong(const float *buf, size_t count, int j) {
    float base = (float)g_size * (float)(g_size + 1) / 2;
    float step = (float)g_size;
    size_t i, k = (7 * (size_t)j) % 13;
    long long wrong = 0;

    for (i = 0; i < count; i++) {
        wrong += buf[i] != base + step * (float)k;
        k = k == 12 ? 0 : k + 1;
    }
    return wrong;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Per-iteration times to the slowest rank's, in place: an operation is
 * done when it is done everywhere. */
static void slowest_per_iter(const char *name, double *v, int n) {
    hvd_check("hvd_allreduce",
              hvd_allreduce(name, v, v, (size_t)n, HVD_FLOAT64, HVD_MAX));
}

static long long sum_over_ranks(long long mine) {
    int64_t v = mine;

    hvd_check("hvd_allreduce",
              hvd_allreduce("hvd-bench.wrong", &v, &v, 1, HVD_INT64, HVD_SUM));
    return (long long)v;
}

/* One step as a trainer runs it: every gradient submitted as backward
 * produces it (last layer first), then all waited for. Returns the time
 * from the first submit to the last wait's return. */
static double model_step(struct model *m, hvd_handle *h) {
    double t0 = now_s();
    int j;

    for (j = m->n - 1; j >= 0; j--)
        hvd_check("hvd_allreduce_async",
                  hvd_allreduce_async(m->t[j].name, m->t[j].buf, m->t[j].buf,
                                      m->t[j].count, HVD_FLOAT32, HVD_AVERAGE,
                                      &h[j]));
    for (j = m->n - 1; j >= 0; j--)
        hvd_check("hvd_wait", hvd_wait(h[j]));
    return now_s() - t0;
}

struct step_result {
    double median_s;
    double min_s;
    long long wrong;
};

/*
 * The inputs are refilled before each step (not timed), and a barrier
 * starts the step on every rank at about the same time, so that a step's
 * time is the operation's and not the skew of the refill.
 */
static void bench_per_tensor(const struct options *o, struct model *m,
                             struct step_result *res) {
    double *times = xmalloc(sizeof(double) * (size_t)o->iters);
    hvd_handle *h = xmalloc(sizeof(*h) * (size_t)m->n);
    long long wrong = 0;
    int s, j;

    for (j = 0; j < m->n; j++)
        m->t[j].buf = xmalloc(m->t[j].count * sizeof(float));
    for (s = 0; s < o->warmup + o->iters; s++) {
        double dt;

        for (j = 0; j < m->n; j++)
            model_fill(m->t[j].buf, m->t[j].count, j);
        hvd_check("hvd_barrier", hvd_barrier());
        dt = model_step(m, h);
        if (s >= o->warmup)
            times[s - o->warmup] = dt;
    }
    for (j = 0; j < m->n; j++)
        wrong += model_wrong(m->t[j].buf, m->t[j].count, j);
    slowest_per_iter("hvd-bench.model.times", times, o->iters);
    res->wrong = sum_over_ranks(wrong);
    res->median_s = median(times, o->iters);
    res->min_s = times[0]; /* median sorted them */
    free(h);
    free(times);
}

static void bench_pre_fused(const struct options *o, const struct model *m,
                            struct step_result *res) {
    double *times = xmalloc(sizeof(double) * (size_t)o->iters);
    float *buf = xmalloc(m->total * sizeof(float));
    int s;

    for (s = 0; s < o->warmup + o->iters; s++) {
        double t0;

        model_fill(buf, m->total, 0);
        hvd_check("hvd_barrier", hvd_barrier());
        t0 = now_s();
        hvd_check("hvd_allreduce",
                  hvd_allreduce("hvd-bench.model.fused", buf, buf, m->total,
                                HVD_FLOAT32, HVD_AVERAGE));
        if (s >= o->warmup)
            times[s - o->warmup] = now_s() - t0;
    }
    res->wrong = sum_over_ranks(model_wrong(buf, m->total, 0));
    slowest_per_iter("hvd-bench.model.times", times, o->iters);
    res->median_s = median(times, o->iters);
    res->min_s = times[0]; /* median sorted them */
    free(buf);
    free(times);
}

/* What the engine thread measures for the caller, through the arg of
 * hvd_internal_call. */
struct bare_arg {
    double times[LAT_ITERS];
    long long wrong;
    hvd_status status;
    char error[512]; /* hvd_last_error() of the engine thread */
};

/* Runs on the engine thread, on every rank at the same point. */
static void bare_allreduce(void *argp, hvd_comm *comm) {
    struct bare_arg *a = argp;
    int it;

    for (it = 0; it < LAT_WARMUP + LAT_ITERS; it++) {
        float x = 1.0f;
        double t0 = now_s();
        hvd_status st =
            hvd_coll_allreduce(comm, &x, &x, 1, HVD_FLOAT32, HVD_SUM);
        double dt = now_s() - t0;

        if (st != HVD_OK) {
            a->status = st;
            snprintf(a->error, sizeof(a->error), "%s", hvd_last_error());
            return;
        }
        a->wrong += x != (float)comm->size;
        if (it >= LAT_WARMUP)
            a->times[it - LAT_WARMUP] = dt;
    }
    a->status = HVD_OK;
}

struct latency_result {
    double engine_s;
    double bare_s;
    long long engine_wrong;
    long long bare_wrong;
};

static void bench_latency(struct latency_result *res) {
    static struct bare_arg bare; /* too big for a thread's stack to spare */
    double times[LAT_ITERS];
    long long wrong = 0;
    int it;

    /* The same name every time: after the first, the response cache
     * decides it with no message through rank 0. */
    for (it = 0; it < LAT_WARMUP + LAT_ITERS; it++) {
        float x = 1.0f;
        double t0 = now_s();

        hvd_check("hvd_allreduce", hvd_allreduce("hvd-bench.latency", &x, &x, 1,
                                                 HVD_FLOAT32, HVD_SUM));
        if (it >= LAT_WARMUP)
            times[it - LAT_WARMUP] = now_s() - t0;
        wrong += x != (float)g_size;
    }
    slowest_per_iter("hvd-bench.latency.times", times, LAT_ITERS);
    res->engine_wrong = sum_over_ranks(wrong);
    res->engine_s = median(times, LAT_ITERS);

    memset(&bare, 0, sizeof(bare));
    bare.status = HVD_ERR_INTERNAL;
    snprintf(bare.error, sizeof(bare.error), "the function never ran");
    hvd_check("hvd_internal_call",
              hvd_internal_call("hvd-bench.bare", bare_allreduce, &bare));
    if (bare.status != HVD_OK) {
        fprintf(stderr,
                "hvd-bench: rank %d: hvd_coll_allreduce (engine thread) "
                "failed: %s: %s\n",
                g_rank, hvd_strerror(bare.status), bare.error);
        exit(1);
    }
    slowest_per_iter("hvd-bench.latency.times", bare.times, LAT_ITERS);
    res->bare_wrong = sum_over_ranks(bare.wrong);
    res->bare_s = median(bare.times, LAT_ITERS);
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

/* Returns the exit status: 0, or 1 if a value was wrong. */
static int bench_model(const struct options *o, struct model *m) {
    struct step_result per = {0}, fused = {0};
    struct latency_result lat = {0};
    long long wrong;

    /* The largest input, g_size * (g_size + 13), must be exact. */
    if ((long)g_size * (g_size + 13) > dtypes[6].max_exact) {
        if (g_rank == 0)
            fprintf(stderr,
                    "hvd-bench: --model's float32 checks are exact up to "
                    "4089 ranks, not %d\n",
                    g_size);
        return 1;
    }
    if (g_rank == 0) {
        printf("#\n# model %s: %d tensors, %zu elements (%.1f MB) per "
               "step\n",
               o->model, m->n, m->total,
               (double)m->total * sizeof(float) / 1e6);
        printf("#  from %s\n", m->path);
        printf("#  float32 average, in place, backward order; warmup %d "
               "iters %d; time of a step: the slowest rank's\n",
               o->warmup, o->iters);
    }
    bench_per_tensor(o, m, &per);
    bench_pre_fused(o, m, &fused);
    bench_latency(&lat);
    wrong = per.wrong + fused.wrong + lat.engine_wrong + lat.bare_wrong;
    if (g_rank == 0) {
        printf("#\n#%-36s  %11s  %11s  %8s\n", " step", "median (ms)",
               "min (ms)", "#wrong");
        printf(" %-36s  %11.2f  %11.2f  %8lld\n",
               "per-tensor (engine, fused by hvd)", per.median_s * 1e3,
               per.min_s * 1e3, per.wrong);
        printf(" %-36s  %11.2f  %11.2f  %8lld\n", "one pre-fused allreduce",
               fused.median_s * 1e3, fused.min_s * 1e3, fused.wrong);
        printf("%s step: per-tensor %.2f ms, pre-fused %.2f ms, ratio %.3f\n",
               o->model, per.median_s * 1e3, fused.median_s * 1e3,
               ratio(per.median_s, fused.median_s));
        printf("#\n# cached 4-byte allreduce (1 float32, sum, same name): "
               "warmup %d iters %d; time of an iteration: the slowest "
               "rank's\n",
               LAT_WARMUP, LAT_ITERS);
        printf("#%-36s  %11s  %8s\n", " path", "median (us)", "#wrong");
        printf(" %-36s  %11.2f  %8lld\n", "engine (hvd_allreduce)",
               lat.engine_s * 1e6, lat.engine_wrong);
        printf(" %-36s  %11.2f  %8lld\n",
               "bare collective (hvd_coll_allreduce)", lat.bare_s * 1e6,
               lat.bare_wrong);
        printf("cached 4-byte allreduce: engine %.2f us, bare collective "
               "%.2f us, ratio %.2f\n",
               lat.engine_s * 1e6, lat.bare_s * 1e6,
               ratio(lat.engine_s, lat.bare_s));
        printf("# Out of bounds values : %lld %s\n#\n", wrong,
               wrong == 0 ? "OK" : "FAILED");
    }
    return wrong == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ */
/* Command line                                                        */

static void usage(FILE *f) {
    fprintf(f,
            "usage: hvd-bench [options]\n"
            "  --op allreduce|allgather|broadcast|all   (allreduce)\n"
            "  --minbytes N     smallest size, K/M/G suffixes   (8)\n"
            "  --maxbytes N     largest size                    (256M)\n"
            "  --stepfactor N   size multiplier between rows    (4)\n"
            "  --dtype T        uint8 int8 int32 int64 float16 bfloat16\n"
            "                   float32 float64                 (float32)\n"
            "  --redop OP       sum avg min max prod            (sum)\n"
            "  --iters N        timed iterations per size       (20)\n"
            "  --warmup N       untimed iterations before them  (5)\n"
            "  --inplace        in place (allreduce then uses min or max,\n"
            "                   the ops whose result repeats; sum, avg and\n"
            "                   prod become max)\n"
            "  --root R         broadcast root                  (0)\n"
            "  --check 0|1      check every result element      (1)\n"
            "  --backend hvd|mpi                                (hvd)\n"
            "  --compare mpi    also run MPI's collective on the same\n"
            "                   buffers after hvd's, print its busbw and\n"
            "                   the ratio hvd/MPI (under mpirun)\n"
            "  --csv FILE       one row per size: op,bytes,count,dtype,\n"
            "                   time_us,algbw,busbw,wrong,path[,mpi_busbw,\n"
            "                   ratio]\n"
            "  --plot FILE.png  busbw against size (gnuplot)\n"
            "  --model resnet50 instead of the sweep: per-tensor gradient\n"
            "                   allreduces of one training step against one\n"
            "                   pre-fused allreduce, then cached 4-byte\n"
            "                   latency against the bare collective (hvd\n"
            "                   backend; --iters (10) and --warmup (3) count\n"
            "                   steps; the sweep's other options do not\n"
            "                   apply)\n"
            "  --model-file P   the model's tensor list, name<TAB>shape<TAB>\n"
            "                   elements per line, forward order\n"
            "                   (shared/data/<model>_params.tsv)\n"
            "  --help\n"
            "Size is the per-rank buffer (allreduce, broadcast) or the total\n"
            "received (allgather), as in nccl-tests.\n");
}

static int parse_size(const char *s, size_t *size_out) {
    unsigned long long v, mult = 1;
    char *end;

    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    switch (*end) {
    case 'K':
    case 'k':
        mult = 1ULL << 10;
        end++;
        break;
    case 'M':
    case 'm':
        mult = 1ULL << 20;
        end++;
        break;
    case 'G':
    case 'g':
        mult = 1ULL << 30;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0' || v > SIZE_MAX / mult)
        return -1;
    *size_out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int min, int *value_out) {
    char *end;
    long v;

    if (s == NULL)
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < min || v > INT_MAX)
        return -1;
    *value_out = (int)v;
    return 0;
}

/* 0 on success; -1 after printing why. */
static int parse_args(int argc, char **argv, struct options *o) {
    int i;
    size_t k;

    for (i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 0, step = 0;

        if (strcmp(opt, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(opt, "--inplace") == 0) {
            o->inplace = 1;
            ok = 1;
        } else if (val == NULL) {
            ok = 0;
        } else if (strcmp(opt, "--op") == 0) {
            step = 1;
            memset(o->run, 0, sizeof(o->run));
            for (k = 0; k < NUM_COLLS; k++)
                if (strcmp(val, coll_names[k]) == 0 ||
                    strcmp(val, "all") == 0) {
                    o->run[k] = 1;
                    ok = 1;
                }
        } else if (strcmp(opt, "--minbytes") == 0) {
            step = 1;
            ok = parse_size(val, &o->minbytes) == 0;
        } else if (strcmp(opt, "--maxbytes") == 0) {
            step = 1;
            ok = parse_size(val, &o->maxbytes) == 0;
        } else if (strcmp(opt, "--stepfactor") == 0) {
            step = 1;
            ok = parse_size(val, &o->stepfactor) == 0 && o->stepfactor >= 2;
        } else if (strcmp(opt, "--dtype") == 0) {
            step = 1;
            for (k = 0; k < NUM_DTYPES; k++)
                if (strcmp(val, dtypes[k].name) == 0 ||
                    strcmp(val, dtypes[k].alias) == 0) {
                    o->dtype = &dtypes[k];
                    ok = 1;
                }
        } else if (strcmp(opt, "--redop") == 0) {
            step = 1;
            for (k = 0; k < NUM_REDOPS; k++)
                if (strcmp(val, redops[k].name) == 0 ||
                    strcmp(val, redops[k].alias) == 0) {
                    o->redop = &redops[k];
                    ok = 1;
                }
        } else if (strcmp(opt, "--iters") == 0) {
            step = 1;
            ok = parse_int(val, 1, &o->iters) == 0;
        } else if (strcmp(opt, "--warmup") == 0) {
            step = 1;
            ok = parse_int(val, 0, &o->warmup) == 0;
        } else if (strcmp(opt, "--root") == 0) {
            step = 1;
            ok = parse_int(val, 0, &o->root) == 0;
        } else if (strcmp(opt, "--check") == 0) {
            step = 1;
            ok = parse_int(val, 0, &o->check) == 0 && o->check <= 1;
        } else if (strcmp(opt, "--backend") == 0) {
            step = 1;
            o->backend = val;
            ok = strcmp(val, "hvd") == 0 || strcmp(val, "mpi") == 0;
        } else if (strcmp(opt, "--compare") == 0) {
            step = 1;
            o->compare = val;
            ok = strcmp(val, "mpi") == 0;
        } else if (strcmp(opt, "--csv") == 0) {
            step = 1;
            o->csv = val;
            ok = *val != '\0';
        } else if (strcmp(opt, "--plot") == 0) {
            step = 1;
            o->plot = val;
            ok = *val != '\0';
        } else if (strcmp(opt, "--model") == 0) {
            step = 1;
            o->model = val;
            ok = *val != '\0';
        } else if (strcmp(opt, "--model-file") == 0) {
            step = 1;
            o->model_file = val;
            ok = *val != '\0';
        }
        if (!ok) {
            if (val != NULL && step)
                fprintf(stderr, "hvd-bench: bad value for %s: %s\n", opt, val);
            else
                fprintf(stderr,
                        "hvd-bench: unknown option or missing value: "
                        "%s\n",
                        opt);
            usage(stderr);
            return -1;
        }
        i += step;
    }
    if (o->minbytes == 0 || o->minbytes > o->maxbytes) {
        fprintf(stderr, "hvd-bench: need 0 < --minbytes <= --maxbytes\n");
        return -1;
    }
    if (o->model_file != NULL && o->model == NULL) {
        fprintf(stderr, "hvd-bench: --model-file needs --model NAME (the "
                        "name the report gives the model)\n");
        return -1;
    }
    if (o->model != NULL && o->model_file == NULL &&
        strcmp(o->model, "resnet50") != 0) {
        fprintf(stderr,
                "hvd-bench: unknown --model %s (built in: resnet50); give "
                "its tensor list with --model-file PATH\n",
                o->model);
        return -1;
    }
    /* A model step is far longer than one sweep iteration. */
    if (o->iters < 0)
        o->iters = o->model != NULL ? 10 : 20;
    if (o->warmup < 0)
        o->warmup = o->model != NULL ? 3 : 5;
    return 0;
}

/* MPI's backend when --compare mpi, else NULL. */
static const struct backend *compare_backend(const struct options *o) {
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
static const struct backend *choose_backend(const struct options *o) {
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
    if (o->run[COLL_ALLREDUCE] && !o->inplace &&
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
    long bound;
    int c;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_args(argc, argv, &o) != 0)
        return 1;
    be = choose_backend(&o);
    if (be == NULL)
        return 1;
    if (o.model != NULL && model_load(&o, &model) != 0)
        return 1;
#ifdef HVD_BENCH_WITH_MPI
    if (o.compare != NULL) {
        /* MPI first: hvd then uses the application's MPI to bootstrap and
         * leaves it to the application to finalize. */
        int provided, mpi_size;
        mpi_check(
            "MPI_Init_thread",
            MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided));
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        mpi_check("MPI_Comm_size", MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
        be->init(&argc, &argv);
        if (mpi_size != g_size) {
            fprintf(stderr,
                    "hvd-bench: --compare mpi: MPI sees %d ranks and hvd %d; "
                    "start the job with mpirun\n",
                    mpi_size, g_size);
            be->finalize();
            MPI_Finalize();
            return 1;
        }
    } else
#endif
        be->init(&argc, &argv);

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

    if (o.root >= g_size) {
        if (g_rank == 0)
            fprintf(stderr, "hvd-bench: --root %d but only %d ranks\n", o.root,
                    g_size);
        be->finalize();
        return 1;
    }
    /* Results reach 2 * size (sums) or 10 (inputs); past what the dtype
     * holds exactly, the checks would fail. */
    bound = 2L * g_size > 10 ? 2L * g_size : 10;
    if (o.check && bound > o.dtype->max_exact) {
        if (g_rank == 0)
            fprintf(stderr,
                    "hvd-bench: %s cannot hold this benchmark's results "
                    "exactly at %d ranks; use --check 0 or a wider dtype\n",
                    o.dtype->name, g_size);
        be->finalize();
        return 1;
    }
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
    char csv_tmp[] = "/tmp/hvd-bench-csv.XXXXXX";
    const char *csv_path = o.csv;
    int plot_failed = 0;
    if (g_rank == 0 && (o.csv != NULL || o.plot != NULL)) {
        if (o.csv != NULL) {
            g_csv = fopen(o.csv, "w");
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
                o.compare != NULL ? ",mpi_busbw,ratio" : "");
    }
    for (c = 0; c < NUM_COLLS; c++)
        if (o.run[c])
            bench_coll(be, &o, (enum coll)c, sendbuf, recvbuf, &t);
    if (g_csv != NULL) {
        fclose(g_csv);
        g_csv = NULL;
        if (o.plot != NULL)
            plot_failed = plot(&o, csv_path);
        if (o.csv == NULL)
            unlink(csv_tmp);
    }
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
