/* The verbs transport (verbs.h): sending: eager buffers, chunks through the
 * peer's ring, rendezvous writes, credits and what the rendezvous owes the
 * peer. Calls fail.c and post.c only. */

#include "transport/verbs/verbs_internal.h"

/* ------------------------------------------------------------------ */
/* Sending                                                             */

static int stage_take(vtp *tp) {
    return tp->nstage_free > 0 ? tp->stage_free[--tp->nstage_free] : -1;
}

/* A CREDIT message when enough freed buffers wait to go back. */
hvd_status hvd_vb_maybe_credit(vqp *q) {
    int err;

    if (q->bye_rx || q->tp->failure.status != HVD_OK ||
        !hvd_vcredit_due(&q->cr))
        return HVD_OK;
    err = hvd_vb_post_ctl(q, HVD_VMSG_CREDIT, NULL, 0);
    if (err <= 1)
        return HVD_OK; /* posted, or later when a buffer frees */
    return hvd_vb_post_failed(q, "credit message", err);
}

/* Posts the eager message m if a credit, a send buffer and a work request
 * are free. Returns 1 if posted. */
static int send_eager(vqp *q, txmsg *m, hvd_status *st) {
    vtp *tp = q->tp;
    hvd_vhdr h = {.type = HVD_VMSG_DATA, .len = (uint32_t)m->len};
    wrctx ctx = {.stage = -1, .kind = WR_EAGER, .sbuf = 1};
    int err;

    if (q->cr.eager == 0 || sb_free(q) <= SEND_RESERVE || wr_free(q) < 1)
        return 0;
    hvd_vcredit_take_eager(&q->cr);
    hvd_vcredit_collect(&q->cr, &h.eager_ret, &h.slot_ret);
    tp->ctr.eager_tx++;
    tp->ctr.cpu_bytes += m->len;
    err = hvd_vb_post_sbuf(q, &h, m->buf, m->len, &ctx);
    if (err != 0) {
        *st = hvd_vb_post_failed(q, "eager message", err);
        return 0;
    }
    /* The payload is copied: the caller's buffer is free again. */
    req_done(tp, m->req, HVD_OK);
    return 1;
}

/* Finds where m is sent from: its registered region, or none (staging).
 * Device memory is always registered (the CPU cannot stage it); a
 * failure there fails the transport. */
static hvd_status source_mr(vqp *q, txmsg *m) {
    vtp *tp = q->tp;

    m->tried_mr = 1;
    if (m->dev) {
        hvd_status st = hvd_mr_get_id(tp->mrc, m->buf, m->len, HVD_MEM_DEVICE,
                                      m->bufid, &m->mr);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            m->mr = NULL;
            snprintf(text, sizeof(text), "%s", hvd_error_get());
            return hvd_tp_failf(
                hvd_vb_fail_with, tp, tp->rank, st, -1,
                "sending %zu bytes of CUDA device memory to rank %d: "
                "%s",
                m->len, q->peer, text);
        }
        return HVD_OK;
    }
    /* From the caller's memory where it is registered (explicitly, or by an
     * earlier send) or may be registered now; else staged. */
    if (!hvd_mr_find_host(tp->mrc, m->buf, m->len, &m->mr) && tp->auto_reg &&
        hvd_mr_get(tp->mrc, m->buf, m->len, HVD_MEM_HOST, &m->mr) != HVD_OK) {
        m->mr = NULL;
        if (!tp->mr_warned)
            HVD_WARN("verbs",
                     "%s; sending through registered staging buffers "
                     "instead",
                     hvd_error_get());
        tp->mr_warned = 1;
    }
    return HVD_OK;
}

/* Posts as many chunk writes of m as credits, work requests and staging
 * allow: into the peer's ring, or for a rendezvous (m->rdv) straight into
 * the receiver's buffer, plain writes with the last one WITH IMMEDIATE
 * (the FIN). Returns 1 once the last chunk is posted. */
