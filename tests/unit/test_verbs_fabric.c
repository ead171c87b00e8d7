/*
 * The verbs transport itself, end to end, over the fake libibverbs's
 * loopback fabric (verbs_fake.h): one thread per rank opens the transport
 * through an in-process bootstrap and runs real traffic. This is the
 * transport's code path on a machine without an RDMA device; what it
 * cannot show is how a real HCA behaves (timing, MTU, RoCE routing).
 *
 * Cases: messages of every size class on both channels with more in
 * flight than there are credits and sends before receives; the channels'
 * independence; zero-copy sends through the registration cache; the
 * collectives (ring and recursive doubling allreduce, both broadcasts,
 * allgather) over it; a length mismatch, a dead peer, a stalled peer, a
 * peer that shuts down early, each with its sentence on every rank; a rank
 * without a device and ports that cannot reach each other failing open on
 * every rank; wake from another thread.
 *
 * Rank threads record what happened; the main thread asserts (cmocka's
 * asserts are not for other threads).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "collectives/coll.h"
#include "collectives/comm.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/verbs/verbs.h"
#include "verbs_fake.h"

#define MAXR 4

typedef struct rank_ctx rank_ctx;
typedef void (*body_fn)(rank_ctx *r);

typedef struct shared {
    int size;
    fake_boot *boot;
    body_fn body;
    int64_t timeout_ns;
    size_t chunk_bytes;
    int ring_chunks;
    int mr_cache;
    int hide_rank;            /* this rank has no device (-1: none) */
    int island_rank;          /* this rank cannot reach the others (-1: none) */
    int flag;                 /* __atomic */
    hvd_transport *tps[MAXR]; /* __atomic */
} shared;

struct rank_ctx {
    int rank;
    shared *sh;
    hvd_transport *tp;
    hvd_status open_st;
    hvd_status st; /* what the body ends with */
    char err[HVD_ERROR_MAX];
    int bad; /* data errors found */
    char note[256];
};

static void record(rank_ctx *r, hvd_status st) {
    if (r->st != HVD_OK)
        return;
    r->st = st;
    snprintf(r->err, sizeof(r->err), "%s", hvd_error_get());
}

static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    shared *sh = r->sh;
    hvd_transport_params p;

    memset(&p, 0, sizeof(p));
    p.rank = r->rank;
    p.size = sh->size;
    p.bootstrap = fake_bootstrap(sh->boot, r->rank);
    p.timeout_ns = sh->timeout_ns;
    p.connect_timeout_ns = 5 * 1000000000LL;
    fake_ib_settings settings;
    fake_ib_settings_fill(&settings, sh->chunk_bytes, sh->ring_chunks,
                          sh->mr_cache, -1, &p);
    fake_hide_devices(r->rank == sh->hide_rank);
    fake_set_island(r->rank == sh->island_rank);
    r->open_st = hvd_verbs_open_with(&fake_seam, &p, &r->tp);
    if (r->open_st != HVD_OK) {
        snprintf(r->err, sizeof(r->err), "%s", hvd_error_get());
        return NULL;
    }
    __atomic_store_n(&sh->tps[r->rank], r->tp, __ATOMIC_RELEASE);
    sh->body(r);
    if (r->tp != NULL) {
        if (r->st == HVD_OK)
            record(r, r->tp->ops->shutdown(r->tp));
        r->tp->ops->close(r->tp);
    }
    return NULL;
}

static void run(shared *sh, rank_ctx *r) {
    pthread_t th[MAXR];

    sh->boot = fake_boot_create(sh->size);
    for (int i = 0; i < sh->size; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        r[i].rank = i;
        r[i].sh = sh;
        pthread_create(&th[i], NULL, rank_main, &r[i]);
    }
    for (int i = 0; i < sh->size; i++)
        pthread_join(th[i], NULL);
    fake_boot_destroy(sh->boot);
}

