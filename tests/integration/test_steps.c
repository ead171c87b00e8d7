/*
 * Integration test of the engine's steps (docs/design.md, "Steps"): cached
 * operations agreed on by every rank's step message, small allreduces
 * reduced from the data carried in them, larger ones run as collectives
 * after the step, and every way out of that fast path.
 *
 *     hvdrun -np N test_steps SUBTEST
 *
 *   dtypes    every dtype and op, sizes 0 to past HVD_STEP_CARRY_BYTES, in
 *             place and not, each name run several times (so cached);
 *   mismatch  a run of cached names in which one rank changes the count,
 *             dtype or op of the name at each position in turn: every rank
 *             gets HVD_ERR_MISMATCH for that one, exact results for the
 *             rest, and the names are cached again afterwards;
 *   join      the last rank joins amid cached names; the others go on;
 *   threads   two threads per rank interleave blocking calls on cached
 *             names, so ranks offer them in different combinations;
 *   mixed     every rank picks, per call and differently from the others,
 *             a blocking call on a free engine (its thread takes the
 *             engine at once: the express way), an asynchronous call
 *             waited for at once (the submission queue), or a blocking
 *             call while another name's request is in flight (the engine
 *             is not free); every fifth round the last rank changes one
 *             name's count: HVD_ERR_MISMATCH for it on every rank, exact
 *             results for the rest;
 *   inflight  a second submission of a name in flight on the same rank is
 *             refused, also while the first runs the express way.
 *
 * Inputs are small integers from (rank, round, name, element): every result
 * is exact in every dtype, and each rank computes it from the same formula
 * and compares bit patterns. Each rank prints "PASS steps SUBTEST rank R"
 * or "FAIL steps SUBTEST rank R: ...". Exit status: 0 pass, 1 fail, 2 bad
 * usage, 77 skip (too few ranks).
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
#include <sys/syscall.h>
#include <unistd.h>

#define EXIT_SKIP 77
#define SENTINEL 0xA5

static const char *g_subtest = "?";
static int g_rank = -1, g_size = -1;

static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;

    flockfile(stdout);
    printf("FAIL steps %s rank %d: ", g_subtest, g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    funlockfile(stdout);
    fflush(stdout);
    exit(1);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL)
        fail("cannot allocate %zu bytes", bytes);
    return p;
}

/* ------------------------------------------------------------------ */
/* Exact values in every dtype                                         */

static const hvd_dtype all_dtypes[] = HVD_TEST_DTYPES;
static const hvd_op all_ops[] = HVD_TEST_OPS;
#define NDTYPES (sizeof(all_dtypes) / sizeof(*all_dtypes))
#define NOPS (sizeof(all_ops) / sizeof(*all_ops))

/* Element j of name `index` in round `round` on `rank` (testutil.h's
 * exact_input). */
static long input(hvd_dtype dt, hvd_op op, int rank, int round, int index,
                  size_t j) {
    return exact_input(dt, op, g_size,
                       j * 7 + (size_t)index * 5 + (size_t)round * 3 +
                           (size_t)rank);
}

/* The result of element j over the ranks in [0, n). */
static long expected(hvd_dtype dt, hvd_op op, int n, int round, int index,
                     size_t j) {
    long acc = input(dt, op, 0, round, index, j);

    for (int r = 1; r < n; r++) {
        long v = input(dt, op, r, round, index, j);
        acc = combine(op, acc, v);
    }
    return op == HVD_AVERAGE ? acc / n : acc;
}

/* One named allreduce and its buffers. */
struct op {
    char name[64];
    int index;
    hvd_dtype dtype;
    hvd_op op;
    size_t count;
    int in_place;
    void *send, *recv;
};

static void op_init(struct op *o, const char *name, int index, hvd_dtype dt,
                    hvd_op op, size_t count, int in_place) {
    size_t bytes = (count + 1) * hvd_dtype_size(dt); /* room for count + 1 */

    memset(o, 0, sizeof(*o));
    snprintf(o->name, sizeof(o->name), "%s", name);
    o->index = index;
    o->dtype = dt;
    o->op = op;
    o->count = count;
    o->in_place = in_place;
    o->send = xmalloc(bytes);
    o->recv = in_place ? o->send : xmalloc(bytes);
}

static void op_free(struct op *o) {
    if (!o->in_place)
        free(o->recv);
    free(o->send);
}

