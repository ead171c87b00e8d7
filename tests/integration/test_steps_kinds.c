/*
 * Integration test of the steps' fast path for every kind of collective
 * (docs/design.md, "Steps", "The express way"): a cached broadcast,
 * allgather, alltoall, reduce-scatter, grouped allreduce, grouped
 * allgather, grouped reduce-scatter and barrier, whose small data travels
 * in the step messages (reduced, concatenated or taken where it arrives)
 * and whose larger data runs as a collective after the step; blocking
 * calls take the express way, and every way out of it.
 *
 *     hvdrun -np N test_steps_kinds SUBTEST
 *     test_steps_kinds --victim R --after K --names M   (run_peer_lost.sh)
 *
 *   exact     every kind, every dtype (every op where it reduces), counts
 *             0, 1, odd, carried, carried only over TCP (run so too),
 *             and past the 64 KiB a step carries, in place and not where
 *             the API has both, each name run several
 *             times blocking (cached: the express way) and then all at
 *             once asynchronously (steps of many parts);
 *   mismatch  a run of cached names of every kind in which the last rank
 *             changes the kind, count, dtype or root of the name at each
 *             position in turn: HVD_ERR_MISMATCH for it on every rank,
 *             exact results for the rest, and cached again afterwards;
 *   join      the last rank joins amid cached names of every kind: the
 *             others' allreduces go on without it, the other kinds fail
 *             naming hvd_join, and all are exact again after;
 *   threads   two threads per rank interleave blocking calls of every
 *             kind, so ranks offer them in different combinations;
 *   mixed     every rank picks, per call and differently from the others,
 *             the express way, the queue (asynchronous and waited for) or
 *             a blocking call while another request is in flight; every
 *             fifth round the last rank changes one name's values;
 *   --victim  every rank runs cached names of every kind; rank R kills
 *             itself before iteration K: each survivor prints "PASS
 *             peer_lost" when its failing call returns HVD_ERR_PEER_LOST
 *             naming rank R within 5 s and hvd_shutdown within 5 s more.
 *
 * Inputs are small integers from (rank, round, name, buffer, element):
 * every result is exact in every dtype, and each rank computes it from the
 * same formula and compares bit patterns. Each rank prints "PASS kinds
 * SUBTEST rank R" or "FAIL kinds SUBTEST rank R: ...". Exit status: 0
 * pass, 1 fail, 2 bad usage, 77 skip (too few ranks).
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_SKIP 77
#define SENTINEL 0xA5
#define MAXR 16
#define NBUF 2

static const char *g_subtest = "?";
static int g_rank = -1, g_size = -1;

static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static _Noreturn void fail(const char *fmt, ...) {
    va_list ap;

    flockfile(stdout);
    printf("FAIL kinds %s rank %d: ", g_subtest, g_rank);
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

/* Element j of buffer `index` in round `round` on `rank`. */
static long input(hvd_dtype dt, hvd_op op, int rank, int round, int index,
                  size_t j) {
    return exact_input(dt, op, g_size,
                       j * 7 + (size_t)index * 5 + (size_t)round * 3 +
                           (size_t)rank);
}

/* The reduction of element j over every rank. */
static long expected(hvd_dtype dt, hvd_op op, int round, int index, size_t j) {
    long acc = input(dt, op, 0, round, index, j);

    for (int r = 1; r < g_size; r++)
        acc = combine(op, acc, input(dt, op, r, round, index, j));
    return op == HVD_AVERAGE ? acc / g_size : acc;
}

enum {
    K_BCAST,
    K_AG,
    K_A2A,
    K_RS,
    K_GAR,
    K_GAG,
    K_GRS,
    K_AR,
    K_BARRIER,
};
static const char *const kind_names[] = {"broadcast",
                                         "allgather",
                                         "alltoall",
                                         "reducescatter",
                                         "grouped_allreduce",
                                         "grouped_allgather",
                                         "grouped_reducescatter",
                                         "allreduce",
                                         "barrier"};

/* One named operation of some kind and its buffers (room for count + 2
 * elements per rank in each, whatever the kind, so that a rank that
 * changes the kind or count of a name still writes inside them). */
struct kop {
    char name[64];
    int kind, index, in_place, root, nbuf;
    hvd_dtype dtype;
    hvd_op op;
    size_t cnt[NBUF];
    void *send[NBUF], *recv[NBUF];
    size_t rcounts[MAXR];
};

