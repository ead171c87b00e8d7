/*
 * The path selector: cost model, table, tuning files, and the start-up
 * measurement (select.h).
 */
#include "collectives/select.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* Native collectives are assumed a little better than ours on the same
 * link, so that auto takes MPI's own where MPI is the transport. */
#define NATIVE_FACTOR 0.9

int hvd_sel_bucket(size_t bytes) {
    int b = 0;
    while (b < HVD_SEL_BUCKETS - 1 && ((size_t)1 << b) < bytes)
        b++;
    return b;
}

static const char *const kind_names[HVD_COLL_NKINDS] = {
    "allreduce", "allgather", "broadcast"};
static const char *const class_names[HVD_NCLASSES] = {"same-host", "other-host",
                                                      "cross"};

const char *hvd_coll_kind_name(hvd_coll_kind kind) {
    return (unsigned)kind < HVD_COLL_NKINDS ? kind_names[kind] : "unknown";
}

const char *hvd_peer_class_name(hvd_peer_class cls) {
    return (unsigned)cls < HVD_NCLASSES ? class_names[cls] : "unknown";
}

/* ------------------------------------------------------------------ */
/* The model                                                           */

static int class_size(const hvd_model *m, hvd_peer_class cls) {
    switch (cls) {
    case HVD_CLASS_SAME_HOST:
        return m->cross_size == 1 ? m->size : m->local_size;
    case HVD_CLASS_OTHER_HOST:
        return m->cross_size > 1 ? m->size : 0;
    default:
        return m->cross_size > 1 && m->local_size > 0 ? m->cross_size : 0;
    }
}

static int ceil_log2(int p) {
    int k = 0;
    while ((1 << k) < p)
        k++;
    return k;
}

static int floor_pow2(int p) {
    int p2 = 1;
    while (p2 * 2 <= p)
        p2 *= 2;
    return p2;
}

/* The link of class cls: the middle of hier runs on the other-host link. */
static const hvd_link *link_of(const hvd_model *m, int tp, hvd_peer_class cls) {
    if (cls == HVD_CLASS_CROSS)
        cls = HVD_CLASS_OTHER_HOST;
    return &m->link[tp][cls];
}

/* Flat allreduce algorithms over one link. */
static double flat_allreduce(hvd_algo algo, int p, const hvd_link *l,
                             double gamma, double n) {
    double a = l->alpha, b = l->beta;
    int p2 = floor_pow2(p);
    double fold = p != p2 ? 2 * (a + n * b) + n * gamma : 0;

    switch (algo) {
    case HVD_ALGO_RING:
        return 2.0 * (p - 1) * a + 2.0 * (p - 1) / p * n * b +
               (double)(p - 1) / p * n * gamma;
    case HVD_ALGO_RD:
        return fold + ceil_log2(p2) * (a + n * b + n * gamma);
    case HVD_ALGO_RABENSEIFNER:
        return fold + 2.0 * ceil_log2(p2) * a + 2.0 * (p2 - 1) / p2 * n * b +
               (double)(p2 - 1) / p2 * n * gamma;
    default:
        return -1;
    }
}

static double min_flat_allreduce(int p, const hvd_link *l, double gamma,
                                 double n) {
    double best = flat_allreduce(HVD_ALGO_RING, p, l, gamma, n);
    double rd = flat_allreduce(HVD_ALGO_RD, p, l, gamma, n);
    double rab = flat_allreduce(HVD_ALGO_RABENSEIFNER, p, l, gamma, n);
    if (rd < best)
        best = rd;
    if (rab < best)
        best = rab;
    return best;
}

/* Reduce-scatter plus allgather among one host's L ranks over shm. */
static double local_phases(const hvd_model *m, int L, double n) {
    const hvd_link *l = &m->link[HVD_TP_SHM][HVD_CLASS_SAME_HOST];
    if (L <= 1)
        return 0;
    if (m->direct)
        return 3 * l->alpha + 2.0 * (L - 1) / L * n * m->get_beta +
               (double)(L - 1) / L * n * m->gamma;
    return 2.0 * (L - 1) * l->alpha + 2.0 * (L - 1) / L * n * l->beta +
           (double)(L - 1) / L * n * m->gamma;
}

