/*
 * The staging pipeline (gpu/stage.c) without a GPU: its CUDA seam is a
 * simulated stream (copies and device reductions queued in order, run
 * later, a few at a time, when a mark is queried), and its inner transport
 * a simulated network (sends and receives matched in order per pair and
 * channel, a few matches per progress call).
 *
 * - Every piece count, depth and size, zero and odd ones: the bytes arrive,
 *   in order, and the chaining holds: a slot is sent only once its copy has
 *   run, copied to the device only once its receive has landed, refilled
 *   only once its send is done; never more than depth pieces of a request
 *   in flight.
 * - Sequences to one peer, both directions, three peers at once.
 * - Failures of the network, of a copy, of a query.
 * - The collectives (ring, recursive doubling, tree, chain, allgather) run
 *   over the pipeline with queued "device" reductions, one thread per
 *   rank, and give bitwise the results of the same collectives over the
 *   bare network with host memory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/coll.h"
#include "collectives/comm.h"
#include "collectives/reduce.h"
#include "gpu/stage.h"
#include "transport/base/error.h"

#define MAXR 6
#define NCH 2

/* ------------------------------------------------------------------ */
/* A simulated stream                                                  */

enum { F_COPY = 1, F_REDUCE, F_SCALE, F_MOVE };

typedef struct fop {
    int kind;
    void *dst;
    const void *a, *b;
    size_t n;
    hvd_dtype dtype;
    hvd_op op;
    int divisor;
    uint64_t seq;
} fop;

typedef struct fmark {
    uint64_t seq;
} fmark;

typedef struct fstream {
    int rank;
    fop *ops;
    size_t head, n, cap;
    uint64_t next_seq, done_seq;
    unsigned seed;
    int eager;        /* run everything on a query */
    int fail_copy_at; /* the n-th copy fails (0: never) */
    int fail_query;   /* queries fail */
    int copies;
    size_t slot_allocs;
    struct fnet *net;
} fstream;

static unsigned next_rand(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 16) & 0x7fff;
}

static void push(fstream *fs, fop op) {
    if (fs->n == fs->cap) {
        fs->cap = fs->cap ? fs->cap * 2 : 64;
        fs->ops = realloc(fs->ops, fs->cap * sizeof(*fs->ops));
        assert_non_null(fs->ops);
    }
    op.seq = ++fs->next_seq;
    fs->ops[fs->n++] = op;
}

static void run_one(fstream *fs) {
    fop *op = &fs->ops[fs->head++];

    switch (op->kind) {
    case F_COPY:
    case F_MOVE:
        if (op->n > 0 && op->dst != op->a)
            memmove(op->dst, op->a, op->n);
        break;
    case F_REDUCE:
        hvd_reduce(op->dst, op->a, op->b, op->n, op->dtype, op->op);
        break;
    case F_SCALE:
        hvd_reduce_scale_div(op->dst, op->n, op->dtype, op->divisor);
        break;
    }
    fs->done_seq = op->seq;
    if (fs->head == fs->n)
        fs->head = fs->n = 0;
}