static int reduces(int kind) {
    return kind == K_RS || kind == K_GAR || kind == K_GRS || kind == K_AR;
}

static void kop_init(struct kop *o, const char *name, int index, int kind,
                     hvd_dtype dt, hvd_op op, size_t count, int in_place,
                     int root) {
    memset(o, 0, sizeof(*o));
    snprintf(o->name, sizeof(o->name), "%s", name);
    o->kind = kind;
    o->index = index;
    o->dtype = dt;
    o->op = reduces(kind) ? op : HVD_SUM;
    o->in_place = in_place && (kind == K_RS || kind == K_GAR || kind == K_AR);
    o->root = root;
    o->nbuf = kind == K_GAR || kind == K_GAG || kind == K_GRS ? 2 : 1;
    o->cnt[0] = count;
    o->cnt[1] = count / 2 + 1;
    for (int b = 0; b < o->nbuf; b++) {
        size_t room = (o->cnt[b] + 2) * (size_t)g_size * hvd_dtype_size(dt);
        o->send[b] = xmalloc(room);
        o->recv[b] =
            o->in_place || kind == K_BCAST ? o->send[b] : xmalloc(room);
    }
}

static void kop_free(struct kop *o) {
    for (int b = 0; b < o->nbuf; b++) {
        if (o->recv[b] != o->send[b])
            free(o->recv[b]);
        free(o->send[b]);
    }
}

/* An alltoall's count from rank r to rank k (uneven: ranks differ). */
static size_t a2a_count(size_t count, int r, int k) {
    return count == 0 ? 0 : count / (size_t)g_size + (size_t)((r + k) % 2);
}

static size_t a2a_total(size_t count, int r) {
    size_t n = 0;

    for (int k = 0; k < g_size; k++)
        n += a2a_count(count, r, k);
    return n;
}

static size_t send_count(const struct kop *o, int b) {
    return o->kind == K_A2A ? a2a_total(o->cnt[0], g_rank) : o->cnt[b];
}

static void kop_fill(struct kop *o, int round) {
    size_t es = hvd_dtype_size(o->dtype);

    for (int b = 0; b < o->nbuf; b++) {
        size_t n = send_count(o, b);
        if (o->kind == K_BCAST && g_rank != o->root) {
            memset(o->send[b], SENTINEL, n * es);
            continue;
        }
        for (size_t j = 0; j < n; j++)
            put_value(
                o->dtype, o->send[b], j,
                input(o->dtype, o->op, g_rank, round, o->index * NBUF + b, j));
        if (o->recv[b] != o->send[b])
            memset(o->recv[b], SENTINEL, n * es);
    }
}

static void bad(const struct kop *o, int round, int b, size_t j, long want) {
    fail("'%s' (%s, dtype %d, op %d, count %zu, %s, round %d) buffer %d "
         "element %zu: expected %ld",
         o->name, kind_names[o->kind], (int)o->dtype, (int)o->op, o->cnt[0],
         o->in_place ? "in place" : "out of place", round, b, j, want);
}

/* Checks one buffer of a reduce-scatter: this rank's block. */
static void check_rs(const struct kop *o, int round, int b) {
    size_t c = o->cnt[b], base = c / (size_t)g_size, extra = c % (size_t)g_size;
    size_t off = (size_t)g_rank * base +
                 ((size_t)g_rank < extra ? (size_t)g_rank : extra);
    size_t n = hvd_reducescatter_count(c, g_size, g_rank);

    for (size_t j = 0; j < n; j++) {
        long want =
            expected(o->dtype, o->op, round, o->index * NBUF + b, off + j);
        if (!holds(o->dtype, o->recv[b], j, want))
            bad(o, round, b, j, want);
    }
}

static void check_a2a(const struct kop *o, int round) {
    size_t at = 0;

    for (int r = 0; r < g_size; r++) {
        size_t off = 0, n = a2a_count(o->cnt[0], r, g_rank);
        for (int k = 0; k < g_rank; k++)
            off += a2a_count(o->cnt[0], r, k);
        if (o->rcounts[r] != n)
            fail("'%s' round %d: %zu elements from rank %d, expected %zu",
                 o->name, round, o->rcounts[r], r, n);
        for (size_t j = 0; j < n; j++, at++) {
            long want =
                input(o->dtype, o->op, r, round, o->index * NBUF, off + j);
            if (!holds(o->dtype, o->recv[0], at, want))
                bad(o, round, 0, at, want);
        }
    }
}

