/* The verbs transport (verbs.h): probe and open: the settings, GPUDirect, the
 * bootstrap exchange; memory registration. */

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

hvd_status hvd_verbs_probe_with(const hvd_ibv_seam *seam,
                                const hvd_transport_params *params,
                                hvd_caps *caps) {
    hvd_verbs_settings set;
    hvd_vdev_cfg cfg;
    hvd_vdev dev;

    memset(caps, 0, sizeof(*caps));
    /* Between any ranks; auto prefers it to TCP where every rank has it. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 20;
    if (hvd_transport_read_settings(&hvd_verbs_ops, params, &set) != HVD_OK) {
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

hvd_status hvd_vb_probe(const hvd_transport_params *params, hvd_caps *caps) {
    return hvd_verbs_probe_with(&hvd_ibv_real, params, caps);
}

/* open, with the settings read. */
static hvd_status open_set(const hvd_ibv_seam *seam,
                           const hvd_transport_params *params,
                           const hvd_verbs_settings *set, hvd_transport **out) {
    vtp *tp = calloc(1, sizeof(*tp));
    hvd_bootstrap *bs = params->bootstrap;
    hvd_vdev_cfg cfg = {
        .device = set->device, .port = set->port, .gid_index = set->gid_index};
    uint8_t *blobs = NULL, *mine = NULL;
    hvd_vqpinfo *qinfo = NULL;
    hvd_vconn *conns = NULL;
    size_t blen = HVD_VCONN_LEN(params->size);
    char why[256] = "", gd_why[160] = "";
    hvd_status st, local = HVD_OK;
    int64_t deadline = hvd_now_ns() + params->connect_timeout_ns;
    int gd_here = gpudirect_here(seam, params, set, gd_why, sizeof(gd_why));
    int gd_bad = -1;

    if (tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->base.ops = &hvd_verbs_ops;
    tp->seam = seam;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->wakefd = -1;
    tp->opening = 1;
    tp->timeout_ns = params->timeout_ns;
    tp->heartbeat_ns =
        tp->timeout_ns / 4 < HEARTBEAT_NS ? tp->timeout_ns / 4 : HEARTBEAT_NS;
    if (blen > HVD_RDV_MAX_BLOB) {
        /* Every rank decides the same from the size alone. */
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "the verbs transport exchanges %zu bytes per rank "
                           "at start, more than the bootstrap carries (%d): "
                           "a job of %d ranks is too large for it; use tcp",
                           blen, HVD_RDV_MAX_BLOB, params->size);
        goto fail;
    }
    tp->qps = calloc((size_t)tp->size * 2, sizeof(*tp->qps));
    tp->pending = calloc((size_t)tp->size, sizeof(*tp->pending));
    tp->last_active = calloc((size_t)tp->size, sizeof(*tp->last_active));
    blobs = malloc(blen * (size_t)tp->size);
    mine = calloc(1, blen);
    qinfo = calloc((size_t)tp->size * 2, sizeof(*qinfo));
    conns = calloc((size_t)tp->size, sizeof(*conns));
    hvd_tp_copy_names(params->hosts, params->pids, tp->size, &tp->hosts,
                      &tp->pids);
    if (tp->qps == NULL || tp->pending == NULL || tp->last_active == NULL ||
        blobs == NULL || mine == NULL || qinfo == NULL || conns == NULL) {
        /* Still take part in the exchange, so no rank waits for us. */
        local = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    for (int i = 0; tp->qps != NULL && i < tp->size * 2; i++) {
        tp->qps[i].tp = tp;
        tp->qps[i].peer = i / 2;
        tp->qps[i].ch = i % 2;
        tp->qps[i].index = i;
    }

    /* Step 1: device, buffers and queue pairs; the connection data. */
    if (local == HVD_OK &&
        hvd_vdev_open(seam, &cfg, &tp->dev, why, sizeof(why)) != HVD_VDEV_OK)
        local = hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", why);
    if (local == HVD_OK) {
        tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        local = tp->wakefd < 0
                    ? hvd_error_set(HVD_ERR_TRANSPORT, "eventfd failed: %s",
                                    strerror(errno))
                    : hvd_vb_setup_local(tp, set);
    }
    if (local != HVD_OK)
        snprintf(why, sizeof(why), "%s", hvd_error_get());
    {
        hvd_vconn c;
        memset(&c, 0, sizeof(c));
        c.rank = (uint32_t)tp->rank;
        c.size = (uint32_t)tp->size;
        if (local == HVD_OK) {
            c.flags = HVD_VCONN_USABLE | (gd_here ? HVD_VCONN_GPUDIRECT : 0);
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
                    qinfo[i] = (hvd_vqpinfo){.qpn = tp->qps[i].qp->qp_num,
                                             .psn = tp->qps[i].psn};
        }
        if (mine != NULL)
            hvd_vconn_encode(&c, qinfo, mine);
    }
    if (mine == NULL || blobs == NULL) {
        /* Nothing to send: this rank cannot take part; the others time
         * out in the bootstrap. */
        st = local;
        goto fail;
    }
    st = bs->allgather(bs, mine, blen, blobs);
    if (st != HVD_OK)
        goto fail;
    {
        int unusable = -1;
        for (int p = 0; p < tp->size; p++) {
            hvd_vqpinfo q2[2];
            hvd_status dst =
                hvd_vconn_decode(blobs + (size_t)p * blen, blen, p, tp->size,
                                 tp->rank, &conns[p], q2);
            if (dst != HVD_OK) {
                if (local == HVD_OK)
                    local = dst;
                continue;
            }
            if (!(conns[p].flags & HVD_VCONN_USABLE)) {
                if (unusable < 0)
                    unusable = p;
                continue;
            }
            qinfo[p * 2] = q2[0];
            qinfo[p * 2 + 1] = q2[1];
            if (!(conns[p].flags & HVD_VCONN_GPUDIRECT) && gd_bad < 0)
                gd_bad = p;
        }
        if (unusable >= 0) {
            /* Every rank sees the same flags and stops here. */
            if (unusable == tp->rank)
                st = hvd_error_set(
                    local != HVD_OK ? local : HVD_ERR_UNSUPPORTED, "%s", why);
            else
                st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                                   "rank %d cannot use RDMA (its log says "
                                   "why)",
                                   unusable);
            goto fail;
        }
    }

    /* GPUDirect RDMA only if every rank can: the engine gives all ranks
     * device memory for an operation, or none. Every rank sees the same
     * flags. */
    tp->gpudirect = gd_bad < 0;
    tp->gpu_device = params->gpu_device;
    if (gd_bad >= 0 && set->gpudirect == 1) {
        if (gd_bad == tp->rank)
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_IB_GPUDIRECT=1: %s; set it to auto to "
                               "stage device memory through host memory",
                               gd_why);
        else
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_IB_GPUDIRECT=1: rank %d cannot move CUDA "
                               "device memory over RDMA (no CUDA device or "
                               "no nvidia-peermem there); set it to auto to "
                               "stage device memory through host memory",
                               gd_bad);
        goto fail;
    }

    /* Step 2: connect every queue pair. */
    for (int p = 0; local == HVD_OK && p < tp->size; p++) {
        if (p == tp->rank)
            continue;
        if (conns[p].link_layer != tp->dev.link_layer) {
            local = hvd_error_set(HVD_ERR_TRANSPORT,
                                  "rank %d's RDMA port is %s and this rank's "
                                  "%s: they cannot connect",
                                  p, hvd_vdev_link_name(conns[p].link_layer),
                                  hvd_vdev_link_name(tp->dev.link_layer));
            break;
        }
        for (int ch = 0; local == HVD_OK && ch < 2; ch++)
            local = hvd_vb_connect_qp(tp, &tp->qps[p * 2 + ch], &conns[p],
                                      &qinfo[p * 2 + ch]);
    }
    st = hvd_vb_agree(tp, bs, local, "connecting RDMA queue pairs");
    if (st != HVD_OK)
        goto fail;

    /* Step 3: a HELLO across every queue pair, so that ports that cannot
     * reach each other fail here, on every rank, not in a collective. */
    local = hvd_vb_hello(tp, deadline);
    st = hvd_vb_agree(tp, bs, local, "checking RDMA connectivity");
    if (st != HVD_OK)
        goto fail;

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
    else if (set->gpudirect != 0 && params->gpu_device >= 0)
        HVD_DEBUG("verbs", "GPUDirect RDMA: off (%s)",
                  gd_here ? "another rank cannot" : gd_why);
    free(blobs);
    free(mine);
    free(qinfo);
    free(conns);
    tp->opening = 0;
    *out = &tp->base;
    return HVD_OK;
