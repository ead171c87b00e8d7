/* The verbs transport (verbs.h): failure. The first failure wins: every
 * request in flight completes with it, every peer is told (an ABORT
 * notice), the queue pairs stop. Every file of the folder may call this
 * one; it calls only post.c (the ABORT notices) and the registration
 * cache. */

#include "transport/verbs/verbs_internal.h"

void hvd_vb_describe(const vtp *tp, int peer, char *out, size_t outlen) {
    int known =
        peer >= 0 && peer < tp->size && tp->hosts != NULL && tp->pids != NULL;

    hvd_tp_describe(out, outlen, peer, tp->size, known ? tp->hosts[peer] : NULL,
                    known ? tp->pids[peer] : -1);
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

/* Fails the transport after ibv_post_send(what) on q returned err. */
hvd_status hvd_vb_post_failed(vqp *q, const char *what, int err) {
    char who[160];

    hvd_vb_describe(q->tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(hvd_vb_fail_with, q->tp, q->tp->rank, HVD_ERR_TRANSPORT,
                        -1, "ibv_post_send(%s) to %s failed: %s", what, who,
                        strerror(err));
}

/* Fails the transport after ibv_post_recv of a receive buffer of q
 * returned err. */
hvd_status hvd_vb_recv_failed(vqp *q, int err) {
    vtp *tp = q->tp;
    char who[160];

    hvd_vb_describe(tp, q->peer, who, sizeof(who));
    return hvd_tp_failf(hvd_vb_fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, -1,
                        "ibv_post_recv on the queue pair to %s failed: %s", who,
                        strerror(err));
}
