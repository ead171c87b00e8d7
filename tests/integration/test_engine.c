/*
 * Integration test of the background engine: named operations submitted
 * in any order and from any thread, fusion, the response cache, mismatch
 * reports, join, the stall inspector, the timeline and a rank that shuts
 * down while the others still submit (left).
 *
 *     hvdrun -np N test_engine SUBTEST
 *
 * SUBTEST is one of order, threads, fusion, cache, mismatch, join, stall,
 * stall_cached, stall_shutdown, timeline, callback, left. run_engine_logs.sh
 * runs each with the environment it needs and checks the logs it asks for
 * (stall warnings, cache counts, checksums, the timeline file).
 *
 * Every input is a small integer computed from (rank, step, operation,
 * element), so every result is exact in every dtype used (float16
 * included); each rank computes the expected result from the same formula
 * and compares bit patterns. Each rank prints "PASS engine SUBTEST rank R"
 * or "FAIL engine SUBTEST rank R: ...". Exit status: 0 pass, 1 fail,
 * 2 bad usage, 77 skip (too few ranks).
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_SKIP 77
#define NAME_LEN 64
#define SENTINEL_BYTE 0xA5
/* Longest we poll or wait for one operation before calling it hung. */
#define POLL_LIMIT_S 60.0

static const char *g_subtest = "?";
static int g_rank = -1;
static int g_size = -1;

/* ------------------------------------------------------------------ */
/* Reporting                                                           */

/* Prints "FAIL engine <subtest> rank <r>: <detail>" and exits 1; hvdrun
 * then tears the job down. May be called from any thread. */
static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;

    flockfile(stdout);
    printf("FAIL engine %s rank %d: ", g_subtest, g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    funlockfile(stdout);
    fflush(stdout);
    exit(1);
}

static void expect_status(const char *what, hvd_status got, hvd_status want) {
    if (got != want)
        fail("%s: status %s expected %s; last error: \"%s\"", what,
             status_name(got), status_name(want), hvd_last_error());
}

static void expect_ok(const char *what, hvd_status got) {
    expect_status(what, got, HVD_OK);
}

/* As expect_ok, for call(name). */
static void expect_call_ok(const char *call, const char *name, hvd_status got) {
    if (got != HVD_OK)
        fail("%s('%s'): status %s expected HVD_OK; last error: \"%s\"", call,
             name, status_name(got), hvd_last_error());
}

static void *xmalloc(size_t bytes) {
    /* Never malloc(0): count 0 still passes real pointers. */
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL)
        fail("cannot allocate %zu bytes", bytes);
    return p;
}

static void sleep_s(double seconds) {
    struct timespec ts;

    if (seconds <= 0)
        return;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* ------------------------------------------------------------------ */
/* Names (the exact encodings are testutil.h's)                         */

static const char *dtype_name(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_INT32:
        return "int32";
    case HVD_INT64:
        return "int64";
    case HVD_FLOAT16:
        return "float16";
    case HVD_FLOAT32:
        return "float32";
    case HVD_FLOAT64:
        return "float64";
    default:
        return "(other)";
    }
}

static const char *op_name(hvd_op op) {
    switch (op) {
    case HVD_SUM:
        return "sum";
    case HVD_AVERAGE:
        return "average";
    case HVD_MAX:
        return "max";
    default:
        return "(other)";
    }
}

static void put_bits(void *buf, size_t elem_size, size_t i, uint64_t bits) {
    switch (elem_size) {
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
    case 2:
        return ((const uint16_t *)buf)[i];
    case 4:
        return ((const uint32_t *)buf)[i];
    default:
        return ((const uint64_t *)buf)[i];
    }
}

/* ------------------------------------------------------------------ */
/* Inputs and expected results                                         */

/*
 * Element j of operation `index` at `step` on `rank`: an integer in
 * [-4, 4], times the job size for an average (so that the average is an
 * exact integer). The largest partial result is 4 * size^2 (64 at size 4),
 * exact in every dtype used.
 */
static long input(hvd_op op, int rank, int step, int index, size_t j) {
    long v = (long)((j * 7 + (size_t)index * 5 + (size_t)step * 3 +
                     (size_t)rank * 11) %
                    9) -
             4;

    return op == HVD_AVERAGE ? v * g_size : v;
}

/* The result every rank must get for element j (all ranks contribute). */
static long expected(hvd_op op, int step, int index, size_t j) {
    long acc = input(op, 0, step, index, j);
    int r;

    for (r = 1; r < g_size; r++) {
        long v = input(op, r, step, index, j);

        if (op == HVD_MAX)
            acc = v > acc ? v : acc;
        else
            acc += v;
    }
    if (op == HVD_AVERAGE)
        acc /= g_size; /* exact: every input is a multiple of size */
    return acc;
}

/* One allreduce: what it is, its buffers and, while in flight, its
 * handle. */
struct arop {
    char name[NAME_LEN];
    int index; /* selects the inputs */
    hvd_dtype dtype;
    hvd_op op;
    size_t count;
    int in_place;
    void *send;
    void *recv;
    hvd_handle handle;
};

/* Sets up op with buffers of count elements; capacity is the largest count
 * it will be given (set_count). */
static void arop_init(struct arop *a, const char *name, int index,
                      hvd_dtype dtype, hvd_op op, size_t count, size_t capacity,
                      int in_place) {
    size_t bytes = capacity * hvd_dtype_size(dtype);

    memset(a, 0, sizeof(*a));
    snprintf(a->name, sizeof(a->name), "%s", name);
    a->index = index;
    a->dtype = dtype;
    a->op = op;
    a->count = count;
    a->in_place = in_place;
    a->send = xmalloc(bytes);
    a->recv = in_place ? a->send : xmalloc(bytes);
}

static void arop_free(struct arop *a) {
    if (!a->in_place)
        free(a->recv);
    free(a->send);
    a->send = a->recv = NULL;
}

/* Fills the input for step; an out-of-place output gets sentinel bytes, so
 * that an output never written is caught. */
