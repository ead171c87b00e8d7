#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

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
/* Failure                                                             */

void hvd_tcp_describe(const tcp *tp, int peer, char *out, size_t outlen) {
    int known =
        peer >= 0 && peer < tp->size && tp->hosts != NULL && tp->pids != NULL;

    hvd_tp_describe(out, outlen, peer, tp->size, known ? tp->hosts[peer] : NULL,
                    known ? tp->pids[peer] : -1);
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
hvd_status hvd_tcp_fail_with(void *arg, hvd_status status, int culprit,
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

/*
 * A connection to s's peer broke. Before blaming that peer, read what the
 * other connections hold: a rank that failed first may have sent an ABORT
 * with the real cause (it then exited, which is why this connection
 * broke), and that cause is what every rank should report. The ABORT may
 * wait behind data for a receive not posted yet: that data is read past
 * and dropped, since the transport fails either way.
 */
hvd_status hvd_tcp_peer_lost(tcp *tp, tsock *s, const char *what) {
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
            hvd_tcp_sock_recv(x);
        if (x->rx_blocked && tp->failure.status == HVD_OK)
            hvd_tcp_scan_for_abort(x);
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
                hvd_tcp_sock_recv(xs[k]);
            if (xs[k]->rx_blocked && tp->failure.status == HVD_OK &&
                !hvd_tcp_scan_for_abort(xs[k]))
                given_up |= 1u << xs[k]->index;
        }
    }
    tp->salvaging = 0;
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    hvd_tcp_describe(tp, s->peer, who, sizeof(who));
    return hvd_tp_failf(hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST,
                        s->peer,
                        "lost %s: %s (the process died, was killed, or exited "
                        "without hvd_shutdown)",
                        who, what);
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
        hvd_tcp_describe(tp, peer, who, sizeof(who));
        return hvd_tp_failf(
            hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, peer,
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

/* Queues a send (send = 1) or a receive of len bytes on the peer's
 * sockets. start: a send goes out at once, without waiting for progress,
 * and a receive whose data is already staged completes here; 0 leaves the
 * sending to the caller (tcp_isendv). */
static hvd_status post(tcp *tp, int peer, int channel, uint8_t *buf, size_t len,
                       hvd_req *req, int send, int start) {
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
    for (int i = 0; i < nparts && start; i++) {
        tsock *s = part_sock(tp, pr, channel, first, i);
        hvd_status st = HVD_OK;
        if (send && s->sendq.count == 1)
            st = hvd_tcp_sock_send(s);
        else if (!send && s->rx_blocked) {
            s->rx_blocked = 0;
            st = hvd_tcp_sock_recv(s);
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
    return post(tp, peer, channel, (uint8_t *)(uintptr_t)buf, len, req, 1, 1);
}

/* Queues every message, then writes each socket that had nothing queued
 * before: a control message's frame and the rest of its body leave in one
 * sendmsg, so the peer gets them in one segment. */
static hvd_status tcp_isendv(hvd_transport *t, int peer, int channel,
                             const hvd_sendv *msgs, int n, hvd_req *reqs) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "send");
    size_t before[HVD_TCP_MAX_SOCKS + 1];
    tpeer *pr;

    if (st != HVD_OK)
        return st;
    pr = &tp->peers[peer];
    for (int i = 0; i < tp->nconn; i++)
        before[i] = pr->socks[i].sendq.count;
    for (int k = 0; k < n && st == HVD_OK; k++)
        st = post(tp, peer, channel, (uint8_t *)(uintptr_t)msgs[k].buf,
                  msgs[k].len, &reqs[k], 1, 0);
    for (int i = 0; i < tp->nconn; i++) {
        tsock *s = &pr->socks[i];
        if (before[i] == 0 && s->sendq.count > 0 &&
            hvd_tcp_sock_send(s) != HVD_OK)
            break; /* the requests completed with the failure */
    }
    return st;
}

static hvd_status tcp_irecv(hvd_transport *t, int peer, int channel, void *buf,
                            size_t len, hvd_req *req) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "receive");

    if (st != HVD_OK)
        return st;
    return post(tp, peer, channel, buf, len, req, 0, 1);
}

/* Makes a progress call waiting in another thread return. */
void hvd_tcp_wake(hvd_transport *t) {
    tcp *tp = (tcp *)t;
    uint64_t one = 1;

    if (tp->wakefd >= 0) {
        ssize_t ignored = write(tp->wakefd, &one, sizeof(one));
        (void)ignored;
    }
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
            hvd_tcp_sock_recv(s);
            if (s->eof || tp->failure.status != HVD_OK) {
                s->eof = 1;
                hvd_tcp_set_events(s);
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
    .probe = hvd_tcp_probe,
    .open = hvd_tcp_open,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .isendv = tcp_isendv,
    .progress = hvd_tcp_progress,
    .wake = hvd_tcp_wake,
    .shutdown = tcp_shutdown,
    .close = hvd_tcp_close,
};
