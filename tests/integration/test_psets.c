/*
 * Integration test of process sets (hvd.h, hvd_process_set_*, hvd_ps_*).
 *
 *     hvdrun -np N test_psets SUBTEST      (or under mpirun)
 *
 *   shapes      every shape of set the job allows: evens, odds, each rank
 *               alone, overlapping windows {r, r+1}, all but the last
 *               (created with their ranks in any order); size, rank and
 *               ranks of each checked on every rank; then in each set its
 *               members run: allreduce of every dtype and op (0, 1, 7 and
 *               1001 elements, in place and not, twice: the second from
 *               the cache), async allreduces in flight together (fused),
 *               a grouped allreduce, a broadcast from every member, an
 *               allgather, an alltoall with uneven splits and zero parts,
 *               a reduce-scatter of rows, a barrier, unnamed operations,
 *               Adasum where the set's size is a power of two; removed
 *               at the end (and their ids not reused)
 *   concurrent  two disjoint sets (evens, odds) each run a stream of
 *               blocking and async allreduces at the same time as the
 *               other, with the job's own operations between
 *   errors      a non-member, an unknown set, a root outside the set, a
 *               set of the same ranks twice, of the job's ranks, ranks
 *               disagreeing on a set's ranks (every rank: MISMATCH),
 *               members disagreeing on an operation, an operation of a
 *               removed set, removing set 0, an operation left waiting
 *               when its set is removed (negotiated and cached), a set's
 *               operation while a member is joined
 *
 * Inputs are small integers: every result is exact and compared bit for
 * bit. Each rank prints "PASS psets SUBTEST rank R" or "FAIL psets SUBTEST
 * rank R: ...". Exit status: 0 pass, 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 64

static const char *g_subtest = "?";
static int g_rank = -1, g_size = -1;

static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;

    printf("FAIL psets %s rank %d: ", g_subtest, g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

static void expect_ok(hvd_status st, const char *what) {
    if (st != HVD_OK)
        fail("%s: %s: %s", what, status_name(st), hvd_last_error());
}

/* st is want, and the sentence contains every one of the words. */
static void expect_error(hvd_status st, hvd_status want, const char *what,
                         const char *word1, const char *word2) {
    if (st != want)
        fail("%s: %s (%s), expected %s", what, status_name(st),
             st == HVD_OK ? "" : hvd_last_error(), status_name(want));
    if ((word1 != NULL && strstr(hvd_last_error(), word1) == NULL) ||
        (word2 != NULL && strstr(hvd_last_error(), word2) == NULL))
        fail("%s: the sentence \"%s\" does not say '%s' and '%s'", what,
             hvd_last_error(), word1 ? word1 : "", word2 ? word2 : "");
}

typedef struct set {
    int id;
    int n;
    int ranks[MAXR]; /* ascending */
    int me;          /* this rank's place, -1 */
} set;