static void arop_fill(struct arop *a, int step) {
    size_t es = hvd_dtype_size(a->dtype);
    size_t j;

    for (j = 0; j < a->count; j++)
        put_bits(a->send, es, j,
                 encode(a->dtype, input(a->op, g_rank, step, a->index, j)));
    if (!a->in_place)
        memset(a->recv, SENTINEL_BYTE, a->count * es);
}

/* Checks the result of step bit for bit. */
static void arop_check(const struct arop *a, int step) {
    size_t es = hvd_dtype_size(a->dtype);
    size_t j;

    for (j = 0; j < a->count; j++) {
        long want = expected(a->op, step, a->index, j);
        uint64_t got = get_bits(a->recv, es, j);

        if (got != encode(a->dtype, want))
            fail("'%s' (%s %s count %zu, step %d) element %zu: bits 0x%" PRIx64
                 ", expected %ld (bits 0x%" PRIx64 ")",
                 a->name, dtype_name(a->dtype), op_name(a->op), a->count, step,
                 j, got, want, encode(a->dtype, want));
    }
}

static void arop_submit(struct arop *a) {
    expect_call_ok("hvd_allreduce_async", a->name,
                   hvd_allreduce_async(a->name, a->send, a->recv, a->count,
                                       a->dtype, a->op, &a->handle));
}

static void arop_wait(struct arop *a) {
    expect_call_ok("hvd_wait", a->name, hvd_wait(a->handle));
    a->handle = NULL;
}

static void arop_blocking(struct arop *a) {
    expect_call_ok(
        "hvd_allreduce", a->name,
        hvd_allreduce(a->name, a->send, a->recv, a->count, a->dtype, a->op));
}

/* Submits, polls with hvd_test until done (bounded), then releases the
 * handle with hvd_wait. */
static void arop_polled(struct arop *a) {
    double deadline = now_s() + POLL_LIMIT_S;
    int done = 0;

    arop_submit(a);
    for (;;) {
        expect_call_ok("hvd_test", a->name, hvd_test(a->handle, &done));
        if (done)
            break;
        if (now_s() > deadline)
            fail("'%s' not done after %.0f s of hvd_test polling", a->name,
                 POLL_LIMIT_S);
        sleep_s(0.0002);
    }
    arop_wait(a);
}

/* Submits ops in the order order[0..n) (indices into ops). */
static void submit_in_order(struct arop *ops, const size_t *order, size_t n) {
    size_t k;

    for (k = 0; k < n; k++)
        arop_submit(&ops[order[k]]);
}

static void wait_in_order(struct arop *ops, const size_t *order, size_t n) {
    size_t k;

    for (k = 0; k < n; k++)
        arop_wait(&ops[order[k]]);
}

/* Fills order[0..n) with a permutation chosen by seed: 0 forward, 1
 * reverse, larger seeds a stride permutation rotated by seed. A stride is
 * a permutation only if it is coprime with n, which is checked. */
static void make_order(int seed, size_t *order, size_t n) {
    static const size_t strides[] = {5, 7, 11, 13, 17, 19, 23, 29};
    size_t stride =
        strides[(size_t)seed % (sizeof(strides) / sizeof(*strides))];
    unsigned char *seen = xmalloc(n);
    size_t k;

    for (k = 0; k < n; k++) {
        if (seed == 0)
            order[k] = k;
        else if (seed == 1)
            order[k] = n - 1 - k;
        else
            order[k] = (k * stride + (size_t)seed) % n;
    }
    memset(seen, 0, n);
    for (k = 0; k < n; k++) {
        if (seen[order[k]])
            fail("make_order(seed %d, n %zu) is not a permutation", seed, n);
        seen[order[k]] = 1;
    }
    free(seen);
}

/* ------------------------------------------------------------------ */
/* order: any submission order, any wait order                         */

#define ORDER_NAMES 96
#define ORDER_STEPS 5
#define ORDER_MAX_COUNT 5000

/* A mix of sizes in [1, 5000]: every fourth one tiny, the others spread
 * by a multiplicative hash; the last one the largest. */
static size_t order_count(int i) {
    if (i == ORDER_NAMES - 1)
        return ORDER_MAX_COUNT;
    if (i % 4 == 0)
        return 1 + (size_t)i / 4;
    return 1 + ((size_t)i * 2654435761u) % ORDER_MAX_COUNT;
}

/*
 * A name in flight on this rank cannot be submitted again. The first
 * submission must still be pending when the second is tried, so it must
 * wait for a rank that has not submitted it yet: rank 0 tries "dup.a",
 * which the others submit only after the gate; the others try "dup.b",
 * which rank 0 submits only after the gate. The gate (a blocking
 * allreduce) completes only once every rank has made its try.
 */
static void test_duplicate(void) {
    struct arop a, b, gate;
    hvd_handle extra = NULL;
    struct arop *mine;
    char text[1024];
    hvd_status st;

    arop_init(&a, "dup.a", 1000, HVD_FLOAT32, HVD_SUM, 33, 33, 0);
    arop_init(&b, "dup.b", 1001, HVD_FLOAT32, HVD_SUM, 17, 17, 0);
    arop_init(&gate, "dup.gate", 1002, HVD_FLOAT32, HVD_SUM, 1, 1, 0);
    arop_fill(&a, 0);
    arop_fill(&b, 0);
    arop_fill(&gate, 0);

    mine = g_rank == 0 ? &a : &b;
    arop_submit(mine);
    st = hvd_allreduce_async(mine->name, mine->send, mine->recv, mine->count,
                             mine->dtype, mine->op, &extra);
    snprintf(text, sizeof(text), "%s", hvd_last_error());
    if (st != HVD_ERR_INVALID_ARG)
        fail("a second '%s' while the first is in flight returned %s, "
             "expected HVD_ERR_INVALID_ARG: \"%s\"",
             mine->name, status_name(st), text);
    if (text[0] == '\0')
        fail("hvd_last_error() is empty after the duplicate '%s'", mine->name);

    arop_blocking(&gate);
    arop_check(&gate, 0);
    arop_submit(g_rank == 0 ? &b : &a);
    arop_wait(&a);
    arop_wait(&b);
    arop_check(&a, 0);
    arop_check(&b, 0);
    arop_free(&gate);
    arop_free(&b);
    arop_free(&a);
}

