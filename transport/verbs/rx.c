/* The verbs transport (verbs.h): receiving: matching arrivals to irecvs,
 * control messages, the receive completions. Calls tx.c (credits and the
 * rendezvous go back through the send side), fail.c and post.c. */

#include "transport/verbs/verbs_internal.h"

/* ------------------------------------------------------------------ */
/* Receiving                                                           */

/* Posts receive buffer idx of q again; a failure fails the transport. */
hvd_status hvd_vb_repost(vqp *q, uint32_t idx) {
    int err = hvd_vb_post_recv(q, idx);

    return err == 0 ? HVD_OK : hvd_vb_recv_failed(q, err);
}

static hvd_status mismatch(vqp *q, size_t sent, int more, size_t want,
                           int upto) {
    return hvd_vb_peer_failf(
        q, HVD_ERR_MISMATCH,
        "sent a message of %s%zu bytes where this rank expected %s%zu: ranks "
        "called collectives in different orders or with different counts",
        more ? "more than " : "", sent, upto ? "at most " : "", want);
}

/* The ranks disagree on the memory type of message r: it came the host
 * way (eager or through the ring) into a receive of device memory. */
static hvd_status memtype_mismatch_rx(vqp *q, const rxreq *r) {
    return hvd_vb_peer_failf(
        q, HVD_ERR_TRANSPORT,
        "sent message %llu of %zu bytes on the %s channel from "
        "host memory (through eager or ring buffers) while this rank "
        "(rank %d) receives it into CUDA device memory: the ranks "
        "disagree on the memory type of an operation",
        (unsigned long long)r->seq, r->len,
        q->ch == HVD_CHANNEL_DATA ? "data" : "control", q->tp->rank);
}

/* Hands arrived data to posted irecvs, in order. */
hvd_status hvd_vb_match(vqp *q) {
    vtp *tp = q->tp;
    hvd_status st;

    while (q->rq_count > 0 && q->arr_count > 0) {
        rxreq *r = &q->rq[q->rq_head];
        rxitem *it = &q->arr[q->arr_head];
        int complete;

        if (r->dev) {
            /* The HCA wrote it; the FIN says it is all there. */
            if (it->chunk != RX_FIN)
                return memtype_mismatch_rx(q, r);
            if (!r->rtr_sent ||
                it->idx != (hvd_vimm_fin(r->seq) & HVD_VIMM_TAG))
                return hvd_vb_protocol_error(q,
                                             "a rendezvous write finished for "
                                             "another message than the one "
                                             "this rank waits for");
            hvd_mr_put(tp->mrc, r->mr);
            r->mr = NULL;
            q->rtr_out--;
            tp->ctr.rdv_rx++;
            /* Before a kernel reads what the HCA wrote. */
            tp->seam->flush_rdma_writes(tp->gpu_device);
            complete = 1;
        } else if (it->chunk == RX_FIN) {
            return hvd_vb_protocol_error(q, "a rendezvous write arrived for a "
                                            "receive in host memory");
        } else if (it->chunk == RX_EAGER) {
            const uint8_t *b = q->rbufs + (size_t)it->idx * EAGER_BYTES;
            if (r->got != 0)
                return hvd_vb_protocol_error(
                    q, "an eager message arrived inside a "
                       "chunked one");
            if (r->upto ? it->len > r->len : it->len != r->len)
                return mismatch(q, it->len, 0, r->len, r->upto);
            if (r->upto)
                r->len = it->len;
            if (it->len > 0)
                memcpy(r->buf, b + HVD_VHDR_LEN, it->len);
            tp->ctr.eager_rx++;
            tp->ctr.cpu_bytes += it->len;
            hvd_vcredit_freed_eager(&q->cr);
            st = hvd_vb_repost(q, it->idx);
            if (st != HVD_OK)
                return st;
            complete = 1;
        } else {
            size_t got;
            hvd_vrx res =
                hvd_vrx_chunk(r->len, r->got, it->len, it->last, &got);
            if (res == HVD_VRX_TOO_LONG)
                return mismatch(q, got, !it->last, r->len, r->upto);
            if (res == HVD_VRX_TOO_SHORT && r->upto) {
                r->len = got; /* the last chunk: the message ends here */
                res = HVD_VRX_DONE;
            }
            if (res == HVD_VRX_TOO_SHORT)
                return mismatch(q, got, 0, r->len, 0);
            memcpy(r->buf + r->got, q->ring + (size_t)it->idx * q->slot_bytes,
                   it->len);
            tp->ctr.cpu_bytes += it->len;
            r->got = got;
            hvd_vcredit_freed_slot(&q->cr);
            complete = res == HVD_VRX_DONE;
            tp->ctr.ring_rx += complete;
        }
        q->arr_head = (q->arr_head + 1) % q->nrbufs;
        q->arr_count--;
        if (complete) {
            hvd_req *req = r->req;
            req->got = r->len;
            q->rq_head = (q->rq_head + 1) % q->rq_cap;
            q->rq_count--;
            req_done(tp, req, HVD_OK);
        }
    }
    if (q->rtr_todo > 0) {
        st = hvd_vb_rdv_progress(
            q); /* a device receive finished: the next RTR */
        if (st != HVD_OK)
            return st;
    }
    return hvd_vb_maybe_credit(q);
}

