#include "transport/tcp/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/failure.h"
#include "transport/handshake.h"
#include "transport/net.h"
#include "transport/tcp/frame.h"

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
    uint64_t scan_drop; /* failing: payload bytes scan_for_abort drops */
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
    int salvaging; /* peer_lost is reading the other connections */
    int shutting_down;
    hvd_tp_failure failure; /* the first failure, which wins */
};

/* Partial-write bookkeeping for the listen/handshake phase. */
typedef struct pending_conn {
    int fd;
    int peer; /* client side: the rank we connect to; server: -1 */
    int index;
    int client;
    int64_t deadline;
    int64_t retry_at; /* client: reconnect after a refusal at this time */
    int connected;    /* client: TCP connect finished */
    char name[HVD_ADDR_MAX + 8];
    hvd_hs hs;
} pending_conn;

/* ------------------------------------------------------------------ */
/* Layout                                                              */

void hvd_tcp_layout(size_t len, int nsocks, size_t stripe_min, uint64_t msgno,
                    int *first_out, int *nparts_out) {
    if (nsocks > 1 && len >= stripe_min && len >= (size_t)nsocks * 64) {
        *first_out = 0;
        *nparts_out = nsocks;
    } else {
        *first_out = (int)(msgno % (uint64_t)(nsocks > 0 ? nsocks : 1));
        *nparts_out = 1;
    }
}

static size_t part_off(size_t len, int nparts, int i) {
    if (i <= 0)
        return 0;
    if (i >= nparts)
        return len;
    return ((len / (size_t)nparts) * (size_t)i) & ~(size_t)63;
}

void hvd_tcp_part_range(size_t len, int nparts, int i, size_t *off_out,
                        size_t *len_out) {
    size_t a = part_off(len, nparts, i);
    size_t b = part_off(len, nparts, i + 1);

    *off_out = a;
    *len_out = b - a;
}

/* ------------------------------------------------------------------ */
/* Part queues                                                         */

static int q_reserve(partq *q, size_t more) {
    size_t cap;
    part *v;

    if (q->count + more <= q->cap)
        return 0;
    cap = q->cap ? q->cap : 8;
    while (cap < q->count + more)
        cap *= 2;
    v = malloc(cap * sizeof(*v));
    if (v == NULL)
        return -1;
    for (size_t i = 0; i < q->count; i++)
        v[i] = q->v[(q->head + i) % q->cap];
    free(q->v);
    q->v = v;
    q->cap = cap;
    q->head = 0;
    return 0;
}

static part *q_at(partq *q, size_t i) { return &q->v[(q->head + i) % q->cap]; }

static part *q_push(partq *q) {
    part *p = &q->v[(q->head + q->count) % q->cap];
    q->count++;
    return p;
}

static void q_pop(partq *q) {
    q->head = (q->head + 1) % q->cap;
    q->count--;
}

/* ------------------------------------------------------------------ */
/* Failure                                                             */

static void describe(const tcp *tp, int peer, char *out, size_t outlen) {
    if (peer < 0 || peer >= tp->size)
        snprintf(out, outlen, "an unknown peer");
    else if (tp->hosts != NULL && tp->pids != NULL)
        snprintf(out, outlen, "rank %d (pid %d on %s)", peer, tp->pids[peer],
                 tp->hosts[peer]);
    else
        snprintf(out, outlen, "rank %d", peer);
}

/* Writes buf fully unless the peer is gone or deadline passes; returns the
 * bytes written. Used only on the way out of a failure. */
static size_t write_until(int fd, const uint8_t *buf, size_t len,
                          int64_t deadline) {
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            break;
        int64_t left = (deadline - hvd_now_ns()) / 1000000;
        if (left <= 0)
            break;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, (int)left);
    }
    return off;
}

/* Finishes the frame cut off at the head of s's send queue, so that an
 * ABORT can follow it; marks s broken if that cannot be done in time. */
static void finish_frame(tsock *s, int64_t deadline) {
    part *p;

    if (s->sendq.count == 0 || s->tx_broken)
        return;
    p = q_at(&s->sendq, 0);
    if (p->hdr_done == 0)
        return; /* nothing of it was sent */
    size_t h = HVD_FRAME_HDR_LEN - p->hdr_done;
    if (write_until(s->fd, p->hdr + p->hdr_done, h, deadline) != h ||
        write_until(s->fd, p->buf + p->done, p->len - p->done, deadline) !=
            p->len - p->done)
        s->tx_broken = 1;
}

static void send_abort(tsock *s, const hvd_frame_abort *a, int64_t deadline) {
    uint8_t frame[HVD_FRAME_HDR_LEN + HVD_FRAME_ABORT_MAX];
    hvd_frame hdr = {.type = HVD_FRAME_ABORT, .seq = s->tx_seq++};
    size_t len;

    len = hvd_frame_abort_encode(a, frame + HVD_FRAME_HDR_LEN);
    hdr.len = len;
    hvd_frame_encode(&hdr, frame);
    len += HVD_FRAME_HDR_LEN;
    if (write_until(s->fd, frame, len, deadline) != len)
        s->tx_broken = 1;
}

/*
 * Makes the transport fail for good: every request in flight completes
 * with status, every later call returns it, and every peer is told (an
 * ABORT frame, best effort) so that all ranks report the same cause. text
 * is the sentence of the rank that detected the failure (origin); the
 * ABORT relays it as it is, so that a rank that hears it second-hand
 * says "rank <origin> reported: <text>" once, not once per hop.
 */