static int send_chunks(vqp *q, txmsg *m, hvd_status *st) {
    vtp *tp = q->tp;

    if (!m->tried_mr && (*st = source_mr(q, m)) != HVD_OK)
        return 0;
    while (m->off < m->len) {
        size_t chunk = q->rslot_bytes, n;
        int last, stage = -1, err;
        struct ibv_sge sge;
        struct ibv_send_wr wr;
        wrctx ctx = {.stage = -1, .kind = m->rdv ? WR_RDV : WR_CHUNK};

        if (m->rdv && m->mr != NULL && chunk < RDV_CHUNK_MIN)
            chunk = RDV_CHUNK_MIN;
        if (m->mr == NULL && chunk > tp->stage_bytes)
            chunk = tp->stage_bytes;
        if ((!m->rdv && q->cr.slots == 0) || wr_free(q) < 1)
            return 0;
        if (m->mr == NULL && (stage = stage_take(tp)) < 0)
            return 0;
        if (!m->rdv)
            hvd_vcredit_take_slot(&q->cr);
        hvd_vchunk_next(m->len, m->off, chunk, &n, &last);
        if (stage >= 0) {
            uint8_t *s = tp->stage + (size_t)stage * tp->stage_bytes;
            memcpy(s, m->buf + m->off, n);
            tp->ctr.staged_tx++;
            tp->ctr.cpu_bytes += n;
            sge = (struct ibv_sge){.addr = (uintptr_t)s,
                                   .length = (uint32_t)n,
                                   .lkey = tp->mem_mr->lkey};
        } else {
            sge = (struct ibv_sge){.addr = (uintptr_t)(m->buf + m->off),
                                   .length = (uint32_t)n,
                                   .lkey = m->mr->mr->lkey};
        }
        memset(&wr, 0, sizeof(wr));
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (m->rdv) {
            wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
            if (last)
                wr.imm_data = htonl(hvd_vimm_fin(m->seq));
            wr.wr.rdma.remote_addr = m->raddr + m->off;
            wr.wr.rdma.rkey = m->rkey;
        } else {
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(hvd_vimm((uint32_t)n, last));
            wr.wr.rdma.remote_addr =
                q->rring + (q->tx_slot % q->rslots) * (uint64_t)q->rslot_bytes;
            wr.wr.rdma.rkey = q->rkey;
        }
        ctx.stage = stage;
        if (last) {
            ctx.req = m->req;
            ctx.mr = m->mr;
        }
        err = hvd_vb_post_wr(q, &wr, &ctx);
        if (err != 0) {
            if (stage >= 0)
                tp->stage_free[tp->nstage_free++] = stage;
            *st = hvd_vb_post_failed(
                q, m->rdv ? "rendezvous write" : "chunk write", err);
            return 0;
        }
        if (!m->rdv)
            q->tx_slot++;
        m->off += n;
        if (last) {
            m->mr = NULL; /* now the work request's */
            if (m->rdv)
                tp->ctr.rdv_tx++;
            else
                tp->ctr.ring_tx++;
            if (m->dev && !m->rdv)
                tp->ctr.ring_dev_tx++;
        }
    }
    return 1;
}

/* Posts a rendezvous control message (RTR, RTS, RING) as post_ctl. */
static int post_rdv(vqp *q, uint8_t type, const hvd_vrdv *r) {
    uint8_t payload[HVD_VRDV_LEN];

    hvd_vrdv_encode(r, payload);
    return hvd_vb_post_ctl(q, type, payload, sizeof(payload));
}

/* Sends what the rendezvous owes the peer: a RING answer, then the RTRs
 * of device receives in order, while fewer than HVD_VRTR_MAX are
 * outstanding. What finds no send buffer goes later. */