static void kop_check(const struct kop *o, int round) {
    for (int b = 0; b < o->nbuf; b++) {
        int index = o->index * NBUF + b;
        size_t c = o->cnt[b];
        switch (o->kind) {
        case K_BCAST:
            for (size_t j = 0; j < c; j++) {
                long want = input(o->dtype, o->op, o->root, round, index, j);
                if (!holds(o->dtype, o->recv[b], j, want))
                    bad(o, round, b, j, want);
            }
            break;
        case K_AG:
        case K_GAG:
            for (int r = 0; r < g_size; r++)
                for (size_t j = 0; j < c; j++) {
                    long want = input(o->dtype, o->op, r, round, index, j);
                    if (!holds(o->dtype, o->recv[b], (size_t)r * c + j, want))
                        bad(o, round, b, (size_t)r * c + j, want);
                }
            break;
        case K_A2A:
            check_a2a(o, round);
            break;
        case K_RS:
        case K_GRS:
            check_rs(o, round, b);
            break;
        case K_GAR:
        case K_AR:
            for (size_t j = 0; j < c; j++) {
                long want = expected(o->dtype, o->op, round, index, j);
                if (!holds(o->dtype, o->recv[b], j, want))
                    bad(o, round, b, j, want);
            }
            break;
        default:
            break;
        }
    }
}

/* What one rank changes in a call (mismatch, mixed): its kind, count,
 * dtype or root; -1 / 0: nothing. */
struct change {
    int kind;
    size_t more;
    int dtype;
    int root;
};
static const struct change same = {-1, 0, -1, -1};

/* Calls o (blocking, or asynchronously into *h if h is not NULL). */
static hvd_status kop_call(struct kop *o, struct change ch, hvd_handle *h) {
    int kind = ch.kind >= 0 ? ch.kind : o->kind;
    hvd_dtype dt = ch.dtype >= 0 ? (hvd_dtype)ch.dtype : o->dtype;
    int root = ch.root >= 0 ? ch.root : o->root;
    size_t c = o->cnt[0] + ch.more;
    size_t cs[NBUF] = {c, o->cnt[1]};
    const void *const *s = (const void *const *)o->send;
    void *const *rv = o->recv;
    size_t sc[MAXR];

    switch (kind) {
    case K_BCAST:
        return h ? hvd_broadcast_async(o->name, o->send[0], c, dt, root, h)
                 : hvd_broadcast(o->name, o->send[0], c, dt, root);
    case K_AG:
        return h ? hvd_allgather_async(o->name, s[0], rv[0], c, dt, h)
                 : hvd_allgather(o->name, s[0], rv[0], c, dt);
    case K_A2A:
        for (int k = 0; k < g_size; k++)
            sc[k] = a2a_count(o->cnt[0], g_rank, k);
        c = a2a_total(o->cnt[0], g_rank);
        size_t cap = (o->cnt[0] + 2) * (size_t)g_size;
        return h ? hvd_alltoall_async(o->name, s[0], c, sc, rv[0], cap,
                                      o->rcounts, dt, h)
                 : hvd_alltoall(o->name, s[0], c, sc, rv[0], cap, o->rcounts,
                                dt);
    case K_RS:
        return h ? hvd_reducescatter_async(o->name, s[0], rv[0], c, dt, o->op,
                                           h)
                 : hvd_reducescatter(o->name, s[0], rv[0], c, dt, o->op);
    case K_GAR:
        return h ? hvd_grouped_allreduce_async(o->name, 2, s, rv, cs, dt, o->op,
                                               h)
                 : hvd_grouped_allreduce(o->name, 2, s, rv, cs, dt, o->op);
    case K_GAG:
        return h ? hvd_grouped_allgather_async(o->name, 2, s, rv, cs, dt, h)
                 : hvd_grouped_allgather(o->name, 2, s, rv, cs, dt);
    case K_GRS:
        return h ? hvd_grouped_reducescatter_async(o->name, 2, s, rv, cs, dt,
                                                   o->op, h)
                 : hvd_grouped_reducescatter(o->name, 2, s, rv, cs, dt, o->op);
    case K_AR:
        return h ? hvd_allreduce_async(o->name, s[0], rv[0], c, dt, o->op, h)
                 : hvd_allreduce(o->name, s[0], rv[0], c, dt, o->op);
    default:
        return hvd_barrier();
    }
}

