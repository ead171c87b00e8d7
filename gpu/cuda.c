/*
 * gpu/gpu.h with the CUDA runtime (built when the toolkit is found).
 */
#include "gpu/gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu/kernels.h"
#include "gpu/stage.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

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

static hvd_status check(hvd_gpu *g) {
    return g->failed == HVD_OK ? HVD_OK : hvd_error_copy(g->failed, g->failmsg);
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

#ifdef HVD_WITH_NCCL
static void nccl_close(hvd_gpu *g);
#endif

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
        nccl_close(g);
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
    hvd_status st = check(g);

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
    hvd_status st = check(g);
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
    hvd_status st = check(g);
    int rc;

    if (st != HVD_OK)
        return st;
    rc = hvd_cuda_fill_neutral(buf, count, dtype, op, g->stream);
    return rc == 0 ? HVD_OK : cuda_fail(g, (cudaError_t)rc, "the fill kernel");
}

hvd_status hvd_gpu_scale_div(hvd_gpu *g, void *buf, size_t count,
                             hvd_dtype dtype, int divisor) {
    hvd_status st = check(g);
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
    hvd_status st = check(g);
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
    hvd_status st = check(g);

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
        return check(g);
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
    hvd_status st = check(g);
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
    hvd_status st = check(g);

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
    if (g->comm != NULL) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t rc = g->nccl->comm_get_async_error(g->comm, &state);
        if (rc == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
            rc = state;
        if (rc != ncclSuccess) {
            st = hvd_nccl_error(g->nccl, rc, g->comm,
                                "an NCCL collective (ncclCommGetAsyncError)");
            g->failed = st;
            snprintf(g->failmsg, sizeof(g->failmsg), "%s", hvd_error_get());
            return st;
        }
    }
#endif
    *done_out = g->done_seq;
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* NCCL                                                                */

#ifdef HVD_WITH_NCCL

int hvd_gpu_nccl_built(void) { return 1; }

int hvd_gpu_nccl_version(void) { return hvd_nccl_header_version(); }

int hvd_gpu_nccl_usable(char *why, size_t whylen) {
    return hvd_nccl_load(why, whylen) != NULL;
}

hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]) {
    char why[320];
    const hvd_nccl_api *api = hvd_nccl_load(why, sizeof(why));
    ncclUniqueId id;
    ncclResult_t rc;

    if (api == NULL)
        return hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", why);
    rc = api->get_unique_id(&id);
    if (rc != ncclSuccess)
        return hvd_nccl_error(api, rc, NULL, "ncclGetUniqueId");
    memcpy(id_out, &id, HVD_NCCL_ID_BYTES);
    return HVD_OK;
}

/* A non-blocking communicator may answer ncclInProgress: waits (bounded)
 * until it has finished what it was asked. Setup only: a collective's
 * launch is done in microseconds. */
