/*
 * gpu/gpu.h with the CUDA runtime (built when the toolkit is found): open
 * and close, device memory, the memory operations of the collectives, the
 * staging seam, fences. Its NCCL part is gpu/cuda_nccl.c.
 */
#include "gpu/gpu_state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/kernels.h"
#include "gpu/stage.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

int hvd_gpu_built(void) { return 1; }

int hvd_gpu_simulated(void) { return 0; }

/* Records a CUDA failure (the first one sticks) and returns its status. */
static hvd_status cuda_fail(hvd_gpu *g, cudaError_t e, const char *call) {
    hvd_status code;

    switch (e) {
    case cudaErrorMemoryAllocation:
        code = HVD_ERR_NO_MEMORY;
        break;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
        code = HVD_ERR_UNSUPPORTED; /* this machine, not hvd */
        break;
    default:
        code = HVD_ERR_INTERNAL;
        break;
    }
    hvd_status st = hvd_error_set(code, "%s failed on CUDA device %d: %s (%s)",
                                  call, g != NULL ? g->cfg.device : -1,
                                  cudaGetErrorString(e), cudaGetErrorName(e));
    if (g != NULL && g->failed == HVD_OK) {
        g->failed = st;
        snprintf(g->failmsg, sizeof(g->failmsg), "%s", hvd_error_get());
    }
    return st;
}

hvd_status hvd_gpu_bus_id(int device, char *out, size_t outlen) {
    cudaError_t e = cudaDeviceGetPCIBusId(out, (int)outlen, device);

    return e == cudaSuccess ? HVD_OK
                            : hvd_error_set(HVD_ERR_UNSUPPORTED,
                                            "cudaDeviceGetPCIBusId(%d) "
                                            "failed: %s",
                                            device, cudaGetErrorString(e));
}

/* ------------------------------------------------------------------ */
/* Open and close                                                      */

static void CUDART_CB host_wake(void *p) {
    waker *w = p;
    int last;

    pthread_mutex_lock(&w->lock);
    if (!w->dead && w->fn != NULL)
        w->fn(w->arg);
    w->pending--;
    last = w->dead && w->pending == 0;
    pthread_mutex_unlock(&w->lock);
    if (last) {
        pthread_mutex_destroy(&w->lock);
        free(w);
    }
}