static int cmp_int(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

/* Creates a set of ranks (given in the order of v) on every rank and
 * checks what every rank then knows of it. */
static set make_set(const int *v, int n) {
    set s = {.n = n, .me = -1};
    int given[MAXR], got[MAXR];

    memcpy(given, v, (size_t)n * sizeof(int));
    expect_ok(hvd_process_set_create(given, n, &s.id),
              "hvd_process_set_create");
    memcpy(s.ranks, v, (size_t)n * sizeof(int));
    qsort(s.ranks, (size_t)n, sizeof(int), cmp_int);
    for (int i = 0; i < n; i++)
        if (s.ranks[i] == g_rank)
            s.me = i;
    if (s.id <= 0)
        fail("a new process set got id %d", s.id);
    if (hvd_process_set_size(s.id) != n || hvd_process_set_rank(s.id) != s.me ||
        hvd_process_set_ranks(s.id, got, MAXR) != n ||
        memcmp(got, s.ranks, (size_t)n * sizeof(int)) != 0)
        fail("set %d of %d ranks: size %d, rank %d (expected %d)", s.id, n,
             hvd_process_set_size(s.id), hvd_process_set_rank(s.id), s.me);
    return s;
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* Rank r's input of element i of tensor t, exact for dtype and op in a set
 * of n ranks. */
static long input(hvd_dtype dt, hvd_op op, int n, int r, size_t i, int t) {
    return exact_input(
        dt, op, n, (size_t)mix(((uint64_t)r << 40) ^ ((uint64_t)t << 24) ^ i));
}

static long reduced(const set *s, hvd_dtype dt, hvd_op op, size_t i, int t) {
    long v = input(dt, op, s->n, s->ranks[0], i, t);
    for (int k = 1; k < s->n; k++)
        v = combine(op, v, input(dt, op, s->n, s->ranks[k], i, t));
    return op == HVD_AVERAGE ? v / s->n : v;
}

static void run_allreduces(const set *s) {
    const hvd_dtype dts[] = HVD_TEST_DTYPES;
    const hvd_op ops[] = HVD_TEST_OPS;
    const size_t counts[] = {0, 1, 7, 1001};
    char name[96];

    for (int pass = 0; pass < 2; pass++)
        for (size_t d = 0; d < sizeof(dts) / sizeof(*dts); d++)
            for (size_t o = 0; o < sizeof(ops) / sizeof(*ops); o++)
                for (size_t c = 0; c < 4; c++) {
                    hvd_dtype dt = dts[d];
                    hvd_op op = ops[o];
                    size_t n = counts[c], es = hvd_dtype_size(dt);
                    int in_place = (int)((d + o + c) % 2);
                    uint8_t *a = malloc(n * es + 1), *b = malloc(n * es + 1);
                    int t = (int)(d * 100 + o * 10 + c);
                    for (size_t i = 0; i < n; i++)
                        put_value(dt, a, i, input(dt, op, s->n, g_rank, i, t));
                    snprintf(name, sizeof(name), "ar.%zu.%zu.%zu", d, o, c);
                    expect_ok(hvd_ps_allreduce(s->id, name, a, in_place ? a : b,
                                               n, dt, op),
                              name);
                    for (size_t i = 0; i < n; i++)
                        if (!holds(dt, in_place ? a : b, i,
                                   reduced(s, dt, op, i, t)))
                            fail("set %d '%s' element %zu: expected %ld", s->id,
                                 name, i, reduced(s, dt, op, i, t));
                    free(a);
                    free(b);
                }
}

static void run_async_and_grouped(const set *s) {
    enum { K = 6, N = 9 };
    int32_t in[K][N], out[K][N];
    hvd_handle h[K];
    char name[64];

    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++)
            in[k][i] = (int32_t)input(HVD_INT32, HVD_SUM, s->n, g_rank,
                                      (size_t)i, 500 + k);
        snprintf(name, sizeof(name), "async.%d", k);
        expect_ok(hvd_ps_allreduce_async(s->id, name, in[k], out[k], N,
                                         HVD_INT32, HVD_SUM, &h[k]),
                  name);
    }
    for (int k = 0; k < K; k++) {
        expect_ok(hvd_wait(h[k]), "hvd_wait");
        for (int i = 0; i < N; i++)
            if (out[k][i] != reduced(s, HVD_INT32, HVD_SUM, (size_t)i, 500 + k))
                fail("set %d async.%d element %d", s->id, k, i);
    }
    const void *send[3] = {in[0], in[1], in[2]};
    void *recv[3] = {out[0], out[1], out[2]};
    size_t counts[3] = {N, 0, 4};
    expect_ok(hvd_ps_grouped_allreduce(s->id, "grouped", 3, send, recv, counts,
                                       HVD_INT32, HVD_MAX),
              "grouped");
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < counts[k]; i++) {
            long want = 0;
            for (int m = 0; m < s->n; m++) {
                long v =
                    input(HVD_INT32, HVD_SUM, s->n, s->ranks[m], i, 500 + k);
                want = m == 0 || v > want ? v : want;
            }
            if (out[k][i] != want)
                fail("set %d grouped tensor %d element %zu", s->id, k, i);
        }
}