static hvd_status fail_with(void *arg, hvd_status status, int culprit,
                            int origin, const char *text) {
    tcp *tp = arg;

    if (!hvd_tp_failure_set(&tp->failure, "tcp", status, tp->rank, origin,
                            text))
        return hvd_tp_failure_error(&tp->failure);
    int64_t deadline = hvd_now_ns() + ABORT_NS;

    for (int i = 0; i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        if (s->fd < 0)
            continue;
        /* The caller's buffers are still valid: finish a frame cut off
         * mid-way (not towards the rank at fault), so that peers can be
         * told why. */
        if (s->peer != culprit && !tp->shutting_down)
            finish_frame(s, deadline);
        else if (s->sendq.count > 0 && q_at(&s->sendq, 0)->hdr_done > 0)
            s->tx_broken = 1;
        for (size_t k = 0; k < s->sendq.count; k++) {
            hvd_req *req = q_at(&s->sendq, k)->req;
            if (req != NULL) {
                req->status = status;
                req->done = 1;
            }
        }
        for (size_t k = 0; k < s->recvq.count; k++) {
            q_at(&s->recvq, k)->req->status = status;
            q_at(&s->recvq, k)->req->done = 1;
        }
        s->sendq.count = 0;
        s->recvq.count = 0;
        s->in_frame = 0;
    }
    for (int p = 0; p < tp->size; p++)
        tp->peers[p].pending = 0;

    if (!tp->shutting_down) {
        hvd_frame_abort a = {
            .status = status, .culprit = culprit, .origin = origin};
        snprintf(a.text, sizeof(a.text), "%s", text);
        for (int p = 0; p < tp->size; p++) {
            if (p == tp->rank || p == origin)
                continue;
            /* The control socket first: the peer always reads it (a
             * header receive is posted, or nothing ever comes), while on
             * a data socket the ABORT could queue behind data for a
             * receive the peer has not posted, unread until the peer
             * blames the wrong rank for the connection closing. */
            for (int k = tp->nconn - 1; k >= 0; k--) {
                tsock *s = &tp->peers[p].socks[k];
                if (s->fd >= 0 && !s->tx_broken && !s->eof) {
                    send_abort(s, &a, deadline);
                    break;
                }
            }
        }
    }
    return hvd_tp_failure_error(&tp->failure);
}

static hvd_status sock_recv(tsock *s);
static int scan_for_abort(tsock *s);

/*
 * A connection to s's peer broke. Before blaming that peer, read what the
 * other connections hold: a rank that failed first may have sent an ABORT
 * with the real cause (it then exited, which is why this connection
 * broke), and that cause is what every rank should report. The ABORT may
 * wait behind data for a receive not posted yet: that data is read past
 * and dropped, since the transport fails either way.
 */
static hvd_status peer_lost(tcp *tp, tsock *s, const char *what) {
    char who[160];

    if (tp->salvaging)
        return HVD_ERR_PEER_LOST; /* noted; the first caller decides */
    tp->salvaging = 1;
    for (int i = 0; i < tp->size * tp->nconn && tp->failure.status == HVD_OK;
         i++) {
        tsock *x = &tp->socks[i];
        if (x->fd < 0 || (x->eof && x->rx_off == x->rx_end))
            continue;
        if (!x->rx_blocked)
            sock_recv(x);
        if (x->rx_blocked && tp->failure.status == HVD_OK)
            scan_for_abort(x);
    }
    /* If the peer itself failed first, its ABORT is on one of its sockets
     * and may arrive a moment after the end of another (separate
     * connections keep no order between them): give each of them a
     * little time to deliver it or close too. */
    int64_t deadline = hvd_now_ns() + ABORT_NS;
    uint32_t given_up = 0; /* sockets whose stream cannot be read on */
    while (tp->failure.status == HVD_OK && s->peer >= 0 && s->peer < tp->size) {
        struct pollfd pfds[HVD_TCP_MAX_SOCKS + 1];
        tsock *xs[HVD_TCP_MAX_SOCKS + 1];
        int n = 0;
        int64_t left = (deadline - hvd_now_ns()) / 1000000;
        for (int k = 0; k < tp->nconn; k++) {
            tsock *x = &tp->peers[s->peer].socks[k];
            if (x->fd >= 0 && !x->eof && !(given_up & (1u << k))) {
                xs[n] = x;
                pfds[n++] = (struct pollfd){.fd = x->fd, .events = POLLIN};
            }
        }
        if (n == 0 || left <= 0 || poll(pfds, (nfds_t)n, (int)left) <= 0)
            break;
        for (int k = 0; k < n && tp->failure.status == HVD_OK; k++) {
            if (pfds[k].revents == 0)
                continue;
            if (!xs[k]->rx_blocked)
                sock_recv(xs[k]);
            if (xs[k]->rx_blocked && tp->failure.status == HVD_OK &&
                !scan_for_abort(xs[k]))
                given_up |= 1u << xs[k]->index;
        }
    }
    tp->salvaging = 0;
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    describe(tp, s->peer, who, sizeof(who));
    return hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, s->peer,
                        "lost %s: %s (the process died, was killed, or exited "
                        "without hvd_shutdown)",
                        who, what);
}

/* ------------------------------------------------------------------ */
/* Progress                                                            */