double hvd_model_cost(const hvd_model *m, hvd_coll_kind kind,
                      hvd_peer_class cls, int tp, hvd_algo algo, size_t bytes) {
    int p = class_size(m, cls);
    const hvd_link *l;
    double n = (double)bytes;

    if (p < 2 || tp < 0 || tp >= HVD_NTPS)
        return -1;
    l = link_of(m, tp, cls);
    if (l->alpha < 0)
        return -1;
    /* Algorithms that need something particular. */
    if (algo == HVD_ALGO_NATIVE &&
        (tp != HVD_TP_NET || !m->native || cls == HVD_CLASS_CROSS))
        return -1;
    if (algo == HVD_ALGO_DIRECT &&
        (tp != HVD_TP_SHM || !m->direct || cls != HVD_CLASS_SAME_HOST))
        return -1;
    if (algo == HVD_ALGO_HIER &&
        (tp != HVD_TP_NET || !m->hier || cls != HVD_CLASS_OTHER_HOST ||
         kind != HVD_COLL_ALLREDUCE))
        return -1;

    switch (kind) {
    case HVD_COLL_ALLREDUCE:
        switch (algo) {
        case HVD_ALGO_RING:
        case HVD_ALGO_RD:
        case HVD_ALGO_RABENSEIFNER:
            return flat_allreduce(algo, p, l, m->gamma, n);
        case HVD_ALGO_DIRECT:
            return 3 * l->alpha + 2.0 * (p - 1) / p * n * m->get_beta +
                   (double)(p - 1) / p * n * m->gamma;
        case HVD_ALGO_NATIVE:
            return NATIVE_FACTOR * min_flat_allreduce(p, l, m->gamma, n);
        case HVD_ALGO_HIER: {
            int L = m->local_size, C = m->cross_size;
            const hvd_link *x = &m->link[HVD_TP_NET][HVD_CLASS_OTHER_HOST];
            double shard = n / L;
            return local_phases(m, L, n) +
                   (C > 1 ? min_flat_allreduce(C, x, m->gamma, shard) : 0);
        }
        default:
            return -1;
        }
    case HVD_COLL_ALLGATHER: /* n: the gathered total */
        switch (algo) {
        case HVD_ALGO_RING:
            return (p - 1) * (l->alpha + n / p * l->beta);
        case HVD_ALGO_DIRECT:
            return 2 * l->alpha + (double)(p - 1) / p * n * m->get_beta;
        case HVD_ALGO_NATIVE:
            return NATIVE_FACTOR * (p - 1) * (l->alpha + n / p * l->beta);
        default:
            return -1;
        }
    case HVD_COLL_BROADCAST: {
        double tree = ceil_log2(p) * (l->alpha + n * l->beta);
        double c = m->chunk[tp] > 0 ? m->chunk[tp] : 512 * 1024;
        double k = ceil(n / c);
        if (k < 1)
            k = 1;
        switch (algo) {
        case HVD_ALGO_TREE:
            return tree;
        case HVD_ALGO_PIPELINE:
            return (p - 2 + k) * (l->alpha + (n < c ? n : c) * l->beta);
        case HVD_ALGO_DIRECT:
            return 2 * l->alpha + n * m->get_beta;
        case HVD_ALGO_NATIVE:
            return NATIVE_FACTOR * tree;
        default:
            return -1;
        }
    }
    default:
        return -1;
    }
}

/* Candidates of each kind; on a tie the earlier wins. The ring comes
 * before Rabenseifner: where their modelled costs are equal (always at
 * p = 2, where Rabenseifner is one exchange of halves) the ring is the
 * faster, because it pipelines its chunks and reduces each while the next
 * is on the wire, where Rabenseifner receives a whole window before it
 * reduces it (np 2 over TCP, 8-128 MiB: 1.3-1.4x, docs/benchmarks.md). */
static const hvd_algo cand_allreduce[] = {
    HVD_ALGO_NATIVE, HVD_ALGO_DIRECT,       HVD_ALGO_RD,
    HVD_ALGO_RING,   HVD_ALGO_RABENSEIFNER, HVD_ALGO_HIER};
static const hvd_algo cand_allgather[] = {HVD_ALGO_NATIVE, HVD_ALGO_DIRECT,
                                          HVD_ALGO_RING};
static const hvd_algo cand_broadcast[] = {HVD_ALGO_NATIVE, HVD_ALGO_DIRECT,
                                          HVD_ALGO_TREE, HVD_ALGO_PIPELINE};