static void test_order(void) {
    struct arop ops[ORDER_NAMES];
    size_t submit_order[ORDER_NAMES], wait_order[ORDER_NAMES];
    char name[NAME_LEN];
    int i, step;

    for (i = 0; i < ORDER_NAMES; i++) {
        snprintf(name, sizeof(name), "t.%d", i);
        /* Every third one in place. */
        arop_init(&ops[i], name, i, HVD_FLOAT32, HVD_SUM, order_count(i),
                  order_count(i), i % 3 == 0);
    }
    for (step = 0; step < ORDER_STEPS; step++) {
        /* Orders differ between ranks in each step and change from step
         * to step; the wait order differs from the submission order. */
        make_order(g_rank + step, submit_order, ORDER_NAMES);
        make_order(g_rank + step + 1, wait_order, ORDER_NAMES);
        for (i = 0; i < ORDER_NAMES; i++)
            arop_fill(&ops[i], step);
        submit_in_order(ops, submit_order, ORDER_NAMES);
        wait_in_order(ops, wait_order, ORDER_NAMES);
        for (i = 0; i < ORDER_NAMES; i++)
            arop_check(&ops[i], step);
    }
    for (i = 0; i < ORDER_NAMES; i++)
        arop_free(&ops[i]);
    test_duplicate();
}

/* ------------------------------------------------------------------ */
/* threads: several submitting threads per rank                        */

#define THREADS 4
#define THREAD_OPS 32
#define THREAD_MAX_COUNT 700

struct thread_arg {
    int k;
    pthread_t thread;
};

/*
 * Thread k runs th<k>.0 .. th<k>.31 one after the other: dtype by i % 3,
 * op by (i / 3) % 2 and blocking or async + hvd_test polling by (i / 6) %
 * 2, so that every combination occurs.
 */
static void *thread_main(void *p) {
    static const hvd_dtype dts[] = {HVD_FLOAT32, HVD_INT32, HVD_FLOAT64};
    static const hvd_op thread_ops[] = {HVD_SUM, HVD_MAX};
    const struct thread_arg *arg = p;
    char name[NAME_LEN];
    struct arop a;
    int i;

    for (i = 0; i < THREAD_OPS; i++) {
        int index = arg->k * THREAD_OPS + i;
        size_t count = 1 + ((size_t)index * 37) % THREAD_MAX_COUNT;

        snprintf(name, sizeof(name), "th%d.%d", arg->k, i);
        arop_init(&a, name, index, dts[i % 3], thread_ops[(i / 3) % 2], count,
                  count, i % 5 == 0);
        arop_fill(&a, 0);
        if ((i / 6) % 2 == 0)
            arop_blocking(&a);
        else
            arop_polled(&a);
        arop_check(&a, 0);
        arop_free(&a);
    }
    return NULL;
}

static void test_threads(void) {
    struct thread_arg args[THREADS];
    int k, err;

    for (k = 0; k < THREADS; k++) {
        args[k].k = k;
        err = pthread_create(&args[k].thread, NULL, thread_main, &args[k]);
        if (err != 0)
            fail("pthread_create: %s", strerror(err));
    }
    for (k = 0; k < THREADS; k++) {
        err = pthread_join(args[k].thread, NULL);
        if (err != 0)
            fail("pthread_join: %s", strerror(err));
    }
}

/* ------------------------------------------------------------------ */
/* fusion: the same results with and without the fusion buffer         */

#define FUSION_NAMES 40