static void set_events(tsock *s) {
    uint32_t want = 0;
    struct epoll_event ev;

    if (s->fd < 0 || !s->registered)
        return;
    if (s->eof && s->sendq.count == 0) {
        /* Nothing more will come: stop watching, or a reset connection
         * would report EPOLLHUP forever. */
        epoll_ctl(s->tp->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        s->registered = 0;
        return;
    }
    if (!s->eof && !s->rx_blocked)
        want |= EPOLLIN | EPOLLRDHUP;
    if (s->sendq.count > 0 && !s->tx_broken)
        want |= EPOLLOUT;
    if (want == s->events)
        return;
    ev.events = want;
    ev.data.ptr = s;
    if (epoll_ctl(s->tp->epfd, EPOLL_CTL_MOD, s->fd, &ev) == 0)
        s->events = want;
}

static void part_done(tcp *tp, tsock *s, partq *q) {
    part *p = q_at(q, 0);
    hvd_req *req = p->req;

    q_pop(q);
    if (req == NULL)
        return; /* a heartbeat */
    tp->peers[s->peer].pending--;
    if (--req->parts_left == 0)
        req->done = 1;
}

static hvd_status sock_send(tsock *s) {
    tcp *tp = s->tp;

    while (s->sendq.count > 0) {
        struct iovec iov[MAX_IOV];
        int niov = 0;

        for (size_t k = 0; k < s->sendq.count && niov + 2 <= MAX_IOV; k++) {
            part *p = q_at(&s->sendq, k);
            if (p->hdr_done < HVD_FRAME_HDR_LEN) {
                iov[niov].iov_base = p->hdr + p->hdr_done;
                iov[niov].iov_len = HVD_FRAME_HDR_LEN - p->hdr_done;
                niov++;
            }
            if (p->done < p->len) {
                iov[niov].iov_base = p->buf + p->done;
                iov[niov].iov_len = p->len - p->done;
                niov++;
            }
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            char what[128];
            snprintf(what, sizeof(what), "send() failed: %s", strerror(errno));
            return peer_lost(tp, s, what);
        }
        size_t left = (size_t)n;
        while (s->sendq.count > 0) {
            part *p = q_at(&s->sendq, 0);
            size_t h = HVD_FRAME_HDR_LEN - p->hdr_done;
            if (h > left)
                h = left;
            p->hdr_done += h;
            left -= h;
            size_t d = p->len - p->done;
            if (d > left)
                d = left;
            p->done += d;
            left -= d;
            if (p->hdr_done < HVD_FRAME_HDR_LEN || p->done < p->len)
                break;
            part_done(tp, s, &s->sendq);
        }
    }
    set_events(s);
    return HVD_OK;
}

/* Reads more bytes into the staging buffer. Returns 1 if bytes came, 0 if
 * none are there now, -1 on EOF (s->eof set) and a failure via *st. */
static int rx_fill(tsock *s, hvd_status *st) {
    if (s->rx_off > 0) {
        memmove(s->rx, s->rx + s->rx_off, s->rx_end - s->rx_off);
        s->rx_end -= s->rx_off;
        s->rx_off = 0;
    }
    for (;;) {
        ssize_t n =
            recv(s->fd, s->rx + s->rx_end, RX_CAP - s->rx_end, MSG_DONTWAIT);
        if (n > 0) {
            s->rx_end += (size_t)n;
            s->tp->peers[s->peer].last_active = hvd_now_ns();
            return 1;
        }
        if (n == 0) {
            s->eof = 1;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        char what[128];
        snprintf(what, sizeof(what), "recv() failed: %s", strerror(errno));
        *st = peer_lost(s->tp, s, what);
        return -2;
    }
}

static hvd_status on_eof(tsock *s) {
    tcp *tp = s->tp;

    s->eof = 1;
    set_events(s);
    if (s->bye_rx && s->recvq.count == 0 && s->rx_off == s->rx_end)
        return HVD_OK;
    if (tp->shutting_down && s->recvq.count == 0)
        return HVD_OK;
    if (s->bye_rx) {
        char who[160];
        describe(tp, s->peer, who, sizeof(who));
        return hvd_tp_failf(
            fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, s->peer,
            "%s called hvd_shutdown while this rank still expected "
            "data from it: ranks did not run the same collectives",
            who);
    }
    return peer_lost(tp, s, "its connection closed unexpectedly");
}

static hvd_status on_abort(tsock *s, const uint8_t *payload, size_t len) {
    hvd_frame_abort a;

    if (hvd_frame_abort_decode(payload, len, &a) != HVD_OK)
        return hvd_tp_failf(fail_with, s->tp, s->tp->rank, HVD_ERR_TRANSPORT,
                            s->peer, "rank %d: %s", s->peer, hvd_error_get());
    return fail_with(s->tp, a.status, a.culprit, a.origin, a.text);
}

/*
 * Only while failing (peer_lost): reads the frames that wait on a socket
 * behind data nobody has asked for yet, dropping that data, and acts on an
 * ABORT found there. Bounded by what the kernel holds now (no waiting) and
 * by a number of frames. Returns 0 if the stream cannot be read on (a
 * malformed frame), else 1.
 */
static int scan_for_abort(tsock *s) {
    tcp *tp = s->tp;
    hvd_status st = HVD_OK;

    for (int n = 0; n < 100000 && tp->failure.status == HVD_OK; n++) {
        size_t avail = s->rx_end - s->rx_off;
        hvd_frame f;

        if (s->scan_drop > 0 && avail > 0) {
            size_t k = s->scan_drop < avail ? (size_t)s->scan_drop : avail;
            s->rx_off += k;
            s->scan_drop -= k;
            continue;
        }
        if (s->scan_drop > 0 || avail < HVD_FRAME_HDR_LEN) {
            if (s->eof || rx_fill(s, &st) <= 0)
                return 1;
            continue;
        }
        if (hvd_frame_decode(s->rx + s->rx_off, avail, s->rx_seq, &f) != HVD_OK)
            return 0;
        if (f.type == HVD_FRAME_ABORT) {
            if (avail < HVD_FRAME_HDR_LEN + f.len) {
                if (s->eof || rx_fill(s, &st) <= 0)
                    return 1;
                continue;
            }
            on_abort(s, s->rx + s->rx_off + HVD_FRAME_HDR_LEN, (size_t)f.len);
            return 1;
        }
        s->rx_off += HVD_FRAME_HDR_LEN;
        s->rx_seq++;
        s->scan_drop = f.type == HVD_FRAME_DATA ? f.len : 0;
    }
    return 1;
}

static hvd_status sock_recv(tsock *s) {
    tcp *tp = s->tp;
    hvd_status st = HVD_OK;

    for (;;) {
        if (!s->in_frame) {
            size_t avail = s->rx_end - s->rx_off;
            hvd_frame f;

            if (avail < HVD_FRAME_HDR_LEN) {
                int r = s->eof ? -1 : rx_fill(s, &st);
                if (r == 0)
                    break;
                if (r == -1)
                    return on_eof(s);
                if (r < 0)
                    return st;
                continue;
            }
            if (hvd_frame_decode(s->rx + s->rx_off, avail, s->rx_seq, &f) !=
                HVD_OK) {
                char who[160];
                describe(tp, s->peer, who, sizeof(who));
                return hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_TRANSPORT,
                                    s->peer, "protocol error from %s: %s", who,
                                    hvd_error_get());
            }
            if (f.type == HVD_FRAME_BYE || f.type == HVD_FRAME_HEARTBEAT) {
                s->rx_off += HVD_FRAME_HDR_LEN;
                s->rx_seq++;
                if (f.type == HVD_FRAME_BYE)
                    s->bye_rx = 1;
                continue;
            }
            if (f.type == HVD_FRAME_ABORT) {
                if (avail < HVD_FRAME_HDR_LEN + f.len) {
                    int r = s->eof ? -1 : rx_fill(s, &st);
                    if (r == 0)
                        break;
                    if (r == -1)
                        return on_eof(s);
                    if (r < 0)
                        return st;
                    continue;
                }
                return on_abort(s, s->rx + s->rx_off + HVD_FRAME_HDR_LEN,
                                (size_t)f.len);
            }
            if (s->recvq.count == 0) {
                /* Data for a receive not posted yet: leave it in the
                 * staging buffer (and the kernel) until irecv. */
                s->rx_blocked = 1;
                break;
            }
            part *p = q_at(&s->recvq, 0);
            if (f.msg_len != p->msg_len || f.len != p->len) {
                char who[160];
                describe(tp, s->peer, who, sizeof(who));
                return hvd_tp_failf(
                    fail_with, tp, tp->rank, HVD_ERR_MISMATCH, s->peer,
                    "%s sent a message of %llu bytes where this "
                    "rank expected %llu: ranks called collectives "
                    "in different orders or with different counts",
                    who, (unsigned long long)f.msg_len,
                    (unsigned long long)p->msg_len);
            }
            s->rx_off += HVD_FRAME_HDR_LEN;
            s->rx_seq++;
            s->in_frame = 1;
        }

        part *p = q_at(&s->recvq, 0);
        size_t avail = s->rx_end - s->rx_off;
        size_t need = p->len - p->done;
        size_t k = avail < need ? avail : need;
        if (k > 0) {
            memcpy(p->buf + p->done, s->rx + s->rx_off, k);
            p->done += k;
            s->rx_off += k;
            need -= k;
        }
        if (need == 0) {
            s->in_frame = 0;
            part_done(tp, s, &s->recvq);
            continue;
        }
        if (s->eof)
            return on_eof(s);
        if (need >= RX_CAP / 2) {
            ssize_t n = recv(s->fd, p->buf + p->done, need, MSG_DONTWAIT);
            if (n > 0) {
                p->done += (size_t)n;
                tp->peers[s->peer].last_active = hvd_now_ns();
                continue;
            }
            if (n == 0)
                return on_eof(s);
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            char what[128];
            snprintf(what, sizeof(what), "recv() failed: %s", strerror(errno));
            return peer_lost(tp, s, what);
        }
        int r = rx_fill(s, &st);
        if (r == 0)
            break;
        if (r == -1)
            return on_eof(s);
        if (r < 0)
            return st;
    }
    set_events(s);
    return HVD_OK;
}

/* Queues a heartbeat on every idle socket: peers waiting on this rank
 * learn that it is alive, even while it waits on someone else. */
static void send_heartbeats(tcp *tp) {
    for (int i = 0; i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        part *p;

        if (s->fd < 0 || s->eof || s->tx_broken || s->sendq.count > 0 ||
            q_reserve(&s->sendq, 1) != 0)
            continue;
        hvd_frame f = {.type = HVD_FRAME_HEARTBEAT, .seq = s->tx_seq++};
        p = q_push(&s->sendq);
        memset(p, 0, sizeof(*p));
        hvd_frame_encode(&f, p->hdr);
        if (sock_send(s) != HVD_OK)
            return;
    }
}

/*
 * A peer is stalled when this rank waits on it (a request in flight) and
 * nothing has arrived from it for the timeout. Ranks that wait send
 * heartbeats, so a peer that is alive but itself waiting on a third rank
 * is not blamed: only the rank that stopped is.
 */
static hvd_status check_stalls(tcp *tp, int64_t now) {
    int waiting = 0;

    if (now - tp->last_check < TIMEOUT_CHECK_NS)
        return HVD_OK;
    tp->last_check = now;
    for (int p = 0; p < tp->size; p++)
        waiting |= tp->peers[p].pending > 0;
    if (waiting && now - tp->last_heartbeat >= tp->heartbeat_ns) {
        tp->last_heartbeat = now;
        send_heartbeats(tp);
        if (tp->failure.status != HVD_OK)
            return tp->failure.status;
    }
    for (int p = 0; p < tp->size; p++) {
        tpeer *peer = &tp->peers[p];
        if (peer->pending > 0 && now - peer->last_active > tp->timeout_ns) {
            char who[160];
            describe(tp, p, who, sizeof(who));
            return hvd_tp_fail_stalled(fail_with, tp, tp->rank, p, who,
                                       tp->timeout_ns);
        }
    }
    return HVD_OK;
}

static hvd_status tcp_progress(hvd_transport *t, int timeout_ms) {
    tcp *tp = (tcp *)t;
    struct epoll_event evs[MAX_EVENTS];
    int n;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    n = epoll_wait(tp->epfd, evs, MAX_EVENTS, timeout_ms);
    if (n < 0 && errno != EINTR)
        return hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                            "epoll_wait() failed: %s", strerror(errno));
    for (int i = 0; i < n && tp->failure.status == HVD_OK; i++) {
        tsock *s = evs[i].data.ptr;
        uint32_t e = evs[i].events;

        if (s == NULL) { /* tcp_wake */
            uint64_t count;
            ssize_t ignored = read(tp->wakefd, &count, sizeof(count));
            (void)ignored;
            continue;
        }
        if ((e & EPOLLOUT) && sock_send(s) != HVD_OK)
            break;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            if (s->rx_blocked && (e & (EPOLLHUP | EPOLLERR))) {
                /* The peer is gone while its data waits for us. */
                if (tp->shutting_down) {
                    s->eof = 1;
                    set_events(s);
                    continue;
                }
                peer_lost(tp, s, "its connection broke");
                break;
            }
            if (!s->rx_blocked && sock_recv(s) != HVD_OK)
                break;
        }
    }
    if (tp->failure.status == HVD_OK)
        check_stalls(tp, hvd_now_ns());
    return tp->failure.status == HVD_OK ? HVD_OK
                                        : hvd_tp_failure_error(&tp->failure);
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */

