/*
 * Integration test of alltoall and reducescatter (hvd.h).
 *
 *     hvdrun -np N test_scatter SUBTEST      (or under mpirun)
 *
 *   alltoall       every dtype; equal splits (no sendcounts) and uneven
 *                  ones with zero parts, counts 0 to past the step; the
 *                  counts received checked against what each rank sent;
 *                  one name repeated with other counts each time (cached);
 *                  blocking and several in flight at once; a recvbuf too
 *                  small on one rank (it alone fails, naming the sizes);
 *                  sendcounts past count refused before submission; ranks
 *                  disagreeing on the dtype (every rank: HVD_ERR_MISMATCH)
 *   adasum         op=HVD_ADASUM: equal inputs give themselves, orthogonal
 *                  ones their sum (both exact), any others Horovod's
 *                  algorithm computed here in double (within rounding);
 *                  float16/32/64, 0 to 100001 elements; a rank count that
 *                  is not a power of two and an integer dtype refused
 *   reducescatter  every dtype and op, flat counts 0, 1, size - 1, odd and
 *                  large, rows of a shape cut unevenly, in place and not,
 *                  each name twice (the second from the response cache);
 *                  a rank with another op (every rank: HVD_ERR_MISMATCH)
 *
 * Inputs are small integers from (rank, element, ...): every result is
 * exact in every dtype and compared bit for bit. Each rank prints "PASS
 * scatter SUBTEST rank R" or "FAIL scatter SUBTEST rank R: ...". Exit
 * status: 0 pass, 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 0xA5

static const char *g_subtest = "?";
static int g_rank = -1, g_size = -1;

static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;

    printf("FAIL scatter %s rank %d: ", g_subtest, g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL)
        fail("cannot allocate %zu bytes", bytes);
    return p;
}

static const hvd_dtype all_dtypes[] = HVD_TEST_DTYPES;
static const hvd_op all_ops[] = HVD_TEST_OPS;
#define NDTYPES (sizeof(all_dtypes) / sizeof(*all_dtypes))
#define NOPS (sizeof(all_ops) / sizeof(*all_ops))

static void expect_ok(hvd_status st, const char *what) {
    if (st != HVD_OK)
        fail("%s: %s: %s", what, status_name(st), hvd_last_error());
}

/* ------------------------------------------------------------------ */
/* alltoall                                                            */

/* Elements rank src sends rank dst in pattern `pat` (0: equal splits of
 * `base` each, passed as no sendcounts; else uneven, zeros included). */
static size_t a2a_count(int pat, size_t base, int src, int dst) {
    if (pat == 0)
        return base;
    return (size_t)((src * 3 + dst * 5 + pat) % 4) * base;
}

/* Element j of what src sends dst: in [0, 8] for uint8, [-4, 4] else. */
static long a2a_value(hvd_dtype dt, int src, int dst, size_t j) {
    long v = (long)((j * 7 + (size_t)src * 3 + (size_t)dst * 5) % 9);

    return dt == HVD_UINT8 ? v : v - 4;
}

/* One alltoall in flight: its buffers and what must arrive. */
struct a2a {
    char name[64];
    hvd_dtype dt;
    int pat;
    size_t base, count, want_total;
    size_t *sendcounts, *recvcounts;
    void *send, *recv;
};

static void a2a_init(struct a2a *a, const char *name, hvd_dtype dt, int pat,
                     size_t base) {
    size_t es = hvd_dtype_size(dt), off = 0;

    memset(a, 0, sizeof(*a));
    snprintf(a->name, sizeof(a->name), "%s", name);
    a->dt = dt;
    a->pat = pat;
    a->base = base;
    a->sendcounts = xmalloc((size_t)g_size * sizeof(size_t));
    a->recvcounts = xmalloc((size_t)g_size * sizeof(size_t));
    for (int d = 0; d < g_size; d++) {
        a->sendcounts[d] = a2a_count(pat, base, g_rank, d);
        a->count += a->sendcounts[d];
        a->want_total += a2a_count(pat, base, d, g_rank);
    }
    a->send = xmalloc(a->count * es);
    a->recv = xmalloc((a->want_total + 1) * es);
    for (int d = 0; d < g_size; d++)
        for (size_t j = 0; j < a->sendcounts[d]; j++, off++)
            put_value(dt, a->send, off, a2a_value(dt, g_rank, d, j));
    memset(a->recv, SENTINEL, (a->want_total + 1) * es);
    for (int s = 0; s < g_size; s++)
        a->recvcounts[s] = (size_t)-1;
}

