/*
 * Many operations of random sizes, dtypes and ops, every result checked,
 * and the resident memory watched.
 *
 *     test_soak --ops N [--max-bytes B] [--kinds allreduce|mixed]
 *               [--seed S] [--warmup W] [--rss-limit-kib K]
 *               [--first-part yes|no]
 *
 * Every rank draws the same sequence of operations from the seed (default
 * 1): the kind (allreduce; with --kinds mixed also broadcast from a random
 * root and allgather), the dtype, the op, and a size log-uniform between 1
 * byte and B (default 8M; 2 % are empty). Operations go out in batches of
 * 1 to 4 async operations (so that small ones fuse) that share one send
 * and one receive pool of B bytes (a batch ends when the next operation
 * does not fit), and are waited for and checked element by element.
 *
 * Inputs are small integers that repeat with a period of 1021 elements,
 * chosen per operation so that every sum, average, product, minimum and
 * maximum is exact in the dtype: each rank fills and checks with memcpy
 * and memcmp of precomputed blocks, so the checks cost little more than
 * the data.
 *
 * Resident memory (/proc/self/statm) is read after W operations (default:
 * a tenth, at least 100), half way from there to the end (printed, to
 * tell a steady leak from one late growth), and at the end; with
 * --rss-limit-kib the growth from the first reading to the last must stay
 * below K KiB. Before the W operations every rank runs one operation of
 * each kind and dtype at the largest size and at every power of two below
 * it (and one byte less), and per dtype a batch of MAX_BATCH allreduces
 * that fuse, so that buffers sized by the largest message of a path or
 * size class, and the fusion buffer, have grown (--first-part no leaves
 * that first part out: over a slow link it takes most of the time, and
 * without --rss-limit-kib no limit needs it). The shared part of the
 * resident memory (the shm transport's segments) is printed apart.
 *
 * Prints "PASS soak rank R: ..." with the counts, the time and the memory,
 * or "FAIL soak rank R: ..." at the first wrong value or failed call.
 * Exit status: 0 pass, 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PERIOD 1021
#define MAX_BATCH 4
#define FUSED_BYTES ((size_t)256 * 1024)
#define NAME_LEN 64

enum { KIND_ALLREDUCE, KIND_BROADCAST, KIND_ALLGATHER };

struct dtype_info {
    hvd_dtype dtype;
    const char *name;
    size_t size;
    int is_signed;
    long max_exact; /* every integer up to this magnitude is exact */
};

static const struct dtype_info dtypes[] = {
    {HVD_UINT8, "uint8", 1, 0, 255},
    {HVD_INT8, "int8", 1, 1, 127},
    {HVD_INT32, "int32", 4, 1, 1L << 30},
    {HVD_INT64, "int64", 8, 1, 1L << 30},
    {HVD_FLOAT16, "float16", 2, 1, 2048},
    {HVD_BFLOAT16, "bfloat16", 2, 1, 256},
    {HVD_FLOAT32, "float32", 4, 1, 1L << 24},
    {HVD_FLOAT64, "float64", 8, 1, 1L << 30},
};
#define NUM_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static const hvd_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                             HVD_PRODUCT};
static const char *const op_names[] = {"sum", "average", "min", "max",
                                       "product"};
#define NUM_OPS (sizeof(ops) / sizeof(ops[0]))

/* One operation of a batch. */
struct soak_op {
    int kind;
    int dt; /* index into dtypes */
    int op; /* index into ops */
    int root;
    unsigned shift;
    size_t count;
    uint8_t *send; /* slices of the pools */
    uint8_t *recv;
    hvd_handle handle;
    char name[NAME_LEN];
};

static int g_rank = -1, g_size = -1;