static void candidates(hvd_coll_kind kind, const hvd_algo **list, size_t *n) {
    switch (kind) {
    case HVD_COLL_ALLREDUCE:
        *list = cand_allreduce;
        *n = sizeof(cand_allreduce) / sizeof(cand_allreduce[0]);
        break;
    case HVD_COLL_ALLGATHER:
        *list = cand_allgather;
        *n = sizeof(cand_allgather) / sizeof(cand_allgather[0]);
        break;
    default:
        *list = cand_broadcast;
        *n = sizeof(cand_broadcast) / sizeof(cand_broadcast[0]);
        break;
    }
}

static size_t bucket_bytes(int b) { return (size_t)1 << b; }

/* The cheapest (tp, algo) for an entry, among algos allowed by only
 * (HVD_ALGO_ANY: any). Returns 0 if none can run. */
static int cheapest(const hvd_model *m, hvd_coll_kind kind, hvd_peer_class cls,
                    int b, hvd_algo only, hvd_choice *out) {
    const hvd_algo *list;
    size_t n;
    double best = -1;

    candidates(kind, &list, &n);
    for (int tp = 0; tp < HVD_NTPS; tp++) {
        for (size_t i = 0; i < n; i++) {
            if (only != HVD_ALGO_ANY && list[i] != only)
                continue;
            double c =
                hvd_model_cost(m, kind, cls, tp, list[i], bucket_bytes(b));
            if (c >= 0 && (best < 0 || c < best)) {
                best = c;
                out->tp = (uint8_t)tp;
                out->algo = (uint8_t)list[i];
                out->chunk = m->chunk[tp];
                out->tuned = 0;
            }
        }
    }
    return best >= 0;
}

static hvd_algo fallback_algo(hvd_coll_kind kind) {
    return kind == HVD_COLL_BROADCAST ? HVD_ALGO_TREE : HVD_ALGO_RING;
}

void hvd_select_from_model(const hvd_model *m, hvd_selector *sel) {
    for (int k = 0; k < HVD_COLL_NKINDS; k++) {
        for (int c = 0; c < HVD_NCLASSES; c++) {
            for (int b = 0; b < HVD_SEL_BUCKETS; b++) {
                hvd_choice *e = &sel->t[k][c][b];
                memset(e, 0, sizeof(*e));
                if (!cheapest(m, (hvd_coll_kind)k, (hvd_peer_class)c, b,
                              HVD_ALGO_ANY, e)) {
                    /* A class this job does not have. */
                    e->tp = HVD_TP_NET;
                    e->algo = (uint8_t)fallback_algo((hvd_coll_kind)k);
                    e->chunk = m->chunk[HVD_TP_NET];
                }
            }
        }
    }
}

int hvd_select_force(const hvd_model *m, hvd_selector *sel, hvd_coll_kind kind,
                     hvd_algo algo) {
    int set = 0;
    for (int c = 0; c < HVD_NCLASSES; c++) {
        for (int b = 0; b < HVD_SEL_BUCKETS; b++) {
            hvd_choice e;
            if (cheapest(m, kind, (hvd_peer_class)c, b, algo, &e)) {
                sel->t[kind][c][b] = e;
                set++;
            }
        }
    }
    return set;
}

/* ------------------------------------------------------------------ */
/* Tuning files                                                        */

static int lookup(const char *const *names, int n, const char *word) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], word) == 0)
            return i;
    return -1;
}