static void a2a_check(const struct a2a *a) {
    size_t es = hvd_dtype_size(a->dt), off = 0;

    for (int s = 0; s < g_size; s++) {
        size_t n = a2a_count(a->pat, a->base, s, g_rank);
        if (a->recvcounts[s] != n)
            fail("'%s': %zu elements came from rank %d, expected %zu", a->name,
                 a->recvcounts[s], s, n);
        for (size_t j = 0; j < n; j++, off++)
            if (!holds(a->dt, a->recv, off, a2a_value(a->dt, s, g_rank, j)))
                fail("'%s' (dtype %d, pattern %d): element %zu from rank %d "
                     "is wrong",
                     a->name, (int)a->dt, a->pat, j, s);
    }
    for (size_t b = 0; b < es; b++)
        if (((unsigned char *)a->recv)[off * es + b] != SENTINEL)
            fail("'%s': written past the %zu elements received", a->name, off);
}

static void a2a_free(struct a2a *a) {
    free(a->sendcounts);
    free(a->recvcounts);
    free(a->send);
    free(a->recv);
}

static hvd_status a2a_submit(struct a2a *a, hvd_handle *h) {
    return hvd_alltoall_async(a->name, a->send, a->count,
                              a->pat == 0 ? NULL : a->sendcounts, a->recv,
                              a->want_total, a->recvcounts, a->dt, h);
}

static void test_alltoall(void) {
    static const size_t bases[] = {0, 1, 3, 20000};
    enum { NB = sizeof(bases) / sizeof(*bases), NPAT = 3 };
    struct a2a *all = xmalloc(NDTYPES * NB * NPAT * sizeof(*all));
    hvd_handle *h = xmalloc(NDTYPES * NB * NPAT * sizeof(*h));
    size_t n = 0;
    char name[64];

    /* Blocking, one by one. */
    for (size_t d = 0; d < NDTYPES; d++)
        for (size_t b = 0; b < NB; b++)
            for (int pat = 0; pat < NPAT; pat++) {
                struct a2a a;
                snprintf(name, sizeof(name), "a2a.%zu.%zu.%d", d, b, pat);
                a2a_init(&a, name, all_dtypes[d], pat, bases[b]);
                expect_ok(hvd_alltoall(a.name, a.send, a.count,
                                       pat == 0 ? NULL : a.sendcounts, a.recv,
                                       a.want_total, a.recvcounts, a.dt),
                          a.name);
                a2a_check(&a);
                a2a_free(&a);
            }
    /* One name again and again with other counts each time: from the
     * second call on it runs from the response cache, its counts told
     * when it runs. */
    for (int round = 0; round < 6; round++) {
        struct a2a a;
        a2a_init(&a, "a2a.repeat", HVD_FLOAT32, round % 3,
                 (size_t)(round * 5 % 7));
        expect_ok(hvd_alltoall(a.name, a.send, a.count,
                               a.pat == 0 ? NULL : a.sendcounts, a.recv,
                               a.want_total, a.recvcounts, a.dt),
                  a.name);
        a2a_check(&a);
        a2a_free(&a);
    }
    /* All in flight at once, waited for in reverse. */
    for (size_t d = 0; d < NDTYPES; d++)
        for (size_t b = 0; b < NB; b++)
            for (int pat = 0; pat < NPAT; pat++, n++) {
                snprintf(name, sizeof(name), "a2a.async.%zu", n);
                a2a_init(&all[n], name, all_dtypes[d], pat, bases[b]);
                expect_ok(a2a_submit(&all[n], &h[n]), all[n].name);
            }
    while (n-- > 0) {
        expect_ok(hvd_wait(h[n]), all[n].name);
        a2a_check(&all[n]);
        a2a_free(&all[n]);
    }
    free(all);
    free(h);

    /* The last rank's recvbuf is one element short: it alone fails. */
    struct a2a a;
    a2a_init(&a, "a2a.small", HVD_INT32, 2, 3);
    size_t cap = a.want_total;
    if (g_rank == g_size - 1 && cap > 0)
        cap--;
    hvd_status st = hvd_alltoall(a.name, a.send, a.count, a.sendcounts, a.recv,
                                 cap, a.recvcounts, a.dt);
    if (cap < a.want_total) {
        if (st != HVD_ERR_INVALID_ARG ||
            strstr(hvd_last_error(), "recvcap") == NULL)
            fail("a recvbuf too small: %s: %s", status_name(st),
                 hvd_last_error());
    } else {
        expect_ok(st, a.name);
        a2a_check(&a);
    }
    a2a_free(&a);

    /* sendcounts past count: refused at once, nothing submitted. */
    size_t *too_many = xmalloc((size_t)g_size * sizeof(size_t));
    int32_t one = 0;
    for (int d = 0; d < g_size; d++)
        too_many[d] = 1;
    st = hvd_alltoall("a2a.bad", &one, (size_t)g_size - 1, too_many, NULL, 0,
                      NULL, HVD_INT32);
    if (st != HVD_ERR_INVALID_ARG || strstr(hvd_last_error(), "count") == NULL)
        fail("sendcounts past count: %s: %s", status_name(st),
             hvd_last_error());
    if (g_size > 1) {
        /* Without sendcounts, a count that does not split evenly. */
        st =
            hvd_alltoall("a2a.uneven", &one, 1, NULL, NULL, 0, NULL, HVD_INT32);
        if (st != HVD_ERR_INVALID_ARG)
            fail("count 1 over %d ranks: %s", g_size, status_name(st));
    }
    free(too_many);

    /* Ranks that disagree on the dtype: every rank is told, by name. */
    if (g_size > 1) {
        int64_t sbuf[8] = {0}, rbuf[8];
        hvd_dtype dt = g_rank == 1 ? HVD_INT64 : HVD_INT32;
        st = hvd_alltoall("a2a.mismatch", sbuf, (size_t)g_size, NULL, rbuf, 8,
                          NULL, dt);
        if (st != HVD_ERR_MISMATCH ||
            strstr(hvd_last_error(), "a2a.mismatch") == NULL ||
            strstr(hvd_last_error(), "alltoall int64") == NULL)
            fail("dtype mismatch: %s: %s", status_name(st), hvd_last_error());
    }
    /* And the job goes on. */
    a2a_init(&a, "a2a.after", HVD_FLOAT32, 1, 2);
    expect_ok(hvd_alltoall(a.name, a.send, a.count, a.sendcounts, a.recv,
                           a.want_total, a.recvcounts, a.dt),
              a.name);
    a2a_check(&a);
    a2a_free(&a);
}