static void run_broadcast_gather(const set *s) {
    double buf[33];
    int32_t mine[5], all[5 * MAXR];
    char name[64];

    for (int m = 0; m < s->n; m++) {
        int root = s->ranks[m];
        for (int i = 0; i < 33; i++)
            buf[i] = g_rank == root ? root * 100 + i : -1;
        snprintf(name, sizeof(name), "bcast.%d", root);
        expect_ok(hvd_ps_broadcast(s->id, name, buf, 33, HVD_FLOAT64, root),
                  name);
        for (int i = 0; i < 33; i++)
            if (buf[i] != root * 100 + i)
                fail("set %d broadcast from %d element %d: %g", s->id, root, i,
                     buf[i]);
        expect_ok(
            hvd_ps_broadcast(s->id, "bcast.empty", NULL, 0, HVD_INT8, root),
            "empty broadcast");
    }
    for (int i = 0; i < 5; i++)
        mine[i] = g_rank * 10 + i;
    expect_ok(hvd_ps_allgather(s->id, "gather", mine, all, 5, HVD_INT32),
              "allgather");
    for (int m = 0; m < s->n; m++)
        for (int i = 0; i < 5; i++)
            if (all[m * 5 + i] != s->ranks[m] * 10 + i)
                fail("set %d allgather: block %d element %d", s->id, m, i);
}

static void run_alltoall_scatter(const set *s) {
    size_t sc[MAXR], rc[MAXR], total = 0, want_total = 0;
    int64_t send[3 * MAXR], recv[3 * MAXR];

    /* To member j: (me + j) % 3 elements (zero parts included). */
    for (int j = 0; j < s->n; j++) {
        sc[j] = (size_t)((s->me + j) % 3);
        for (size_t k = 0; k < sc[j]; k++)
            send[total + k] = (int64_t)g_rank * 10000 + j * 100 + (int64_t)k;
        total += sc[j];
        want_total += (size_t)((j + s->me) % 3);
    }
    expect_ok(hvd_ps_alltoall(s->id, "a2a", send, total, sc, recv, 3 * MAXR, rc,
                              HVD_INT64),
              "alltoall");
    for (int j = 0, off = 0; j < s->n; j++) {
        if (rc[j] != (size_t)((j + s->me) % 3))
            fail("set %d alltoall: %zu elements from member %d", s->id, rc[j],
                 j);
        for (size_t k = 0; k < rc[j]; k++, off++)
            if (recv[off] !=
                (int64_t)s->ranks[j] * 10000 + s->me * 100 + (int64_t)k)
                fail("set %d alltoall: element %zu from member %d", s->id, k,
                     j);
    }
    (void)want_total;

    /* Reduce-scatter of 2n + 1 rows of 3: the first member gets 3 rows. */
    int64_t shape[2] = {2 * s->n + 1, 3};
    size_t count = (size_t)shape[0] * 3;
    float *in = malloc(count * sizeof(float)), out[9];
    hvd_handle h;
    for (size_t i = 0; i < count; i++)
        in[i] = (float)(g_rank + (int)i);
    expect_ok(hvd_ps_reducescatter_shaped_async(s->id, "rs", in, out, 2, shape,
                                                HVD_FLOAT32, HVD_SUM, &h),
              "reducescatter");
    expect_ok(hvd_wait(h), "reducescatter wait");
    size_t rows = hvd_reducescatter_count((size_t)shape[0], s->n, s->me);
    size_t first = 0;
    for (int m = 0; m < s->me; m++)
        first += hvd_reducescatter_count((size_t)shape[0], s->n, m);
    for (size_t i = 0; i < rows * 3; i++) {
        float want = 0;
        for (int m = 0; m < s->n; m++)
            want += (float)(s->ranks[m] + (int)(first * 3 + i));
        if (out[i] != want)
            fail("set %d reducescatter element %zu: %g, expected %g", s->id, i,
                 out[i], want);
    }
    free(in);
}

static void run_misc(const set *s) {
    float v[4], r[4];

    expect_ok(hvd_ps_barrier(s->id), "barrier");
    for (int k = 0; k < 2; k++) {
        int32_t x = g_rank + k, y = -1;
        expect_ok(hvd_ps_allreduce(s->id, NULL, &x, &y, 1, HVD_INT32, HVD_SUM),
                  "unnamed allreduce");
        int32_t want = 0;
        for (int m = 0; m < s->n; m++)
            want += s->ranks[m] + k;
        if (y != want)
            fail("set %d unnamed allreduce %d: %d, expected %d", s->id, k, y,
                 want);
    }
    if ((s->n & (s->n - 1)) == 0) {
        for (int i = 0; i < 4; i++)
            v[i] = (float)(i + 1);
        expect_ok(
            hvd_ps_allreduce(s->id, "adasum", v, r, 4, HVD_FLOAT32, HVD_ADASUM),
            "adasum");
        for (int i = 0; i < 4; i++)
            if (r[i] != v[i])
                fail("set %d adasum of equal inputs: %g, expected %g", s->id,
                     r[i], v[i]);
    }
}

