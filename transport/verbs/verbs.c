/* The verbs transport (verbs.h): failures and control messages, heartbeats and
 * stalls, isend and irecv, goodbye, and the ops table. */

#include "transport/verbs/verbs_internal.h"

/* ------------------------------------------------------------------ */
/* Failure                                                             */

void hvd_vb_describe(const vtp *tp, int peer, char *out, size_t outlen) {
    int known =
        peer >= 0 && peer < tp->size && tp->hosts != NULL && tp->pids != NULL;

    hvd_tp_describe(out, outlen, peer, tp->size, known ? tp->hosts[peer] : NULL,
                    known ? tp->pids[peer] : -1);
}

/* Posts one signaled send work request with its context. Returns the
 * errno of ibv_post_send (0: posted). */
int hvd_vb_post_wr(vqp *q, struct ibv_send_wr *wr, const wrctx *ctx) {
    struct ibv_send_wr *bad = NULL;
    int err;

    q->wr[q->wr_posted % q->wr_cap] = *ctx;
    wr->wr_id = SEND_ID(q->index, q->wr_posted);
    wr->send_flags |= IBV_SEND_SIGNALED;
    wr->next = NULL;
    err = q->tp->seam->post_send(q->qp, wr, &bad);
    if (err == 0)
        q->wr_posted++;
    return err;
}

/* Sends header h and plen bytes of payload from q's next send buffer (the
 * caller has checked that one and a work request are free). Returns the
 * errno of ibv_post_send (0: posted); on failure the buffer is free
 * again. */
int hvd_vb_post_sbuf(vqp *q, const hvd_vhdr *h, const void *payload,
                     size_t plen, const wrctx *ctx) {
    uint8_t *b = sb_take(q);
    struct ibv_sge sge = {.addr = (uintptr_t)b,
                          .length = (uint32_t)(HVD_VHDR_LEN + plen),
                          .lkey = q->tp->mem_mr->lkey};
    struct ibv_send_wr wr;
    int err;

    hvd_vhdr_encode(h, b);
    if (plen > 0)
        memcpy(b + HVD_VHDR_LEN, payload, plen);
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    err = hvd_vb_post_wr(q, &wr, ctx);
    if (err != 0)
        q->sb_used--;
    return err;
}

/* Posts a control message (header and payload) on q if a send buffer and
 * a work request are free. Returns 0 if posted, 1 if not now, else the
 * errno of ibv_post_send. */
int hvd_vb_post_ctl(vqp *q, uint8_t type, const uint8_t *payload, size_t plen) {
    hvd_vhdr h = {.type = type, .len = (uint32_t)plen};
    wrctx ctx = {.stage = -1, .kind = WR_CTL, .type = type, .sbuf = 1};
    int err;

    if (sb_free(q) < 1 || wr_free(q) < 1 || q->qp == NULL)
        return 1;
    if (type != HVD_VMSG_ABORT)
        hvd_vcredit_collect(&q->cr, &h.eager_ret, &h.slot_ret);
    err = hvd_vb_post_sbuf(q, &h, payload, plen, &ctx);
    if (err != 0) {
        /* The credits taken for the header were not sent. */
        q->cr.eager_ret += h.eager_ret;
        q->cr.slot_ret += h.slot_ret;
    }
    return err;
}

const char *hvd_vb_ctl_name(uint8_t type) {
    switch (type) {
    case HVD_VMSG_CREDIT:
        return "credit message";
    case HVD_VMSG_HEARTBEAT:
        return "heartbeat";
    case HVD_VMSG_BYE:
        return "goodbye";
    case HVD_VMSG_HELLO:
        return "hello";
    case HVD_VMSG_ABORT:
        return "abort notice";
    case HVD_VMSG_RTR:
        return "ready-to-receive message";
    case HVD_VMSG_RTS:
        return "ready-to-send message";
    case HVD_VMSG_RING:
        return "ring answer";
    default:
        return "message";
    }
}

/* Drains the completion queue for up to ABORT_NS so that the ABORT
 * notices posted by fail_with leave before the queue pairs are torn down.
 * Nothing else is processed: the transport has failed. */