static void op_fill(struct op *o, int round) {
    for (size_t j = 0; j < o->count; j++)
        put_value(o->dtype, o->send, j,
                  input(o->dtype, o->op, g_rank, round, o->index, j));
    if (!o->in_place)
        memset(o->recv, SENTINEL, o->count * hvd_dtype_size(o->dtype));
}

/* Checks the result of round over the ranks in [0, n). */
static void op_check(const struct op *o, int round, int n) {
    for (size_t j = 0; j < o->count; j++) {
        long want = expected(o->dtype, o->op, n, round, o->index, j);
        if (!holds(o->dtype, o->recv, j, want))
            fail("'%s' (dtype %d, op %d, count %zu, %s, round %d) element "
                 "%zu: expected %ld",
                 o->name, (int)o->dtype, (int)o->op, o->count,
                 o->in_place ? "in place" : "out of place", round, j, want);
    }
}

static void op_run(struct op *o) {
    hvd_status st =
        hvd_allreduce(o->name, o->send, o->recv, o->count, o->dtype, o->op);
    if (st != HVD_OK)
        fail("hvd_allreduce('%s'): %s: %s", o->name, status_name(st),
             hvd_last_error());
}

/* ------------------------------------------------------------------ */
/* dtypes                                                              */

#define DT_ROUNDS 3
/* Elements: empty, one, odd, within the default 64 KiB a step carries for
 * every dtype, and past it for all but uint8/int8 (a collective after the
 * step). */
static const size_t dt_counts[] = {0, 1, 7, 1000, 20000};
#define NCOUNTS (sizeof(dt_counts) / sizeof(*dt_counts))

static void test_dtypes(void) {
    size_t n = NDTYPES * NOPS * NCOUNTS * 2, k = 0;
    struct op *ops = xmalloc(n * sizeof(*ops));
    char name[64];

    for (size_t d = 0; d < NDTYPES; d++)
        for (size_t o = 0; o < NOPS; o++)
            for (size_t c = 0; c < NCOUNTS; c++)
                for (int ip = 0; ip < 2; ip++, k++) {
                    snprintf(name, sizeof(name), "dt.%zu", k);
                    op_init(&ops[k], name, (int)k, all_dtypes[d], all_ops[o],
                            dt_counts[c], ip);
                }
    /* Blocking, one after the other: each a step of its own from round 1
     * on (round 0 negotiates and caches them). */
    for (int round = 0; round < DT_ROUNDS; round++)
        for (k = 0; k < n; k++) {
            op_fill(&ops[k], round);
            op_run(&ops[k]);
            op_check(&ops[k], round, g_size);
        }
    /* All at once: steps with many offers, carried and not, fused. */
    for (int round = DT_ROUNDS; round < DT_ROUNDS + 2; round++) {
        hvd_handle *h = xmalloc(n * sizeof(*h));
        for (k = 0; k < n; k++) {
            op_fill(&ops[k], round);
            hvd_status st = hvd_allreduce_async(ops[k].name, ops[k].send,
                                                ops[k].recv, ops[k].count,
                                                ops[k].dtype, ops[k].op, &h[k]);
            if (st != HVD_OK)
                fail("hvd_allreduce_async('%s'): %s: %s", ops[k].name,
                     status_name(st), hvd_last_error());
        }
        for (k = n; k-- > 0;) {
            hvd_status st = hvd_wait(h[k]);
            if (st != HVD_OK)
                fail("hvd_wait('%s'): %s: %s", ops[k].name, status_name(st),
                     hvd_last_error());
            op_check(&ops[k], round, g_size);
        }
        free(h);
    }
    for (k = 0; k < n; k++)
        op_free(&ops[k]);
    free(ops);
}

/* ------------------------------------------------------------------ */
/* mismatch                                                            */

#define MM_NAMES 6
/* Carried (small) and not (70000 float32: 280 KB) names in one run. */
static const size_t mm_counts[MM_NAMES] = {1, 300, 70000, 16, 5000, 2};