hvd_status hvd_gpu_open(const hvd_gpu_config *cfg, hvd_gpu **out) {
    hvd_gpu *g = calloc(1, sizeof(*g));
    cudaError_t e;
    hvd_status st;

    if (g == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    g->cfg = *cfg;
    g->waker = calloc(1, sizeof(*g->waker));
    if (g->waker == NULL) {
        free(g);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    pthread_mutex_init(&g->waker->lock, NULL);
    g->waker->fn = cfg->wake;
    g->waker->arg = cfg->wake_arg;
    e = cudaSetDevice(cfg->device);
    if (e != cudaSuccess) {
        st = cuda_fail(g, e, "cudaSetDevice");
        goto fail;
    }
    /* A blocking stream: it waits for work the caller queued on the
     * legacy default stream, so tensors written there are ready. */
    e = cudaStreamCreate(&g->stream);
    if (e != cudaSuccess) {
        st = cuda_fail(g, e, "cudaStreamCreate");
        goto fail;
    }
    HVD_DEBUG("gpu", "CUDA device %d, stream %p", cfg->device,
              (void *)g->stream);
    *out = g;
    return HVD_OK;
fail:
    pthread_mutex_destroy(&g->waker->lock);
    free(g->waker);
    free(g);
    return st;
}

void hvd_gpu_abort(hvd_gpu *g) {
    if (g == NULL || g->aborted)
        return;
    g->aborted = 1;
#ifdef HVD_WITH_NCCL
    if (g->comm != NULL) {
        HVD_WARN("gpu", "aborting the NCCL communicator");
        g->nccl->comm_abort(g->comm);
        g->comm = NULL;
    }
#endif
}

void hvd_gpu_close(hvd_gpu *g) {
    int last;

    if (g == NULL)
        return;
    if (!g->aborted && g->stream != NULL) {
        cudaError_t e = cudaStreamSynchronize(g->stream);
        if (e != cudaSuccess)
            HVD_WARN("gpu", "cudaStreamSynchronize at close: %s",
                     cudaGetErrorString(e));
    }
#ifdef HVD_WITH_NCCL
    if (g->comm != NULL)
        hvd_cuda_nccl_finalize(g);
#endif
    for (size_t i = 0; i < g->cap; i++)
        cudaEventDestroy(g->events[i]);
    if (g->fusion != NULL) {
        /* After an abort the stream may never drain: free in its order
         * rather than wait for the whole device. */
        if (g->aborted)
            cudaFreeAsync(g->fusion, g->stream);
        else
            cudaFree(g->fusion);
    }
    if (g->stream != NULL)
        cudaStreamDestroy(g->stream);
    pthread_mutex_lock(&g->waker->lock);
    g->waker->dead = 1;
    last = g->waker->pending == 0;
    pthread_mutex_unlock(&g->waker->lock);
    if (last) {
        pthread_mutex_destroy(&g->waker->lock);
        free(g->waker);
    }
    free(g->events);
    free(g->seqs);
    free(g->copies);
    free(g);
}

/* ------------------------------------------------------------------ */
/* Device memory                                                       */

hvd_status hvd_gpu_fusion(hvd_gpu *g, size_t bytes, void **out) {
    hvd_status st = hvd_cuda_check(g);

    if (st != HVD_OK)
        return st;
    if (bytes > g->fusion_cap) {
        void *p;
        cudaError_t e;
        /* cudaFree waits for the device, so the old buffer is not in use
         * any more when it goes. */
        if (g->fusion != NULL) {
            e = cudaFree(g->fusion);
            g->fusion = NULL;
            g->fusion_cap = 0;
            if (e != cudaSuccess)
                return cuda_fail(g, e, "cudaFree(fusion buffer)");
        }
        e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* not sticky for the device */
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "cudaMalloc of a %zu-byte fusion buffer on "
                                 "CUDA device %d failed: %s; lower "
                                 "HVD_FUSION_THRESHOLD",
                                 bytes, g->cfg.device, cudaGetErrorString(e));
        }
        g->fusion = p;
        g->fusion_cap = bytes;
    }
    *out = g->fusion;
    return HVD_OK;
}

hvd_status hvd_gpu_copies(hvd_gpu *g, const hvd_gpu_copy *items, size_t n) {
    hvd_status st = hvd_cuda_check(g);
    int rc;

    if (st != HVD_OK || n == 0)
        return st;
    if (n > g->copies_cap) {
        hvd_cuda_copy *p = realloc(g->copies, n * sizeof(*p));
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        g->copies = p;
        g->copies_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        g->copies[i].dst = items[i].dst;
        g->copies[i].src = items[i].src;
        g->copies[i].bytes = items[i].bytes;
    }
    rc = hvd_cuda_copy_batch(g->copies, n, g->stream);
    return rc == 0 ? HVD_OK
                   : cuda_fail(g, (cudaError_t)rc, "the batched copy kernel");
}

hvd_status hvd_gpu_fill_neutral(hvd_gpu *g, void *buf, size_t count,
                                hvd_dtype dtype, hvd_op op) {
    hvd_status st = hvd_cuda_check(g);
    int rc;

    if (st != HVD_OK)
        return st;
    rc = hvd_cuda_fill_neutral(buf, count, dtype, op, g->stream);
    return rc == 0 ? HVD_OK : cuda_fail(g, (cudaError_t)rc, "the fill kernel");
}

hvd_status hvd_gpu_scale_div(hvd_gpu *g, void *buf, size_t count,
                             hvd_dtype dtype, int divisor) {
    hvd_status st = hvd_cuda_check(g);
    int rc;

    if (st != HVD_OK)
        return st;
    rc = hvd_cuda_scale_div(buf, count, dtype, divisor, g->stream);
    return rc == 0 ? HVD_OK
                   : cuda_fail(g, (cudaError_t)rc, "the division kernel");
}

/* The collectives' memory operations: queued; failures stick. */
static void m_reduce(void *ctx, void *dst, const void *a, const void *b,
                     size_t count, hvd_dtype dtype, hvd_op op) {
    hvd_gpu *g = ctx;
    int rc;

    if (g->failed != HVD_OK)
        return;
    rc = hvd_cuda_reduce(dst, a, b, count, dtype, op, g->stream);
    if (rc != 0)
        cuda_fail(g, (cudaError_t)rc, "the reduction kernel");
}