static void kop_run(struct kop *o, int round) {
    kop_fill(o, round);
    hvd_status st = kop_call(o, same, NULL);
    if (st != HVD_OK)
        fail("round %d: %s('%s'): %s: %s", round, kind_names[o->kind], o->name,
             status_name(st), hvd_last_error());
    kop_check(o, round);
}

/* ------------------------------------------------------------------ */
/* exact                                                               */

#define EX_ROUNDS 3
/* Elements: empty, one, odd, carried for every dtype, carried for the
 * wider dtypes only where the control channel is a network (past the
 * 8 KiB part of shared memory, within TCP's 32 KiB), a 4-byte alltoall
 * whose data just fits TCP's 32 KiB and whose counts do not (carried
 * there: its counts are not held against the limit), past the 64 KiB a
 * step carries for most (a collective after the step). */
static const size_t ex_counts[] = {0, 1, 7, 1000, 3000, 8190, 20000};
#define EX_NCOUNTS (sizeof(ex_counts) / sizeof(*ex_counts))

static size_t ex_build(struct kop *ops) {
    size_t k = 0;
    char name[64];

    for (size_t d = 0; d < NDTYPES; d++)
        for (size_t c = 0; c < EX_NCOUNTS; c++) {
            hvd_dtype dt = all_dtypes[d];
            size_t n = ex_counts[c];
            hvd_op op = all_ops[(d + c) % NOPS];
#define ADD(kind, o, ip, root)                                                 \
    do {                                                                       \
        snprintf(name, sizeof(name), "ex.%zu.%s", k, kind_names[kind]);        \
        kop_init(&ops[k], name, (int)k, kind, dt, o, n, ip, root);             \
        k++;                                                                   \
    } while (0)
            ADD(K_BCAST, HVD_SUM, 0, (int)(d + c) % g_size);
            ADD(K_AG, HVD_SUM, 0, 0);
            ADD(K_A2A, HVD_SUM, 0, 0);
            for (size_t p = 0; p < NOPS; p++)
                ADD(K_RS, all_ops[p], (int)p % 2, 0);
            ADD(K_GAR, op, (int)c % 2, 0);
            ADD(K_GAG, HVD_SUM, 0, 0);
            ADD(K_GRS, op, 0, 0);
#undef ADD
        }
    return k;
}

static void test_exact(void) {
    size_t cap = NDTYPES * EX_NCOUNTS * (6 + NOPS);
    struct kop *ops = xmalloc(cap * sizeof(*ops));
    size_t n = ex_build(ops);
    hvd_handle *h = xmalloc(n * sizeof(*h));

    /* Blocking, one after the other: round 0 negotiates and caches, the
     * later rounds take the express way (a lone step each). */
    for (int round = 0; round < EX_ROUNDS; round++)
        for (size_t k = 0; k < n; k++) {
            kop_run(&ops[k], round);
            if (k % 16 == 0 && hvd_barrier() != HVD_OK)
                fail("hvd_barrier: %s", hvd_last_error());
        }
    /* All at once: steps with many parts, carried and not. */
    for (int round = EX_ROUNDS; round < EX_ROUNDS + 2; round++) {
        for (size_t k = 0; k < n; k++) {
            kop_fill(&ops[k], round);
            hvd_status st = kop_call(&ops[k], same, &h[k]);
            if (st != HVD_OK)
                fail("round %d: %s_async('%s'): %s: %s", round,
                     kind_names[ops[k].kind], ops[k].name, status_name(st),
                     hvd_last_error());
        }
        for (size_t k = n; k-- > 0;) {
            hvd_status st = hvd_wait(h[k]);
            if (st != HVD_OK)
                fail("round %d: hvd_wait('%s'): %s: %s", round, ops[k].name,
                     status_name(st), hvd_last_error());
            kop_check(&ops[k], round);
        }
    }
    for (size_t k = 0; k < n; k++)
        kop_free(&ops[k]);
    free(h);
    free(ops);
}