static void mm_run(struct op *ops, int round, int bad) {
    for (int i = 0; i < MM_NAMES; i++) {
        struct op *o = &ops[i];
        int odd = i == bad && g_rank == g_size - 1;
        size_t count = o->count + (odd && bad % 3 == 0);
        hvd_dtype dt = odd && bad % 3 == 1 ? HVD_INT32 : o->dtype;
        hvd_op op = odd && bad % 3 == 2 ? HVD_MAX : o->op;
        hvd_status st;

        op_fill(o, round);
        st = hvd_allreduce(o->name, o->send, o->recv, count, dt, op);
        if (i != bad) {
            if (st != HVD_OK)
                fail("round %d (mismatch at %d): '%s': %s: %s", round, bad,
                     o->name, status_name(st), hvd_last_error());
            op_check(o, round, g_size);
            continue;
        }
        char quoted[70];
        snprintf(quoted, sizeof(quoted), "'%s'", o->name);
        if (st != HVD_ERR_MISMATCH || strstr(hvd_last_error(), quoted) == NULL)
            fail("round %d: '%s' (rank %d changed its %s): %s, expected "
                 "HVD_ERR_MISMATCH naming it: \"%s\"",
                 round, o->name, g_size - 1,
                 bad % 3 == 0   ? "count"
                 : bad % 3 == 1 ? "dtype"
                                : "op",
                 status_name(st), hvd_last_error());
        if (!names_rank(hvd_last_error(), g_size - 1))
            fail("the mismatch report does not name rank %d: \"%s\"",
                 g_size - 1, hvd_last_error());
        if (g_rank == 0 && round == MM_NAMES + 2)
            printf("mismatch report: %s\n", hvd_last_error());
    }
}

/*
 * One name again and again, changed by one rank right after a run of it:
 * that rank's request to erase the slot reaches rank 0 while the others
 * may still be running the slot, and must not be lost there.
 */
static void mm_repeat(void) {
    struct op o;

    op_init(&o, "mm.again", 50, HVD_FLOAT32, HVD_SUM, 5, 0);
    for (int round = 0; round < 100; round++) {
        int odd = round % 4 == 3 && g_rank == g_size - 1;
        op_fill(&o, round);
        hvd_status st =
            hvd_allreduce(o.name, o.send, o.recv, o.count + odd, o.dtype, o.op);
        if (round % 4 != 3) {
            if (st != HVD_OK)
                fail("'mm.again' round %d: %s: %s", round, status_name(st),
                     hvd_last_error());
            op_check(&o, round, g_size);
        } else if (st != HVD_ERR_MISMATCH) {
            fail("'mm.again' round %d (rank %d changed the count): %s, "
                 "expected HVD_ERR_MISMATCH: \"%s\"",
                 round, g_size - 1, status_name(st), hvd_last_error());
        }
    }
    op_free(&o);
}

static void test_mismatch(void) {
    struct op ops[MM_NAMES];
    char name[64];
    int round = 0;

    for (int i = 0; i < MM_NAMES; i++) {
        snprintf(name, sizeof(name), "mm.%d", i);
        op_init(&ops[i], name, i, HVD_FLOAT32, HVD_SUM, mm_counts[i], i == 4);
    }
    /* Cached, then a mismatch at every position, each followed by a run
     * that agrees again (the names negotiated and cached anew). */
    for (; round < 2; round++)
        mm_run(ops, round, -1);
    for (int bad = 0; bad < MM_NAMES; bad++) {
        mm_run(ops, round++, bad);
        mm_run(ops, round++, -1);
        mm_run(ops, round++, -1);
    }
    for (int i = 0; i < MM_NAMES; i++)
        op_free(&ops[i]);
    mm_repeat();
}

/* ------------------------------------------------------------------ */
/* join                                                                */

#define JOIN_SHORT 4
#define JOIN_LONG 9
static const size_t join_counts[] = {1, 1000, 70000};
#define JOIN_NAMES (sizeof(join_counts) / sizeof(*join_counts))

/* Rank size-1 runs JOIN_SHORT rounds of the cached names and joins, the
 * others JOIN_LONG: from round JOIN_SHORT on only they contribute (sum and
 * average of rank + 1: n(n+1)/2, then divided by n). */