static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;

    printf("FAIL soak rank %d: ", g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

/* ------------------------------------------------------------------ */
/* The shared random sequence: xorshift64*, the same on every rank.    */

static uint64_t rng_state;

static uint64_t rng(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rng_unit(void) { return (double)(rng() >> 11) * 0x1.0p-53; }

/* Writes integer v as dtype dt at p (testutil.h's exact encoding). */
static void store(int dt, uint8_t *p, long v) {
    put_value(dtypes[dt].dtype, p, 0, v);
}

/* ------------------------------------------------------------------ */
/* Inputs and expected results                                         */

/* Rank r's input at position k (0 <= k < PERIOD) of an operation. */
static long input(const struct soak_op *o, int r, unsigned k) {
    const struct dtype_info *d = &dtypes[o->dt];
    unsigned j = (k + o->shift) % PERIOD;

    if (o->kind != KIND_ALLREDUCE)
        return (long)((j * 7 + (unsigned)r * 31) % 100) -
               (d->is_signed ? 50 : 0);
    switch (ops[o->op]) {
    case HVD_SUM:
    case HVD_AVERAGE: {
        /* base + (2r - (size-1)): the deviations sum to 0, so the sum is
         * size * base and the average base, exactly, and no input is
         * negative. */
        long m = d->max_exact / g_size - g_size + 1;
        if (m > 1000)
            m = 1000;
        return (long)(j % (unsigned)m) + g_size + 2L * r - (g_size - 1);
    }
    case HVD_PRODUCT:
        if (d->is_signed && (j + (unsigned)r) % 3 == 0)
            return -1;
        return 1 + (long)((j + 2u * (unsigned)r) % 2);
    default: {
        long v = (long)((j * 13 + (unsigned)r * 29) % 100);
        return d->is_signed ? v - 50 : v;
    }
    }
}

static long reduce_expected(const struct soak_op *o, unsigned k) {
    long acc = input(o, 0, k);

    for (int r = 1; r < g_size; r++) {
        long v = input(o, r, k);
        switch (ops[o->op]) {
        case HVD_SUM:
        case HVD_AVERAGE:
            acc += v;
            break;
        case HVD_PRODUCT:
            acc *= v;
            break;
        case HVD_MIN:
            acc = v < acc ? v : acc;
            break;
        default:
            acc = v > acc ? v : acc;
            break;
        }
    }
    return ops[o->op] == HVD_AVERAGE ? acc / g_size : acc;
}

/* Fills dst (n elements) with the repeating block pat of PERIOD elements. */
static void fill_pattern(uint8_t *dst, size_t n, const uint8_t *pat,
                         size_t esize) {
    size_t block = PERIOD * esize, bytes = n * esize;

    for (size_t off = 0; off < bytes; off += block)
        memcpy(dst + off, pat, bytes - off < block ? bytes - off : block);
}

/* Index of the first element of got (n elements) that differs from the
 * repeating pattern, or n. */
static size_t check_pattern(const uint8_t *got, size_t n, const uint8_t *pat,
                            size_t esize) {
    size_t block = PERIOD * esize, bytes = n * esize;

    for (size_t off = 0; off < bytes; off += block) {
        size_t len = bytes - off < block ? bytes - off : block;
        if (memcmp(got + off, pat, len) != 0) {
            for (size_t b = 0; b < len; b++)
                if (got[off + b] != pat[b])
                    return (off + b) / esize;
        }
    }
    return n;
}

/* Per operation: this rank's input block and the expected blocks. */
static uint8_t *g_mine;     /* PERIOD elements */
static uint8_t *g_expect;   /* PERIOD elements (allreduce, broadcast) */
static uint8_t *g_per_rank; /* size * PERIOD elements (allgather) */

static void prepare(const struct soak_op *o) {
    size_t es = dtypes[o->dt].size;

    for (unsigned k = 0; k < PERIOD; k++) {
        store(o->dt, g_mine + k * es, input(o, g_rank, k));
        if (o->kind == KIND_ALLREDUCE)
            store(o->dt, g_expect + k * es, reduce_expected(o, k));
        else if (o->kind == KIND_BROADCAST)
            store(o->dt, g_expect + k * es, input(o, o->root, k));
        else
            for (int r = 0; r < g_size; r++)
                store(o->dt, g_per_rank + ((size_t)r * PERIOD + k) * es,
                      input(o, r, k));
    }
}

static const char *kind_name(int kind) {
    return kind == KIND_ALLREDUCE   ? "allreduce"
           : kind == KIND_BROADCAST ? "broadcast"
                                    : "allgather";
}

static void submit(struct soak_op *o) {
    size_t es = dtypes[o->dt].size;
    hvd_dtype dt = dtypes[o->dt].dtype;
    hvd_status s;

    prepare(o);
    if (o->kind == KIND_BROADCAST) {
        /* In place: the root's buffer holds its input, the others' hold
         * garbage that must be overwritten. */
        if (g_rank == o->root)
            fill_pattern(o->recv, o->count, g_mine, es);
        else
            memset(o->recv, 0xA5, o->count * es);
        s = hvd_broadcast_async(o->name, o->recv, o->count, dt, o->root,
                                &o->handle);
    } else {
        fill_pattern(o->send, o->count, g_mine, es);
        if (o->kind == KIND_ALLREDUCE)
            s = hvd_allreduce_async(o->name, o->send, o->recv, o->count, dt,
                                    ops[o->op], &o->handle);
        else
            s = hvd_allgather_async(o->name, o->send, o->recv, o->count, dt,
                                    &o->handle);
    }
    if (s != HVD_OK)
        fail("%s '%s' (%s, %zu elements): %s: %s", kind_name(o->kind), o->name,
             dtypes[o->dt].name, o->count, status_name(s), hvd_last_error());
}

static void finish(struct soak_op *o) {
    size_t es = dtypes[o->dt].size, bad;
    hvd_status s = hvd_wait(o->handle);

    if (s != HVD_OK)
        fail("%s '%s' (%s, %zu elements): %s: %s", kind_name(o->kind), o->name,
             dtypes[o->dt].name, o->count, status_name(s), hvd_last_error());
    /* The expected blocks of this operation (a later one of the batch may
     * have replaced them). */
    prepare(o);
    if (o->kind == KIND_ALLGATHER) {
        for (int r = 0; r < g_size; r++) {
            bad = check_pattern(o->recv + (size_t)r * o->count * es, o->count,
                                g_per_rank + (size_t)r * PERIOD * es, es);
            if (bad < o->count)
                fail("allgather '%s' (%s, %zu elements): block of rank %d is "
                     "wrong at element %zu",
                     o->name, dtypes[o->dt].name, o->count, r, bad);
        }
        return;
    }
    bad = check_pattern(o->recv, o->count, g_expect, es);
    if (bad < o->count)
        fail("%s '%s' (%s %s, %zu elements, root %d): element %zu is wrong",
             kind_name(o->kind), o->name, dtypes[o->dt].name, op_names[o->op],
             o->count, o->root, bad);
}

/* Resident memory (KiB) from /proc/self/statm; *shared_out gets the part
 * that is shared (file or shared-memory pages, such as the shm transport's
 * segments, which grow as their pages are first touched). */
static long rss_kib(long *shared_out) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = -1, shared = 0;
    long kib = sysconf(_SC_PAGESIZE) / 1024;

    if (f == NULL)
        return -1;
    if (fscanf(f, "%ld %ld %ld", &size, &resident, &shared) != 3)
        resident = -1;
    fclose(f);
    if (shared_out != NULL)
        *shared_out = shared * kib;
    return resident < 0 ? -1 : resident * kib;
}

static int parse_bytes(const char *s, size_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);

    if (end == s)
        return -1;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end != '\0' || v < 64 || v > ((size_t)1 << 30))
        return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char **argv) {
    int nops = -1, warmup = -1, rss_limit = -1, seed = 1, mixed = 0;
    int first_part = 1;
    size_t max_bytes = (size_t)8 << 20;
    struct soak_op batch[MAX_BATCH];
    int nbatch = 0, i, done = 0;
    size_t send_used = 0, recv_used = 0;
    uint8_t *send_pool, *recv_pool;
    double bytes_total = 0, t0, elapsed;
    long rss_warm = -1, rss_mid = -1, rss_end, rss_max = 0;
    long shared_warm = 0, shared_end = 0;
    int mid;
    unsigned long by_kind[3] = {0, 0, 0}, empty = 0;
    hvd_status s;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--ops") == 0 && parse_int(v, &nops) == 0)
            continue;
        if (strcmp(a, "--max-bytes") == 0 && parse_bytes(v, &max_bytes) == 0)
            continue;
        if (strcmp(a, "--kinds") == 0 &&
            (strcmp(v, "allreduce") == 0 || strcmp(v, "mixed") == 0)) {
            mixed = strcmp(v, "mixed") == 0;
            continue;
        }
        if (strcmp(a, "--seed") == 0 && parse_int(v, &seed) == 0)
            continue;
        if (strcmp(a, "--warmup") == 0 && parse_int(v, &warmup) == 0)
            continue;
        if (strcmp(a, "--rss-limit-kib") == 0 && parse_int(v, &rss_limit) == 0)
            continue;
        if (strcmp(a, "--first-part") == 0 &&
            (strcmp(v, "yes") == 0 || strcmp(v, "no") == 0)) {
            first_part = strcmp(v, "yes") == 0;
            continue;
        }
        break;
    }
    if (i != argc || nops < 1) {
        fprintf(stderr,
                "usage: %s --ops N [--max-bytes B] [--kinds allreduce|mixed] "
                "[--seed S] [--warmup W] [--rss-limit-kib K] "
                "[--first-part yes|no]\n",
                argv[0]);
        return 2;
    }
    if (warmup < 0)
        warmup = nops / 10 > 100 ? nops / 10 : 100;
    if (warmup > nops)
        warmup = nops;
    mid = warmup + (nops - warmup) / 2;

    s = hvd_init();
    if (s != HVD_OK) {
        printf("FAIL soak: hvd_init: %s: %s\n", status_name(s),
               hvd_last_error());
        return 1;
    }
    g_rank = hvd_rank();
    g_size = hvd_size();
    /* The mesh is up (hvd_init returns after it): run_badnet.sh waits for
     * this line before it looks at who listens where. */
    printf("READY soak rank %d\n", g_rank);
    fflush(stdout);
    rng_state = 0x9E3779B97F4A7C15ULL ^ (uint64_t)seed;

    /* Touched once, so that they are resident before the first reading. */
    send_pool = malloc(max_bytes);
    recv_pool = malloc(max_bytes * (size_t)g_size);
    g_mine = malloc(PERIOD * 8);
    g_expect = malloc(PERIOD * 8);
    g_per_rank = malloc((size_t)g_size * PERIOD * 8);
    if (send_pool == NULL || recv_pool == NULL || g_mine == NULL ||
        g_expect == NULL || g_per_rank == NULL)
        fail("out of memory (%zu-byte pools)", max_bytes);
    memset(send_pool, 0, max_bytes);
    memset(recv_pool, 0, max_bytes * (size_t)g_size);

    /* The first part: every kind and dtype at the largest size and at
     * each power of two (and one byte less) below it, so that buffers
     * sized per path or per size class have grown before the warm-up
     * ends; then, per dtype, a batch of MAX_BATCH sums of FUSED_BYTES
     * each (the default HVD_FUSION_TENSOR_MAX), which fuse, so that the
     * fusion buffer has grown too. These are not counted among the nops. */
    int nlog = 0;
    while (((size_t)2 << nlog) <= max_bytes)
        nlog++;
    int nsteps = 1 + 2 * (nlog + 1);
    int nsized = (mixed ? 3 : 1) * (int)NUM_DTYPES * nsteps;
    int nfirst = first_part ? nsized + (int)NUM_DTYPES * MAX_BATCH : 0;
    size_t fused_bytes = FUSED_BYTES < max_bytes / MAX_BATCH
                             ? FUSED_BYTES
                             : max_bytes / MAX_BATCH;
    t0 = now_s();
    for (int n = -nfirst; n < nops; n++) {
        struct soak_op o;
        int grouped = n < 0 && n + nfirst >= nsized;

        memset(&o, 0, sizeof(o));
        if (grouped) {
            o.kind = KIND_ALLREDUCE;
            o.dt = (n + nfirst - nsized) / MAX_BATCH;
            o.op = 0;
            o.count = fused_bytes / dtypes[o.dt].size;
        } else if (n < 0) {
            int f = n + nfirst, step = f % nsteps;
            size_t bytes = step == 0 ? max_bytes
                                     : ((size_t)1 << ((step - 1) / 2)) -
                                           (size_t)(step % 2 == 1);
            o.kind = f / nsteps / (int)NUM_DTYPES;
            o.dt = f / nsteps % (int)NUM_DTYPES;
            o.op = (int)(rng() % NUM_OPS);
            o.count = bytes / dtypes[o.dt].size;
        } else {
            double u = rng_unit();
            o.kind = !mixed || u < 0.7 ? KIND_ALLREDUCE
                     : u < 0.85        ? KIND_BROADCAST
                                       : KIND_ALLGATHER;
            o.dt = (int)(rng() % NUM_DTYPES);
            o.op = (int)(rng() % NUM_OPS);
            if (rng() % 50 == 0) {
                o.count = 0;
            } else {
                double b = exp(rng_unit() * log((double)max_bytes));
                o.count = (size_t)b / dtypes[o.dt].size;
                if (o.count == 0)
                    o.count = 1;
            }
        }
        o.root = (int)(rng() % (uint64_t)g_size);
        o.shift = (unsigned)(rng() % PERIOD);
        snprintf(o.name, sizeof(o.name), "soak.%d", n);
        size_t bytes = o.count * dtypes[o.dt].size;
        size_t rbytes =
            o.kind == KIND_ALLGATHER ? bytes * (size_t)g_size : bytes;

        /* A batch ends when it is full, when this operation does not fit
         * in the pools, or at random (1 to 4 operations); the fused ones
         * of the first part go MAX_BATCH at a time. */
        if (nbatch > 0 &&
            (nbatch == MAX_BATCH || send_used + bytes > max_bytes ||
             recv_used + rbytes > max_bytes * (size_t)g_size ||
             (grouped ? (n + nfirst - nsized) % MAX_BATCH == 0
                      : rng() % 3 == 0))) {
            for (int k = 0; k < nbatch; k++)
                finish(&batch[k]);
            done += nbatch;
            nbatch = 0;
            send_used = recv_used = 0;
            long sh, r = rss_kib(&sh);
            if (r > rss_max)
                rss_max = r;
            if (rss_warm < 0 && n >= warmup) {
                rss_warm = r;
                shared_warm = sh;
            }
            if (rss_mid < 0 && n >= mid)
                rss_mid = r;
        }
        o.send = send_pool + send_used;
        o.recv = recv_pool + recv_used;
        send_used += (bytes + 63) & ~(size_t)63;
        recv_used += (rbytes + 63) & ~(size_t)63;
        batch[nbatch] = o;
        submit(&batch[nbatch]);
        nbatch++;
        if (n >= 0) {
            bytes_total += (double)bytes;
            by_kind[o.kind]++;
            empty += o.count == 0;
        }
    }
    for (int k = 0; k < nbatch; k++)
        finish(&batch[k]);
    elapsed = now_s() - t0;
    rss_end = rss_kib(&shared_end);
    if (rss_warm < 0) {
        rss_warm = rss_end;
        shared_warm = shared_end;
    }
    if (rss_mid < 0)
        rss_mid = rss_end;
    if (rss_end > rss_max)
        rss_max = rss_end;

    s = hvd_shutdown();
    if (s != HVD_OK)
        fail("hvd_shutdown: %s: %s", status_name(s), hvd_last_error());
    if (rss_limit >= 0 && rss_end - rss_warm >= rss_limit)
        fail("resident memory grew by %ld KiB after warm-up: %ld KiB after "
             "%d ops, %ld KiB (%+ld) after %d, %ld KiB (%+ld) at the end; "
             "limit %d KiB",
             rss_end - rss_warm, rss_warm, warmup, rss_mid, rss_mid - rss_warm,
             mid, rss_end, rss_end - rss_mid, rss_limit);
    printf("PASS soak rank %d: %d ops (%lu allreduce, %lu broadcast, %lu "
           "allgather, %lu empty) after %d of the first part, %.2f GB per "
           "rank, every result exact, "
           "%.1f s; resident memory after %d ops %ld KiB, after %d %ld KiB "
           "(%+ld KiB), at the end %ld KiB (%+ld KiB), peak %ld KiB; of it "
           "shared %ld KiB, then %ld KiB (%+ld KiB)\n",
           g_rank, nops, by_kind[0], by_kind[1], by_kind[2], empty, nfirst,
           bytes_total / 1e9, elapsed, warmup, rss_warm, mid, rss_mid,
           rss_mid - rss_warm, rss_end, rss_end - rss_mid, rss_max, shared_warm,
           shared_end, shared_end - shared_warm);
    free(send_pool);
    free(recv_pool);
    free(g_mine);
    free(g_expect);
    free(g_per_rank);
    return 0;
}