static shared defaults(int size, body_fn body) {
    shared sh;

    memset(&sh, 0, sizeof(sh));
    sh.size = size;
    sh.body = body;
    sh.timeout_ns = 20 * 1000000000LL;
    /* Small rings: many chunks per message, credits cycle constantly. */
    sh.chunk_bytes = 4096;
    sh.ring_chunks = 2;
    sh.mr_cache = 0;
    sh.hide_rank = -1;
    sh.island_rank = -1;
    return sh;
}

static int setup(void **state) {
    (void)state;
    fake_reset();
    return 0;
}

static int teardown(void **state) {
    fake_stats st;

    (void)state;
    fake_get_stats(&st);
    if (st.live_mrs != 0 || st.bad_access != 0 || st.cq_overflows != 0) {
        fprintf(stderr,
                "fake: %d regions left, %d bad accesses, %d CQ "
                "overflows\n",
                st.live_mrs, st.bad_access, st.cq_overflows);
        return -1;
    }
    return 0;
}

static void sleep_until_flag(shared *sh, int want) {
    int64_t end = hvd_now_ns() + 20 * 1000000000LL;

    while (__atomic_load_n(&sh->flag, __ATOMIC_ACQUIRE) < want &&
           hvd_now_ns() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Progress until req is done (bounded); its status. */
static hvd_status wait_req(hvd_transport *tp, hvd_req *req) {
    int64_t end = hvd_now_ns() + 30 * 1000000000LL;

    while (!req->done && hvd_now_ns() < end) {
        hvd_status st = tp->ops->progress(tp, 50);
        if (st != HVD_OK)
            return st;
    }
    if (!req->done)
        return hvd_error_set(HVD_ERR_INTERNAL, "test: request never finished");
    if (req->status != HVD_OK) {
        hvd_status st = tp->ops->progress(tp, 0);
        return st != HVD_OK ? st : req->status;
    }
    return HVD_OK;
}

static uint8_t pattern(int src, int dst, int ch, int msg, size_t i) {
    return (uint8_t)(src * 131 + dst * 71 + ch * 37 + msg * 13 + i * 7 +
                     (i >> 9));
}

/* ------------------------------------------------------------------ */
/* Traffic                                                             */

static const size_t sizes[] = {0,    1,    100,   4079,  4080,  4081,
                               4096, 8192, 10000, 65536, 300000};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define ROUNDS 3

/* Every rank sends every size to every other on both channels, ROUNDS
 * times, all posted before any receive. */
static void exchange(rank_ctx *r) {
    int n = r->sh->size, me = r->rank;
    int nmsg = ROUNDS * (int)NSIZES;
    size_t per = (size_t)(n - 1) * 2 * (size_t)nmsg;
    hvd_req *sreq = calloc(per, sizeof(*sreq));
    hvd_req *rreq = calloc(per, sizeof(*rreq));
    uint8_t **sbuf = calloc(per, sizeof(*sbuf));
    uint8_t **rbuf = calloc(per, sizeof(*rbuf));
    size_t k = 0;
    hvd_status st = HVD_OK;

    for (int peer = 0; peer < n && st == HVD_OK; peer++) {
        if (peer == me)
            continue;
        for (int ch = 0; ch < 2; ch++) {
            for (int m = 0; m < nmsg && st == HVD_OK; m++, k++) {
                size_t len = sizes[m % NSIZES];
                sbuf[k] = malloc(len ? len : 1);
                for (size_t i = 0; i < len; i++)
                    sbuf[k][i] = pattern(me, peer, ch, m, i);
                st = r->tp->ops->isend(r->tp, peer, ch, sbuf[k], len, &sreq[k]);
            }
        }
    }
    k = 0;
    for (int peer = 0; peer < n && st == HVD_OK; peer++) {
        if (peer == me)
            continue;
        for (int ch = 0; ch < 2; ch++) {
            for (int m = 0; m < nmsg && st == HVD_OK; m++, k++) {
                size_t len = sizes[m % NSIZES];
                rbuf[k] = malloc(len ? len : 1);
                st = r->tp->ops->irecv(r->tp, peer, ch, rbuf[k], len, &rreq[k]);
            }
        }
    }
    for (size_t i = 0; i < k && st == HVD_OK; i++)
        st = wait_req(r->tp, &rreq[i]);
    for (size_t i = 0; i < k && st == HVD_OK; i++)
        st = wait_req(r->tp, &sreq[i]);
    record(r, st);
    k = 0;
    for (int peer = 0; peer < n && st == HVD_OK; peer++) {
        if (peer == me)
            continue;
        for (int ch = 0; ch < 2; ch++) {
            for (int m = 0; m < nmsg; m++, k++) {
                size_t len = sizes[m % NSIZES];
                for (size_t i = 0; i < len; i++) {
                    if (rbuf[k][i] != pattern(peer, me, ch, m, i)) {
                        if (r->bad++ == 0)
                            snprintf(r->note, sizeof(r->note),
                                     "from %d ch %d msg %d (%zu bytes): "
                                     "byte %zu wrong",
                                     peer, ch, m, len, i);
                        break;
                    }
                }
            }
        }
    }
    for (size_t i = 0; i < per; i++) {
        free(sbuf[i]);
        free(rbuf[i]);
    }
    free(sbuf);
    free(rbuf);
    free(sreq);
    free(rreq);
}

static void expect_clean(rank_ctx *r, int n) {
    for (int i = 0; i < n; i++) {
        if (r[i].open_st != HVD_OK || r[i].st != HVD_OK || r[i].bad != 0)
            fprintf(stderr, "rank %d: open %s, status %s: %s %s\n", i,
                    hvd_status_name(r[i].open_st), hvd_status_name(r[i].st),
                    r[i].err, r[i].note);
        assert_int_equal(r[i].open_st, HVD_OK);
        assert_int_equal(r[i].st, HVD_OK);
        assert_int_equal(r[i].bad, 0);
    }
}

static void traffic_staged(void **state) {
    rank_ctx r[MAXR];
    fake_stats st;

    (void)state;
    for (int n = 2; n <= 3; n++) {
        shared sh = defaults(n, exchange);
        run(&sh, r);
        expect_clean(r, n);
    }
    fake_get_stats(&st);
    assert_true(st.writes > 1000);
    assert_true(st.sends > 1000);
    /* Posted receives never ran out (no "receiver not ready"). */
    assert_int_equal(st.rnr_waits, 0);
    /* Only the transport's own buffers were registered. */
    assert_int_equal(st.regs, 2 * 2 + 2 * 3);
}

static void traffic_zero_copy(void **state) {
    shared sh = defaults(3, exchange);
    rank_ctx r[MAXR];
    fake_stats st;

    (void)state;
    sh.mr_cache = 1;
    sh.chunk_bytes = 64 * 1024;
    sh.ring_chunks = 3;
    run(&sh, r);
    expect_clean(r, 3);
    fake_get_stats(&st);
    /* User buffers were registered (and all released at close). */
    assert_true(st.regs > 2 * 3);
}

static void traffic_big_ring(void **state) {
    shared sh = defaults(2, exchange);
    rank_ctx r[MAXR];

    (void)state;
    sh.chunk_bytes = 1 << 20;
    sh.ring_chunks = 8;
    run(&sh, r);
    expect_clean(r, 2);
}

/* A control message passes data stuck for want of credits. */
static void independent(rank_ctx *r) {
    const size_t big = 1 << 20;
    uint8_t *data = malloc(big), ctl[64];
    hvd_req dreq, creq;
    hvd_status st = HVD_OK;

    memset(ctl, 0, sizeof(ctl));
    if (r->rank == 0) {
        for (size_t i = 0; i < big; i++)
            data[i] = (uint8_t)(i * 3);
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, data, big, &dreq);
        if (st == HVD_OK) {
            memset(ctl, 0x5a, sizeof(ctl));
            st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_CONTROL, ctl,
                                   sizeof(ctl), &creq);
        }
        if (st == HVD_OK)
            st = wait_req(r->tp, &creq);
        if (st == HVD_OK)
            st = wait_req(r->tp, &dreq);
    } else {
        /* The control message first, with no data receive posted: the
         * data's chunks fill the ring and wait. */
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_CONTROL, ctl, sizeof(ctl),
                               &creq);
        if (st == HVD_OK)
            st = wait_req(r->tp, &creq);
        for (size_t i = 0; i < sizeof(ctl); i++)
            r->bad += ctl[i] != 0x5a;
        if (st == HVD_OK)
            st =
                r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, data, big, &dreq);
        if (st == HVD_OK)
            st = wait_req(r->tp, &dreq);
        for (size_t i = 0; st == HVD_OK && i < big; i++)
            if (data[i] != (uint8_t)(i * 3)) {
                r->bad++;
                break;
            }
    }
    record(r, st);
    free(data);
}