/* ------------------------------------------------------------------ */
/* reducescatter                                                       */

/* Element j of rank's input (testutil.h's exact_input). */
static long rs_input(hvd_dtype dt, hvd_op op, int rank, int index, size_t j) {
    return exact_input(dt, op, g_size,
                       j * 7 + (size_t)index * 5 + (size_t)rank);
}

static long rs_expected(hvd_dtype dt, hvd_op op, int index, size_t j) {
    long acc = rs_input(dt, op, 0, index, j);

    for (int r = 1; r < g_size; r++)
        acc = combine(op, acc, rs_input(dt, op, r, index, j));
    return op == HVD_AVERAGE ? acc / g_size : acc;
}

/* One reduce-scatter of rows x width elements (width 0: flat, no shape). */
static void rs_run(int index, hvd_dtype dt, hvd_op op, size_t rows,
                   size_t width, int in_place) {
    size_t es = hvd_dtype_size(dt), unit = width > 0 ? width : 1;
    size_t count = rows * unit, off = 0, mine;
    char name[64];

    for (int r = 0; r < g_rank; r++)
        off += hvd_reducescatter_count(rows, g_size, r) * unit;
    mine = hvd_reducescatter_count(rows, g_size, g_rank) * unit;
    snprintf(name, sizeof(name), "rs.%d", index);
    uint8_t *send = xmalloc(count * es);
    uint8_t *recv = in_place ? send : xmalloc((mine + 1) * es);
    for (int round = 0; round < 2; round++) {
        for (size_t j = 0; j < count; j++)
            put_value(dt, send, j, rs_input(dt, op, g_rank, index, j));
        if (!in_place)
            memset(recv, SENTINEL, (mine + 1) * es);
        hvd_status st;
        if (width > 0) {
            int64_t shape[2] = {(int64_t)rows, (int64_t)width};
            hvd_handle h;
            st = hvd_reducescatter_shaped_async(name, send, recv, 2, shape, dt,
                                                op, &h);
            if (st == HVD_OK)
                st = hvd_wait(h);
        } else {
            st = hvd_reducescatter(name, send, recv, count, dt, op);
        }
        expect_ok(st, name);
        for (size_t j = 0; j < mine; j++)
            if (!holds(dt, recv, j, rs_expected(dt, op, index, off + j)))
                fail("'%s' (dtype %d, op %d, %zu x %zu, %s, round %d): "
                     "element %zu of this rank's %zu is wrong",
                     name, (int)dt, (int)op, rows, width,
                     in_place ? "in place" : "out of place", round, j, mine);
        if (!in_place)
            for (size_t b = 0; b < es; b++)
                if (recv[mine * es + b] != SENTINEL)
                    fail("'%s': written past this rank's %zu elements", name,
                         mine);
    }
    if (!in_place)
        free(recv);
    free(send);
}

