/*
 * GPUDirect RDMA in the verbs transport, over the fake libibverbs's
 * loopback fabric (verbs_fake.h) with simulated CUDA device memory: pages
 * the fake's mem_type reports as device memory, and which are
 * inaccessible to the CPU (PROT_NONE) except to the fake HCA and to
 * fake_dev_write/fake_dev_read (cudaMemcpy). A transport that touched a
 * device buffer with the CPU (an eager copy, staging, a copy out of the
 * ring) would crash these tests; the counters show which path each
 * message took.
 *
 * Cases: probe and the agreement at open (knob, no CUDA device, no
 * nvidia-peermem); every pair of memory types (device and host, each way)
 * at sizes 0, 1, around the eager limit, several chunks and several MiB,
 * exact bytes both ways at once; bursts of device messages posted before
 * their receives, on 3 ranks; the ranks disagreeing on a memory type and
 * on a length, each with its sentence; a device address reused by another
 * allocation; the collectives on device buffers.
 *
 * Rank threads record what happened; the main thread asserts.
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
/* The transport's eager buffers hold 4096 bytes with a 16-byte header. */
#define EAGER_MAX (4096 - 16)

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
    int gpudirect;   /* HVD_IB_GPUDIRECT: 0, 1, 2 (auto) */
    int no_gpu_rank; /* this rank has no CUDA device (-1: none) */
    int flag[MAXR];  /* __atomic */
} shared;

struct rank_ctx {
    int rank;
    shared *sh;
    hvd_transport *tp;
    hvd_status open_st;
    hvd_status st;
    char err[HVD_ERROR_MAX];
    int bad;
    char note[256];
    unsigned mem_types;
    hvd_verbs_counters ctr; /* at the end of the body */
    hvd_mr_stats ms;
};

static void record(rank_ctx *r, hvd_status st) {
    if (r->st != HVD_OK)
        return;
    r->st = st;
    snprintf(r->err, sizeof(r->err), "%s", hvd_error_get());
}

static void note(rank_ctx *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note(rank_ctx *r, const char *fmt, ...) {
    va_list ap;

    if (r->bad++ > 0)
        return;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof(r->note), fmt, ap);
    va_end(ap);
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
                          sh->mr_cache, sh->gpudirect, &p);
    p.gpu_device = r->rank == sh->no_gpu_rank ? -1 : 0;
    r->open_st = hvd_verbs_open_with(&fake_seam, &p, &r->tp);
    if (r->open_st != HVD_OK) {
        snprintf(r->err, sizeof(r->err), "%s", hvd_error_get());
        return NULL;
    }
    r->mem_types = r->tp->ops->mem_types(r->tp);
    sh->body(r);
    if (r->tp != NULL) {
        hvd_verbs_counters_get(r->tp, &r->ctr);
        hvd_verbs_mr_stats(r->tp, &r->ms);
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
    sh.chunk_bytes = 4096;
    sh.ring_chunks = 2;
    sh.gpudirect = 2;
    sh.no_gpu_rank = -1;
    return sh;
}

