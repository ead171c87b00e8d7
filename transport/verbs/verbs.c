#include "transport/verbs/verbs.h"
#include "transport/verbs/settings.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/failure.h"
#include "transport/rendezvous.h"
#include "transport/verbs/conn.h"
#include "transport/verbs/device.h"
#include "transport/verbs/mr.h"
#include "transport/verbs/proto.h"
#include "transport/verbs/seam.h"

/* Eager buffers (header included), sent and received. */
#define EAGER_BYTES 4096
/* Eager buffers a peer may fill before it waits for credits. */
#define EAGER_CREDITS 16
/* Posted receives beyond the credits, for control messages (and the
 * HVD_VRTR_MAX rendezvous FINs, counted apart). */
#define CTL_RESERVE 8
/* Send buffers per queue pair; the last SEND_RESERVE are kept for control
 * messages, so credits can always go back. */
#define SEND_BUFS (EAGER_CREDITS + 4)
#define SEND_RESERVE 4
/* The control channel's receive ring (its messages are mostly small). */
#define CTL_SLOT_BYTES (16 * 1024)
#define CTL_SLOTS 4
/* Staging chunks shared by all queue pairs, for sends not registered. */
#define STAGE_MIN 16
/* Registration cache bounds. */
#define MR_CACHE_ENTRIES 128
#define MR_CACHE_BYTES ((size_t)4 << 30)
#define POLL_BATCH 32
#define DRAIN_ROUNDS 64
/* The least a rendezvous write from registered memory carries: it goes
 * into the receiver's own buffer, so the ring's slot size does not bound
 * it, and fewer, larger writes cost fewer work requests. */
#define RDV_CHUNK_MIN ((size_t)1 << 20)
/* How often stalled peers are looked for. */
#define CHECK_NS (100 * 1000000LL)
/* Most time between two heartbeats of a waiting rank. */
#define HEARTBEAT_NS (1000 * 1000000LL)
/* Time a failing rank spends telling its peers why. */
#define ABORT_NS (200 * 1000000LL)
/* How long a goodbye may take. */
#define SHUTDOWN_NS (30 * 1000000000LL)
/* Queue pair timing: local ACK timeout 4.096 us * 2^14 (67 ms), 7
 * retries; "receiver not ready" retried without limit (7), 0.64 ms apart
 * (12). */
#define QP_TIMEOUT 14
#define QP_RETRY 7
#define QP_RNR_RETRY 7
#define QP_MIN_RNR 12

#define RECV_BIT 0x80000000u
#define SEND_ID(qi, seq)                                                       \
    (((uint64_t)(qi) << 32) | ((uint32_t)(seq)&0x7fffffffu))
#define RECV_ID(qi, idx) (((uint64_t)(qi) << 32) | RECV_BIT | (uint32_t)(idx))

_Static_assert(HVD_VHDR_LEN + 12 + 64 <= EAGER_BYTES,
               "an ABORT must fit in an eager buffer");
_Static_assert(EAGER_BYTES >= HVD_VCONN_EAGER_MIN, "eager buffers too small");

enum { WR_EAGER = 1, WR_CHUNK, WR_CTL, WR_RDV };

/* A send not completely posted yet. */
typedef struct txmsg {
    hvd_req *req;
    const uint8_t *buf;
    size_t len;
    size_t off;       /* bytes posted */
    hvd_mr_entry *mr; /* its region when sent from the user's buffer */
    int tried_mr;
    /* GPUDirect (proto.h). */
    uint64_t seq;   /* its number on the queue pair */
    uint64_t bufid; /* device memory: the allocation's id */
    uint64_t raddr; /* rendezvous: the receiver's buffer */
    uint32_t rkey;
    uint8_t dev;      /* from CUDA device memory */
    uint8_t rdv;      /* written into the receiver's buffer */
    uint8_t rts_sent; /* device memory: RTS sent */
} txmsg;

/* A posted send work request, released by its completion (send
 * completions of a queue pair arrive in posting order). */
typedef struct wrctx {
    hvd_req *req;     /* completed with this WR, or NULL */
    hvd_mr_entry *mr; /* released with this WR, or NULL */
    int stage;        /* staging chunk to free, or -1 */
    uint8_t kind;
    uint8_t type; /* control message type */
    uint8_t sbuf; /* holds the oldest send buffer */
} wrctx;

typedef struct rxreq {
    hvd_req *req;
    uint8_t *buf;
    size_t len;
    size_t got;
    uint64_t seq;     /* its number on the queue pair */
    hvd_mr_entry *mr; /* device memory: its region, held until done */
    uint8_t dev;      /* into CUDA device memory: by rendezvous */
    uint8_t rtr_sent;
} rxreq;

enum { RX_EAGER = 0, RX_RING = 1, RX_FIN = 2 };

/* Data that arrived and waits for its irecv. */
typedef struct rxitem {
    uint8_t chunk; /* RX_EAGER: eager buffer idx; RX_RING: ring slot idx;
                      RX_FIN: a rendezvous ended, idx its tag */
    uint8_t last;
    uint32_t idx;
    uint32_t len;
} rxitem;

typedef struct vtp vtp;

/* The queue pair of one (peer, channel). */
typedef struct vqp {
    vtp *tp;
    int peer;
    int ch;
    int index; /* peer * 2 + ch */
    struct ibv_qp *qp;
    uint32_t psn;
    /* The peer's side. */
    uint64_t rring; /* slot 0 of the ring the peer keeps for us */
    uint32_t rkey;
    uint32_t rslots;
    uint32_t rslot_bytes;
    uint32_t reager_bytes;
    uint64_t tx_slot;
    hvd_vcredit cr;
    /* Receiving. */
    uint8_t *rbufs; /* nrbufs eager buffers, all posted when free */
    uint32_t nrbufs;
    uint8_t *ring; /* our ring for this peer */
    uint32_t slots;
    uint32_t slot_bytes;
    uint64_t rx_slot;
    rxitem *arr; /* arrivals: a ring of nrbufs */
    uint32_t arr_head;
    uint32_t arr_count;
    rxreq *rq; /* posted irecvs, a growing ring */
    size_t rq_cap;
    size_t rq_head;
    size_t rq_count;
    /* Sending. */
    txmsg *sq; /* isends not fully posted, a growing ring */
    size_t sq_cap;
    size_t sq_head;
    size_t sq_count;
    uint8_t *sbufs; /* SEND_BUFS send buffers, used in order */
    uint32_t sb_first;
    uint32_t sb_used;
    wrctx *wr; /* wr_cap contexts of posted sends */
    uint32_t wr_cap;
    uint64_t wr_posted;
    uint64_t wr_done;
    int hb_out;
    int hello_rx;
    int hello_done;
    int bye_rx;
    int bye_tx;
    int abort_out;
    /* GPUDirect (proto.h): message numbers and the rendezvous. */
    uint64_t tx_seq;            /* the next isend's number */
    uint64_t tx_begun;          /* messages numbered below this have started */
    uint64_t rx_seq;            /* the next irecv's number */
    hvd_vrdv rtr[HVD_VRTR_MAX]; /* RTRs received and not used yet */
    int nrtr;
    uint64_t ring_ok;    /* RING received for message ring_ok - 1 (0: none) */
    uint64_t rts_in;     /* RTS for message rts_in - 1, not posted yet */
    uint64_t ring_reply; /* RING owed for message ring_reply - 1 */
    uint32_t rtr_out;    /* RTRs sent whose receive is not done */
    uint32_t rtr_todo;   /* device receives whose RTR is not sent */
} vqp;

struct vtp {
    hvd_transport base;
    const hvd_ibv_seam *seam;
    int rank;
    int size;
    hvd_vdev dev;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int armed;
    int wakefd;
    uint8_t *mem; /* receive and send buffers, staging */
    size_t mem_len;
    struct ibv_mr *mem_mr;
    uint8_t *ring; /* receive rings, written by peers */
    size_t ring_len;
    struct ibv_mr *ring_mr;
    uint8_t *stage;
    uint32_t stage_bytes;
    int nstage;
    int *stage_free;
    int nstage_free;
    uint32_t slots[2];
    uint32_t slot_bytes[2];
    vqp *qps; /* size * 2; this rank's own pair unused */
    hvd_mr_cache *mrc;
    int auto_reg; /* register user send buffers on their own */
    int mr_warned;
    int gpudirect;  /* every rank moves CUDA device memory itself */
    int gpu_device; /* the CUDA device of this rank's device memory */
    hvd_verbs_counters ctr;
    int64_t timeout_ns;
    int64_t heartbeat_ns;
    int64_t last_check;
    int64_t last_hb;
    int *pending; /* per peer: requests in flight */
    int64_t *last_active;
    char (*hosts)[HVD_HOST_MAX];
    int *pids;
    int shutting_down;
    int opening; /* failures are agreed through the bootstrap */
    /* First failed work completion of a drain, blamed once the drain has
     * looked for an ABORT that explains it. */
    int err_pending;
    hvd_status err_status;
    char err_text[HVD_ERROR_MAX];
    int err_peer;
    hvd_tp_failure failure; /* the first failure, which wins */
};

/* ------------------------------------------------------------------ */
/* Failure                                                             */

static void describe(const vtp *tp, int peer, char *out, size_t outlen) {
    if (peer < 0 || peer >= tp->size)
        snprintf(out, outlen, "an unknown peer");
    else if (tp->hosts != NULL && tp->pids != NULL)
        snprintf(out, outlen, "rank %d (pid %d on %s)", peer, tp->pids[peer],
                 tp->hosts[peer]);
    else
        snprintf(out, outlen, "rank %d", peer);
}

static void req_done(vtp *tp, hvd_req *req, hvd_status st) {
    req->status = st;
    req->done = 1;
    if (req->peer >= 0 && req->peer < tp->size)
        tp->pending[req->peer]--;
}

static int sb_free(const vqp *q) { return SEND_BUFS - (int)q->sb_used; }

static int wr_free(const vqp *q) {
    return (int)(q->wr_cap - (uint32_t)(q->wr_posted - q->wr_done));
}

static uint8_t *sb_take(vqp *q) {
    uint32_t i = (q->sb_first + q->sb_used) % SEND_BUFS;
    q->sb_used++;
    return q->sbufs + (size_t)i * EAGER_BYTES;
}

/* Posts one signaled send work request with its context. Returns the
 * errno of ibv_post_send (0: posted). */
static int post_wr(vqp *q, struct ibv_send_wr *wr, const wrctx *ctx) {
    struct ibv_send_wr *bad = NULL;
    int err;

    q->wr[q->wr_posted % q->wr_cap] = *ctx;
    wr->wr_id = SEND_ID(q->index, q->wr_posted);
    wr->send_flags |= IBV_SEND_SIGNALED;
    wr->next = NULL;
    err = q->tp->seam->post_send(q->qp, wr, &bad);
    if (err == 0)
        q->wr_posted++;
    return err;
}

/* Posts a control message (header and payload) on q if a send buffer and
 * a work request are free. Returns 0 if posted, 1 if not now, else the
 * errno of ibv_post_send. */
