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
#include "transport/bootstrap/failure.h"
#include "transport/bootstrap/net.h"
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
/* Time a failing rank spends telling its peers why, in all. */
#define ABORT_NS (200 * 1000000LL)
/* Most time between two heartbeats of a waiting rank. */
#define HEARTBEAT_NS (1000 * 1000000LL)
/* How long a goodbye may take. */
#define SHUTDOWN_NS (30 * 1000000000LL)

_Static_assert(RX_CAP >= HVD_FRAME_HDR_LEN + HVD_FRAME_ABORT_MAX,
               "an ABORT frame must fit in the receive staging buffer");

/* One frame of a request on one socket. */
typedef struct part {
    hvd_req *req; /* NULL for a heartbeat */
    uint8_t *buf;
    size_t len;  /* payload bytes */
    size_t done; /* payload bytes moved */
    uint64_t msg_len;
    size_t hdr_done; /* send side: header bytes written */
    uint8_t hdr[HVD_FRAME_HDR_LEN];
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
    int tx_broken;  /* a frame was cut off mid-way: no more frames */
    uint32_t events;
    int registered; /* in the epoll set */
    int eof;
    int bye_rx;
    uint64_t
        scan_drop; /* failing: payload bytes hvd_tcp_scan_for_abort drops */
} tsock;

typedef struct tpeer {
    tsock *socks; /* nconn entries: nsocks for data, then control */
    uint64_t tx_msgs;
    uint64_t rx_msgs;
    int pending; /* parts in flight */
    int64_t last_active;
    char addr[HVD_ADDR_MAX];
    int port;
} tpeer;

struct tcp {
    hvd_transport base;
    int rank;
    int size;
    int nsocks; /* data sockets per peer */
    int nconn;  /* sockets per peer: the data ones and one for control */
    int wakefd; /* eventfd that makes a waiting progress return */
    size_t stripe_min;
    int64_t timeout_ns;
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

/* ------------------------------------------------------------------ */
/* Shared between the files (each defined where its section lives)     */

/* fail.c: failure. */
void hvd_tcp_describe(const tcp *tp, int peer, char *out, size_t outlen);
hvd_status hvd_tcp_fail_with(void *arg, hvd_status status, int culprit,
                             int origin, const char *text);

/* stream.c: a socket's frames; a lost peer. */
void hvd_tcp_set_events(tsock *s);
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
void hvd_tcp_wake(hvd_transport *t);
hvd_status hvd_tcp_progress(hvd_transport *t, int timeout_ms);

/* connect.c: the mesh. */
/* Takes fd over as the index-th socket to peer, watched by epoll. */
void hvd_tcp_install(tcp *tp, int peer, int index, int fd);
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
