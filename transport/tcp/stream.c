/*
 * The TCP transport's sockets (see tcp_internal.h): writing a socket's
 * queued frames, reading its frames into the posted receives, an ABORT or
 * an end from the peer, and a lost peer (hvd_tcp_peer_lost, which reads
 * the other connections for the real cause before blaming it).
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/wire.h"

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
    /* A socket whose data waits for an irecv stops reporting only once
     * epoll has reported it (progress sets rx_muted): the irecv usually
     * comes first, and then neither change of the events (two system
     * calls) was needed. */
    if (!s->eof && !(s->rx_blocked && s->rx_muted))
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

size_t hvd_tcp_seal_frame(tsock *s, hvd_frame *f, uint8_t *buf) {
    size_t n = HVD_FRAME_HDR_LEN + (size_t)f->len;

    f->seq = s->tx_seq++;
    hvd_frame_encode(f, buf);
    if (s->tp->protect == HVD_PROTECT_NONE)
        return n;
    if (hvd_aead_seal(&s->tx_h, s->tx_ctr++, buf, n, buf + n) != 0)
        return 0;
    return n + HVD_PROTECT_TAG;
}

/* Readies more of p's payload to send: authenticates it a little ahead
 * (integrity), or encrypts the next piece into the socket's stage once the
 * last piece is out (encrypt); seals the tag once all of it is through. 0
 * on success. */
static int prepare(tsock *s, part *p) {
    size_t n;
    /* A large payload is a record of its own, begun here; a small one
     * goes on with its header's (seal_part). */
    int begin = p->ready == 0 && p->hlen > HVD_FRAME_HDR_LEN;

    if (s->tp->protect == HVD_PROTECT_INTEGRITY) {
        if (p->ready - p->done >= MAC_AHEAD / 2)
            return 0;
        n = p->len - p->ready < MAC_AHEAD ? p->len - p->ready : MAC_AHEAD;
        if ((begin && hvd_aead_begin(&s->tx_b, p->payload_ctr) != 0) ||
            hvd_aead_update(&s->tx_b, p->buf + p->ready, NULL, n) != 0)
            return -1;
    } else {
        if (p->done < p->ready)
            return 0; /* the piece staged last is not all out yet */
        if (s->st_pending == 0)
            s->st_used = 0;
        n = TX_STAGE - s->st_used;
        if (n == 0)
            return 0;
        if (n > p->len - p->ready)
            n = p->len - p->ready;
        if ((begin && hvd_aead_begin(&s->tx_b, p->payload_ctr) != 0) ||
            hvd_aead_update(&s->tx_b, p->buf + p->ready, s->stage + s->st_used,
                            n) != 0)
            return -1;
        p->chunk = p->ready;
        p->stage_pos = s->st_used;
        s->st_used += n;
        s->st_pending += n;
    }
    p->ready += n;
    if (p->ready == p->len && hvd_aead_seal_end(&s->tx_b, p->tag) != 0)
        return -1;
    return 0;
}

/* Seals p's header when it first goes out: frames take their numbers in
 * the order they leave. A header starts a record: it goes on through a
 * small payload (one tag after it), or ends with its own tag before a
 * large payload's record. 0 on success. */
static int seal_part(tsock *s, part *p) {
    hvd_frame f = {.type =
                       p->req == NULL ? HVD_FRAME_HEARTBEAT : HVD_FRAME_DATA,
                   .seq = s->tx_seq,
                   .msg_len = p->msg_len,
                   .len = p->len};
    uint8_t *h = p->hdr;

    p->seq0 = s->tx_seq++;
    p->ctr0 = s->tx_ctr;
    p->hlen = HVD_FRAME_HDR_LEN;
    hvd_frame_encode(&f, h);
    p->sealed = 1;
    if (s->tp->protect == HVD_PROTECT_NONE) {
        p->ready = p->len;
        return 0;
    }
    if (hvd_aead_begin(&s->tx_b, s->tx_ctr++) != 0 ||
        hvd_aead_update(&s->tx_b, h, h, HVD_FRAME_HDR_LEN) != 0)
        return -1;
    if (p->len > INLINE_MAX) {
        p->hlen = HDR_MAX;
        p->payload_ctr = s->tx_ctr++;
        return hvd_aead_seal_end(&s->tx_b, h + HVD_FRAME_HDR_LEN);
    }
    if (p->len == 0)
        return hvd_aead_seal_end(&s->tx_b, p->tag);
    return 0;
}