static void test_reducescatter(void) {
    size_t counts[] = {0, 1, (size_t)g_size - 1, 7, 1000, 70001};
    int index = 0;

    for (size_t d = 0; d < NDTYPES; d++)
        for (size_t o = 0; o < NOPS; o++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(*counts); c++)
                rs_run(index++, all_dtypes[d], all_ops[o], counts[c], 0,
                       (int)(c % 2));
            /* Rows of 3 cut unevenly: 2 * size + 1 rows. */
            rs_run(index++, all_dtypes[d], all_ops[o], 2 * (size_t)g_size + 1,
                   3, 0);
        }
    if (g_size > 1) {
        float in[4] = {1, 2, 3, 4}, out[4];
        hvd_op op = g_rank == 0 ? HVD_SUM : HVD_MAX;
        hvd_status st =
            hvd_reducescatter("rs.mismatch", in, out, 4, HVD_FLOAT32, op);
        if (st != HVD_ERR_MISMATCH ||
            strstr(hvd_last_error(), "reducescatter float32 max") == NULL)
            fail("op mismatch: %s: %s", status_name(st), hvd_last_error());
    }
    rs_run(index++, HVD_FLOAT32, HVD_SUM, 11, 0, 0);
}

/* ------------------------------------------------------------------ */
/* adasum                                                              */

static double ad_input(int pattern, int rank, size_t j) {
    switch (pattern) {
    case 0: /* the same everywhere: Adasum averages, the result is it */
        return (double)((long)(j % 9) - 4);
    case 1: /* orthogonal: rank r only where j % size == r; Adasum adds */
        return j % (size_t)g_size == (size_t)rank ? (double)(j % 5 + 1) : 0;
    default: /* anything */
        return (double)((long)((j * 7 + (size_t)rank * 13) % 17) - 8) / 4.0;
    }
}