static int post_ctl(vqp *q, uint8_t type, const uint8_t *payload, size_t plen) {
    vtp *tp = q->tp;
    hvd_vhdr h = {.type = type, .len = (uint32_t)plen};
    struct ibv_sge sge;
    struct ibv_send_wr wr;
    wrctx ctx = {.stage = -1, .kind = WR_CTL, .type = type, .sbuf = 1};
    uint8_t *b;
    int err;

    if (sb_free(q) < 1 || wr_free(q) < 1 || q->qp == NULL)
        return 1;
    if (type != HVD_VMSG_ABORT)
        hvd_vcredit_collect(&q->cr, &h.eager_ret, &h.slot_ret);
    b = sb_take(q);
    hvd_vhdr_encode(&h, b);
    if (plen > 0)
        memcpy(b + HVD_VHDR_LEN, payload, plen);
    sge = (struct ibv_sge){.addr = (uintptr_t)b,
                           .length = (uint32_t)(HVD_VHDR_LEN + plen),
                           .lkey = tp->mem_mr->lkey};
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    err = post_wr(q, &wr, &ctx);
    if (err != 0) {
        q->sb_used--;
        /* The credits taken for the header were not sent. */
        q->cr.eager_ret += h.eager_ret;
        q->cr.slot_ret += h.slot_ret;
    }
    return err;
}

static const char *ctl_name(uint8_t type) {
    switch (type) {
    case HVD_VMSG_CREDIT:
        return "credit message";
    case HVD_VMSG_HEARTBEAT:
        return "heartbeat";
    case HVD_VMSG_BYE:
        return "goodbye";
    case HVD_VMSG_HELLO:
        return "hello";
    case HVD_VMSG_ABORT:
        return "abort notice";
    case HVD_VMSG_RTR:
        return "ready-to-receive message";
    case HVD_VMSG_RTS:
        return "ready-to-send message";
    case HVD_VMSG_RING:
        return "ring answer";
    default:
        return "message";
    }
}

/* Drains the completion queue for up to ABORT_NS so that the ABORT
 * notices posted by fail_with leave before the queue pairs are torn down.
 * Nothing else is processed: the transport has failed. */
