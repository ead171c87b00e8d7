/*
 * The collective algorithms against an in-memory transport: one thread per
 * rank, messages copied through mutex-protected queues. This checks the
 * algorithms' index arithmetic for every count and rank count (1 to 7),
 * chunk sizes down to the minimum, pipeline depths 1 to 4, forced
 * algorithms (ring, recursive doubling, Rabenseifner, direct one-sided
 * reads, tree, chain), every root, in place and out of place,
 * independently of any real transport.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include <cmocka.h>

#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "transport/base/error.h"

#define MAXP 7

/* ---- the in-memory transport ---- */

/*
 * Flow control as a socket's: a send completes once the bytes queued ahead
 * of it, itself included, fit in BUFFERED (the kernel took it), or once
 * the receiver has taken it. A message larger than BUFFERED completes only
 * when received, so an algorithm that blocks on sends before posting the
 * receives its peer needs deadlocks here, as it would over TCP.
 */
#define BUFFERED 512

typedef struct msg {
    struct msg *next;
    size_t len;
    hvd_req *sreq;
    int sender_done; /* the sender has completed sreq */
    int consumed;    /* the receiver has taken it */
    uint8_t data[];
} msg;

typedef struct world {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    msg *head[MAXP][MAXP]; /* [src][dst] */
    msg *tail[MAXP][MAXP];
    msg *taken[MAXP][MAXP]; /* consumed, sender not told yet */
} world;

typedef struct posted {
    void *buf;
    size_t len;
    hvd_req *req;
} posted;

typedef struct fake {
    hvd_transport base;
    world *w;
    int rank;
    posted recvs[MAXP][64]; /* per source, FIFO */
    int nrecv[MAXP];
} fake;

static int complete_sends(fake *f);

static hvd_status fake_isend(hvd_transport *t, int peer, int channel,
                             const void *buf, size_t len, hvd_req *req) {
    fake *f = (fake *)t;

    (void)channel; /* one channel is enough for the algorithms */
    msg *m = malloc(sizeof(*m) + len + 1);

    if (m == NULL)
        return HVD_ERR_NO_MEMORY;
    m->next = NULL;
    m->len = len;
    m->sreq = req;
    m->sender_done = 0;
    m->consumed = 0;
    req->status = HVD_OK;
    req->done = 0;
    if (len)
        memcpy(m->data, buf, len);
    pthread_mutex_lock(&f->w->mu);
    if (f->w->tail[f->rank][peer])
        f->w->tail[f->rank][peer]->next = m;
    else
        f->w->head[f->rank][peer] = m;
    f->w->tail[f->rank][peer] = m;
    complete_sends(f);
    pthread_cond_broadcast(&f->w->cv);
    pthread_mutex_unlock(&f->w->mu);
    return HVD_OK;
}

/* Completes this rank's sends the "kernel" has taken; caller holds the
 * lock. Only the sender's thread writes its requests. */
static int complete_sends(fake *f) {
    int n = 0;

    for (int dst = 0; dst < f->w->size; dst++) {
        size_t ahead = 0;
        for (msg *m = f->w->head[f->rank][dst]; m != NULL; m = m->next) {
            ahead += m->len;
            if (ahead > BUFFERED)
                break;
            if (!m->sender_done) {
                m->sender_done = 1;
                m->sreq->done = 1;
                n++;
            }
        }
        msg **pp = &f->w->taken[f->rank][dst];
        while (*pp != NULL) {
            msg *m = *pp;
            *pp = m->next;
            if (!m->sender_done) {
                m->sreq->done = 1;
                n++;
            }
            free(m);
        }
    }
    return n;
}

/* Matches queued messages with posted receives; caller holds the lock. */
static int match(fake *f) {
    int matched = 0;

    for (int src = 0; src < f->w->size; src++) {
        while (f->nrecv[src] > 0 && f->w->head[src][f->rank] != NULL) {
            msg *m = f->w->head[src][f->rank];
            posted p = f->recvs[src][0];
            f->w->head[src][f->rank] = m->next;
            if (m->next == NULL)
                f->w->tail[src][f->rank] = NULL;
            memmove(f->recvs[src], f->recvs[src] + 1,
                    (size_t)(--f->nrecv[src]) * sizeof(posted));
            if (m->len != p.len) {
                fprintf(stderr,
                        "rank %d: message of %zu bytes from %d, "
                        "expected %zu\n",
                        f->rank, m->len, src, p.len);
                p.req->status = HVD_ERR_MISMATCH;
            } else {
                if (m->len)
                    memcpy(p.buf, m->data, m->len);
                p.req->status = HVD_OK;
            }
            p.req->done = 1;
            if (m->sender_done) {
                free(m);
            } else {
                m->next = f->w->taken[src][f->rank];
                f->w->taken[src][f->rank] = m;
            }
            pthread_cond_broadcast(&f->w->cv);
            matched++;
        }
    }
    return matched;
}

