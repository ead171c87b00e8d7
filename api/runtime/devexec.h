/*
 * The engine's executor for device tensors: runs the allreduces,
 * broadcasts and allgathers whose buffers are CUDA device memory, on the
 * engine thread, in the cycle's order, without waiting for the GPU.
 *
 * The path (the same on every rank, decided once):
 * - "nccl": NCCL's collectives, when every rank could set NCCL up
 *   (HVD_TRANSPORT=nccl requires it; auto takes it where possible);
 * - "direct": the collectives of collectives/ over the engine's transport,
 *   which reads device memory itself (GPUDirect RDMA; caps.mem_types);
 * - "staged": the same collectives over the staging pipeline
 *   (gpu/stage.h) around the engine's transport (tcp, shm, mpi);
 * - "local": a job of one, copies only.
 * In all of them the reductions and copies run on the GPU (gpu/kernels.cu)
 * on hvd's stream; a fused group is packed into the device fusion buffer
 * and unpacked by batched kernels.
 *
 * Setup is lazy: the first device operation of the job opens the GPU (and
 * NCCL), so a host-only job never creates a CUDA context. Every rank
 * reaches that operation at the same point of the order and they agree,
 * through the engine's host communicator, whether it worked everywhere;
 * if not, every rank fails that and every later device operation with the
 * same sentence (host operations go on).
 *
 * Each operation ends with a fence; the engine completes its requests
 * when hvd_devexec_poll says the fence is reached.
 */
#ifndef HVD_API_DEVEXEC_H
#define HVD_API_DEVEXEC_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/comm.h"
#include "gpu/gpu.h"
#include "hvd/types.h"
#include "transport/transport.h"

/* How NCCL is wanted. */
enum { HVD_NCCL_OFF = 0, HVD_NCCL_AUTO, HVD_NCCL_REQUIRED };

typedef struct hvd_devexec_config {
    int rank;
    int size;
    hvd_transport *tp;     /* the engine's (NULL in a job of one) */
    unsigned tp_mem_types; /* its caps.mem_types */
    hvd_comm *host;        /* the engine's data communicator (to agree) */
    hvd_comm_config comm;  /* for the device communicator */
    hvd_gpu_config gpu;
    int nccl;         /* HVD_NCCL_* */
    int nccl_have_id; /* nccl_id holds rank 0's id (jobs of several) */
    uint8_t nccl_id[HVD_NCCL_ID_BYTES];
} hvd_devexec_config;

typedef struct hvd_devexec hvd_devexec;

/* One tensor of an operation. send == NULL: a joined rank's share (the
 * op's neutral element). */
typedef struct hvd_dev_tensor {
    const void *send;
    void *recv;
    uint64_t count;
} hvd_dev_tensor;

/* Touches no GPU. cfg is copied. */
hvd_status hvd_devexec_create(const hvd_devexec_config *cfg, hvd_devexec **out);

/* Waits (bounded by timeout_ns) for the GPU to finish what is queued, then
 * frees; accepts NULL. Engine thread. */
void hvd_devexec_destroy(hvd_devexec *dev, int64_t timeout_ns);

/* The job failed: stops every wait on the GPU (aborts NCCL). */
void hvd_devexec_abort(hvd_devexec *dev);

/*
 * The operations. Each queues its work and a fence; *seq_out numbers the
 * fence. On failure *fatal_out says whether the engine can go on: 0 when
 * the GPU cannot be used on some rank (every rank fails the operation
 * alike, with the sentence), 1 when the job cannot go on.
 *
 * allreduce: tensors t[0..n), one collective (fused unless n == 1); a
 * joined rank's tensors (send NULL) are the neutral element, and
 * HVD_AVERAGE divides by the job's size all the same.
 */
hvd_status hvd_devexec_allreduce(hvd_devexec *dev, const hvd_dev_tensor *t,
                                 size_t n, hvd_dtype dtype, hvd_op op,
                                 uint64_t *seq_out, int *fatal_out);
hvd_status hvd_devexec_broadcast(hvd_devexec *dev, void *buf, size_t count,
                                 hvd_dtype dtype, int root, uint64_t *seq_out,
                                 int *fatal_out);
hvd_status hvd_devexec_allgather(hvd_devexec *dev, const void *sendbuf,
                                 void *recvbuf, size_t count, hvd_dtype dtype,
                                 uint64_t *seq_out, int *fatal_out);

/* *done_out = the last fence reached (0 before any). Never blocks. */
hvd_status hvd_devexec_poll(hvd_devexec *dev, uint64_t *done_out);

/* "nccl", "staged over tcp", "direct over verbs", "local", or "none"
 * before setup: where device tensors go (timeline, log). */
const char *hvd_devexec_path(const hvd_devexec *dev);

#endif