/* Fills iov with what the first max_parts queued frames have ready to go,
 * in stream order: it stops at a payload not all ready. Returns the
 * number of entries, -1 if sealing failed. */
static int build_iov(tsock *s, struct iovec *iov, size_t max_parts) {
    int niov = 0;

    for (size_t k = 0;
         k < s->sendq.count && k < max_parts && niov + 3 <= MAX_IOV; k++) {
        part *p = q_at(&s->sendq, k);
        if (!p->sealed && seal_part(s, p) != 0)
            return -1;
        if (p->hdr_done < p->hlen) {
            iov[niov].iov_base = p->hdr + p->hdr_done;
            iov[niov++].iov_len = p->hlen - p->hdr_done;
        }
        if (p->ready < p->len && prepare(s, p) != 0)
            return -1;
        if (p->done < p->ready) {
            iov[niov].iov_base =
                s->tp->protect == HVD_PROTECT_ENCRYPT
                    ? s->stage + p->stage_pos + (p->done - p->chunk)
                    : p->buf + p->done;
            iov[niov++].iov_len = p->ready - p->done;
        }
        if (p->ready < p->len)
            break;
        if (p->tag_done < s->tp->tag_len) {
            iov[niov].iov_base = p->tag + p->tag_done;
            iov[niov++].iov_len = s->tp->tag_len - p->tag_done;
        }
    }
    return niov;
}

/* Counts n bytes written against the queued frames; pops the finished
 * ones if pop (else stops at the first). */
static void sent(tsock *s, size_t n, int pop) {
    while (s->sendq.count > 0 && q_at(&s->sendq, 0)->sealed) {
        part *p = q_at(&s->sendq, 0);
        size_t hl = p->hlen;
        size_t h = hl - p->hdr_done < n ? hl - p->hdr_done : n;
        p->hdr_done += h;
        n -= h;
        size_t d = p->ready - p->done < n ? p->ready - p->done : n;
        p->done += d;
        n -= d;
        if (s->tp->protect == HVD_PROTECT_ENCRYPT)
            s->st_pending -= d;
        size_t t = p->done < p->len ? 0 : s->tp->tag_len - p->tag_done;
        t = t < n ? t : n;
        p->tag_done += t;
        n -= t;
        if (p->hdr_done < hl || p->done < p->len ||
            p->tag_done < s->tp->tag_len || !pop)
            break;
        part_done(s->tp, s, &s->sendq);
    }
}

static hvd_status seal_failed(tsock *s) {
    return hvd_tp_failf(hvd_tcp_fail_with, s->tp, s->tp->rank, HVD_ERR_INTERNAL,
                        -1, "OpenSSL failed to seal a frame for rank %d",
                        s->peer);
}

hvd_status hvd_tcp_sock_send(tsock *s) {
    while (s->sendq.count > 0) {
        struct iovec iov[MAX_IOV];
        int niov = build_iov(s, iov, SIZE_MAX);

        if (niov < 0)
            return seal_failed(s);
        if (niov == 0)
            break;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return io_failed(s, "send()");
        }
        sent(s, (size_t)n, 1);
    }
    hvd_tcp_set_events(s);
    return HVD_OK;
}

int hvd_tcp_finish_head(tsock *s, int64_t deadline) {
    int ok = 1;

    while (s->sendq.count > 0 && q_at(&s->sendq, 0)->hdr_done > 0) {
        part *p = q_at(&s->sendq, 0);
        struct iovec iov[MAX_IOV];
        int niov;

        if (p->hdr_done == p->hlen && p->done == p->len &&
            p->tag_done == s->tp->tag_len)
            break;
        niov = build_iov(s, iov, 1);
        if (niov <= 0) {
            ok = 0;
            break;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent(s, (size_t)n, 0);
            continue;
        }
        int64_t left = (deadline - hvd_now_ns()) / 1000000;
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || left <= 0) {
            ok = 0;
            break;
        }
        struct pollfd pfd = {.fd = s->fd, .events = POLLOUT};
        poll(&pfd, 1, (int)left);
    }
    /* The frames behind never leave: the next frame (an ABORT) takes the
     * numbers they took, so that the peer can read it. */
    for (size_t k = 0; k < s->sendq.count; k++) {
        part *p = q_at(&s->sendq, k);
        if (p->sealed && p->hdr_done == 0) {
            s->tx_seq = (uint32_t)p->seq0;
            s->tx_ctr = p->ctr0;
            break;
        }
    }
    return ok ? 0 : -1;
}