/* FNV-1a, 64 bits. */
static uint64_t checksum(const void *buf, size_t bytes) {
    const unsigned char *p = buf;
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t k;

    for (k = 0; k < bytes; k++) {
        h ^= p[k];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The wrapper runs this with HVD_FUSION_THRESHOLD=0 and with the default,
 * and compares rank 0's CHECKSUM lines. */
static void test_fusion(void) {
    static const hvd_dtype dts[] = {HVD_FLOAT32, HVD_INT64, HVD_FLOAT16};
    static const hvd_op fusion_ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MAX};
    struct arop ops[FUSION_NAMES];
    char name[NAME_LEN];
    int i;

    for (i = 0; i < FUSION_NAMES; i++) {
        /* One empty tensor among them: count 0 is allowed. */
        size_t count = i == 7 ? 0 : 1 + ((size_t)i * 53) % 300;

        snprintf(name, sizeof(name), "fu.%d", i);
        arop_init(&ops[i], name, i, dts[i % 3], fusion_ops[(i / 3) % 3], count,
                  count, i % 4 == 0);
        arop_fill(&ops[i], 0);
    }
    for (i = 0; i < FUSION_NAMES; i++)
        arop_submit(&ops[i]);
    for (i = 0; i < FUSION_NAMES; i++)
        arop_wait(&ops[i]);
    for (i = 0; i < FUSION_NAMES; i++) {
        arop_check(&ops[i], 0);
        if (g_rank == 0)
            printf("CHECKSUM %s %016" PRIx64 "\n", ops[i].name,
                   checksum(ops[i].recv,
                            ops[i].count * hvd_dtype_size(ops[i].dtype)));
        arop_free(&ops[i]);
    }
}

/* ------------------------------------------------------------------ */
/* cache: the same names again, one with new parameters, evictions     */

#define CACHE_NAMES 10
#define CACHE_STEPS 20
#define CACHE_CHANGE_STEP 10
#define CACHE_CHANGED_NAME 3
#define CACHE_EVICT_NAMES 24
#define CACHE_EVICT_ROUNDS 3

static size_t cache_count(int i) { return 1 + (size_t)i * 41; }

/* One step of the CACHE_NAMES names: all submitted, then all waited. */
static void cache_step(struct arop *ops, int step) {
    int i;

    for (i = 0; i < CACHE_NAMES; i++)
        arop_fill(&ops[i], step);
    for (i = 0; i < CACHE_NAMES; i++)
        arop_submit(&ops[i]);
    for (i = CACHE_NAMES - 1; i >= 0; i--)
        arop_wait(&ops[i]);
    for (i = 0; i < CACHE_NAMES; i++)
        arop_check(&ops[i], step);
}

static void test_cache(void) {
    struct arop ops[CACHE_NAMES], ev[CACHE_EVICT_NAMES];
    char name[NAME_LEN];
    int i, step, round;

    for (i = 0; i < CACHE_NAMES; i++) {
        snprintf(name, sizeof(name), "ca.%d", i);
        /* Room for the changed count of step CACHE_CHANGE_STEP. */
        arop_init(&ops[i], name, i, i % 2 == 0 ? HVD_FLOAT32 : HVD_INT32,
                  (i / 2) % 2 == 0 ? HVD_SUM : HVD_MAX, cache_count(i),
                  cache_count(i) + 17, 0);
    }
    for (step = 0; step < CACHE_STEPS; step++) {
        /* Every rank changes the count of one name in one step and back in
         * the next: a cached entry must not be reused with the old
         * parameters. */
        ops[CACHE_CHANGED_NAME].count = cache_count(CACHE_CHANGED_NAME) +
                                        (step == CACHE_CHANGE_STEP ? 17 : 0);
        cache_step(ops, step);
    }

    /* More names than a small HVD_CACHE_CAPACITY holds, in rounds. */
    for (i = 0; i < CACHE_EVICT_NAMES; i++) {
        snprintf(name, sizeof(name), "ev.%d", i);
        arop_init(&ev[i], name, 100 + i, HVD_FLOAT32, HVD_SUM,
                  1 + (size_t)i * 13, 1 + (size_t)i * 13, 0);
    }
    for (round = 0; round < CACHE_EVICT_ROUNDS; round++) {
        for (i = 0; i < CACHE_EVICT_NAMES; i++) {
            arop_fill(&ev[i], round);
            arop_submit(&ev[i]);
        }
        for (i = 0; i < CACHE_EVICT_NAMES; i++) {
            arop_wait(&ev[i]);
            arop_check(&ev[i], round);
        }
    }
    /* The first names again, after they may have been evicted. */
    cache_step(ops, CACHE_STEPS);
    for (i = 0; i < CACHE_EVICT_NAMES; i++)
        arop_free(&ev[i]);
    for (i = 0; i < CACHE_NAMES; i++)
        arop_free(&ops[i]);
}

/* ------------------------------------------------------------------ */
/* mismatch: ranks that disagree get HVD_ERR_MISMATCH, then carry on   */

#define MISMATCH_COUNT 10

/* st and the error text (copied by the caller right after the call) must
 * be a mismatch report naming 'name', rank 0 and rank 1. */
static void expect_mismatch(const char *name, hvd_status st, const char *text) {
    char quoted[NAME_LEN + 2];

    snprintf(quoted, sizeof(quoted), "'%s'", name);
    if (st != HVD_ERR_MISMATCH)
        fail("'%s': status %s, expected HVD_ERR_MISMATCH: \"%s\"", name,
             status_name(st), text);
    if (strstr(text, quoted) == NULL || !names_rank(text, 0) ||
        !names_rank(text, 1))
        fail("'%s': the mismatch report does not name %s, rank 0 and "
             "rank 1: \"%s\"",
             name, quoted, text);
    if (g_rank == 0)
        printf("mismatch report: %s\n", text);
}

/* After each mismatch an agreed allreduce succeeds with exact values. */
static void agreed_after(int k) {
    char name[NAME_LEN];
    struct arop a;

    snprintf(name, sizeof(name), "ok.%d", k);
    arop_init(&a, name, 200 + k, HVD_FLOAT32, HVD_SUM, 257, 257, 0);
    arop_fill(&a, 0);
    arop_blocking(&a);
    arop_check(&a, 0);
    arop_free(&a);
}

static void test_mismatch(void) {
    /* Room for rank 1's extra element; int32 and float32 have one size. */
    float buf[MISMATCH_COUNT + 1];
    char text[2048];
    hvd_status st;
    int one = g_rank == 1;

    memset(buf, 0, sizeof(buf));

    st = hvd_allreduce("mm.count", buf, buf, MISMATCH_COUNT + (size_t)one,
                       HVD_FLOAT32, HVD_SUM);
    snprintf(text, sizeof(text), "%s", hvd_last_error());
    expect_mismatch("mm.count", st, text);
    agreed_after(0);

    st = hvd_allreduce("mm.dtype", buf, buf, MISMATCH_COUNT,
                       one ? HVD_INT32 : HVD_FLOAT32, HVD_SUM);
    snprintf(text, sizeof(text), "%s", hvd_last_error());
    expect_mismatch("mm.dtype", st, text);
    agreed_after(1);

    st = hvd_allreduce("mm.op", buf, buf, MISMATCH_COUNT, HVD_FLOAT32,
                       one ? HVD_MAX : HVD_SUM);
    snprintf(text, sizeof(text), "%s", hvd_last_error());
    expect_mismatch("mm.op", st, text);
    agreed_after(2);

    st = hvd_broadcast("mm.root", buf, MISMATCH_COUNT, HVD_FLOAT32, one);
    snprintf(text, sizeof(text), "%s", hvd_last_error());
    expect_mismatch("mm.root", st, text);
    agreed_after(3);
}

/* ------------------------------------------------------------------ */
/* join: one rank runs out of data early                               */

#define JOIN_COUNT 1000
#define JOIN_LONG_STEPS 6
#define JOIN_SHORT_STEPS 3

/* Checks that every element of buf is want, exactly. */
static void expect_all(const char *name, int step, const float *buf,
                       float want) {
    size_t j;

    for (j = 0; j < JOIN_COUNT; j++)
        if (buf[j] != want)
            fail("'%s' step %d element %zu: %.9g, expected %.9g", name, step, j,
                 (double)buf[j], (double)want);
}

/*
 * While rank size-1 is joined, the collectives that need every rank fail
 * on the others with a sentence naming it and hvd_join, as Horovod's do
 * (its suite expects the error for a broadcast from a rank that is not
 * joined too); a barrier completes without it.
 */
static void join_refusals(void) {
    int32_t v[8] = {0}, out[8 * 64];
    size_t got[64];
    const char *what[4] = {"broadcast", "allgather", "alltoall",
                           "reducescatter"};

    if (g_size > 8)
        return;

    for (int k = 0; k < 4; k++) {
        char name[NAME_LEN];
        hvd_status st;
        snprintf(name, sizeof(name), "join.%s", what[k]);
        switch (k) {
        case 0:
            st = hvd_broadcast(name, v, 1, HVD_INT32, 0);
            break;
        case 1:
            st = hvd_allgather(name, v, out, 1, HVD_INT32);
            break;
        case 2:
            st = hvd_alltoall(name, v, (size_t)g_size, NULL, out,
                              (size_t)g_size, got, HVD_INT32);
            break;
        default:
            st = hvd_reducescatter(name, v, out, (size_t)g_size, HVD_INT32,
                                   HVD_SUM);
        }
        char rank_text[32];
        snprintf(rank_text, sizeof(rank_text), "rank(s) %d", g_size - 1);
        if (st != HVD_ERR_INVALID_ARG ||
            strstr(hvd_last_error(), "hvd_join") == NULL ||
            strstr(hvd_last_error(), rank_text) == NULL)
            fail("%s while rank %d is joined: %s (%s), expected "
                 "HVD_ERR_INVALID_ARG naming it and hvd_join",
                 what[k], g_size - 1, status_name(st), hvd_last_error());
    }
    expect_ok("barrier while joined", hvd_barrier());
}

/*
 * Rank size-1 runs JOIN_SHORT_STEPS steps, the others JOIN_LONG_STEPS, each
 * an allreduce sum and average of rank + 1. From step JOIN_SHORT_STEPS on,
 * rank size-1 has joined: only ranks 0..size-2 contribute, so the sum is
 * n(n+1)/2 for n = size - 1, and the average that sum divided by the job's
 * size (Horovod's semantics: the joined rank counts as a zero). The
 * average is computed here as the library must: the float sum divided by
 * the float size (exact operands, so one correctly rounded result).
 */
static void test_join(void) {
    int steps = g_rank == g_size - 1 ? JOIN_SHORT_STEPS : JOIN_LONG_STEPS;
    float *send = xmalloc(JOIN_COUNT * sizeof(float));
    float *recv = xmalloc(JOIN_COUNT * sizeof(float));
    char name[NAME_LEN];
    int step, last = -1, lo, hi;
    size_t j;

    for (step = 0; step < steps; step++) {
        int n = step < JOIN_SHORT_STEPS ? g_size : g_size - 1;
        float sum = (float)(n * (n + 1) / 2);

        for (j = 0; j < JOIN_COUNT; j++)
            send[j] = (float)(g_rank + 1);

        snprintf(name, sizeof(name), "join.sum.%d", step);
        memset(recv, SENTINEL_BYTE, JOIN_COUNT * sizeof(float));
        expect_ok(name, hvd_allreduce(name, send, recv, JOIN_COUNT, HVD_FLOAT32,
                                      HVD_SUM));
        expect_all(name, step, recv, sum);

        snprintf(name, sizeof(name), "join.avg.%d", step);
        memset(recv, SENTINEL_BYTE, JOIN_COUNT * sizeof(float));
        expect_ok(name, hvd_allreduce(name, send, recv, JOIN_COUNT, HVD_FLOAT32,
                                      HVD_AVERAGE));
        expect_all(name, step, recv, sum / (float)g_size);
    }

    if (g_rank != g_size - 1)
        join_refusals();
    expect_ok("hvd_join", hvd_join(&last));
    /* Ranks 0..size-2 join after rank size-1 has: one of them is last. */
    if (last < 0 || last >= g_size - 1)
        fail("hvd_join: last rank %d, expected one of 0..%d (rank %d ran "
             "fewer steps and joined first)",
             last, g_size - 2, g_size - 1);

    /* Every rank must have been told the same last rank. */
    expect_ok("join.last.min", hvd_allreduce("join.last.min", &last, &lo, 1,
                                             HVD_INT32, HVD_MIN));
    expect_ok("join.last.max", hvd_allreduce("join.last.max", &last, &hi, 1,
                                             HVD_INT32, HVD_MAX));
    if (lo != last || hi != last)
        fail("hvd_join: last rank %d here, but ranks were told %d to %d", last,
             lo, hi);
    if (g_rank == 0)
        printf("hvd_join: last rank %d\n", last);
    free(recv);
    free(send);
}

/* ------------------------------------------------------------------ */
/* stall and stall_shutdown: a rank that is late or never comes        */

#define STALL_SHUTDOWN_DEFAULT_S 2
#define STALL_FAIL_LIMIT_S 10.0
/* The longest a rank waits for a line in the job's log. */
#define LOG_WAIT_S 60.0

/*
 * Waits (bounded: LOG_WAIT_S) until the job's output, which
 * run_engine_logs.sh captures in the file HVD_TEST_LOG (hvdrun writes each
 * rank's lines there as they come), holds at least count lines containing
 * text. This orders a late rank after what the others log, not after a
 * sleep.
 */
static void await_log(const char *text, int count) {
    const char *path = getenv("HVD_TEST_LOG");
    double deadline = now_s() + LOG_WAIT_S;
    struct timespec tick = {0, 20 * 1000 * 1000};
    char line[2048];

    if (path == NULL || path[0] == '\0')
        fail("HVD_TEST_LOG is not set: run %s through run_engine_logs.sh",
             g_subtest);
    for (;;) {
        FILE *f = fopen(path, "r");
        int seen = 0;
        while (f != NULL && fgets(line, sizeof(line), f) != NULL)
            seen += strstr(line, text) != NULL;
        if (f != NULL)
            fclose(f);
        if (seen >= count)
            return;
        if (now_s() > deadline)
            fail("%d line(s) with \"%s\" expected in %s after %.0f s, found "
                 "%d",
                 count, text, path, LOG_WAIT_S, seen);
        nanosleep(&tick, NULL);
    }
}

/* With HVD_STALL_CHECK_SECONDS=1 rank 0 warns while 'late' waits for
 * rank 1 (the wrapper checks the log); the operation still succeeds. Rank
 * 1 submits it only once rank 0's warning is in the log. */
static void test_stall(void) {
    struct arop a;
    double t0;

    arop_init(&a, "late", 300, HVD_FLOAT32, HVD_SUM, 64, 64, 0);
    arop_fill(&a, 0);
    expect_ok("hvd_barrier", hvd_barrier());
    t0 = now_s();
    if (g_rank == 1)
        await_log("stall: 'late' waits", 1);
    arop_blocking(&a);
    arop_check(&a, 0);
    if (g_rank == 0)
        printf("'late' took %.2f s\n", now_s() - t0);
    arop_free(&a);
}

/* The same for a cached name: its steps, not the coordinator, see that
 * rank 1 has not offered it (rank 0's vote table warns). */
static void test_stall_cached(void) {
    struct arop a;
    int round;

    arop_init(&a, "late.cached", 301, HVD_FLOAT32, HVD_SUM, 16, 16, 0);
    for (round = 0; round < 3; round++) {
        arop_fill(&a, round);
        arop_blocking(&a);
        arop_check(&a, round);
    }
    expect_ok("hvd_barrier", hvd_barrier());
    if (g_rank == 1)
        await_log("stall: 'late.cached' waits", 1);
    arop_fill(&a, round);
    arop_blocking(&a);
    arop_check(&a, round);
    arop_free(&a);
}

/*
 * With HVD_STALL_SHUTDOWN_SECONDS=S, 'never' (which rank 1 never submits)
 * fails with HVD_ERR_TIMEOUT on every other rank after about S s. Rank 1
 * stays idle after the barrier until every other rank has logged that
 * 'never' failed, and only then submits 'after', which the others submit
 * as soon as 'never' has failed: 'after' is not itself stalled on either
 * side.
 */
static void test_stall_shutdown(void) {
    const char *env = getenv("HVD_STALL_SHUTDOWN_SECONDS");
    int shutdown_s = STALL_SHUTDOWN_DEFAULT_S;
    struct arop never, after;
    char text[1024];
    double t_submit, elapsed;
    hvd_status st;

    if (env != NULL && parse_int(env, &shutdown_s) != 0)
        fail("HVD_STALL_SHUTDOWN_SECONDS=%s is not a whole number", env);
    if (shutdown_s <= 0 || shutdown_s >= STALL_FAIL_LIMIT_S)
        fail("needs 0 < HVD_STALL_SHUTDOWN_SECONDS < %.0f (got %d)",
             STALL_FAIL_LIMIT_S, shutdown_s);

    arop_init(&never, "never", 400, HVD_FLOAT32, HVD_SUM, 8, 8, 0);
    arop_init(&after, "after", 401, HVD_FLOAT32, HVD_SUM, 128, 128, 0);
    arop_fill(&never, 0);
    arop_fill(&after, 0);
    expect_ok("hvd_barrier", hvd_barrier());
    if (g_rank == 1) {
        await_log("'never' failed after", g_size - 1);
    } else {
        t_submit = now_s();
        arop_submit(&never);
        st = hvd_wait(never.handle);
        elapsed = now_s() - t_submit;
        snprintf(text, sizeof(text), "%s", hvd_last_error());
        if (st != HVD_ERR_TIMEOUT)
            fail("'never' returned %s after %.2f s, expected HVD_ERR_TIMEOUT: "
                 "\"%s\"",
                 status_name(st), elapsed, text);
        if (elapsed < 0.5 * shutdown_s || elapsed > STALL_FAIL_LIMIT_S)
            fail("'never' failed after %.2f s, expected %.1f to %.0f s "
                 "(HVD_STALL_SHUTDOWN_SECONDS=%d): \"%s\"",
                 elapsed, 0.5 * shutdown_s, STALL_FAIL_LIMIT_S, shutdown_s,
                 text);
        printf("'never' failed after %.2f s: %s\n", elapsed, text);
    }
    arop_blocking(&after);
    arop_check(&after, 0);
    arop_free(&after);
    arop_free(&never);
}

/* ------------------------------------------------------------------ */
/* left: a rank calls hvd_shutdown while the others still submit      */

/* st and text must be HVD_ERR_SHUTDOWN naming the rank that left. */
static void expect_left(const char *what, hvd_status st, const char *text) {
    char who[64];

    snprintf(who, sizeof(who), "rank(s) %d called hvd_shutdown", g_size - 1);
    if (st != HVD_ERR_SHUTDOWN || strstr(text, who) == NULL)
        fail("%s: %s \"%s\", expected HVD_ERR_SHUTDOWN saying \"%s\"", what,
             status_name(st), text, who);
    printf("%s: %s\n", what, text);
}

/*
 * Rank size-1 calls hvd_shutdown right after a barrier; the others then
 * submit what it never will: a new name, a name the cache knows (3 rounds
 * on every rank first) and hvd_join. Each fails at once with
 * HVD_ERR_SHUTDOWN naming it, instead of waiting for it (a join would
 * wait forever, the others until HVD_TIMEOUT_SECONDS); then every rank's
 * hvd_shutdown succeeds.
 */
static void test_left(void) {
    struct arop fresh, cached;
    int round, last = -7;
    hvd_status st;

    arop_init(&cached, "left.cached", 410, HVD_FLOAT32, HVD_SUM, 16, 16, 0);
    arop_init(&fresh, "left.new", 411, HVD_INT32, HVD_MAX, 5, 5, 0);
    for (round = 0; round < 3; round++) {
        arop_fill(&cached, round);
        arop_blocking(&cached);
        arop_check(&cached, round);
    }
    expect_ok("hvd_barrier", hvd_barrier());
    if (g_rank < g_size - 1) {
        arop_fill(&fresh, 0);
        st = hvd_allreduce(fresh.name, fresh.send, fresh.recv, fresh.count,
                           fresh.dtype, fresh.op);
        expect_left("'left.new'", st, hvd_last_error());
        arop_fill(&cached, round);
        st = hvd_allreduce(cached.name, cached.send, cached.recv, cached.count,
                           cached.dtype, cached.op);
        expect_left("'left.cached'", st, hvd_last_error());
        st = hvd_join(&last);
        expect_left("hvd_join", st, hvd_last_error());
    }
    arop_free(&fresh);
    arop_free(&cached);
}

/* ------------------------------------------------------------------ */
/* timeline: enough kinds of events for check_timeline.py              */

#define TIMELINE_NAMES 20
#define TIMELINE_STEPS 3
#define TIMELINE_BCAST_COUNT 100
#define TIMELINE_GATHER_COUNT 10
#define TIMELINE_GROUP 3

static void timeline_broadcast(void) {
    int root = g_size - 1;
    int32_t buf[TIMELINE_BCAST_COUNT];
    hvd_handle h;
    size_t j;

    for (j = 0; j < TIMELINE_BCAST_COUNT; j++)
        buf[j] = g_rank == root ? (int32_t)input(HVD_SUM, root, 0, 500, j)
                                : (int32_t)0x5a5a5a5a;
    expect_ok("hvd_broadcast_async('tl.bcast')",
              hvd_broadcast_async("tl.bcast", buf, TIMELINE_BCAST_COUNT,
                                  HVD_INT32, root, &h));
    expect_ok("hvd_wait('tl.bcast')", hvd_wait(h));
    for (j = 0; j < TIMELINE_BCAST_COUNT; j++)
        if (buf[j] != (int32_t)input(HVD_SUM, root, 0, 500, j))
            fail("'tl.bcast' element %zu: %" PRId32 ", expected %ld", j, buf[j],
                 input(HVD_SUM, root, 0, 500, j));
}

static void timeline_allgather(void) {
    float send[TIMELINE_GATHER_COUNT];
    float *recv =
        xmalloc((size_t)g_size * TIMELINE_GATHER_COUNT * sizeof(float));
    hvd_handle h;
    size_t j;
    int r;

    for (j = 0; j < TIMELINE_GATHER_COUNT; j++)
        send[j] = (float)input(HVD_SUM, g_rank, 0, 501, j);
    expect_ok("hvd_allgather_async('tl.gather')",
              hvd_allgather_async("tl.gather", send, recv,
                                  TIMELINE_GATHER_COUNT, HVD_FLOAT32, &h));
    expect_ok("hvd_wait('tl.gather')", hvd_wait(h));
    for (r = 0; r < g_size; r++)
        for (j = 0; j < TIMELINE_GATHER_COUNT; j++) {
            float want = (float)input(HVD_SUM, r, 0, 501, j);
            float got = recv[(size_t)r * TIMELINE_GATHER_COUNT + j];

            if (got != want)
                fail("'tl.gather' block %d element %zu: %g, expected %g", r, j,
                     (double)got, (double)want);
        }
    free(recv);
}

/* A grouped allreduce always goes through the fusion buffer, so the
 * timeline has fusion events however the 20 single ones were batched. */
static void timeline_grouped(void) {
    struct arop parts[TIMELINE_GROUP];
    const void *sends[TIMELINE_GROUP];
    void *recvs[TIMELINE_GROUP];
    size_t counts[TIMELINE_GROUP];
    int k;

    for (k = 0; k < TIMELINE_GROUP; k++) {
        /* The names only label failures; the group has one name. */
        char name[NAME_LEN];

        snprintf(name, sizeof(name), "tl.group[%d]", k);
        arop_init(&parts[k], name, 600 + k, HVD_FLOAT32, HVD_SUM,
                  5 + (size_t)k * 7, 5 + (size_t)k * 7, 0);
        arop_fill(&parts[k], 0);
        sends[k] = parts[k].send;
        recvs[k] = parts[k].recv;
        counts[k] = parts[k].count;
    }
    expect_ok("hvd_grouped_allreduce('tl.group')",
              hvd_grouped_allreduce("tl.group", TIMELINE_GROUP, sends, recvs,
                                    counts, HVD_FLOAT32, HVD_SUM));
    for (k = 0; k < TIMELINE_GROUP; k++) {
        arop_check(&parts[k], 0);
        arop_free(&parts[k]);
    }
}

static void test_timeline(void) {
    struct arop ops[TIMELINE_NAMES];
    char name[NAME_LEN];
    int i, step;

    for (i = 0; i < TIMELINE_NAMES; i++) {
        snprintf(name, sizeof(name), "tl.%d", i);
        arop_init(&ops[i], name, i, HVD_FLOAT32, HVD_SUM, 1 + (size_t)i * 3,
                  1 + (size_t)i * 3, 0);
    }
    for (step = 0; step < TIMELINE_STEPS; step++) {
        for (i = 0; i < TIMELINE_NAMES; i++) {
            arop_fill(&ops[i], step);
            arop_submit(&ops[i]);
        }
        for (i = 0; i < TIMELINE_NAMES; i++) {
            arop_wait(&ops[i]);
            arop_check(&ops[i], step);
        }
    }
    for (i = 0; i < TIMELINE_NAMES; i++)
        arop_free(&ops[i]);
    timeline_broadcast();
    timeline_allgather();
    timeline_grouped();
}

/* ------------------------------------------------------------------ */
/* callback: operations completed through hvd_on_done                  */

#define CB_OPS 24

static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cb_cond = PTHREAD_COND_INITIALIZER;

struct cb_slot {
    int calls; /* how often the function ran: must end at exactly 1 */
    hvd_status status;
    char error[1024];
    pthread_t thread;
};

static void cb_done(hvd_status status, const char *error, void *arg) {
    struct cb_slot *slot = arg;

    pthread_mutex_lock(&cb_lock);
    slot->calls++;
    slot->status = status;
    slot->thread = pthread_self();
    snprintf(slot->error, sizeof(slot->error), "%s",
             error != NULL ? error : "(null)");
    pthread_cond_broadcast(&cb_cond);
    pthread_mutex_unlock(&cb_lock);
}

/* Waits (bounded) until every one of n slots has been called back. */
static void cb_wait_all(struct cb_slot *slots, int n) {
    struct timespec until;
    int left;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)POLL_LIMIT_S;
    pthread_mutex_lock(&cb_lock);
    for (;;) {
        left = 0;
        for (int i = 0; i < n; i++)
            left += slots[i].calls == 0;
        if (left == 0 ||
            pthread_cond_timedwait(&cb_cond, &cb_lock, &until) != 0)
            break;
    }
    pthread_mutex_unlock(&cb_lock);
    if (left != 0)
        fail("%d of %d completion functions not called after %.0f s", left, n,
             POLL_LIMIT_S);
}