int hvd_select_parse(const char *text, const hvd_model *m, hvd_selector *sel,
                     char *err, size_t errlen) {
    int prev_kind = -1, prev_cls = -1, next_bucket = 0;
    int lineno = 0;
    const char *line = text;

    while (line != NULL && *line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char buf[256], kw[32], cw[32], tw[32], aw[32], extra[8];
        unsigned long long maxb, chunk;
        int k, c, tp, nf;
        hvd_algo algo;

        lineno++;
        if (len >= sizeof(buf)) {
            snprintf(err, errlen, "line %d is too long", lineno);
            return -1;
        }
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = end != NULL ? end + 1 : NULL;
        char *hash = strchr(buf, '#');
        if (hash != NULL)
            *hash = '\0';
        nf = sscanf(buf, "%31s %31s %llu %31s %31s %llu %7s", kw, cw, &maxb, tw,
                    aw, &chunk, extra);
        if (nf <= 0)
            continue; /* blank or comment */
        if (nf != 6) {
            snprintf(err, errlen,
                     "line %d: want <collective> <class> <max bytes> "
                     "<transport> <algorithm> <chunk bytes>",
                     lineno);
            return -1;
        }
        k = lookup(kind_names, HVD_COLL_NKINDS, kw);
        c = lookup(class_names, HVD_NCLASSES, cw);
        if (k < 0 || c < 0) {
            snprintf(err, errlen, "line %d: unknown %s '%s'", lineno,
                     k < 0 ? "collective" : "class", k < 0 ? kw : cw);
            return -1;
        }
        if (strcmp(tw, "shm") == 0)
            tp = HVD_TP_SHM;
        else if (strcmp(tw, "net") == 0 || strcmp(tw, "tcp") == 0 ||
                 strcmp(tw, "mpi") == 0)
            tp = HVD_TP_NET;
        else {
            snprintf(err, errlen, "line %d: unknown transport '%s'", lineno,
                     tw);
            return -1;
        }
        if (hvd_algo_parse(aw, &algo) != 0 || algo == HVD_ALGO_UNFORCED) {
            snprintf(err, errlen, "line %d: unknown algorithm '%s'", lineno,
                     aw);
            return -1;
        }
        if (chunk < 64 || chunk > (1ULL << 30)) {
            snprintf(err, errlen, "line %d: chunk %llu is not in [64, 1G]",
                     lineno, chunk);
            return -1;
        }
        if (k != prev_kind || c != prev_cls)
            next_bucket = 0;
        prev_kind = k;
        prev_cls = c;
        int last = maxb >= ((1ULL << (HVD_SEL_BUCKETS - 1)))
                       ? HVD_SEL_BUCKETS - 1
                       : hvd_sel_bucket((size_t)maxb);
        /* Entries the job cannot run stay as the model has them. */
        int runnable = hvd_model_cost(m, (hvd_coll_kind)k, (hvd_peer_class)c,
                                      tp, algo, 1) >= 0;
        for (int b = next_bucket; b <= last; b++) {
            if (!runnable)
                continue;
            hvd_choice *e = &sel->t[k][c][b];
            e->tp = (uint8_t)tp;
            e->algo = (uint8_t)algo;
            e->chunk = (uint32_t)chunk;
            e->tuned = 1;
        }
        if (last + 1 > next_bucket)
            next_bucket = last + 1;
    }
    return 0;
}

size_t hvd_select_format(const hvd_selector *sel, char *out, size_t outlen) {
    size_t off = 0;
    int n;

#define ADD(...)                                                               \
    do {                                                                       \
        n = snprintf(out + (off < outlen ? off : outlen),                      \
                     off < outlen ? outlen - off : 0, __VA_ARGS__);            \
        if (n > 0)                                                             \
            off += (size_t)n;                                                  \
    } while (0)

    ADD("# hvd tuning file: <collective> <class> <max bytes> <transport> "
        "<algorithm> <chunk bytes>\n");
    for (int k = 0; k < HVD_COLL_NKINDS; k++) {
        for (int c = 0; c < HVD_NCLASSES; c++) {
            for (int b = 0; b < HVD_SEL_BUCKETS; b++) {
                const hvd_choice *e = &sel->t[k][c][b];
                const hvd_choice *nx =
                    b + 1 < HVD_SEL_BUCKETS ? &sel->t[k][c][b + 1] : NULL;
                if (nx != NULL && nx->tp == e->tp && nx->algo == e->algo &&
                    nx->chunk == e->chunk)
                    continue;
                ADD("%s %s %llu %s %s %u\n", kind_names[k], class_names[c],
                    b == HVD_SEL_BUCKETS - 1 ? (unsigned long long)-1 >> 1
                                             : (unsigned long long)1 << b,
                    e->tp == HVD_TP_SHM ? "shm" : "net",
                    hvd_algo_name((hvd_algo)e->algo), e->chunk);
            }
        }
    }
#undef ADD
    return off;
}

/* ------------------------------------------------------------------ */
/* Measuring at start-up                                               */

#define SMALL_REPS 10
#define LARGE_BYTES (1024 * 1024)
#define LARGE_REPS 3
/* Once this long has gone on round trips of one size (and one has been
 * timed after the warm-up), no more are started: over a slow link (a
 * 20 ms, 2 % loss link moves 1 MiB in about a second each way) the
 * measurement would otherwise hold hvd_init for ten seconds. */
