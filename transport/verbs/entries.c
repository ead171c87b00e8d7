/* The entries the verbs ops table names that are not setup's or
 * progress's (probe and open on the real libibverbs, the memory types),
 * and the public extras of verbs.h: registration and the counters. */

#include "transport/verbs/verbs_internal.h"

#include <stdio.h>
#include <string.h>

#include "transport/base/error.h"
#include "transport/verbs/lib.h"

hvd_status hvd_verbs_probe_with(const hvd_ibv_seam *seam,
                                const hvd_transport_params *params,
                                hvd_caps *caps) {
    return hvd_vb_probe(&hvd_verbs_ops, seam, params, caps);
}

hvd_status hvd_verbs_open_with(const hvd_ibv_seam *seam,
                               const hvd_transport_params *params,
                               hvd_transport **out) {
    hvd_verbs_settings set;
    hvd_status st = hvd_transport_read_settings(&hvd_verbs_ops, params, &set);

    return st != HVD_OK ? st
                        : hvd_vb_open(&hvd_verbs_ops, seam, params, &set, out);
}

/* The real library is loaded here, when the transport is first asked
 * about (transport/verbs/lib.h). */
hvd_status hvd_vb_entry_probe(const hvd_transport_params *params,
                              hvd_caps *caps) {
    if (!hvd_ibv_lib_load()) {
        memset(caps, 0, sizeof(*caps));
        snprintf(caps->reason, sizeof(caps->reason), "%s", hvd_ibv_lib_why());
        return HVD_OK;
    }
    return hvd_verbs_probe_with(&hvd_ibv_real, params, caps);
}

hvd_status hvd_vb_entry_open(const hvd_transport_params *params,
                             hvd_transport **out) {
    if (!hvd_ibv_lib_load())
        return hvd_error_set(HVD_ERR_UNSUPPORTED, "HVD_TRANSPORT=verbs: %s",
                             hvd_ibv_lib_why());
    return hvd_verbs_open_with(&hvd_ibv_real, params, out);
}

unsigned hvd_vb_mem_types(hvd_transport *t) {
    const vtp *tp = (const vtp *)t;

    return tp->gpudirect
               ? HVD_MEM_BIT(HVD_MEM_HOST) | HVD_MEM_BIT(HVD_MEM_DEVICE)
               : 0;
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

void hvd_verbs_mr_stats(hvd_transport *t, hvd_mr_stats *out) {
    memset(out, 0, sizeof(*out));
    if (t != NULL && t->ops == &hvd_verbs_ops)
        hvd_mr_cache_stats(((vtp *)t)->mrc, out);
}