fail : {
    char text[HVD_ERROR_MAX];
    snprintf(text, sizeof(text), "%s", hvd_error_get());
    tp->shutting_down = 1; /* no ABORT notices from a failed open */
    hvd_vb_close(&tp->base);
    free(blobs);
    free(mine);
    free(qinfo);
    free(conns);
    return hvd_error_copy(st, text);
}
}

hvd_status hvd_verbs_open_with(const hvd_ibv_seam *seam,
                               const hvd_transport_params *params,
                               hvd_transport **out) {
    hvd_verbs_settings set;
    hvd_status st = hvd_transport_read_settings(&hvd_verbs_ops, params, &set);

    return st != HVD_OK ? st : open_set(seam, params, &set, out);
}

hvd_status hvd_vb_open(const hvd_transport_params *params,
                       hvd_transport **out) {
    return hvd_verbs_open_with(&hvd_ibv_real, params, out);
}

hvd_status hvd_verbs_register(hvd_transport *t, const void *addr, size_t len,
                              hvd_mem_type type, hvd_mr_entry **out) {
    vtp *tp = (vtp *)t;

    if (t == NULL || t->ops != &hvd_verbs_ops)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_verbs_register: not a verbs transport");
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (type == HVD_MEM_DEVICE) {
        uint64_t id = 0;
        tp->seam->mem_type(addr, &id);
        return hvd_mr_get_id(tp->mrc, addr, len, type, id, out);
    }
    return hvd_mr_get(tp->mrc, addr, len, type, out);
}

void hvd_verbs_unregister(hvd_transport *t, hvd_mr_entry *e) {
    if (t != NULL && t->ops == &hvd_verbs_ops)
        hvd_mr_put(((vtp *)t)->mrc, e);
}

void hvd_verbs_counters_get(hvd_transport *t, hvd_verbs_counters *out) {
    memset(out, 0, sizeof(*out));
    if (t != NULL && t->ops == &hvd_verbs_ops)
        *out = ((vtp *)t)->ctr;
}

unsigned hvd_vb_mem_types(hvd_transport *t) {
    const vtp *tp = (const vtp *)t;

    return tp->gpudirect
               ? HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE)
               : 0;
}

void hvd_verbs_mr_stats(hvd_transport *t, hvd_mr_stats *out) {
    memset(out, 0, sizeof(*out));
    if (t != NULL && t->ops == &hvd_verbs_ops)
        hvd_mr_cache_stats(((vtp *)t)->mrc, out);
}