/* A machine with a CUDA device and nvidia-peermem. */
static int setup(void **state) {
    (void)state;
    fake_reset();
    fake_cfg()->cuda_devices = 1;
    fake_cfg()->peermem = 1;
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

/* Progress until the transport has received `want` RTRs in all. */
static hvd_status wait_rtr(hvd_transport *tp, uint64_t want) {
    int64_t end = hvd_now_ns() + 30 * 1000000000LL;
    hvd_verbs_counters c;

    for (;;) {
        hvd_status st = tp->ops->progress(tp, 10);
        if (st != HVD_OK)
            return st;
        hvd_verbs_counters_get(tp, &c);
        if (c.rtr_rx >= want)
            return HVD_OK;
        if (hvd_now_ns() > end)
            return hvd_error_set(HVD_ERR_INTERNAL, "test: no RTR came");
    }
}

static uint8_t pattern(int src, int msg, size_t i) {
    return (uint8_t)(src * 131 + msg * 13 + i * 7 + (i >> 9));
}

/* A buffer of len bytes in device memory (inaccessible to the CPU) or
 * host memory, filled with the pattern of (src, msg) or zeroed. */
static uint8_t *buffer(int dev, size_t len, int src, int msg, int fill) {
    uint8_t *host = malloc(len ? len : 1), *b;

    for (size_t i = 0; i < len; i++)
        host[i] = fill ? pattern(src, msg, i) : 0;
    if (!dev)
        return host;
    b = fake_dev_alloc(len, 1);
    if (b != NULL && len > 0)
        fake_dev_write(b, host, len);
    free(host);
    return b;
}

static void release(int dev, uint8_t *b) {
    if (dev)
        fake_dev_free(b);
    else
        free(b);
}

/* The index of the first byte of b (len bytes) not the pattern of (src,
 * msg), or len. */
static size_t check(int dev, const uint8_t *b, size_t len, int src, int msg) {
    uint8_t *host = malloc(len ? len : 1);
    size_t i;

    if (dev && len > 0)
        fake_dev_read(host, b, len);
    else if (len > 0)
        memcpy(host, b, len);
    for (i = 0; i < len; i++)
        if (host[i] != pattern(src, msg, i))
            break;
    free(host);
    return i;
}

/* ------------------------------------------------------------------ */
/* Probe and agreement                                                 */

static void probe_caps(void **state) {
    hvd_transport_params p;
    hvd_caps caps;
    const unsigned both =
        HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE);

    (void)state;
    hvd_env_var gd[] = {{"HVD_IB_GPUDIRECT", "auto"}, {NULL, NULL}};

    memset(&p, 0, sizeof(p));
    p.env = hvd_env_vars_get;
    p.env_ctx = gd;
    p.gpu_device = 0;
    assert_int_equal(hvd_verbs_probe_with(&fake_seam, &p, &caps), HVD_OK);
    assert_true(caps.usable);
    assert_int_equal(caps.mem_types, both);
    /* No nvidia-peermem, no CUDA device, no device for this rank, or the
     * knob off: host memory only. */
    fake_cfg()->peermem = 0;
    hvd_verbs_probe_with(&fake_seam, &p, &caps);
    assert_true(caps.usable);
    assert_int_equal(caps.mem_types, 0);
    fake_cfg()->peermem = 1;
    fake_cfg()->cuda_devices = 0;
    hvd_verbs_probe_with(&fake_seam, &p, &caps);
    assert_int_equal(caps.mem_types, 0);
    fake_cfg()->cuda_devices = 1;
    p.gpu_device = -1;
    hvd_verbs_probe_with(&fake_seam, &p, &caps);
    assert_int_equal(caps.mem_types, 0);
    p.gpu_device = 0;
    gd[0].value = "off";
    hvd_verbs_probe_with(&fake_seam, &p, &caps);
    assert_int_equal(caps.mem_types, 0);
    gd[0].value = "on";
    hvd_verbs_probe_with(&fake_seam, &p, &caps);
    assert_int_equal(caps.mem_types, both);
}

static void nothing(rank_ctx *r) { (void)r; }

/* Registering device memory without nvidia-peermem is refused with the
 * reason. */
static void refuse_register(rank_ctx *r) {
    uint8_t *b = fake_dev_alloc(4096, 1);
    hvd_mr_entry *e = NULL;

    if (hvd_verbs_register(r->tp, b, 4096, HVD_MEM_DEVICE, &e) !=
            HVD_ERR_UNSUPPORTED ||
        strstr(hvd_error_get(), "nvidia-peermem") == NULL)
        note(r, "device registration without nvidia-peermem: %s",
             hvd_error_get());
    fake_dev_free(b);
}