static double ad_get(hvd_dtype dt, const void *buf, size_t j) {
    if (dt == HVD_FLOAT64)
        return ((const double *)buf)[j];
    if (dt == HVD_FLOAT32)
        return ((const float *)buf)[j];
    uint16_t h = ((const uint16_t *)buf)[j];
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Horovod's Adasum over whole vectors, level by level, in double: the
 * reference the library's distributed one is compared with. */
static void ad_reference(int pattern, size_t count, double *out) {
    int p = g_size;
    double *v = xmalloc((size_t)p * count * sizeof(double));

    for (int r = 0; r < p; r++)
        for (size_t j = 0; j < count; j++)
            v[(size_t)r * count + j] = ad_input(pattern, r, j);
    for (int l = 1; l < p; l <<= 1)
        for (int r = 0; r < p; r += 2 * l) {
            double *a = v + (size_t)r * count, *b = v + (size_t)(r + l) * count;
            double dot = 0, aa = 0, bb = 0;
            for (size_t j = 0; j < count; j++) {
                dot += a[j] * b[j];
                aa += a[j] * a[j];
                bb += b[j] * b[j];
            }
            double ac = aa >= sqrt(DBL_MIN) ? 1 - dot / aa * 0.5 : 1;
            double bc = bb >= sqrt(DBL_MIN) ? 1 - dot / bb * 0.5 : 1;
            for (size_t j = 0; j < count; j++)
                a[j] = ac * a[j] + bc * b[j];
        }
    memcpy(out, v, count * sizeof(double));
    free(v);
}

static void test_adasum(void) {
    static const hvd_dtype dts[] = {HVD_FLOAT16, HVD_FLOAT32, HVD_FLOAT64};
    static const size_t counts[] = {0, 1, 7, 1000, 100001};
    int pow2 = (g_size & (g_size - 1)) == 0;
    char name[64];

    if (!pow2) {
        float x = 1, y;
        hvd_status st =
            hvd_allreduce("ad.np", &x, &y, 1, HVD_FLOAT32, HVD_ADASUM);
        if (st != HVD_ERR_UNSUPPORTED ||
            strstr(hvd_last_error(), "power-of-two") == NULL)
            fail("Adasum on %d ranks: %s: %s", g_size, status_name(st),
                 hvd_last_error());
        return;
    }
    int32_t i = 1, o;
    hvd_status st = hvd_allreduce("ad.int", &i, &o, 1, HVD_INT32, HVD_ADASUM);
    if (st != HVD_ERR_UNSUPPORTED)
        fail("Adasum of int32: %s", status_name(st));
    for (size_t d = 0; d < sizeof(dts) / sizeof(*dts); d++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(*counts); c++)
            for (int pattern = 0; pattern < 3; pattern++) {
                hvd_dtype dt = dts[d];
                size_t n = counts[c], es = hvd_dtype_size(dt);
                uint8_t *send = xmalloc(n * es), *recv = xmalloc(n * es);
                double *want = xmalloc((n ? n : 1) * sizeof(double));
                for (size_t j = 0; j < n; j++) {
                    double v = ad_input(pattern, g_rank, j);
                    if (dt == HVD_FLOAT64)
                        ((double *)send)[j] = v;
                    else if (dt == HVD_FLOAT32)
                        ((float *)send)[j] = (float)v;
                    else
                        put_value(dt, send, j, (long)v); /* patterns 0, 1 */
                }
                if (dt == HVD_FLOAT16 && pattern == 2) {
                    free(send);
                    free(recv);
                    free(want);
                    continue; /* its quarters are not integers */
                }
                ad_reference(pattern, n, want);
                snprintf(name, sizeof(name), "ad.%zu.%zu.%d", d, c, pattern);
                /* Twice: the second from the response cache. */
                for (int round = 0; round < 2; round++) {
                    expect_ok(
                        hvd_allreduce(name, send, recv, n, dt, HVD_ADASUM),
                        name);
                    for (size_t j = 0; j < n; j++) {
                        double got = ad_get(dt, recv, j);
                        double tol = pattern < 2 ? 0
                                     : dt == HVD_FLOAT32
                                         ? 1e-5 * (fabs(want[j]) + 1)
                                         : 1e-12 * (fabs(want[j]) + 1);
                        if (fabs(got - want[j]) > tol)
                            fail("'%s' (%s, pattern %d, %zu elements) "
                                 "element %zu: %.17g, expected %.17g",
                                 name,
                                 dt == HVD_FLOAT16   ? "float16"
                                 : dt == HVD_FLOAT32 ? "float32"
                                                     : "float64",
                                 pattern, n, j, got, want[j]);
                    }
                }
                free(send);
                free(recv);
                free(want);
            }
}

/* ------------------------------------------------------------------ */
/* grouped allgather and reduce-scatter                                */

/* One grouped allgather and one grouped reduce-scatter of every dtype
 * (and op), of buffers of 0, 1, 7 and 1001 elements, each checked
 * exactly; in the job, then (size > 2) in the set of all ranks but the
 * last; ranks disagreeing on the number of buffers: HVD_ERR_MISMATCH. */
static void grouped_once(int ps, int n, const int *members, int me) {
    const size_t counts[4] = {0, 1, 7, 1001};
    char name[64];

    for (size_t d = 0; d < NDTYPES; d++) {
        hvd_dtype dt = all_dtypes[d];
        size_t es = hvd_dtype_size(dt);
        const void *send[4];
        void *recv[4];
        for (int i = 0; i < 4; i++) {
            uint8_t *b = xmalloc(counts[i] * es);
            for (size_t j = 0; j < counts[i]; j++)
                put_value(
                    dt, b, j,
                    exact_input(dt, HVD_SUM, n,
                                (size_t)g_rank * 131 + j * 7 + (size_t)i));
            send[i] = b;
            recv[i] = xmalloc(counts[i] * es * (size_t)n);
        }
        snprintf(name, sizeof(name), "gag.%zu", d);
        expect_ok(
            ps != 0
                ? hvd_ps_grouped_allgather(ps, name, 4, send, recv, counts, dt)
                : hvd_grouped_allgather(name, 4, send, recv, counts, dt),
            name);
        for (int i = 0; i < 4; i++)
            for (int m = 0; m < n; m++)
                for (size_t j = 0; j < counts[i]; j++) {
                    long want = exact_input(dt, HVD_SUM, n,
                                            (size_t)members[m] * 131 + j * 7 +
                                                (size_t)i);
                    if (!holds(dt, recv[i], (size_t)m * counts[i] + j, want))
                        fail("'%s' (set %d) buffer %d block %d element %zu: "
                             "expected %ld",
                             name, ps, i, m, j, want);
                }
        for (size_t o = 0; o < NOPS; o++) {
            hvd_op op = all_ops[o];
            for (int i = 0; i < 4; i++)
                for (size_t j = 0; j < counts[i]; j++)
                    put_value(
                        dt, (void *)send[i], j,
                        exact_input(dt, op, n,
                                    (size_t)g_rank * 131 + j * 7 + (size_t)i));
            snprintf(name, sizeof(name), "grs.%zu.%zu", d, o);
            expect_ok(ps != 0 ? hvd_ps_grouped_reducescatter(
                                    ps, name, 4, send, recv, counts, dt, op)
                              : hvd_grouped_reducescatter(name, 4, send, recv,
                                                          counts, dt, op),
                      name);
            for (int i = 0; i < 4; i++) {
                size_t first = 0;
                for (int m = 0; m < me; m++)
                    first += hvd_reducescatter_count(counts[i], n, m);
                size_t mine = hvd_reducescatter_count(counts[i], n, me);
                for (size_t j = 0; j < mine; j++) {
                    size_t at = first + j;
                    long want = 0;
                    for (int m = 0; m < n; m++) {
                        long v = exact_input(dt, op, n,
                                             (size_t)members[m] * 131 + at * 7 +
                                                 (size_t)i);
                        want = m == 0 ? v : combine(op, want, v);
                    }
                    if (op == HVD_AVERAGE)
                        want /= n;
                    if (!holds(dt, recv[i], j, want))
                        fail("'%s' (set %d) buffer %d element %zu: expected "
                             "%ld",
                             name, ps, i, at, want);
                }
            }
        }
        for (int i = 0; i < 4; i++) {
            free((void *)send[i]);
            free(recv[i]);
        }
    }
}

static void test_grouped(void) {
    int all[64], id = 0;

    if (g_size > 64)
        fail("this subtest runs up to 64 ranks");
    for (int r = 0; r < g_size; r++)
        all[r] = r;
    grouped_once(0, g_size, all, g_rank);
    if (g_size > 2) {
        expect_ok(hvd_process_set_create(all, g_size - 1, &id), "create");
        if (g_rank < g_size - 1)
            grouped_once(id, g_size - 1, all, g_rank);
        expect_ok(hvd_process_set_remove(id), "remove");
    }
    if (g_size > 1) {
        float in[2] = {1, 2}, out[4];
        const void *send[2] = {in, in};
        void *recv[2] = {out, out + 2};
        size_t counts[2] = {1, 1};
        int n = g_rank == 0 ? 1 : 2;
        hvd_status st = hvd_grouped_allgather("gag.mismatch", n, send, recv,
                                              counts, HVD_FLOAT32);
        if (st != HVD_ERR_MISMATCH ||
            strstr(hvd_last_error(), "counts 1,1") == NULL)
            fail("grouped allgather of 1 and 2 buffers: %s: %s",
                 status_name(st), hvd_last_error());
    }
}

static const struct {
    const char *name;
    void (*run)(void);
} subtests[] = {
    {"adasum", test_adasum},
    {"alltoall", test_alltoall},
    {"grouped", test_grouped},
    {"reducescatter", test_reducescatter},
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
        fprintf(stderr, "usage: %s alltoall|reducescatter|adasum|grouped\n",
                argv[0]);
        return 2;
    }
    g_subtest = subtests[k].name;
    st = hvd_init();
    if (st != HVD_OK)
        fail("hvd_init: %s: %s", status_name(st), hvd_last_error());
    g_rank = hvd_rank();
    g_size = hvd_size();
    subtests[k].run();
    st = hvd_shutdown();
    if (st != HVD_OK)
        fail("hvd_shutdown: %s: %s", status_name(st), hvd_last_error());
    printf("PASS scatter %s rank %d\n", g_subtest, g_rank);
    return 0;
}