static void test_join(void) {
    int rounds = g_rank == g_size - 1 ? JOIN_SHORT : JOIN_LONG, last = -1;
    float *send = xmalloc(70000 * sizeof(float));
    float *recv = xmalloc(70000 * sizeof(float));
    char name[64];

    for (size_t j = 0; j < 70000; j++)
        send[j] = (float)(g_rank + 1);
    for (int round = 0; round < rounds; round++) {
        int n = round < JOIN_SHORT ? g_size : g_size - 1;
        float sum = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < JOIN_NAMES; i++)
            for (int avg = 0; avg < 2; avg++) {
                /* An average divides by the job's size, joined ranks
                 * counting as zeros (Horovod's semantics). */
                float want = avg ? sum / (float)g_size : sum;
                snprintf(name, sizeof(name), "jn.%zu.%d", i, avg);
                memset(recv, SENTINEL, join_counts[i] * sizeof(float));
                hvd_status st =
                    hvd_allreduce(name, send, recv, join_counts[i], HVD_FLOAT32,
                                  avg ? HVD_AVERAGE : HVD_SUM);
                if (st != HVD_OK)
                    fail("round %d '%s': %s: %s", round, name, status_name(st),
                         hvd_last_error());
                for (size_t j = 0; j < join_counts[i]; j++)
                    if (recv[j] != want)
                        fail("round %d '%s' element %zu: %g, expected %g",
                             round, name, j, (double)recv[j], (double)want);
            }
    }
    hvd_status st = hvd_join(&last);
    if (st != HVD_OK)
        fail("hvd_join: %s: %s", status_name(st), hvd_last_error());
    if (last < 0 || last >= g_size - 1)
        fail("hvd_join: last rank %d, expected one of 0..%d", last, g_size - 2);
    /* The cache path works again once nobody is joined. */
    for (int round = 0; round < 3; round++) {
        snprintf(name, sizeof(name), "jn.after");
        float one = 1, total = 0;
        st = hvd_allreduce(name, &one, &total, 1, HVD_FLOAT32, HVD_SUM);
        if (st != HVD_OK || total != (float)g_size)
            fail("'%s' after join: %s, %g (expected %d)", name, status_name(st),
                 (double)total, g_size);
    }
    free(recv);
    free(send);
}

/* ------------------------------------------------------------------ */
/* threads                                                             */

#define TH_THREADS 2
#define TH_NAMES 3
#define TH_ROUNDS 60

static void *th_main(void *arg) {
    int t = (int)(intptr_t)arg;
    struct op ops[TH_NAMES];
    char name[64];

    for (int i = 0; i < TH_NAMES; i++) {
        snprintf(name, sizeof(name), "th.%d.%d", t, i);
        op_init(&ops[i], name, t * TH_NAMES + i,
                i == 1 ? HVD_INT32 : HVD_FLOAT32, i == 2 ? HVD_MAX : HVD_SUM,
                i == 0 ? 1 : (i == 1 ? 777 : 30000), i == 1);
    }
    for (int round = 0; round < TH_ROUNDS; round++)
        for (int i = 0; i < TH_NAMES; i++) {
            /* The same order on every rank within a thread (blocking
             * calls), but the threads interleave differently on each. */
            struct op *o = &ops[(i + round) % TH_NAMES];
            op_fill(o, round);
            op_run(o);
            op_check(o, round, g_size);
        }
    for (int i = 0; i < TH_NAMES; i++)
        op_free(&ops[i]);
    return NULL;
}

static void test_threads(void) {
    pthread_t th[TH_THREADS];

    for (int t = 0; t < TH_THREADS; t++)
        if (pthread_create(&th[t], NULL, th_main, (void *)(intptr_t)t) != 0)
            fail("pthread_create failed");
    for (int t = 0; t < TH_THREADS; t++)
        pthread_join(th[t], NULL);
}

/* ------------------------------------------------------------------ */
/* mixed                                                               */

#define MX_NAMES 4
#define MX_ROUNDS 40
static const size_t mx_counts[MX_NAMES] = {1, 64, 5000, 70000};

static hvd_status mx_wait(hvd_handle h, const char *what) {
    hvd_status st = hvd_wait(h);
    if (st != HVD_OK && st != HVD_ERR_MISMATCH)
        fail("hvd_wait(%s): %s: %s", what, status_name(st), hvd_last_error());
    return st;
}