static void flush_aborts(vtp *tp) {
    int64_t deadline = hvd_now_ns() + ABORT_NS;
    int left = 0;

    for (int i = 0; i < tp->size * 2; i++)
        left += tp->qps[i].abort_out;
    while (left > 0 && hvd_now_ns() < deadline) {
        struct ibv_wc wc[POLL_BATCH];
        int n = tp->seam->poll_cq(tp->cq, POLL_BATCH, wc);
        if (n < 0)
            break;
        for (int i = 0; i < n; i++) {
            uint32_t qi = (uint32_t)(wc[i].wr_id >> 32);
            if ((wc[i].wr_id & RECV_BIT) || qi >= (uint32_t)tp->size * 2)
                continue;
            vqp *q = &tp->qps[qi];
            wrctx *c = &q->wr[(wc[i].wr_id & 0x7fffffffu) % q->wr_cap];
            if (c->kind == WR_CTL && c->type == HVD_VMSG_ABORT &&
                q->abort_out) {
                q->abort_out = 0;
                left--;
            }
        }
        if (n == 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

/*
 * Makes the transport fail for good: every request in flight completes
 * with status, every later call returns it, every peer is told (an ABORT
 * notice, best effort) so that all ranks report the same cause, and the
 * queue pairs go to the error state so that the HCA touches no user
 * buffer any more.
 */
static hvd_status fail_with(void *arg, hvd_status status, int culprit,
                            int origin, const char *text) {
    vtp *tp = arg;

    if (!hvd_tp_failure_set(&tp->failure, "verbs", status, tp->rank, origin,
                            text))
        return hvd_tp_failure_error(&tp->failure);

    for (int i = 0; i < tp->size * 2; i++) {
        vqp *q = &tp->qps[i];
        if (q->qp == NULL)
            continue;
        for (size_t k = 0; k < q->sq_count; k++) {
            txmsg *m = &q->sq[(q->sq_head + k) % q->sq_cap];
            if (m->mr != NULL)
                hvd_mr_put(tp->mrc, m->mr);
            req_done(tp, m->req, status);
        }
        q->sq_count = 0;
        for (uint64_t s = q->wr_done; s < q->wr_posted; s++) {
            wrctx *c = &q->wr[s % q->wr_cap];
            if (c->req != NULL)
                req_done(tp, c->req, status);
            c->req = NULL;
        }
        for (size_t k = 0; k < q->rq_count; k++) {
            rxreq *r = &q->rq[(q->rq_head + k) % q->rq_cap];
            if (r->mr != NULL)
                hvd_mr_put(tp->mrc, r->mr);
            req_done(tp, r->req, status);
        }
        q->rq_count = 0;
    }

    if (!tp->shutting_down && !tp->opening) {
        hvd_vabort a = {.status = status, .culprit = culprit, .origin = origin};
        uint8_t payload[EAGER_BYTES - HVD_VHDR_LEN];
        size_t plen;

        snprintf(a.text, sizeof(a.text), "%s", text);
        plen = hvd_vabort_encode(&a, payload, sizeof(payload));
        for (int p = 0; p < tp->size; p++) {
            vqp *q = &tp->qps[p * 2 + HVD_CHANNEL_DATA];
            if (p == tp->rank || p == origin || q->qp == NULL || q->bye_rx)
                continue;
            if (post_ctl(q, HVD_VMSG_ABORT, payload, plen) == 0)
                q->abort_out = 1;
        }
        flush_aborts(tp);
    }
    for (int i = 0; i < tp->size * 2; i++) {
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        if (tp->qps[i].qp != NULL)
            tp->seam->modify_qp(tp->qps[i].qp, &attr, IBV_QP_STATE);
    }
    return hvd_tp_failure_error(&tp->failure);
}

static hvd_status protocol_error(vqp *q, const char *what) {
    char who[160];

    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(fail_with, q->tp, q->tp->rank, HVD_ERR_TRANSPORT,
                        q->peer, "protocol error from %s on the %s channel: %s",
                        who, q->ch == HVD_CHANNEL_DATA ? "data" : "control",
                        what);
}

static hvd_status repost(vqp *q, uint32_t idx) {
    vtp *tp = q->tp;
    struct ibv_sge sge = {.addr =
                              (uintptr_t)(q->rbufs + (size_t)idx * EAGER_BYTES),
                          .length = EAGER_BYTES,
                          .lkey = tp->mem_mr->lkey};
    struct ibv_recv_wr wr = {
        .wr_id = RECV_ID(q->index, idx), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad = NULL;
    int err = tp->seam->post_recv(q->qp, &wr, &bad);

    if (err != 0) {
        char who[160];
        describe(tp, q->peer, who, sizeof(who));
        return hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                            "ibv_post_recv on the queue pair to %s failed: %s",
                            who, strerror(err));
    }
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* Sending                                                             */

static int stage_take(vtp *tp) {
    return tp->nstage_free > 0 ? tp->stage_free[--tp->nstage_free] : -1;
}

/* A CREDIT message when enough freed buffers wait to go back. */
static hvd_status maybe_credit(vqp *q) {
    int err;

    if (q->bye_rx || q->tp->failure.status != HVD_OK ||
        !hvd_vcredit_due(&q->cr))
        return HVD_OK;
    err = post_ctl(q, HVD_VMSG_CREDIT, NULL, 0);
    if (err <= 1)
        return HVD_OK; /* posted, or later when a buffer frees */
    char who[160];
    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(fail_with, q->tp, q->tp->rank, HVD_ERR_TRANSPORT, -1,
                        "ibv_post_send(credit message) to %s failed: %s", who,
                        strerror(err));
}

static hvd_status post_failed(vqp *q, const char *what, int err) {
    char who[160];

    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(fail_with, q->tp, q->tp->rank, HVD_ERR_TRANSPORT, -1,
                        "ibv_post_send(%s) to %s failed: %s", what, who,
                        strerror(err));
}

/* Posts the eager message m if a credit, a send buffer and a work request
 * are free. Returns 1 if posted. */
static int send_eager(vqp *q, txmsg *m, hvd_status *st) {
    vtp *tp = q->tp;
    hvd_vhdr h = {.type = HVD_VMSG_DATA, .len = (uint32_t)m->len};
    wrctx ctx = {.stage = -1, .kind = WR_EAGER, .sbuf = 1};
    struct ibv_sge sge;
    struct ibv_send_wr wr;
    uint8_t *b;
    int err;

    if (q->cr.eager == 0 || sb_free(q) <= SEND_RESERVE || wr_free(q) < 1)
        return 0;
    hvd_vcredit_take_eager(&q->cr);
    hvd_vcredit_collect(&q->cr, &h.eager_ret, &h.slot_ret);
    b = sb_take(q);
    hvd_vhdr_encode(&h, b);
    if (m->len > 0)
        memcpy(b + HVD_VHDR_LEN, m->buf, m->len);
    tp->ctr.eager_tx++;
    tp->ctr.cpu_bytes += m->len;
    sge = (struct ibv_sge){.addr = (uintptr_t)b,
                           .length = (uint32_t)(HVD_VHDR_LEN + m->len),
                           .lkey = tp->mem_mr->lkey};
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    err = post_wr(q, &wr, &ctx);
    if (err != 0) {
        *st = post_failed(q, "eager message", err);
        return 0;
    }
    /* The payload is copied: the caller's buffer is free again. */
    req_done(tp, m->req, HVD_OK);
    return 1;
}

/* Finds where m is sent from: its registered region, or none (staging).
 * Device memory is always registered (the CPU cannot stage it); a
 * failure there fails the transport. */
static hvd_status source_mr(vqp *q, txmsg *m) {
    vtp *tp = q->tp;

    m->tried_mr = 1;
    if (m->dev) {
        hvd_status st = hvd_mr_get_id(tp->mrc, m->buf, m->len, HVD_MEM_DEVICE,
                                      m->bufid, &m->mr);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            m->mr = NULL;
            snprintf(text, sizeof(text), "%s", hvd_error_get());
            return hvd_tp_failf(
                fail_with, tp, tp->rank, st, -1,
                "sending %zu bytes of CUDA device memory to rank %d: "
                "%s",
                m->len, q->peer, text);
        }
        return HVD_OK;
    }
    /* From the caller's memory where it is registered (explicitly, or by an
     * earlier send) or may be registered now; else staged. */
    if (!hvd_mr_find_host(tp->mrc, m->buf, m->len, &m->mr) && tp->auto_reg &&
        hvd_mr_get(tp->mrc, m->buf, m->len, HVD_MEM_HOST, &m->mr) != HVD_OK) {
        m->mr = NULL;
        if (!tp->mr_warned)
            HVD_WARN("verbs",
                     "%s; sending through registered staging buffers "
                     "instead",
                     hvd_error_get());
        tp->mr_warned = 1;
    }
    return HVD_OK;
}

/* Posts as many chunk writes of m as credits, work requests and staging
 * allow: into the peer's ring, or for a rendezvous (m->rdv) straight into
 * the receiver's buffer, plain writes with the last one WITH IMMEDIATE
 * (the FIN). Returns 1 once the last chunk is posted. */
static int send_chunks(vqp *q, txmsg *m, hvd_status *st) {
    vtp *tp = q->tp;

    if (!m->tried_mr && (*st = source_mr(q, m)) != HVD_OK)
        return 0;
    while (m->off < m->len) {
        size_t chunk = q->rslot_bytes, n;
        int last, stage = -1, err;
        struct ibv_sge sge;
        struct ibv_send_wr wr;
        wrctx ctx = {.stage = -1, .kind = m->rdv ? WR_RDV : WR_CHUNK};

        if (m->rdv && m->mr != NULL && chunk < RDV_CHUNK_MIN)
            chunk = RDV_CHUNK_MIN;
        if (m->mr == NULL && chunk > tp->stage_bytes)
            chunk = tp->stage_bytes;
        if ((!m->rdv && q->cr.slots == 0) || wr_free(q) < 1)
            return 0;
        if (m->mr == NULL && (stage = stage_take(tp)) < 0)
            return 0;
        if (!m->rdv)
            hvd_vcredit_take_slot(&q->cr);
        hvd_vchunk_next(m->len, m->off, chunk, &n, &last);
        if (stage >= 0) {
            uint8_t *s = tp->stage + (size_t)stage * tp->stage_bytes;
            memcpy(s, m->buf + m->off, n);
            tp->ctr.staged_tx++;
            tp->ctr.cpu_bytes += n;
            sge = (struct ibv_sge){.addr = (uintptr_t)s,
                                   .length = (uint32_t)n,
                                   .lkey = tp->mem_mr->lkey};
        } else {
            sge = (struct ibv_sge){.addr = (uintptr_t)(m->buf + m->off),
                                   .length = (uint32_t)n,
                                   .lkey = m->mr->mr->lkey};
        }
        memset(&wr, 0, sizeof(wr));
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (m->rdv) {
            wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
            if (last)
                wr.imm_data = htonl(hvd_vimm_fin(m->seq));
            wr.wr.rdma.remote_addr = m->raddr + m->off;
            wr.wr.rdma.rkey = m->rkey;
        } else {
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(hvd_vimm((uint32_t)n, last));
            wr.wr.rdma.remote_addr =
                q->rring + (q->tx_slot % q->rslots) * (uint64_t)q->rslot_bytes;
            wr.wr.rdma.rkey = q->rkey;
        }
        ctx.stage = stage;
        if (last) {
            ctx.req = m->req;
            ctx.mr = m->mr;
        }
        err = post_wr(q, &wr, &ctx);
        if (err != 0) {
            if (stage >= 0)
                tp->stage_free[tp->nstage_free++] = stage;
            *st = post_failed(q, m->rdv ? "rendezvous write" : "chunk write",
                              err);
            return 0;
        }
        if (!m->rdv)
            q->tx_slot++;
        m->off += n;
        if (last) {
            m->mr = NULL; /* now the work request's */
            if (m->rdv)
                tp->ctr.rdv_tx++;
            else
                tp->ctr.ring_tx++;
            if (m->dev && !m->rdv)
                tp->ctr.ring_dev_tx++;
        }
    }
    return 1;
}

/* Posts a rendezvous control message (RTR, RTS, RING) as post_ctl. */
static int post_rdv(vqp *q, uint8_t type, const hvd_vrdv *r) {
    uint8_t payload[HVD_VRDV_LEN];

    hvd_vrdv_encode(r, payload);
    return post_ctl(q, type, payload, sizeof(payload));
}

/* Sends what the rendezvous owes the peer: a RING answer, then the RTRs
 * of device receives in order, while fewer than HVD_VRTR_MAX are
 * outstanding. What finds no send buffer goes later. */
static hvd_status rdv_progress(vqp *q) {
    vtp *tp = q->tp;
    int err;

    if (q->ring_reply != 0) {
        hvd_vrdv r = {.seq = q->ring_reply - 1};
        err = post_rdv(q, HVD_VMSG_RING, &r);
        if (err == 1)
            return HVD_OK;
        if (err != 0)
            return post_failed(q, "ring answer", err);
        q->ring_reply = 0;
    }
    for (size_t k = 0;
         k < q->rq_count && q->rtr_todo > 0 && q->rtr_out < HVD_VRTR_MAX; k++) {
        rxreq *x = &q->rq[(q->rq_head + k) % q->rq_cap];
        hvd_vrdv r;
        if (!x->dev || x->rtr_sent)
            continue;
        r = (hvd_vrdv){.seq = x->seq,
                       .addr = (uintptr_t)x->buf,
                       .len = x->len,
                       .rkey = x->mr->mr->rkey};
        err = post_rdv(q, HVD_VMSG_RTR, &r);
        if (err == 1)
            break;
        if (err != 0)
            return post_failed(q, "ready-to-receive message", err);
        x->rtr_sent = 1;
        q->rtr_todo--;
        q->rtr_out++;
        tp->ctr.rtr_tx++;
    }
    return HVD_OK;
}

/* The RTR received for message seq, or NULL. */
static hvd_vrdv *rtr_find(vqp *q, uint64_t seq) {
    for (int i = 0; i < q->nrtr; i++)
        if (q->rtr[i].seq == seq)
            return &q->rtr[i];
    return NULL;
}

/* m goes into the buffer r offers. */
static hvd_status start_rdv(vqp *q, txmsg *m, hvd_vrdv *r) {
    if (r->len != m->len) {
        char who[160];
        describe(q->tp, q->peer, who, sizeof(who));
        return hvd_tp_failf(
            fail_with, q->tp, q->tp->rank, HVD_ERR_MISMATCH, q->peer,
            "%s expects a message of %llu bytes where this rank "
            "(rank %d) sends %zu: ranks called collectives in "
            "different orders or with different counts",
            who, (unsigned long long)r->len, q->tp->rank, m->len);
    }
    m->rdv = 1;
    m->raddr = r->addr;
    m->rkey = r->rkey;
    *r = q->rtr[--q->nrtr];
    return HVD_OK;
}

/* A device message at the head of the send queue with no RTR: asks the
 * peer where it goes (once) and waits for its RTR or RING. */
static hvd_status ask_rdv(vqp *q, txmsg *m) {
    hvd_vrdv r = {.seq = m->seq, .len = m->len};
    int err;

    if (m->rts_sent)
        return HVD_OK;
    err = post_rdv(q, HVD_VMSG_RTS, &r);
    if (err > 1)
        return post_failed(q, "ready-to-send message", err);
    if (err == 0) {
        m->rts_sent = 1;
        q->tp->ctr.rts_tx++;
    }
    return HVD_OK;
}

/* Starts what the send queue of q can start now. */
static hvd_status tx_progress(vqp *q) {
    vtp *tp = q->tp;
    hvd_status st = HVD_OK;

    if (tp->gpudirect && (q->ring_reply != 0 || q->rtr_todo > 0)) {
        st = rdv_progress(q);
        if (st != HVD_OK)
            return st;
    }
    while (q->sq_count > 0 && tp->failure.status == HVD_OK) {
        txmsg *m = &q->sq[q->sq_head];
        hvd_vrdv *r;
        int posted;

        /* An RTR for a message not started yet: into the receiver's
         * buffer, from whatever memory. */
        if (!m->rdv && m->off == 0 && q->nrtr > 0 &&
            (r = rtr_find(q, m->seq)) != NULL) {
            st = start_rdv(q, m, r);
            if (st != HVD_OK)
                return st;
        }
        if (m->rdv)
            posted = send_chunks(q, m, &st);
        else if (m->dev && q->ring_ok == m->seq + 1)
            posted = send_chunks(q, m, &st); /* into the ring, never eager */
        else if (m->dev) {
            st = ask_rdv(q, m);
            posted = 0;
        } else
            posted = hvd_veager(m->len, q->reager_bytes)
                         ? send_eager(q, m, &st)
                         : send_chunks(q, m, &st);
        if (st != HVD_OK)
            return st;
        if (posted || m->off > 0)
            q->tx_begun = m->seq + 1;
        if (!posted)
            break;
        q->sq_head = (q->sq_head + 1) % q->sq_cap;
        q->sq_count--;
    }
    return tp->failure.status == HVD_OK ? maybe_credit(q) : tp->failure.status;
}

/* ------------------------------------------------------------------ */
/* Receiving                                                           */

static hvd_status mismatch(vqp *q, size_t sent, int more, size_t want) {
    char who[160];

    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(
        fail_with, q->tp, q->tp->rank, HVD_ERR_MISMATCH, q->peer,
        "%s sent a message of %s%zu bytes where this rank expected "
        "%zu: ranks called collectives in different orders or with "
        "different counts",
        who, more ? "more than " : "", sent, want);
}

/* The ranks disagree on the memory type of message r: it came the host
 * way (eager or through the ring) into a receive of device memory. */
static hvd_status memtype_mismatch_rx(vqp *q, const rxreq *r) {
    char who[160];

    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(
        fail_with, q->tp, q->tp->rank, HVD_ERR_TRANSPORT, q->peer,
        "%s sent message %llu of %zu bytes on the %s channel from "
        "host memory (through eager or ring buffers) while this rank "
        "(rank %d) receives it into CUDA device memory: the ranks "
        "disagree on the memory type of an operation",
        who, (unsigned long long)r->seq, r->len,
        q->ch == HVD_CHANNEL_DATA ? "data" : "control", q->tp->rank);
}

/* Hands arrived data to posted irecvs, in order. */
static hvd_status match(vqp *q) {
    vtp *tp = q->tp;
    hvd_status st;

    while (q->rq_count > 0 && q->arr_count > 0) {
        rxreq *r = &q->rq[q->rq_head];
        rxitem *it = &q->arr[q->arr_head];
        int complete;

        if (r->dev) {
            /* The HCA wrote it; the FIN says it is all there. */
            if (it->chunk != RX_FIN)
                return memtype_mismatch_rx(q, r);
            if (!r->rtr_sent ||
                it->idx != (hvd_vimm_fin(r->seq) & HVD_VIMM_TAG))
                return protocol_error(q, "a rendezvous write finished for "
                                         "another message than the one "
                                         "this rank waits for");
            hvd_mr_put(tp->mrc, r->mr);
            r->mr = NULL;
            q->rtr_out--;
            tp->ctr.rdv_rx++;
            /* Before a kernel reads what the HCA wrote. */
            tp->seam->flush_rdma_writes(tp->gpu_device);
            complete = 1;
        } else if (it->chunk == RX_FIN) {
            return protocol_error(q, "a rendezvous write arrived for a "
                                     "receive in host memory");
        } else if (it->chunk == RX_EAGER) {
            const uint8_t *b = q->rbufs + (size_t)it->idx * EAGER_BYTES;
            if (r->got != 0)
                return protocol_error(q, "an eager message arrived inside a "
                                         "chunked one");
            if (it->len != r->len)
                return mismatch(q, it->len, 0, r->len);
            if (it->len > 0)
                memcpy(r->buf, b + HVD_VHDR_LEN, it->len);
            tp->ctr.eager_rx++;
            tp->ctr.cpu_bytes += it->len;
            hvd_vcredit_freed_eager(&q->cr);
            st = repost(q, it->idx);
            if (st != HVD_OK)
                return st;
            complete = 1;
        } else {
            size_t got;
            hvd_vrx res =
                hvd_vrx_chunk(r->len, r->got, it->len, it->last, &got);
            if (res == HVD_VRX_TOO_LONG)
                return mismatch(q, got, !it->last, r->len);
            if (res == HVD_VRX_TOO_SHORT)
                return mismatch(q, got, 0, r->len);
            memcpy(r->buf + r->got, q->ring + (size_t)it->idx * q->slot_bytes,
                   it->len);
            tp->ctr.cpu_bytes += it->len;
            r->got = got;
            hvd_vcredit_freed_slot(&q->cr);
            complete = res == HVD_VRX_DONE;
            tp->ctr.ring_rx += complete;
        }
        q->arr_head = (q->arr_head + 1) % q->nrbufs;
        q->arr_count--;
        if (complete) {
            hvd_req *req = r->req;
            q->rq_head = (q->rq_head + 1) % q->rq_cap;
            q->rq_count--;
            req_done(tp, req, HVD_OK);
        }
    }
    if (q->rtr_todo > 0) {
        st = rdv_progress(q); /* a device receive finished: the next RTR */
        if (st != HVD_OK)
            return st;
    }
    return maybe_credit(q);
}

static hvd_status arrive(vqp *q, int chunk, uint32_t idx, uint32_t len,
                         int last) {
    rxitem *it;

    if (q->arr_count >= q->nrbufs)
        return protocol_error(q, "more messages arrived than it had credits "
                                 "for");
    it = &q->arr[(q->arr_head + q->arr_count) % q->nrbufs];
    it->chunk = (uint8_t)chunk;
    it->idx = idx;
    it->len = len;
    it->last = (uint8_t)last;
    q->arr_count++;
    return HVD_OK;
}

static hvd_status on_bye(vqp *q) {
    char who[160];

    q->bye_rx = 1;
    if (q->rq_count == 0 || q->tp->shutting_down)
        return HVD_OK;
    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(
        fail_with, q->tp, q->tp->rank, HVD_ERR_PEER_LOST, q->peer,
        "%s called hvd_shutdown while this rank still expected data "
        "from it: ranks did not run the same collectives",
        who);
}

/* The sender learns that the receiver of message r->seq receives it into
 * device memory, after it had sent it from host memory. */
static hvd_status memtype_mismatch_tx(vqp *q, const hvd_vrdv *r) {
    char who[160];

    describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(
        fail_with, q->tp, q->tp->rank, HVD_ERR_TRANSPORT, q->peer,
        "%s receives message %llu of %llu bytes on the %s channel "
        "into CUDA device memory, but this rank (rank %d) had "
        "already sent it from host memory: the ranks disagree on "
        "the memory type of an operation",
        who, (unsigned long long)r->seq, (unsigned long long)r->len,
        q->ch == HVD_CHANNEL_DATA ? "data" : "control", q->tp->rank);
}

/* RTR (at a sender), RTS and RING (RTS at a receiver, RING at a sender):
 * proto.h. */
static hvd_status on_rdv(vqp *q, uint8_t type, const hvd_vrdv *r) {
    vtp *tp = q->tp;

    if (!tp->gpudirect)
        return protocol_error(q, "a rendezvous message, and GPUDirect RDMA "
                                 "is off");
    if (type == HVD_VMSG_RTR) {
        tp->ctr.rtr_rx++;
        if (r->seq < q->tx_begun)
            return memtype_mismatch_tx(q, r);
        if (q->nrtr >= HVD_VRTR_MAX || rtr_find(q, r->seq) != NULL)
            return protocol_error(q, "more ready-to-receive messages than "
                                     "the protocol allows");
        q->rtr[q->nrtr++] = *r;
        return HVD_OK;
    }
    if (type == HVD_VMSG_RING) {
        const txmsg *m = q->sq_count > 0 ? &q->sq[q->sq_head] : NULL;
        if (m == NULL || m->seq != r->seq || !m->dev || !m->rts_sent)
            return protocol_error(q, "a ring answer for a message this "
                                     "rank did not ask about");
        q->ring_ok = r->seq + 1;
        return HVD_OK;
    }
    /* RTS: the peer sends message r->seq from device memory. */
    if (r->seq < q->rx_seq) {
        uint64_t first = q->rx_seq - q->rq_count;
        const rxreq *x;
        if (r->seq < first)
            return protocol_error(q, "a ready-to-send message for a message "
                                     "already received");
        x = &q->rq[(q->rq_head + (size_t)(r->seq - first)) % q->rq_cap];
        /* A device receive answers with its RTR. */
        if (!x->dev) {
            if (q->ring_reply != 0)
                return protocol_error(q, "two ready-to-send messages at "
                                         "once");
            q->ring_reply = r->seq + 1;
            return rdv_progress(q);
        }
        return HVD_OK;
    }
    if (q->rts_in != 0)
        return protocol_error(q, "two ready-to-send messages at once");
    q->rts_in = r->seq + 1; /* answered when the receive is posted */
    return HVD_OK;
}

static hvd_status recv_done(vqp *q, uint32_t idx, const struct ibv_wc *wc) {
    vtp *tp = q->tp;
    const uint8_t *b = q->rbufs + (size_t)idx * EAGER_BYTES;
    hvd_vhdr h;
    hvd_status st;

    tp->last_active[q->peer] = hvd_now_ns();
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        uint32_t imm = ntohl(wc->imm_data);
        uint32_t len = hvd_vimm_len(imm);
        char what[128];
        if (hvd_vimm_is_fin(imm)) {
            if (!tp->gpudirect)
                return protocol_error(q, "a rendezvous write, and GPUDirect "
                                         "RDMA is off");
            st = arrive(q, RX_FIN, imm & HVD_VIMM_TAG, 0, 1);
            if (st == HVD_OK)
                st = repost(q, idx);
            return st == HVD_OK ? match(q) : st;
        }
        if (len == 0 || len > q->slot_bytes) {
            snprintf(what, sizeof(what),
                     "a chunk of %u bytes for slots of %u bytes", len,
                     q->slot_bytes);
            return protocol_error(q, what);
        }
        st = arrive(q, RX_RING, (uint32_t)(q->rx_slot % q->slots), len,
                    hvd_vimm_last(imm));
        q->rx_slot++;
        if (st == HVD_OK)
            st = repost(q, idx); /* the write used no eager buffer */
        return st == HVD_OK ? match(q) : st;
    }
    if (wc->opcode != IBV_WC_RECV)
        return protocol_error(q, "a completion of an unexpected kind");
    if (hvd_vhdr_decode(b, wc->byte_len, &h) != HVD_OK) {
        char what[256];
        snprintf(what, sizeof(what), "%s", hvd_error_get());
        return protocol_error(q, what);
    }
    if (hvd_vcredit_grant(&q->cr, h.eager_ret, h.slot_ret) != 0)
        return protocol_error(q, "it returned more credits than it had");
    switch (h.type) {
    case HVD_VMSG_DATA:
        st = arrive(q, RX_EAGER, idx, h.len, 1);
        return st == HVD_OK ? match(q) : st;
    case HVD_VMSG_RTR:
    case HVD_VMSG_RTS:
    case HVD_VMSG_RING: {
        hvd_vrdv r;
        hvd_vrdv_decode(b + HVD_VHDR_LEN, &r);
        st = on_rdv(q, h.type, &r);
        if (st != HVD_OK)
            return st;
        break;
    }
    case HVD_VMSG_ABORT: {
        hvd_vabort a;
        if (hvd_vabort_decode(b + HVD_VHDR_LEN, h.len, &a) != HVD_OK)
            return protocol_error(q, "a truncated ABORT notice");
        /* Relayed as the origin said it (hvd_tp_failure_set names it). */
        return fail_with(tp, (hvd_status)a.status, a.culprit, a.origin, a.text);
    }
    case HVD_VMSG_HELLO:
        q->hello_rx = 1;
        break;
    case HVD_VMSG_BYE:
        st = on_bye(q);
        if (st != HVD_OK)
            return st;
        break;
    default: /* CREDIT, HEARTBEAT */
        break;
    }
    return repost(q, idx);
}

/* ------------------------------------------------------------------ */
/* Completions                                                         */

static const char *wr_what(const wrctx *c) {
    switch (c->kind) {
    case WR_EAGER:
        return "eager send";
    case WR_CHUNK:
        return "chunk write";
    case WR_RDV:
        return "rendezvous write";
    default:
        return ctl_name(c->type);
    }
}

/* 1 if a send work request of q still carries a request. */
static int wr_carries_req(const vqp *q) {
    for (uint64_t s = q->wr_done; s < q->wr_posted; s++)
        if (q->wr[s % q->wr_cap].req != NULL)
            return 1;
    return 0;
}

/* Notes a failed work completion; the drain decides after it has looked
 * for an ABORT notice that explains it. Returns 1 if the failure is
 * harmless: the peer said goodbye and nothing is owed to or from it, so
 * it may have torn its queue pairs down under our last control messages. */
static int wc_error(vqp *q, const struct ibv_wc *wc) {
    vtp *tp = q->tp;
    char who[160], what[64];
    hvd_status status;

    if (tp->err_pending || tp->failure.status != HVD_OK)
        return 0;
    if ((q->bye_rx || tp->shutting_down) && q->rq_count == 0 &&
        q->sq_count == 0 && !wr_carries_req(q))
        return 1;
    if (wc->wr_id & RECV_BIT)
        snprintf(what, sizeof(what), "receive");
    else
        snprintf(what, sizeof(what), "%s",
                 wr_what(&q->wr[(wc->wr_id & 0x7fffffffu) % q->wr_cap]));
    describe(tp, q->peer, who, sizeof(who));
    switch (wc->status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        status = HVD_ERR_PEER_LOST;
        snprintf(tp->err_text, sizeof(tp->err_text),
                 "lost %s: RDMA %s on the %s channel failed: %s (vendor error "
                 "%#x; the process died, was killed, exited without "
                 "hvd_shutdown, or its link went down)",
                 who, what, q->ch == HVD_CHANNEL_DATA ? "data" : "control",
                 ibv_wc_status_str(wc->status), wc->vendor_err);
        break;
    default:
        status = HVD_ERR_TRANSPORT;
        snprintf(tp->err_text, sizeof(tp->err_text),
                 "RDMA %s with %s on the %s channel failed: %s (vendor error "
                 "%#x)",
                 what, who, q->ch == HVD_CHANNEL_DATA ? "data" : "control",
                 ibv_wc_status_str(wc->status), wc->vendor_err);
        break;
    }
    tp->err_pending = 1;
    tp->err_status = status;
    tp->err_peer = q->peer;
    return 0;
}

static hvd_status send_done(vqp *q, const struct ibv_wc *wc) {
    vtp *tp = q->tp;
    wrctx *c;

    if ((wc->wr_id & 0x7fffffffu) != (q->wr_done & 0x7fffffffu) ||
        q->wr_done == q->wr_posted)
        return hvd_tp_failf(
            fail_with, tp, tp->rank, HVD_ERR_INTERNAL, -1,
            "verbs: send completion %llu out of order (expected %llu)",
            (unsigned long long)(wc->wr_id & 0x7fffffffu),
            (unsigned long long)(q->wr_done & 0x7fffffffu));
    c = &q->wr[q->wr_done % q->wr_cap];
    q->wr_done++;
    if (c->sbuf) {
        q->sb_first = (q->sb_first + 1) % SEND_BUFS;
        q->sb_used--;
    }
    if (c->stage >= 0)
        tp->stage_free[tp->nstage_free++] = c->stage;
    if (c->mr != NULL)
        hvd_mr_put(tp->mrc, c->mr);
    if (c->req != NULL)
        req_done(tp, c->req, HVD_OK);
    if (c->kind == WR_CTL) {
        if (c->type == HVD_VMSG_HEARTBEAT)
            q->hb_out = 0;
        else if (c->type == HVD_VMSG_HELLO)
            q->hello_done = 1;
        else if (c->type == HVD_VMSG_ABORT)
            q->abort_out = 0;
    }
    *c = (wrctx){.stage = -1};
    return HVD_OK;
}

static hvd_status handle(vtp *tp, const struct ibv_wc *wc) {
    uint32_t qi = (uint32_t)(wc->wr_id >> 32);
    vqp *q;

    if (qi >= (uint32_t)tp->size * 2 || tp->qps[qi].qp == NULL)
        return hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_INTERNAL, -1,
                            "verbs: completion for unknown queue pair %u", qi);
    q = &tp->qps[qi];
    if (wc->status != IBV_WC_SUCCESS) {
        /* A harmless failure releases the send's buffers; a real one
         * leaves its request to fail_with. */
        if (wc_error(q, wc) && !(wc->wr_id & RECV_BIT))
            return send_done(q, wc);
        return HVD_OK;
    }
    if (wc->wr_id & RECV_BIT)
        return recv_done(
            q, (uint32_t)(wc->wr_id & ~(uint64_t)RECV_BIT & 0xffffffffu), wc);
    return send_done(q, wc);
}

/* Processes what the completion queue holds; returns the number of
 * completions (or -1 once failed). */
static int drain(vtp *tp) {
    struct ibv_wc wc[POLL_BATCH];
    int total = 0;

    for (int round = 0; round < DRAIN_ROUNDS && tp->failure.status == HVD_OK;
         round++) {
        int n = tp->seam->poll_cq(tp->cq, POLL_BATCH, wc);
        if (n < 0) {
            hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                         "ibv_poll_cq failed");
            break;
        }
        for (int i = 0; i < n && tp->failure.status == HVD_OK; i++)
            handle(tp, &wc[i]);
        total += n;
        if (n < POLL_BATCH)
            break;
    }
    if (tp->failure.status == HVD_OK && tp->err_pending) {
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", tp->err_text);
        hvd_tp_failf(fail_with, tp, tp->rank, tp->err_status, tp->err_peer,
                     "%s", text);
    }
    if (tp->failure.status != HVD_OK)
        return -1;
    if (total > 0) {
        /* Credits, send buffers or staging chunks may have freed. */
        for (int i = 0; i < tp->size * 2 && tp->failure.status == HVD_OK; i++) {
            vqp *q = &tp->qps[i];
            if (q->qp != NULL && (q->sq_count > 0 || hvd_vcredit_due(&q->cr) ||
                                  q->ring_reply != 0 || q->rtr_todo > 0))
                tx_progress(q);
        }
    }
    return tp->failure.status == HVD_OK ? total : -1;
}