/* The candidate sets of a job of g_size ranks, without repeats or the
 * job itself; returns how many. */
static int shapes(int v[][MAXR], int *n) {
    int k = 0, size = g_size;

    for (int parity = 0; parity < 2; parity++) {
        n[k] = 0;
        for (int r = size - 1; r >= 0; r--) /* given in descending order */
            if (r % 2 == parity)
                v[k][n[k]++] = r;
        k++;
    }
    for (int r = 0; r < size; r++) {
        n[k] = 1;
        v[k++][0] = r;
    }
    for (int r = 0; r + 1 < size; r++) {
        n[k] = 2;
        v[k][0] = r + 1;
        v[k++][1] = r;
    }
    n[k] = size - 1;
    for (int r = 0; r < size - 1; r++)
        v[k][r] = r;
    k++;
    /* Drop the empty, the job's and repeated ones. */
    int out = 0;
    for (int i = 0; i < k; i++) {
        int keep = n[i] > 0 && n[i] < size;
        int a[MAXR];
        memcpy(a, v[i], (size_t)n[i] * sizeof(int));
        qsort(a, (size_t)n[i], sizeof(int), cmp_int);
        for (int j = 0; keep && j < out; j++) {
            int b[MAXR];
            memcpy(b, v[j], (size_t)n[j] * sizeof(int));
            qsort(b, (size_t)n[j], sizeof(int), cmp_int);
            keep = !(n[j] == n[i] &&
                     memcmp(a, b, (size_t)n[i] * sizeof(int)) == 0);
        }
        if (keep) {
            memmove(v[out], v[i], (size_t)n[i] * sizeof(int));
            n[out++] = n[i];
        }
    }
    return out;
}

static void test_shapes(void) {
    static int v[4 * MAXR][MAXR];
    int n[4 * MAXR], k = shapes(v, n), last = 0;
    set *s = calloc((size_t)k + 1, sizeof(*s));

    for (int i = 0; i < k; i++) {
        s[i] = make_set(v[i], n[i]);
        if (s[i].id <= last)
            fail("set ids not increasing: %d after %d", s[i].id, last);
        last = s[i].id;
    }
    /* Every rank goes through the sets in the same order: a rank in two
     * sets never waits in one for a member that waits in the other. */
    for (int i = 0; i < k; i++) {
        if (s[i].me < 0)
            continue;
        run_allreduces(&s[i]);
        run_async_and_grouped(&s[i]);
        run_broadcast_gather(&s[i]);
        run_alltoall_scatter(&s[i]);
        run_misc(&s[i]);
    }
    int32_t x = 1, y = 0;
    expect_ok(hvd_allreduce("job.after", &x, &y, 1, HVD_INT32, HVD_SUM),
              "the job's allreduce");
    if (y != g_size)
        fail("the job's allreduce after the sets: %d", y);
    for (int i = 0; i < k; i++) {
        expect_ok(hvd_process_set_remove(s[i].id), "hvd_process_set_remove");
        if (hvd_process_set_size(s[i].id) != -1)
            fail("set %d still there after its removal", s[i].id);
    }
    if (k > 0) {
        int r0 = 0;
        set again = make_set(&r0, 1);
        if (again.id <= last)
            fail("a removed id was reused: %d", again.id);
        expect_ok(hvd_process_set_remove(again.id), "remove");
    }
    free(s);
}