static void channels_independent(void **state) {
    shared sh = defaults(2, independent);
    rank_ctx r[MAXR];

    (void)state;
    run(&sh, r);
    expect_clean(r, 2);
}

/* The GPUDirect hook: memory registered through the transport (here a
 * host buffer standing in for CUDA memory) is sent without staging, with
 * HVD_IB_MR_CACHE off; CUDA memory needs nvidia-peermem. */
static void registered(rank_ctx *r) {
    const size_t len = 300000;
    uint8_t *buf = malloc(len);
    hvd_mr_entry *e = NULL;
    hvd_mr_stats ms;
    hvd_req req;
    hvd_status st = HVD_OK;

    if (r->rank == 0) {
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)(i * 11);
        /* Without nvidia-peermem: refused, with the reason. */
        if (hvd_verbs_register(r->tp, buf, len, HVD_MEM_DEVICE, &e) !=
                HVD_ERR_UNSUPPORTED ||
            strstr(hvd_error_get(), "nvidia-peermem") == NULL)
            r->bad++;
        fake_cfg()->peermem = 1; /* only this thread reads it */
        st = hvd_verbs_register(r->tp, buf, len, HVD_MEM_DEVICE, &e);
        for (int k = 0; k < 2 && st == HVD_OK; k++) {
            st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, buf, len, &req);
            if (st == HVD_OK)
                st = wait_req(r->tp, &req);
        }
        hvd_verbs_mr_stats(r->tp, &ms);
        snprintf(r->note, sizeof(r->note), "hits %llu misses %llu",
                 (unsigned long long)ms.hits, (unsigned long long)ms.misses);
        if (e != NULL)
            hvd_verbs_unregister(r->tp, e);
    } else {
        for (int k = 0; k < 2 && st == HVD_OK; k++) {
            memset(buf, 0, len);
            st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, buf, len, &req);
            if (st == HVD_OK)
                st = wait_req(r->tp, &req);
            for (size_t i = 0; st == HVD_OK && i < len; i++)
                if (buf[i] != (uint8_t)(i * 11)) {
                    r->bad++;
                    break;
                }
        }
    }
    record(r, st);
    free(buf);
}