/* ------------------------------------------------------------------ */
/* mismatch                                                            */

#define MM_NAMES 7
static const int mm_kinds[MM_NAMES] = {K_BCAST, K_AG,  K_A2A, K_RS,
                                       K_GAG,   K_GRS, K_AG};
/* Carried, and one not (20000 float32: 80 KB). */
static const size_t mm_counts[MM_NAMES] = {5, 3, 8, 13, 2, 9, 20000};

/* The change of the last rank at position bad of kind t (0 kind, 1 count,
 * 2 dtype, 3 root); same if there is none of that kind for it. */
static struct change mm_change(const struct kop *o, int t) {
    struct change ch = same;

    if (t == 0) /* never an allgather into its own sendbuf */
        ch.kind = o->kind == K_BCAST ? K_AR : o->kind == K_AG ? K_BCAST : K_AG;
    else if (t == 1 && o->kind != K_A2A) /* an alltoall's counts are its own */
        ch.more = 1;
    else if (t == 2)
        ch.dtype = HVD_INT32;
    else if (t == 3 && o->kind == K_BCAST)
        ch.root = (o->root + 1) % g_size;
    return ch;
}

static int changed(struct change ch) {
    return ch.kind >= 0 || ch.more > 0 || ch.dtype >= 0 || ch.root >= 0;
}

static void mm_run(struct kop *ops, int round, int bad, int t) {
    for (int i = 0; i < MM_NAMES; i++) {
        struct kop *o = &ops[i];
        struct change ch = i == bad ? mm_change(o, t) : same;
        int odd = changed(ch);
        hvd_status st;

        kop_fill(o, round);
        st = kop_call(o, g_rank == g_size - 1 ? ch : same, NULL);
        if (!odd) {
            if (st != HVD_OK)
                fail("round %d (mismatch at %d): '%s': %s: %s", round, bad,
                     o->name, status_name(st), hvd_last_error());
            kop_check(o, round);
            continue;
        }
        char quoted[70];
        snprintf(quoted, sizeof(quoted), "'%s'", o->name);
        if (st != HVD_ERR_MISMATCH || strstr(hvd_last_error(), quoted) == NULL)
            fail("round %d: '%s' (rank %d changed its %s): %s, expected "
                 "HVD_ERR_MISMATCH naming it: \"%s\"",
                 round, o->name, g_size - 1,
                 t == 0   ? "kind"
                 : t == 1 ? "count"
                 : t == 2 ? "dtype"
                          : "root",
                 status_name(st), hvd_last_error());
        if (!names_rank(hvd_last_error(), g_size - 1))
            fail("the mismatch report does not name rank %d: \"%s\"",
                 g_size - 1, hvd_last_error());
    }
}

static void test_mismatch(void) {
    struct kop ops[MM_NAMES];
    char name[64];
    int round = 0;

    for (int i = 0; i < MM_NAMES; i++) {
        snprintf(name, sizeof(name), "mm.%d.%s", i, kind_names[mm_kinds[i]]);
        kop_init(&ops[i], name, i, mm_kinds[i], HVD_FLOAT32, HVD_SUM,
                 mm_counts[i], 0, i % g_size);
    }
    for (; round < 2; round++)
        mm_run(ops, round, -1, 0);
    for (int bad = 0; bad < MM_NAMES; bad++)
        for (int t = 0; t < 4; t++) {
            if (!changed(mm_change(&ops[bad], t)))
                continue;
            mm_run(ops, round++, bad, t);
            mm_run(ops, round++, -1, 0);
        }
    for (int i = 0; i < MM_NAMES; i++)
        kop_free(&ops[i]);
}

/* ------------------------------------------------------------------ */
/* join                                                                */

#define JOIN_SHORT 3
#define JOIN_LONG 6
#define JN_NAMES 8
static const int jn_kinds[JN_NAMES] = {K_BCAST, K_AG,  K_A2A, K_RS,
                                       K_GAG,   K_GRS, K_AR,  K_BARRIER};

/* While the last rank is joined, an allreduce sums the others' inputs
 * (its own counts as a zero: SUM of rank + 1 here); the other kinds
 * fail naming hvd_join. */