static hvd_status check_peer(tcp *tp, int peer, const char *what) {
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (peer < 0 || peer >= tp->size || peer == tp->rank)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "tcp %s to rank %d: not a peer of rank %d in a "
                             "job of %d",
                             what, peer, tp->rank, tp->size);
    if (tp->peers[peer].socks[0].bye_rx) {
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

/* Socket of part i of a message laid out from first on channel. */
static tsock *part_sock(tcp *tp, tpeer *pr, int channel, int first, int i) {
    if (channel == HVD_CHANNEL_CONTROL)
        return &pr->socks[tp->nsocks];
    return &pr->socks[(first + i) % tp->nsocks];
}

static hvd_status post(tcp *tp, int peer, int channel, uint8_t *buf, size_t len,
                       hvd_req *req, int send) {
    tpeer *pr = &tp->peers[peer];
    uint64_t msgno = send ? pr->tx_msgs : pr->rx_msgs;
    int first = 0, nparts = 1;

    /* Control messages go whole onto the control socket, so that they
     * never wait behind data (or data behind them). */
    if (channel == HVD_CHANNEL_DATA)
        hvd_tcp_layout(len, tp->nsocks, tp->stripe_min, msgno, &first, &nparts);
    for (int i = 0; i < nparts; i++) {
        tsock *s = part_sock(tp, pr, channel, first, i);
        if (q_reserve(send ? &s->sendq : &s->recvq, 1) != 0)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory queueing a message for "
                                 "rank %d",
                                 peer);
    }
    if (channel == HVD_CHANNEL_DATA && send)
        pr->tx_msgs++;
    else if (channel == HVD_CHANNEL_DATA)
        pr->rx_msgs++;
    req->done = 0;
    req->status = HVD_OK;
    req->peer = peer;
    req->len = len;
    req->parts_left = nparts;
    if (pr->pending == 0)
        pr->last_active = hvd_now_ns();
    pr->pending += nparts;

    for (int i = 0; i < nparts; i++) {
        tsock *s = part_sock(tp, pr, channel, first, i);
        size_t off, plen;
        part *p;

        hvd_tcp_part_range(len, nparts, i, &off, &plen);
        p = q_push(send ? &s->sendq : &s->recvq);
        p->req = req;
        p->buf = buf + off;
        p->len = plen;
        p->done = 0;
        p->msg_len = len;
        p->hdr_done = 0;
        if (send) {
            hvd_frame f = {.type = HVD_FRAME_DATA,
                           .seq = s->tx_seq++,
                           .msg_len = len,
                           .len = plen};
            hvd_frame_encode(&f, p->hdr);
        }
    }
    /* Start at once: a send goes out without waiting for progress, and a
     * receive whose data is already staged completes here. */
    for (int i = 0; i < nparts; i++) {
        tsock *s = part_sock(tp, pr, channel, first, i);
        hvd_status st = HVD_OK;
        if (send && s->sendq.count == 1)
            st = sock_send(s);
        else if (!send && s->rx_blocked) {
            s->rx_blocked = 0;
            st = sock_recv(s);
        }
        if (st != HVD_OK)
            return HVD_OK; /* the request completed with the failure */
    }
    return HVD_OK;
}

