/* The verbs transport (verbs.h): moving data, the entry of the ops that do
 * it: isend and irecv, progress (with heartbeats and stalled peers) and
 * wake. The work itself is done by the files below it, which only this one
 * calls from above: completion.c (the completion queue), rx.c (receiving),
 * tx.c (sending); and fail.c, post.c. */

#include "transport/verbs/verbs_internal.h"

/* ------------------------------------------------------------------ */
/* Heartbeats and stalls                                               */

/*
 * A peer is stalled when this rank waits on it (a request in flight) and
 * nothing has arrived from it for the timeout. Ranks that wait send
 * heartbeats, so a peer that is alive but itself waiting on a third rank
 * is not blamed: only the rank that stopped is. A heartbeat to a peer
 * that died fails with the transport retry error, which names it.
 */
static hvd_status housekeeping(vtp *tp, int64_t now) {
    int waiting = 0;

    if (now - tp->last_check < CHECK_NS)
        return HVD_OK;
    tp->last_check = now;
    for (int p = 0; p < tp->size; p++)
        waiting |= tp->pending[p] > 0;
    if (waiting && now - tp->last_hb >= tp->heartbeat_ns) {
        tp->last_hb = now;
        for (int p = 0; p < tp->size; p++) {
            vqp *q = &tp->qps[p * 2 + HVD_CHANNEL_DATA];
            int err;
            if (p == tp->rank || q->hb_out || q->bye_rx)
                continue;
            err = hvd_vb_post_ctl(q, HVD_VMSG_HEARTBEAT, NULL, 0);
            if (err == 0)
                q->hb_out = 1;
            else if (err > 1)
                return hvd_vb_post_failed(q, "heartbeat", err);
        }
    }
    for (int p = 0; p < tp->size; p++) {
        if (tp->pending[p] > 0 && now - tp->last_active[p] > tp->timeout_ns) {
            char who[160];
            hvd_vb_describe(tp, p, who, sizeof(who));
            return hvd_tp_fail_stalled(hvd_vb_fail_with, tp, tp->rank, p, who,
                                       tp->timeout_ns);
        }
    }
    return HVD_OK;
}

hvd_status hvd_vb_progress(hvd_transport *t, int timeout_ms) {
    vtp *tp = (vtp *)t;
    int64_t end = timeout_ms < 0 ? INT64_MAX
                                 : hvd_now_ns() + (int64_t)timeout_ms * 1000000;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    for (;;) {
        int moved = hvd_vb_drain(tp);
        int64_t now = hvd_now_ns();
        int waiting = 0, wait_ms;

        if (moved >= 0)
            housekeeping(tp, now);
        if (tp->failure.status != HVD_OK)
            return hvd_tp_failure_error(&tp->failure);
        if (moved > 0 || now >= end)
            return HVD_OK;
        for (int p = 0; p < tp->size && !waiting; p++)
            waiting = tp->pending[p] > 0;
        if (end == INT64_MAX && !waiting)
            wait_ms = -1;
        else {
            int64_t left = end - now;
            if (waiting && left > CHECK_NS)
                left = CHECK_NS;
            wait_ms = (int)((left + 999999) / 1000000);
        }
        if (hvd_vb_wait_events(tp, wait_ms))
            return tp->failure.status == HVD_OK
                       ? HVD_OK
                       : hvd_tp_failure_error(&tp->failure);
    }
}

void hvd_vb_wake(hvd_transport *t) {
    vtp *tp = (vtp *)t;
    uint64_t one = 1;

    if (tp->wakefd >= 0) {
        ssize_t ignored = write(tp->wakefd, &one, sizeof(one));
        (void)ignored;
    }
}

/* One turn for setup and goodbye, which wait on their own control
 * messages: processes what the completion queue holds and, where that was
 * nothing, sleeps up to wait_ms for more. Returns what the drain returned
 * (-1 once failed). */
int hvd_vb_step(vtp *tp, int wait_ms) {
    int moved = hvd_vb_drain(tp);

    if (moved == 0)
        hvd_vb_wait_events(tp, wait_ms);
    return moved;
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */

/*
 * Checks a request's peer and channel. A send to a peer that has said
 * goodbye can never be received; a receive may still be, from what
 * arrived before the goodbye (hvd_vb_irecv checks that after matching).
 */
static hvd_status check_peer(vtp *tp, int peer, int channel, const char *what) {
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (peer < 0 || peer >= tp->size || peer == tp->rank ||
        (channel != HVD_CHANNEL_DATA && channel != HVD_CHANNEL_CONTROL))
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "verbs %s to rank %d on channel %d: not a peer "
                             "of rank %d in a job of %d",
                             what, peer, channel, tp->rank, tp->size);
    if (strcmp(what, "send") == 0 && tp->qps[peer * 2 + channel].bye_rx) {
        char who[160];
        hvd_vb_describe(tp, peer, who, sizeof(who));
        return hvd_tp_failf(
            hvd_vb_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, peer,
            "%s has already called hvd_shutdown: ranks did not run "
            "the same collectives",
            who);
    }
    return HVD_OK;
}

/* 1 if buf is CUDA device memory that this transport moves itself (and
 * its allocation's id); always 0 with GPUDirect off and on the control
 * channel, where every buffer is host memory (transport.h) and nothing is
 * asked. */