static void m_scale_div(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                        int divisor) {
    hvd_gpu *g = ctx;

    if (g->failed == HVD_OK)
        hvd_gpu_scale_div(g, buf, count, dtype, divisor);
}

static void m_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    hvd_gpu *g = ctx;
    cudaError_t e;

    if (g->failed != HVD_OK || dst == src || bytes == 0)
        return;
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g->stream);
    if (e != cudaSuccess)
        cuda_fail(g, e, "cudaMemcpyAsync");
}

static hvd_status m_alloc(void *ctx, size_t bytes, void **out) {
    hvd_gpu *g = ctx;
    cudaError_t e = cudaMalloc(out, bytes);

    if (e != cudaSuccess) {
        cudaGetLastError();
        return hvd_error_set(HVD_ERR_NO_MEMORY,
                             "cudaMalloc of %zu bytes of scratch on CUDA "
                             "device %d failed: %s",
                             bytes, g->cfg.device, cudaGetErrorString(e));
    }
    return HVD_OK;
}

static void m_free(void *ctx, void *p) {
    (void)ctx;
    /* cudaFree waits for the device: nothing queued still uses p. */
    if (p != NULL)
        cudaFree(p);
}

const hvd_memops hvd_gpu_memops = {
    .name = "cuda",
    .reduce = m_reduce,
    .scale_div = m_scale_div,
    .copy = m_copy,
    .alloc = m_alloc,
    .free = m_free,
};

hvd_status hvd_gpu_sync(hvd_gpu *g) {
    hvd_status st = hvd_cuda_check(g);
    cudaError_t e;

    if (st != HVD_OK)
        return st;
    e = cudaStreamSynchronize(g->stream);
    return e == cudaSuccess ? HVD_OK : cuda_fail(g, e, "cudaStreamSynchronize");
}

static void s_reduce(void *ctx, void *dst, const void *a, const void *b,
                     size_t count, hvd_dtype dtype, hvd_op op) {
    m_reduce(ctx, dst, a, b, count, dtype, op);
    hvd_gpu_sync(ctx);
}

static void s_scale_div(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                        int divisor) {
    m_scale_div(ctx, buf, count, dtype, divisor);
    hvd_gpu_sync(ctx);
}

static void s_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    m_copy(ctx, dst, src, bytes);
    hvd_gpu_sync(ctx);
}

const hvd_memops hvd_gpu_memops_sync = {
    .name = "cuda (synchronous)",
    .reduce = s_reduce,
    .scale_div = s_scale_div,
    .copy = s_copy,
    .alloc = m_alloc,
    .free = m_free,
};

/* ------------------------------------------------------------------ */
/* The staging seam                                                    */

static hvd_status seam_alloc(void *ctx, size_t bytes, void **buf_out,
                             void **mark_out) {
    hvd_gpu *g = ctx;
    cudaEvent_t ev;
    void *buf;
    cudaError_t e = cudaHostAlloc(&buf, bytes, cudaHostAllocPortable);

    if (e != cudaSuccess) {
        cudaGetLastError();
        return hvd_error_set(HVD_ERR_NO_MEMORY,
                             "cudaHostAlloc of a %zu-byte staging buffer "
                             "failed: %s; lower HVD_GPU_STAGE_BYTES or "
                             "HVD_GPU_STAGE_DEPTH",
                             bytes, cudaGetErrorString(e));
    }
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaFreeHost(buf);
        return cuda_fail(g, e, "cudaEventCreateWithFlags");
    }
    *buf_out = buf;
    *mark_out = ev;
    return HVD_OK;
}

static void seam_free(void *ctx, void *buf, void *mark) {
    (void)ctx;
    cudaFreeHost(buf);
    cudaEventDestroy((cudaEvent_t)mark);
}

static hvd_status seam_copy(void *ctx, void *dst, const void *src, size_t bytes,
                            void *mark) {
    hvd_gpu *g = ctx;
    cudaError_t e;
    hvd_status st = hvd_cuda_check(g);

    if (st != HVD_OK)
        return st;
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g->stream);
    if (e == cudaSuccess)
        e = cudaEventRecord((cudaEvent_t)mark, g->stream);
    return e == cudaSuccess ? HVD_OK
                            : cuda_fail(g, e, "staging cudaMemcpyAsync");
}

