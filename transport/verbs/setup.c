/* The verbs transport (verbs.h): setup and teardown: probe, open (the
 * settings, GPUDirect RDMA, the bootstrap exchange, the hello), close and
 * goodbye. Calls qp.c (buffers and queue pairs), progress.c (its one turn
 * of the completion queue, for the hello and the goodbye), post.c and
 * fail.c, and the components device.c, conn.c and mr.c. */

#include "transport/verbs/verbs_internal.h"

/* 1 if this rank can move CUDA device memory itself (GPUDirect RDMA);
 * else why not, as a phrase, in why. */
static int gpudirect_here(const hvd_ibv_seam *seam,
                          const hvd_transport_params *params,
                          const hvd_verbs_settings *set, char *why,
                          size_t whylen) {
    if (set->gpudirect == 0) {
        snprintf(why, whylen, "HVD_IB_GPUDIRECT=0");
        return 0;
    }
    if (params->gpu_device < 0 || seam->cuda_devices() <= 0) {
        snprintf(why, whylen,
                 "this rank has no CUDA device (or hvd was built without "
                 "CUDA)");
        return 0;
    }
    if (!seam->peermem_loaded()) {
        snprintf(why, whylen,
                 "the nvidia-peermem kernel module is not loaded on this "
                 "rank's host (`modprobe nvidia-peermem`)");
        return 0;
    }
    return 1;
}

/* probe over seam; ops is the verbs ops table (its settings). */
hvd_status hvd_vb_probe(const hvd_transport_ops *ops, const hvd_ibv_seam *seam,
                        const hvd_transport_params *params, hvd_caps *caps) {
    hvd_verbs_settings set;
    hvd_vdev_cfg cfg;
    hvd_vdev dev;

    memset(caps, 0, sizeof(*caps));
    /* Between any ranks; auto prefers it to TCP where every rank has it. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 20;
    if (hvd_transport_read_settings(ops, params, &set) != HVD_OK) {
        snprintf(caps->reason, sizeof(caps->reason), "%s", hvd_error_get());
        return HVD_OK;
    }
    cfg = (hvd_vdev_cfg){
        .device = set.device, .port = set.port, .gid_index = set.gid_index};
    if (hvd_vdev_open(seam, &cfg, &dev, caps->reason, sizeof(caps->reason)) ==
        HVD_VDEV_OK) {
        char why[160];
        caps->usable = 1;
        hvd_vdev_close(seam, &dev);
        if (gpudirect_here(seam, params, &set, why, sizeof(why)))
            caps->mem_types =
                HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE);
    }
    return HVD_OK;
}

void hvd_vb_close(hvd_transport *t) {
    vtp *tp = (vtp *)t;

    if (tp == NULL)
        return;
    for (int i = 0; tp->qps != NULL && i < tp->size * 2; i++) {
        vqp *q = &tp->qps[i];
        if (q->qp != NULL)
            tp->seam->destroy_qp(q->qp);
        free(q->arr);
        free(q->rq);
        free(q->sq);
        free(q->wr);
    }
    /* Regions held by work requests that never completed go too: their
     * queue pairs are gone. */
    hvd_mr_cache_destroy(tp->mrc);
    if (tp->cq != NULL)
        tp->seam->destroy_cq(tp->cq);
    if (tp->chan != NULL)
        tp->seam->destroy_comp_channel(tp->chan);
    if (tp->mem_mr != NULL)
        tp->seam->dereg_mr(tp->mem_mr);
    if (tp->ring_mr != NULL)
        tp->seam->dereg_mr(tp->ring_mr);
    if (tp->pd != NULL)
        tp->seam->dealloc_pd(tp->pd);
    hvd_vdev_close(tp->seam, &tp->dev);
    if (tp->wakefd >= 0)
        close(tp->wakefd);
    free(tp->mem);
    free(tp->ring);
    free(tp->stage_free);
    free(tp->qps);
    free(tp->pending);
    free(tp->last_active);
    free(tp->hosts);
    free(tp->pids);
    free(tp);
}

/* What every rank says after a setup step: all ranks take the same
 * decision from it. */
