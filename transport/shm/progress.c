/*
 * The shared-memory transport's data movement (see shm_internal.h):
 * isend/irecv, progress (a pass over the FIFOs, then a spin and a futex
 * sleep on this rank's doorbell), watching the peers while waiting, wake
 * and one-sided get.
 */
#include "transport/shm/shm_internal.h"

#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"

/* 1 if all that is in flight with pe is control messages to it. */
static int only_control_sends(const speer *pe) {
    for (int ch = 0; ch < NCHANNELS; ch++)
        if (pe->recvq[ch].count > 0 || pe->ackq[ch].count > 0 ||
            (ch != HVD_CHANNEL_CONTROL && pe->sendq[ch].count > 0))
            return 0;
    return 1;
}

/* Drops the sends queued to pe on ch (its peer left in order). */
static void drop_sends(speer *pe, int ch) {
    msgq *q = &pe->sendq[ch];
    while (q->count > 0) {
        msg *m = q_front(q);
        if (m->req != NULL)
            hvd_shm_complete(m->req, HVD_OK);
        if (m->owned)
            free(m->buf);
        pe->pending--;
        q_pop(q);
    }
}

/*
 * The slow checks, at most every SLICE_MS while waiting: a peer that
 * failed, died, or has stalled past the timeout while this rank waits on
 * it.
 */
hvd_status hvd_shm_check_peers(shm *tp, int64_t now) {
    if (now - tp->last_check < SLICE_MS * 1000000LL)
        return HVD_OK;
    tp->last_check = now;
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        char who[160];
        if (pe->seg == NULL)
            continue;
        seg_hdr *h = hdr_of(pe->seg);
        int32_t st = atomic_load(&h->failed);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            memcpy(text, h->failmsg, sizeof(text));
            text[sizeof(text) - 1] = '\0';
            return hvd_shm_fail_with(tp, (hvd_status)st, h->culprit, tp->rank,
                                     text);
        }
        hvd_shm_describe(tp, p, who, sizeof(who));
        if ((!atomic_load(&h->bye) || pe->pending > 0) &&
            hvd_shm_peer_exited(pe)) {
            /* What it wrote before it went is still in this rank's FIFOs:
             * take it first, as a socket is read to its end. */
            hvd_shm_pass(tp);
            if (tp->failure.status != HVD_OK)
                return hvd_tp_failure_error(&tp->failure);
            if (atomic_load(&h->bye) && only_control_sends(pe)) {
                /* It left in order: control messages it will never read
                 * (the engine's last ones) are dropped. */
                drop_sends(pe, HVD_CHANNEL_CONTROL);
                continue;
            }
        }
        if ((!atomic_load(&h->bye) || pe->pending > 0) &&
            hvd_shm_peer_exited(pe))
            return hvd_tp_failf(
                hvd_shm_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, p,
                "%s exited or was killed while rank %d %s (its "
                "process is gone)",
                who, tp->rank, pe->pending > 0 ? "waited on it" : "still ran");
        if (pe->pending > 0) {
            int64_t last = atomic_load(&h->heartbeat);
            if (last < pe->last_active)
                last = pe->last_active;
            if (now - last > tp->timeout_ns)
                return hvd_tp_fail_stalled(hvd_shm_fail_with, tp, tp->rank, p,
                                           who, tp->timeout_ns);
        }
    }
    return HVD_OK;
}

/*
 * What the peers have done with this rank, as one number that changes when
 * any of them writes a cell into its FIFOs or consumes one of the cells it
 * wrote into theirs. Read only while spinning (these are lines the peers
 * write), never on the polling path.
 */
static uint64_t activity(const shm *tp) {
    uint64_t sum = 0;

    for (int p = 0; p < tp->size; p++) {
        const speer *pe = &tp->peers[p];
        if (pe->seg == NULL)
            continue;
        for (int ch = 0; ch < NCHANNELS; ch++) {
            fifo *in = fifo_of(tp->seg, pe->local, ch);
            fifo *out = fifo_of(pe->seg, tp->my_local, ch);
            sum += atomic_load_explicit(&cell_of(in, ch, pe->rx_head[ch])->seq,
                                        memory_order_relaxed);
            sum += atomic_load_explicit(&out->head, memory_order_relaxed);
        }
    }
    return sum;
}

/* How long a rank spins where other processes hold the cores. */
#define BUSY_SPIN_NS (20 * 1000LL)