/*
 * CB_OPS allreduces of every size class submitted in a rank-dependent
 * order, each handed to hvd_on_done at once: every function runs exactly
 * once, with HVD_OK and a NULL sentence, and the results are exact; then
 * one whose operation had already finished (hvd_test said so), whose
 * function runs before hvd_on_done returns, on the calling thread; with
 * two ranks or more a mismatch, whose function gets HVD_ERR_MISMATCH and
 * the sentence. Bad arguments are refused.
 */
static void test_callback(void) {
    static struct cb_slot slots[CB_OPS + 2];
    struct arop ops[CB_OPS], late;
    size_t order[CB_OPS];
    char name[NAME_LEN];
    int i, done = 0;
    double deadline;

    expect_status("hvd_on_done(NULL)", hvd_on_done(NULL, cb_done, NULL),
                  HVD_ERR_INVALID_ARG);
    for (i = 0; i < CB_OPS; i++) {
        snprintf(name, sizeof(name), "cb.%d", i);
        arop_init(&ops[i], name, i, i % 2 ? HVD_FLOAT64 : HVD_INT32, HVD_SUM,
                  order_count(i), order_count(i), i % 3 == 0);
        arop_fill(&ops[i], 0);
    }
    make_order(g_rank, order, CB_OPS);
    for (i = 0; i < CB_OPS; i++) {
        struct arop *a = &ops[order[i]];
        arop_submit(a);
        expect_call_ok("hvd_on_done", a->name,
                       hvd_on_done(a->handle, cb_done, &slots[order[i]]));
        a->handle = NULL;
    }
    cb_wait_all(slots, CB_OPS);
    for (i = 0; i < CB_OPS; i++) {
        if (slots[i].calls != 1 || slots[i].status != HVD_OK ||
            strcmp(slots[i].error, "(null)") != 0)
            fail("'%s': called %d times, status %s, sentence \"%s\"",
                 ops[i].name, slots[i].calls, status_name(slots[i].status),
                 slots[i].error);
        arop_check(&ops[i], 0);
        arop_free(&ops[i]);
    }

    arop_init(&late, "cb.late", 99, HVD_FLOAT32, HVD_SUM, 1000, 1000, 0);
    arop_fill(&late, 0);
    arop_submit(&late);
    deadline = now_s() + POLL_LIMIT_S;
    while (!done) {
        expect_call_ok("hvd_test", late.name, hvd_test(late.handle, &done));
        if (!done && now_s() > deadline)
            fail("'cb.late' not done after %.0f s", POLL_LIMIT_S);
        if (!done)
            sleep_s(0.0002);
    }
    expect_call_ok("hvd_on_done", late.name,
                   hvd_on_done(late.handle, cb_done, &slots[CB_OPS]));
    if (slots[CB_OPS].calls != 1 ||
        !pthread_equal(slots[CB_OPS].thread, pthread_self()))
        fail("'cb.late': finished before hvd_on_done, but its function was "
             "not called once on the calling thread before it returned");
    arop_check(&late, 0);
    arop_free(&late);

    if (g_size >= 2) {
        float buf[MISMATCH_COUNT + 1];
        hvd_handle h;

        memset(buf, 0, sizeof(buf));
        expect_call_ok(
            "hvd_allreduce_async", "cb.mm",
            hvd_allreduce_async("cb.mm", buf, buf,
                                MISMATCH_COUNT + (size_t)(g_rank == 1),
                                HVD_FLOAT32, HVD_SUM, &h));
        expect_call_ok("hvd_on_done", "cb.mm",
                       hvd_on_done(h, cb_done, &slots[CB_OPS + 1]));
        cb_wait_all(&slots[CB_OPS + 1], 1);
        expect_mismatch("cb.mm", slots[CB_OPS + 1].status,
                        slots[CB_OPS + 1].error);
        agreed_after(9);
    }
}