typedef struct step_blob {
    uint32_t ok;
    char why[252];
} step_blob;

/* Allgathers this rank's outcome of a step; HVD_OK if every rank's was
 * good, else the first failing rank's sentence. */
static hvd_status agree(vtp *tp, hvd_bootstrap *bs, hvd_status mine,
                        const char *what) {
    step_blob me, *all = calloc((size_t)tp->size, sizeof(*all));
    hvd_status st;

    if (all == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    memset(&me, 0, sizeof(me));
    me.ok = mine == HVD_OK ? 0 : (uint32_t)mine;
    if (mine != HVD_OK)
        snprintf(me.why, sizeof(me.why), "%s", hvd_error_get());
    st = bs->allgather(bs, &me, sizeof(me), all);
    for (int p = 0; st == HVD_OK && p < tp->size; p++) {
        if (all[p].ok == 0)
            continue;
        all[p].why[sizeof(all[p].why) - 1] = '\0';
        hvd_status ps = all[p].ok > HVD_ERR_INTERNAL ? HVD_ERR_TRANSPORT
                                                     : (hvd_status)all[p].ok;
        st = p == tp->rank
                 ? hvd_error_set(ps, "%s: %s", what, all[p].why)
                 : hvd_error_set(ps, "%s: rank %d: %s", what, p, all[p].why);
    }
    free(all);
    return st;
}

/* Sends HELLO on every queue pair and waits until every one has crossed
 * both ways (bounded by deadline). */
static hvd_status hello(vtp *tp, int64_t deadline) {
    hvd_status st = HVD_OK;

    for (int i = 0; i < tp->size * 2; i++) {
        vqp *q = &tp->qps[i];
        if (q->qp == NULL)
            continue;
        int err = hvd_vb_post_ctl(q, HVD_VMSG_HELLO, NULL, 0);
        if (err != 0)
            return hvd_error_set(
                HVD_ERR_TRANSPORT, "ibv_post_send(hello) to rank %d failed: %s",
                q->peer, err == 1 ? "no send buffer" : strerror(err));
    }
    for (int moved = 0;; moved = hvd_vb_step(tp, 100)) {
        int missing = -1;
        if (moved < 0)
            return hvd_tp_failure_error(&tp->failure);
        for (int i = 0; i < tp->size * 2 && missing < 0; i++) {
            vqp *q = &tp->qps[i];
            if (q->qp != NULL && (!q->hello_rx || !q->hello_done))
                missing = i;
        }
        if (missing < 0)
            break;
        if (hvd_now_ns() > deadline) {
            vqp *q = &tp->qps[missing];
            char who[160];
            hvd_vb_describe(tp, q->peer, who, sizeof(who));
            st = hvd_error_set(HVD_ERR_TIMEOUT,
                               "no RDMA %s with %s within the start timeout "
                               "(the ports cannot reach each other: check "
                               "the fabric, or HVD_IB_GID_INDEX on RoCE)",
                               !q->hello_done ? "acknowledgement" : "hello",
                               who);
            break;
        }
    }
    return st;
}

/* What open keeps between its steps. */
typedef struct open_state {
    const hvd_transport_params *params;
    const hvd_verbs_settings *set;
    vtp *tp;
    size_t blen;        /* one rank's connection data */
    uint8_t *blobs;     /* every rank's, from the allgather */
    uint8_t *mine;      /* this rank's */
    hvd_vqpinfo *qinfo; /* per queue pair: the peer's QPN and PSN */
    hvd_vconn *conns;   /* per rank */
    hvd_status local;   /* this rank's outcome of the current step */
    char why[256];      /* why this rank cannot use RDMA */
    char gd_why[160];   /* why this rank cannot use GPUDirect RDMA */
    int gd_here;
    int gd_bad; /* the first rank without GPUDirect RDMA, or -1 */
} open_state;

/* The transport with its parameters, nothing allocated yet; NULL if out
 * of memory. */
static vtp *new_tp(const hvd_transport_ops *ops, const hvd_ibv_seam *seam,
                   const hvd_transport_params *params) {
    vtp *tp = calloc(1, sizeof(*tp));

    if (tp == NULL)
        return NULL;
    tp->base.ops = ops;
    tp->seam = seam;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->wakefd = -1;
    tp->opening = 1;
    tp->timeout_ns = params->timeout_ns;
    tp->heartbeat_ns =
        tp->timeout_ns / 4 < HEARTBEAT_NS ? tp->timeout_ns / 4 : HEARTBEAT_NS;
    return tp;
}

/* The transport's per-peer arrays and open's own; out of memory is this
 * rank's outcome of step 1 (it still takes part in the exchange, so that
 * no rank waits for it). */
static void alloc_open(open_state *os) {
    vtp *tp = os->tp;

    tp->qps = calloc((size_t)tp->size * 2, sizeof(*tp->qps));
    tp->pending = calloc((size_t)tp->size, sizeof(*tp->pending));
    tp->last_active = calloc((size_t)tp->size, sizeof(*tp->last_active));
    os->blobs = malloc(os->blen * (size_t)tp->size);
    os->mine = calloc(1, os->blen);
    os->qinfo = calloc((size_t)tp->size * 2, sizeof(*os->qinfo));
    os->conns = calloc((size_t)tp->size, sizeof(*os->conns));
    hvd_tp_copy_names(os->params->hosts, os->params->pids, tp->size, &tp->hosts,
                      &tp->pids);
    if (tp->qps == NULL || tp->pending == NULL || tp->last_active == NULL ||
        os->blobs == NULL || os->mine == NULL || os->qinfo == NULL ||
        os->conns == NULL)
        os->local = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; tp->qps != NULL && i < tp->size * 2; i++) {
        tp->qps[i].tp = tp;
        tp->qps[i].peer = i / 2;
        tp->qps[i].ch = i % 2;
        tp->qps[i].index = i;
    }
}