static void sync_stream(fstream *fs) {
    while (fs->head < fs->n)
        run_one(fs);
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    const uint8_t *x = a, *y = b;

    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

/* 1 if an unrun copy or reduction writes into [buf, buf + len). */
static int pending_write(const fstream *fs, const void *buf, size_t len) {
    for (size_t i = fs->head; i < fs->n; i++) {
        const fop *op = &fs->ops[i];
        size_t n = op->kind == F_REDUCE || op->kind == F_SCALE
                       ? op->n * hvd_dtype_size(op->dtype)
                       : op->n;
        if (overlaps(op->dst, n, buf, len))
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* A simulated network                                                 */

typedef struct fmsg {
    struct fmsg *next;
    void *buf;
    size_t len;
    hvd_req *req;
} fmsg;

typedef struct fnet {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    int threaded;
    int budget; /* matches per progress call; 0: all */
    unsigned seed;
    fmsg *sends[MAXR][MAXR][NCH], *recvs[MAXR][MAXR][NCH]; /* [src][dst] */
    hvd_status failed;
    size_t bytes;
    fstream *streams[MAXR];
} fnet;

typedef struct fep {
    hvd_transport base;
    fnet *net;
    int rank;
} fep;

static void append(fmsg **head, fmsg *m) {
    while (*head != NULL)
        head = &(*head)->next;
    *head = m;
}

/* 1 if buf is the target of a receive not matched yet (rank's side). */
static int pending_recv(fnet *net, int rank, const void *buf, size_t len) {
    for (int s = 0; s < net->size; s++)
        for (int c = 0; c < NCH; c++)
            for (fmsg *m = net->recvs[s][rank][c]; m; m = m->next)
                if (overlaps(m->buf, m->len, buf, len))
                    return 1;
    return 0;
}

/* 1 if buf is being sent by rank (posted, not matched yet). */
static int pending_send(fnet *net, int rank, const void *buf, size_t len) {
    for (int d = 0; d < net->size; d++)
        for (int c = 0; c < NCH; c++)
            for (fmsg *m = net->sends[rank][d][c]; m; m = m->next)
                if (overlaps(m->buf, m->len, buf, len))
                    return 1;
    return 0;
}

static void fail_everything(fnet *net) {
    for (int s = 0; s < net->size; s++)
        for (int d = 0; d < net->size; d++)
            for (int c = 0; c < NCH; c++) {
                fmsg **lists[2] = {&net->sends[s][d][c], &net->recvs[s][d][c]};
                for (int k = 0; k < 2; k++) {
                    while (*lists[k] != NULL) {
                        fmsg *m = *lists[k];
                        *lists[k] = m->next;
                        m->req->status = net->failed;
                        m->req->done = 1;
                        free(m);
                    }
                }
            }
}

/* Matches up to budget pairs (0: all); returns how many. Locked. */
static int match(fnet *net) {
    int n = 0;

    for (int s = 0; s < net->size; s++)
        for (int d = 0; d < net->size; d++)
            for (int c = 0; c < NCH; c++) {
                fmsg **sh = &net->sends[s][d][c], **rh = &net->recvs[s][d][c];
                while (*sh != NULL && *rh != NULL) {
                    if (net->budget > 0 && n >= net->budget &&
                        next_rand(&net->seed) % 2)
                        return n;
                    fmsg *sm = *sh, *rm = *rh;
                    *sh = sm->next;
                    *rh = rm->next;
                    /* Exact lengths, as the transport contract says. */
                    assert_int_equal(sm->len, rm->len);
                    if (sm->len > 0)
                        memcpy(rm->buf, sm->buf, sm->len);
                    net->bytes += sm->len;
                    sm->req->status = rm->req->status = HVD_OK;
                    sm->req->done = rm->req->done = 1;
                    free(sm);
                    free(rm);
                    n++;
                }
            }
    return n;
}

static hvd_status f_post(fep *ep, int send, int peer, int ch, void *buf,
                         size_t len, hvd_req *req) {
    fnet *net = ep->net;
    fmsg *m = calloc(1, sizeof(*m));

    assert_non_null(m);
    m->buf = buf;
    m->len = len;
    m->req = req;
    req->done = 0;
    req->status = HVD_OK;
    pthread_mutex_lock(&net->mu);
    if (net->failed != HVD_OK) {
        pthread_mutex_unlock(&net->mu);
        free(m);
        return hvd_error_set(net->failed, "simulated network failed");
    }
    if (send) {
        /* The chaining: what goes on the wire is what the copy wrote. */
        if (net->streams[ep->rank] != NULL)
            assert_false(pending_write(net->streams[ep->rank], buf, len));
        append(&net->sends[ep->rank][peer][ch], m);
    } else {
        append(&net->recvs[peer][ep->rank][ch], m);
    }
    pthread_cond_broadcast(&net->cv);
    pthread_mutex_unlock(&net->mu);
    return HVD_OK;
}

static hvd_status f_isend(hvd_transport *t, int peer, int ch, const void *buf,
                          size_t len, hvd_req *req) {
    return f_post((fep *)t, 1, peer, ch, (void *)buf, len, req);
}

static hvd_status f_irecv(hvd_transport *t, int peer, int ch, void *buf,
                          size_t len, hvd_req *req) {
    return f_post((fep *)t, 0, peer, ch, buf, len, req);
}

static hvd_status f_progress(hvd_transport *t, int timeout_ms) {
    fnet *net = ((fep *)t)->net;
    hvd_status st;

    pthread_mutex_lock(&net->mu);
    if (net->failed == HVD_OK && match(net) == 0 && net->threaded &&
        timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 2000000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&net->cv, &net->mu, &ts);
        match(net);
    }
    if (net->failed != HVD_OK) {
        fail_everything(net);
        st = hvd_error_set(net->failed, "simulated network: peer lost");
    } else {
        st = HVD_OK;
    }
    pthread_cond_broadcast(&net->cv);
    pthread_mutex_unlock(&net->mu);
    return st;
}

static void f_wake(hvd_transport *t) {
    fnet *net = ((fep *)t)->net;

    pthread_mutex_lock(&net->mu);
    pthread_cond_broadcast(&net->cv);
    pthread_mutex_unlock(&net->mu);
}

static void f_close(hvd_transport *t) { (void)t; }

static const hvd_transport_ops fops = {
    .size = sizeof(hvd_transport_ops),
    .name = "fake",
    .isend = f_isend,
    .irecv = f_irecv,
    .progress = f_progress,
    .wake = f_wake,
    .close = f_close,
};

static void net_init(fnet *net, int size, int threaded, int budget,
                     unsigned seed) {
    memset(net, 0, sizeof(*net));
    pthread_mutex_init(&net->mu, NULL);
    pthread_cond_init(&net->cv, NULL);
    net->size = size;
    net->threaded = threaded;
    net->budget = budget;
    net->seed = seed;
}

/* Drops what is still posted without touching the requests (their owners
 * may be gone), as a transport's close does. */
static void net_destroy(fnet *net) {
    for (int s = 0; s < net->size; s++)
        for (int d = 0; d < net->size; d++)
            for (int c = 0; c < NCH; c++) {
                fmsg **lists[2] = {&net->sends[s][d][c], &net->recvs[s][d][c]};
                for (int k = 0; k < 2; k++) {
                    while (*lists[k] != NULL) {
                        fmsg *m = *lists[k];
                        *lists[k] = m->next;
                        free(m);
                    }
                }
            }
    pthread_mutex_destroy(&net->mu);
    pthread_cond_destroy(&net->cv);
}

/* ------------------------------------------------------------------ */
/* The seam over the simulated stream                                  */

static hvd_status s_alloc(void *ctx, size_t bytes, void **buf, void **mark) {
    fstream *fs = ctx;

    *buf = malloc(bytes);
    *mark = calloc(1, sizeof(fmark));
    assert_non_null(*buf);
    assert_non_null(*mark);
    fs->slot_allocs++;
    return HVD_OK;
}

static void s_free(void *ctx, void *buf, void *mark) {
    (void)ctx;
    free(buf);
    free(mark);
}

static hvd_status s_copy(void *ctx, void *dst, const void *src, size_t bytes,
                         void *mark) {
    fstream *fs = ctx;
    fop op = {.kind = F_COPY, .dst = dst, .a = src, .n = bytes};

    assert_true(bytes > 0);
    if (fs->fail_copy_at > 0 && ++fs->copies == fs->fail_copy_at)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "cudaMemcpyAsync: simulated failure");
    if (fs->net != NULL) {
        pthread_mutex_lock(&fs->net->mu);
        /* A slot is copied to the device only once its data landed, and
         * refilled only once the network is done reading it. */
        assert_false(pending_recv(fs->net, fs->rank, src, bytes));
        assert_false(pending_send(fs->net, fs->rank, dst, bytes));
        pthread_mutex_unlock(&fs->net->mu);
    }
    push(fs, op);
    ((fmark *)mark)->seq = fs->next_seq;
    return HVD_OK;
}

static hvd_status s_query(void *ctx, void *mark, int *done) {
    fstream *fs = ctx;

    if (fs->fail_query)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "cudaEventQuery: simulated failure");
    /* The stream runs a few operations between two looks. */
    int k = fs->eager ? 1 << 30 : (int)(next_rand(&fs->seed) % 3);
    while (k-- > 0 && fs->head < fs->n)
        run_one(fs);
    *done = fs->done_seq >= ((fmark *)mark)->seq;
    return HVD_OK;
}