static hvd_status fake_irecv(hvd_transport *t, int peer, int channel, void *buf,
                             size_t len, hvd_req *req) {
    fake *f = (fake *)t;

    (void)channel;

    if (f->nrecv[peer] == 64)
        return HVD_ERR_INTERNAL;
    req->done = 0;
    f->recvs[peer][f->nrecv[peer]++] = (posted){buf, len, req};
    pthread_mutex_lock(&f->w->mu);
    match(f);
    pthread_mutex_unlock(&f->w->mu);
    return HVD_OK;
}

static hvd_status fake_progress(hvd_transport *t, int timeout_ms) {
    fake *f = (fake *)t;

    pthread_mutex_lock(&f->w->mu);
    if (match(f) + complete_sends(f) == 0 && timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&f->w->cv, &f->w->mu, &ts);
        match(f);
        complete_sends(f);
    }
    pthread_mutex_unlock(&f->w->mu);
    return HVD_OK;
}

/* One-sided reads: the ranks are threads of one process. */
static hvd_status fake_get(hvd_transport *t, int peer, void *buf,
                           uint64_t remote, size_t len) {
    (void)t, (void)peer;
    memcpy(buf, (const void *)(uintptr_t)remote, len);
    return HVD_OK;
}

static int fake_can_get(hvd_transport *t, int peer) {
    (void)t, (void)peer;
    return 1;
}

static const hvd_transport_ops fake_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "fake",
    .isend = fake_isend,
    .irecv = fake_irecv,
    .progress = fake_progress,
    .get = fake_get,
    .can_get = fake_can_get,
};

/* ---- expected values ---- */

static double value(int r, size_t i, hvd_op op, int p) {
    switch (op) {
    case HVD_ADASUM: /* not used here */
    case HVD_SUM:
        return (double)((i * 7 + (size_t)r * 3) % 5);
    case HVD_AVERAGE:
        return (double)(p * (int)((i * 7 + (size_t)r * 3) % 5));
    case HVD_MIN:
    case HVD_MAX:
        return (double)((i * 13 + (size_t)r * 7) % 100);
    case HVD_PRODUCT:
        return (double)(1 + (i + (size_t)r) % 2);
    }
    return 0;
}