static void gpudirect_hook(void **state) {
    shared sh = defaults(2, registered);
    rank_ctx r[MAXR];
    fake_stats st;

    (void)state;
    sh.chunk_bytes = 64 * 1024;
    sh.ring_chunks = 2;
    run(&sh, r);
    expect_clean(r, 2);
    /* Registered once (by the hook), found by both sends: no staging. */
    assert_string_equal(r[0].note, "hits 2 misses 1");
    fake_get_stats(&st);
    assert_int_equal(st.regs, 2 * 2 + 1);
}

/* ------------------------------------------------------------------ */
/* Collectives                                                         */

static void collectives(rank_ctx *r) {
    int n = r->sh->size, me = r->rank;
    hvd_comm_config cfg;
    hvd_comm *comm = NULL;
    const size_t counts[] = {1, 1000, 50000, 300001};
    hvd_status st;

    hvd_comm_config_default(&cfg);
    cfg.chunk_bytes = 16 * 1024;
    st = hvd_comm_create(me, n, r->tp, HVD_CHANNEL_DATA, &cfg, &comm);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && st == HVD_OK;
         c++) {
        size_t count = counts[c];
        float *in = malloc(count * sizeof(float));
        float *out = malloc(count * sizeof(float) * (size_t)n);
        for (int algo = 0; algo < 2 && st == HVD_OK; algo++) {
            for (size_t i = 0; i < count; i++)
                in[i] = (float)((i % 1000) + (size_t)me * 1000);
            st = algo == 0 ? hvd_ring_allreduce(comm, in, out, count,
                                                HVD_FLOAT32, HVD_SUM)
                           : hvd_rd_allreduce(comm, in, out, count, HVD_FLOAT32,
                                              HVD_SUM);
            for (size_t i = 0; st == HVD_OK && i < count; i++) {
                float want =
                    (float)(n * (int)(i % 1000) + 1000 * n * (n - 1) / 2);
                if (out[i] != want) {
                    r->bad++;
                    snprintf(r->note, sizeof(r->note),
                             "%s allreduce of %zu: [%zu] = %g, want %g",
                             algo == 0 ? "ring" : "rd", count, i,
                             (double)out[i], (double)want);
                    break;
                }
            }
        }
        for (int algo = 0; algo < 2 && st == HVD_OK; algo++) {
            int root = (int)(c % (size_t)n);
            for (size_t i = 0; i < count; i++)
                out[i] = me == root ? (float)(i % 777) : -1.0f;
            st = algo == 0 ? hvd_tree_broadcast(comm, out,
                                                count * sizeof(float), root)
                           : hvd_chain_broadcast(comm, out,
                                                 count * sizeof(float), root);
            for (size_t i = 0; st == HVD_OK && i < count; i++)
                if (out[i] != (float)(i % 777)) {
                    r->bad++;
                    break;
                }
        }
        if (st == HVD_OK) {
            for (size_t i = 0; i < count; i++)
                in[i] = (float)(me * 10 + (int)(i % 10));
            st = hvd_ring_allgather(comm, in, out, count * sizeof(float));
            for (int p = 0; st == HVD_OK && p < n; p++)
                for (size_t i = 0; i < count; i++)
                    if (out[(size_t)p * count + i] !=
                        (float)(p * 10 + (int)(i % 10))) {
                        r->bad++;
                        break;
                    }
        }
        free(in);
        free(out);
    }
    if (st == HVD_OK)
        st = hvd_coll_barrier(comm);
    record(r, st);
    hvd_comm_destroy(comm);
}

