/*
 * Private to the TCP transport (transport/tcp/): its constants, structs and
 * the functions its files share. Nothing outside transport/tcp/ includes
 * it; the transport's interface is transport/tcp/tcp.h.
 *
 * Calls go one way, down this list (frame.c and settings.c call nothing
 * of the transport):
 *
 *   tcp.c       the ops table (the registry's entry)
 *   setup.c     probe, open (where to listen, the address exchange),
 *               open over connected sockets (tests), goodbye (shutdown)
 *               and close
 *   connect.c   the mesh: connecting, accepting, the handshake
 *   progress.c  moving data: layout, isend/isendv/irecv, wake, the
 *               progress engine (epoll, heartbeats, stalled peers)
 *   stream.c    a socket's frames, written and read; a lost peer
 *   fail.c      naming a peer; failing for good (ABORT to every peer)
 *   frame.c     the wire format (transport/tcp/frame.h)
 *   settings.c  the HVD_* settings table
 */
#ifndef HVD_TRANSPORT_TCP_TCP_INTERNAL_H
#define HVD_TRANSPORT_TCP_TCP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "transport/base/grow.h"
#include "transport/base/hostload.h"
#include "transport/bootstrap/failure.h"
#include "transport/bootstrap/net.h"
#include "transport/bootstrap/protect.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp.h"
#include "transport/transport.h"

/* Receive staging per socket: small frames are read in bulk into it, large
 * payloads go straight into the caller's buffer. */
#define RX_CAP (16 * 1024)
#define MAX_EVENTS 64
#define MAX_IOV 32
/* A connection that does not finish its handshake in this time is dropped. */
#define HANDSHAKE_NS (10 * 1000000000LL)
/* How often stalled peers are looked for. */
#define TIMEOUT_CHECK_NS (100 * 1000000LL)
/* Most bytes of a frame header on the wire: the header and its tag. */
#define HDR_MAX (HVD_FRAME_HDR_LEN + HVD_PROTECT_TAG)
/* With protection, a frame whose payload has at most this many bytes is
 * one record (header and payload, one tag): one seal and one open per
 * small message. A larger payload is a record of its own after the
 * header's, so that its header is checked before anything of it is
 * acted on. */
#define INLINE_MAX 4096
/* HVD_TCP_PROTECT=encrypt: the ciphertext of what a socket sends is staged
 * in a buffer of this size (set up once per socket, never per message). */
#define TX_STAGE (256 * 1024)
/* HVD_TCP_PROTECT=integrity: a payload is authenticated at most this far
 * ahead of what the socket has sent, so the tag is computed in the pass
 * that sends (the bytes are still in cache) rather than in one before. */
#define MAC_AHEAD (256 * 1024)
/* Mid-frame, received bytes show that the sender is alive only in amounts
 * a live sender produces: this many, or the rest of the frame. A trickle
 * (heartbeats filling a gap an attacker cut, one byte every few seconds)
 * keeps no stalled frame alive, while a slow link that keeps delivering
 * (this much per HVD_TIMEOUT_SECONDS) still carries a frame of any size. */
#define LIFE_BYTES (64 * 1024)
/* Time a failing rank spends telling its peers why, in all. */
#define ABORT_NS (200 * 1000000LL)
/* Most time between two heartbeats of a waiting rank. */
#define HEARTBEAT_NS (1000 * 1000000LL)
/* How long a goodbye may take. */
#define SHUTDOWN_NS (30 * 1000000000LL)

_Static_assert(RX_CAP >= HVD_FRAME_HDR_LEN + INLINE_MAX + HVD_PROTECT_TAG &&
                   INLINE_MAX >= HVD_FRAME_ABORT_MAX,
               "an ABORT frame must fit in the receive staging buffer");

/*
 * One frame of a request on one socket. On the wire (see frame.h): the
 * header, its tag, the payload, the payload's tag (tags only when
 * HVD_TCP_PROTECT is not none; the payload's only if there is one).
 */