static void open_agreement(void **state) {
    rank_ctx r[MAXR];
    const unsigned both =
        HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE);
    shared sh = defaults(3, nothing);

    (void)state;
    /* Every rank can: on. */
    run(&sh, r);
    expect_clean(r, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r[i].mem_types, both);
    /* One rank without a CUDA device: off everywhere (auto). */
    sh = defaults(3, nothing);
    sh.no_gpu_rank = 1;
    run(&sh, r);
    expect_clean(r, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r[i].mem_types, 0);
    /* Required: open fails everywhere, naming the rank. */
    sh.gpudirect = 1;
    run(&sh, r);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].open_st, HVD_ERR_UNSUPPORTED);
        assert_non_null(strstr(r[i].err, "HVD_IB_GPUDIRECT=1"));
    }
    assert_non_null(strstr(r[1].err, "this rank has no CUDA device"));
    assert_non_null(strstr(r[0].err, "rank 1 cannot move CUDA device memory"));
    /* The knob off: off. */
    sh = defaults(2, nothing);
    sh.gpudirect = 0;
    run(&sh, r);
    expect_clean(r, 2);
    assert_int_equal(r[0].mem_types, 0);
    /* No nvidia-peermem: off, and device registration is refused. */
    fake_cfg()->peermem = 0;
    sh = defaults(2, refuse_register);
    run(&sh, r);
    expect_clean(r, 2);
    assert_int_equal(r[0].mem_types, 0);
}

/* ------------------------------------------------------------------ */
/* Every pair of memory types                                          */

static const size_t sizes[] = {
    0,    1,     100,       EAGER_MAX - 1, EAGER_MAX, EAGER_MAX + 1,
    4096, 10000, 65536 + 3, (3 << 20) + 5};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* (source, destination) device: 1, host: 0. */
static const int kinds[4][2] = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};

/* Both ranks send each case to each other at once, one case at a time,
 * and check the bytes and the path from the counters. A host send to a
 * device receive waits for the receiver's RTR first: the transport
 * requires it (proto.h). */
static void pairs(rank_ctx *r) {
    hvd_transport *tp = r->tp;
    int peer = 1 - r->rank, msg = 0;
    uint64_t rtrs = 0; /* RTRs the peer has sent by now */
    hvd_status st = HVD_OK;

    for (int k = 0; k < 4 && st == HVD_OK; k++) {
        int sdev = kinds[k][0], ddev = kinds[k][1];
        for (size_t z = 0; z < NSIZES && st == HVD_OK; z++, msg++) {
            size_t len = sizes[z];
            uint8_t *out = buffer(sdev, len, r->rank, msg, 1);
            uint8_t *in = buffer(ddev, len, 0, 0, 0);
            hvd_verbs_counters a, b;
            hvd_req sreq, rreq;
            size_t bad;

            hvd_verbs_counters_get(tp, &a);
            st = tp->ops->irecv(tp, peer, HVD_CHANNEL_DATA, in, len, &rreq);
            rtrs += ddev && len > 0;
            if (st == HVD_OK && !sdev && ddev && len > 0)
                st = wait_rtr(tp, rtrs);
            if (st == HVD_OK)
                st =
                    tp->ops->isend(tp, peer, HVD_CHANNEL_DATA, out, len, &sreq);
            if (st == HVD_OK)
                st = wait_req(tp, &rreq);
            if (st == HVD_OK)
                st = wait_req(tp, &sreq);
            hvd_verbs_counters_get(tp, &b);
            if (st == HVD_OK && (bad = check(ddev, in, len, peer, msg)) != len)
                note(r, "%s->%s %zu bytes: byte %zu wrong",
                     sdev ? "device" : "host", ddev ? "device" : "host", len,
                     bad);
            /* The path taken (this rank sent and received the case). */
            if (st == HVD_OK && len > 0) {
                uint64_t rdv_rx = b.rdv_rx - a.rdv_rx;
                uint64_t copied = b.cpu_bytes - a.cpu_bytes;
                uint64_t eager = b.eager_tx - a.eager_tx;
                uint64_t staged = b.staged_tx - a.staged_tx;
                uint64_t ring_rx = b.ring_rx - a.ring_rx;
                uint64_t eager_rx = b.eager_rx - a.eager_rx;
                if (ddev && (rdv_rx != 1 || ring_rx != 0 || eager_rx != 0))
                    note(r,
                         "%s->device %zu bytes: rendezvous %llu, ring %llu, "
                         "eager %llu",
                         sdev ? "device" : "host", len,
                         (unsigned long long)rdv_rx,
                         (unsigned long long)ring_rx,
                         (unsigned long long)eager_rx);
                if (sdev && (eager != 0 || staged != 0))
                    note(r, "device->%s %zu bytes: eager %llu, staged %llu",
                         ddev ? "device" : "host", len,
                         (unsigned long long)eager, (unsigned long long)staged);
                if (sdev && ddev && copied != 0)
                    note(r, "device->device %zu bytes: the CPU copied %llu",
                         len, (unsigned long long)copied);
                if (sdev && !ddev &&
                    (b.ring_dev_tx - a.ring_dev_tx != 1 ||
                     b.rts_tx - a.rts_tx != 1))
                    note(r, "device->host %zu bytes: not through the ring",
                         len);
                if (!sdev && !ddev &&
                    (b.rdv_tx != a.rdv_tx || b.rtr_tx != a.rtr_tx ||
                     b.rts_tx != a.rts_tx))
                    note(r, "host->host %zu bytes: a rendezvous", len);
            }
            release(sdev, out);
            release(ddev, in);
        }
    }
    record(r, st);
}