static void collectives_over_verbs(void **state) {
    rank_ctx r[MAXR];

    (void)state;
    for (int n = 2; n <= 4; n++) {
        shared sh = defaults(n, collectives);
        sh.chunk_bytes = 8192;
        sh.ring_chunks = 4;
        sh.mr_cache = n == 3;
        run(&sh, r);
        expect_clean(r, n);
    }
}

/* ------------------------------------------------------------------ */
/* Failures                                                            */

/* Rank 0 sends 5000 bytes where rank 1 expects 6000; rank 2 waits on rank
 * 0 and learns why from its ABORT. */
static void mismatch(rank_ctx *r) {
    uint8_t buf[6000];
    hvd_req req;
    hvd_status st;

    memset(buf, 1, sizeof(buf));
    if (r->rank == 0) {
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, buf, 5000, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
        /* Then wait on rank 1, which fails and says so. */
        if (st == HVD_OK)
            st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, buf, 10, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
    } else if (r->rank == 1) {
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, buf, 6000, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
    } else {
        st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_CONTROL, buf, 10, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
    }
    record(r, st);
    /* Later calls return the same failure. */
    if (st != HVD_OK &&
        r->tp->ops->isend(r->tp, (r->rank + 1) % 3, 0, buf, 1, &req) != st)
        r->bad++;
}