static void jn_round(struct kop *ops, int round, int joined) {
    for (int i = 0; i < JN_NAMES; i++) {
        struct kop *o = &ops[i];
        /* Unnamed barriers are named by how many a rank called: the
         * joined rank calls none, so neither do the others meanwhile. */
        if (joined && o->kind == K_BARRIER)
            continue;
        if (!joined) {
            if (o->kind == K_AR)
                kop_fill(o, round);
            kop_run(o, round);
            continue;
        }
        if (o->kind == K_AR) {
            float one = (float)(g_rank + 1), sum = 0;
            int n = g_size - 1;
            hvd_status st =
                hvd_allreduce(o->name, &one, &sum, 1, HVD_FLOAT32, HVD_SUM);
            if (st != HVD_OK || sum != (float)(n * (n + 1) / 2))
                fail("round %d '%s' while rank %d is joined: %s, %g", round,
                     o->name, g_size - 1, status_name(st), (double)sum);
            continue;
        }
        kop_fill(o, round);
        hvd_status st = kop_call(o, same, NULL);
        if (st != HVD_ERR_INVALID_ARG || !strstr(hvd_last_error(), "hvd_join"))
            fail("round %d '%s' while rank %d is joined: %s, expected "
                 "HVD_ERR_INVALID_ARG naming hvd_join: \"%s\"",
                 round, o->name, g_size - 1, status_name(st), hvd_last_error());
    }
}

static void test_join(void) {
    int rounds = g_rank == g_size - 1 ? JOIN_SHORT : JOIN_LONG, last = -1;
    struct kop ops[JN_NAMES];
    char name[64];

    for (int i = 0; i < JN_NAMES; i++) {
        snprintf(name, sizeof(name), "jn.%d.%s", i, kind_names[jn_kinds[i]]);
        /* The allreduce is 1 float32 (jn_round's sum while joined). */
        kop_init(&ops[i], name, i, jn_kinds[i],
                 jn_kinds[i] == K_AR ? HVD_FLOAT32 : HVD_INT32, HVD_SUM,
                 jn_kinds[i] == K_AR ? 1 : (size_t)(i * 300 + 1), 0, 0);
    }
    for (int round = 0; round < rounds; round++)
        jn_round(ops, round, round >= JOIN_SHORT);
    hvd_status st = hvd_join(&last);
    if (st != HVD_OK)
        fail("hvd_join: %s: %s", status_name(st), hvd_last_error());
    /* The cache path works again once nobody is joined. */
    for (int round = JOIN_LONG; round < JOIN_LONG + 3; round++)
        jn_round(ops, round, 0);
    for (int i = 0; i < JN_NAMES; i++)
        kop_free(&ops[i]);
}

/* ------------------------------------------------------------------ */
/* threads                                                             */

#define TH_THREADS 2
#define TH_NAMES 6
#define TH_ROUNDS 30
static const int th_kinds[TH_NAMES] = {K_BCAST, K_AG,  K_A2A,
                                       K_RS,    K_GAR, K_GAG};