typedef struct part {
    hvd_req *req; /* NULL for a heartbeat */
    uint8_t *buf;
    size_t len;  /* payload bytes */
    size_t done; /* payload bytes moved */
    uint64_t msg_len;
    int upto; /* a receive of up to len bytes (irecv_upto) */
    /* Send side. */
    int sealed;      /* the header is sealed: seq and record numbers taken */
    size_t hlen;     /* header bytes on the wire: 24, or 40 with a tag */
    size_t hdr_done; /* header bytes written */
    size_t ready;    /* payload bytes ready to go: authenticated
                        (integrity) or encrypted into the stage (encrypt) */
    size_t chunk;    /* encrypt: payload byte chunk is at stage[stage_pos] */
    size_t stage_pos;
    size_t tag_done;      /* bytes of the trailing tag written */
    uint64_t seq0, ctr0;  /* the socket's counters before the header took
                             its numbers (to give them back, see fail.c) */
    uint64_t payload_ctr; /* a payload record's number (not inline) */
    uint8_t hdr[HDR_MAX];
    uint8_t tag[HVD_PROTECT_TAG];
} part;

/* FIFO of parts, a ring that grows by doubling (never per message in the
 * steady state). */
typedef struct partq {
    part *v;
    size_t cap;
    size_t head;
    size_t count;
} partq;

typedef struct tcp tcp;

typedef struct tsock {
    tcp *tp;
    int fd;
    int peer;
    int index;
    partq sendq;
    partq recvq;
    uint32_t tx_seq;
    uint32_t rx_seq;
    uint8_t *rx; /* RX_CAP bytes; valid data is rx[rx_off, rx_end) */
    size_t rx_off;
    size_t rx_end;
    int in_frame;   /* receiving the payload of recvq's head */
    int rx_blocked; /* a DATA header waits for an irecv */
    int rx_muted;   /* rx_blocked, and epoll said so: EPOLLIN is off */
    int rx_drained; /* the last recv() took less than it asked for */
    int tx_broken;  /* a frame was cut off mid-way: no more frames */
    uint32_t events;
    int registered; /* in the epoll set */
    int eof;
    int bye_rx;
    uint64_t
        scan_drop; /* failing: payload bytes hvd_tcp_scan_for_abort drops */
    /* Frame protection (HVD_TCP_PROTECT; none: unused). */
    hvd_aead tx_h;   /* whole records: headers, ABORT payloads */
    hvd_aead tx_b;   /* the payload being sent, in pieces */
    hvd_aead rx_a;   /* what arrives, one record at a time */
    uint64_t tx_ctr; /* next record number sent */
    uint64_t rx_ctr; /* next record number expected */
    uint64_t rx_payload_ctr;
    int hdr_begun;     /* the record of the header at rx_off is begun */
    int cur_inline;    /* cur's payload was in its header's record */
    uint8_t *stage;    /* encrypt: TX_STAGE bytes of ciphertext */
    size_t st_used;    /* bytes of the stage handed out */
    size_t st_pending; /* bytes of the stage not sent yet */
    int have_hdr;      /* cur holds an opened header not acted on yet */
    hvd_frame cur;
    size_t tag_got; /* bytes of the payload's tag received */
    uint8_t rx_tag[HVD_PROTECT_TAG];
    /* The last sign of life on this stream (a frame begun or completed,
     * or LIFE_BYTES more of one) and the bytes received since. */
    int64_t rx_mark;
    uint64_t rx_since;
} tsock;

typedef struct tpeer {
    tsock *socks; /* nconn entries: nsocks for data, then control */
    uint64_t tx_msgs;
    uint64_t rx_msgs;
    int pending; /* parts in flight */
    int64_t last_active;
    int64_t wait_since; /* when pending last became nonzero */
    char addr[HVD_ADDR_MAX];
    int port;
} tpeer;

struct tcp {
    hvd_transport base;
    int rank;
    int size;
    int nsocks;     /* data sockets per peer */
    int nconn;      /* sockets per peer: the data ones and one for control */
    int protect;    /* HVD_TCP_PROTECT (hvd_protect_mode) */
    size_t tag_len; /* 0 (none) or HVD_PROTECT_TAG */
    int wakefd;     /* eventfd that makes a waiting progress return */
    size_t stripe_min;
    int64_t timeout_ns;
    int64_t spin_ns;   /* HVD_TCP_SPIN_US: a wait polls this long first */
    int spin_yield;    /* this host has more ranks than cores */
    hvd_hostload load; /* whether the host has a core to spare */
    int epfd;
    tpeer *peers;
    tsock *socks; /* size * nconn; this rank's own row is unused */
    char (*hosts)[HVD_HOST_MAX];
    int *pids;
    int64_t last_check;
    int64_t heartbeat_ns;
    int64_t last_heartbeat;
    int salvaging; /* hvd_tcp_peer_lost is reading the other connections */
    int shutting_down;
    hvd_tp_failure failure; /* the first failure, which wins */
};

