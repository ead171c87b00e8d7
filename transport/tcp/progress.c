/*
 * The TCP transport's data movement (see tcp_internal.h): how a message
 * is laid out on a pair's sockets, isend/isendv/irecv, wake, and the
 * progress engine (epoll, heartbeats, stalled peers).
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"

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

/* Queues a send (send = 1) or a receive of len bytes (upto: at most len,
 * on the control channel) on the peer's sockets. start: a send goes out
 * at once, without waiting for progress, and a receive whose data is
 * already staged completes here; 0 leaves the sending to the caller
 * (hvd_tcp_isendv). */
static hvd_status post(tcp *tp, int peer, int channel, uint8_t *buf, size_t len,
                       hvd_req *req, int send, int start, int upto) {
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
        pr->last_active = pr->wait_since = hvd_now_ns();
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
        p->upto = upto;
        /* A send's header is sealed when it first goes out (stream.c),
         * so frames take their numbers in the order they leave. */
        p->sealed = 0;
        p->hdr_done = 0;
        p->ready = 0;
        p->tag_done = 0;
    }
    for (int i = 0; i < nparts && start; i++) {
        tsock *s = part_sock(tp, pr, channel, first, i);
        hvd_status st = HVD_OK;
        if (send && s->sendq.count == 1)
            st = hvd_tcp_sock_send(s);
        else if (!send && s->rx_blocked) {
            s->rx_blocked = 0;
            s->rx_muted = 0;
            st = hvd_tcp_sock_recv(s);
        }
        if (st != HVD_OK)
            return HVD_OK; /* the request completed with the failure */
    }
    return HVD_OK;
}

hvd_status hvd_tcp_isend(hvd_transport *t, int peer, int channel,
                         const void *buf, size_t len, hvd_req *req) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "send");

    if (st != HVD_OK)
        return st;
    return post(tp, peer, channel, (uint8_t *)(uintptr_t)buf, len, req, 1, 1,
                0);
}

/* Queues every message, then writes each socket that had nothing queued
 * before: a control message's frame and the rest of its body leave in one
 * sendmsg, so the peer gets them in one segment. */
hvd_status hvd_tcp_isendv(hvd_transport *t, int peer, int channel,
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
                  msgs[k].len, &reqs[k], 1, 0, 0);
    for (int i = 0; i < tp->nconn; i++) {
        tsock *s = &pr->socks[i];
        if (before[i] == 0 && s->sendq.count > 0 &&
            hvd_tcp_sock_send(s) != HVD_OK)
            break; /* the requests completed with the failure */
    }
    return st;
}

hvd_status hvd_tcp_irecv(hvd_transport *t, int peer, int channel, void *buf,
                         size_t len, hvd_req *req) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "receive");

    if (st != HVD_OK)
        return st;
    return post(tp, peer, channel, buf, len, req, 0, 1, 0);
}

/* A control message goes whole onto its socket (post), so the frame that
 * comes says its length. */
hvd_status hvd_tcp_irecv_upto(hvd_transport *t, int peer, int channel,
                              void *buf, size_t cap, hvd_req *req) {
    tcp *tp = (tcp *)t;
    hvd_status st = check_peer(tp, peer, "receive");

    if (st != HVD_OK)
        return st;
    if (channel != HVD_CHANNEL_CONTROL)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "tcp: irecv_upto on channel %d (the control "
                             "channel only)",
                             channel);
    return post(tp, peer, channel, buf, cap, req, 0, 1, 1);
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

/* Queues a heartbeat on every idle socket: peers waiting on this rank
 * learn that it is alive, even while it waits on someone else. */
static void send_heartbeats(tcp *tp) {
    for (int i = 0; i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        part *p;

        if (s->fd < 0 || s->eof || s->tx_broken || s->sendq.count > 0 ||
            q_reserve(&s->sendq, 1) != 0)
            continue;
        p = q_push(&s->sendq);
        memset(p, 0, sizeof(*p));
        if (hvd_tcp_sock_send(s) != HVD_OK)
            return;
    }
}

/*
 * A stream stalls mid-frame when, while this rank waits on its peer and
 * the peer shows life, the frame under way neither completes nor gets
 * LIFE_BYTES more for the timeout (stream.c's rx_got). The peer's other
 * connections may be lively (its heartbeats), and a trickle may keep this
 * one from falling silent: an attacker who cut the end of a burst, or who
 * forwards a byte now and then, would otherwise hold the job for as long
 * as they like.
 */