static void *th_main(void *arg) {
    int t = (int)(intptr_t)arg;
    struct kop ops[TH_NAMES];
    char name[64];

    for (int i = 0; i < TH_NAMES; i++) {
        snprintf(name, sizeof(name), "th.%d.%d", t, i);
        kop_init(&ops[i], name, t * TH_NAMES + i, th_kinds[i],
                 i % 2 ? HVD_INT32 : HVD_FLOAT32, i == 3 ? HVD_MAX : HVD_SUM,
                 i == 1 ? 20000 : (size_t)(i * 37 + 1), i == 3, i % g_size);
    }
    for (int round = 0; round < TH_ROUNDS; round++)
        for (int i = 0; i < TH_NAMES; i++)
            kop_run(&ops[(i + round) % TH_NAMES], round);
    for (int i = 0; i < TH_NAMES; i++)
        kop_free(&ops[i]);
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

#define MX_NAMES 6
#define MX_ROUNDS 30
static const int mx_kinds[MX_NAMES] = {K_BCAST, K_AG, K_A2A, K_RS, K_GRS, K_AG};
static const size_t mx_counts[MX_NAMES] = {3, 64, 12, 5000, 33, 20000};

static void test_mixed(void) {
    struct kop ops[MX_NAMES], side;
    char name[64];

    for (int i = 0; i < MX_NAMES; i++) {
        snprintf(name, sizeof(name), "mx.%d", i);
        kop_init(&ops[i], name, i, mx_kinds[i], HVD_FLOAT32, HVD_SUM,
                 mx_counts[i], i == 3, (i + 1) % g_size);
    }
    kop_init(&side, "mx.side", 40, K_AG, HVD_FLOAT64, HVD_SUM, 3, 0, 0);
    for (int round = 0; round < MX_ROUNDS; round++) {
        int badi = round % 5 == 4 ? (round / 5) % MX_NAMES : -1;
        for (int i = 0; i < MX_NAMES; i++) {
            struct kop *o = &ops[i];
            int way = (g_rank + round + i) % 3;
            struct change ch = same;
            hvd_handle h, hs;
            hvd_status st;

            if (i == badi)
                ch = mm_change(o, o->kind == K_A2A ? 2 : 1);
            /* Every rank submits the side request in every call, before
             * (way 2) or after its own call. */
            kop_fill(&side, round * MX_NAMES + i);
            if (way == 2 && kop_call(&side, same, &hs) != HVD_OK)
                fail("'mx.side': %s", hvd_last_error());
            kop_fill(o, round);
            if (way == 1) {
                st = kop_call(o, g_rank == g_size - 1 ? ch : same, &h);
                if (st == HVD_OK)
                    st = hvd_wait(h);
            } else {
                st = kop_call(o, g_rank == g_size - 1 ? ch : same, NULL);
            }
            if (i == badi) {
                if (st != HVD_ERR_MISMATCH)
                    fail("round %d '%s' (rank %d changed it): %s, expected "
                         "HVD_ERR_MISMATCH: \"%s\"",
                         round, o->name, g_size - 1, status_name(st),
                         hvd_last_error());
            } else {
                if (st != HVD_OK)
                    fail("round %d '%s' (way %d): %s: %s", round, o->name, way,
                         status_name(st), hvd_last_error());
                kop_check(o, round);
            }
            if (way != 2 && kop_call(&side, same, &hs) != HVD_OK)
                fail("'mx.side': %s", hvd_last_error());
            if (hvd_wait(hs) != HVD_OK)
                fail("hvd_wait('mx.side'): %s", hvd_last_error());
            kop_check(&side, round * MX_NAMES + i);
        }
    }
    for (int i = 0; i < MX_NAMES; i++)
        kop_free(&ops[i]);
    kop_free(&side);
}

/* ------------------------------------------------------------------ */
/* A killed rank (run_peer_lost.sh)                                     */

#define PL_ITERS 100000
#define PL_LIMIT_S 5.0
static const int pl_kinds[] = {K_BCAST, K_AG, K_A2A, K_RS, K_GAG, K_BARRIER};
#define PL_KINDS (sizeof(pl_kinds) / sizeof(*pl_kinds))

static int peer_lost(int victim, int after, int names) {
    struct kop ops[PL_KINDS * 4];
    int n = names > 0 && names < (int)PL_KINDS * 4 ? names : (int)PL_KINDS * 4;
    char name[64];
    int it;
    hvd_status st = HVD_OK;

    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "pl.%d", i);
        kop_init(&ops[i], name, i, pl_kinds[i % PL_KINDS], HVD_FLOAT32, HVD_SUM,
                 i / (int)PL_KINDS == 3 ? 20000 : (size_t)(i * 11 + 1), 0, 0);
    }
    double last_ok = now_s();
    for (it = 0; it < PL_ITERS && st == HVD_OK; it++) {
        if (g_rank == victim && it == after) {
            struct timespec wall;
            clock_gettime(CLOCK_REALTIME, &wall);
            printf("VICTIM rank %d raises SIGKILL at iteration %d, time "
                   "%lld.%09ld\n",
                   g_rank, it, (long long)wall.tv_sec, wall.tv_nsec);
            fflush(stdout);
            raise(SIGKILL);
        }
        kop_fill(&ops[it % n], it);
        st = kop_call(&ops[it % n], same, NULL);
        if (st == HVD_OK)
            last_ok = now_s();
    }
    double elapsed = now_s() - last_ok;
    char text[1024];
    snprintf(text, sizeof(text), "%s", hvd_last_error());
    hvd_status again = kop_call(&ops[0], same, NULL);
    double t0 = now_s();
    hvd_shutdown();
    double down = now_s() - t0;
    if (st != HVD_ERR_PEER_LOST || !names_rank(text, victim) ||
        elapsed >= PL_LIMIT_S || again == HVD_OK || down > PL_LIMIT_S) {
        printf("FAIL peer_lost rank %d: iteration %d returned %s after "
               "%.3f s (a later call %s, hvd_shutdown %.3f s), expected "
               "HVD_ERR_PEER_LOST naming rank %d within %.0f s: %s\n",
               g_rank, it - 1, status_name(st), elapsed, status_name(again),
               down, victim, PL_LIMIT_S, text);
        return 1;
    }
    printf("PASS peer_lost rank %d: %.3f s: %s\n", g_rank, elapsed, text);
    for (int i = 0; i < n; i++)
        kop_free(&ops[i]);
    return 0;
}