static void test_concurrent(void) {
    int ev[MAXR], od[MAXR], ne = 0, no = 0;

    if (g_size < 2)
        return;
    for (int r = 0; r < g_size; r++) {
        if (r % 2 == 0)
            ev[ne++] = r;
        else
            od[no++] = r;
    }
    set e = make_set(ev, ne), o = make_set(od, no);
    const set *mine = g_rank % 2 == 0 ? &e : &o;
    for (int round = 0; round < 5; round++) {
        enum { K = 16, N = 257 };
        static float in[K][N], out[K][N];
        hvd_handle h[K];
        char name[64];
        for (int it = 0; it < 40; it++) {
            int32_t x = g_rank * 1000 + it, y = 0, want = 0;
            snprintf(name, sizeof(name), "stream.%d", it % 4);
            expect_ok(
                hvd_ps_allreduce(mine->id, name, &x, &y, 1, HVD_INT32, HVD_SUM),
                name);
            for (int m = 0; m < mine->n; m++)
                want += mine->ranks[m] * 1000 + it;
            if (y != want)
                fail("round %d stream %d: %d, expected %d", round, it, y, want);
        }
        for (int k = 0; k < K; k++) {
            for (int i = 0; i < N; i++)
                in[k][i] = (float)(g_rank + k + i % 7);
            snprintf(name, sizeof(name), "burst.%d", k);
            expect_ok(hvd_ps_allreduce_async(mine->id, name, in[k], out[k], N,
                                             HVD_FLOAT32, HVD_SUM, &h[k]),
                      name);
        }
        for (int k = 0; k < K; k++) {
            expect_ok(hvd_wait(h[k]), "burst wait");
            for (int i = 0; i < N; i++) {
                float want = 0;
                for (int m = 0; m < mine->n; m++)
                    want += (float)(mine->ranks[m] + k + i % 7);
                if (out[k][i] != want)
                    fail("round %d burst %d element %d: %g, expected %g", round,
                         k, i, out[k][i], want);
            }
        }
        int32_t x = 1, y = 0;
        expect_ok(hvd_allreduce("job.between", &x, &y, 1, HVD_INT32, HVD_SUM),
                  "the job's allreduce");
        if (y != g_size)
            fail("the job's allreduce between: %d", y);
    }
    expect_ok(hvd_process_set_remove(e.id), "remove evens");
    expect_ok(hvd_process_set_remove(o.id), "remove odds");
}