/* n bytes of s's stream arrived; mid says whether a frame was under way
 * before them. Every byte shows the peer alive (its last_active), but a
 * frame under way is alive only while LIFE_BYTES come at a time or it
 * completes (rx_frame_done): see check_stalls in progress.c. */
static void rx_got(tsock *s, size_t n, int mid) {
    int64_t now = hvd_now_ns();

    s->tp->peers[s->peer].last_active = now;
    if (!mid) {
        s->rx_mark = now;
        s->rx_since = 0;
    }
    s->rx_since += n;
    if (s->rx_since >= LIFE_BYTES) {
        s->rx_mark = now;
        s->rx_since = 0;
    }
}

/* A whole frame arrived on s: the stream is alive. */
static void rx_frame_done(tsock *s) {
    s->rx_mark = hvd_now_ns();
    s->rx_since = 0;
}

/* Reads more bytes into the staging buffer. Returns 1 if bytes came, 0 if
 * none are there now, -1 on EOF (s->eof set) and a failure via *st. */
static int rx_fill(tsock *s, hvd_status *st) {
    int mid = rx_mid_frame(s);

    if (s->rx_off > 0) {
        memmove(s->rx, s->rx + s->rx_off, s->rx_end - s->rx_off);
        s->rx_end -= s->rx_off;
        s->rx_off = 0;
    }
    for (;;) {
        ssize_t n =
            recv(s->fd, s->rx + s->rx_end, RX_CAP - s->rx_end, MSG_DONTWAIT);
        if (n > 0) {
            s->rx_drained = (size_t)n < RX_CAP - s->rx_end;
            s->rx_end += (size_t)n;
            rx_got(s, (size_t)n, mid);
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

hvd_status hvd_tcp_auth_failed(tsock *s) {
    tcp *tp = s->tp;
    char who[160];

    hvd_tcp_describe(tp, s->peer, who, sizeof(who));
    return hvd_tp_failf(hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_PROTOCOL,
                        s->peer,
                        "frame from %s failed authentication "
                        "(HVD_TCP_PROTECT=%s): it was altered, replayed, "
                        "reordered or cut on the way",
                        who, hvd_protect_name(tp->protect));
}

/*
 * Opens the next frame header in the staging buffer into s->cur (its
 * bytes consumed): 1 when s->cur holds it, 0 when more bytes are needed,
 * -1 when its tag failed, -2 when it is malformed (hvd_error_get says
 * how). Nothing of a header is believed before its tag is checked: its
 * length only says where the tag is (after the header, or after a small
 * payload), and a forged one makes the tag fail. A small payload comes
 * in the same record, opened here too, and waits in the staging buffer
 * after the header; then comes the record's tag.
 */
static int next_header(tsock *s) {
    tcp *tp = s->tp;
    uint8_t *h = s->rx + s->rx_off;
    size_t avail = s->rx_end - s->rx_off;
    uint64_t len;
    int small;

    if (s->have_hdr)
        return 1;
    if (avail < HVD_FRAME_HDR_LEN)
        return 0;
    if (tp->protect != HVD_PROTECT_NONE) {
        if (!s->hdr_begun &&
            (hvd_aead_begin(&s->rx_a, s->rx_ctr) != 0 ||
             hvd_aead_update(&s->rx_a, h, h, HVD_FRAME_HDR_LEN) != 0))
            return -1;
        s->hdr_begun = 1;
        len = hvd_get64(h + 16);
        small = len <= INLINE_MAX;
        if (avail < HVD_FRAME_HDR_LEN + (small ? len : 0) + HVD_PROTECT_TAG)
            return 0;
        s->hdr_begun = 0;
        if (small && hvd_aead_update(&s->rx_a, h + HVD_FRAME_HDR_LEN,
                                     h + HVD_FRAME_HDR_LEN, len) != 0)
            return -1;
        if (hvd_aead_open_end(&s->rx_a,
                              h + HVD_FRAME_HDR_LEN + (small ? len : 0)) != 0)
            return -1;
        s->rx_ctr++;
        s->cur_inline = small;
        if (!small)
            s->rx_payload_ctr = s->rx_ctr++;
    }
    if (hvd_frame_decode(h, HVD_FRAME_HDR_LEN, s->rx_seq, &s->cur) != HVD_OK)
        return -2;
    s->rx_seq++;
    s->rx_off += HVD_FRAME_HDR_LEN;
    if (tp->protect != HVD_PROTECT_NONE && !s->cur_inline)
        s->rx_off += HVD_PROTECT_TAG;
    s->have_hdr = 1;
    return 1;
}

/*
 * Only while failing (hvd_tcp_peer_lost): reads the frames that wait on a
 * socket behind data nobody has asked for yet, dropping that data, and acts on
 * an ABORT found there. Bounded by what the kernel holds now (no waiting) and
 * by a number of frames. Returns 0 if the stream cannot be read on (a
 * malformed or forged frame), else 1.
 */
int hvd_tcp_scan_for_abort(tsock *s) {
    tcp *tp = s->tp;
    hvd_status st = HVD_OK;

    for (int n = 0; n < 100000 && tp->failure.status == HVD_OK; n++) {
        size_t avail = s->rx_end - s->rx_off;
        int r;

        if (s->scan_drop > 0 && avail > 0) {
            size_t k = s->scan_drop < avail ? (size_t)s->scan_drop : avail;
            s->rx_off += k;
            s->scan_drop -= k;
            continue;
        }
        r = s->scan_drop > 0 ? 0 : next_header(s);
        if (r < 0)
            return 0;
        if (r == 1 && s->cur.type == HVD_FRAME_ABORT &&
            s->rx_end - s->rx_off < s->cur.len + tp->tag_len)
            r = 0;
        if (r == 0) {
            if (s->eof || rx_fill(s, &st) <= 0)
                return 1;
            continue;
        }
        s->have_hdr = 0;
        if (s->cur.type == HVD_FRAME_ABORT) {
            on_abort(s, s->rx + s->rx_off, (size_t)s->cur.len);
            return 1;
        }
        /* The rest of the frame: its payload and the tag after it. */
        s->scan_drop = s->cur.len + tp->tag_len;
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

/* Acts on the header in s->cur. Returns 1 to read on, 0 to stop for now
 * (more bytes needed, or no receive posted for its data), -1 with a
 * failure in *st. */
static int on_header(tsock *s, hvd_status *st) {
    tcp *tp = s->tp;
    hvd_frame *f = &s->cur;
    char who[160];

    if (f->type == HVD_FRAME_BYE || f->type == HVD_FRAME_HEARTBEAT) {
        s->have_hdr = 0;
        s->rx_off += tp->tag_len;
        rx_frame_done(s);
        if (f->type == HVD_FRAME_BYE)
            s->bye_rx = 1;
        return 1;
    }
    if (f->type == HVD_FRAME_ABORT) {
        if (s->rx_end - s->rx_off < f->len + tp->tag_len) {
            int r = refill(s, st);
            return r < 0 ? -1 : r;
        }
        s->have_hdr = 0;
        *st = on_abort(s, s->rx + s->rx_off, (size_t)f->len);
        return -1;
    }
    if (s->recvq.count == 0) {
        /* Data for a receive not posted yet: leave it in the staging
         * buffer (and the kernel) until irecv. */
        s->rx_blocked = 1;
        return 0;
    }
    part *p = q_at(&s->recvq, 0);
    if (p->upto && f->msg_len == f->len && f->len <= p->len) {
        /* A control message, whole: the receive takes its length. */
        p->len = p->msg_len = f->len;
        p->req->len = p->req->got = f->len;
    }
    if (f->msg_len != p->msg_len || f->len != p->len) {
        hvd_tcp_describe(tp, s->peer, who, sizeof(who));
        *st = hvd_tp_failf(
            hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_MISMATCH, s->peer,
            "%s sent a message of %llu bytes where this "
            "rank expected %s%llu: ranks called collectives "
            "in different orders or with different counts",
            who, (unsigned long long)f->msg_len, p->upto ? "at most " : "",
            (unsigned long long)p->msg_len);
        return -1;
    }
    s->have_hdr = 0;
    s->in_frame = 1;
    s->tag_got = 0;
    if (tp->protect != HVD_PROTECT_NONE && !s->cur_inline &&
        hvd_aead_begin(&s->rx_a, s->rx_payload_ctr) != 0) {
        *st = hvd_tcp_auth_failed(s);
        return -1;
    }
    return 1;
}

/* n bytes of the payload just landed in the caller's buffer at buf:
 * authenticates them (integrity) or decrypts them in place (encrypt). */
static int absorb(tsock *s, uint8_t *buf, size_t n) {
    if (s->tp->protect == HVD_PROTECT_NONE || s->cur_inline || n == 0)
        return 0;
    return hvd_aead_update(&s->rx_a, buf, buf, n);
}

/* Moves the payload (and its tag) of the frame being received from the
 * staging buffer. 1: the part is complete and authentic; 0: more to come;
 * -1 with a failure in *st. */
static int take_staged(tsock *s, part *p, hvd_status *st) {
    size_t avail = s->rx_end - s->rx_off;
    size_t need = p->len - p->done;
    size_t k = avail < need ? avail : need;
    size_t tl = s->tp->tag_len;

    if (k > 0) {
        memcpy(p->buf + p->done, s->rx + s->rx_off, k);
        if (absorb(s, p->buf + p->done, k) != 0) {
            *st = hvd_tcp_auth_failed(s);
            return -1;
        }
        p->done += k;
        s->rx_off += k;
        avail -= k;
    }
    if (p->done < p->len)
        return 0;
    k = tl - s->tag_got < avail ? tl - s->tag_got : avail;
    memcpy(s->rx_tag + s->tag_got, s->rx + s->rx_off, k);
    s->tag_got += k;
    s->rx_off += k;
    if (s->tag_got < tl)
        return 0;
    /* A small payload's tag was checked with its header (next_header). */
    if (tl > 0 && !s->cur_inline &&
        hvd_aead_open_end(&s->rx_a, s->rx_tag) != 0) {
        *st = hvd_tcp_auth_failed(s);
        return -1;
    }
    return 1;
}

hvd_status hvd_tcp_sock_recv(tsock *s) {
    tcp *tp = s->tp;
    hvd_status st = HVD_OK;

    s->rx_drained = 0;
    for (;;) {
        if (!s->in_frame) {
            int r = next_header(s);
            if (r == -1)
                return hvd_tcp_auth_failed(s);
            if (r == -2) {
                char who[160];
                hvd_tcp_describe(tp, s->peer, who, sizeof(who));
                return hvd_tp_failf(
                    hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_PROTOCOL, s->peer,
                    "protocol error from %s: %s", who, hvd_error_get());
            }
            if (r == 1)
                r = on_header(s, &st);
            else if (s->rx_drained)
                /* A recv() that took less than it asked for emptied the
                 * socket: another would only say EAGAIN (a system call
                 * per message). What comes later, epoll (level-triggered)
                 * reports. */
                r = 0;
            else
                r = refill(s, &st);
            if (r < 0)
                return st;
            if (r == 0)
                break;
            continue;
        }

        part *p = q_at(&s->recvq, 0);
        int r = take_staged(s, p, &st);
        if (r < 0)
            return st;
        if (r == 1) {
            s->in_frame = 0;
            rx_frame_done(s);
            part_done(tp, s, &s->recvq);
            continue;
        }
        if (s->eof)
            return on_eof(s);
        size_t need = p->len - p->done;
        if (need >= RX_CAP / 2) {
            ssize_t n = recv(s->fd, p->buf + p->done, need, MSG_DONTWAIT);
            if (n > 0) {
                if (absorb(s, p->buf + p->done, (size_t)n) != 0)
                    return hvd_tcp_auth_failed(s);
                p->done += (size_t)n;
                rx_got(s, (size_t)n, 1);
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
        r = refill(s, &st);
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