/*
 * Sleeps until the completion queue has something, wake is called, or
 * timeout_ms passes (-1: no limit). Arms the completion channel first and
 * drains once more, so that a completion between the last drain and the
 * arming is not slept through. Returns 1 if woken by wake or if that
 * drain moved something (or failed), 0 otherwise.
 */
static int wait_events(vtp *tp, int timeout_ms) {
    struct pollfd pfd[2];
    int woke = 0;

    if (!tp->armed) {
        if (tp->seam->req_notify_cq(tp->cq) != 0) {
            hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                         "ibv_req_notify_cq failed");
            return 1;
        }
        tp->armed = 1;
        if (drain(tp) != 0)
            return 1;
    }
    pfd[0] = (struct pollfd){.fd = tp->chan->fd, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = tp->wakefd, .events = POLLIN};
    if (poll(pfd, 2, timeout_ms) <= 0)
        return 0;
    if (pfd[0].revents & POLLIN) {
        struct ibv_cq *cq;
        if (tp->seam->get_cq_event(tp->chan, &cq) == 0) {
            tp->seam->ack_cq_events(cq, 1);
            tp->armed = 0;
        }
    }
    if (pfd[1].revents & POLLIN) {
        uint64_t count;
        ssize_t ignored = read(tp->wakefd, &count, sizeof(count));
        (void)ignored;
        woke = 1;
    }
    return woke;
}