static hvd_status tcp_isend(hvd_transport *t, int peer, int channel,
                            const void *buf, size_t len, hvd_req *req) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "send");

    if (st != HVD_OK)
        return st;
    return post(tp, peer, channel, (uint8_t *)(uintptr_t)buf, len, req, 1);
}

static hvd_status tcp_irecv(hvd_transport *t, int peer, int channel, void *buf,
                            size_t len, hvd_req *req) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "receive");

    if (st != HVD_OK)
        return st;
    return post(tp, peer, channel, buf, len, req, 0);
}

/* Makes a progress call waiting in another thread return. */
static void tcp_wake(hvd_transport *t) {
    tcp *tp = (tcp *)t;
    uint64_t one = 1;

    if (tp->wakefd >= 0) {
        ssize_t ignored = write(tp->wakefd, &one, sizeof(one));
        (void)ignored;
    }
}

/* ------------------------------------------------------------------ */
/* Connection setup                                                    */

typedef struct listen_blob {
    char addr[HVD_ADDR_MAX];
    uint32_t port;
    uint32_t nsocks;
} listen_blob;

static hvd_hs_code admit(void *ctx, int kind, int rank, int index, char *why,
                         size_t whylen) {
    tcp *tp = ctx;

    if (kind != HVD_HS_KIND_DATA) {
        snprintf(why, whylen, "not a data connection (kind %d)", kind);
        return HVD_HS_UNEXPECTED;
    }
    if (rank <= tp->rank || rank >= tp->size || index >= tp->nconn) {
        snprintf(why, whylen,
                 "rank %d socket %d is not expected to connect to rank %d "
                 "(job of %d, %d sockets per peer)",
                 rank, index, tp->rank, tp->size, tp->nconn);
        return HVD_HS_UNEXPECTED;
    }
    if (tp->peers[rank].socks[index].fd >= 0) {
        snprintf(why, whylen, "rank %d socket %d is already connected", rank,
                 index);
        return HVD_HS_UNEXPECTED;
    }
    return HVD_HS_OK;
}

static hvd_status client_start(tcp *tp, pending_conn *c,
                               const hvd_transport_params *params) {
    hvd_status st = hvd_net_connect_start(tp->peers[c->peer].addr,
                                          tp->peers[c->peer].port, &c->fd);
    if (st != HVD_OK)
        return st;
    c->connected = 0;
    return hvd_hs_client_init(&c->hs, params->job_id, params->secret,
                              HVD_HS_KIND_DATA, tp->rank, c->index, c->peer);
}

static void install(tcp *tp, int peer, int index, int fd) {
    tsock *s = &tp->peers[peer].socks[index];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = s};

    s->fd = fd;
    hvd_net_nodelay(fd);
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
        s->events = ev.events;
        s->registered = 1;
    }
}

/*
 * Builds the mesh: connects to every lower rank and accepts every higher
 * one, all at once in one poll loop, so no rank waits on another's setup.
 */