static void memory_type_pairs(void **state) {
    shared sh = defaults(2, pairs);
    rank_ctx r[MAXR];
    fake_stats st;

    (void)state;
    run(&sh, r);
    expect_clean(r, 2);
    fake_get_stats(&st);
    /* Rendezvous chunks before the last are plain writes: host sends,
     * staged, go 4 KiB at a time. (A host send at an address where a
     * freed device buffer was once registered took that registration and
     * 1 MiB writes, under TSan's allocator: hvd_mr_find_host.) */
    assert_true(st.plain_writes > 1000);
    assert_int_equal(st.rnr_waits, 0);
    /* The same with large chunks and user buffers registered. */
    sh = defaults(2, pairs);
    sh.chunk_bytes = 1 << 20;
    sh.ring_chunks = 4;
    sh.mr_cache = 1;
    run(&sh, r);
    expect_clean(r, 2);
}

/* ------------------------------------------------------------------ */
/* Bursts: many device messages in flight, sends before receives        */

#define BURST 24

static size_t burst_len(int m) {
    static const size_t l[] = {1, 5000, 70000, EAGER_MAX, 300001, 17};
    return l[m % 6];
}

/* Every rank sends BURST messages to every other, all posted before any
 * receive; receives into device memory (ddev) or host memory. */
static void burst(rank_ctx *r, int ddev) {
    int n = r->sh->size, me = r->rank;
    size_t per = (size_t)(n - 1) * BURST, k = 0;
    hvd_req *sreq = calloc(per, sizeof(*sreq));
    hvd_req *rreq = calloc(per, sizeof(*rreq));
    uint8_t **out = calloc(per, sizeof(*out));
    uint8_t **in = calloc(per, sizeof(*in));
    hvd_status st = HVD_OK;

    for (int peer = 0; peer < n && st == HVD_OK; peer++) {
        if (peer == me)
            continue;
        for (int m = 0; m < BURST && st == HVD_OK; m++, k++) {
            out[k] = buffer(1, burst_len(m), me * 8 + peer, m, 1);
            st = r->tp->ops->isend(r->tp, peer, HVD_CHANNEL_DATA, out[k],
                                   burst_len(m), &sreq[k]);
        }
    }
    k = 0;
    for (int peer = 0; peer < n && st == HVD_OK; peer++) {
        if (peer == me)
            continue;
        for (int m = 0; m < BURST && st == HVD_OK; m++, k++) {
            in[k] = buffer(ddev, burst_len(m), 0, 0, 0);
            st = r->tp->ops->irecv(r->tp, peer, HVD_CHANNEL_DATA, in[k],
                                   burst_len(m), &rreq[k]);
        }
    }
    for (size_t i = 0; i < k && st == HVD_OK; i++)
        st = wait_req(r->tp, &rreq[i]);
    for (size_t i = 0; i < k && st == HVD_OK; i++)
        st = wait_req(r->tp, &sreq[i]);
    record(r, st);
    k = 0;
    for (int peer = 0; peer < n; peer++) {
        if (peer == me)
            continue;
        for (int m = 0; m < BURST; m++, k++) {
            size_t bad;
            if (st == HVD_OK && (bad = check(ddev, in[k], burst_len(m),
                                             peer * 8 + me, m)) != burst_len(m))
                note(r, "from %d msg %d (%zu bytes): byte %zu wrong", peer, m,
                     burst_len(m), bad);
            release(1, out[k]);
            release(ddev, in[k]);
        }
    }
    free(sreq);
    free(rreq);
    free(out);
    free(in);
}