static hvd_stage_seam seam_of(fstream *fs) {
    hvd_stage_seam seam = {
        .ctx = fs,
        .slot_alloc = s_alloc,
        .slot_free = s_free,
        .copy = s_copy,
        .query = s_query,
    };
    return seam;
}

/* ------------------------------------------------------------------ */
/* A world of ranks in one thread                                      */

typedef struct world {
    fnet net;
    fep ep[MAXR];
    fstream fs[MAXR];
    hvd_transport *st[MAXR];
} world;

static void world_open(world *w, int size, size_t piece, int depth, int budget,
                       unsigned seed) {
    hvd_stage_config cfg = {.piece_bytes = piece, .depth = depth};

    memset(w, 0, sizeof(*w));
    net_init(&w->net, size, 0, budget, seed);
    for (int r = 0; r < size; r++) {
        w->ep[r].base.ops = &fops;
        w->ep[r].net = &w->net;
        w->ep[r].rank = r;
        w->fs[r].rank = r;
        w->fs[r].seed = seed * 31u + (unsigned)r;
        w->fs[r].net = &w->net;
        w->net.streams[r] = &w->fs[r];
        hvd_stage_seam seam = seam_of(&w->fs[r]);
        assert_int_equal(
            hvd_stage_open(&w->ep[r].base, size, &cfg, &seam, &w->st[r]),
            HVD_OK);
    }
}

static void world_close(world *w) {
    for (int r = 0; r < w->net.size; r++) {
        w->st[r]->ops->close(w->st[r]);
        free(w->fs[r].ops);
    }
    net_destroy(&w->net);
}

/* Drives every rank until all of reqs are done (bounded). */
static void drive(world *w, hvd_req *const *reqs, int n) {
    for (long iter = 0; iter < 10000000; iter++) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= reqs[i]->done;
        if (all)
            return;
        for (int r = 0; r < w->net.size; r++)
            assert_int_equal(w->st[r]->ops->progress(w->st[r], 0), HVD_OK);
    }
    fail_msg("requests did not finish");
}