/* Step 1, this rank's part: the device, buffers and queue pairs. */
static void open_local(open_state *os, const hvd_ibv_seam *seam) {
    vtp *tp = os->tp;
    hvd_vdev_cfg cfg = {.device = os->set->device,
                        .port = os->set->port,
                        .gid_index = os->set->gid_index};

    if (os->local == HVD_OK && hvd_vdev_open(seam, &cfg, &tp->dev, os->why,
                                             sizeof(os->why)) != HVD_VDEV_OK)
        os->local = hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", os->why);
    if (os->local == HVD_OK) {
        tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        os->local = tp->wakefd < 0
                        ? hvd_error_set(HVD_ERR_TRANSPORT, "eventfd failed: %s",
                                        strerror(errno))
                        : hvd_vb_setup_local(tp, os->set);
    }
    if (os->local != HVD_OK)
        snprintf(os->why, sizeof(os->why), "%s", hvd_error_get());
}

/* This rank's connection data (conn.h) into os->mine: whether it can use
 * RDMA and GPUDirect RDMA, its port, rings and queue pairs. */
static void encode_mine(open_state *os) {
    vtp *tp = os->tp;
    hvd_vconn c;

    memset(&c, 0, sizeof(c));
    c.rank = (uint32_t)tp->rank;
    c.size = (uint32_t)tp->size;
    if (os->local == HVD_OK) {
        c.flags = HVD_VCONN_USABLE | (os->gd_here ? HVD_VCONN_GPUDIRECT : 0);
        c.lid = (uint16_t)tp->dev.lid;
        c.port = (uint8_t)tp->dev.port;
        c.link_layer = (uint8_t)tp->dev.link_layer;
        c.mtu = (uint8_t)tp->dev.mtu;
        c.gid_index = tp->dev.gid_index;
        memcpy(c.gid, tp->dev.gid.raw, 16);
        c.ring_addr = (uintptr_t)tp->ring;
        c.rkey = tp->ring_mr->rkey;
        c.eager_bytes = EAGER_BYTES;
        for (int ch = 0; ch < 2; ch++) {
            c.eager_credits[ch] = EAGER_CREDITS;
            c.slots[ch] = (uint16_t)tp->slots[ch];
            c.slot_bytes[ch] = tp->slot_bytes[ch];
        }
        for (int i = 0; i < tp->size * 2; i++)
            if (tp->qps[i].qp != NULL)
                os->qinfo[i] = (hvd_vqpinfo){.qpn = tp->qps[i].qp->qp_num,
                                             .psn = tp->qps[i].psn};
    }
    if (os->mine != NULL)
        hvd_vconn_encode(&c, os->qinfo, os->mine);
}