static void failure_mismatch(void **state) {
    shared sh = defaults(3, mismatch);
    rank_ctx r[MAXR];

    (void)state;
    run(&sh, r);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].open_st, HVD_OK);
        assert_int_equal(r[i].st, HVD_ERR_MISMATCH);
        assert_int_equal(r[i].bad, 0);
        assert_non_null(strstr(r[i].err, "rank 0 sent a message of 5000 "
                                         "bytes where this rank expected "
                                         "6000"));
    }
    assert_null(strstr(r[1].err, "reported"));
    assert_non_null(strstr(r[0].err, "rank 1 reported"));
    assert_non_null(strstr(r[2].err, "rank 1 reported"));
}

/* Eager: 100 bytes where 200 are expected; a chunked message that is too
 * long. */
static void mismatch_small(rank_ctx *r) {
    uint8_t buf[20000];
    hvd_req req;
    hvd_status st;

    memset(buf, 2, sizeof(buf));
    if (r->rank == 0)
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_CONTROL, buf, 100, &req);
    else
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_CONTROL, buf, 200, &req);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req);
    if (st == HVD_OK && r->rank == 0) {
        /* Rank 1 fails; this receive learns it from the ABORT. */
        st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, buf, 1, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
    }
    record(r, st);
}

static void too_long(rank_ctx *r) {
    uint8_t buf[20000];
    hvd_req req;
    hvd_status st;

    memset(buf, 3, sizeof(buf));
    if (r->rank == 0)
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, buf, 20000, &req);
    else
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, buf, 9000, &req);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req);
    if (st == HVD_OK && r->rank == 0) {
        st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, buf, 1, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
    }
    record(r, st);
}

static void failure_mismatch_sizes(void **state) {
    rank_ctx r[MAXR];
    shared sh = defaults(2, mismatch_small);

    (void)state;
    run(&sh, r);
    assert_int_equal(r[1].st, HVD_ERR_MISMATCH);
    assert_non_null(strstr(r[1].err, "sent a message of 100 bytes where this "
                                     "rank expected 200"));
    assert_int_equal(r[0].st, HVD_ERR_MISMATCH);
    sh = defaults(2, too_long);
    run(&sh, r);
    assert_int_equal(r[1].st, HVD_ERR_MISMATCH);
    assert_non_null(strstr(r[1].err, "sent a message of more than"));
    assert_non_null(strstr(r[1].err, "expected 9000"));
}

/* Rank 1 vanishes (its queue pairs are destroyed without a goodbye). Rank
 * 0's send to it fails with the transport retry error; rank 0's receive
 * from it fails when a heartbeat finds it gone. */
static void dies(rank_ctx *r) {
    uint8_t buf[100000];
    hvd_req req;
    hvd_status st = HVD_OK;
    int64_t end = hvd_now_ns() + 10 * 1000000000LL;

    memset(buf, 0, sizeof(buf));
    if (r->rank == 1) {
        r->tp->ops->close(r->tp);
        r->tp = NULL;
        __atomic_store_n(&r->sh->flag, 1, __ATOMIC_RELEASE);
        return;
    }
    while (!__atomic_load_n(&r->sh->flag, __ATOMIC_ACQUIRE) &&
           hvd_now_ns() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (r->sh->size == 2)
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, buf, sizeof(buf),
                               &req);
    else
        st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, buf, 8, &req);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req);
    record(r, st);
}

static void failure_peer_lost(void **state) {
    rank_ctx r[MAXR];

    (void)state;
    for (int n = 2; n <= 3; n++) {
        shared sh = defaults(n, dies);
        sh.timeout_ns = 2 * 1000000000LL; /* heartbeats every 0.5 s */
        run(&sh, r);
        for (int i = 0; i < n; i++) {
            if (i == 1)
                continue;
            assert_int_equal(r[i].st, HVD_ERR_PEER_LOST);
            assert_non_null(strstr(r[i].err, "lost rank 1"));
            assert_non_null(strstr(r[i].err, "transport retry counter "
                                             "exceeded"));
        }
    }
}

/* Rank 2 is alive but stops calling hvd (no progress, no heartbeats):
 * rank 0, which waits on it, times out naming it; rank 1, which waits on
 * rank 0 (alive, sending heartbeats), is told by rank 0. */