static void burst_to_device(rank_ctx *r) { burst(r, 1); }
static void burst_to_host(rank_ctx *r) { burst(r, 0); }

static void bursts(void **state) {
    rank_ctx r[MAXR];
    fake_stats st;
    int flushes = 0;

    (void)state;
    for (int n = 2; n <= 3; n++) {
        shared sh = defaults(n, burst_to_device);
        run(&sh, r);
        expect_clean(r, n);
        for (int i = 0; i < n; i++) {
            assert_int_equal(r[i].ctr.rdv_rx, (uint64_t)(n - 1) * BURST);
            assert_int_equal(r[i].ctr.cpu_bytes, 0);
        }
        /* Each device receive flushed the HCA's writes before it
         * completed. */
        fake_get_stats(&st);
        assert_int_equal(st.flushes - flushes, n * (n - 1) * BURST);
        flushes = st.flushes;
        sh = defaults(n, burst_to_host);
        run(&sh, r);
        expect_clean(r, n);
        for (int i = 0; i < n; i++) {
            assert_int_equal(r[i].ctr.ring_dev_tx, (uint64_t)(n - 1) * BURST);
            assert_int_equal(r[i].ctr.eager_tx, 0);
            assert_int_equal(r[i].ctr.staged_tx, 0);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Disagreements                                                       */

/* Rank 0 sends 100 bytes of host memory (eager); rank 1 receives them
 * into device memory once they are there. Rank 2 waits on rank 1. */
static void type_mismatch(rank_ctx *r) {
    uint8_t host[100];
    hvd_req req;
    hvd_status st = HVD_OK;
    uint8_t *dev = NULL;

    memset(host, 7, sizeof(host));
    if (r->rank == 0) {
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, host, 100, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
        __atomic_store_n(&r->sh->flag[0], 1, __ATOMIC_RELEASE);
        if (st == HVD_OK)
            st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, host, 1, &req);
    } else if (r->rank == 1) {
        int64_t end = hvd_now_ns() + 10 * 1000000000LL;
        while (!__atomic_load_n(&r->sh->flag[0], __ATOMIC_ACQUIRE) &&
               hvd_now_ns() < end)
            r->tp->ops->progress(r->tp, 1);
        for (int i = 0; i < 10; i++)
            r->tp->ops->progress(r->tp, 1);
        dev = fake_dev_alloc(100, 1);
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, dev, 100, &req);
    } else {
        st = r->tp->ops->irecv(r->tp, 1, HVD_CHANNEL_DATA, host, 1, &req);
    }
    if (st == HVD_OK)
        st = wait_req(r->tp, &req);
    record(r, st);
    if (dev != NULL)
        fake_dev_free(dev);
}

/* Device to device, 5000 bytes sent where 6000 are expected. */
static void length_mismatch(rank_ctx *r) {
    uint8_t *dev = fake_dev_alloc(6000, 1);
    hvd_req req;
    hvd_status st;

    if (r->rank == 0)
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, dev, 5000, &req);
    else
        st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, dev, 6000, &req);
    if (st == HVD_OK)
        st = wait_req(r->tp, &req);
    record(r, st);
    fake_dev_free(dev);
}

