/* The verbs transport (verbs.h): send completions, failed work completions,
 * draining the completion queue and waiting on it. Hands receive
 * completions to rx.c and what freed send resources to tx.c; calls fail.c
 * and post.c. */

#include "transport/verbs/verbs_internal.h"

/* ------------------------------------------------------------------ */
/* Completions                                                         */

static const char *wr_what(const wrctx *c) {
    switch (c->kind) {
    case WR_EAGER:
        return "eager send";
    case WR_CHUNK:
        return "chunk write";
    case WR_RDV:
        return "rendezvous write";
    default:
        return hvd_vb_ctl_name(c->type);
    }
}

/* 1 if a send work request of q still carries a request. */
static int wr_carries_req(const vqp *q) {
    for (uint64_t s = q->wr_done; s < q->wr_posted; s++)
        if (q->wr[s % q->wr_cap].req != NULL)
            return 1;
    return 0;
}

/* Notes a failed work completion; the drain decides after it has looked
 * for an ABORT notice that explains it. Returns 1 if the failure is
 * harmless: the peer said goodbye and nothing is owed to or from it, so
 * it may have torn its queue pairs down under our last control messages. */
static int wc_error(vqp *q, const struct ibv_wc *wc) {
    vtp *tp = q->tp;
    char who[160], what[64];
    hvd_status status;

    if (tp->err_pending || tp->failure.status != HVD_OK)
        return 0;
    if ((q->bye_rx || tp->shutting_down) && q->rq_count == 0 &&
        q->sq_count == 0 && !wr_carries_req(q))
        return 1;
    if (wc->wr_id & RECV_BIT)
        snprintf(what, sizeof(what), "receive");
    else
        snprintf(what, sizeof(what), "%s",
                 wr_what(&q->wr[(wc->wr_id & 0x7fffffffu) % q->wr_cap]));
    hvd_vb_describe(tp, q->peer, who, sizeof(who));
    switch (wc->status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        status = HVD_ERR_PEER_LOST;
        snprintf(tp->err_text, sizeof(tp->err_text),
                 "lost %s: RDMA %s on the %s channel failed: %s (vendor error "
                 "%#x; the process died, was killed, exited without "
                 "hvd_shutdown, or its link went down)",
                 who, what, q->ch == HVD_CHANNEL_DATA ? "data" : "control",
                 ibv_wc_status_str(wc->status), wc->vendor_err);
        break;
    default:
        status = HVD_ERR_TRANSPORT;
        snprintf(tp->err_text, sizeof(tp->err_text),
                 "RDMA %s with %s on the %s channel failed: %s (vendor error "
                 "%#x)",
                 what, who, q->ch == HVD_CHANNEL_DATA ? "data" : "control",
                 ibv_wc_status_str(wc->status), wc->vendor_err);
        break;
    }
    tp->err_pending = 1;
    tp->err_status = status;
    tp->err_peer = q->peer;
    return 0;
}

static hvd_status send_done(vqp *q, const struct ibv_wc *wc) {
    vtp *tp = q->tp;
    wrctx *c;

    if ((wc->wr_id & 0x7fffffffu) != (q->wr_done & 0x7fffffffu) ||
        q->wr_done == q->wr_posted)
        return hvd_tp_failf(
            hvd_vb_fail_with, tp, tp->rank, HVD_ERR_INTERNAL, -1,
            "verbs: send completion %llu out of order (expected %llu)",
            (unsigned long long)(wc->wr_id & 0x7fffffffu),
            (unsigned long long)(q->wr_done & 0x7fffffffu));
    c = &q->wr[q->wr_done % q->wr_cap];
    q->wr_done++;
    if (c->sbuf) {
        q->sb_first = (q->sb_first + 1) % SEND_BUFS;
        q->sb_used--;
    }
    if (c->stage >= 0)
        tp->stage_free[tp->nstage_free++] = c->stage;
    if (c->mr != NULL)
        hvd_mr_put(tp->mrc, c->mr);
    if (c->req != NULL)
        req_done(tp, c->req, HVD_OK);
    if (c->kind == WR_CTL) {
        if (c->type == HVD_VMSG_HEARTBEAT)
            q->hb_out = 0;
        else if (c->type == HVD_VMSG_HELLO)
            q->hello_done = 1;
        else if (c->type == HVD_VMSG_ABORT)
            q->abort_out = 0;
    }
    *c = (wrctx){.stage = -1};
    return HVD_OK;
}