/* ------------------------------------------------------------------ */
/* Heartbeats and stalls                                               */

/*
 * A peer is stalled when this rank waits on it (a request in flight) and
 * nothing has arrived from it for the timeout. Ranks that wait send
 * heartbeats, so a peer that is alive but itself waiting on a third rank
 * is not blamed: only the rank that stopped is. A heartbeat to a peer
 * that died fails with the transport retry error, which names it.
 */
static hvd_status housekeeping(vtp *tp, int64_t now) {
    int waiting = 0;

    if (now - tp->last_check < CHECK_NS)
        return HVD_OK;
    tp->last_check = now;
    for (int p = 0; p < tp->size; p++)
        waiting |= tp->pending[p] > 0;
    if (waiting && now - tp->last_hb >= tp->heartbeat_ns) {
        tp->last_hb = now;
        for (int p = 0; p < tp->size; p++) {
            vqp *q = &tp->qps[p * 2 + HVD_CHANNEL_DATA];
            int err;
            if (p == tp->rank || q->hb_out || q->bye_rx)
                continue;
            err = post_ctl(q, HVD_VMSG_HEARTBEAT, NULL, 0);
            if (err == 0)
                q->hb_out = 1;
            else if (err > 1)
                return post_failed(q, "heartbeat", err);
        }
    }
    for (int p = 0; p < tp->size; p++) {
        if (tp->pending[p] > 0 && now - tp->last_active[p] > tp->timeout_ns) {
            char who[160];
            describe(tp, p, who, sizeof(who));
            return hvd_tp_fail_stalled(fail_with, tp, tp->rank, p, who,
                                       tp->timeout_ns);
        }
    }
    return HVD_OK;
}

static hvd_status vb_progress(hvd_transport *t, int timeout_ms) {
    vtp *tp = (vtp *)t;
    int64_t end = timeout_ms < 0 ? INT64_MAX
                                 : hvd_now_ns() + (int64_t)timeout_ms * 1000000;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    for (;;) {
        int moved = drain(tp);
        int64_t now = hvd_now_ns();
        int waiting = 0, wait_ms;

        if (moved >= 0)
            housekeeping(tp, now);
        if (tp->failure.status != HVD_OK)
            return hvd_tp_failure_error(&tp->failure);
        if (moved > 0 || now >= end)
            return HVD_OK;
        for (int p = 0; p < tp->size && !waiting; p++)
            waiting = tp->pending[p] > 0;
        if (end == INT64_MAX && !waiting)
            wait_ms = -1;
        else {
            int64_t left = end - now;
            if (waiting && left > CHECK_NS)
                left = CHECK_NS;
            wait_ms = (int)((left + 999999) / 1000000);
        }
        if (wait_events(tp, wait_ms))
            return tp->failure.status == HVD_OK
                       ? HVD_OK
                       : hvd_tp_failure_error(&tp->failure);
    }
}

static void vb_wake(hvd_transport *t) {
    vtp *tp = (vtp *)t;
    uint64_t one = 1;

    if (tp->wakefd >= 0) {
        ssize_t ignored = write(tp->wakefd, &one, sizeof(one));
        (void)ignored;
    }
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */

/*
 * Checks a request's peer and channel. A send to a peer that has said
 * goodbye can never be received; a receive may still be, from what
 * arrived before the goodbye (vb_irecv checks that after matching).
 */
static hvd_status check_peer(vtp *tp, int peer, int channel, const char *what) {
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (peer < 0 || peer >= tp->size || peer == tp->rank ||
        (channel != HVD_CHANNEL_DATA && channel != HVD_CHANNEL_CONTROL))
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "verbs %s to rank %d on channel %d: not a peer "
                             "of rank %d in a job of %d",
                             what, peer, channel, tp->rank, tp->size);
    if (strcmp(what, "send") == 0 && tp->qps[peer * 2 + channel].bye_rx) {
        char who[160];
        describe(tp, peer, who, sizeof(who));
        return hvd_tp_failf(
            fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, peer,
            "%s has already called hvd_shutdown: ranks did not run "
            "the same collectives",
            who);
    }
    return HVD_OK;
}

/* A ring of elem-sized entries (cap, head, count), full, grown to twice
 * its capacity: the new buffer, or NULL (the old one is then kept). Rings
 * never shrink, so the steady state does not allocate. */
static void *ring_grow(void *v, size_t elem, size_t *cap, size_t *head,
                       size_t count) {
    size_t ncap = *cap ? *cap * 2 : 16;
    uint8_t *nv = malloc(ncap * elem);

    if (nv == NULL)
        return NULL;
    for (size_t i = 0; i < count; i++)
        memcpy(nv + i * elem, (uint8_t *)v + ((*head + i) % *cap) * elem, elem);
    free(v);
    *cap = ncap;
    *head = 0;
    return nv;
}

/* 1 if buf is CUDA device memory that this transport moves itself (and
 * its allocation's id); always 0 with GPUDirect off and on the control
 * channel, where every buffer is host memory (transport.h) and nothing is
 * asked. */
static int on_device(vtp *tp, int channel, const void *buf, size_t len,
                     uint64_t *id_out) {
    *id_out = 0;
    return tp->gpudirect && channel == HVD_CHANNEL_DATA && len > 0 &&
           tp->seam->mem_type(buf, id_out) == HVD_MEM_DEVICE;
}

static void start_req(vtp *tp, hvd_req *req, int peer, size_t len) {
    req->done = 0;
    req->status = HVD_OK;
    req->peer = peer;
    req->len = len;
    req->parts_left = 1;
    if (tp->pending[peer]++ == 0)
        tp->last_active[peer] = hvd_now_ns();
}

static hvd_status vb_isend(hvd_transport *t, int peer, int channel,
                           const void *buf, size_t len, hvd_req *req) {
    vtp *tp = (vtp *)t;
    hvd_status st = check_peer(tp, peer, channel, "send");
    uint64_t id;
    vqp *q;
    txmsg *m;
    int dev;

    if (st != HVD_OK)
        return st;
    dev = on_device(tp, channel, buf, len, &id);
    q = &tp->qps[peer * 2 + channel];
    if (q->sq_count == q->sq_cap) {
        txmsg *v = ring_grow(q->sq, sizeof(*q->sq), &q->sq_cap, &q->sq_head,
                             q->sq_count);
        if (v == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory queueing a message for rank "
                                 "%d",
                                 peer);
        q->sq = v;
    }
    start_req(tp, req, peer, len);
    m = &q->sq[(q->sq_head + q->sq_count) % q->sq_cap];
    *m = (txmsg){.req = req,
                 .buf = buf,
                 .len = len,
                 .seq = q->tx_seq++,
                 .dev = (uint8_t)dev,
                 .bufid = id};
    q->sq_count++;
    tp->ctr.dev_tx += (uint64_t)dev;
    /* Start at once: a send goes out without waiting for progress. A
     * failure completes the request with it. */
    if (q->sq_count == 1)
        tx_progress(q);
    return HVD_OK;
}