static hvd_status connect_mesh(tcp *tp, const hvd_transport_params *params,
                               int lfd) {
    int nclients = tp->rank * tp->nconn;
    int nexpect = (tp->size - 1 - tp->rank) * tp->nconn;
    int maxconn = nclients + nexpect + 16;
    pending_conn *conns = calloc((size_t)maxconn, sizeof(*conns));
    struct pollfd *pfds = calloc((size_t)maxconn + 1, sizeof(*pfds));
    int nconn = 0, connected = 0;
    int64_t deadline = hvd_now_ns() + params->connect_timeout_ns;
    hvd_status st = HVD_OK;

    if (conns == NULL || pfds == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory connecting");
        goto out;
    }
    for (int p = 0; p < tp->rank; p++) {
        for (int k = 0; k < tp->nconn; k++) {
            pending_conn *c = &conns[nconn++];
            c->peer = p;
            c->index = k;
            c->client = 1;
            c->deadline = deadline;
            snprintf(c->name, sizeof(c->name), "%s:%d", tp->peers[p].addr,
                     tp->peers[p].port);
            st = client_start(tp, c, params);
            if (st != HVD_OK)
                goto out;
        }
    }

    while (connected < nclients + nexpect) {
        int64_t now = hvd_now_ns();
        int npfd = 0;

        if (now > deadline) {
            for (int i = 0; i < nconn; i++) {
                if (conns[i].client && conns[i].fd != -2) {
                    char who[160];
                    describe(tp, conns[i].peer, who, sizeof(who));
                    st = hvd_error_set(HVD_ERR_TIMEOUT,
                                       "could not connect to %s at %s "
                                       "within the start timeout",
                                       who, conns[i].name);
                    goto out;
                }
            }
            st = hvd_error_set(HVD_ERR_TIMEOUT,
                               "rank %d: %d of %d higher ranks' connections "
                               "did not arrive within the start timeout",
                               tp->rank, nclients + nexpect - connected,
                               nexpect);
            goto out;
        }
        pfds[npfd++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < nconn; i++) {
            pending_conn *c = &conns[i];
            short ev = POLLIN;
            if (c->fd < 0)
                continue;
            if (c->client && !c->connected)
                ev = POLLOUT;
            else if (c->hs.out_off < c->hs.out_len)
                ev = POLLOUT;
            pfds[npfd++] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        int r = poll(pfds, (nfds_t)npfd, 100);
        if (r < 0 && errno != EINTR) {
            st = hvd_error_set(HVD_ERR_TRANSPORT, "poll() failed: %s",
                               strerror(errno));
            goto out;
        }
        now = hvd_now_ns();

        /* New connections from higher ranks (or from strangers). */
        for (;;) {
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0)
                break;
            pending_conn *c = NULL;
            for (int i = 0; i < nconn; i++)
                if (conns[i].fd == -1 && !conns[i].client)
                    c = &conns[i];
            if (c == NULL && nconn < maxconn)
                c = &conns[nconn++];
            if (c == NULL) {
                /* Full of strangers (the table has room for every
                 * expected connection and 16 more): drop the one that has
                 * waited longest, so that strangers that connect and stay
                 * silent cannot keep a rank out. */
                for (int i = 0; i < nconn; i++)
                    if (!conns[i].client && conns[i].fd >= 0 &&
                        (c == NULL || conns[i].deadline < c->deadline))
                        c = &conns[i];
                if (c == NULL) {
                    char name[HVD_ADDR_MAX];
                    hvd_net_peer_name(fd, name, sizeof(name));
                    HVD_WARN("tcp",
                             "dropped connection from %s: too many "
                             "unauthenticated connections",
                             name);
                    close(fd);
                    continue;
                }
                HVD_WARN("tcp",
                         "dropped connection from %s: too many connections "
                         "that have not authenticated, and it waited "
                         "longest",
                         c->name);
                close(c->fd);
            }
            memset(c, 0, sizeof(*c));
            c->fd = fd;
            c->peer = -1;
            c->deadline = now + HANDSHAKE_NS;
            hvd_net_peer_name(fd, c->name, sizeof(c->name));
            hvd_hs_server_init(&c->hs, params->job_id, params->secret,
                               HVD_HS_KIND_DATA, tp->rank, admit, tp);
        }

        for (int i = 0; i < nconn; i++) {
            pending_conn *c = &conns[i];
            short want = 0;

            if (c->client && c->fd == -1 && now >= c->retry_at) {
                st = client_start(tp, c, params);
                if (st != HVD_OK)
                    goto out;
            }
            if (c->fd < 0)
                continue;
            if (c->client && !c->connected) {
                struct pollfd q = {.fd = c->fd, .events = POLLOUT};
                if (poll(&q, 1, 0) <= 0)
                    continue;
                int err = hvd_net_connect_result(c->fd);
                if (err == ECONNREFUSED || err == ECONNRESET ||
                    err == ETIMEDOUT) {
                    /* The peer's listener is up before the address
                     * exchange, so this is rare (backlog overflow); retry
                     * a little later. */
                    close(c->fd);
                    c->fd = -1;
                    c->retry_at = now + 50 * 1000000LL;
                    continue;
                }
                if (err != 0) {
                    char who[160];
                    describe(tp, c->peer, who, sizeof(who));
                    st = hvd_error_set(HVD_ERR_TRANSPORT,
                                       "connect(%s) to %s failed: %s", c->name,
                                       who, strerror(err));
                    goto out;
                }
                c->connected = 1;
            }
            st = hvd_hs_io(&c->hs, c->fd, &want);
            if (st == HVD_OK && want == 0) {
                int peer = c->client ? c->peer : c->hs.peer_rank;
                int index = c->client ? c->index : c->hs.peer_index;
                if (tp->peers[peer].socks[index].fd >= 0) {
                    HVD_WARN("tcp",
                             "dropped a second connection from %s claiming "
                             "rank %d socket %d",
                             c->name, peer, index);
                    close(c->fd);
                } else {
                    install(tp, peer, index, c->fd);
                    connected++;
                }
                c->fd = c->client ? -2 : -1;
                continue;
            }
            if (st == HVD_OK && now > c->deadline && !c->client)
                st = hvd_error_set(HVD_ERR_TIMEOUT, "handshake timed out");
            if (st == HVD_OK)
                continue;
            if (c->client && st == HVD_ERR_PEER_LOST && now < c->deadline) {
                /* Dropped unanswered: the peer had too many strangers at
                 * once. Try again a little later. */
                HVD_DEBUG("tcp", "connecting to %s: %s; trying again", c->name,
                          c->hs.err);
                close(c->fd);
                c->fd = -1;
                c->retry_at = now + 50 * 1000000LL;
                st = HVD_OK;
                continue;
            }
            if (c->client) {
                char who[160];
                describe(tp, c->peer, who, sizeof(who));
                st = hvd_error_set(st, "connecting to %s at %s: %s", who,
                                   c->name,
                                   c->hs.err[0] ? c->hs.err : hvd_error_get());
                goto out;
            }
            /* A stranger, a neighbour job or a wrong secret: refuse, log,
             * and carry on. */
            HVD_WARN("tcp", "refused connection from %s claiming rank %d: %s",
                     c->name, c->hs.peer_rank,
                     c->hs.err[0] ? c->hs.err : hvd_error_get());
            close(c->fd);
            c->fd = -1;
            st = HVD_OK;
        }
    }
out:
    for (int i = 0; conns != NULL && i < nconn; i++) {
        if (conns[i].fd < 0)
            continue;
        if (!conns[i].client && st == HVD_OK)
            HVD_WARN("tcp",
                     "dropped connection from %s: the mesh is complete and "
                     "it had not authenticated",
                     conns[i].name);
        close(conns[i].fd);
    }
    free(conns);
    free(pfds);
    return st;
}