static void flush_aborts(vtp *tp) {
    int64_t deadline = hvd_now_ns() + ABORT_NS;
    int left = 0;

    for (int i = 0; i < tp->size * 2; i++)
        left += tp->qps[i].abort_out;
    while (left > 0 && hvd_now_ns() < deadline) {
        struct ibv_wc wc[POLL_BATCH];
        int n = tp->seam->poll_cq(tp->cq, POLL_BATCH, wc);
        if (n < 0)
            break;
        for (int i = 0; i < n; i++) {
            uint32_t qi = (uint32_t)(wc[i].wr_id >> 32);
            if ((wc[i].wr_id & RECV_BIT) || qi >= (uint32_t)tp->size * 2)
                continue;
            vqp *q = &tp->qps[qi];
            wrctx *c = &q->wr[(wc[i].wr_id & 0x7fffffffu) % q->wr_cap];
            if (c->kind == WR_CTL && c->type == HVD_VMSG_ABORT &&
                q->abort_out) {
                q->abort_out = 0;
                left--;
            }
        }
        if (n == 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

/*
 * Makes the transport fail for good: every request in flight completes
 * with status, every later call returns it, every peer is told (an ABORT
 * notice, best effort) so that all ranks report the same cause, and the
 * queue pairs go to the error state so that the HCA touches no user
 * buffer any more.
 */
hvd_status hvd_vb_fail_with(void *arg, hvd_status status, int culprit,
                            int origin, const char *text) {
    vtp *tp = arg;

    if (!hvd_tp_failure_set(&tp->failure, "verbs", status, tp->rank, origin,
                            text))
        return hvd_tp_failure_error(&tp->failure);

    for (int i = 0; i < tp->size * 2; i++) {
        vqp *q = &tp->qps[i];
        if (q->qp == NULL)
            continue;
        for (size_t k = 0; k < q->sq_count; k++) {
            txmsg *m = &q->sq[(q->sq_head + k) % q->sq_cap];
            if (m->mr != NULL)
                hvd_mr_put(tp->mrc, m->mr);
            req_done(tp, m->req, status);
        }
        q->sq_count = 0;
        for (uint64_t s = q->wr_done; s < q->wr_posted; s++) {
            wrctx *c = &q->wr[s % q->wr_cap];
            if (c->req != NULL)
                req_done(tp, c->req, status);
            c->req = NULL;
        }
        for (size_t k = 0; k < q->rq_count; k++) {
            rxreq *r = &q->rq[(q->rq_head + k) % q->rq_cap];
            if (r->mr != NULL)
                hvd_mr_put(tp->mrc, r->mr);
            req_done(tp, r->req, status);
        }
        q->rq_count = 0;
    }

    if (!tp->shutting_down && !tp->opening) {
        hvd_vabort a = {.status = status, .culprit = culprit, .origin = origin};
        uint8_t payload[EAGER_BYTES - HVD_VHDR_LEN];
        size_t plen;

        snprintf(a.text, sizeof(a.text), "%s", text);
        plen = hvd_vabort_encode(&a, payload, sizeof(payload));
        for (int p = 0; p < tp->size; p++) {
            vqp *q = &tp->qps[p * 2 + HVD_CHANNEL_DATA];
            if (p == tp->rank || p == origin || q->qp == NULL || q->bye_rx)
                continue;
            if (hvd_vb_post_ctl(q, HVD_VMSG_ABORT, payload, plen) == 0)
                q->abort_out = 1;
        }
        flush_aborts(tp);
    }
    for (int i = 0; i < tp->size * 2; i++) {
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        if (tp->qps[i].qp != NULL)
            tp->seam->modify_qp(tp->qps[i].qp, &attr, IBV_QP_STATE);
    }
    return hvd_tp_failure_error(&tp->failure);
}

hvd_status hvd_vb_peer_failf(vqp *q, hvd_status status, const char *fmt, ...) {
    char who[160], text[HVD_ERROR_MAX];
    va_list ap;

    hvd_vb_describe(q->tp, q->peer, who, sizeof(who));
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    return hvd_tp_failf(hvd_vb_fail_with, q->tp, q->tp->rank, status, q->peer,
                        "%s %s", who, text);
}

hvd_status hvd_vb_protocol_error(vqp *q, const char *what) {
    char who[160];

    hvd_vb_describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(hvd_vb_fail_with, q->tp, q->tp->rank, HVD_ERR_PROTOCOL,
                        q->peer, "protocol error from %s on the %s channel: %s",
                        who, q->ch == HVD_CHANNEL_DATA ? "data" : "control",
                        what);
}

hvd_status hvd_vb_repost(vqp *q, uint32_t idx) {
    vtp *tp = q->tp;
    struct ibv_sge sge = {.addr =
                              (uintptr_t)(q->rbufs + (size_t)idx * EAGER_BYTES),
                          .length = EAGER_BYTES,
                          .lkey = tp->mem_mr->lkey};
    struct ibv_recv_wr wr = {
        .wr_id = RECV_ID(q->index, idx), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad = NULL;
    int err = tp->seam->post_recv(q->qp, &wr, &bad);

    if (err != 0) {
        char who[160];
        hvd_vb_describe(tp, q->peer, who, sizeof(who));
        return hvd_tp_failf(hvd_vb_fail_with, tp, tp->rank, HVD_ERR_TRANSPORT,
                            -1,
                            "ibv_post_recv on the queue pair to %s failed: %s",
                            who, strerror(err));
    }
    return HVD_OK;
}

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

static hvd_status vb_progress(hvd_transport *t, int timeout_ms) {
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

static void vb_wake(hvd_transport *t) {
    vtp *tp = (vtp *)t;
    uint64_t one = 1;

    if (tp->wakefd >= 0) {
        ssize_t ignored = write(tp->wakefd, &one, sizeof(one));
        (void)ignored;
    }
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */

/*
 * Checks a request's peer and channel. A send to a peer that has said
 * goodbye can never be received; a receive may still be, from what
 * arrived before the goodbye (vb_irecv checks that after matching).
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

static hvd_status vb_isend(hvd_transport *t, int peer, int channel,
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

static hvd_status vb_irecv(hvd_transport *t, int peer, int channel, void *buf,
                           size_t len, hvd_req *req) {
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
    dev = on_device(tp, channel, buf, len, &id);
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
    q->rq[(q->rq_head + q->rq_count) % q->rq_cap] = (rxreq){
        .req = req, .buf = buf, .len = len, .seq = seq, .mr = mr, .dev = dev};
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

/* ------------------------------------------------------------------ */
/* Goodbye                                                             */

static hvd_status vb_shutdown(hvd_transport *t) {
    vtp *tp = (vtp *)t;
    int64_t deadline =
        hvd_now_ns() +
        (tp->timeout_ns < SHUTDOWN_NS ? tp->timeout_ns : SHUTDOWN_NS);

    if (tp->failure.status != HVD_OK)
        return HVD_OK;
    tp->shutting_down = 1;
    while (hvd_now_ns() < deadline && tp->failure.status == HVD_OK) {
        int open_qps = 0;
        for (int i = 0; i < tp->size * 2; i++) {
            vqp *q = &tp->qps[i];
            if (q->qp == NULL)
                continue;
            if (!q->bye_tx) {
                int err = hvd_vb_post_ctl(q, HVD_VMSG_BYE, NULL, 0);
                if (err == 0)
                    q->bye_tx = 1;
                else if (err > 1)
                    break;
            }
            /* Done with a pair once the peer said goodbye and ours has
             * been acknowledged. */
            if (!q->bye_tx || !q->bye_rx || q->wr_done < q->wr_posted)
                open_qps++;
        }
        if (open_qps == 0)
            return HVD_OK;
        if (hvd_vb_drain(tp) == 0)
            hvd_vb_wait_events(tp, 100);
    }
    HVD_DEBUG("verbs", "not every peer said goodbye in time");
    return HVD_OK;
}

const hvd_transport_ops hvd_verbs_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "verbs",
    .title = "RDMA",
    .settings = hvd_verbs_settings_table,
    .nsettings = HVD_VERBS_NSETTINGS,
    .settings_size = sizeof(hvd_verbs_settings),
    .probe = hvd_vb_probe,
    .open = hvd_vb_open,
    .isend = vb_isend,
    .irecv = vb_irecv,
    .progress = vb_progress,
    .wake = vb_wake,
    .shutdown = vb_shutdown,
    .close = hvd_vb_close,
    .mem_types = hvd_vb_mem_types,
};
