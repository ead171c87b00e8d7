/*
 * The verbs transport's own declarations, shared by its files (verbs.h has
 * what the rest of hvd uses). Nothing outside transport/verbs/ includes
 * this. Its files, and the one way their calls go (a file calls only
 * files below it, never one above):
 *
 *   verbs.c       the ops table only (it names the entries below)
 *   entries.c     probe and open on the real libibverbs, the memory
 *                 types, hvd_verbs_register and the counters
 *                                                  -> setup.c, mr.c
 *   setup.c       probe, open (the settings, GPUDirect RDMA, the bootstrap
 *                 exchange, the hello), close, goodbye
 *                                                  -> qp.c, progress.c
 *   qp.c          buffers, rings, the completion queue, queue pairs and
 *                 connecting them
 *   progress.c    moving data: isend, irecv, progress (heartbeats and
 *                 stalled peers), wake; the only file above that calls
 *                 the three below it             -> completion.c, rx.c, tx.c
 *   completion.c  send completions, failed work completions, draining the
 *                 completion queue and waiting on it   -> rx.c, tx.c
 *   rx.c          receiving: matching arrivals to irecvs, control
 *                 messages, the receive completions    -> tx.c
 *   tx.c          sending: eager buffers, chunks through the peer's ring,
 *                 rendezvous writes, credits
 *   fail.c        failure (the first one wins, ABORT notices to the
 *                 peers); every file above may call it -> post.c
 *   post.c        posting work requests; calls no file of the transport
 *   settings.c    the HVD_IB_* settings table (settings.h)
 *
 * and its components, which call none of the files above: device.c
 * (device and port, device.h), conn.c (the connection data, conn.h),
 * proto.c (the protocol's pure parts, proto.h), mr.c (the registration
 * cache, mr.h), seam.c (the libibverbs calls, seam.h; a fake behind them
 * in the unit tests), lib.c (libibverbs loaded at run time, lib.h: the
 * functions seam.c calls, as forwarders). So no lower file needs to tell a
 * higher one anything: what a completion frees, completion.c hands to tx.c
 * itself.
 */
#ifndef HVD_TRANSPORT_VERBS_INTERNAL_H
#define HVD_TRANSPORT_VERBS_INTERNAL_H

#include "transport/verbs/settings.h"
#include "transport/verbs/verbs.h"

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
#include "transport/base/grow.h"
#include "transport/base/log.h"
#include "transport/bootstrap/failure.h"
#include "transport/bootstrap/rendezvous.h"
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
    uint8_t upto; /* irecv_upto: len is the most it takes */
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

/* Small helpers of the hot path, used by several files. */
static inline void req_done(vtp *tp, hvd_req *req, hvd_status st) {
    req->status = st;
    req->done = 1;
    if (req->peer >= 0 && req->peer < tp->size)
        tp->pending[req->peer]--;
}

static inline int sb_free(const vqp *q) { return SEND_BUFS - (int)q->sb_used; }

static inline int wr_free(const vqp *q) {
    return (int)(q->wr_cap - (uint32_t)(q->wr_posted - q->wr_done));
}

static inline uint8_t *sb_take(vqp *q) {
    uint32_t i = (q->sb_first + q->sb_used) % SEND_BUFS;
    q->sb_used++;
    return q->sbufs + (size_t)i * EAGER_BYTES;
}

/* The RTR received for message seq, or NULL. */
static inline hvd_vrdv *rtr_find(vqp *q, uint64_t seq) {
    for (int i = 0; i < q->nrtr; i++)
        if (q->rtr[i].seq == seq)
            return &q->rtr[i];
    return NULL;
}

/* verbs.c: the ops table (verbs.h). */

/* entries.c: the ops table's probe, open and mem_types. */
hvd_status hvd_vb_entry_probe(const hvd_transport_params *params,
                              hvd_caps *caps);
hvd_status hvd_vb_entry_open(const hvd_transport_params *params,
                             hvd_transport **out);
unsigned hvd_vb_mem_types(hvd_transport *t);

/* setup.c */
hvd_status hvd_vb_probe(const hvd_transport_ops *ops, const hvd_ibv_seam *seam,
                        const hvd_transport_params *params, hvd_caps *caps);
hvd_status hvd_vb_open(const hvd_transport_ops *ops, const hvd_ibv_seam *seam,
                       const hvd_transport_params *params,
                       const hvd_verbs_settings *set, hvd_transport **out);
void hvd_vb_close(hvd_transport *t);
hvd_status hvd_vb_shutdown(hvd_transport *t);

/* qp.c */
hvd_status hvd_vb_setup_local(vtp *tp, const hvd_verbs_settings *set);
hvd_status hvd_vb_connect_qp(vtp *tp, vqp *q, const hvd_vconn *r,
                             const hvd_vqpinfo *qi);

/* progress.c */
hvd_status hvd_vb_isend(hvd_transport *t, int peer, int channel,
                        const void *buf, size_t len, hvd_req *req);
hvd_status hvd_vb_irecv(hvd_transport *t, int peer, int channel, void *buf,
                        size_t len, hvd_req *req);
hvd_status hvd_vb_irecv_upto(hvd_transport *t, int peer, int channel, void *buf,
                             size_t cap, hvd_req *req);
hvd_status hvd_vb_progress(hvd_transport *t, int timeout_ms);
void hvd_vb_wake(hvd_transport *t);
int hvd_vb_step(vtp *tp, int wait_ms);

/* completion.c */
int hvd_vb_drain(vtp *tp);
int hvd_vb_wait_events(vtp *tp, int timeout_ms);

/* rx.c */
hvd_status hvd_vb_repost(vqp *q, uint32_t idx);
hvd_status hvd_vb_match(vqp *q);
hvd_status hvd_vb_on_bye(vqp *q);
hvd_status hvd_vb_recv_done(vqp *q, uint32_t idx, const struct ibv_wc *wc);

/* tx.c */
hvd_status hvd_vb_maybe_credit(vqp *q);
hvd_status hvd_vb_rdv_progress(vqp *q);
hvd_status hvd_vb_tx_progress(vqp *q);

/* fail.c */
void hvd_vb_describe(const vtp *tp, int peer, char *out, size_t outlen);
hvd_status hvd_vb_fail_with(void *arg, hvd_status status, int culprit,
                            int origin, const char *text);
/* Fails the transport with q's peer as the culprit, in the sentence
 * "<the peer: rank, pid, host> <fmt formatted>". */
hvd_status hvd_vb_peer_failf(vqp *q, hvd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
hvd_status hvd_vb_protocol_error(vqp *q, const char *what);
hvd_status hvd_vb_post_failed(vqp *q, const char *what, int err);
hvd_status hvd_vb_recv_failed(vqp *q, int err);

/* post.c */
int hvd_vb_post_wr(vqp *q, struct ibv_send_wr *wr, const wrctx *ctx);
int hvd_vb_post_sbuf(vqp *q, const hvd_vhdr *h, const void *payload,
                     size_t plen, const wrctx *ctx);
int hvd_vb_post_ctl(vqp *q, uint8_t type, const uint8_t *payload, size_t plen);
int hvd_vb_post_recv(vqp *q, uint32_t idx);
const char *hvd_vb_ctl_name(uint8_t type);

#endif
