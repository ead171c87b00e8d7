/*
 * The TCP transport's progress engine (see tcp_internal.h).
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"

/* ------------------------------------------------------------------ */
/* Progress                                                            */

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
        if (hvd_tcp_sock_send(s) != HVD_OK)
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
            hvd_tcp_describe(tp, p, who, sizeof(who));
            return hvd_tp_fail_stalled(hvd_tcp_fail_with, tp, tp->rank, p, who,
                                       tp->timeout_ns);
        }
    }
    return HVD_OK;
}

hvd_status hvd_tcp_progress(hvd_transport *t, int timeout_ms) {
    tcp *tp = (tcp *)t;
    struct epoll_event evs[MAX_EVENTS];
    int n;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    n = epoll_wait(tp->epfd, evs, MAX_EVENTS, timeout_ms);
    if (n < 0 && errno != EINTR)
        return hvd_tp_failf(hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_TRANSPORT,
                            -1, "epoll_wait() failed: %s", strerror(errno));
    for (int i = 0; i < n && tp->failure.status == HVD_OK; i++) {
        tsock *s = evs[i].data.ptr;
        uint32_t e = evs[i].events;

        if (s == NULL) { /* hvd_tcp_wake */
            uint64_t count;
            ssize_t ignored = read(tp->wakefd, &count, sizeof(count));
            (void)ignored;
            continue;
        }
        if ((e & EPOLLOUT) && hvd_tcp_sock_send(s) != HVD_OK)
            break;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            if (s->rx_blocked && (e & (EPOLLHUP | EPOLLERR))) {
                /* The peer is gone while its data waits for us. */
                if (tp->shutting_down) {
                    s->eof = 1;
                    hvd_tcp_set_events(s);
                    continue;
                }
                hvd_tcp_peer_lost(tp, s, "its connection broke");
                break;
            }
            if (!s->rx_blocked && hvd_tcp_sock_recv(s) != HVD_OK)
                break;
        }
    }
    if (tp->failure.status == HVD_OK)
        check_stalls(tp, hvd_now_ns());
    return tp->failure.status == HVD_OK ? HVD_OK
                                        : hvd_tp_failure_error(&tp->failure);
}