/* A device send whose receive is never posted: the stall timeout. */
static void never_posted(rank_ctx *r) {
    uint8_t *dev = fake_dev_alloc(100000, 1);
    hvd_req req;
    hvd_status st = HVD_OK;

    if (r->rank == 0) {
        st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, dev, 100000, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
        __atomic_store_n(&r->sh->flag[0], 1, __ATOMIC_RELEASE);
    } else {
        /* Alive, but not calling the transport. */
        int64_t end = hvd_now_ns() + 10 * 1000000000LL;
        while (!__atomic_load_n(&r->sh->flag[0], __ATOMIC_ACQUIRE) &&
               hvd_now_ns() < end) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        r->tp->ops->close(r->tp);
        r->tp = NULL;
    }
    record(r, st);
    fake_dev_free(dev);
}

static void disagreements(void **state) {
    rank_ctx r[MAXR];
    shared sh = defaults(3, type_mismatch);

    (void)state;
    run(&sh, r);
    for (int i = 0; i < 3; i++) {
        if (r[i].st != HVD_ERR_TRANSPORT)
            fprintf(stderr, "rank %d: %s: %s\n", i, hvd_status_name(r[i].st),
                    r[i].err);
        assert_int_equal(r[i].st, HVD_ERR_TRANSPORT);
        assert_non_null(strstr(r[i].err, "disagree on the memory type"));
    }
    assert_non_null(strstr(r[1].err, "rank 0 sent message 0 of 100 bytes on "
                                     "the data channel from host memory"));
    assert_non_null(strstr(r[1].err, "this rank (rank 1) receives it into "
                                     "CUDA device memory"));
    assert_non_null(strstr(r[2].err, "reported"));

    sh = defaults(2, length_mismatch);
    run(&sh, r);
    assert_int_equal(r[0].st, HVD_ERR_MISMATCH);
    assert_non_null(strstr(r[0].err, "rank 1 expects a message of 6000 bytes "
                                     "where this rank (rank 0) sends 5000"));
    assert_int_equal(r[1].st, HVD_ERR_MISMATCH);
    assert_non_null(strstr(r[1].err, "rank 0 reported"));

    sh = defaults(2, never_posted);
    sh.timeout_ns = 1000000000LL;
    run(&sh, r);
    assert_int_equal(r[0].st, HVD_ERR_TIMEOUT);
    assert_non_null(strstr(r[0].err, "nothing (not even a heartbeat) "
                                     "arrived from rank 1"));
}

/* ------------------------------------------------------------------ */
/* Address reuse                                                        */

/* Rank 0 sends from one device buffer to rank 1's device buffer three
 * times; before the third, both allocations are freed and made again at
 * the same addresses (new buffer ids). */
static void reuse(rank_ctx *r) {
    const size_t len = 50000;
    uint8_t *b = buffer(1, len, 0, 0, r->rank == 0);
    hvd_status st = HVD_OK;

    for (int k = 0; k < 3 && st == HVD_OK; k++) {
        hvd_req req;
        if (k == 2)
            fake_dev_reuse(b);
        if (r->rank == 0)
            st = r->tp->ops->isend(r->tp, 1, HVD_CHANNEL_DATA, b, len, &req);
        else
            st = r->tp->ops->irecv(r->tp, 0, HVD_CHANNEL_DATA, b, len, &req);
        if (st == HVD_OK)
            st = wait_req(r->tp, &req);
        if (st == HVD_OK && r->rank == 1 && check(1, b, len, 0, 0) != len)
            note(r, "round %d: wrong bytes", k);
        if (r->rank == 1) {
            uint8_t zero[1] = {0};
            fake_dev_write(b, zero, 1); /* the next round rewrites it */
        }
    }
    record(r, st);
    hvd_verbs_mr_stats(r->tp, &r->ms);
    release(1, b);
}