static hvd_status vb_irecv(hvd_transport *t, int peer, int channel, void *buf,
                           size_t len, hvd_req *req) {
    vtp *tp = (vtp *)t;
    hvd_status st = check_peer(tp, peer, channel, "receive");
    hvd_mr_entry *mr = NULL;
    uint64_t id, seq;
    vqp *q;
    int dev;

    if (st != HVD_OK)
        return st;
    q = &tp->qps[peer * 2 + channel];
    if (q->rq_count == q->rq_cap) {
        rxreq *v = ring_grow(q->rq, sizeof(*q->rq), &q->rq_cap, &q->rq_head,
                             q->rq_count);
        if (v == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory queueing a receive from rank "
                                 "%d",
                                 peer);
        q->rq = v;
    }
    dev = on_device(tp, channel, buf, len, &id);
    if (dev) {
        /* Registered now, for the RTR; held until the message is in. */
        st = hvd_mr_get_id(tp->mrc, buf, len, HVD_MEM_DEVICE, id, &mr);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            snprintf(text, sizeof(text), "%s", hvd_error_get());
            return hvd_tp_failf(
                fail_with, tp, tp->rank, st, -1,
                "receiving %zu bytes from rank %d into CUDA device "
                "memory: %s",
                len, peer, text);
        }
    }
    start_req(tp, req, peer, len);
    seq = q->rx_seq++;
    q->rq[(q->rq_head + q->rq_count) % q->rq_cap] = (rxreq){
        .req = req, .buf = buf, .len = len, .seq = seq, .mr = mr, .dev = dev};
    q->rq_count++;
    if (dev) {
        q->rtr_todo++;
        tp->ctr.dev_rx++;
    }
    if (q->rts_in == seq + 1) {
        /* The sender asked already: a host receive answers RING, a device
         * one its RTR. */
        q->rts_in = 0;
        if (!dev)
            q->ring_reply = seq + 1;
    }
    if (q->ring_reply != 0 || q->rtr_todo > 0)
        rdv_progress(q); /* a failure completes the request with it */
    /* Data already here completes it now. */
    if (q->arr_count > 0)
        match(q);
    /* After the peer's goodbye everything it sent is here: a receive that
     * is still waiting will never complete. */
    if (q->bye_rx && q->rq_count > 0 && tp->failure.status == HVD_OK)
        on_bye(q);
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* Setup                                                               */

static void vb_close(hvd_transport *t) {
    vtp *tp = (vtp *)t;

    if (tp == NULL)
        return;
    for (int i = 0; tp->qps != NULL && i < tp->size * 2; i++) {
        vqp *q = &tp->qps[i];
        if (q->qp != NULL)
            tp->seam->destroy_qp(q->qp);
        free(q->arr);
        free(q->rq);
        free(q->sq);
        free(q->wr);
    }
    /* Regions held by work requests that never completed go too: their
     * queue pairs are gone. */
    hvd_mr_cache_destroy(tp->mrc);
    if (tp->cq != NULL)
        tp->seam->destroy_cq(tp->cq);
    if (tp->chan != NULL)
        tp->seam->destroy_comp_channel(tp->chan);
    if (tp->mem_mr != NULL)
        tp->seam->dereg_mr(tp->mem_mr);
    if (tp->ring_mr != NULL)
        tp->seam->dereg_mr(tp->ring_mr);
    if (tp->pd != NULL)
        tp->seam->dealloc_pd(tp->pd);
    hvd_vdev_close(tp->seam, &tp->dev);
    if (tp->wakefd >= 0)
        close(tp->wakefd);
    free(tp->mem);
    free(tp->ring);
    free(tp->stage_free);
    free(tp->qps);
    free(tp->pending);
    free(tp->last_active);
    free(tp->hosts);
    free(tp->pids);
    free(tp);
}

static uint32_t next_psn(uint64_t *state) {
    /* xorshift64: PSNs only need to differ between incarnations. */
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state & 0xffffff);
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* Buffers, rings, completion queue and queue pairs (in INIT, receives
 * posted). The sentence of a failure is in hvd_last_error. */