#define MEASURE_BUDGET_NS (1000 * 1000000LL)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Round trips of n bytes between comm ranks a (who starts) and b; the
 * median (more than 3 timed) or the best one, in seconds. Rank a ends
 * early once MEASURE_BUDGET_NS is spent, and says so in the first byte of
 * its message (1: more follow, 2: the last), so that b ends with it. */
static hvd_status round_trips(hvd_comm *c, int a, int b, uint8_t *buf, size_t n,
                              int reps, double *out) {
    double t[SMALL_REPS + 1];
    int me = c->rank, peer = me == a ? b : a, timed = 0;
    hvd_req *req = c->reqs;
    int64_t start = hvd_now_ns();

    for (int i = 0, last = 0; i <= reps && !last; i++) {
        int64_t t0 = hvd_now_ns();
        hvd_status st;
        if (me == a) {
            last = i == reps || (i >= 1 && t0 - start > MEASURE_BUDGET_NS);
            buf[0] = last ? 2 : 1;
            st = hvd_comm_isend(c, peer, buf, n, &req[0]);
            if (st == HVD_OK)
                st = hvd_comm_wait(c, &req[0]);
            if (st == HVD_OK)
                st = hvd_comm_irecv(c, peer, buf, n, &req[1]);
            if (st == HVD_OK)
                st = hvd_comm_wait(c, &req[1]);
        } else {
            st = hvd_comm_irecv(c, peer, buf, n, &req[1]);
            if (st == HVD_OK)
                st = hvd_comm_wait(c, &req[1]);
            last = buf[0] == 2;
            if (st == HVD_OK)
                st = hvd_comm_isend(c, peer, buf, n, &req[0]);
            if (st == HVD_OK)
                st = hvd_comm_wait(c, &req[0]);
        }
        if (st != HVD_OK)
            return st;
        if (i > 0) /* the first warms up */
            t[timed++] = (double)(hvd_now_ns() - t0) * 1e-9;
    }
    if (timed == 0) /* reps 0: nothing was timed */
        t[timed++] = 0;
    qsort(t, (size_t)timed, sizeof(t[0]), cmp_double);
    *out = timed > 3 ? t[timed / 2] : t[0];
    return HVD_OK;
}

/* Alpha and beta of the link between comm ranks a and b. */
static hvd_status measure_link(hvd_comm *c, int a, int b, uint8_t *buf,
                               hvd_link *out) {
    double small, large;
    hvd_status st = round_trips(c, a, b, buf, 8, SMALL_REPS, &small);
    if (st == HVD_OK)
        st = round_trips(c, a, b, buf, LARGE_BYTES, LARGE_REPS, &large);
    if (st != HVD_OK)
        return st;
    out->alpha = small / 2;
    out->beta = (large / 2 - out->alpha) / LARGE_BYTES;
    if (out->beta <= 0)
        out->beta = 1e-12;
    return HVD_OK;
}

/* Seconds a byte of one-sided read: rank b publishes a buffer, rank a reads
 * it LARGE_REPS times. */
static hvd_status measure_get(hvd_comm *c, int a, int b, uint8_t *buf,
                              double *out) {
    hvd_req *req = c->reqs;
    uint64_t addr = (uint64_t)(uintptr_t)buf;
    hvd_status st;
    static char none;

    if (c->rank == b) {
        st = hvd_comm_isend(c, a, &addr, sizeof(addr), &req[0]);
        if (st == HVD_OK)
            st = hvd_comm_irecv(c, a, &none, 0, &req[1]);
        return st == HVD_OK ? hvd_comm_waitall(c, req, 2) : st;
    }
    uint8_t *mine = buf + LARGE_BYTES;
    double best = 0;
    st = hvd_comm_irecv(c, b, &addr, sizeof(addr), &req[0]);
    if (st == HVD_OK)
        st = hvd_comm_wait(c, &req[0]);
    for (int i = 0; st == HVD_OK && i <= LARGE_REPS; i++) {
        int64_t t0 = hvd_now_ns();
        st = hvd_comm_get(c, b, mine, addr, LARGE_BYTES);
        double t = (double)(hvd_now_ns() - t0) * 1e-9;
        if (i > 0 && (best == 0 || t < best))
            best = t;
    }
    hvd_status st2 = hvd_comm_isend(c, b, &none, 0, &req[1]);
    if (st2 == HVD_OK)
        st2 = hvd_comm_wait(c, &req[1]);
    if (st == HVD_OK)
        st = st2;
    *out = best / LARGE_BYTES;
    return st;
}