static hvd_status arrive(vqp *q, int chunk, uint32_t idx, uint32_t len,
                         int last) {
    rxitem *it;

    if (q->arr_count >= q->nrbufs)
        return hvd_vb_protocol_error(
            q, "more messages arrived than it had credits "
               "for");
    it = &q->arr[(q->arr_head + q->arr_count) % q->nrbufs];
    it->chunk = (uint8_t)chunk;
    it->idx = idx;
    it->len = len;
    it->last = (uint8_t)last;
    q->arr_count++;
    return HVD_OK;
}

hvd_status hvd_vb_on_bye(vqp *q) {
    q->bye_rx = 1;
    if (q->rq_count == 0 || q->tp->shutting_down)
        return HVD_OK;
    return hvd_vb_peer_failf(
        q, HVD_ERR_PEER_LOST,
        "called hvd_shutdown while this rank still expected data "
        "from it: ranks did not run the same collectives");
}

/* The sender learns that the receiver of message r->seq receives it into
 * device memory, after it had sent it from host memory. */
static hvd_status memtype_mismatch_tx(vqp *q, const hvd_vrdv *r) {
    return hvd_vb_peer_failf(
        q, HVD_ERR_TRANSPORT,
        "receives message %llu of %llu bytes on the %s channel "
        "into CUDA device memory, but this rank (rank %d) had "
        "already sent it from host memory: the ranks disagree on "
        "the memory type of an operation",
        (unsigned long long)r->seq, (unsigned long long)r->len,
        q->ch == HVD_CHANNEL_DATA ? "data" : "control", q->tp->rank);
}

/* RTR (at a sender), RTS and RING (RTS at a receiver, RING at a sender):
 * proto.h. */
static hvd_status on_rdv(vqp *q, uint8_t type, const hvd_vrdv *r) {
    vtp *tp = q->tp;

    if (!tp->gpudirect)
        return hvd_vb_protocol_error(q,
                                     "a rendezvous message, and GPUDirect RDMA "
                                     "is off");
    if (type == HVD_VMSG_RTR) {
        tp->ctr.rtr_rx++;
        if (r->seq < q->tx_begun)
            return memtype_mismatch_tx(q, r);
        if (q->nrtr >= HVD_VRTR_MAX || rtr_find(q, r->seq) != NULL)
            return hvd_vb_protocol_error(q,
                                         "more ready-to-receive messages than "
                                         "the protocol allows");
        q->rtr[q->nrtr++] = *r;
        return HVD_OK;
    }
    if (type == HVD_VMSG_RING) {
        const txmsg *m = q->sq_count > 0 ? &q->sq[q->sq_head] : NULL;
        if (m == NULL || m->seq != r->seq || !m->dev || !m->rts_sent)
            return hvd_vb_protocol_error(q, "a ring answer for a message this "
                                            "rank did not ask about");
        q->ring_ok = r->seq + 1;
        return HVD_OK;
    }
    /* RTS: the peer sends message r->seq from device memory. */
    if (r->seq < q->rx_seq) {
        uint64_t first = q->rx_seq - q->rq_count;
        const rxreq *x;
        if (r->seq < first)
            return hvd_vb_protocol_error(
                q, "a ready-to-send message for a message "
                   "already received");
        x = &q->rq[(q->rq_head + (size_t)(r->seq - first)) % q->rq_cap];
        /* A device receive answers with its RTR. */
        if (!x->dev) {
            if (q->ring_reply != 0)
                return hvd_vb_protocol_error(q, "two ready-to-send messages at "
                                                "once");
            q->ring_reply = r->seq + 1;
            return hvd_vb_rdv_progress(q);
        }
        return HVD_OK;
    }
    if (q->rts_in != 0)
        return hvd_vb_protocol_error(q, "two ready-to-send messages at once");
    q->rts_in = r->seq + 1; /* answered when the receive is posted */
    return HVD_OK;
}