/*
 * Spins for HVD_SHM_SPIN_US (at most until deadline), yielding the core at
 * every look, until this rank's requests move (data, freed cells, an
 * acknowledgement: peers do not ring a rank that is awake), its doorbell
 * rings (another thread's wake, a peer's failure), or a peer does anything
 * else with this rank (it consumed this rank's cells, or sent what no
 * receive is posted for yet). Returns 1 if something happened (the caller
 * looks again, and progress starts a new spin), 0 if it is time to sleep.
 * The last kind of event ended the spin when every message rang the
 * doorbell; without it, on a host with more ranks than cores, ranks slept
 * while the job was busy and each wake-up cost milliseconds
 * (docs/benchmarks.md, issue 35). Where other processes hold the cores it
 * pauses between looks instead of yielding, for BUSY_SPIN_NS at most.
 */
static int spin(shm *tp, seg_hdr *me, int64_t deadline) {
    int64_t now = hvd_now_ns(), spin_end = now + tp->spin_ns;
    uint64_t seen = tp->spin_ns > 0 ? activity(tp) : 0;
    /* Other processes hold the cores: a yield would hand this one to them
     * for a whole time slice (milliseconds), so the spin pauses between
     * looks instead, and only briefly: asleep, this rank is woken at once
     * by its peer's doorbell. */
    int busy = tp->load_on && !hvd_hostload_room(&tp->load, now);

    if (busy && spin_end > now + BUSY_SPIN_NS)
        spin_end = now + BUSY_SPIN_NS;
    if (spin_end > deadline)
        spin_end = deadline;
    while (hvd_now_ns() < spin_end) {
        uint32_t bell =
            atomic_load_explicit(&me->doorbell, memory_order_acquire);
        if (bell != tp->seen_bell) {
            tp->seen_bell = bell;
            hvd_shm_pass(tp);
            return 1;
        }
        if (hvd_shm_pass(tp))
            return 1;
        if (activity(tp) != seen)
            return 1;
        /* Give the core to any other runnable thread (the peer, if they
         * share it; this rank's own application thread): a busy loop would
         * hold it for a whole time slice. */
        if (busy)
            hvd_cpu_relax();
        else
            sched_yield();
    }
    return 0;
}

hvd_status hvd_shm_progress(hvd_transport *t, int timeout_ms) {
    shm *tp = (shm *)t;
    seg_hdr *me = tp->seg != NULL ? hdr_of(tp->seg) : NULL;
    /* The heartbeat and the peers' checks need only the coarse clock; a
     * wait reads the fine one. */
    int64_t now = hvd_coarse_ns(), deadline;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (me == NULL) {
        /* No same-host peer: nothing can ever arrive. */
        if (timeout_ms != 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        return HVD_OK;
    }
    if (now - tp->last_heartbeat >= HEARTBEAT_NS) {
        tp->last_heartbeat = now;
        atomic_store_explicit(&me->heartbeat, now, memory_order_relaxed);
    }
    /* Peers are looked at every SLICE_MS even while traffic from others
     * keeps this rank from ever sleeping. */
    if (hvd_shm_check_peers(tp, now) != HVD_OK)
        goto out;
    if (hvd_shm_pass(tp) || timeout_ms == 0)
        goto out;
    now = hvd_now_ns();
    deadline = timeout_ms < 0 ? INT64_MAX : now + timeout_ms * 1000000LL;
    if (spin(tp, me, deadline))
        goto out;
    for (;;) {
        uint32_t bell;
        int64_t left;
        struct timespec ts;

        /* The store, the fence (or barrier), then the look:
         * hvd_shm_notify says why a peer that publishes meanwhile either
         * is seen here or rings. */
        atomic_store_explicit(&me->sleeping, 1, memory_order_relaxed);
        hvd_shm_sleep_fence(tp);
        bell = atomic_load(&me->doorbell);
        if (bell != tp->seen_bell || hvd_shm_pass(tp)) {
            tp->seen_bell = bell;
            atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
            hvd_shm_pass(tp);
            break;
        }
        now = hvd_now_ns();
        left = deadline - now;
        if (left > SLICE_MS * 1000000LL)
            left = SLICE_MS * 1000000LL;
        if (tp->membar_failed && left > 1000000LL)
            left = 1000000LL;
        if (left > 0) {
            ts.tv_sec = left / 1000000000LL;
            ts.tv_nsec = left % 1000000000LL;
            hvd_shm_futex(&me->doorbell, FUTEX_WAIT, bell, &ts);
        }
        atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
        if (atomic_load(&me->doorbell) != bell) {
            tp->seen_bell = atomic_load(&me->doorbell);
            hvd_shm_pass(tp);
            break;
        }
        now = hvd_now_ns();
        if (now - tp->last_heartbeat >= HEARTBEAT_NS) {
            tp->last_heartbeat = now;
            atomic_store_explicit(&me->heartbeat, now, memory_order_relaxed);
        }
        if (hvd_shm_check_peers(tp, now) != HVD_OK || now >= deadline)
            break;
    }
out:
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    return HVD_OK;
}

static hvd_status check_peer(shm *tp, int peer, int channel, const char *what) {
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (peer < 0 || peer >= tp->size || peer == tp->rank)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "shm: cannot %s rank %d (this is rank %d of %d)",
                             what, peer, tp->rank, tp->size);
    if (tp->peers[peer].seg == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "shm: rank %d is on another host (%s) than rank "
                             "%d: shared memory cannot reach it",
                             peer, tp->hosts ? tp->hosts[peer] : "?", tp->rank);
    if (channel < 0 || channel >= NCHANNELS)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "shm: no channel %d",
                             channel);
    return HVD_OK;
}

