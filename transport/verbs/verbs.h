/*
 * The RDMA verbs transport (built when libibverbs is found:
 * HVD_WITH_VERBS), for InfiniBand and RoCE.
 *
 * One reliable-connected queue pair per (peer, channel), all completing
 * into one completion queue whose completion channel is what an idle
 * progress call sleeps on (with an eventfd for wake). Connection data
 * (transport/verbs/conn.h) goes through the bootstrap allgather; the
 * protocol (eager SENDs, chunked RDMA WRITE WITH IMMEDIATE into receive
 * rings, credits) is described in transport/verbs/proto.h; user send
 * buffers are registered through a cache (transport/verbs/mr.h) or copied
 * through registered staging chunks.
 *
 * open is collective and all-or-nothing: every rank reports whether it
 * has a usable device, whether its queue pairs connected and whether a
 * HELLO crossed every queue pair, and either every rank succeeds or every
 * rank fails with the sentence of the first rank that could not.
 */
#ifndef HVD_TRANSPORT_VERBS_VERBS_H
#define HVD_TRANSPORT_VERBS_VERBS_H

#include "transport/transport.h"
#include "transport/verbs/mr.h"
#include "transport/verbs/seam.h"

extern const hvd_transport_ops hvd_verbs_ops;

/* probe and open over another libibverbs (a fake in the unit tests); the
 * transport's ops use hvd_ibv_real. */
hvd_status hvd_verbs_probe_with(const hvd_ibv_seam *seam,
                                const hvd_transport_params *params,
                                hvd_caps *caps);
hvd_status hvd_verbs_open_with(const hvd_ibv_seam *seam,
                               const hvd_transport_params *params,
                               hvd_transport **out);

/*
 * Registers [addr, addr + len) of the given memory type in tp's
 * registration cache and holds it until hvd_verbs_unregister: sends from
 * inside it then go from that memory without a copy, whatever
 * HVD_IB_MR_CACHE says (the caller promises the memory stays allocated
 * while registered). This is the GPUDirect RDMA hook: HVD_MEM_DEVICE
 * registers device memory, which needs the nvidia-peermem module
 * (HVD_ERR_UNSUPPORTED with a sentence otherwise). Receives still land in
 * the host receive rings and are copied out, so only a sender's device
 * memory is served this way. tp must be a verbs transport.
 */
hvd_status hvd_verbs_register(hvd_transport *tp, const void *addr, size_t len,
                              hvd_mem_type type, hvd_mr_entry **out);
void hvd_verbs_unregister(hvd_transport *tp, hvd_mr_entry *e);

/* The registration cache's counters (tests, debug logs). */
void hvd_verbs_mr_stats(hvd_transport *tp, hvd_mr_stats *out);

#endif