static hvd_status nccl_ready(hvd_gpu *g, ncclComm_t comm, ncclResult_t rc,
                             const char *call) {
    int64_t deadline = hvd_now_ns() + g->cfg.nccl_timeout_ns;

    while (rc == ncclInProgress) {
        ncclResult_t state = ncclInProgress;
        rc = g->nccl->comm_get_async_error(comm, &state);
        if (rc == ncclSuccess)
            rc = state;
        if (rc == ncclInProgress) {
            if (hvd_now_ns() > deadline)
                return hvd_error_set(HVD_ERR_TIMEOUT,
                                     "%s did not finish within %.0f s", call,
                                     (double)g->cfg.nccl_timeout_ns / 1e9);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    return rc == ncclSuccess ? HVD_OK : hvd_nccl_error(g->nccl, rc, comm, call);
}

hvd_status hvd_gpu_nccl_open(hvd_gpu *g, const uint8_t *id, int rank,
                             int size) {
    char why[320];
    ncclUniqueId uid;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    ncclResult_t rc;
    hvd_status st;

    g->nccl = hvd_nccl_load(why, sizeof(why));
    if (g->nccl == NULL)
        return hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", why);
    if (id != NULL) {
        memcpy(&uid, id, sizeof(uid));
    } else {
        rc = g->nccl->get_unique_id(&uid);
        if (rc != ncclSuccess)
            return hvd_nccl_error(g->nccl, rc, NULL, "ncclGetUniqueId");
    }
    /* Non-blocking, so that setup is bounded and an error is seen. */
    config.blocking = 0;
    rc = g->nccl->comm_init_rank_config(&comm, size, uid, rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
        return hvd_nccl_error(g->nccl, rc, comm, "ncclCommInitRankConfig");
    st = nccl_ready(g, comm, rc, "ncclCommInitRankConfig");
    if (st != HVD_OK) {
        if (comm != NULL)
            g->nccl->comm_abort(comm);
        return st;
    }
    g->comm = comm;
    HVD_INFO("gpu", "NCCL %d communicator: rank %d of %d on CUDA device %d",
             g->nccl->version, rank, size, g->cfg.device);
    return HVD_OK;
}

int hvd_gpu_has_nccl(const hvd_gpu *g) { return g->comm != NULL; }

/* A non-blocking communicator is finalized (its work flushed, bounded),
 * then destroyed; one that will not finish is aborted. */
static void nccl_close(hvd_gpu *g) {
    ncclResult_t rc = g->nccl->comm_finalize(g->comm);

    if ((rc == ncclSuccess || rc == ncclInProgress) &&
        nccl_ready(g, g->comm, ncclInProgress, "ncclCommFinalize") == HVD_OK) {
        g->nccl->comm_destroy(g->comm);
    } else {
        HVD_WARN("gpu", "NCCL communicator not finalized (%s); aborting it",
                 hvd_error_get());
        g->nccl->comm_abort(g->comm);
    }
    g->comm = NULL;
}

void hvd_gpu_nccl_close(hvd_gpu *g) {
    if (g->comm != NULL) {
        g->nccl->comm_abort(g->comm);
        g->comm = NULL;
    }
}

static ncclDataType_t nccl_dtype(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
        return ncclUint8;
    case HVD_INT8:
        return ncclInt8;
    case HVD_INT32:
        return ncclInt32;
    case HVD_INT64:
        return ncclInt64;
    case HVD_FLOAT16:
        return ncclFloat16;
    case HVD_BFLOAT16:
        return ncclBfloat16;
    case HVD_FLOAT32:
        return ncclFloat32;
    case HVD_FLOAT64:
        break;
    }
    return ncclFloat64;
}

static ncclRedOp_t nccl_op(hvd_op op) {
    switch (op) {
    case HVD_PRODUCT:
        return ncclProd;
    case HVD_MIN:
        return ncclMin;
    case HVD_MAX:
        return ncclMax;
    default:
        return ncclSum;
    }
}

/* Turns a collective's launch result into a status; a failure sticks. */
static hvd_status launched(hvd_gpu *g, ncclResult_t rc, const char *call) {
    hvd_status st =
        rc == ncclInProgress
            ? nccl_ready(g, g->comm, rc, call)
            : (rc == ncclSuccess ? HVD_OK
                                 : hvd_nccl_error(g->nccl, rc, g->comm, call));
    if (st != HVD_OK && g->failed == HVD_OK) {
        g->failed = st;
        snprintf(g->failmsg, sizeof(g->failmsg), "%s", hvd_error_get());
    }
    return st;
}

hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    hvd_status st = check(g);

    if (st != HVD_OK)
        return st;
    return launched(g,
                    g->nccl->all_reduce(sendbuf, recvbuf, count,
                                        nccl_dtype(dtype), nccl_op(op), g->comm,
                                        g->stream),
                    "ncclAllReduce");
}

hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *g, void *buf, size_t bytes,
                                  int root) {
    hvd_status st = check(g);

    if (st != HVD_OK)
        return st;
    return launched(g,
                    g->nccl->broadcast(buf, buf, bytes, ncclUint8, root,
                                       g->comm, g->stream),
                    "ncclBroadcast");
}

hvd_status hvd_gpu_nccl_allgather(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t bytes) {
    hvd_status st = check(g);

    if (st != HVD_OK)
        return st;
    return launched(g,
                    g->nccl->all_gather(sendbuf, recvbuf, bytes, ncclUint8,
                                        g->comm, g->stream),
                    "ncclAllGather");
}

#else /* CUDA without NCCL */

int hvd_gpu_nccl_built(void) { return 0; }

int hvd_gpu_nccl_version(void) { return 0; }

int hvd_gpu_nccl_usable(char *why, size_t whylen) {
    snprintf(why, whylen, "this hvd was built without NCCL");
    return 0;
}

hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]) {
    (void)id_out;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "this hvd was built without NCCL");
}

hvd_status hvd_gpu_nccl_open(hvd_gpu *g, const uint8_t *id, int rank,
                             int size) {
    (void)g, (void)id, (void)rank, (void)size;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "this hvd was built without NCCL");
}

int hvd_gpu_has_nccl(const hvd_gpu *g) {
    (void)g;
    return 0;
}

void hvd_gpu_nccl_close(hvd_gpu *g) { (void)g; }

hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    (void)g, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "no NCCL");
}

hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *g, void *buf, size_t bytes,
                                  int root) {
    (void)g, (void)buf, (void)bytes, (void)root;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "no NCCL");
}

hvd_status hvd_gpu_nccl_allgather(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t bytes) {
    (void)g, (void)sendbuf, (void)recvbuf, (void)bytes;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "no NCCL");
}

#endif
