/*
 * Exhaustive correctness test of the blocking collectives.
 *
 * Run under hvdrun at any size (CI: 1, 2, 3, 4):
 *     hvdrun -np 4 test_collectives [--max-count N] [--quick]
 *
 * Every input is a small integer computed from (rank, element index), so
 * every result is exact in every dtype, float16 and bfloat16 included.
 * Each rank computes the expected result on its own, from the same formula,
 * and compares bit patterns. Exit status: 0 pass, 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MAX_COUNT ((size_t)16 * 1024 * 1024)
#define QUICK_MAX_COUNT ((size_t)1009)
#define ALLGATHER_MAX_COUNT ((size_t)1024 * 1024)
#define SENTINEL_BYTE 0xA5
#define NAME_LEN 96

struct dtype_info {
    hvd_dtype dtype;
    const char *name;
    size_t size;
    int is_signed;
    /* Largest magnitude whose integers (and all smaller ones) the type
     * holds exactly. */
    long max_exact;
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

struct op_info {
    hvd_op op;
    const char *name;
};

static const struct op_info ops[] = {
    {HVD_SUM, "sum"}, {HVD_AVERAGE, "average"}, {HVD_MIN, "min"},
    {HVD_MAX, "max"}, {HVD_PRODUCT, "product"},
};
#define NUM_OPS (sizeof(ops) / sizeof(ops[0]))

static const size_t counts[] = {
    0, 1, 7, 1009, (size_t)1 << 20, (size_t)1 << 24};
#define NUM_COUNTS (sizeof(counts) / sizeof(counts[0]))

/* The rank for messages: from HVD_RANK until hvd_init() has told us. */
static int g_rank = -1;
static int g_size = -1;
static unsigned long g_checks;
static unsigned long g_skipped;

/* ------------------------------------------------------------------ */
/* Prints "FAIL <what> rank <r>: <detail>" and exits 1; hvdrun then tears
 * the job down. */