static double expected(size_t i, hvd_op op, int p) {
    double acc = value(0, i, op, p);
    for (int r = 1; r < p; r++) {
        double v = value(r, i, op, p);
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
    return op == HVD_AVERAGE ? acc / p : acc;
}

static void store(void *buf, size_t i, hvd_dtype dt, double v) {
    switch (dt) {
    case HVD_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case HVD_FLOAT16:
        ((uint16_t *)buf)[i] = hvd_float_to_half((float)v);
        break;
    case HVD_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    default:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    }
}

static double load(const void *buf, size_t i, hvd_dtype dt) {
    switch (dt) {
    case HVD_INT32:
        return ((const int32_t *)buf)[i];
    case HVD_FLOAT16:
        return hvd_half_to_float(((const uint16_t *)buf)[i]);
    case HVD_FLOAT64:
        return ((const double *)buf)[i];
    default:
        return ((const uint8_t *)buf)[i];
    }
}

/* ---- the per-rank program ---- */

typedef struct job {
    world *w;
    hvd_comm_config cfg;
    int errors;
    pthread_mutex_t err_mu;
} job;

typedef struct rank_arg {
    job *j;
    int rank;
} rank_arg;

static const size_t counts[] = {0,  1,  2,  3,   5,   7,   8,
                                13, 31, 64, 100, 257, 1000};
static const hvd_dtype dtypes[] = {HVD_INT32, HVD_FLOAT16, HVD_FLOAT64,
                                   HVD_UINT8};
#define N(a) (sizeof(a) / sizeof((a)[0]))

static void report(job *j, int rank, const char *what, size_t i, double got,
                   double want) {
    pthread_mutex_lock(&j->err_mu);
    if (j->errors++ < 10)
        fprintf(stderr,
                "FAIL %s rank %d size %d chunk %zu depth %d: [%zu] got %g "
                "want %g\n",
                what, rank, j->w->size, j->cfg.chunk_bytes, j->cfg.depth, i,
                got, want);
    pthread_mutex_unlock(&j->err_mu);
}

static void *rank_main(void *argp) {
    rank_arg *a = argp;
    job *j = a->j;
    int r = a->rank, p = j->w->size;
    fake *f = calloc(1, sizeof(*f));
    hvd_comm *comm = NULL;
    char what[128];

    f->base.ops = &fake_ops;
    f->w = j->w;
    f->rank = r;
    if (hvd_comm_create(r, p, &f->base, HVD_CHANNEL_DATA, &j->cfg, &comm) !=
        HVD_OK) {
        report(j, r, "comm_create", 0, 0, 0);
        free(f);
        return NULL;
    }
    for (size_t ci = 0; ci < N(counts); ci++) {
        size_t n = counts[ci];
        for (size_t di = 0; di < N(dtypes); di++) {
            hvd_dtype dt = dtypes[di];
            size_t es = hvd_dtype_size(dt);
            uint8_t *in = malloc(n * es + 1), *out = malloc(n * es + 1);
            for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
                /* uint8 min/max values fit; products and sums too. */
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (size_t i = 0; i < n; i++)
                        store(in, i, dt, value(r, i, (hvd_op)op, p));
                    void *dst = inplace ? in : out;
                    hvd_status st =
                        hvd_coll_allreduce(comm, in, dst, n, dt, (hvd_op)op);
                    snprintf(what, sizeof(what), "allreduce %s %s count %zu %s",
                             hvd_dtype_name(dt), hvd_op_name((hvd_op)op), n,
                             inplace ? "in place" : "out of place");
                    if (st != HVD_OK) {
                        report(j, r, what, 0, st, 0);
                        continue;
                    }
                    for (size_t i = 0; i < n; i++) {
                        double want = expected(i, (hvd_op)op, p);
                        double got = load(dst, i, dt);
                        if (got != want) {
                            report(j, r, what, i, got, want);
                            break;
                        }
                    }
                }
            }
            free(in);
            free(out);
        }
        /* Broadcast from every root. */
        for (int root = 0; root < p; root++) {
            uint8_t *buf = malloc(n * 4 + 1);
            for (size_t i = 0; i < n * 4; i++)
                buf[i] = r == root ? (uint8_t)(i * 31 + (size_t)root) : 0xee;
            hvd_status st = hvd_coll_broadcast(comm, buf, n, HVD_INT32, root);
            snprintf(what, sizeof(what), "broadcast count %zu root %d", n,
                     root);
            if (st != HVD_OK)
                report(j, r, what, 0, st, 0);
            for (size_t i = 0; st == HVD_OK && i < n * 4; i++) {
                if (buf[i] != (uint8_t)(i * 31 + (size_t)root)) {
                    report(j, r, what, i, buf[i],
                           (uint8_t)(i * 31 + (size_t)root));
                    break;
                }
            }
            free(buf);
        }
        /* Allgather, out of place and both in-place forms. */
        for (int mode = 0; mode < 3; mode++) {
            size_t bytes = n * 8;
            uint8_t *all = malloc(bytes * (size_t)p + 1);
            uint8_t *mine = malloc(bytes + 1);
            const void *src = mine;
            memset(all, 0xee, bytes * (size_t)p);
            uint8_t *fill = mode == 0   ? mine
                            : mode == 1 ? all + (size_t)r * bytes
                                        : all;
            for (size_t i = 0; i < bytes; i++)
                fill[i] = (uint8_t)(i + (size_t)r * 17);
            if (mode != 0)
                src = fill;
            hvd_status st = hvd_coll_allgather(comm, src, all, n, HVD_FLOAT64);
            snprintf(what, sizeof(what), "allgather count %zu mode %d", n,
                     mode);
            if (st != HVD_OK)
                report(j, r, what, 0, st, 0);
            for (int q = 0; st == HVD_OK && q < p; q++) {
                for (size_t i = 0; i < bytes; i++) {
                    uint8_t want = (uint8_t)(i + (size_t)q * 17);
                    if (all[(size_t)q * bytes + i] != want) {
                        report(j, r, what, (size_t)q * bytes + i,
                               all[(size_t)q * bytes + i], want);
                        q = p;
                        break;
                    }
                }
            }
            free(all);
            free(mine);
        }
    }
    for (int k = 0; k < 3; k++)
        if (hvd_coll_barrier(comm) != HVD_OK)
            report(j, r, "barrier", 0, 0, 0);
    hvd_comm_destroy(comm);
    /* Every message was received. */
    pthread_mutex_lock(&j->w->mu);
    for (int src = 0; src < p; src++)
        if (j->w->head[src][r] != NULL || f->nrecv[src] != 0)
            report(j, r, "leftover messages", (size_t)src, 0, 0);
    pthread_mutex_unlock(&j->w->mu);
    free(f);
    return NULL;
}

