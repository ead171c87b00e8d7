/*
 * The TCP transport's sockets (see tcp_internal.h): writing a socket's
 * queued frames, reading its frames into the posted receives, an ABORT or
 * an end from the peer, and a lost peer (hvd_tcp_peer_lost, which reads
 * the other connections for the real cause before blaming it).
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"

/* The socket's call (send(), recv()) failed with errno: the peer is lost,
 * with that sentence. */
static hvd_status io_failed(tsock *s, const char *call) {
    char what[128];

    snprintf(what, sizeof(what), "%s failed: %s", call, strerror(errno));
    return hvd_tcp_peer_lost(s->tp, s, what);
}

void hvd_tcp_set_events(tsock *s) {
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

hvd_status hvd_tcp_sock_send(tsock *s) {
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
            return io_failed(s, "send()");
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
    hvd_tcp_set_events(s);
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
        *st = io_failed(s, "recv()");
        return -2;
    }
}

static hvd_status on_eof(tsock *s) {
    tcp *tp = s->tp;

    s->eof = 1;
    hvd_tcp_set_events(s);
    if (s->bye_rx && s->recvq.count == 0 && s->rx_off == s->rx_end)
        return HVD_OK;
    if (tp->shutting_down && s->recvq.count == 0)
        return HVD_OK;
    if (s->bye_rx) {
        char who[160];
        hvd_tcp_describe(tp, s->peer, who, sizeof(who));
        return hvd_tp_failf(
            hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, s->peer,
            "%s called hvd_shutdown while this rank still expected "
            "data from it: ranks did not run the same collectives",
            who);
    }
    return hvd_tcp_peer_lost(tp, s, "its connection closed unexpectedly");
}

static hvd_status on_abort(tsock *s, const uint8_t *payload, size_t len) {
    hvd_frame_abort a;

    if (hvd_frame_abort_decode(payload, len, &a) != HVD_OK)
        return hvd_tp_failf(hvd_tcp_fail_with, s->tp, s->tp->rank,
                            HVD_ERR_PROTOCOL, s->peer, "rank %d: %s", s->peer,
                            hvd_error_get());
    return hvd_tcp_fail_with(s->tp, a.status, a.culprit, a.origin, a.text);
}

/*
 * Only while failing (hvd_tcp_peer_lost): reads the frames that wait on a
 * socket behind data nobody has asked for yet, dropping that data, and acts on
 * an ABORT found there. Bounded by what the kernel holds now (no waiting) and
 * by a number of frames. Returns 0 if the stream cannot be read on (a
 * malformed frame), else 1.
 */
int hvd_tcp_scan_for_abort(tsock *s) {
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

/* Reads more of the stream into the staging buffer: 1 if bytes came, 0 if
 * none are there now; -1 if it ended or failed, *st then saying how. */
static int refill(tsock *s, hvd_status *st) {
    int r = s->eof ? -1 : rx_fill(s, st);

    if (r == -1)
        *st = on_eof(s);
    return r < 0 ? -1 : r;
}

hvd_status hvd_tcp_sock_recv(tsock *s) {
    tcp *tp = s->tp;
    hvd_status st = HVD_OK;

    for (;;) {
        if (!s->in_frame) {
            size_t avail = s->rx_end - s->rx_off;
            hvd_frame f = {0};
            /* A header, or an ABORT's body, not all here yet. */
            int more = avail < HVD_FRAME_HDR_LEN;

            if (!more) {
                if (hvd_frame_decode(s->rx + s->rx_off, avail, s->rx_seq, &f) !=
                    HVD_OK) {
                    char who[160];
                    hvd_tcp_describe(tp, s->peer, who, sizeof(who));
                    return hvd_tp_failf(hvd_tcp_fail_with, tp, tp->rank,
                                        HVD_ERR_PROTOCOL, s->peer,
                                        "protocol error from %s: %s", who,
                                        hvd_error_get());
                }
                if (f.type == HVD_FRAME_BYE || f.type == HVD_FRAME_HEARTBEAT) {
                    s->rx_off += HVD_FRAME_HDR_LEN;
                    s->rx_seq++;
                    if (f.type == HVD_FRAME_BYE)
                        s->bye_rx = 1;
                    continue;
                }
                more = f.type == HVD_FRAME_ABORT &&
                       avail < HVD_FRAME_HDR_LEN + f.len;
            }
            if (more) {
                int r = refill(s, &st);
                if (r < 0)
                    return st;
                if (r == 0)
                    break;
                continue;
            }
            if (f.type == HVD_FRAME_ABORT)
                return on_abort(s, s->rx + s->rx_off + HVD_FRAME_HDR_LEN,
                                (size_t)f.len);
            if (s->recvq.count == 0) {
                /* Data for a receive not posted yet: leave it in the
                 * staging buffer (and the kernel) until irecv. */
                s->rx_blocked = 1;
                break;
            }
            part *p = q_at(&s->recvq, 0);
            if (f.msg_len != p->msg_len || f.len != p->len) {
                char who[160];
                hvd_tcp_describe(tp, s->peer, who, sizeof(who));
                return hvd_tp_failf(
                    hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_MISMATCH, s->peer,
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
            return io_failed(s, "recv()");
        }
        int r = refill(s, &st);
        if (r < 0)
            return st;
        if (r == 0)
            break;
    }
    hvd_tcp_set_events(s);
    return HVD_OK;
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
