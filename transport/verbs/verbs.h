/*
 * The RDMA verbs transport (built when libibverbs is found:
 * HVD_WITH_VERBS), for InfiniBand and RoCE.
 *
 * One reliable-connected queue pair per (peer, channel), all completing
 * into one completion queue whose completion channel is what an idle
 * progress call sleeps on (with an eventfd for wake). Connection data
 * (transport/verbs/conn.h) goes through the bootstrap allgather; the
 * protocol (eager SENDs, chunked RDMA WRITE WITH IMMEDIATE into receive
 * rings, credits, and the rendezvous of GPUDirect RDMA) is described in
 * transport/verbs/proto.h; user send buffers are registered through a
 * cache (transport/verbs/mr.h) or copied through registered staging
 * chunks.
 *
 * GPUDirect RDMA: where hvd is built with CUDA, this rank has a CUDA
 * device (params->gpu_device), the nvidia-peermem module is loaded and
 * HVD_IB_GPUDIRECT (transport/verbs/settings.h) is not off, probe puts
 * HVD_MEM_DEVICE in caps.mem_types; open agrees on it with every rank
 * (ops->mem_types), and isend/irecv then take CUDA device pointers, which
 * the HCA reads and writes directly: the CPU never touches them.
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
 * (HVD_ERR_UNSUPPORTED with a sentence otherwise). Sends and receives of
 * device memory need no such call: with GPUDirect on they register their
 * buffers themselves. tp must be a verbs transport.
 */
hvd_status hvd_verbs_register(hvd_transport *tp, const void *addr, size_t len,
                              hvd_mem_type type, hvd_mr_entry **out);
void hvd_verbs_unregister(hvd_transport *tp, hvd_mr_entry *e);

/* The registration cache's counters (tests, debug logs). */
void hvd_verbs_mr_stats(hvd_transport *tp, hvd_mr_stats *out);

/* What the transport did with messages, counted since open (tests, debug
 * logs): the copies the CPU made, and the rendezvous of device memory. */
typedef struct hvd_verbs_counters {
    uint64_t eager_tx;    /* messages sent eager (copied into a buffer) */
    uint64_t eager_rx;    /* eager messages copied into their receive */
    uint64_t ring_tx;     /* messages written into the peer's ring */
    uint64_t ring_rx;     /* messages copied out of this rank's ring */
    uint64_t cpu_bytes;   /* payload bytes the CPU copied: eager payloads
                             both ways, ring chunks out, staging in */
    uint64_t staged_tx;   /* chunks sent through staging */
    uint64_t dev_tx;      /* isends of CUDA device memory */
    uint64_t dev_rx;      /* irecvs into CUDA device memory */
    uint64_t rdv_tx;      /* messages written into the receiver's buffer */
    uint64_t rdv_rx;      /* receives completed that way */
    uint64_t rtr_tx;      /* RTRs sent */
    uint64_t rtr_rx;      /* RTRs received */
    uint64_t rts_tx;      /* RTSs sent (device sends without an RTR) */
    uint64_t ring_dev_tx; /* device messages written into a peer's ring */
} hvd_verbs_counters;

void hvd_verbs_counters_get(hvd_transport *tp, hvd_verbs_counters *out);

#endif