static hvd_status post(shm *tp, int peer, int ch, msgq *q, void *buf,
                       size_t len, hvd_req *req, int upto) {
    msg m = {.req = req, .buf = buf, .len = len, .upto = upto};

    req->done = 0;
    req->status = HVD_OK;
    req->peer = peer;
    req->len = len;
    if (q_push(q, &m) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (tp->peers[peer].pending++ == 0)
        tp->peers[peer].last_active = hvd_coarse_ns();
    (void)ch;
    return HVD_OK;
}

hvd_status hvd_shm_isend(hvd_transport *t, int peer, int channel,
                         const void *buf, size_t len, hvd_req *req) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, channel, "send to");
    msgq *q;

    if (st == HVD_OK)
        st = post(tp, peer, channel, &tp->peers[peer].sendq[channel],
                  (void *)(uintptr_t)buf, len, req, 0);
    if (st != HVD_OK)
        return st;
    /* Start at once: a small message is in the peer's FIFO before the
     * caller next waits. */
    q = &tp->peers[peer].sendq[channel];
    if (q->count == 1)
        hvd_shm_push(tp, peer, channel);
    /*
     * A control message the FIFO cannot take now is copied and completes
     * at once, as a socket buffers it: the engine sends control messages
     * and waits for them while the peer may be busy in a collective that
     * waits on this rank, so they must never wait for the peer.
     */
    if (channel == HVD_CHANNEL_CONTROL && !req->done && q->count > 0) {
        msg *m = &q->v[(q->head + q->count - 1) & (q->cap - 1)];
        uint8_t *copy = malloc(len > 0 ? len : 1);
        if (copy == NULL)
            return HVD_OK; /* it completes when written, as data does */
        if (len > 0)
            memcpy(copy, buf, len);
        m->buf = copy;
        m->owned = 1;
        m->req = NULL;
        hvd_shm_complete(req, HVD_OK);
    }
    return HVD_OK;
}

hvd_status hvd_shm_irecv(hvd_transport *t, int peer, int channel, void *buf,
                         size_t len, hvd_req *req) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, channel, "receive from");

    if (st == HVD_OK)
        st = post(tp, peer, channel, &tp->peers[peer].recvq[channel], buf, len,
                  req, 0);
    return st;
}

hvd_status hvd_shm_irecv_upto(hvd_transport *t, int peer, int channel,
                              void *buf, size_t cap, hvd_req *req) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, channel, "receive from");

    if (st == HVD_OK)
        st = post(tp, peer, channel, &tp->peers[peer].recvq[channel], buf, cap,
                  req, 1);
    return st;
}

void hvd_shm_wake(hvd_transport *t) {
    shm *tp = (shm *)t;
    if (tp->seg != NULL)
        hvd_shm_ring(tp->seg);
}

hvd_status hvd_shm_get(hvd_transport *t, int peer, void *buf, uint64_t remote,
                       size_t len) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, 0, "read from");

    if (st != HVD_OK)
        return st;
    if (!tp->cma)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "shm: process_vm_readv is not permitted here");
    return len > 0 ? hvd_shm_cma_read(tp, peer, buf, remote, len) : HVD_OK;
}

int hvd_shm_can_get(hvd_transport *t, int peer) {
    shm *tp = (shm *)t;
    return tp->cma && peer >= 0 && peer < tp->size &&
           tp->peers[peer].seg != NULL;
}