static void test_errors(void) {
    int all[MAXR], zero = 0, id = -1;
    int32_t x = 1, y = 0;
    hvd_handle h;

    for (int r = 0; r < g_size; r++)
        all[r] = r;
    /* The job's own ranks, an empty set, a rank outside the job. */
    expect_error(hvd_process_set_create(all, g_size, &id), HVD_ERR_INVALID_ARG,
                 "a set of the job's ranks", "exists", NULL);
    expect_error(hvd_process_set_create(all, 0, &id), HVD_ERR_INVALID_ARG,
                 "an empty set", NULL, NULL);
    int outside = g_size;
    expect_error(hvd_process_set_create(&outside, 1, &id), HVD_ERR_INVALID_ARG,
                 "a rank outside the job", "not a rank", NULL);
    int twice[2] = {0, 0};
    expect_error(hvd_process_set_create(twice, 2, &id), HVD_ERR_INVALID_ARG,
                 "a rank twice", g_size > 1 ? "twice" : NULL, NULL);
    expect_error(hvd_process_set_remove(0), HVD_ERR_INVALID_ARG,
                 "removing set 0", "cannot be removed", NULL);
    expect_error(hvd_ps_allreduce(99, "nowhere", &x, &y, 1, HVD_INT32, HVD_SUM),
                 HVD_ERR_INVALID_ARG, "an unknown set", "no process set 99",
                 NULL);

    if (g_size < 2)
        return; /* a set of one rank would be the job */
    set s0 = make_set(&zero, 1);
    expect_error(hvd_process_set_create(&zero, 1, &id), HVD_ERR_INVALID_ARG,
                 "the same set twice", "exists already", NULL);
    if (g_rank != 0)
        expect_error(
            hvd_ps_allreduce(s0.id, "not mine", &x, &y, 1, HVD_INT32, HVD_SUM),
            HVD_ERR_INVALID_ARG, "a non-member", "not a member", NULL);
    if (g_size > 1 && g_rank == 0)
        expect_error(
            hvd_ps_broadcast(s0.id, "root outside", &x, 1, HVD_INT32, 1),
            HVD_ERR_INVALID_ARG, "a root outside the set", "not a member",
            NULL);
    expect_ok(hvd_process_set_remove(s0.id), "remove");
    if (g_rank == 0)
        expect_error(
            hvd_ps_allreduce(s0.id, "removed", &x, &y, 1, HVD_INT32, HVD_SUM),
            HVD_ERR_INVALID_ARG, "a removed set", "no process set", NULL);
    expect_error(hvd_process_set_remove(s0.id), HVD_ERR_INVALID_ARG,
                 "removing a removed set", "no process set", NULL);
    /* Ranks disagree on a set's ranks: every rank is told. */
    int mine = g_rank == 0 ? 0 : 1;
    expect_error(hvd_process_set_create(&mine, 1, &id), HVD_ERR_MISMATCH,
                 "ranks disagreeing on a set", "process set", NULL);

    /* The rest needs a set of two that is not the job. */
    if (g_size < 3) {
        expect_ok(hvd_barrier(), "barrier");
        return;
    }
    int pair[2] = {0, 1};
    set p = make_set(pair, 2);
    if (p.me >= 0) {
        /* Members disagree on the dtype. */
        float f = 1;
        hvd_status st = g_rank == 0 ? hvd_ps_allreduce(p.id, "mixed", &x, &y, 1,
                                                       HVD_INT32, HVD_SUM)
                                    : hvd_ps_allreduce(p.id, "mixed", &f, &f, 1,
                                                       HVD_FLOAT32, HVD_SUM);
        expect_error(st, HVD_ERR_MISMATCH, "members disagreeing", "int32",
                     "float32");
        /* Once cached, submitted by one member only, then the set removed:
         * it fails (cache path); then the same, negotiated. */
        expect_ok(hvd_ps_allreduce(p.id, "left", &x, &y, 1, HVD_INT32, HVD_SUM),
                  "left");
        if (g_rank == 0)
            expect_ok(hvd_ps_allreduce_async(p.id, "left", &x, &y, 1, HVD_INT32,
                                             HVD_SUM, &h),
                      "left again");
    }
    expect_ok(hvd_process_set_remove(p.id), "remove the pair");
    if (g_rank == 0)
        expect_error(hvd_wait(h), HVD_ERR_INVALID_ARG,
                     "a cached operation of a removed set", "removed", NULL);
    p = make_set(pair, 2);
    if (g_rank == 0)
        expect_ok(hvd_ps_allreduce_async(p.id, "never", &x, &y, 1, HVD_INT32,
                                         HVD_SUM, &h),
                  "never");
    expect_ok(hvd_barrier(), "barrier"); /* rank 0 has asked for it */
    expect_ok(hvd_process_set_remove(p.id), "remove the pair again");
    if (g_rank == 0)
        expect_error(hvd_wait(h), HVD_ERR_INVALID_ARG,
                     "a negotiated operation of a removed set", "process set",
                     NULL);

    /* A set's operation while a member is joined fails; the join then
     * completes once every rank joined. */
    p = make_set(pair, 2);
    if (g_rank == 0)
        expect_error(hvd_ps_allreduce(p.id, "while joined", &x, &y, 1,
                                      HVD_INT32, HVD_SUM),
                     HVD_ERR_INVALID_ARG, "a member joined", "hvd_join", NULL);
    int last = -1;
    expect_ok(hvd_join(&last), "join");
    expect_ok(hvd_process_set_remove(p.id), "remove after join");
}

static const struct {
    const char *name;
    void (*run)(void);
} subtests[] = {
    {"shapes", test_shapes},
    {"concurrent", test_concurrent},
    {"errors", test_errors},
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
        fprintf(stderr, "usage: %s shapes|concurrent|errors\n", argv[0]);
        return 2;
    }
    g_subtest = subtests[k].name;
    st = hvd_init();
    if (st != HVD_OK)
        fail("hvd_init: %s: %s", status_name(st), hvd_last_error());
    g_rank = hvd_rank();
    g_size = hvd_size();
    if (g_size > MAXR)
        fail("this test runs up to %d ranks", MAXR);
    subtests[k].run();
    st = hvd_shutdown();
    if (st != HVD_OK)
        fail("hvd_shutdown: %s: %s", status_name(st), hvd_last_error());
    printf("PASS psets %s rank %d\n", g_subtest, g_rank);
    return 0;
}