static hvd_status setup_local(vtp *tp, const hvd_verbs_settings *set) {
    struct ibv_context *ctx = tp->dev.ctx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), off = 0, per_qp[2];
    uint32_t nrbufs[2], wr_cap[2];
    uint64_t cqe = 16, seed;
    int npeers = tp->size - 1;

    tp->slots[0] = (uint32_t)set->ring_chunks;
    tp->slot_bytes[0] = (uint32_t)set->chunk_bytes;
    tp->slots[1] = CTL_SLOTS;
    tp->slot_bytes[1] = CTL_SLOT_BYTES;
    for (int ch = 0; ch < 2; ch++) {
        nrbufs[ch] = EAGER_CREDITS + tp->slots[ch] + CTL_RESERVE + HVD_VRTR_MAX;
        wr_cap[ch] = tp->slots[ch] + SEND_BUFS;
        if (nrbufs[ch] > (uint32_t)tp->dev.attr.max_qp_wr ||
            wr_cap[ch] > (uint32_t)tp->dev.attr.max_qp_wr)
            return hvd_error_set(
                HVD_ERR_TRANSPORT,
                "%s allows %d work requests per queue "
                "pair and HVD_IB_RING_CHUNKS=%u needs %u: "
                "lower HVD_IB_RING_CHUNKS",
                tp->dev.name, tp->dev.attr.max_qp_wr, tp->slots[0],
                nrbufs[ch] > wr_cap[ch] ? nrbufs[ch] : wr_cap[ch]);
        per_qp[ch] = ((size_t)nrbufs[ch] + SEND_BUFS) * EAGER_BYTES;
        cqe += (uint64_t)npeers * (nrbufs[ch] + wr_cap[ch]);
    }
    if (cqe > (uint64_t)tp->dev.attr.max_cqe)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "%d peers need a completion queue of %llu "
                             "entries and %s allows %d: lower "
                             "HVD_IB_RING_CHUNKS",
                             npeers, (unsigned long long)cqe, tp->dev.name,
                             tp->dev.attr.max_cqe);

    tp->pd = tp->seam->alloc_pd(ctx);
    if (tp->pd == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT, "ibv_alloc_pd(%s) failed: %s",
                             tp->dev.name, strerror(errno));

    /* Local buffers: per queue pair its receive and send buffers, then
     * the staging chunks. */
    tp->stage_bytes = tp->slot_bytes[0];
    tp->nstage =
        (int)(2 * tp->slots[0] > STAGE_MIN ? 2 * tp->slots[0] : STAGE_MIN);
    tp->mem_len = round_up((size_t)npeers * (per_qp[0] + per_qp[1]) +
                               (size_t)tp->nstage * tp->stage_bytes,
                           page);
    tp->ring_len = round_up(
        (size_t)hvd_vring_bytes(tp->size, tp->slots, tp->slot_bytes), page);
    if (posix_memalign((void **)&tp->mem, page, tp->mem_len) != 0 ||
        posix_memalign((void **)&tp->ring, page, tp->ring_len) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY,
                             "out of memory allocating %zu bytes of RDMA "
                             "buffers",
                             tp->mem_len + tp->ring_len);
    memset(tp->mem, 0, tp->mem_len);
    memset(tp->ring, 0, tp->ring_len);
    tp->mem_mr =
        tp->seam->reg_mr(tp->pd, tp->mem, tp->mem_len, IBV_ACCESS_LOCAL_WRITE);
    if (tp->mem_mr != NULL)
        tp->ring_mr =
            tp->seam->reg_mr(tp->pd, tp->ring, tp->ring_len,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (tp->mem_mr == NULL || tp->ring_mr == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_reg_mr of %zu bytes of RDMA buffers failed: "
                             "%s (raise the locked-memory limit, `ulimit -l "
                             "unlimited`, or lower HVD_IB_RING_CHUNKS)",
                             tp->mem_mr == NULL ? tp->mem_len : tp->ring_len,
                             strerror(errno));
    tp->stage_free = malloc((size_t)tp->nstage * sizeof(*tp->stage_free));
    if (tp->stage_free == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->stage = tp->mem + (size_t)npeers * (per_qp[0] + per_qp[1]);
    for (int i = 0; i < tp->nstage; i++)
        tp->stage_free[i] = tp->nstage - 1 - i;
    tp->nstage_free = tp->nstage;

    tp->chan = tp->seam->create_comp_channel(ctx);
    if (tp->chan == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_create_comp_channel(%s) failed: %s",
                             tp->dev.name, strerror(errno));
    int fl = fcntl(tp->chan->fd, F_GETFL);
    if (fl < 0 || fcntl(tp->chan->fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "fcntl(completion channel, O_NONBLOCK) failed: "
                             "%s",
                             strerror(errno));
    tp->cq = tp->seam->create_cq(ctx, (int)cqe, tp->chan);
    if (tp->cq == NULL)
        return hvd_error_set(
            HVD_ERR_TRANSPORT, "ibv_create_cq(%s, %llu entries) failed: %s",
            tp->dev.name, (unsigned long long)cqe, strerror(errno));

    seed = (uint64_t)hvd_now_ns() ^ ((uint64_t)getpid() << 32) ^
           (uint64_t)tp->rank;
    if (seed == 0)
        seed = 1;
    for (int p = 0; p < tp->size; p++) {
        if (p == tp->rank)
            continue;
        for (int ch = 0; ch < 2; ch++) {
            vqp *q = &tp->qps[p * 2 + ch];
            struct ibv_qp_init_attr ia;
            struct ibv_qp_attr qa;

            q->nrbufs = nrbufs[ch];
            q->wr_cap = wr_cap[ch];
            q->slots = tp->slots[ch];
            q->slot_bytes = tp->slot_bytes[ch];
            q->rbufs = tp->mem + off;
            off += (size_t)nrbufs[ch] * EAGER_BYTES;
            q->sbufs = tp->mem + off;
            off += (size_t)SEND_BUFS * EAGER_BYTES;
            q->ring = tp->ring + hvd_vring_offset(tp->size, tp->rank, p, ch, 0,
                                                  tp->slots, tp->slot_bytes);
            q->arr = calloc(q->nrbufs, sizeof(*q->arr));
            q->wr = calloc(q->wr_cap, sizeof(*q->wr));
            if (q->arr == NULL || q->wr == NULL)
                return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
            memset(&ia, 0, sizeof(ia));
            ia.send_cq = tp->cq;
            ia.recv_cq = tp->cq;
            ia.qp_type = IBV_QPT_RC;
            ia.cap.max_send_wr = q->wr_cap;
            ia.cap.max_recv_wr = q->nrbufs;
            ia.cap.max_send_sge = 1;
            ia.cap.max_recv_sge = 1;
            q->qp = tp->seam->create_qp(tp->pd, &ia);
            if (q->qp == NULL)
                return hvd_error_set(HVD_ERR_TRANSPORT,
                                     "ibv_create_qp(RC, %s) failed: %s (the "
                                     "device may not offer reliable "
                                     "connections)",
                                     tp->dev.name, strerror(errno));
            memset(&qa, 0, sizeof(qa));
            qa.qp_state = IBV_QPS_INIT;
            qa.pkey_index = 0;
            qa.port_num = (uint8_t)tp->dev.port;
            qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
            int err =
                tp->seam->modify_qp(q->qp, &qa,
                                    IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                        IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
            if (err != 0)
                return hvd_error_set(HVD_ERR_TRANSPORT,
                                     "ibv_modify_qp(INIT) failed: %s",
                                     strerror(err));
            q->psn = next_psn(&seed);
            for (uint32_t i = 0; i < q->nrbufs; i++) {
                hvd_status st = repost(q, i);
                if (st != HVD_OK)
                    return hvd_error_copy(st, tp->failure.text);
            }
        }
    }

    /* User buffers: registered on their own where that is safe; the cache
     * also holds explicit registrations (hvd_verbs_register). */
    tp->auto_reg = set->mr_cache == 1 || (set->mr_cache == 2 && tp->dev.odp);
    return hvd_mr_cache_create(tp->seam, tp->pd, IBV_ACCESS_LOCAL_WRITE,
                               tp->dev.odp, MR_CACHE_ENTRIES, MR_CACHE_BYTES,
                               &tp->mrc);
}

/* Moves q to RTR then RTS towards the peer described by r and qi. */
static hvd_status connect_qp(vtp *tp, vqp *q, const hvd_vconn *r,
                             const hvd_vqpinfo *qi) {
    struct ibv_qp_attr a;
    int err;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(r->mtu < tp->dev.mtu ? r->mtu : tp->dev.mtu);
    a.dest_qp_num = qi->qpn;
    a.rq_psn = qi->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = QP_MIN_RNR;
    a.ah_attr.port_num = (uint8_t)tp->dev.port;
    if (tp->dev.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)tp->dev.gid_index;
        a.ah_attr.grh.hop_limit = 64;
    } else {
        a.ah_attr.dlid = r->lid;
    }
    err = tp->seam->modify_qp(
        q->qp, &a,
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_modify_qp(RTR) towards rank %d (QPN %#x) "
                             "failed: %s",
                             q->peer, qi->qpn, strerror(err));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = QP_TIMEOUT;
    a.retry_cnt = QP_RETRY;
    a.rnr_retry = QP_RNR_RETRY;
    a.sq_psn = q->psn;
    a.max_rd_atomic = 1;
    err = tp->seam->modify_qp(q->qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_modify_qp(RTS) towards rank %d failed: %s",
                             q->peer, strerror(err));
    q->rring = r->ring_addr +
               hvd_vring_offset(tp->size, q->peer, tp->rank, q->ch, 0,
                                (const uint32_t[]){r->slots[0], r->slots[1]},
                                r->slot_bytes);
    q->rkey = r->rkey;
    q->rslots = r->slots[q->ch];
    q->rslot_bytes = r->slot_bytes[q->ch];
    q->reager_bytes = r->eager_bytes;
    hvd_vcredit_init(&q->cr, r->eager_credits[q->ch], r->slots[q->ch],
                     EAGER_CREDITS, q->slots);
    return HVD_OK;
}

/* What every rank says after a setup step: all ranks take the same
 * decision from it. */
typedef struct step_blob {
    uint32_t ok;
    char why[252];
} step_blob;

/* Allgathers this rank's outcome of a step; HVD_OK if every rank's was
 * good, else the first failing rank's sentence. */
static hvd_status agree(vtp *tp, hvd_bootstrap *bs, hvd_status mine,
                        const char *what) {
    step_blob me, *all = calloc((size_t)tp->size, sizeof(*all));
    hvd_status st;

    if (all == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    memset(&me, 0, sizeof(me));
    me.ok = mine == HVD_OK ? 0 : (uint32_t)mine;
    if (mine != HVD_OK)
        snprintf(me.why, sizeof(me.why), "%s", hvd_error_get());
    st = bs->allgather(bs, &me, sizeof(me), all);
    for (int p = 0; st == HVD_OK && p < tp->size; p++) {
        if (all[p].ok == 0)
            continue;
        all[p].why[sizeof(all[p].why) - 1] = '\0';
        hvd_status ps = all[p].ok > HVD_ERR_INTERNAL ? HVD_ERR_TRANSPORT
                                                     : (hvd_status)all[p].ok;
        st = p == tp->rank
                 ? hvd_error_set(ps, "%s: %s", what, all[p].why)
                 : hvd_error_set(ps, "%s: rank %d: %s", what, p, all[p].why);
    }
    free(all);
    return st;
}

/* Sends HELLO on every queue pair and waits until every one has crossed
 * both ways (bounded by deadline). */
static hvd_status hello(vtp *tp, int64_t deadline) {
    hvd_status st = HVD_OK;

    for (int i = 0; i < tp->size * 2; i++) {
        vqp *q = &tp->qps[i];
        if (q->qp == NULL)
            continue;
        int err = post_ctl(q, HVD_VMSG_HELLO, NULL, 0);
        if (err != 0)
            return hvd_error_set(
                HVD_ERR_TRANSPORT, "ibv_post_send(hello) to rank %d failed: %s",
                q->peer, err == 1 ? "no send buffer" : strerror(err));
    }
    for (;;) {
        int missing = -1;
        if (drain(tp) < 0)
            return hvd_tp_failure_error(&tp->failure);
        for (int i = 0; i < tp->size * 2 && missing < 0; i++) {
            vqp *q = &tp->qps[i];
            if (q->qp != NULL && (!q->hello_rx || !q->hello_done))
                missing = i;
        }
        if (missing < 0)
            break;
        if (hvd_now_ns() > deadline) {
            vqp *q = &tp->qps[missing];
            char who[160];
            describe(tp, q->peer, who, sizeof(who));
            st = hvd_error_set(HVD_ERR_TIMEOUT,
                               "no RDMA %s with %s within the start timeout "
                               "(the ports cannot reach each other: check "
                               "the fabric, or HVD_IB_GID_INDEX on RoCE)",
                               !q->hello_done ? "acknowledgement" : "hello",
                               who);
            break;
        }
        wait_events(tp, 100);
    }
    return st;
}

/* 1 if this rank can move CUDA device memory itself (GPUDirect RDMA);
 * else why not, as a phrase, in why. */
static int gpudirect_here(const hvd_ibv_seam *seam,
                          const hvd_transport_params *params,
                          const hvd_verbs_settings *set, char *why,
                          size_t whylen) {
    if (set->gpudirect == 0) {
        snprintf(why, whylen, "HVD_IB_GPUDIRECT=0");
        return 0;
    }
    if (params->gpu_device < 0 || seam->cuda_devices() <= 0) {
        snprintf(why, whylen,
                 "this rank has no CUDA device (or hvd was built without "
                 "CUDA)");
        return 0;
    }
    if (!seam->peermem_loaded()) {
        snprintf(why, whylen,
                 "the nvidia-peermem kernel module is not loaded on this "
                 "rank's host (`modprobe nvidia-peermem`)");
        return 0;
    }
    return 1;
}

hvd_status hvd_verbs_probe_with(const hvd_ibv_seam *seam,
                                const hvd_transport_params *params,
                                hvd_caps *caps) {
    hvd_verbs_settings set;
    hvd_vdev_cfg cfg;
    hvd_vdev dev;

    memset(caps, 0, sizeof(*caps));
    /* Between any ranks; auto prefers it to TCP where every rank has it. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 20;
    if (hvd_transport_read_settings(&hvd_verbs_ops, params, &set) != HVD_OK) {
        snprintf(caps->reason, sizeof(caps->reason), "%s", hvd_error_get());
        return HVD_OK;
    }
    cfg = (hvd_vdev_cfg){
        .device = set.device, .port = set.port, .gid_index = set.gid_index};
    if (hvd_vdev_open(seam, &cfg, &dev, caps->reason, sizeof(caps->reason)) ==
        HVD_VDEV_OK) {
        char why[160];
        caps->usable = 1;
        hvd_vdev_close(seam, &dev);
        if (gpudirect_here(seam, params, &set, why, sizeof(why)))
            caps->mem_types =
                HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE);
    }
    return HVD_OK;
}

static hvd_status vb_probe(const hvd_transport_params *params, hvd_caps *caps) {
    return hvd_verbs_probe_with(&hvd_ibv_real, params, caps);
}

/* open, with the settings read. */
static hvd_status open_set(const hvd_ibv_seam *seam,
                           const hvd_transport_params *params,
                           const hvd_verbs_settings *set, hvd_transport **out) {
    vtp *tp = calloc(1, sizeof(*tp));
    hvd_bootstrap *bs = params->bootstrap;
    hvd_vdev_cfg cfg = {
        .device = set->device, .port = set->port, .gid_index = set->gid_index};
    uint8_t *blobs = NULL, *mine = NULL;
    hvd_vqpinfo *qinfo = NULL;
    hvd_vconn *conns = NULL;
    size_t blen = HVD_VCONN_LEN(params->size);
    char why[256] = "", gd_why[160] = "";
    hvd_status st, local = HVD_OK;
    int64_t deadline = hvd_now_ns() + params->connect_timeout_ns;
    int gd_here = gpudirect_here(seam, params, set, gd_why, sizeof(gd_why));
    int gd_bad = -1;

    if (tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->base.ops = &hvd_verbs_ops;
    tp->seam = seam;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->wakefd = -1;
    tp->opening = 1;
    tp->timeout_ns = params->timeout_ns;
    tp->heartbeat_ns =
        tp->timeout_ns / 4 < HEARTBEAT_NS ? tp->timeout_ns / 4 : HEARTBEAT_NS;
    if (blen > HVD_RDV_MAX_BLOB) {
        /* Every rank decides the same from the size alone. */
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "the verbs transport exchanges %zu bytes per rank "
                           "at start, more than the bootstrap carries (%d): "
                           "a job of %d ranks is too large for it; use tcp",
                           blen, HVD_RDV_MAX_BLOB, params->size);
        goto fail;
    }
    tp->qps = calloc((size_t)tp->size * 2, sizeof(*tp->qps));
    tp->pending = calloc((size_t)tp->size, sizeof(*tp->pending));
    tp->last_active = calloc((size_t)tp->size, sizeof(*tp->last_active));
    blobs = malloc(blen * (size_t)tp->size);
    mine = calloc(1, blen);
    qinfo = calloc((size_t)tp->size * 2, sizeof(*qinfo));
    conns = calloc((size_t)tp->size, sizeof(*conns));
    if (params->hosts != NULL && params->pids != NULL) {
        tp->hosts = malloc((size_t)tp->size * sizeof(*tp->hosts));
        tp->pids = malloc((size_t)tp->size * sizeof(*tp->pids));
        if (tp->hosts != NULL && tp->pids != NULL) {
            memcpy(tp->hosts, params->hosts,
                   (size_t)tp->size * sizeof(*tp->hosts));
            memcpy(tp->pids, params->pids,
                   (size_t)tp->size * sizeof(*tp->pids));
        }
    }
    if (tp->qps == NULL || tp->pending == NULL || tp->last_active == NULL ||
        blobs == NULL || mine == NULL || qinfo == NULL || conns == NULL) {
        /* Still take part in the exchange, so no rank waits for us. */
        local = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    for (int i = 0; tp->qps != NULL && i < tp->size * 2; i++) {
        tp->qps[i].tp = tp;
        tp->qps[i].peer = i / 2;
        tp->qps[i].ch = i % 2;
        tp->qps[i].index = i;
    }

    /* Step 1: device, buffers and queue pairs; the connection data. */
    if (local == HVD_OK &&
        hvd_vdev_open(seam, &cfg, &tp->dev, why, sizeof(why)) != HVD_VDEV_OK)
        local = hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", why);
    if (local == HVD_OK) {
        tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        local = tp->wakefd < 0
                    ? hvd_error_set(HVD_ERR_TRANSPORT, "eventfd failed: %s",
                                    strerror(errno))
                    : setup_local(tp, set);
    }
    if (local != HVD_OK)
        snprintf(why, sizeof(why), "%s", hvd_error_get());
    {
        hvd_vconn c;
        memset(&c, 0, sizeof(c));
        c.rank = (uint32_t)tp->rank;
        c.size = (uint32_t)tp->size;
        if (local == HVD_OK) {
            c.flags = HVD_VCONN_USABLE | (gd_here ? HVD_VCONN_GPUDIRECT : 0);
            c.lid = (uint16_t)tp->dev.lid;
            c.port = (uint8_t)tp->dev.port;
            c.link_layer = (uint8_t)tp->dev.link_layer;
            c.mtu = (uint8_t)tp->dev.mtu;
            c.gid_index = tp->dev.gid_index;
            memcpy(c.gid, tp->dev.gid.raw, 16);
            c.ring_addr = (uintptr_t)tp->ring;
            c.rkey = tp->ring_mr->rkey;
            c.eager_bytes = EAGER_BYTES;
            for (int ch = 0; ch < 2; ch++) {
                c.eager_credits[ch] = EAGER_CREDITS;
                c.slots[ch] = (uint16_t)tp->slots[ch];
                c.slot_bytes[ch] = tp->slot_bytes[ch];
            }
            for (int i = 0; i < tp->size * 2; i++)
                if (tp->qps[i].qp != NULL)
                    qinfo[i] = (hvd_vqpinfo){.qpn = tp->qps[i].qp->qp_num,
                                             .psn = tp->qps[i].psn};
        }
        if (mine != NULL)
            hvd_vconn_encode(&c, qinfo, mine);
    }
    if (mine == NULL || blobs == NULL) {
        /* Nothing to send: this rank cannot take part; the others time
         * out in the bootstrap. */
        st = local;
        goto fail;
    }
    st = bs->allgather(bs, mine, blen, blobs);
    if (st != HVD_OK)
        goto fail;
    {
        int unusable = -1;
        for (int p = 0; p < tp->size; p++) {
            hvd_vqpinfo q2[2];
            hvd_status dst =
                hvd_vconn_decode(blobs + (size_t)p * blen, blen, p, tp->size,
                                 tp->rank, &conns[p], q2);
            if (dst != HVD_OK) {
                if (local == HVD_OK)
                    local = dst;
                continue;
            }
            if (!(conns[p].flags & HVD_VCONN_USABLE)) {
                if (unusable < 0)
                    unusable = p;
                continue;
            }
            qinfo[p * 2] = q2[0];
            qinfo[p * 2 + 1] = q2[1];
            if (!(conns[p].flags & HVD_VCONN_GPUDIRECT) && gd_bad < 0)
                gd_bad = p;
        }
        if (unusable >= 0) {
            /* Every rank sees the same flags and stops here. */
            if (unusable == tp->rank)
                st = hvd_error_set(
                    local != HVD_OK ? local : HVD_ERR_UNSUPPORTED, "%s", why);
            else
                st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                                   "rank %d cannot use RDMA (its log says "
                                   "why)",
                                   unusable);
            goto fail;
        }
    }

    /* GPUDirect RDMA only if every rank can: the engine gives all ranks
     * device memory for an operation, or none. Every rank sees the same
     * flags. */
    tp->gpudirect = gd_bad < 0;
    tp->gpu_device = params->gpu_device;
    if (gd_bad >= 0 && set->gpudirect == 1) {
        if (gd_bad == tp->rank)
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_IB_GPUDIRECT=1: %s; set it to auto to "
                               "stage device memory through host memory",
                               gd_why);
        else
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_IB_GPUDIRECT=1: rank %d cannot move CUDA "
                               "device memory over RDMA (no CUDA device or "
                               "no nvidia-peermem there); set it to auto to "
                               "stage device memory through host memory",
                               gd_bad);
        goto fail;
    }

    /* Step 2: connect every queue pair. */
    for (int p = 0; local == HVD_OK && p < tp->size; p++) {
        if (p == tp->rank)
            continue;
        if (conns[p].link_layer != tp->dev.link_layer) {
            local = hvd_error_set(HVD_ERR_TRANSPORT,
                                  "rank %d's RDMA port is %s and this rank's "
                                  "%s: they cannot connect",
                                  p, hvd_vdev_link_name(conns[p].link_layer),
                                  hvd_vdev_link_name(tp->dev.link_layer));
            break;
        }
        for (int ch = 0; local == HVD_OK && ch < 2; ch++)
            local = connect_qp(tp, &tp->qps[p * 2 + ch], &conns[p],
                               &qinfo[p * 2 + ch]);
    }
    st = agree(tp, bs, local, "connecting RDMA queue pairs");
    if (st != HVD_OK)
        goto fail;

    /* Step 3: a HELLO across every queue pair, so that ports that cannot
     * reach each other fail here, on every rank, not in a collective. */
    local = hello(tp, deadline);
    st = agree(tp, bs, local, "checking RDMA connectivity");
    if (st != HVD_OK)
        goto fail;

    HVD_DEBUG("verbs",
              "%s port %d (%s, LID %d, GID index %d, MTU %d): %d peers, "
              "data chunks of %u bytes x %u, sends from user buffers: %s",
              tp->dev.name, tp->dev.port,
              hvd_vdev_link_name(tp->dev.link_layer), tp->dev.lid,
              tp->dev.gid_index, 128 << tp->dev.mtu, tp->size - 1,
              tp->slot_bytes[0], tp->slots[0],
              !tp->auto_reg ? "no (staged)"
              : tp->dev.odp ? "yes (on-demand paging)"
                            : "yes (pinned, HVD_IB_MR_CACHE=on)");
    if (tp->gpudirect)
        HVD_DEBUG("verbs", "GPUDirect RDMA: on (CUDA device memory is read "
                           "and written by the HCA)");
    else if (set->gpudirect != 0 && params->gpu_device >= 0)
        HVD_DEBUG("verbs", "GPUDirect RDMA: off (%s)",
                  gd_here ? "another rank cannot" : gd_why);
    free(blobs);
    free(mine);
    free(qinfo);
    free(conns);
    tp->opening = 0;
    *out = &tp->base;
    return HVD_OK;
fail : {
    char text[HVD_ERROR_MAX];
    snprintf(text, sizeof(text), "%s", hvd_error_get());
    tp->shutting_down = 1; /* no ABORT notices from a failed open */
    vb_close(&tp->base);
    free(blobs);
    free(mine);
    free(qinfo);
    free(conns);
    return hvd_error_copy(st, text);
}
}

hvd_status hvd_verbs_open_with(const hvd_ibv_seam *seam,
                               const hvd_transport_params *params,
                               hvd_transport **out) {
    hvd_verbs_settings set;
    hvd_status st = hvd_transport_read_settings(&hvd_verbs_ops, params, &set);

    return st != HVD_OK ? st : open_set(seam, params, &set, out);
}

static hvd_status vb_open(const hvd_transport_params *params,
                          hvd_transport **out) {
    return hvd_verbs_open_with(&hvd_ibv_real, params, out);
}

hvd_status hvd_verbs_register(hvd_transport *t, const void *addr, size_t len,
                              hvd_mem_type type, hvd_mr_entry **out) {
    vtp *tp = (vtp *)t;

    if (t == NULL || t->ops != &hvd_verbs_ops)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_verbs_register: not a verbs transport");
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (type == HVD_MEM_DEVICE) {
        uint64_t id = 0;
        tp->seam->mem_type(addr, &id);
        return hvd_mr_get_id(tp->mrc, addr, len, type, id, out);
    }
    return hvd_mr_get(tp->mrc, addr, len, type, out);
}

void hvd_verbs_unregister(hvd_transport *t, hvd_mr_entry *e) {
    if (t != NULL && t->ops == &hvd_verbs_ops)
        hvd_mr_put(((vtp *)t)->mrc, e);
}

void hvd_verbs_counters_get(hvd_transport *t, hvd_verbs_counters *out) {
    memset(out, 0, sizeof(*out));
    if (t != NULL && t->ops == &hvd_verbs_ops)
        *out = ((vtp *)t)->ctr;
}

static unsigned vb_mem_types(hvd_transport *t) {
    const vtp *tp = (const vtp *)t;

    return tp->gpudirect
               ? HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE)
               : 0;
}

void hvd_verbs_mr_stats(hvd_transport *t, hvd_mr_stats *out) {
    memset(out, 0, sizeof(*out));
    if (t != NULL && t->ops == &hvd_verbs_ops)
        hvd_mr_cache_stats(((vtp *)t)->mrc, out);
}

/* ------------------------------------------------------------------ */
/* Goodbye                                                             */

static hvd_status vb_shutdown(hvd_transport *t) {
    vtp *tp = (vtp *)t;
    int64_t deadline =
        hvd_now_ns() +
        (tp->timeout_ns < SHUTDOWN_NS ? tp->timeout_ns : SHUTDOWN_NS);

    if (tp->failure.status != HVD_OK)
        return HVD_OK;
    tp->shutting_down = 1;
    while (hvd_now_ns() < deadline && tp->failure.status == HVD_OK) {
        int open_qps = 0;
        for (int i = 0; i < tp->size * 2; i++) {
            vqp *q = &tp->qps[i];
            if (q->qp == NULL)
                continue;
            if (!q->bye_tx) {
                int err = post_ctl(q, HVD_VMSG_BYE, NULL, 0);
                if (err == 0)
                    q->bye_tx = 1;
                else if (err > 1)
                    break;
            }
            /* Done with a pair once the peer said goodbye and ours has
             * been acknowledged. */
            if (!q->bye_tx || !q->bye_rx || q->wr_done < q->wr_posted)
                open_qps++;
        }
        if (open_qps == 0)
            return HVD_OK;
        if (drain(tp) == 0)
            wait_events(tp, 100);
    }
    HVD_DEBUG("verbs", "not every peer said goodbye in time");
    return HVD_OK;
}

const hvd_transport_ops hvd_verbs_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "verbs",
    .title = "RDMA",
    .settings = hvd_verbs_settings_table,
    .nsettings = HVD_VERBS_NSETTINGS,
    .settings_size = sizeof(hvd_verbs_settings),
    .probe = vb_probe,
    .open = vb_open,
    .isend = vb_isend,
    .irecv = vb_irecv,
    .progress = vb_progress,
    .wake = vb_wake,
    .shutdown = vb_shutdown,
    .close = vb_close,
    .mem_types = vb_mem_types,
};
