/* The verbs transport (verbs.h): the local side of open: buffers, rings,
 * the completion queue and the queue pairs, and connecting a queue pair to
 * its peer. Called by setup.c; calls fail.c and post.c (the first
 * receives). */

#include "transport/verbs/verbs_internal.h"

static uint32_t next_psn(uint64_t *state) {
    /* xorshift64: PSNs only need to differ between incarnations. */
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state & 0xffffff);
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* What the queue pairs of each channel need: receive buffers, work
 * requests and local memory per queue pair, and completion queue entries
 * for them all. */
typedef struct qp_sizes {
    uint32_t nrbufs[2];
    uint32_t wr_cap[2];
    size_t per_qp[2];
    uint64_t cqe;
} qp_sizes;

/* Sizes the rings from the settings and checks what the queue pairs need
 * against what the device allows. */
static hvd_status size_qps(vtp *tp, const hvd_verbs_settings *set,
                           qp_sizes *sz) {
    int npeers = tp->size - 1;

    tp->slots[0] = (uint32_t)set->ring_chunks;
    tp->slot_bytes[0] = (uint32_t)set->chunk_bytes;
    tp->slots[1] = CTL_SLOTS;
    tp->slot_bytes[1] = CTL_SLOT_BYTES;
    sz->cqe = 16;
    for (int ch = 0; ch < 2; ch++) {
        uint32_t nrbufs =
            EAGER_CREDITS + tp->slots[ch] + CTL_RESERVE + HVD_VRTR_MAX;
        uint32_t wr_cap = tp->slots[ch] + SEND_BUFS;
        if (nrbufs > (uint32_t)tp->dev.attr.max_qp_wr ||
            wr_cap > (uint32_t)tp->dev.attr.max_qp_wr)
            return hvd_error_set(HVD_ERR_TRANSPORT,
                                 "%s allows %d work requests per queue "
                                 "pair and HVD_IB_RING_CHUNKS=%u needs %u: "
                                 "lower HVD_IB_RING_CHUNKS",
                                 tp->dev.name, tp->dev.attr.max_qp_wr,
                                 tp->slots[0],
                                 nrbufs > wr_cap ? nrbufs : wr_cap);
        sz->nrbufs[ch] = nrbufs;
        sz->wr_cap[ch] = wr_cap;
        sz->per_qp[ch] = ((size_t)nrbufs + SEND_BUFS) * EAGER_BYTES;
        sz->cqe += (uint64_t)npeers * (nrbufs + wr_cap);
    }
    if (sz->cqe > (uint64_t)tp->dev.attr.max_cqe)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "%d peers need a completion queue of %llu "
                             "entries and %s allows %d: lower "
                             "HVD_IB_RING_CHUNKS",
                             npeers, (unsigned long long)sz->cqe, tp->dev.name,
                             tp->dev.attr.max_cqe);
    return HVD_OK;
}

/* The protection domain and the local memory, registered: per queue pair
 * its receive and send buffers, then the staging chunks; and the receive
 * rings the peers write into. */