static hvd_status check_frames(tcp *tp, int p, int64_t now) {
    tpeer *peer = &tp->peers[p];

    /* A peer from which nothing at all comes any more (no heartbeat
     * either) is stopped or gone, not trickling: the silence timer names
     * it as such. */
    if (now - peer->last_active > 2 * tp->heartbeat_ns + TIMEOUT_CHECK_NS)
        return HVD_OK;

    for (int k = 0; k < tp->nconn; k++) {
        tsock *s = &peer->socks[k];
        int64_t since =
            s->rx_mark > peer->wait_since ? s->rx_mark : peer->wait_since;
        char who[160];

        if (s->fd < 0 || !rx_mid_frame(s) || now - since <= tp->timeout_ns)
            continue;
        hvd_tcp_describe(tp, p, who, sizeof(who));
        return hvd_tp_failf(hvd_tcp_fail_with, tp, tp->rank, HVD_ERR_TIMEOUT, p,
                            "%s sent only %llu bytes in %.0f s in the middle "
                            "of a frame: the connection stalls or is being "
                            "tampered with (HVD_TIMEOUT_SECONDS sets this "
                            "limit)",
                            who, (unsigned long long)s->rx_since,
                            (double)(now - since) / 1e9);
    }
    return HVD_OK;
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
        if (peer->pending > 0 && check_frames(tp, p, now) != HVD_OK)
            return tp->failure.status;
    }
    return HVD_OK;
}

/*
 * epoll_wait for up to timeout_ms (-1: no bound), but while a request is
 * in flight and the host has a core to spare, polling for HVD_TCP_SPIN_US
 * first. A rank asleep in epoll_wait is woken through the scheduler when
 * its peer's segment lands, and on loopback that wake-up (10-25 us, more
 * on a loaded host) cost more than the exchange itself: a collective's
 * exchange on the data socket, whose waits sleep, took 2-3 times as long
 * as an engine step on the control socket, whose waits poll
 * (docs/benchmarks.md, "Issue 35: TCP latency"). An idle rank, with
 * nothing in flight, sleeps at once.
 */
static int wait_events(tcp *tp, struct epoll_event *evs, int timeout_ms) {
    int n = epoll_wait(tp->epfd, evs, MAX_EVENTS, 0);
    int waiting = 0;
    int64_t start, end, now;

    if (n != 0 || timeout_ms == 0)
        return n;
    for (int p = 0; p < tp->size && tp->spin_ns > 0; p++)
        waiting |= tp->peers[p].pending > 0;
    start = now = hvd_now_ns();
    /* On a busy host TCP wakes a receiver as a synchronous wake-up, which
     * the scheduler puts on the waker's core, and a waker that then polls
     * holds it off (2 KiB round trip with 4 other busy threads on 2 cores:
     * 17 us sleeping, 37 us polling for 20 us, 53 us for 100 us). */
    if (!waiting || !hvd_hostload_room(&tp->load, now))
        return epoll_wait(tp->epfd, evs, MAX_EVENTS, timeout_ms);
    end = start + tp->spin_ns;
    if (timeout_ms > 0 && end > start + timeout_ms * 1000000LL)
        end = start + timeout_ms * 1000000LL;
    for (unsigned k = 1; now < end; k++) {
        /* Where ranks share cores, give the core to any other runnable
         * thread (the peer) at every look: a busy loop would hold it for a
         * whole time slice. Else only now and then, as the engine's spin
         * does: a yield on a busy host hands the core to another process
         * for its whole slice. */
        if (tp->spin_yield || k % 64 == 0)
            sched_yield();
        n = epoll_wait(tp->epfd, evs, MAX_EVENTS, 0);
        if (n != 0)
            return n;
        now = hvd_now_ns();
    }
    if (timeout_ms < 0)
        return epoll_wait(tp->epfd, evs, MAX_EVENTS, -1);
    int64_t left_ms = timeout_ms - (now - start) / 1000000;
    return epoll_wait(tp->epfd, evs, MAX_EVENTS,
                      left_ms > 0 ? (int)left_ms : 0);
}

hvd_status hvd_tcp_progress(hvd_transport *t, int timeout_ms) {
    tcp *tp = (tcp *)t;
    struct epoll_event evs[MAX_EVENTS];
    int n;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    n = wait_events(tp, evs, timeout_ms);
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
            if (s->rx_blocked) {
                /* Its data waits for an irecv: quiet until then. */
                s->rx_muted = 1;
                hvd_tcp_set_events(s);
                continue;
            }
            if (hvd_tcp_sock_recv(s) != HVD_OK)
                break;
        }
    }
    if (tp->failure.status == HVD_OK)
        check_stalls(tp, hvd_now_ns());
    return tp->failure.status == HVD_OK ? HVD_OK
                                        : hvd_tp_failure_error(&tp->failure);
}