static void fill(uint8_t *p, size_t n, unsigned salt) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 7u + salt * 13u + (i >> 8));
}

static size_t npieces(size_t len, size_t piece) {
    return len == 0 ? 1 : (len + piece - 1) / piece;
}

/* ------------------------------------------------------------------ */
/* Tests: one request                                                  */

/* Every piece count up to depth + 3, for several piece sizes and depths,
 * sizes 0 and odd included. */
static void one_message_every_shape(void **state) {
    static const size_t pieces[] = {1, 2, 3, 5, 8, 64};
    static const int depths[] = {1, 2, 3, 4, 6};

    (void)state;
    for (size_t pi = 0; pi < sizeof(pieces) / sizeof(pieces[0]); pi++) {
        for (size_t di = 0; di < sizeof(depths) / sizeof(depths[0]); di++) {
            size_t piece = pieces[pi];
            int depth = depths[di];
            size_t maxlen = piece * (size_t)(depth + 3) + 1;
            for (size_t len = 0; len <= maxlen; len++) {
                world w;
                uint8_t *src = malloc(len + 1), *dst = malloc(len + 1);
                hvd_req sreq, rreq;
                hvd_req *reqs[2] = {&sreq, &rreq};
                hvd_stage_stats ss, rs;

                world_open(&w, 2, piece, depth, (int)(len % 3),
                           (unsigned)(len * 17 + piece * 5 + (size_t)depth));
                fill(src, len, (unsigned)len);
                memset(dst, 0xEE, len + 1);
                assert_int_equal(
                    w.st[0]->ops->isend(w.st[0], 1, 0, src, len, &sreq),
                    HVD_OK);
                assert_int_equal(
                    w.st[1]->ops->irecv(w.st[1], 0, 0, dst, len, &rreq),
                    HVD_OK);
                drive(&w, reqs, 2);
                assert_int_equal(sreq.status, HVD_OK);
                assert_int_equal(rreq.status, HVD_OK);
                assert_memory_equal(src, dst, len);
                assert_int_equal(dst[len], 0xEE); /* nothing beyond */
                hvd_stage_stats_get(w.st[0], &ss);
                hvd_stage_stats_get(w.st[1], &rs);
                size_t np = npieces(len, piece);
                assert_int_equal(ss.pieces, np);
                assert_int_equal(rs.pieces, np);
                assert_true(ss.max_inflight <= (size_t)depth);
                assert_true(rs.max_inflight <= (size_t)depth);
                assert_true(ss.max_inflight ==
                            (np < (size_t)depth ? np : (size_t)depth));
                /* One copy per non-empty piece, one slot per piece in
                 * flight at most. */
                assert_int_equal(ss.copies, len == 0 ? 0 : np);
                assert_int_equal(rs.copies, len == 0 ? 0 : np);
                assert_true(ss.slots <= (size_t)depth);
                assert_true(rs.slots <= (size_t)depth);
                world_close(&w);
                free(src);
                free(dst);
            }
        }
    }
}

/* A receiver that posts late, and a sender whose copies run only when
 * looked at many times: the data still flows and nothing runs ahead. */
static void slow_stream_late_receiver(void **state) {
    world w;
    size_t len = 1000;
    uint8_t src[1000], dst[1000];
    hvd_req sreq, rreq;
    hvd_req *reqs[2] = {&sreq, &rreq};

    (void)state;
    world_open(&w, 2, 7, 3, 1, 99);
    fill(src, len, 3);
    assert_int_equal(w.st[0]->ops->isend(w.st[0], 1, 1, src, len, &sreq),
                     HVD_OK);
    for (int i = 0; i < 100; i++)
        assert_int_equal(w.st[0]->ops->progress(w.st[0], 0), HVD_OK);
    assert_false(sreq.done); /* nobody receives yet */
    assert_int_equal(w.st[1]->ops->irecv(w.st[1], 0, 1, dst, len, &rreq),
                     HVD_OK);
    drive(&w, reqs, 2);
    assert_memory_equal(src, dst, len);
    world_close(&w);
}

/* ------------------------------------------------------------------ */
/* Tests: several requests                                             */

/* Many messages to one peer, all posted at once: they arrive in order,
 * each into its own buffer, whatever their pieces. */