/* Reads every rank's connection data from the allgather: HVD_OK if every
 * rank can use RDMA (every rank sees the same flags and takes the same
 * decision), and who cannot use GPUDirect RDMA. */
static hvd_status read_peers(open_state *os) {
    vtp *tp = os->tp;
    int unusable = -1;

    for (int p = 0; p < tp->size; p++) {
        hvd_vqpinfo q2[2];
        hvd_status dst =
            hvd_vconn_decode(os->blobs + (size_t)p * os->blen, os->blen, p,
                             tp->size, tp->rank, &os->conns[p], q2);
        if (dst != HVD_OK) {
            if (os->local == HVD_OK)
                os->local = dst;
            continue;
        }
        if (!(os->conns[p].flags & HVD_VCONN_USABLE)) {
            if (unusable < 0)
                unusable = p;
            continue;
        }
        os->qinfo[p * 2] = q2[0];
        os->qinfo[p * 2 + 1] = q2[1];
        if (!(os->conns[p].flags & HVD_VCONN_GPUDIRECT) && os->gd_bad < 0)
            os->gd_bad = p;
    }
    if (unusable < 0)
        return HVD_OK;
    if (unusable == tp->rank)
        return hvd_error_set(os->local != HVD_OK ? os->local
                                                 : HVD_ERR_UNSUPPORTED,
                             "%s", os->why);
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "rank %d cannot use RDMA (its log says why)",
                         unusable);
}

/* GPUDirect RDMA only if every rank can: the engine gives all ranks
 * device memory for an operation, or none. Every rank sees the same
 * flags. */
static hvd_status agree_gpudirect(open_state *os) {
    vtp *tp = os->tp;
    int gd_bad = os->gd_bad;

    tp->gpudirect = gd_bad < 0;
    tp->gpu_device = os->params->gpu_device;
    if (gd_bad < 0 || os->set->gpudirect != 1)
        return HVD_OK;
    if (gd_bad == tp->rank)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_IB_GPUDIRECT=1: %s; set it to auto to "
                             "stage device memory through host memory",
                             os->gd_why);
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "HVD_IB_GPUDIRECT=1: rank %d cannot move CUDA "
                         "device memory over RDMA (no CUDA device or "
                         "no nvidia-peermem there); set it to auto to "
                         "stage device memory through host memory",
                         gd_bad);
}

/* Step 2, this rank's part: connects every queue pair. */
static void connect_all(open_state *os) {
    vtp *tp = os->tp;

    for (int p = 0; os->local == HVD_OK && p < tp->size; p++) {
        if (p == tp->rank)
            continue;
        if (os->conns[p].link_layer != tp->dev.link_layer) {
            os->local =
                hvd_error_set(HVD_ERR_TRANSPORT,
                              "rank %d's RDMA port is %s and this rank's "
                              "%s: they cannot connect",
                              p, hvd_vdev_link_name(os->conns[p].link_layer),
                              hvd_vdev_link_name(tp->dev.link_layer));
            break;
        }
        for (int ch = 0; os->local == HVD_OK && ch < 2; ch++)
            os->local =
                hvd_vb_connect_qp(tp, &tp->qps[p * 2 + ch], &os->conns[p],
                                  &os->qinfo[p * 2 + ch]);
    }
}

