/*
 * Private to the CUDA backend of gpu/gpu.h: the hvd_gpu its two files
 * share. gpu/cuda.c (open and close, device memory, the collectives'
 * memory operations, staging, fences) calls gpu/cuda_nccl.c (the NCCL
 * communicator and its collectives), never the reverse. Nothing else
 * includes this.
 */
#ifndef HVD_GPU_GPU_STATE_H
#define HVD_GPU_GPU_STATE_H

#include "gpu/gpu.h"

#include <pthread.h>

#include <cuda_runtime_api.h>

#include "gpu/kernels.h"
#include "transport/base/error.h"

#ifdef HVD_WITH_NCCL
#include "gpu/nccl.h"
_Static_assert(sizeof(ncclUniqueId) == HVD_NCCL_ID_BYTES,
               "an NCCL unique id is 128 bytes");
#endif

/*
 * What a host callback on the stream reaches. It outlives the hvd_gpu if a
 * callback may still be queued when the hvd_gpu is closed after an abort;
 * the lock makes close wait for a callback that is running.
 */
typedef struct waker {
    pthread_mutex_t lock;
    int pending; /* callbacks queued and not run */
    int dead;    /* the hvd_gpu is gone: call nothing */
    void (*fn)(void *arg);
    void *arg;
} waker;

struct hvd_gpu {
    hvd_gpu_config cfg;
    cudaStream_t stream;
    void *fusion;
    size_t fusion_cap;
    /* Fences: a ring of events in the order they were recorded. */
    cudaEvent_t *events;
    uint64_t *seqs;
    size_t cap, head, count;
    uint64_t next_seq, done_seq;
    waker *waker;
    hvd_cuda_copy *copies;
    size_t copies_cap;
    /* The first failure of queued work: everything fails after it. */
    hvd_status failed;
    char failmsg[HVD_ERROR_MAX];
    int aborted;
#ifdef HVD_WITH_NCCL
    const hvd_nccl_api *nccl;
    ncclComm_t comm;
#endif
};

/* The first failure of queued work, again: everything fails after it. */
static inline hvd_status hvd_cuda_check(hvd_gpu *g) {
    return g->failed == HVD_OK ? HVD_OK : hvd_error_copy(g->failed, g->failmsg);
}

#ifdef HVD_WITH_NCCL
/* gpu/cuda_nccl.c: at close, g's communicator is finalized (its work
 * flushed, bounded), then destroyed; one that will not finish is
 * aborted. */
void hvd_cuda_nccl_finalize(hvd_gpu *g);
/* An asynchronous error of g's communicator, which sticks (hvd_gpu_poll). */
hvd_status hvd_cuda_nccl_poll(hvd_gpu *g);
#endif

#endif