hvd_status hvd_vb_recv_done(vqp *q, uint32_t idx, const struct ibv_wc *wc) {
    vtp *tp = q->tp;
    const uint8_t *b = q->rbufs + (size_t)idx * EAGER_BYTES;
    hvd_vhdr h;
    hvd_status st;

    tp->last_active[q->peer] = hvd_now_ns();
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        uint32_t imm = ntohl(wc->imm_data);
        uint32_t len = hvd_vimm_len(imm);
        char what[128];
        if (hvd_vimm_is_fin(imm)) {
            if (!tp->gpudirect)
                return hvd_vb_protocol_error(
                    q, "a rendezvous write, and GPUDirect "
                       "RDMA is off");
            st = arrive(q, RX_FIN, imm & HVD_VIMM_TAG, 0, 1);
            if (st == HVD_OK)
                st = hvd_vb_repost(q, idx);
            return st == HVD_OK ? hvd_vb_match(q) : st;
        }
        if (len == 0 || len > q->slot_bytes) {
            snprintf(what, sizeof(what),
                     "a chunk of %u bytes for slots of %u bytes", len,
                     q->slot_bytes);
            return hvd_vb_protocol_error(q, what);
        }
        st = arrive(q, RX_RING, (uint32_t)(q->rx_slot % q->slots), len,
                    hvd_vimm_last(imm));
        q->rx_slot++;
        if (st == HVD_OK)
            st = hvd_vb_repost(q, idx); /* the write used no eager buffer */
        return st == HVD_OK ? hvd_vb_match(q) : st;
    }
    if (wc->opcode != IBV_WC_RECV)
        return hvd_vb_protocol_error(q, "a completion of an unexpected kind");
    if (hvd_vhdr_decode(b, wc->byte_len, &h) != HVD_OK) {
        char what[256];
        snprintf(what, sizeof(what), "%s", hvd_error_get());
        return hvd_vb_protocol_error(q, what);
    }
    if (hvd_vcredit_grant(&q->cr, h.eager_ret, h.slot_ret) != 0)
        return hvd_vb_protocol_error(q, "it returned more credits than it had");
    switch (h.type) {
    case HVD_VMSG_DATA:
        st = arrive(q, RX_EAGER, idx, h.len, 1);
        return st == HVD_OK ? hvd_vb_match(q) : st;
    case HVD_VMSG_RTR:
    case HVD_VMSG_RTS:
    case HVD_VMSG_RING: {
        hvd_vrdv r;
        hvd_vrdv_decode(b + HVD_VHDR_LEN, &r);
        st = on_rdv(q, h.type, &r);
        if (st != HVD_OK)
            return st;
        break;
    }
    case HVD_VMSG_ABORT: {
        hvd_vabort a;
        if (hvd_vabort_decode(b + HVD_VHDR_LEN, h.len, &a) != HVD_OK)
            return hvd_vb_protocol_error(q, "a truncated ABORT notice");
        /* Relayed as the origin said it (hvd_tp_failure_set names it). */
        return hvd_vb_fail_with(tp, (hvd_status)a.status, a.culprit, a.origin,
                                a.text);
    }
    case HVD_VMSG_HELLO:
        q->hello_rx = 1;
        break;
    case HVD_VMSG_BYE:
        st = hvd_vb_on_bye(q);
        if (st != HVD_OK)
            return st;
        break;
    default: /* CREDIT, HEARTBEAT */
        break;
    }
    return hvd_vb_repost(q, idx);
}