static int on_device(vtp *tp, int channel, const void *buf, size_t len,
                     uint64_t *id_out) {
    *id_out = 0;
    return tp->gpudirect && channel == HVD_CHANNEL_DATA && len > 0 &&
           tp->seam->mem_type(buf, id_out) == HVD_MEM_DEVICE;
}

static void start_req(vtp *tp, hvd_req *req, int peer, size_t len) {
    req->done = 0;
    req->status = HVD_OK;
    req->peer = peer;
    req->len = len;
    req->parts_left = 1;
    if (tp->pending[peer]++ == 0)
        tp->last_active[peer] = hvd_now_ns();
}

hvd_status hvd_vb_isend(hvd_transport *t, int peer, int channel,
                        const void *buf, size_t len, hvd_req *req) {
    vtp *tp = (vtp *)t;
    hvd_status st = check_peer(tp, peer, channel, "send");
    uint64_t id;
    vqp *q;
    txmsg *m;
    int dev;

    if (st != HVD_OK)
        return st;
    dev = on_device(tp, channel, buf, len, &id);
    q = &tp->qps[peer * 2 + channel];
    if (q->sq_count == q->sq_cap) {
        txmsg *v = hvd_ring_grow(q->sq, sizeof(*q->sq), &q->sq_cap, &q->sq_head,
                                 q->sq_count, q->sq_count + 1);
        if (v == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory queueing a message for rank "
                                 "%d",
                                 peer);
        q->sq = v;
    }
    start_req(tp, req, peer, len);
    m = &q->sq[(q->sq_head + q->sq_count) % q->sq_cap];
    *m = (txmsg){.req = req,
                 .buf = buf,
                 .len = len,
                 .seq = q->tx_seq++,
                 .dev = (uint8_t)dev,
                 .bufid = id};
    q->sq_count++;
    tp->ctr.dev_tx += (uint64_t)dev;
    /* Start at once: a send goes out without waiting for progress. A
     * failure completes the request with it. */
    if (q->sq_count == 1)
        hvd_vb_tx_progress(q);
    return HVD_OK;
}

/* Posts a receive of len bytes (upto: at most len, host memory). */
static hvd_status post_recv(hvd_transport *t, int peer, int channel, void *buf,
                            size_t len, hvd_req *req, int upto) {
    vtp *tp = (vtp *)t;
    hvd_status st = check_peer(tp, peer, channel, "receive");
    hvd_mr_entry *mr = NULL;
    uint64_t id, seq;
    vqp *q;
    int dev;

    if (st != HVD_OK)
        return st;
    q = &tp->qps[peer * 2 + channel];
    if (q->rq_count == q->rq_cap) {
        rxreq *v = hvd_ring_grow(q->rq, sizeof(*q->rq), &q->rq_cap, &q->rq_head,
                                 q->rq_count, q->rq_count + 1);
        if (v == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory queueing a receive from rank "
                                 "%d",
                                 peer);
        q->rq = v;
    }
    dev = !upto && on_device(tp, channel, buf, len, &id);
    if (dev) {
        /* Registered now, for the RTR; held until the message is in. */
        st = hvd_mr_get_id(tp->mrc, buf, len, HVD_MEM_DEVICE, id, &mr);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            snprintf(text, sizeof(text), "%s", hvd_error_get());
            return hvd_tp_failf(
                hvd_vb_fail_with, tp, tp->rank, st, -1,
                "receiving %zu bytes from rank %d into CUDA device "
                "memory: %s",
                len, peer, text);
        }
    }
    start_req(tp, req, peer, len);
    seq = q->rx_seq++;
    q->rq[(q->rq_head + q->rq_count) % q->rq_cap] =
        (rxreq){.req = req,
                .buf = buf,
                .len = len,
                .seq = seq,
                .mr = mr,
                .dev = (uint8_t)dev,
                .upto = (uint8_t)upto};
    q->rq_count++;
    if (dev) {
        q->rtr_todo++;
        tp->ctr.dev_rx++;
    }
    if (q->rts_in == seq + 1) {
        /* The sender asked already: a host receive answers RING, a device
         * one its RTR. */
        q->rts_in = 0;
        if (!dev)
            q->ring_reply = seq + 1;
    }
    if (q->ring_reply != 0 || q->rtr_todo > 0)
        hvd_vb_rdv_progress(q); /* a failure completes the request with it */
    /* Data already here completes it now. */
    if (q->arr_count > 0)
        hvd_vb_match(q);
    /* After the peer's goodbye everything it sent is here: a receive that
     * is still waiting will never complete. */
    if (q->bye_rx && q->rq_count > 0 && tp->failure.status == HVD_OK)
        hvd_vb_on_bye(q);
    return HVD_OK;
}

hvd_status hvd_vb_irecv(hvd_transport *t, int peer, int channel, void *buf,
                        size_t len, hvd_req *req) {
    return post_recv(t, peer, channel, buf, len, req, 0);
}

/* The eager buffer or the ring's last chunk says where the message ends. */
hvd_status hvd_vb_irecv_upto(hvd_transport *t, int peer, int channel, void *buf,
                             size_t cap, hvd_req *req) {
    if (channel != HVD_CHANNEL_CONTROL)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "verbs: irecv_upto on channel %d (the control "
                             "channel only)",
                             channel);
    return post_recv(t, peer, channel, buf, cap, req, 1);
}