static void sequence_to_one_peer(void **state) {
    static const size_t lens[] = {0,  1,   5, 0,    17, 64, 65,
                                  63, 200, 0, 1000, 3,  129};
    enum { N = sizeof(lens) / sizeof(lens[0]) };

    (void)state;
    for (int depth = 1; depth <= 4; depth++) {
        for (size_t piece = 1; piece <= 70; piece += 23) {
            world w;
            uint8_t *src[N], *dst[N];
            hvd_req sreq[N], rreq[N];
            hvd_req *reqs[2 * N];
            world_open(&w, 2, piece, depth, 2, (unsigned)(piece + depth));
            for (int i = 0; i < N; i++) {
                src[i] = malloc(lens[i] + 1);
                dst[i] = malloc(lens[i] + 1);
                fill(src[i], lens[i], (unsigned)i);
                memset(dst[i], 0, lens[i] + 1);
                reqs[i] = &sreq[i];
                reqs[N + i] = &rreq[i];
            }
            /* Receives first on one channel half the time, sends first
             * otherwise. */
            for (int i = 0; i < N; i++) {
                if (depth % 2)
                    assert_int_equal(w.st[1]->ops->irecv(w.st[1], 0, 0, dst[i],
                                                         lens[i], &rreq[i]),
                                     HVD_OK);
                assert_int_equal(w.st[0]->ops->isend(w.st[0], 1, 0, src[i],
                                                     lens[i], &sreq[i]),
                                 HVD_OK);
            }
            if (depth % 2 == 0)
                for (int i = 0; i < N; i++)
                    assert_int_equal(w.st[1]->ops->irecv(w.st[1], 0, 0, dst[i],
                                                         lens[i], &rreq[i]),
                                     HVD_OK);
            drive(&w, reqs, 2 * N);
            for (int i = 0; i < N; i++) {
                assert_int_equal(sreq[i].status, HVD_OK);
                assert_int_equal(rreq[i].status, HVD_OK);
                assert_memory_equal(src[i], dst[i], lens[i]);
                free(src[i]);
                free(dst[i]);
            }
            world_close(&w);
        }
    }
}

/* Three ranks each sending to and receiving from both others, on both
 * channels at once; then the same again: the slot pool does not grow. */
static void all_pairs_both_channels(void **state) {
    enum { R = 3, M = 4 };
    world w;
    uint8_t *src[R][R][NCH][M], *dst[R][R][NCH][M];
    hvd_req sreq[R][R][NCH][M], rreq[R][R][NCH][M];
    hvd_req *reqs[2 * R * R * NCH * M];
    size_t slots_after_first[R];

    (void)state;
    world_open(&w, R, 48, 2, 3, 7);
    for (int round = 0; round < 2; round++) {
        int n = 0;
        for (int s = 0; s < R; s++)
            for (int d = 0; d < R; d++)
                for (int c = 0; c < NCH; c++)
                    for (int m = 0; m < M; m++) {
                        size_t len = (size_t)(s * 97 + d * 31 + c * 7 + m * 50);
                        if (s == d)
                            continue;
                        src[s][d][c][m] = malloc(len + 1);
                        dst[s][d][c][m] = malloc(len + 1);
                        fill(src[s][d][c][m], len,
                             (unsigned)(s + d + c + m + round));
                        assert_int_equal(
                            w.st[s]->ops->isend(w.st[s], d, c, src[s][d][c][m],
                                                len, &sreq[s][d][c][m]),
                            HVD_OK);
                        assert_int_equal(
                            w.st[d]->ops->irecv(w.st[d], s, c, dst[s][d][c][m],
                                                len, &rreq[s][d][c][m]),
                            HVD_OK);
                        reqs[n++] = &sreq[s][d][c][m];
                        reqs[n++] = &rreq[s][d][c][m];
                    }
        drive(&w, reqs, n);
        for (int s = 0; s < R; s++)
            for (int d = 0; d < R; d++)
                for (int c = 0; c < NCH; c++)
                    for (int m = 0; m < M; m++) {
                        size_t len = (size_t)(s * 97 + d * 31 + c * 7 + m * 50);
                        if (s == d)
                            continue;
                        assert_memory_equal(src[s][d][c][m], dst[s][d][c][m],
                                            len);
                        free(src[s][d][c][m]);
                        free(dst[s][d][c][m]);
                    }
        for (int r = 0; r < R; r++) {
            hvd_stage_stats st;
            hvd_stage_stats_get(w.st[r], &st);
            if (round == 0)
                slots_after_first[r] = st.slots;
            else
                assert_int_equal(st.slots, slots_after_first[r]);
            assert_true(st.max_inflight <= 2);
        }
    }
    world_close(&w);
}

/* ------------------------------------------------------------------ */
/* Tests: failures                                                     */