static void test_mixed(void) {
    struct op ops[MX_NAMES], side;
    char name[64];

    for (int i = 0; i < MX_NAMES; i++) {
        snprintf(name, sizeof(name), "mx.%d", i);
        op_init(&ops[i], name, 60 + i, i == 1 ? HVD_INT32 : HVD_FLOAT32,
                i == 2 ? HVD_MAX : HVD_SUM, mx_counts[i], i == 1);
    }
    op_init(&side, "mx.side", 70, HVD_FLOAT64, HVD_SUM, 3, 0);
    for (int round = 0; round < MX_ROUNDS; round++) {
        int bad = round % 5 == 4 ? (round / 5) % MX_NAMES : -1;
        for (int i = 0; i < MX_NAMES; i++) {
            struct op *o = &ops[i];
            int way = (g_rank + round + i) % 3, k = round * MX_NAMES + i;
            size_t count = o->count + (i == bad && g_rank == g_size - 1);
            hvd_handle h, hs;
            hvd_status st;

            /* Every rank submits the side request in every call, before
             * (way 2) or after its blocking call. */
            op_fill(&side, k);
            if (way == 2 &&
                hvd_allreduce_async(side.name, side.send, side.recv, side.count,
                                    side.dtype, side.op, &hs) != HVD_OK)
                fail("hvd_allreduce_async('mx.side'): %s", hvd_last_error());
            op_fill(o, round);
            if (way == 1) {
                st = hvd_allreduce_async(o->name, o->send, o->recv, count,
                                         o->dtype, o->op, &h);
                if (st == HVD_OK)
                    st = mx_wait(h, o->name);
            } else {
                st = hvd_allreduce(o->name, o->send, o->recv, count, o->dtype,
                                   o->op);
            }
            if (way != 2 &&
                hvd_allreduce_async(side.name, side.send, side.recv, side.count,
                                    side.dtype, side.op, &hs) != HVD_OK)
                fail("hvd_allreduce_async('mx.side'): %s", hvd_last_error());
            if (mx_wait(hs, "mx.side") != HVD_OK)
                fail("'mx.side' round %d: %s", k, hvd_last_error());
            op_check(&side, k, g_size);
            if (i != bad) {
                if (st != HVD_OK)
                    fail("round %d '%s' (way %d): %s: %s", round, o->name, way,
                         status_name(st), hvd_last_error());
                op_check(o, round, g_size);
            } else if (st != HVD_ERR_MISMATCH ||
                       !names_rank(hvd_last_error(), g_size - 1)) {
                fail("round %d '%s' (way %d, rank %d changed its count): %s, "
                     "expected HVD_ERR_MISMATCH naming that rank: \"%s\"",
                     round, o->name, way, g_size - 1, status_name(st),
                     hvd_last_error());
            }
        }
    }
    for (int i = 0; i < MX_NAMES; i++)
        op_free(&ops[i]);
    op_free(&side);
}

/* ------------------------------------------------------------------ */
/* inflight                                                            */

/*
 * The order of the two submissions is set by conditions, not by sleeps:
 * rank 0's second thread submits only once its main thread has raised a
 * flag just before its blocking call and then been seen asleep (its
 * blocking call waiting for the last rank, which has not called yet); the
 * last rank calls only once rank 0's second submission has returned, which
 * rank 0 says by creating a file named after the job (a bounded poll).
 */
typedef struct inflight {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calling; /* the main thread is about to call 'if.dup' */
    pid_t main_tid;
    const char *signal_path; /* created once the second submission returned */
    hvd_status second;
    float y;
} inflight;

/* 1 once the thread tid is asleep (state S or D in its stat file). */
static int thread_asleep(pid_t tid) {
    char path[64], buf[512];
    FILE *f;
    size_t n;
    const char *close_paren;

    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    close_paren = strrchr(buf, ')');
    return close_paren != NULL && close_paren[1] == ' ' &&
           (close_paren[2] == 'S' || close_paren[2] == 'D');
}

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    if (f == NULL)
        fail("cannot create %s", path);
    fclose(f);
}

/* Waits (bounded: 60 s) for path to exist. */
static void await_file(const char *path) {
    struct timespec ts = {0, 2 * 1000 * 1000};
    for (int i = 0; i < 30000; i++) {
        if (access(path, F_OK) == 0)
            return;
        nanosleep(&ts, NULL);
    }
    fail("%s never appeared", path);
}

static void *inflight_second(void *arg) {
    inflight *in = arg;
    hvd_handle h;
    float x = 1;
    struct timespec ts = {0, 1000 * 1000};

    pthread_mutex_lock(&in->mu);
    while (!in->calling)
        pthread_cond_wait(&in->cv, &in->mu);
    pthread_mutex_unlock(&in->mu);
    /* Bounded (5 s): past it the submission goes ahead, and the round
     * still checks that one of the two is refused. */
    for (int i = 0; i < 5000 && !thread_asleep(in->main_tid); i++)
        nanosleep(&ts, NULL);
    in->second =
        hvd_allreduce_async("if.dup", &x, &in->y, 1, HVD_FLOAT32, HVD_SUM, &h);
    touch(in->signal_path);
    if (in->second == HVD_OK)
        hvd_wait(h);
    return NULL;
}