static void log_open(const open_state *os) {
    const vtp *tp = os->tp;

    HVD_DEBUG("verbs",
              "%s port %d (%s, LID %d, GID index %d, MTU %d): %d peers, "
              "data chunks of %u bytes x %u, sends from user buffers: %s",
              tp->dev.name, tp->dev.port,
              hvd_vdev_link_name(tp->dev.link_layer), tp->dev.lid,
              tp->dev.gid_index, 128 << tp->dev.mtu, tp->size - 1,
              tp->slot_bytes[0], tp->slots[0],
              !tp->auto_reg ? "no (staged)"
              : tp->dev.odp ? "yes (on-demand paging)"
                            : "yes (pinned, HVD_IB_MR_CACHE=on)");
    if (tp->gpudirect)
        HVD_DEBUG("verbs", "GPUDirect RDMA: on (CUDA device memory is read "
                           "and written by the HCA)");
    else if (os->set->gpudirect != 0 && os->params->gpu_device >= 0)
        HVD_DEBUG("verbs", "GPUDirect RDMA: off (%s)",
                  os->gd_here ? "another rank cannot" : os->gd_why);
}

static void free_scratch(open_state *os) {
    free(os->blobs);
    free(os->mine);
    free(os->qinfo);
    free(os->conns);
}

/*
 * open over seam with the settings read; ops is the verbs ops table. Three
 * steps, each agreed by every rank: the connection data (device, buffers,
 * queue pairs; whether every rank can use RDMA and GPUDirect RDMA),
 * connecting every queue pair, a HELLO across every one.
 */
hvd_status hvd_vb_open(const hvd_transport_ops *ops, const hvd_ibv_seam *seam,
                       const hvd_transport_params *params,
                       const hvd_verbs_settings *set, hvd_transport **out) {
    open_state os = {.params = params,
                     .set = set,
                     .blen = HVD_VCONN_LEN(params->size),
                     .local = HVD_OK,
                     .gd_bad = -1};
    hvd_bootstrap *bs = params->bootstrap;
    int64_t deadline = hvd_now_ns() + params->connect_timeout_ns;
    hvd_status st;

    os.gd_here =
        gpudirect_here(seam, params, set, os.gd_why, sizeof(os.gd_why));
    os.tp = new_tp(ops, seam, params);
    if (os.tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (os.blen > HVD_RDV_MAX_BLOB) {
        /* Every rank decides the same from the size alone. */
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "the verbs transport exchanges %zu bytes per rank "
                           "at start, more than the bootstrap carries (%d): "
                           "a job of %d ranks is too large for it; use tcp",
                           os.blen, HVD_RDV_MAX_BLOB, params->size);
        goto fail;
    }
    alloc_open(&os);

    /* Step 1: device, buffers and queue pairs; the connection data. */
    open_local(&os, seam);
    encode_mine(&os);
    if (os.mine == NULL || os.blobs == NULL) {
        /* Nothing to send: this rank cannot take part; the others time
         * out in the bootstrap. */
        st = os.local;
        goto fail;
    }
    st = bs->allgather(bs, os.mine, os.blen, os.blobs);
    if (st == HVD_OK)
        st = read_peers(&os);
    if (st == HVD_OK)
        st = agree_gpudirect(&os);
    if (st != HVD_OK)
        goto fail;

    /* Step 2: connect every queue pair. */
    connect_all(&os);
    st = agree(os.tp, bs, os.local, "connecting RDMA queue pairs");
    if (st != HVD_OK)
        goto fail;

    /* Step 3: a HELLO across every queue pair, so that ports that cannot
     * reach each other fail here, on every rank, not in a collective. */
    os.local = hello(os.tp, deadline);
    st = agree(os.tp, bs, os.local, "checking RDMA connectivity");
    if (st != HVD_OK)
        goto fail;

    log_open(&os);
    free_scratch(&os);
    os.tp->opening = 0;
    *out = &os.tp->base;
    return HVD_OK;
fail : {
    char text[HVD_ERROR_MAX];
    snprintf(text, sizeof(text), "%s", hvd_error_get());
    os.tp->shutting_down = 1; /* no ABORT notices from a failed open */
    hvd_vb_close(&os.tp->base);
    free_scratch(&os);
    return hvd_error_copy(st, text);
}
}

/* Goodbye: a BYE on every queue pair, and the peers' BYEs, bounded by
 * the timeout; whatever is missing then is only logged. */
hvd_status hvd_vb_shutdown(hvd_transport *t) {
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
        hvd_vb_step(tp, 100);
    }
    HVD_DEBUG("verbs", "not every peer said goodbye in time");
    return HVD_OK;
}