static void network_failure(void **state) {
    world w;
    uint8_t src[300], dst[300];
    hvd_req sreq, rreq, late;

    (void)state;
    world_open(&w, 2, 50, 2, 1, 5);
    fill(src, sizeof(src), 1);
    assert_int_equal(w.st[0]->ops->isend(w.st[0], 1, 0, src, 300, &sreq),
                     HVD_OK);
    assert_int_equal(w.st[1]->ops->irecv(w.st[1], 0, 0, dst, 300, &rreq),
                     HVD_OK);
    assert_int_equal(w.st[0]->ops->progress(w.st[0], 0), HVD_OK);
    w.net.failed = HVD_ERR_PEER_LOST;
    assert_int_equal(w.st[0]->ops->progress(w.st[0], 0), HVD_ERR_PEER_LOST);
    assert_non_null(strstr(hvd_error_get(), "peer lost"));
    assert_true(sreq.done);
    assert_int_equal(sreq.status, HVD_ERR_PEER_LOST);
    assert_int_equal(w.st[1]->ops->progress(w.st[1], 0), HVD_ERR_PEER_LOST);
    assert_true(rreq.done);
    assert_int_equal(rreq.status, HVD_ERR_PEER_LOST);
    /* Later calls fail the same way, with the same sentence. */
    assert_int_equal(w.st[0]->ops->isend(w.st[0], 1, 0, src, 1, &late),
                     HVD_ERR_PEER_LOST);
    assert_non_null(strstr(hvd_error_get(), "peer lost"));
    world_close(&w);
}

static void copy_failure(void **state) {
    world w;
    uint8_t src[300], dst[300];
    hvd_req sreq, rreq;

    (void)state;
    world_open(&w, 2, 50, 2, 0, 5);
    w.fs[0].fail_copy_at = 3; /* the third piece's copy */
    fill(src, sizeof(src), 1);
    assert_int_equal(w.st[1]->ops->irecv(w.st[1], 0, 0, dst, 300, &rreq),
                     HVD_OK);
    hvd_status st = w.st[0]->ops->isend(w.st[0], 1, 0, src, 300, &sreq);
    for (int i = 0; i < 1000 && st == HVD_OK; i++)
        st = w.st[0]->ops->progress(w.st[0], 0);
    assert_int_equal(st, HVD_ERR_INTERNAL);
    assert_non_null(strstr(hvd_error_get(), "cudaMemcpyAsync"));
    assert_true(sreq.done);
    assert_int_equal(sreq.status, HVD_ERR_INTERNAL);
    assert_int_equal(w.st[0]->ops->progress(w.st[0], 0), HVD_ERR_INTERNAL);
    world_close(&w);
}

static void query_failure(void **state) {
    world w;
    uint8_t src[10], dst[10];
    hvd_req sreq, rreq;

    (void)state;
    world_open(&w, 2, 4, 2, 0, 5);
    w.fs[1].fail_query = 1;
    fill(src, sizeof(src), 1);
    assert_int_equal(w.st[0]->ops->isend(w.st[0], 1, 0, src, 10, &sreq),
                     HVD_OK);
    assert_int_equal(w.st[1]->ops->irecv(w.st[1], 0, 0, dst, 10, &rreq),
                     HVD_OK);
    hvd_status st = HVD_OK;
    for (int i = 0; i < 1000 && st == HVD_OK; i++) {
        assert_int_equal(w.st[0]->ops->progress(w.st[0], 0), HVD_OK);
        st = w.st[1]->ops->progress(w.st[1], 0);
    }
    assert_int_equal(st, HVD_ERR_INTERNAL);
    assert_non_null(strstr(hvd_error_get(), "cudaEventQuery"));
    assert_int_equal(rreq.status, HVD_ERR_INTERNAL);
    world_close(&w);
}

static void bad_arguments(void **state) {
    world w;
    hvd_req req;
    hvd_transport *t;
    hvd_stage_config cfg = {.piece_bytes = 0, .depth = 1};
    hvd_stage_seam seam;

    (void)state;
    world_open(&w, 2, 8, 2, 0, 1);
    assert_int_equal(w.st[0]->ops->isend(w.st[0], 2, 0, "x", 1, &req),
                     HVD_ERR_INTERNAL);
    assert_int_equal(w.st[0]->ops->irecv(w.st[0], 1, 2, NULL, 0, &req),
                     HVD_ERR_INTERNAL);
    seam = seam_of(&w.fs[0]);
    assert_int_equal(hvd_stage_open(&w.ep[0].base, 2, &cfg, &seam, &t),
                     HVD_ERR_INVALID_ARG);
    world_close(&w);
}

/* ------------------------------------------------------------------ */
/* The collectives over the pipeline, one thread per rank              */

/* "Device" memory operations: queued on the rank's stream, like the CUDA
 * ones, so they run in order with the staging copies. */
static void d_reduce(void *ctx, void *dst, const void *a, const void *b,
                     size_t n, hvd_dtype dtype, hvd_op op) {
    fop o = {.kind = F_REDUCE,
             .dst = dst,
             .a = a,
             .b = b,
             .n = n,
             .dtype = dtype,
             .op = op};
    if (n > 0)
        push(ctx, o);
}

static void d_scale(void *ctx, void *buf, size_t n, hvd_dtype dtype,
                    int divisor) {
    fop o = {.kind = F_SCALE,
             .dst = buf,
             .n = n,
             .dtype = dtype,
             .divisor = divisor};
    if (n > 0)
        push(ctx, o);
}

