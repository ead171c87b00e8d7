/*
 * The sweep over sizes, one row of the table for each: the inputs (small
 * integers, exact in every dtype) and the results expected of them, the
 * timed iterations, the check of every element, and the row itself on
 * stdout and in --csv, with MPI's busbw beside it under --compare mpi.
 * plot() draws the CSV with gnuplot for --plot.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
        case HVD_ADASUM: /* not used here */
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
    case COLL_ALLTOALL:
        return (long)((i + 3 * ur) % 11);
    case COLL_REDUCESCATTER:
        return input_value(COLL_ALLREDUCE, op, r, i);
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
        case HVD_ADASUM: /* not used here */
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
FILE *g_csv;

double now_s(void) {
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
    case COLL_ALLTOALL:
        be->alltoall(run->send, run->recv, run->count, dtype);
        break;
    case COLL_REDUCESCATTER:
        be->reducescatter(run->send, run->recv, run->count, dtype, run->op);
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
    case COLL_ALLTOALL:
        /* count elements to each rank: block d of sendbuf goes to d. */
        memset(recvbuf, 0xff, bytes * (size_t)g_size);
        run->send = sendbuf;
        fill(o, run->send, run->coll, run->op, g_rank,
             run->count * (size_t)g_size);
        break;
    case COLL_REDUCESCATTER:
        memset(recvbuf, 0xff, bytes);
        run->send = sendbuf;
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
    case COLL_ALLTOALL:
        /* Block q came from rank q: its block g_rank. */
        for (q = 0; q < g_size; q++) {
            const unsigned char *block =
                (const unsigned char *)run->recv + (size_t)q * run->count * es;
            size_t from = (size_t)g_rank * run->count;

            for (i = 0; i < run->count; i++)
                wrong +=
                    get_bits(block, es, i) !=
                    encode(dtype, input_value(run->coll, run->op, q, from + i));
        }
        break;
    case COLL_REDUCESCATTER: {
        size_t off = 0, n = hvd_reducescatter_count(run->count, g_size, g_rank);

        for (q = 0; q < g_rank; q++)
            off += hvd_reducescatter_count(run->count, g_size, q);
        for (i = 0; i < n; i++)
            wrong += get_bits(run->recv, es, i) !=
                     encode(dtype, allreduce_expected(run->op, off + i));
        break;
    }
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
    case COLL_ALLTOALL:
    case COLL_REDUCESCATTER:
        return (n - 1) / n;
    case COLL_BROADCAST:
    case NUM_COLLS:
        break;
    }
    return 1;
}

void bench_coll(const struct backend *be, const struct options *o,
                enum coll coll, unsigned char *sendbuf, unsigned char *recvbuf,
                struct totals *t) {
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
    if (coll != COLL_ALLREDUCE && coll != COLL_REDUCESCATTER)
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
        /* alltoall: count is what goes to each rank. */
        int per_rank = coll == COLL_ALLGATHER || coll == COLL_ALLTOALL;
        run.count = per_rank ? bytes / es / (size_t)g_size : bytes / es;
        row.bytes = run.count * es * (per_rank ? (size_t)g_size : 1);
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
                bench_hvd_check("hvd_path",
                                hvd_path(coll_names[coll], row.bytes,
                                         o->dtype->dtype, path, sizeof(path)));
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
int plot(const struct options *o, const char *csv_path) {
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