/* ------------------------------------------------------------------ */
/* Part queues                                                         */

/* Here, static inline, because progress.c, stream.c and fail.c use them,
 * the first two on the hot path (once per message part). */

static inline int q_reserve(partq *q, size_t more) {
    part *v;

    if (q->count + more <= q->cap)
        return 0;
    v = hvd_ring_grow(q->v, sizeof(*v), &q->cap, &q->head, q->count,
                      q->count + more);
    if (v == NULL)
        return -1;
    q->v = v;
    return 0;
}

static inline part *q_at(partq *q, size_t i) {
    return &q->v[(q->head + i) & (q->cap - 1)];
}

static inline part *q_push(partq *q) {
    part *p = &q->v[(q->head + q->count) & (q->cap - 1)];
    q->count++;
    return p;
}

static inline void q_pop(partq *q) {
    q->head = (q->head + 1) & (q->cap - 1);
    q->count--;
}

/* s has part of a frame and waits on the wire for the rest (not on an
 * irecv: a header for a receive not posted yet is not on the wire). */
static inline int rx_mid_frame(const tsock *s) {
    return !s->eof && !s->rx_blocked &&
           (s->in_frame || s->have_hdr || s->rx_end > s->rx_off);
}

/* ------------------------------------------------------------------ */
/* Shared between the files (each defined where its section lives)     */

/* fail.c: failure. */
void hvd_tcp_describe(const tcp *tp, int peer, char *out, size_t outlen);
hvd_status hvd_tcp_fail_with(void *arg, hvd_status status, int culprit,
                             int origin, const char *text);

/* stream.c: a socket's frames; a lost peer. */
void hvd_tcp_set_events(tsock *s);
/* Seals a whole frame of at most INLINE_MAX payload bytes as s's next
 * one: buf holds its payload at HVD_FRAME_HDR_LEN, room for the header
 * before and the tag after; f's seq is taken here. Returns the bytes to
 * send, 0 if sealing failed. */
size_t hvd_tcp_seal_frame(tsock *s, hvd_frame *f, uint8_t *buf);
/* Failing: writes the rest of the frame at the head of s's send queue
 * (until deadline), then gives back the numbers of the frames queued
 * behind it, which will never be sent. 0 if the frame went out whole. */
int hvd_tcp_finish_head(tsock *s, int64_t deadline);
/* The failure of a frame that did not authenticate (HVD_ERR_PROTOCOL). */
hvd_status hvd_tcp_auth_failed(tsock *s);
hvd_status hvd_tcp_sock_send(tsock *s);
hvd_status hvd_tcp_sock_recv(tsock *s);
int hvd_tcp_scan_for_abort(tsock *s);
hvd_status hvd_tcp_peer_lost(tcp *tp, tsock *s, const char *what);

/* progress.c: moving data. */
hvd_status hvd_tcp_isend(hvd_transport *t, int peer, int channel,
                         const void *buf, size_t len, hvd_req *req);
hvd_status hvd_tcp_isendv(hvd_transport *t, int peer, int channel,
                          const hvd_sendv *msgs, int n, hvd_req *reqs);
hvd_status hvd_tcp_irecv(hvd_transport *t, int peer, int channel, void *buf,
                         size_t len, hvd_req *req);
hvd_status hvd_tcp_irecv_upto(hvd_transport *t, int peer, int channel,
                              void *buf, size_t cap, hvd_req *req);
void hvd_tcp_wake(hvd_transport *t);
hvd_status hvd_tcp_progress(hvd_transport *t, int timeout_ms);

/* connect.c: the mesh. */
/* Takes fd over as the index-th socket to peer, watched by epoll, its
 * frames protected with these keys (HVD_PROTECT_KEY bytes each; unused
 * when HVD_TCP_PROTECT=none). */
hvd_status hvd_tcp_install(tcp *tp, int peer, int index, int fd,
                           const uint8_t *tx_key, const uint8_t *rx_key);
/* Connects to every lower rank and accepts every higher one on lfd,
 * bounded by params->connect_timeout_ns. */
hvd_status hvd_tcp_connect_mesh(tcp *tp, const hvd_transport_params *params,
                                int lfd);

/* setup.c. */
hvd_status hvd_tcp_probe(const hvd_transport_params *params, hvd_caps *caps);
hvd_status hvd_tcp_open(const hvd_transport_params *params,
                        hvd_transport **out);
hvd_status hvd_tcp_shutdown(hvd_transport *t);
void hvd_tcp_close(hvd_transport *t);

#endif