static void d_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    fop o = {.kind = F_MOVE, .dst = dst, .a = src, .n = bytes};
    if (bytes > 0 && dst != src)
        push(ctx, o);
}

static hvd_status d_alloc(void *ctx, size_t bytes, void **out) {
    sync_stream(ctx); /* as cudaMalloc/cudaFree synchronize */
    *out = malloc(bytes);
    return *out != NULL ? HVD_OK : HVD_ERR_NO_MEMORY;
}

static void d_free(void *ctx, void *p) {
    sync_stream(ctx);
    free(p);
}

static const hvd_memops dev_memops = {
    .name = "simulated device",
    .reduce = d_reduce,
    .scale_div = d_scale,
    .copy = d_copy,
    .alloc = d_alloc,
    .free = d_free,
};

enum { C_RING, C_RD, C_TREE, C_CHAIN, C_ALLGATHER, C_COUNT };

typedef struct job {
    int kind;
    int size;
    size_t count;
    hvd_dtype dtype;
    hvd_op op;
    int root;
    size_t piece;
    int depth;
    size_t chunk;
    fnet net;
    fep ep[MAXR];
    fstream fs[MAXR];
    uint8_t *in[MAXR];
    uint8_t *out_staged[MAXR];
    uint8_t *out_host[MAXR];
    hvd_status status[MAXR];
} job;

typedef struct rank_arg {
    job *j;
    int rank;
} rank_arg;

static hvd_status run_collective(job *j, hvd_comm *comm, int rank,
                                 uint8_t *out) {
    size_t esize = hvd_dtype_size(j->dtype), bytes = j->count * esize;

    switch (j->kind) {
    case C_RING:
        return hvd_ring_allreduce(comm, j->in[rank], out, j->count, j->dtype,
                                  j->op);
    case C_RD:
        return hvd_rd_allreduce(comm, j->in[rank], out, j->count, j->dtype,
                                j->op);
    case C_TREE:
    case C_CHAIN:
        /* In place: out starts as the input (host copy: the test's
         * own memory, set before the collective). */
        memcpy(out, j->in[rank], bytes);
        return j->kind == C_TREE
                   ? hvd_tree_broadcast(comm, out, bytes, j->root)
                   : hvd_chain_broadcast(comm, out, bytes, j->root);
    default:
        return hvd_ring_allgather(comm, j->in[rank], out, bytes);
    }
}

static void *rank_main(void *p) {
    rank_arg *ra = p;
    job *j = ra->j;
    int r = ra->rank;
    hvd_comm_config cfg;
    hvd_comm *comm = NULL;
    hvd_transport *st = NULL;
    hvd_stage_config scfg = {.piece_bytes = j->piece, .depth = j->depth};
    hvd_stage_seam seam = seam_of(&j->fs[r]);
    hvd_status s;

    hvd_comm_config_default(&cfg);
    cfg.chunk_bytes = j->chunk;
    cfg.depth = j->depth;
    /* Staged, with "device" reductions. */
    s = hvd_stage_open(&j->ep[r].base, j->size, &scfg, &seam, &st);
    if (s == HVD_OK)
        s = hvd_comm_create(r, j->size, st, HVD_CHANNEL_DATA, &cfg, &comm);
    if (s == HVD_OK) {
        hvd_comm_set_memops(comm, &dev_memops, &j->fs[r]);
        s = run_collective(j, comm, r, j->out_staged[r]);
        sync_stream(&j->fs[r]); /* the engine waits for its last event */
    }
    hvd_comm_destroy(comm);
    if (st != NULL)
        st->ops->close(st);
    /* The same over the bare network, host memory. */
    if (s == HVD_OK)
        s = hvd_comm_create(r, j->size, &j->ep[r].base, HVD_CHANNEL_DATA, &cfg,
                            &comm);
    if (s == HVD_OK) {
        s = run_collective(j, comm, r, j->out_host[r]);
        hvd_comm_destroy(comm);
    }
    j->status[r] = s;
    return NULL;
}

/* Small integers, and for floats random fractions too: the two runs use
 * the same algorithm, so even inexact sums must agree bitwise. */
static void fill_input(uint8_t *p, size_t count, hvd_dtype dtype,
                       unsigned *seed) {
    for (size_t i = 0; i < count; i++) {
        int v = (int)(next_rand(seed) % 19) - 9;
        double f = v + (double)(next_rand(seed) % 1000) / 997.0;
        switch (dtype) {
        case HVD_UINT8:
            p[i] = (uint8_t)v;
            break;
        case HVD_INT8:
            ((int8_t *)p)[i] = (int8_t)v;
            break;
        case HVD_INT32:
            ((int32_t *)p)[i] = v;
            break;
        case HVD_INT64:
            ((int64_t *)p)[i] = v;
            break;
        case HVD_FLOAT16:
            ((uint16_t *)p)[i] = hvd_float_to_half((float)f);
            break;
        case HVD_BFLOAT16:
            ((uint16_t *)p)[i] = hvd_float_to_bfloat16((float)f);
            break;
        case HVD_FLOAT32:
            ((float *)p)[i] = (float)f;
            break;
        case HVD_FLOAT64:
            ((double *)p)[i] = f;
            break;
        }
    }
}