static int run_job(int p, const hvd_comm_config *cfg) {
    world w;
    job j;
    pthread_t th[MAXP];
    rank_arg args[MAXP];

    memset(&w, 0, sizeof(w));
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    w.size = p;
    memset(&j, 0, sizeof(j));
    j.w = &w;
    j.cfg = *cfg;
    pthread_mutex_init(&j.err_mu, NULL);
    for (int r = 0; r < p; r++) {
        args[r] = (rank_arg){&j, r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < p; r++)
        pthread_join(th[r], NULL);
    for (int a = 0; a < p; a++) {
        for (int b = 0; b < p; b++) {
            while (w.taken[a][b] != NULL) {
                msg *m = w.taken[a][b];
                w.taken[a][b] = m->next;
                free(m);
            }
        }
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&j.err_mu);
    return j.errors;
}

static void sweep_some(hvd_algo ar, hvd_algo bc, const size_t *chunks,
                       size_t nchunks, const int *depths, size_t ndepths) {
    int errors = 0;

    for (int p = 1; p <= MAXP; p++) {
        for (size_t c = 0; c < nchunks; c++) {
            for (size_t d = 0; d < ndepths; d++) {
                hvd_comm_config cfg;
                hvd_comm_config_default(&cfg);
                cfg.chunk_bytes = chunks[c];
                cfg.depth = depths[d];
                cfg.allreduce_algo = ar;
                cfg.bcast_algo = bc;
                errors += run_job(p, &cfg);
            }
        }
    }
    assert_int_equal(errors, 0);
}

static void sweep(hvd_algo ar, hvd_algo bc) {
    static const size_t chunks[] = {64, 200, 4096};
    static const int depths[] = {1, 2, 4};
    sweep_some(ar, bc, chunks, N(chunks), depths, N(depths));
}

/* Algorithms without a pipeline depth: fewer combinations. */
static void sweep_short(hvd_algo ar, hvd_algo bc) {
    static const size_t chunks[] = {64, 4096};
    static const int depths[] = {2};
    sweep_some(ar, bc, chunks, N(chunks), depths, N(depths));
}

static void rabenseifner_and_tree(void **state) {
    (void)state;
    sweep_short(HVD_ALGO_RABENSEIFNER, HVD_ALGO_TREE);
}

static void direct(void **state) {
    (void)state;
    sweep_short(HVD_ALGO_DIRECT, HVD_ALGO_DIRECT);
}

static void ring_and_chain(void **state) {
    (void)state;
    sweep(HVD_ALGO_RING, HVD_ALGO_PIPELINE);
}

static void rd_and_tree(void **state) {
    (void)state;
    sweep(HVD_ALGO_RD, HVD_ALGO_TREE);
}

static void automatic(void **state) {
    (void)state;
    sweep(HVD_ALGO_UNFORCED, HVD_ALGO_UNFORCED);
}

static void selector(void **state) {
    (void)state;
    hvd_comm comm;

    memset(&comm, 0, sizeof(comm));
    hvd_comm_config_default(&comm.cfg);
    comm.size = 4;
    assert_int_equal(hvd_select_allreduce(&comm, 8), HVD_ALGO_RD);
    assert_int_equal(hvd_select_allreduce(&comm, comm.cfg.allreduce_rd_max),
                     HVD_ALGO_RD);
    assert_int_equal(hvd_select_allreduce(&comm, comm.cfg.allreduce_rd_max + 1),
                     HVD_ALGO_RING);
    assert_int_equal(hvd_select_broadcast(&comm, 8), HVD_ALGO_TREE);
    assert_int_equal(hvd_select_broadcast(&comm, 64 << 20), HVD_ALGO_PIPELINE);
    comm.cfg.allreduce_algo = HVD_ALGO_RING;
    assert_int_equal(hvd_select_allreduce(&comm, 8), HVD_ALGO_RING);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(selector),
        cmocka_unit_test(ring_and_chain),
        cmocka_unit_test(rd_and_tree),
        cmocka_unit_test(automatic),
        cmocka_unit_test(rabenseifner_and_tree),
        cmocka_unit_test(direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
