/*
 * The GPU side of the engine (docs/gpu.md): one hvd_gpu per engine, used
 * from the engine thread only (except the wake callback).
 *
 * Everything hvd does to device memory is queued on one CUDA stream of its
 * own, in the order the engine asks: packing tensors into the device
 * fusion buffer (batched kernels), the collective (NCCL; or, over a
 * transport that reads host memory only, the staging copies and the
 * reduction kernels the collectives queue through hvd_gpu_memops), the
 * division of an average, unpacking. The engine does not wait for the
 * stream: it places a fence after an operation and completes the
 * operation's requests once hvd_gpu_poll says the fence is reached (a
 * CUDA event, polled; a host callback on the stream wakes the engine
 * then, so it need not spin).
 *
 * Built with the CUDA toolkit (gpu/cuda.c); without it (gpu/nocuda.c)
 * hvd_gpu_open fails with HVD_ERR_UNSUPPORTED and nothing else is reached.
 * NCCL (gpu/nccl.c) is loaded with dlopen when first needed, so libhvd
 * loads where libnccl is not installed.
 *
 * Errors: a failing CUDA or NCCL call is turned into an hvd_status with the
 * library's own text (and the call) in hvd_last_error(). Errors of queued
 * work surface at the next hvd_gpu_poll; after one the stream's state is
 * unknown and the engine treats it as fatal.
 */
#ifndef HVD_GPU_GPU_H
#define HVD_GPU_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"
#include "transport/base/memops.h"
#include "transport/transport.h"

/* An NCCL unique id (ncclUniqueId is 128 bytes). */
#define HVD_NCCL_ID_BYTES 128

typedef struct hvd_gpu hvd_gpu;

typedef struct hvd_gpu_config {
    int device;         /* CUDA device ordinal to use */
    size_t stage_bytes; /* staging piece size (HVD_GPU_STAGE_BYTES) */
    int stage_depth;    /* staging pieces in flight (HVD_GPU_STAGE_DEPTH) */
    int64_t nccl_timeout_ns; /* bound on setting up NCCL */
    /* Called from any thread (a CUDA host callback) when a fence may have
     * been reached; must not block or call CUDA. */
    void (*wake)(void *arg);
    void *wake_arg;
} hvd_gpu_config;

/* 1 if this hvd was built with CUDA (with NCCL). */
int hvd_gpu_built(void);

/* 1 only in the tests' libhvd with a simulated GPU (tests/gpu/sim_gpu.c),
 * whose "device memory" the CPU can read: there HVD_TEST_GPU_DIRECT=1 makes
 * the transport count as reading device memory, to test the direct path. */
int hvd_gpu_simulated(void);
int hvd_gpu_nccl_built(void);
/* NCCL_VERSION_CODE of the nccl.h this hvd was built with (21805 for
 * 2.18.5), 0 without NCCL. */
int hvd_gpu_nccl_version(void);

/*
 * Whether NCCL can be used on this rank: built in, libnccl loadable (it is
 * loaded here), recent enough. On 0, why gets a phrase for a sentence.
 */
int hvd_gpu_nccl_usable(char *why, size_t whylen);

/* Rank 0 of a job makes the id every rank's NCCL communicator starts
 * from; hvd_init hands it to the others through its bootstrap. */
hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]);

/* The PCI bus id of device ("0000:3b:00.0"), to tell whether two ranks of
 * a host share a GPU (NCCL refuses that). Creates no context. */
hvd_status hvd_gpu_bus_id(int device, char *out, size_t outlen);

/*
 * Selects cfg->device for the calling thread, creates the stream and the
 * events. Makes the device's primary context current (CUDA creates it on
 * first use): this is where a job first touches its GPU.
 */
hvd_status hvd_gpu_open(const hvd_gpu_config *cfg, hvd_gpu **out);

/* Waits for everything queued, then frees; accepts NULL. After
 * hvd_gpu_abort it does not wait. */
void hvd_gpu_close(hvd_gpu *gpu);

/* The job failed (a peer is lost): aborts the NCCL communicator, so that
 * no kernel waits on the dead peer, and stops waiting for the stream. */
void hvd_gpu_abort(hvd_gpu *gpu);

/*
 * Makes the NCCL communicator of rank among size from id (every rank
 * calls it together; the one of a job of one needs no id from others:
 * pass NULL). Bounded by cfg->nccl_timeout_ns; on failure nothing is left
 * (the communicator is aborted).
 */
hvd_status hvd_gpu_nccl_open(hvd_gpu *gpu, const uint8_t *id, int rank,
                             int size);
int hvd_gpu_has_nccl(const hvd_gpu *gpu);

/* Drops the NCCL communicator (aborted: the ranks that set it up agree
 * not to use it, because another could not). */
void hvd_gpu_nccl_close(hvd_gpu *gpu);

/* ---- device memory operations, queued on the stream ---- */

/* The device fusion buffer, at least bytes (> 0), grown as needed (growing
 * waits for the stream: its old contents are dropped). */
hvd_status hvd_gpu_fusion(hvd_gpu *gpu, size_t bytes, void **out);

/* Batched copies (pack and unpack): one kernel per 64 of them. */
typedef struct hvd_gpu_copy {
    void *dst;
    const void *src;
    size_t bytes;
} hvd_gpu_copy;
hvd_status hvd_gpu_copies(hvd_gpu *gpu, const hvd_gpu_copy *items, size_t n);

hvd_status hvd_gpu_fill_neutral(hvd_gpu *gpu, void *buf, size_t count,
                                hvd_dtype dtype, hvd_op op);
hvd_status hvd_gpu_scale_div(hvd_gpu *gpu, void *buf, size_t count,
                             hvd_dtype dtype, int divisor);

/*
 * The collectives' memory operations on device memory (ctx: the hvd_gpu),
 * queued on the stream; their errors surface at hvd_gpu_poll.
 */
extern const hvd_memops hvd_gpu_memops;

/* The same, each operation waited for before it returns: for a transport
 * that reads and writes device memory itself (GPUDirect), whose sends
 * must not start before the kernel that made their data has finished. */
extern const hvd_memops hvd_gpu_memops_sync;

/* Waits until everything queued on hvd's stream has run. */
hvd_status hvd_gpu_sync(hvd_gpu *gpu);

/* The staging pipeline (gpu/stage.h) over inner, its copies on the stream
 * and its slots pinned memory. Close it before the hvd_gpu. */
hvd_status hvd_gpu_stage_open(hvd_gpu *gpu, hvd_transport *inner, int size,
                              hvd_transport **out);

/* ---- NCCL collectives, queued on the stream ---- */

/* op: HVD_AVERAGE is not taken (sum, then hvd_gpu_scale_div). */
hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *gpu, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op);
hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *gpu, void *buf, size_t bytes,
                                  int root);
hvd_status hvd_gpu_nccl_allgather(hvd_gpu *gpu, const void *sendbuf,
                                  void *recvbuf, size_t bytes);

/* ---- completion ---- */

/* Places a fence after everything queued so far; *seq_out numbers it
 * (1, 2, ...). */
hvd_status hvd_gpu_fence(hvd_gpu *gpu, uint64_t *seq_out);

/*
 * *done_out = the highest fence reached (fences are reached in order).
 * Also reports the first error of queued work, and NCCL's asynchronous
 * errors (ncclCommGetAsyncError) with NCCL's text.
 */
hvd_status hvd_gpu_poll(hvd_gpu *gpu, uint64_t *done_out);

#endif