/* Comm rank of transport rank world in c, or -1. */
static int comm_rank_of(const hvd_comm *c, int world) {
    for (int i = 0; i < c->size; i++)
        if (hvd_comm_peer(c, i) == world)
            return i;
    return -1;
}

/* Rank 0's measurements, with the partners' help. */
static hvd_status measure(hvd_paths *paths, hvd_comm *net, int same_peer,
                          int other_peer, hvd_model *m) {
    uint8_t *buf = NULL;
    hvd_status st = HVD_OK;
    int me = net->rank;
    hvd_comm *shm = paths->shm != NULL ? paths->shm : paths->local;

    if (me != 0 && me != same_peer && me != other_peer)
        return HVD_OK;
    buf = calloc(2, LARGE_BYTES);
    if (buf == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (same_peer > 0 && (me == 0 || me == same_peer)) {
        /* Over the primary only where it serves same-host peers itself. */
        if (paths->single_host)
            st = measure_link(net, 0, same_peer, buf,
                              &m->link[HVD_TP_NET][HVD_CLASS_SAME_HOST]);
        if (st == HVD_OK && shm != NULL) {
            int a = comm_rank_of(shm, 0), b = comm_rank_of(shm, same_peer);
            st = measure_link(shm, a, b, buf,
                              &m->link[HVD_TP_SHM][HVD_CLASS_SAME_HOST]);
            if (st == HVD_OK && m->direct)
                st = measure_get(shm, a, b, buf, &m->get_beta);
        }
    }
    if (st == HVD_OK && other_peer > 0 && (me == 0 || me == other_peer))
        st = measure_link(net, 0, other_peer, buf,
                          &m->link[HVD_TP_NET][HVD_CLASS_OTHER_HOST]);
    if (st == HVD_OK && me == 0) {
        /* Reduction: float32 sum over a cache-sized buffer. */
        size_t n = 256 * 1024 / sizeof(float);
        double best = 0;
        for (int i = 0; i < 4; i++) {
            int64_t t0 = hvd_now_ns();
            hvd_reduce(buf, buf, buf + LARGE_BYTES, n, HVD_FLOAT32, HVD_SUM);
            double t = (double)(hvd_now_ns() - t0) * 1e-9;
            if (i > 0 && (best == 0 || t < best))
                best = t;
        }
        m->gamma = best / (double)(n * sizeof(float));
    }
    free(buf);
    return st;
}

static hvd_status read_file(const char *path, char **out) {
    FILE *f = fopen(path, "r");
    char *text = NULL;
    size_t len = 0;

    if (f == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "HVD_TUNING_FILE=%s cannot be read: %s", path,
                             strerror(errno));
    text = malloc(64 * 1024 + 1);
    if (text == NULL) {
        fclose(f);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    len = fread(text, 1, 64 * 1024, f);
    if (!feof(f)) {
        fclose(f);
        free(text);
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "HVD_TUNING_FILE=%s is larger than 64 KiB: not a "
                             "tuning file",
                             path);
    }
    fclose(f);
    text[len] = '\0';
    *out = text;
    return HVD_OK;
}

hvd_status hvd_paths_tune(hvd_paths *paths, hvd_comm *net, hvd_algo forced,
                          hvd_algo forced_bcast, const char *tuning_path) {
    hvd_model *m = &paths->model;
    int same_peer = -1, other_peer = -1;
    uint64_t text_len = 0;
    char *text = NULL;
    char err[256];
    hvd_status st = HVD_OK;

    /* The partners: the first same-host and other-host ranks of rank 0. */
    if (paths->single_host) {
        same_peer = paths->shm != NULL || net->size > 1 ? 1 : -1;
    } else {
        if (paths->local != NULL && paths->local->size > 1)
            same_peer = hvd_comm_peer(paths->local, 1);
        /* local->map[0] is this host's first rank; rank 0's host's first
         * other rank is local rank 1 of host 0, which every rank can name
         * only on host 0: rank 0 learns it here and tells the others. */
    }
    {
        /* Every rank must know the partners: rank 0 decides. */
        int32_t peers[2] = {same_peer, -1};
        if (net->rank == 0 && !paths->single_host && paths->cross != NULL &&
            paths->cross->size > 1)
            peers[1] = hvd_comm_peer(paths->cross, 1);
        st = hvd_tree_broadcast(net, peers, sizeof(peers), 0);
        if (st != HVD_OK)
            return st;
        same_peer = peers[0];
        other_peer = peers[1];
    }
    if (net->rank == 0 || net->rank == same_peer || net->rank == other_peer)
        st = measure(paths, net, same_peer, other_peer, m);
    if (st == HVD_OK && net->rank == 0 && tuning_path != NULL &&
        tuning_path[0] != '\0') {
        st = read_file(tuning_path, &text);
        if (st == HVD_OK)
            text_len = strlen(text);
    }
    /* A rank that failed still takes part in the broadcasts below, so that
     * nobody waits for it; rank 0 sends a zeroed model then. */
    {
        hvd_model got = *m;
        hvd_status bst = hvd_tree_broadcast(net, &got, sizeof(got), 0);
        if (bst == HVD_OK)
            bst = hvd_tree_broadcast(net, &text_len, sizeof(text_len), 0);
        if (bst != HVD_OK) {
            free(text);
            return bst;
        }
        if (net->rank != 0 && text_len > 0) {
            text = malloc(text_len + 1);
            if (text == NULL) {
                free(text);
                return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
            }
            text[text_len] = '\0';
        }
        if (text_len > 0) {
            bst = hvd_tree_broadcast(net, text, text_len, 0);
            if (bst != HVD_OK) {
                free(text);
                return bst;
            }
        }
        *m = got;
    }
    if (st != HVD_OK) {
        free(text);
        return st;
    }
    hvd_select_from_model(m, &paths->sel);
    if (text != NULL &&
        hvd_select_parse(text, m, &paths->sel, err, sizeof(err)) != 0) {
        free(text);
        return hvd_error_set(HVD_ERR_INVALID_ARG, "HVD_TUNING_FILE=%s: %s",
                             tuning_path != NULL ? tuning_path : "(rank 0's)",
                             err);
    }
    free(text);
    if (forced != HVD_ALGO_UNFORCED) {
        if (hvd_select_force(m, &paths->sel, HVD_COLL_ALLREDUCE, forced) == 0)
            return hvd_error_set(
                HVD_ERR_UNSUPPORTED,
                "HVD_ALGORITHM=%s cannot run in this job (%d ranks on %d "
                "hosts%s%s): unset it or choose another",
                hvd_algo_name(forced), m->size, m->cross_size,
                m->direct ? "" : ", no one-sided shared-memory reads",
                m->native ? ", native collectives" : "");
        if (forced == HVD_ALGO_RING || forced == HVD_ALGO_DIRECT ||
            forced == HVD_ALGO_NATIVE)
            hvd_select_force(m, &paths->sel, HVD_COLL_ALLGATHER, forced);
    }
    if (forced_bcast != HVD_ALGO_UNFORCED &&
        hvd_select_force(m, &paths->sel, HVD_COLL_BROADCAST, forced_bcast) == 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_BCAST_ALGORITHM=%s cannot run in this job: "
                             "unset it or choose another",
                             hvd_algo_name(forced_bcast));
    if (hvd_log_current >= HVD_LOG_DEBUG && net->rank == 0) {
        char table[8192];
        hvd_select_format(&paths->sel, table, sizeof(table));
        HVD_DEBUG("select",
                  "model: net alpha %.1f us beta %.3f ns/B (same host), "
                  "%.1f us %.3f ns/B (other host); shm %.1f us %.3f ns/B; "
                  "get %.3f ns/B; reduce %.3f ns/B; table:\n%s",
                  m->link[HVD_TP_NET][HVD_CLASS_SAME_HOST].alpha * 1e6,
                  m->link[HVD_TP_NET][HVD_CLASS_SAME_HOST].beta * 1e9,
                  m->link[HVD_TP_NET][HVD_CLASS_OTHER_HOST].alpha * 1e6,
                  m->link[HVD_TP_NET][HVD_CLASS_OTHER_HOST].beta * 1e9,
                  m->link[HVD_TP_SHM][HVD_CLASS_SAME_HOST].alpha * 1e6,
                  m->link[HVD_TP_SHM][HVD_CLASS_SAME_HOST].beta * 1e9,
                  m->get_beta * 1e9, m->gamma * 1e9, table);
    }
    return HVD_OK;
}

void hvd_paths_clear(hvd_paths *paths) {
    if (paths == NULL)
        return;
    hvd_comm_destroy(paths->shm);
    hvd_comm_destroy(paths->local);
    hvd_comm_destroy(paths->cross);
    paths->shm = paths->local = paths->cross = NULL;
}