static hvd_status seam_query(void *ctx, void *mark, int *done_out) {
    hvd_gpu *g = ctx;
    cudaError_t e = cudaEventQuery((cudaEvent_t)mark);

    if (e == cudaSuccess) {
        *done_out = 1;
        return HVD_OK;
    }
    if (e == cudaErrorNotReady) {
        *done_out = 0;
        return hvd_cuda_check(g);
    }
    return cuda_fail(g, e, "cudaEventQuery (a staging copy)");
}

hvd_status hvd_gpu_stage_open(hvd_gpu *g, hvd_transport *inner, int size,
                              hvd_transport **out) {
    hvd_stage_config cfg = {.piece_bytes = g->cfg.stage_bytes,
                            .depth = g->cfg.stage_depth};
    hvd_stage_seam seam = {
        .ctx = g,
        .slot_alloc = seam_alloc,
        .slot_free = seam_free,
        .copy = seam_copy,
        .query = seam_query,
    };

    return hvd_stage_open(inner, size, &cfg, &seam, out);
}

/* ------------------------------------------------------------------ */
/* Fences                                                              */

hvd_status hvd_gpu_fence(hvd_gpu *g, uint64_t *seq_out) {
    hvd_status st = hvd_cuda_check(g);
    cudaError_t e;

    if (st != HVD_OK)
        return st;
    if (g->count == g->cap) {
        /* Grow the ring, keeping the order: unroll it into the new one. */
        size_t cap = g->cap ? 2 * g->cap : 16;
        cudaEvent_t *ev = calloc(cap, sizeof(*ev));
        uint64_t *seqs = calloc(cap, sizeof(*seqs));
        if (ev == NULL || seqs == NULL) {
            free(ev);
            free(seqs);
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        }
        for (size_t i = 0; i < g->count; i++) {
            ev[i] = g->events[(g->head + i) % g->cap];
            seqs[i] = g->seqs[(g->head + i) % g->cap];
        }
        for (size_t i = g->count; i < cap; i++) {
            e = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
            if (e != cudaSuccess) {
                for (size_t k = g->count; k < i; k++)
                    cudaEventDestroy(ev[k]);
                free(ev);
                free(seqs);
                return cuda_fail(g, e, "cudaEventCreateWithFlags");
            }
        }
        free(g->events);
        free(g->seqs);
        g->events = ev;
        g->seqs = seqs;
        g->cap = cap;
        g->head = 0;
    }
    size_t i = (g->head + g->count) % g->cap;
    e = cudaEventRecord(g->events[i], g->stream);
    if (e != cudaSuccess)
        return cuda_fail(g, e, "cudaEventRecord");
    if (g->waker->fn != NULL) {
        pthread_mutex_lock(&g->waker->lock);
        g->waker->pending++;
        pthread_mutex_unlock(&g->waker->lock);
        e = cudaLaunchHostFunc(g->stream, host_wake, g->waker);
        if (e != cudaSuccess) {
            pthread_mutex_lock(&g->waker->lock);
            g->waker->pending--;
            pthread_mutex_unlock(&g->waker->lock);
            return cuda_fail(g, e, "cudaLaunchHostFunc");
        }
    }
    g->seqs[i] = ++g->next_seq;
    g->count++;
    *seq_out = g->next_seq;
    return HVD_OK;
}

hvd_status hvd_gpu_poll(hvd_gpu *g, uint64_t *done_out) {
    hvd_status st = hvd_cuda_check(g);

    if (st != HVD_OK)
        return st;
    while (g->count > 0) {
        cudaError_t e = cudaEventQuery(g->events[g->head]);
        if (e == cudaErrorNotReady)
            break;
        if (e != cudaSuccess)
            return cuda_fail(g, e, "the work queued on hvd's stream");
        g->done_seq = g->seqs[g->head];
        g->head = (g->head + 1) % g->cap;
        g->count--;
    }
#ifdef HVD_WITH_NCCL
    st = hvd_cuda_nccl_poll(g);
    if (st != HVD_OK)
        return st;
#endif
    *done_out = g->done_seq;
    return HVD_OK;
}