static _Noreturn void fail(const char *what, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static _Noreturn void fail(const char *what, const char *fmt, ...) {
    va_list ap;

    printf("FAIL %s rank %d: ", what, g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

static void expect_status(const char *what, hvd_status got, hvd_status want) {
    if (got != want)
        fail(what, "status %s (%s) expected %s; last error: \"%s\"",
             status_name(got), hvd_strerror(got), status_name(want),
             hvd_last_error());
    g_checks++;
}

static void expect_ok(const char *what, hvd_status got) {
    expect_status(what, got, HVD_OK);
}

static void expect_true(const char *what, int cond, const char *detail) {
    if (!cond)
        fail(what, "%s", detail);
    g_checks++;
}

/* An argument error must be HVD_ERR_INVALID_ARG and say why. */
static void expect_invalid(const char *what, hvd_status got) {
    expect_status(what, got, HVD_ERR_INVALID_ARG);
    expect_true(what, hvd_last_error() != NULL && hvd_last_error()[0] != '\0',
                "hvd_last_error() is empty after HVD_ERR_INVALID_ARG");
}

static void *xmalloc(size_t bytes) {
    /* Never malloc(0): count 0 still passes real pointers. */
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL)
        fail("malloc", "cannot allocate %zu bytes", bytes);
    return p;
}

/* ------------------------------------------------------------------ */
/* Bit patterns (encode is testutil.h's)                               */

/* The value of a bit pattern, for messages only. */
static double decode(hvd_dtype dtype, uint64_t bits) {
    switch (dtype) {
    case HVD_UINT8:
        return (uint8_t)bits;
    case HVD_INT8:
        return (int8_t)(uint8_t)bits;
    case HVD_INT32:
        return (int32_t)(uint32_t)bits;
    case HVD_INT64:
        return (double)(int64_t)bits;
    case HVD_FLOAT16: {
        unsigned e = (unsigned)(bits >> 10) & 0x1f;
        double v = (double)(bits & 0x3ff);
        int shift;

        if (e == 31)
            v = (bits & 0x3ff) != 0 ? NAN : INFINITY;
        else {
            if (e != 0)
                v += 1024;
            /* value = v * 2^(max(e,1) - 25) */
            for (shift = (e != 0 ? (int)e : 1) - 25; shift > 0; shift--)
                v *= 2;
            for (; shift < 0; shift++)
                v /= 2;
        }
        return (bits & 0x8000) != 0 ? -v : v;
    }
    case HVD_BFLOAT16: {
        uint32_t b32 = (uint32_t)(bits & 0xffff) << 16;
        float f;

        memcpy(&f, &b32, sizeof(f));
        return f;
    }
    case HVD_FLOAT32: {
        uint32_t b32 = (uint32_t)bits;
        float f;

        memcpy(&f, &b32, sizeof(f));
        return f;
    }
    case HVD_FLOAT64: {
        double d;

        memcpy(&d, &bits, sizeof(d));
        return d;
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

/* ------------------------------------------------------------------ */
/* Allreduce inputs and expected results                               */

/* A well-mixed function of the element index, so that an element that
 * lands at the wrong offset (by any amount) is caught. */
static uint64_t mix(uint64_t i) {
    i ^= i >> 31;
    i *= 0x9e3779b97f4a7c15ULL;
    i ^= i >> 29;
    return i >> 32;
}

/* Input of element i on rank r, a small integer (the formulas of the test
 * plan, applied to mix(i)). */
static long input_value(hvd_op op, int is_signed, int r, int size, size_t i) {
    uint64_t m = mix(i);
    uint64_t ur = (uint64_t)r;
    long v;

    switch (op) {
    case HVD_ADASUM: /* not used here */
    case HVD_SUM:
        v = (long)((m * 7 + ur * 3) % 5);
        return is_signed ? v - 2 : v;
    case HVD_AVERAGE:
        /* A multiple of size, so that the average is an exact integer. */
        v = (long)((m * 7 + ur * 3) % 5);
        return (long)size * (is_signed ? v - 2 : v);
    case HVD_MIN:
    case HVD_MAX:
        v = (long)((m * 13 + ur * 7) % 100);
        return is_signed ? v - 50 : v;
    case HVD_PRODUCT:
        v = 1 + (long)((m + ur) % 2);
        return is_signed && (m + 2 * ur) % 3 == 0 ? -v : v;
    }
    return 0;
}

static long expected_value(hvd_op op, int is_signed, int size, size_t i) {
    long acc = input_value(op, is_signed, 0, size, i);
    int r;

    for (r = 1; r < size; r++) {
        long v = input_value(op, is_signed, r, size, i);

        acc = combine(op, acc, v);
    }
    if (op == HVD_AVERAGE)
        acc /= size; /* exact: acc is size times an integer */
    return acc;
}

/* Bound on |any input, partial or final result| of the formulas above; a
 * dtype that cannot hold it exactly is skipped (only happens above 6
 * ranks). */
static long result_bound(hvd_op op, int is_signed, int size) {
    switch (op) {
    case HVD_ADASUM: /* not used here */
    case HVD_SUM:
        return (long)size * (is_signed ? 2 : 4);
    case HVD_AVERAGE:
        return (long)size * size * (is_signed ? 2 : 4);
    case HVD_MIN:
    case HVD_MAX:
        return 99;
    case HVD_PRODUCT:
        return size >= 30 ? 1L << 30 : 1L << size;
    }
    return 0;
}

/* Inputs of this rank and expected results for one (op, signedness), as
 * int16 (every value we use fits), computed once and encoded per dtype. */
struct values {
    int16_t *in;
    int16_t *expected;
};

static void compute_values(hvd_op op, int is_signed, size_t count,
                           struct values *v) {
    size_t i;

    for (i = 0; i < count; i++) {
        v->in[i] = (int16_t)input_value(op, is_signed, g_rank, g_size, i);
        v->expected[i] = (int16_t)expected_value(op, is_signed, g_size, i);
    }
}

static void fill_values(const struct dtype_info *dt, void *buf,
                        const int16_t *vals, size_t count) {
    size_t i;

    for (i = 0; i < count; i++)
        put_bits(buf, dt->size, i, encode(dt->dtype, vals[i]));
}

/* Checks buf[i] == vals[i] bit for bit; prints up to 3 mismatches, then
 * fails. */
static void check_values(const char *what, const struct dtype_info *dt,
                         const void *buf, const int16_t *vals, size_t count) {
    size_t i;
    int bad = 0;

    for (i = 0; i < count && bad < 3; i++) {
        uint64_t got = get_bits(buf, dt->size, i);
        uint64_t want = encode(dt->dtype, vals[i]);

        if (got != want) {
            printf("FAIL %s rank %d: index %zu got %.17g (0x%" PRIx64
                   ") expected %.17g (0x%" PRIx64 ")\n",
                   what, g_rank, i, decode(dt->dtype, got), got,
                   decode(dt->dtype, want), want);
            bad++;
        }
    }
    if (bad > 0) {
        fflush(stdout);
        exit(1);
    }
    g_checks++;
}

static void check_sentinel_tail(const char *what, const unsigned char *buf,
                                size_t from, size_t to) {
    size_t i;

    for (i = from; i < to; i++)
        if (buf[i] != SENTINEL_BYTE)
            fail(what, "byte %zu beyond the result was overwritten (0x%02x)", i,
                 buf[i]);
    g_checks++;
}

static void test_allreduce_one(const struct dtype_info *dt,
                               const struct op_info *op, size_t count,
                               const struct values *v, unsigned char *a,
                               unsigned char *b) {
    char name[NAME_LEN], what[NAME_LEN + 32];
    size_t bytes = count * dt->size;

    /* In place. The byte after the result must stay untouched. */
    snprintf(name, sizeof(name), "ar.%s.%s.%zu.inplace", dt->name, op->name,
             count);
    fill_values(dt, a, v->in, count);
    memset(a + bytes, SENTINEL_BYTE, dt->size);
    expect_ok(name, hvd_allreduce(name, a, a, count, dt->dtype, op->op));
    check_values(name, dt, a, v->expected, count);
    check_sentinel_tail(name, a, bytes, bytes + dt->size);

    /* Out of place: recvbuf starts as a sentinel, sendbuf must not
     * change. */
    snprintf(name, sizeof(name), "ar.%s.%s.%zu.outofplace", dt->name, op->name,
             count);
    fill_values(dt, a, v->in, count);
    memset(b, SENTINEL_BYTE, bytes + dt->size);
    expect_ok(name, hvd_allreduce(name, a, b, count, dt->dtype, op->op));
    check_values(name, dt, b, v->expected, count);
    check_sentinel_tail(name, b, bytes, bytes + dt->size);
    snprintf(what, sizeof(what), "%s (sendbuf changed)", name);
    check_values(what, dt, a, v->in, count);
}

static void test_allreduce(size_t count) {
    /* One spare element past the end, to detect writes beyond count. */
    unsigned char *a = xmalloc((count + 1) * sizeof(uint64_t));
    unsigned char *b = xmalloc((count + 1) * sizeof(uint64_t));
    struct values v;
    size_t o, d;
    int is_signed;

    v.in = xmalloc(count * sizeof(int16_t));
    v.expected = xmalloc(count * sizeof(int16_t));
    for (o = 0; o < NUM_OPS; o++) {
        for (is_signed = 0; is_signed <= 1; is_signed++) {
            long bound = result_bound(ops[o].op, is_signed, g_size);

            compute_values(ops[o].op, is_signed, count, &v);
            for (d = 0; d < NUM_DTYPES; d++) {
                if (dtypes[d].is_signed != is_signed)
                    continue;
                if (bound > dtypes[d].max_exact || bound > INT16_MAX) {
                    g_skipped++;
                    continue;
                }
                test_allreduce_one(&dtypes[d], &ops[o], count, &v, a, b);
            }
        }
    }
    free(v.expected);
    free(v.in);
    free(b);
    free(a);
}

/* ------------------------------------------------------------------ */
/* Broadcast and allgather: exact bytes                                */

/* Byte k of a payload: no arithmetic is done on it, so any bits will do;
 * seed makes payloads of different ranks and calls differ. */
static void fill_pattern(unsigned char *buf, size_t bytes, uint64_t seed) {
    size_t k;

    for (k = 0; k < bytes; k += 8) {
        uint64_t w = mix(seed * 0x100000001b3ULL + k);
        size_t n = bytes - k < 8 ? bytes - k : 8;

        memcpy(buf + k, &w, n);
    }
}

/* Checks buf against fill_pattern(seed); index is in elements. */
static void check_pattern(const char *what, const unsigned char *buf,
                          size_t bytes, uint64_t seed, size_t elem_size,
                          size_t first_index) {
    size_t k, j;

    for (k = 0; k < bytes; k += 8) {
        uint64_t w = mix(seed * 0x100000001b3ULL + k);
        size_t n = bytes - k < 8 ? bytes - k : 8;
        unsigned char want[8];

        memcpy(want, &w, sizeof(want));
        if (memcmp(buf + k, want, n) == 0)
            continue;
        for (j = 0; j < n; j++)
            if (buf[k + j] != want[j])
                fail(what, "index %zu got byte 0x%02x expected 0x%02x",
                     first_index + (k + j) / elem_size, buf[k + j], want[j]);
    }
    g_checks++;
}

static uint64_t bcast_seed(size_t d, int root) {
    return 1000003ULL * (d + 1) + (uint64_t)root + 1;
}

static uint64_t allgather_seed(size_t d, int rank) {
    return 7000003ULL * (d + 1) + (uint64_t)rank + 1;
}

static void test_broadcast(size_t count) {
    unsigned char *buf = xmalloc((count + 1) * sizeof(uint64_t));
    char name[NAME_LEN];
    size_t d;
    int root;

    for (d = 0; d < NUM_DTYPES; d++) {
        const struct dtype_info *dt = &dtypes[d];
        size_t bytes = count * dt->size;

        for (root = 0; root < g_size; root++) {
            uint64_t seed = bcast_seed(d, root);

            snprintf(name, sizeof(name), "bc.%s.%zu.root%d", dt->name, count,
                     root);
            if (g_rank == root)
                fill_pattern(buf, bytes, seed);
            else
                memset(buf, SENTINEL_BYTE, bytes);
            memset(buf + bytes, SENTINEL_BYTE, dt->size);
            expect_ok(name, hvd_broadcast(name, buf, count, dt->dtype, root));
            check_pattern(name, buf, bytes, seed, dt->size, 0);
            check_sentinel_tail(name, buf, bytes, bytes + dt->size);
        }
    }
    free(buf);
}

static void check_allgather_result(const char *what, size_t d,
                                   const unsigned char *recv, size_t count) {
    size_t bytes = count * dtypes[d].size;
    size_t total = bytes * (size_t)g_size;
    int q;

    for (q = 0; q < g_size; q++)
        check_pattern(what, recv + (size_t)q * bytes, bytes,
                      allgather_seed(d, q), dtypes[d].size, (size_t)q * count);
    check_sentinel_tail(what, recv, total, total + dtypes[d].size);
}

static void test_allgather(size_t count) {
    size_t total_max = (count * (size_t)g_size + 1) * sizeof(uint64_t);
    unsigned char *send = xmalloc((count + 1) * sizeof(uint64_t));
    unsigned char *recv = xmalloc(total_max);
    char name[NAME_LEN], what[NAME_LEN + 32];
    size_t d;

    for (d = 0; d < NUM_DTYPES; d++) {
        const struct dtype_info *dt = &dtypes[d];
        size_t bytes = count * dt->size;
        size_t total = bytes * (size_t)g_size;
        uint64_t seed = allgather_seed(d, g_rank);
        unsigned char *mine = recv + (size_t)g_rank * bytes;

        snprintf(name, sizeof(name), "ag.%s.%zu.outofplace", dt->name, count);
        fill_pattern(send, bytes, seed);
        memset(recv, SENTINEL_BYTE, total + dt->size);
        expect_ok(name, hvd_allgather(name, send, recv, count, dt->dtype));
        check_allgather_result(name, d, recv, count);
        snprintf(what, sizeof(what), "%s (sendbuf changed)", name);
        check_pattern(what, send, bytes, seed, dt->size, 0);

        /* In place: this rank's block already sits at its place. */
        snprintf(name, sizeof(name), "ag.%s.%zu.inplace", dt->name, count);
        memset(recv, SENTINEL_BYTE, total + dt->size);
        fill_pattern(mine, bytes, seed);
        expect_ok(name, hvd_allgather(name, mine, recv, count, dt->dtype));
        check_allgather_result(name, d, recv, count);

        /* In place the other way (hvd.h): sendbuf == recvbuf, the input
         * at the start, moved to its block (on rank > 0 it overlaps
         * another rank's block, which the peers must not read). */
        snprintf(name, sizeof(name), "ag.%s.%zu.atstart", dt->name, count);
        memset(recv, SENTINEL_BYTE, total + dt->size);
        fill_pattern(recv, bytes, seed);
        expect_ok(name, hvd_allgather(name, recv, recv, count, dt->dtype));
        check_allgather_result(name, d, recv, count);
    }
    free(recv);
    free(send);
}

/* ------------------------------------------------------------------ */
/* Setup, topology and argument errors                                 */

static void test_before_init(void) {
    float x = 1.0f, y = 0.0f;

    expect_true("before-init.initialized", hvd_initialized() == 0,
                "hvd_initialized() is not 0 before hvd_init()");
    expect_true("before-init.rank", hvd_rank() == -1,
                "hvd_rank() is not -1 before hvd_init()");
    expect_true("before-init.size", hvd_size() == -1,
                "hvd_size() is not -1 before hvd_init()");
    expect_status(
        "before-init.allreduce",
        hvd_allreduce("before-init.allreduce", &x, &y, 1, HVD_FLOAT32, HVD_SUM),
        HVD_ERR_NOT_INITIALIZED);
    expect_status("before-init.broadcast",
                  hvd_broadcast("before-init.broadcast", &x, 1, HVD_FLOAT32, 0),
                  HVD_ERR_NOT_INITIALIZED);
    expect_status(
        "before-init.allgather",
        hvd_allgather("before-init.allgather", &x, &y, 1, HVD_FLOAT32),
        HVD_ERR_NOT_INITIALIZED);
    expect_status("before-init.barrier", hvd_barrier(),
                  HVD_ERR_NOT_INITIALIZED);
}

static void expect_env_int(const char *what, const char *var, int value) {
    const char *s = getenv(var);
    char detail[160];
    char *end;
    long v;

    if (s == NULL || s[0] == '\0')
        return;
    errno = 0;
    v = strtol(s, &end, 10);
    snprintf(detail, sizeof(detail), "%s=%s but the library says %d", var, s,
             value);
    expect_true(what, errno == 0 && *end == '\0' && v == value, detail);
}

static void test_topology(void) {
    int rank = hvd_rank(), size = hvd_size();
    int lrank = hvd_local_rank(), lsize = hvd_local_size();
    int crank = hvd_cross_rank(), csize = hvd_cross_size();
    char detail[200];
    char host[64];
    unsigned char *hosts;
    int q, same_host = 1;

    snprintf(detail, sizeof(detail),
             "rank %d size %d local_rank %d local_size %d cross_rank %d "
             "cross_size %d",
             rank, size, lrank, lsize, crank, csize);
    expect_true("topology.rank", size >= 1 && rank >= 0 && rank < size, detail);
    expect_true("topology.local",
                lsize >= 1 && lsize <= size && lrank >= 0 && lrank < lsize,
                detail);
    expect_true("topology.cross",
                csize >= 1 && csize <= size && crank >= 0 && crank < csize,
                detail);
    expect_env_int("topology.env-rank", "HVD_RANK", rank);
    expect_env_int("topology.env-size", "HVD_SIZE", size);

    /* If every rank is on this host (as under hvdrun), the job is one host
     * with every rank local. */
    memset(host, 0, sizeof(host));
    if (getenv("HVD_HOSTNAME") != NULL) /* the host hvd counts this rank on */
        snprintf(host, sizeof(host), "%s", getenv("HVD_HOSTNAME"));
    else if (gethostname(host, sizeof(host) - 1) != 0)
        snprintf(host, sizeof(host), "(unknown)");
    hosts = xmalloc(sizeof(host) * (size_t)size);
    expect_ok("topology.hostnames",
              hvd_allgather("topology.hostnames", host, hosts, sizeof(host),
                            HVD_UINT8));
    for (q = 0; q < size; q++)
        if (memcmp(hosts + (size_t)q * sizeof(host), host, sizeof(host)) != 0)
            same_host = 0;
    if (same_host) {
        expect_true("topology.one-host",
                    csize == 1 && crank == 0 && lsize == size && lrank == rank,
                    detail);
    }
    free(hosts);
}

static void test_dtype_size(void) {
    size_t d;

    for (d = 0; d < NUM_DTYPES; d++)
        expect_true("dtype_size",
                    hvd_dtype_size(dtypes[d].dtype) == dtypes[d].size,
                    dtypes[d].name);
    expect_true("dtype_size.invalid", hvd_dtype_size((hvd_dtype)99) == 0,
                "hvd_dtype_size((hvd_dtype)99) is not 0");
}

static void test_invalid_args(void) {
    float a[4] = {1, 2, 3, 4};
    float *b = xmalloc(4 * sizeof(float) * (size_t)g_size);

    expect_invalid(
        "err.ar.null-send",
        hvd_allreduce("err.ar.null-send", NULL, b, 4, HVD_FLOAT32, HVD_SUM));
    expect_invalid(
        "err.ar.null-recv",
        hvd_allreduce("err.ar.null-recv", a, NULL, 4, HVD_FLOAT32, HVD_SUM));
    expect_invalid("err.ar.dtype", hvd_allreduce("err.ar.dtype", a, b, 4,
                                                 (hvd_dtype)99, HVD_SUM));
    expect_invalid("err.ar.op", hvd_allreduce("err.ar.op", a, b, 4, HVD_FLOAT32,
                                              (hvd_op)99));
    expect_invalid("err.bc.null",
                   hvd_broadcast("err.bc.null", NULL, 4, HVD_FLOAT32, 0));
    expect_invalid("err.bc.dtype",
                   hvd_broadcast("err.bc.dtype", a, 4, (hvd_dtype)99, 0));
    expect_invalid(
        "err.bc.root-negative",
        hvd_broadcast("err.bc.root-negative", a, 4, HVD_FLOAT32, -1));
    expect_invalid("err.bc.root-size", hvd_broadcast("err.bc.root-size", a, 4,
                                                     HVD_FLOAT32, g_size));
    expect_invalid("err.ag.null-send",
                   hvd_allgather("err.ag.null-send", NULL, b, 4, HVD_FLOAT32));
    expect_invalid("err.ag.null-recv",
                   hvd_allgather("err.ag.null-recv", a, NULL, 4, HVD_FLOAT32));
    expect_invalid("err.ag.dtype",
                   hvd_allgather("err.ag.dtype", a, b, 4, (hvd_dtype)99));

    /* Argument errors are local: the runtime still works after them. */
    a[0] = 3;
    expect_ok("err.after",
              hvd_allreduce("err.after", a, b, 1, HVD_FLOAT32, HVD_MAX));
    expect_true("err.after", b[0] == 3, "allreduce after argument errors");
    free(b);
}

static void test_barriers(void) {
    char what[32];
    int k;

    for (k = 0; k < 5; k++) {
        snprintf(what, sizeof(what), "barrier.%d", k);
        expect_ok(what, hvd_barrier());
    }
}

/* ------------------------------------------------------------------ */

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--max-count N] [--quick] [--restarts N]\n"
            "  --max-count N  skip counts above N elements (default %zu;\n"
            "                 K, M, G suffixes multiply by 1024)\n"
            "  --quick        counts up to %zu only\n"
            "  --restarts N   then hvd_init again after hvd_shutdown N\n"
            "                 times, an allreduce in each\n",
            prog, DEFAULT_MAX_COUNT, QUICK_MAX_COUNT);
}

static int parse_count(const char *s, size_t *count_out) {
    char *end;
    unsigned long long v;

    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    switch (*end) {
    case 'K':
    case 'k':
        v <<= 10;
        end++;
        break;
    case 'M':
    case 'm':
        v <<= 20;
        end++;
        break;
    case 'G':
    case 'g':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0')
        return -1;
    *count_out = (size_t)v;
    return 0;
}

int main(int argc, char **argv) {
    size_t max_count = DEFAULT_MAX_COUNT;
    const char *env_rank = getenv("HVD_RANK");
    int restarts = 0;
    size_t c;
    int i;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (env_rank != NULL)
        g_rank = atoi(env_rank);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--max-count") == 0 && i + 1 < argc) {
            if (parse_count(argv[++i], &max_count) != 0) {
                usage(argv[0]);
                return 2;
            }
        } else if (strcmp(argv[i], "--quick") == 0) {
            if (max_count > QUICK_MAX_COUNT)
                max_count = QUICK_MAX_COUNT;
        } else if (strcmp(argv[i], "--restarts") == 0 && i + 1 < argc) {
            restarts = atoi(argv[++i]);
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    /* --quick wins over a later, larger --max-count too. */
    for (i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0 && max_count > QUICK_MAX_COUNT)
            max_count = QUICK_MAX_COUNT;

    test_before_init();
    expect_ok("init", hvd_init());
    expect_ok("init.again", hvd_init());
    expect_true("initialized", hvd_initialized() == 1,
                "hvd_initialized() is not 1 after hvd_init()");
    g_rank = hvd_rank();
    g_size = hvd_size();

    test_topology();
    test_dtype_size();
    test_barriers();
    for (c = 0; c < NUM_COUNTS; c++) {
        if (counts[c] > max_count)
            continue;
        test_allreduce(counts[c]);
        test_broadcast(counts[c]);
        if (counts[c] <= ALLGATHER_MAX_COUNT)
            test_allgather(counts[c]);
        expect_ok("barrier.count", hvd_barrier());
        if (g_rank == 0)
            printf("count %zu done (%lu checks so far)\n", counts[c], g_checks);
    }
    test_invalid_args();
    test_barriers();

    expect_ok("shutdown", hvd_shutdown());
    expect_true("shutdown.initialized", hvd_initialized() == 0,
                "hvd_initialized() is not 0 after hvd_shutdown()");
    {
        float x = 1.0f, y = 0.0f;
        hvd_status s =
            hvd_allreduce("after-shutdown", &x, &y, 1, HVD_FLOAT32, HVD_SUM);

        expect_true("after-shutdown.allreduce",
                    s == HVD_ERR_NOT_INITIALIZED || s == HVD_ERR_SHUTDOWN,
                    "hvd_allreduce after hvd_shutdown did not fail with "
                    "HVD_ERR_NOT_INITIALIZED or HVD_ERR_SHUTDOWN");
    }

    /* --restarts: hvd_init after hvd_shutdown starts the job again in
     * this process (Horovod's Gloo-flavoured suite and elastic training
     * do), each time with a name of the last start and a new one. */
    for (int gen = 1; gen <= restarts; gen++) {
        char name[32];
        float x = (float)(g_rank + gen), sum = 0.0f;
        float want = (float)(g_size * gen + g_size * (g_size - 1) / 2);

        expect_ok("init.after_shutdown", hvd_init());
        expect_true("init.after_shutdown.rank",
                    hvd_rank() == g_rank && hvd_size() == g_size,
                    "rank or size changed across hvd_init after shutdown");
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof(name), "gen.%d", k == 0 ? 0 : gen);
            expect_ok("gen.allreduce",
                      hvd_allreduce(name, &x, &sum, 1, HVD_FLOAT32, HVD_SUM));
            expect_true("gen.sum", sum == want,
                        "wrong sum after hvd_init after hvd_shutdown");
        }
        expect_ok("gen.barrier", hvd_barrier());
        expect_ok("gen.shutdown", hvd_shutdown());
    }

    if (g_skipped > 0)
        printf("note: %lu allreduce cases skipped: their exact results do "
               "not fit the dtype at size %d\n",
               g_skipped, g_size);
    printf("PASS test_collectives rank %d size %d: %lu checks\n", g_rank,
           g_size, g_checks);
    return 0;
}