static hvd_status alloc_buffers(vtp *tp, const qp_sizes *sz) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t qp_bytes = (size_t)(tp->size - 1) * (sz->per_qp[0] + sz->per_qp[1]);

    tp->pd = tp->seam->alloc_pd(tp->dev.ctx);
    if (tp->pd == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT, "ibv_alloc_pd(%s) failed: %s",
                             tp->dev.name, strerror(errno));
    tp->stage_bytes = tp->slot_bytes[0];
    tp->nstage =
        (int)(2 * tp->slots[0] > STAGE_MIN ? 2 * tp->slots[0] : STAGE_MIN);
    tp->mem_len =
        round_up(qp_bytes + (size_t)tp->nstage * tp->stage_bytes, page);
    tp->ring_len = round_up(
        (size_t)hvd_vring_bytes(tp->size, tp->slots, tp->slot_bytes), page);
    if (posix_memalign((void **)&tp->mem, page, tp->mem_len) != 0 ||
        posix_memalign((void **)&tp->ring, page, tp->ring_len) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY,
                             "out of memory allocating %zu bytes of RDMA "
                             "buffers",
                             tp->mem_len + tp->ring_len);
    memset(tp->mem, 0, tp->mem_len);
    memset(tp->ring, 0, tp->ring_len);
    tp->mem_mr =
        tp->seam->reg_mr(tp->pd, tp->mem, tp->mem_len, IBV_ACCESS_LOCAL_WRITE);
    if (tp->mem_mr != NULL)
        tp->ring_mr =
            tp->seam->reg_mr(tp->pd, tp->ring, tp->ring_len,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (tp->mem_mr == NULL || tp->ring_mr == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_reg_mr of %zu bytes of RDMA buffers failed: "
                             "%s (raise the locked-memory limit, `ulimit -l "
                             "unlimited`, or lower HVD_IB_RING_CHUNKS)",
                             tp->mem_mr == NULL ? tp->mem_len : tp->ring_len,
                             strerror(errno));
    tp->stage_free = malloc((size_t)tp->nstage * sizeof(*tp->stage_free));
    if (tp->stage_free == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->stage = tp->mem + qp_bytes;
    for (int i = 0; i < tp->nstage; i++)
        tp->stage_free[i] = tp->nstage - 1 - i;
    tp->nstage_free = tp->nstage;
    return HVD_OK;
}

/* The completion channel (non-blocking, for progress to sleep on) and the
 * completion queue of cqe entries. */
static hvd_status create_cq(vtp *tp, uint64_t cqe) {
    int fl;

    tp->chan = tp->seam->create_comp_channel(tp->dev.ctx);
    if (tp->chan == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_create_comp_channel(%s) failed: %s",
                             tp->dev.name, strerror(errno));
    fl = fcntl(tp->chan->fd, F_GETFL);
    if (fl < 0 || fcntl(tp->chan->fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "fcntl(completion channel, O_NONBLOCK) failed: "
                             "%s",
                             strerror(errno));
    tp->cq = tp->seam->create_cq(tp->dev.ctx, (int)cqe, tp->chan);
    if (tp->cq == NULL)
        return hvd_error_set(
            HVD_ERR_TRANSPORT, "ibv_create_cq(%s, %llu entries) failed: %s",
            tp->dev.name, (unsigned long long)cqe, strerror(errno));
    return HVD_OK;
}

/* Queue pair q of channel ch: its buffers (from *off in the local memory,
 * advanced), its ring, the queue pair in INIT with a fresh PSN, and its
 * receives posted. */
static hvd_status init_qp(vtp *tp, vqp *q, int ch, const qp_sizes *sz,
                          size_t *off, uint64_t *seed) {
    struct ibv_qp_init_attr ia;
    struct ibv_qp_attr qa;
    int err;

    q->nrbufs = sz->nrbufs[ch];
    q->wr_cap = sz->wr_cap[ch];
    q->slots = tp->slots[ch];
    q->slot_bytes = tp->slot_bytes[ch];
    q->rbufs = tp->mem + *off;
    *off += (size_t)q->nrbufs * EAGER_BYTES;
    q->sbufs = tp->mem + *off;
    *off += (size_t)SEND_BUFS * EAGER_BYTES;
    q->ring = tp->ring + hvd_vring_offset(tp->size, tp->rank, q->peer, ch, 0,
                                          tp->slots, tp->slot_bytes);
    q->arr = calloc(q->nrbufs, sizeof(*q->arr));
    q->wr = calloc(q->wr_cap, sizeof(*q->wr));
    if (q->arr == NULL || q->wr == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = tp->cq;
    ia.recv_cq = tp->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = q->wr_cap;
    ia.cap.max_recv_wr = q->nrbufs;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    q->qp = tp->seam->create_qp(tp->pd, &ia);
    if (q->qp == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_create_qp(RC, %s) failed: %s (the "
                             "device may not offer reliable "
                             "connections)",
                             tp->dev.name, strerror(errno));
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_INIT;
    qa.pkey_index = 0;
    qa.port_num = (uint8_t)tp->dev.port;
    qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    err = tp->seam->modify_qp(q->qp, &qa,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS);
    if (err != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_modify_qp(INIT) failed: %s", strerror(err));
    q->psn = next_psn(seed);
    for (uint32_t i = 0; i < q->nrbufs; i++) {
        err = hvd_vb_post_recv(q, i);
        if (err != 0)
            return hvd_error_copy(hvd_vb_recv_failed(q, err), tp->failure.text);
    }
    return HVD_OK;
}

/* Buffers, rings, completion queue and queue pairs (in INIT, receives
 * posted). The sentence of a failure is in hvd_last_error. */
hvd_status hvd_vb_setup_local(vtp *tp, const hvd_verbs_settings *set) {
    qp_sizes sz;
    size_t off = 0;
    uint64_t seed;
    hvd_status st = size_qps(tp, set, &sz);

    if (st == HVD_OK)
        st = alloc_buffers(tp, &sz);
    if (st == HVD_OK)
        st = create_cq(tp, sz.cqe);
    if (st != HVD_OK)
        return st;
    seed = (uint64_t)hvd_now_ns() ^ ((uint64_t)getpid() << 32) ^
           (uint64_t)tp->rank;
    if (seed == 0)
        seed = 1;
    for (int p = 0; p < tp->size; p++) {
        for (int ch = 0; p != tp->rank && ch < 2; ch++) {
            st = init_qp(tp, &tp->qps[p * 2 + ch], ch, &sz, &off, &seed);
            if (st != HVD_OK)
                return st;
        }
    }

    /* User buffers: registered on their own where that is safe; the cache
     * also holds explicit registrations (hvd_verbs_register). */
    tp->auto_reg = set->mr_cache == 1 || (set->mr_cache == 2 && tp->dev.odp);
    return hvd_mr_cache_create(tp->seam, tp->pd, IBV_ACCESS_LOCAL_WRITE,
                               tp->dev.odp, MR_CACHE_ENTRIES, MR_CACHE_BYTES,
                               &tp->mrc);
}

/* Moves q to RTR then RTS towards the peer described by r and qi. */
hvd_status hvd_vb_connect_qp(vtp *tp, vqp *q, const hvd_vconn *r,
                             const hvd_vqpinfo *qi) {
    struct ibv_qp_attr a;
    int err;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(r->mtu < tp->dev.mtu ? r->mtu : tp->dev.mtu);
    a.dest_qp_num = qi->qpn;
    a.rq_psn = qi->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = QP_MIN_RNR;
    a.ah_attr.port_num = (uint8_t)tp->dev.port;
    if (tp->dev.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)tp->dev.gid_index;
        a.ah_attr.grh.hop_limit = 64;
    } else {
        a.ah_attr.dlid = r->lid;
    }
    err = tp->seam->modify_qp(
        q->qp, &a,
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_modify_qp(RTR) towards rank %d (QPN %#x) "
                             "failed: %s",
                             q->peer, qi->qpn, strerror(err));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = QP_TIMEOUT;
    a.retry_cnt = QP_RETRY;
    a.rnr_retry = QP_RNR_RETRY;
    a.sq_psn = q->psn;
    a.max_rd_atomic = 1;
    err = tp->seam->modify_qp(q->qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ibv_modify_qp(RTS) towards rank %d failed: %s",
                             q->peer, strerror(err));
    q->rring = r->ring_addr +
               hvd_vring_offset(tp->size, q->peer, tp->rank, q->ch, 0,
                                (const uint32_t[]){r->slots[0], r->slots[1]},
                                r->slot_bytes);
    q->rkey = r->rkey;
    q->rslots = r->slots[q->ch];
    q->rslot_bytes = r->slot_bytes[q->ch];
    q->reager_bytes = r->eager_bytes;
    hvd_vcredit_init(&q->cr, r->eager_credits[q->ch], r->slots[q->ch],
                     EAGER_CREDITS, q->slots);
    return HVD_OK;
}