static void stalls(rank_ctx *r) {
    uint8_t buf[16];
    hvd_req req;
    hvd_status st;

    if (r->rank == 2) {
        int64_t end = hvd_now_ns() + 10 * 1000000000LL;
        while (!__atomic_load_n(&r->sh->flag, __ATOMIC_ACQUIRE) &&
               hvd_now_ns() < end) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        r->tp->ops->close(r->tp);
        r->tp = NULL;
        return;
    }
    st = r->tp->ops->irecv(r->tp, r->rank == 0 ? 2 : 0, HVD_CHANNEL_DATA, buf,
                           sizeof(buf), &req);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req);
    record(r, st);
    if (r->rank == 1)
        __atomic_store_n(&r->sh->flag, 1, __ATOMIC_RELEASE);
}

static void failure_stall(void **state) {
    shared sh = defaults(3, stalls);
    rank_ctx r[MAXR];

    (void)state;
    sh.timeout_ns = 1000000000LL;
    run(&sh, r);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].st, HVD_ERR_TIMEOUT);
        assert_non_null(strstr(r[i].err, "nothing (not even a heartbeat) "
                                         "arrived from rank 2"));
    }
    assert_non_null(strstr(r[1].err, "rank 0 reported"));
}

/* Rank 1 shuts down while rank 0 still expects data from it. */
static void early_bye(rank_ctx *r) {
    uint8_t buf[16];
    hvd_req req;
    hvd_status st = HVD_OK;

    if (r->rank == 0) {
        st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, buf, sizeof(buf),
                               &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
    }
    record(r, st);
}

static void failure_early_shutdown(void **state) {
    shared sh = defaults(2, early_bye);
    rank_ctx r[MAXR];

    (void)state;
    sh.timeout_ns = 1000000000LL;
    run(&sh, r);
    assert_int_equal(r[0].st, HVD_ERR_PEER_LOST);
    assert_non_null(strstr(r[0].err, "rank 1 called hvd_shutdown while this "
                                     "rank still expected data"));
    assert_int_equal(r[1].st, HVD_OK);
}

/* Rank 0's last messages to rank 1 (one chunked, one eager) complete on
 * rank 0 before rank 1 asks for them, and rank 0 says goodbye: rank 1's
 * later receives still get them, and only one more fails. */
static void late(rank_ctx *r) {
    static uint8_t big[100000], small[100];
    hvd_req req[3];
    hvd_status st = HVD_OK;

    if (r->rank == 0) {
        for (size_t i = 0; i < sizeof(big); i++)
            big[i] = (uint8_t)(i * 5);
        memset(small, 9, sizeof(small));
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, big, sizeof(big),
                               &req[0]);
        if (st == HVD_OK)
            st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, small,
                                   sizeof(small), &req[1]);
        for (int i = 0; i < 2 && st == HVD_OK; i++)
            st = wait_req(r->tp, &req[i]);
        record(r, st); /* then rank_main says goodbye */
        return;
    }
    /* Let the goodbye arrive behind the data first. */
    for (int i = 0; i < 20; i++)
        r->tp->ops->progress(r->tp, 10);
    uint8_t *in = calloc(1, sizeof(big));
    st =
        r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, in, sizeof(big), &req[0]);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req[0]);
    for (size_t i = 0; st == HVD_OK && i < sizeof(big); i++)
        if (in[i] != (uint8_t)(i * 5)) {
            r->bad++;
            break;
        }
    if (st == HVD_OK)
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, in, sizeof(small),
                               &req[1]);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req[1]);
    r->bad += st == HVD_OK && in[99] != 9;
    snprintf(r->note, sizeof(r->note), "first two: %s", hvd_status_name(st));
    if (st == HVD_OK)
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, in, 1, &req[2]);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req[2]);
    record(r, st);
    free(in);
}