static void tcp_close(hvd_transport *t) {
    tcp *tp = (tcp *)t;

    if (tp == NULL)
        return;
    for (int i = 0; tp->socks != NULL && i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        if (s->fd >= 0)
            close(s->fd);
        free(s->sendq.v);
        free(s->recvq.v);
        free(s->rx);
    }
    if (tp->epfd >= 0)
        close(tp->epfd);
    if (tp->wakefd >= 0)
        close(tp->wakefd);
    free(tp->socks);
    free(tp->peers);
    free(tp->hosts);
    free(tp->pids);
    free(tp);
}

static hvd_status tcp_probe(const hvd_transport_params *params,
                            hvd_caps *caps) {
    (void)params;
    memset(caps, 0, sizeof(*caps));
    caps->usable = 1;
    /* Between any ranks; after RDMA and shared memory where they serve. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 10;
    return HVD_OK;
}

/* A transport with its peers, sockets and epoll set, not connected yet. */
static hvd_status tcp_new(const hvd_transport_params *params,
                          const hvd_tcp_settings *set, tcp **out) {
    tcp *tp = calloc(1, sizeof(*tp));
    hvd_status st;

    if (tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->base.ops = &hvd_tcp_ops;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->nsocks = set->nsocks;
    tp->nconn = tp->nsocks + 1;
    tp->wakefd = -1;
    tp->stripe_min = set->stripe_min;
    tp->timeout_ns = params->timeout_ns;
    /* Four heartbeats per timeout, at most one a second. */
    tp->heartbeat_ns =
        tp->timeout_ns / 4 < HEARTBEAT_NS ? tp->timeout_ns / 4 : HEARTBEAT_NS;
    tp->epfd = -1;
    tp->peers = calloc((size_t)tp->size, sizeof(*tp->peers));
    tp->socks =
        calloc((size_t)tp->size * (size_t)tp->nconn, sizeof(*tp->socks));
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
    if (tp->peers == NULL || tp->socks == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int p = 0; p < tp->size; p++) {
        tp->peers[p].socks = &tp->socks[(size_t)p * (size_t)tp->nconn];
        for (int k = 0; k < tp->nconn; k++) {
            tsock *s = &tp->peers[p].socks[k];
            s->tp = tp;
            s->fd = -1;
            s->peer = p;
            s->index = k;
            if (p != tp->rank && (s->rx = malloc(RX_CAP)) == NULL) {
                st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
                goto fail;
            }
        }
    }
    tp->epfd = epoll_create1(EPOLL_CLOEXEC);
    tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->epfd < 0 || tp->wakefd < 0) {
        st = hvd_error_set(HVD_ERR_TRANSPORT,
                           "epoll_create1/eventfd failed: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event wev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wakefd, &wev) != 0) {
        st = hvd_error_set(HVD_ERR_TRANSPORT, "epoll_ctl(eventfd) failed: %s",
                           strerror(errno));
        goto fail;
    }
    *out = tp;
    return HVD_OK;
fail:
    tcp_close(&tp->base);
    return st;
}

hvd_status hvd_tcp_open_connected(const hvd_transport_params *params,
                                  const int *fds, hvd_transport **out) {
    hvd_tcp_settings set;
    tcp *tp = NULL;
    hvd_status st = hvd_transport_read_settings(&hvd_tcp_ops, params, &set);

    if (st == HVD_OK)
        st = tcp_new(params, &set, &tp);
    if (st != HVD_OK)
        return st;
    for (int p = 0; p < tp->size; p++) {
        for (int k = 0; k < tp->nconn && p != tp->rank; k++) {
            int fd = fds[p * tp->nconn + k];
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
                st = hvd_error_set(HVD_ERR_TRANSPORT,
                                   "fcntl(O_NONBLOCK) of socket %d of rank "
                                   "%d failed: %s",
                                   k, p, strerror(errno));
                tcp_close(&tp->base);
                return st;
            }
            install(tp, p, k, fd);
        }
    }
    *out = &tp->base;
    return HVD_OK;
}

/*
 * Where this rank listens: HVD_IFACE's address when set; else where the
 * launcher reached it; else loopback when every rank is on this host; else
 * this host's first routable address.
 */
static hvd_status bind_addr(const hvd_transport_params *params,
                            const hvd_tcp_settings *set, char *out,
                            size_t outlen) {
    int one_host = 1;

    if (set->iface[0] != '\0')
        return hvd_net_iface_addr(set->iface, out, outlen);
    if (params->launcher_addr != NULL && params->launcher_addr[0] != '\0') {
        snprintf(out, outlen, "%s", params->launcher_addr);
        return HVD_OK;
    }
    for (int i = 0; params->hosts != NULL && i < params->size; i++)
        one_host &= strcmp(params->hosts[i], params->hosts[0]) == 0;
    if (one_host) {
        snprintf(out, outlen, "127.0.0.1");
        return HVD_OK;
    }
    return hvd_net_host_addr(out, outlen);
}

/* Reads the settings, and opens the mesh under the bound they set. */
static hvd_status tcp_open_mesh(const hvd_transport_params *params,
                                const hvd_tcp_settings *set,
                                hvd_transport **out);

static hvd_status tcp_open(const hvd_transport_params *params,
                           hvd_transport **out) {
    hvd_tcp_settings set;
    hvd_transport_params p = *params;
    hvd_status st = hvd_transport_read_settings(&hvd_tcp_ops, params, &set);
    int bounded = params->may_fall_back && set.setup_ns < p.connect_timeout_ns;

    if (st != HVD_OK)
        return st;
    /* Another transport can take over: do not keep every rank waiting the
     * whole start timeout for a mesh that cannot form. */
    if (bounded)
        p.connect_timeout_ns = set.setup_ns;
    st = tcp_open_mesh(&p, &set, out);
    if (st != HVD_OK && bounded) {
        char why[HVD_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", hvd_error_get());
        st = hvd_error_set(st, "%s; the limit is HVD_TCP_SETUP_SECONDS=%lld",
                           why, (long long)(set.setup_ns / 1000000000LL));
    }
    return st;
}

static hvd_status tcp_open_mesh(const hvd_transport_params *params,
                                const hvd_tcp_settings *set,
                                hvd_transport **out) {
    listen_blob mine, *all = NULL;
    char addr[HVD_ADDR_MAX];
    int lfd = -1, port = 0;
    tcp *tp = NULL;
    hvd_status st = bind_addr(params, set, addr, sizeof(addr));

    if (st == HVD_OK)
        st = tcp_new(params, set, &tp);
    if (st != HVD_OK)
        return st;
    st = hvd_net_listen(addr, 0, &lfd, &port);
    if (st != HVD_OK)
        goto fail;
    HVD_DEBUG("tcp", "listening on %s port %d", addr, port);
    memset(&mine, 0, sizeof(mine));
    snprintf(mine.addr, sizeof(mine.addr), "%s", addr);
    mine.port = (uint32_t)port;
    mine.nsocks = (uint32_t)tp->nsocks;
    all = calloc((size_t)tp->size, sizeof(*all));
    if (all == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    st = params->bootstrap->allgather(params->bootstrap, &mine, sizeof(mine),
                                      all);
    if (st != HVD_OK)
        goto fail;
    for (int p = 0; p < tp->size; p++) {
        if (all[p].nsocks != (uint32_t)tp->nsocks) {
            st = hvd_error_set(HVD_ERR_MISMATCH,
                               "rank %d uses %u sockets per peer and rank %d "
                               "uses %d: set HVD_TCP_NSOCKS the same on every "
                               "rank",
                               p, all[p].nsocks, tp->rank, tp->nsocks);
            goto fail;
        }
        all[p].addr[HVD_ADDR_MAX - 1] = '\0';
        memcpy(tp->peers[p].addr, all[p].addr, HVD_ADDR_MAX);
        tp->peers[p].port = (int)all[p].port;
    }
    st = connect_mesh(tp, params, lfd);
    if (st != HVD_OK)
        goto fail;
    close(lfd);
    free(all);
    HVD_DEBUG("tcp", "connected to %d peers with %d sockets each", tp->size - 1,
              tp->nsocks);
    *out = &tp->base;
    return HVD_OK;
fail:
    if (lfd >= 0)
        close(lfd);
    free(all);
    tcp_close(&tp->base);
    return st;
}

/* ------------------------------------------------------------------ */
/* Goodbye                                                             */

static hvd_status tcp_shutdown(hvd_transport *t) {
    tcp *tp = (tcp *)t;
    int64_t deadline =
        hvd_now_ns() +
        (tp->timeout_ns < SHUTDOWN_NS ? tp->timeout_ns : SHUTDOWN_NS);
    int open_socks = 0;

    if (tp->failure.status != HVD_OK)
        return HVD_OK;
    tp->shutting_down = 1;
    for (int i = 0; i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        uint8_t hdr[HVD_FRAME_HDR_LEN];
        hvd_frame f = {.type = HVD_FRAME_BYE, .seq = s->tx_seq};
        size_t off = 0;

        if (s->fd < 0)
            continue;
        hvd_frame_encode(&f, hdr);
        while (off < sizeof(hdr) && hvd_now_ns() < deadline) {
            ssize_t n = send(s->fd, hdr + off, sizeof(hdr) - off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                off += (size_t)n;
            } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                struct pollfd pfd = {.fd = s->fd, .events = POLLOUT};
                poll(&pfd, 1, 100);
            } else {
                break; /* the peer is already gone */
            }
        }
        s->tx_seq++;
        shutdown(s->fd, SHUT_WR);
        if (!s->eof)
            open_socks++;
    }
    /* Read until every peer has said goodbye too, so no unread byte makes
     * the kernel reset a connection whose last data is still in flight. */
    while (open_socks > 0 && hvd_now_ns() < deadline) {
        struct epoll_event evs[MAX_EVENTS];
        int n = epoll_wait(tp->epfd, evs, MAX_EVENTS, 100);
        for (int i = 0; i < n; i++) {
            tsock *s = evs[i].data.ptr;
            if (s == NULL || s->eof)
                continue;
            if (s->rx_blocked) {
                s->rx_off = s->rx_end; /* data nobody asked for */
                s->rx_blocked = 0;
            }
            sock_recv(s);
            if (s->eof || tp->failure.status != HVD_OK) {
                s->eof = 1;
                set_events(s);
                open_socks--;
            }
        }
        if (tp->failure.status != HVD_OK)
            break;
    }
    if (open_socks > 0)
        HVD_DEBUG("tcp", "%d sockets did not say goodbye in time", open_socks);
    return HVD_OK;
}

const hvd_transport_ops hvd_tcp_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "tcp",
    .title = "TCP",
    .settings = hvd_tcp_settings_table,
    .nsettings = HVD_TCP_NSETTINGS,
    .settings_size = sizeof(hvd_tcp_settings),
    .probe = tcp_probe,
    .open = tcp_open,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .progress = tcp_progress,
    .wake = tcp_wake,
    .shutdown = tcp_shutdown,
    .close = tcp_close,
};