/* ------------------------------------------------------------------ */

static const struct {
    const char *name;
    void (*run)(void);
    int min_size;
} subtests[] = {
    {"exact", test_exact, 1}, {"mismatch", test_mismatch, 2},
    {"join", test_join, 2},   {"threads", test_threads, 1},
    {"mixed", test_mixed, 2},
};
#define NSUBTESTS (sizeof(subtests) / sizeof(*subtests))

/* KINDS_CARRY_BY_RANK="a,b,...": rank r's HVD_STEP_CARRY_BYTES is the r-th
 * entry (an empty one: the default), so that ranks carry differently: one
 * the counts of an alltoall alone, one nothing, one all of it. */
static void carry_by_rank(void) {
    const char *by = getenv("KINDS_CARRY_BY_RANK"), *rank = getenv("HVD_RANK");
    char entry[32];
    int r;

    if (by == NULL || rank == NULL || parse_int(rank, &r) != 0)
        return;
    for (; r > 0 && by != NULL; r--) {
        by = strchr(by, ',');
        by = by != NULL ? by + 1 : NULL;
    }
    if (by == NULL)
        return;
    size_t n = strcspn(by, ",");
    if (n == 0 || n >= sizeof(entry))
        return;
    memcpy(entry, by, n);
    entry[n] = '\0';
    setenv("HVD_STEP_CARRY_BYTES", entry, 1);
}

int main(int argc, char **argv) {
    int victim = -1, after = -1, names = 0;
    size_t k = 0;
    hvd_status st;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 7 && strcmp(argv[1], "--victim") == 0 &&
        strcmp(argv[3], "--after") == 0 && strcmp(argv[5], "--names") == 0 &&
        parse_int(argv[2], &victim) == 0 && parse_int(argv[4], &after) == 0 &&
        parse_int(argv[6], &names) == 0) {
        g_subtest = "peer_lost";
        signal(SIGTERM, SIG_IGN);
    } else {
        for (k = 0; argc == 2 && k < NSUBTESTS; k++)
            if (strcmp(argv[1], subtests[k].name) == 0)
                break;
        if (argc != 2 || k == NSUBTESTS) {
            fprintf(stderr,
                    "usage: %s exact|mismatch|join|threads|mixed\n"
                    "       %s --victim R --after K --names M\n",
                    argv[0], argv[0]);
            return 2;
        }
        g_subtest = subtests[k].name;
    }
    carry_by_rank();
    st = hvd_init();
    if (st != HVD_OK)
        fail("hvd_init: %s: %s", status_name(st), hvd_last_error());
    g_rank = hvd_rank();
    g_size = hvd_size();
    if (g_size > MAXR)
        fail("at most %d ranks", MAXR);
    if (victim >= 0) {
        if (victim >= g_size || g_size < 2)
            fail("needs --victim < size and size >= 2");
        return peer_lost(victim, after, names);
    }
    if (g_size < subtests[k].min_size) {
        printf("SKIP kinds %s rank %d: needs %d ranks\n", g_subtest, g_rank,
               subtests[k].min_size);
        hvd_shutdown();
        return EXIT_SKIP;
    }
    subtests[k].run();
    st = hvd_shutdown();
    if (st != HVD_OK)
        fail("hvd_shutdown: %s: %s", status_name(st), hvd_last_error());
    printf("PASS kinds %s rank %d\n", g_subtest, g_rank);
    return 0;
}
