/*
 * The TCP transport's failures (see tcp_internal.h): naming a peer, and
 * failing for good: every request completed, every peer told why (an
 * ABORT frame, best effort). Calls nothing else of the transport but the
 * frame codec.
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>

#include "transport/base/clock.h"

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
    if (s->sendq.count == 0 || s->tx_broken)
        return;
    if (hvd_tcp_finish_head(s, deadline) != 0)
        s->tx_broken = 1;
}

static void send_abort(tsock *s, const hvd_frame_abort *a, int64_t deadline) {
    uint8_t frame[HDR_MAX + HVD_FRAME_ABORT_MAX];
    hvd_frame hdr = {.type = HVD_FRAME_ABORT};
    size_t len;

    hdr.len = hvd_frame_abort_encode(a, frame + HVD_FRAME_HDR_LEN);
    len = hvd_tcp_seal_frame(s, &hdr, frame);
    if (len == 0 || write_until(s->fd, frame, len, deadline) != len)
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