static hvd_status handle(vtp *tp, const struct ibv_wc *wc) {
    uint32_t qi = (uint32_t)(wc->wr_id >> 32);
    vqp *q;

    if (qi >= (uint32_t)tp->size * 2 || tp->qps[qi].qp == NULL)
        return hvd_tp_failf(hvd_vb_fail_with, tp, tp->rank, HVD_ERR_INTERNAL,
                            -1, "verbs: completion for unknown queue pair %u",
                            qi);
    q = &tp->qps[qi];
    if (wc->status != IBV_WC_SUCCESS) {
        /* A harmless failure releases the send's buffers; a real one
         * leaves its request to fail_with. */
        if (wc_error(q, wc) && !(wc->wr_id & RECV_BIT))
            return send_done(q, wc);
        return HVD_OK;
    }
    if (wc->wr_id & RECV_BIT)
        return hvd_vb_recv_done(
            q, (uint32_t)(wc->wr_id & ~(uint64_t)RECV_BIT & 0xffffffffu), wc);
    return send_done(q, wc);
}

/* Processes what the completion queue holds; returns the number of
 * completions (or -1 once failed). */
int hvd_vb_drain(vtp *tp) {
    struct ibv_wc wc[POLL_BATCH];
    int total = 0;

    for (int round = 0; round < DRAIN_ROUNDS && tp->failure.status == HVD_OK;
         round++) {
        int n = tp->seam->poll_cq(tp->cq, POLL_BATCH, wc);
        if (n < 0) {
            hvd_tp_failf(hvd_vb_fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                         "ibv_poll_cq failed");
            break;
        }
        for (int i = 0; i < n && tp->failure.status == HVD_OK; i++)
            handle(tp, &wc[i]);
        total += n;
        if (n < POLL_BATCH)
            break;
    }
    if (tp->failure.status == HVD_OK && tp->err_pending) {
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", tp->err_text);
        hvd_tp_failf(hvd_vb_fail_with, tp, tp->rank, tp->err_status,
                     tp->err_peer, "%s", text);
    }
    if (tp->failure.status != HVD_OK)
        return -1;
    if (total > 0) {
        /* Credits, send buffers or staging chunks may have freed. */
        for (int i = 0; i < tp->size * 2 && tp->failure.status == HVD_OK; i++) {
            vqp *q = &tp->qps[i];
            if (q->qp != NULL && (q->sq_count > 0 || hvd_vcredit_due(&q->cr) ||
                                  q->ring_reply != 0 || q->rtr_todo > 0))
                hvd_vb_tx_progress(q);
        }
    }
    return tp->failure.status == HVD_OK ? total : -1;
}

/*
 * Sleeps until the completion queue has something, wake is called, or
 * timeout_ms passes (-1: no limit). Arms the completion channel first and
 * drains once more, so that a completion between the last drain and the
 * arming is not slept through. Returns 1 if woken by wake or if that
 * drain moved something (or failed), 0 otherwise.
 */
int hvd_vb_wait_events(vtp *tp, int timeout_ms) {
    struct pollfd pfd[2];
    int woke = 0;

    if (!tp->armed) {
        if (tp->seam->req_notify_cq(tp->cq) != 0) {
            hvd_tp_failf(hvd_vb_fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                         "ibv_req_notify_cq failed");
            return 1;
        }
        tp->armed = 1;
        if (hvd_vb_drain(tp) != 0)
            return 1;
    }
    pfd[0] = (struct pollfd){.fd = tp->chan->fd, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = tp->wakefd, .events = POLLIN};
    if (poll(pfd, 2, timeout_ms) <= 0)
        return 0;
    if (pfd[0].revents & POLLIN) {
        struct ibv_cq *cq;
        if (tp->seam->get_cq_event(tp->chan, &cq) == 0) {
            tp->seam->ack_cq_events(cq, 1);
            tp->armed = 0;
        }
    }
    if (pfd[1].revents & POLLIN) {
        uint64_t count;
        ssize_t ignored = read(tp->wakefd, &count, sizeof(count));
        (void)ignored;
        woke = 1;
    }
    return woke;
}