hvd_status hvd_vb_rdv_progress(vqp *q) {
    vtp *tp = q->tp;
    int err;

    if (q->ring_reply != 0) {
        hvd_vrdv r = {.seq = q->ring_reply - 1};
        err = post_rdv(q, HVD_VMSG_RING, &r);
        if (err == 1)
            return HVD_OK;
        if (err != 0)
            return hvd_vb_post_failed(q, "ring answer", err);
        q->ring_reply = 0;
    }
    for (size_t k = 0;
         k < q->rq_count && q->rtr_todo > 0 && q->rtr_out < HVD_VRTR_MAX; k++) {
        rxreq *x = &q->rq[(q->rq_head + k) % q->rq_cap];
        hvd_vrdv r;
        if (!x->dev || x->rtr_sent)
            continue;
        r = (hvd_vrdv){.seq = x->seq,
                       .addr = (uintptr_t)x->buf,
                       .len = x->len,
                       .rkey = x->mr->mr->rkey};
        err = post_rdv(q, HVD_VMSG_RTR, &r);
        if (err == 1)
            break;
        if (err != 0)
            return hvd_vb_post_failed(q, "ready-to-receive message", err);
        x->rtr_sent = 1;
        q->rtr_todo--;
        q->rtr_out++;
        tp->ctr.rtr_tx++;
    }
    return HVD_OK;
}

/* m goes into the buffer r offers. */
static hvd_status start_rdv(vqp *q, txmsg *m, hvd_vrdv *r) {
    if (r->len != m->len) {
        return hvd_vb_peer_failf(
            q, HVD_ERR_MISMATCH,
            "expects a message of %llu bytes where this rank (rank %d) sends "
            "%zu: ranks called collectives in different orders or with "
            "different counts",
            (unsigned long long)r->len, q->tp->rank, m->len);
    }
    m->rdv = 1;
    m->raddr = r->addr;
    m->rkey = r->rkey;
    *r = q->rtr[--q->nrtr];
    return HVD_OK;
}

/* A device message at the head of the send queue with no RTR: asks the
 * peer where it goes (once) and waits for its RTR or RING. */
static hvd_status ask_rdv(vqp *q, txmsg *m) {
    hvd_vrdv r = {.seq = m->seq, .len = m->len};
    int err;

    if (m->rts_sent)
        return HVD_OK;
    err = post_rdv(q, HVD_VMSG_RTS, &r);
    if (err > 1)
        return hvd_vb_post_failed(q, "ready-to-send message", err);
    if (err == 0) {
        m->rts_sent = 1;
        q->tp->ctr.rts_tx++;
    }
    return HVD_OK;
}

/* Starts what the send queue of q can start now. */
hvd_status hvd_vb_tx_progress(vqp *q) {
    vtp *tp = q->tp;
    hvd_status st = HVD_OK;

    if (tp->gpudirect && (q->ring_reply != 0 || q->rtr_todo > 0)) {
        st = hvd_vb_rdv_progress(q);
        if (st != HVD_OK)
            return st;
    }
    while (q->sq_count > 0 && tp->failure.status == HVD_OK) {
        txmsg *m = &q->sq[q->sq_head];
        hvd_vrdv *r;
        int posted;

        /* An RTR for a message not started yet: into the receiver's
         * buffer, from whatever memory. */
        if (!m->rdv && m->off == 0 && q->nrtr > 0 &&
            (r = rtr_find(q, m->seq)) != NULL) {
            st = start_rdv(q, m, r);
            if (st != HVD_OK)
                return st;
        }
        if (m->rdv)
            posted = send_chunks(q, m, &st);
        else if (m->dev && q->ring_ok == m->seq + 1)
            posted = send_chunks(q, m, &st); /* into the ring, never eager */
        else if (m->dev) {
            st = ask_rdv(q, m);
            posted = 0;
        } else
            posted = hvd_veager(m->len, q->reager_bytes)
                         ? send_eager(q, m, &st)
                         : send_chunks(q, m, &st);
        if (st != HVD_OK)
            return st;
        if (posted || m->off > 0)
            q->tx_begun = m->seq + 1;
        if (!posted)
            break;
        q->sq_head = (q->sq_head + 1) % q->sq_cap;
        q->sq_count--;
    }
    return tp->failure.status == HVD_OK ? hvd_vb_maybe_credit(q)
                                        : tp->failure.status;
}