static void receives_after_goodbye(void **state) {
    shared sh = defaults(2, late);
    rank_ctx r[MAXR];

    (void)state;
    sh.timeout_ns = 1000000000LL;
    sh.chunk_bytes = 64 * 1024; /* the big message fits the ring */
    sh.ring_chunks = 2;
    run(&sh, r);
    assert_int_equal(r[0].st, HVD_OK);
    assert_string_equal(r[1].note, "first two: HVD_OK");
    assert_int_equal(r[1].bad, 0);
    assert_int_equal(r[1].st, HVD_ERR_PEER_LOST);
    assert_non_null(strstr(r[1].err, "rank 0 called hvd_shutdown while this "
                                     "rank still expected data"));
}

static void nothing(rank_ctx *r) { (void)r; }

/* open is all-or-nothing: one rank without a device fails it everywhere,
 * each rank with a sentence. */
static void open_without_device(void **state) {
    shared sh = defaults(3, nothing);
    rank_ctx r[MAXR];

    (void)state;
    sh.hide_rank = 1;
    run(&sh, r);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r[i].open_st, HVD_ERR_UNSUPPORTED);
    assert_non_null(strstr(r[1].err, "no RDMA device found"));
    assert_non_null(strstr(r[0].err, "rank 1 cannot use RDMA"));
    assert_non_null(strstr(r[2].err, "rank 1 cannot use RDMA"));
}

/* Ports that cannot reach each other: the HELLO check fails open on every
 * rank, with the same first cause. */
static void open_unreachable(void **state) {
    shared sh = defaults(3, nothing);
    rank_ctx r[MAXR];

    (void)state;
    sh.island_rank = 2;
    run(&sh, r);
    for (int i = 0; i < 3; i++) {
        assert_int_not_equal(r[i].open_st, HVD_OK);
        assert_non_null(strstr(r[i].err, "checking RDMA connectivity"));
    }
}

/* wake makes a progress call waiting without limit return. Flag: 2 once
 * rank 0 is back, 3 once the waker has stopped (then the transport may
 * go). */
static void waits(rank_ctx *r) {
    if (r->rank == 0) {
        hvd_status st = r->tp->ops->progress(r->tp, -1);
        record(r, st);
        __atomic_store_n(&r->sh->flag, 2, __ATOMIC_RELEASE);
    }
    /* Rank 1 stays quiet (no goodbye) until then. */
    sleep_until_flag(r->sh, 3);
}

static void *waker(void *arg) {
    shared *sh = arg;
    int64_t end = hvd_now_ns() + 20 * 1000000000LL;

    while (__atomic_load_n(&sh->flag, __ATOMIC_ACQUIRE) < 2 &&
           hvd_now_ns() < end) {
        struct timespec ts = {0, 20000000};
        hvd_transport *tp = __atomic_load_n(&sh->tps[0], __ATOMIC_ACQUIRE);
        nanosleep(&ts, NULL);
        if (tp != NULL)
            tp->ops->wake(tp);
    }
    __atomic_store_n(&sh->flag, 3, __ATOMIC_RELEASE);
    return NULL;
}

static void wake_from_another_thread(void **state) {
    shared sh = defaults(2, waits);
    rank_ctx r[MAXR];
    pthread_t w;

    (void)state;
    pthread_create(&w, NULL, waker, &sh);
    run(&sh, r);
    pthread_join(w, NULL);
    assert_int_equal(sh.flag, 3);
    expect_clean(r, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(traffic_staged, setup, teardown),
        cmocka_unit_test_setup_teardown(traffic_zero_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(traffic_big_ring, setup, teardown),
        cmocka_unit_test_setup_teardown(channels_independent, setup, teardown),
        cmocka_unit_test_setup_teardown(gpudirect_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(collectives_over_verbs, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(failure_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(failure_mismatch_sizes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(failure_peer_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(failure_stall, setup, teardown),
        cmocka_unit_test_setup_teardown(failure_early_shutdown, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(receives_after_goodbye, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(open_without_device, setup, teardown),
        cmocka_unit_test_setup_teardown(open_unreachable, setup, teardown),
        cmocka_unit_test_setup_teardown(wake_from_another_thread, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