static void run_job(int kind, int size, size_t count, hvd_dtype dtype,
                    hvd_op op, size_t piece, int depth, size_t chunk,
                    unsigned seed) {
    job *j = calloc(1, sizeof(*j));
    pthread_t th[MAXR];
    rank_arg ra[MAXR];
    size_t esize = hvd_dtype_size(dtype);
    size_t outn = kind == C_ALLGATHER ? count * (size_t)size : count;

    assert_non_null(j);
    j->kind = kind;
    j->size = size;
    j->count = count;
    j->dtype = dtype;
    j->op = op;
    j->root = size > 1 ? (int)(seed % (unsigned)size) : 0;
    j->piece = piece;
    j->depth = depth;
    j->chunk = chunk;
    net_init(&j->net, size, 1, 2, seed);
    for (int r = 0; r < size; r++) {
        j->ep[r].base.ops = &fops;
        j->ep[r].net = &j->net;
        j->ep[r].rank = r;
        j->fs[r].rank = r;
        j->fs[r].seed = seed + (unsigned)r * 7919u;
        j->fs[r].net = &j->net;
        j->net.streams[r] = &j->fs[r];
        j->in[r] = malloc(count * esize + 1);
        j->out_staged[r] = malloc(outn * esize + 1);
        j->out_host[r] = malloc(outn * esize + 1);
        unsigned s = seed * 131u + (unsigned)r;
        fill_input(j->in[r], count, dtype, &s);
        memset(j->out_staged[r], 0x5A, outn * esize + 1);
        memset(j->out_host[r], 0xA5, outn * esize + 1);
        ra[r].j = j;
        ra[r].rank = r;
    }
    for (int r = 0; r < size; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ra[r]), 0);
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++) {
        if (j->status[r] != HVD_OK)
            fail_msg("collective %d np %d count %zu dtype %d op %d piece %zu "
                     "depth %d: rank %d status %d",
                     kind, size, count, (int)dtype, (int)op, piece, depth, r,
                     (int)j->status[r]);
        if (memcmp(j->out_staged[r], j->out_host[r], outn * esize) != 0)
            fail_msg("collective %d np %d count %zu dtype %d op %d piece %zu "
                     "depth %d: rank %d: staged result differs from host",
                     kind, size, count, (int)dtype, (int)op, piece, depth, r);
        /* Same on every rank. */
        assert_memory_equal(j->out_staged[r], j->out_staged[0], outn * esize);
    }
    for (int r = 0; r < size; r++) {
        free(j->in[r]);
        free(j->out_staged[r]);
        free(j->out_host[r]);
        free(j->fs[r].ops);
    }
    net_destroy(&j->net);
    free(j);
}

static void collectives_over_pipeline(void **state) {
    static const size_t counts[] = {0, 1, 7, 64, 333, 4099};
    static const hvd_dtype dtypes[] = {HVD_FLOAT32, HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_INT32,   HVD_FLOAT64, HVD_UINT8};
    static const hvd_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                 HVD_PRODUCT};
    unsigned seed = 1;

    (void)state;
    for (int size = 2; size <= 5; size++) {
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            for (int kind = 0; kind < C_COUNT; kind++) {
                size_t count = counts[ci];
                hvd_dtype dt = dtypes[(ci + (size_t)kind) % 6];
                hvd_op op = ops[(ci + (size_t)size) % 5];
                size_t piece = (size_t)(24 + 77 * (kind + size) % 300);
                int depth = 1 + (int)((ci + (size_t)size) % 4);
                run_job(kind, size, count, dt, op, piece, depth, 64, seed++);
            }
        }
    }
    /* Every dtype and op once through the ring and recursive doubling. */
    for (size_t di = 0; di < 6; di++)
        for (size_t oi = 0; oi < 5; oi++) {
            run_job(C_RING, 3, 1001, dtypes[di], ops[oi], 100, 2, 256, seed++);
            run_job(C_RD, 3, 101, dtypes[di], ops[oi], 64, 3, 256, seed++);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_message_every_shape),
        cmocka_unit_test(slow_stream_late_receiver),
        cmocka_unit_test(sequence_to_one_peer),
        cmocka_unit_test(all_pairs_both_channels),
        cmocka_unit_test(network_failure),
        cmocka_unit_test(copy_failure),
        cmocka_unit_test(query_failure),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(collectives_over_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