/* ------------------------------------------------------------------ */

struct subtest {
    const char *name;
    void (*run)(void);
    int min_size;
};

static const struct subtest subtests[] = {
    {"order", test_order, 1},
    {"threads", test_threads, 1},
    {"fusion", test_fusion, 1},
    {"cache", test_cache, 1},
    {"mismatch", test_mismatch, 2},
    {"join", test_join, 2},
    {"stall", test_stall, 2},
    {"stall_shutdown", test_stall_shutdown, 2},
    {"stall_cached", test_stall_cached, 2},
    {"left", test_left, 2},
    {"timeline", test_timeline, 1},
    {"callback", test_callback, 1},
};
#define NUM_SUBTESTS (sizeof(subtests) / sizeof(subtests[0]))

static void usage(const char *prog) {
    size_t k;

    fprintf(stderr, "usage: %s SUBTEST\n  SUBTEST:", prog);
    for (k = 0; k < NUM_SUBTESTS; k++)
        fprintf(stderr, " %s", subtests[k].name);
    fprintf(stderr, "\n");
}

int main(int argc, char **argv) {
    const struct subtest *t = NULL;
    const char *env_rank = getenv("HVD_RANK");
    hvd_status st;
    size_t k;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (env_rank != NULL)
        g_rank = atoi(env_rank);
    for (k = 0; argc == 2 && k < NUM_SUBTESTS; k++)
        if (strcmp(argv[1], subtests[k].name) == 0)
            t = &subtests[k];
    if (t == NULL) {
        usage(argv[0]);
        return 2;
    }
    g_subtest = t->name;

    st = hvd_init();
    if (st != HVD_OK)
        fail("hvd_init: %s: %s", status_name(st), hvd_last_error());
    g_rank = hvd_rank();
    g_size = hvd_size();
    if (g_size < t->min_size) {
        printf("SKIP engine %s rank %d: needs at least %d ranks, have %d\n",
               t->name, g_rank, t->min_size, g_size);
        hvd_shutdown();
        return EXIT_SKIP;
    }

    t->run();

    expect_ok("hvd_shutdown", hvd_shutdown());
    printf("PASS engine %s rank %d\n", t->name, g_rank);
    return 0;
}