/* A name in flight is refused to a second submission on the same rank,
 * also while its first is a blocking call running the engine in its own
 * thread (the express way, which keeps its name out of the engine's map):
 * rank 0 blocks in 'if.dup' (the last rank calls it only once rank 0's
 * second submission has returned) while another thread submits 'if.dup'
 * once the blocking call is asleep. Should the second thread still come
 * first (it waits for the main thread to sleep, which should be in the
 * blocking call), the blocking call is the one refused: either way exactly
 * one of the two is, and the other gets the exact sum; at least one round
 * must have seen the blocking call first. */
static void test_inflight(void) {
    float want = (float)(g_size * (g_size + 1) / 2);
    const char *job = getenv("HVD_JOB_ID"), *tmp = getenv("TMPDIR");
    char path[512];
    int express_first = 0;

    if (job == NULL)
        fail("HVD_JOB_ID is not set: run under hvdrun");
    for (int round = 0; round < 3; round++) {
        inflight in = {.mu = PTHREAD_MUTEX_INITIALIZER,
                       .cv = PTHREAD_COND_INITIALIZER};
        pthread_t th;
        float x = (float)(g_rank + 1), y = 0;
        snprintf(path, sizeof(path), "%s/hvd-steps-inflight-%s-%d",
                 tmp != NULL ? tmp : "/tmp", job, round);
        in.signal_path = path;
        in.main_tid = (pid_t)syscall(SYS_gettid);
        if (g_rank == 0 && pthread_create(&th, NULL, inflight_second, &in) != 0)
            fail("pthread_create failed");
        if (g_rank == g_size - 1)
            await_file(path);
        if (g_rank == 0) {
            pthread_mutex_lock(&in.mu);
            in.calling = 1;
            pthread_cond_signal(&in.cv);
            pthread_mutex_unlock(&in.mu);
        }
        hvd_status st =
            hvd_allreduce("if.dup", &x, &y, 1, HVD_FLOAT32, HVD_SUM);
        if (g_rank != 0) {
            if (st != HVD_OK || y != want)
                fail("round %d 'if.dup': %s, %g", round, status_name(st),
                     (double)y);
            continue;
        }
        pthread_join(th, NULL);
        unlink(path);
        if (st == HVD_OK && y == want && in.second == HVD_ERR_INVALID_ARG) {
            express_first++;
        } else if (st != HVD_ERR_INVALID_ARG || in.second != HVD_OK ||
                   in.y != want) {
            fail("round %d: the blocking 'if.dup' returned %s (%g) and a "
                 "second 'if.dup' submitted while it was in flight %s (%g): "
                 "expected exactly one refused with HVD_ERR_INVALID_ARG and "
                 "the other the sum %g",
                 round, status_name(st), (double)y, status_name(in.second),
                 (double)in.y, (double)want);
        }
    }
    if (g_rank == 0 && express_first == 0)
        fail("no round submitted the second 'if.dup' while the blocking one "
             "was in flight (the second thread came first every time)");
}

/* ------------------------------------------------------------------ */

static const struct {
    const char *name;
    void (*run)(void);
    int min_size;
} subtests[] = {
    {"dtypes", test_dtypes, 1}, {"mismatch", test_mismatch, 2},
    {"join", test_join, 2},     {"threads", test_threads, 1},
    {"mixed", test_mixed, 2},   {"inflight", test_inflight, 2},
};
#define NSUBTESTS (sizeof(subtests) / sizeof(*subtests))

int main(int argc, char **argv) {
    size_t k;
    hvd_status st;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (k = 0; argc == 2 && k < NSUBTESTS; k++)
        if (strcmp(argv[1], subtests[k].name) == 0)
            break;
    if (argc != 2 || k == NSUBTESTS) {
        fprintf(stderr, "usage: %s dtypes|mismatch|join|threads\n", argv[0]);
        return 2;
    }
    g_subtest = subtests[k].name;
    st = hvd_init();
    if (st != HVD_OK)
        fail("hvd_init: %s: %s", status_name(st), hvd_last_error());
    g_rank = hvd_rank();
    g_size = hvd_size();
    if (g_size < subtests[k].min_size) {
        printf("SKIP steps %s rank %d: needs %d ranks\n", g_subtest, g_rank,
               subtests[k].min_size);
        hvd_shutdown();
        return EXIT_SKIP;
    }
    subtests[k].run();
    st = hvd_shutdown();
    if (st != HVD_OK)
        fail("hvd_shutdown: %s: %s", status_name(st), hvd_last_error());
    printf("PASS steps %s rank %d\n", g_subtest, g_rank);
    return 0;
}
