/* The verbs transport (verbs.h): posting work requests: a send with its
 * context, a send buffer, a control message, a receive buffer. The bottom
 * of the folder: it calls no other file of it, and reports errors as the
 * errno of libibverbs for its callers to turn into a failure. */

#include "transport/verbs/verbs_internal.h"

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

/* Posts eager buffer idx of q as a receive. Returns the errno of
 * ibv_post_recv (0: posted). */
int hvd_vb_post_recv(vqp *q, uint32_t idx) {
    vtp *tp = q->tp;
    struct ibv_sge sge = {.addr =
                              (uintptr_t)(q->rbufs + (size_t)idx * EAGER_BYTES),
                          .length = EAGER_BYTES,
                          .lkey = tp->mem_mr->lkey};
    struct ibv_recv_wr wr = {
        .wr_id = RECV_ID(q->index, idx), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad = NULL;

    return tp->seam->post_recv(q->qp, &wr, &bad);
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