static void address_reuse(void **state) {
    shared sh = defaults(2, reuse);
    rank_ctx r[MAXR];
    fake_stats st;

    (void)state;
    run(&sh, r);
    expect_clean(r, 2);
    for (int i = 0; i < 2; i++) {
        /* Registered, found again, then registered anew. */
        assert_int_equal(r[i].ms.misses, 2);
        assert_int_equal(r[i].ms.hits, 1);
        assert_int_equal(r[i].ms.reused, 1);
    }
    fake_get_stats(&st);
    /* 2 x 2 transport buffers, 2 x 2 user regions. */
    assert_int_equal(st.regs, 8);
}

/* ------------------------------------------------------------------ */
/* Collectives on device buffers                                        */

static hvd_status dev_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    *out = fake_dev_alloc(bytes, 0);
    return *out != NULL ? HVD_OK
                        : hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
}

static void dev_free(void *ctx, void *p) {
    (void)ctx;
    if (p != NULL)
        fake_dev_free(p);
}

/* The collectives with every buffer, scratch included, in (simulated)
 * device memory. Their reductions run on the CPU here, so the memory is
 * left accessible; what matters is that every message takes the device
 * path. */
static void collectives(rank_ctx *r) {
    int n = r->sh->size, me = r->rank;
    hvd_memops ops = hvd_host_memops;
    hvd_comm_config cfg;
    hvd_comm *comm = NULL;
    const size_t counts[] = {1, 1000, 50000, 300001};
    hvd_status st;

    ops.alloc = dev_alloc;
    ops.free = dev_free;
    hvd_comm_config_default(&cfg);
    cfg.chunk_bytes = 16 * 1024;
    st = hvd_comm_create(me, n, r->tp, HVD_CHANNEL_DATA, &cfg, &comm);
    if (st == HVD_OK)
        hvd_comm_set_memops(comm, &ops, NULL);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && st == HVD_OK;
         c++) {
        size_t count = counts[c];
        float *in = fake_dev_alloc(count * sizeof(float), 0);
        float *out = fake_dev_alloc(count * sizeof(float) * (size_t)n, 0);
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
                    note(r, "%s allreduce of %zu: [%zu] = %g, want %g",
                         algo == 0 ? "ring" : "rd", count, i, (double)out[i],
                         (double)want);
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
                    note(r, "broadcast of %zu: [%zu] wrong", count, i);
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
                        note(r, "allgather of %zu: rank %d's part wrong", count,
                             p);
                        break;
                    }
        }
        fake_dev_free(in);
        fake_dev_free(out);
    }
    record(r, st);
    hvd_comm_destroy(comm);
}

static void collectives_on_device(void **state) {
    rank_ctx r[MAXR];

    (void)state;
    for (int n = 2; n <= 4; n++) {
        shared sh = defaults(n, collectives);
        sh.chunk_bytes = 8192;
        sh.ring_chunks = 4;
        run(&sh, r);
        expect_clean(r, n);
        for (int i = 0; i < n; i++) {
            if (r[i].ctr.ring_rx != 0 || r[i].ctr.cpu_bytes != 0 ||
                r[i].ctr.rdv_rx == 0)
                fprintf(stderr,
                        "np %d rank %d: ring %llu, eager %llu, copied %llu, "
                        "rendezvous %llu\n",
                        n, i, (unsigned long long)r[i].ctr.ring_rx,
                        (unsigned long long)r[i].ctr.eager_rx,
                        (unsigned long long)r[i].ctr.cpu_bytes,
                        (unsigned long long)r[i].ctr.rdv_rx);
            /* Every byte by rendezvous; only empty messages (which
             * carry nothing) go eager. */
            assert_true(r[i].ctr.rdv_rx > 0);
            assert_int_equal(r[i].ctr.ring_rx, 0);
            assert_int_equal(r[i].ctr.cpu_bytes, 0);
            assert_int_equal(r[i].ctr.staged_tx, 0);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(probe_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(open_agreement, setup, teardown),
        cmocka_unit_test_setup_teardown(memory_type_pairs, setup, teardown),
        cmocka_unit_test_setup_teardown(bursts, setup, teardown),
        cmocka_unit_test_setup_teardown(disagreements, setup, teardown),
        cmocka_unit_test_setup_teardown(address_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(collectives_on_device, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
