/*
 * A simulated GPU behind gpu/gpu.h, for tests on machines without one:
 * libhvd_simgpu is the library with this in place of gpu/cuda.c. Its
 * "device memory" is host memory that tests/gpu/fake_libcuda.c calls
 * device memory, so hvd's own detection sends it down the device path:
 * negotiation, separate fusion, the device executor, fences and the
 * engine's completion of them, and the staging pipeline over the real
 * transport with the collectives' device memory operations.
 *
 * Like a stream, the work is queued and runs later, in order, on a thread
 * of its own (the "GPU"), which now and then lets others run between two
 * operations and calls the engine's wake-up when a fence is reached. So a
 * result read before its fence, or an operation queued out of order, shows
 * as a wrong result. The reductions are collectives/reduce.c's (the CUDA
 * kernels have their own tests). NCCL is never usable here.
 */
#include "gpu/gpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reduce.h"
#include "gpu/stage.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

enum { Q_COPY = 1, Q_REDUCE, Q_SCALE, Q_FILL, Q_MARK, Q_FENCE };

typedef struct qop {
    int kind;
    void *dst;
    const void *a, *b;
    size_t n;
    hvd_dtype dtype;
    hvd_op op;
    int divisor;
    uint64_t *mark; /* Q_MARK: set to seq when run */
    uint64_t seq;
} qop;

struct hvd_gpu {
    hvd_gpu_config cfg;
    pthread_t thread;
    pthread_mutex_t mu; /* the queue, marks and fences_done */
    pthread_cond_t cv;
    int stop;
    qop *q;
    size_t head, n, cap;
    uint64_t next_seq;
    uint64_t fences, fences_done;
    void *fusion;
    size_t fusion_cap;
    unsigned seed;
};

int hvd_gpu_built(void) { return 1; }

int hvd_gpu_simulated(void) { return 1; }

int hvd_gpu_nccl_built(void) { return 0; }

int hvd_gpu_nccl_version(void) { return 0; }

int hvd_gpu_nccl_usable(char *why, size_t whylen) {
    snprintf(why, whylen, "a simulated GPU has no NCCL");
    return 0;
}

hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]) {
    (void)id_out;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "a simulated GPU has no NCCL");
}

hvd_status hvd_gpu_bus_id(int device, char *out, size_t outlen) {
    snprintf(out, outlen, "sim:%d", device);
    return HVD_OK;
}

static hvd_status push(hvd_gpu *g, qop op) {
    pthread_mutex_lock(&g->mu);
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 256;
        qop *q = realloc(g->q, cap * sizeof(*q));
        if (q == NULL) {
            pthread_mutex_unlock(&g->mu);
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        }
        g->q = q;
        g->cap = cap;
    }
    op.seq = ++g->next_seq;
    g->q[g->n++] = op;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return HVD_OK;
}

/* Runs one operation (the GPU thread, unlocked: the engine does not touch
 * what it writes until a mark or fence after it is reached). */
static void run_one(const qop *op) {
    switch (op->kind) {
    case Q_COPY:
        if (op->n > 0 && op->dst != op->a)
            memmove(op->dst, op->a, op->n);
        break;
    case Q_REDUCE:
        hvd_reduce(op->dst, op->a, op->b, op->n, op->dtype, op->op);
        break;
    case Q_SCALE:
        hvd_reduce_scale_div(op->dst, op->n, op->dtype, op->divisor);
        break;
    case Q_FILL:
        hvd_reduce_fill_neutral(op->dst, op->n, op->dtype, op->op);
        break;
    default: /* Q_MARK, Q_FENCE: under the lock, in gpu_main */
        break;
    }
}

static void *gpu_main(void *arg) {
    hvd_gpu *g = arg;

    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stop && g->head == g->n)
            pthread_cond_wait(&g->cv, &g->mu);
        if (g->head == g->n)
            break; /* stop, and nothing left */
        qop op = g->q[g->head];
        pthread_mutex_unlock(&g->mu);
        run_one(&op);
        g->seed = g->seed * 1103515245u + 12345u;
        if ((g->seed >> 16) % 4 == 0)
            sched_yield(); /* the GPU is late now and then */
        pthread_mutex_lock(&g->mu);
        if (op.kind == Q_MARK)
            *op.mark = op.seq;
        if (op.kind == Q_FENCE)
            g->fences_done++;
        g->head++;
        if (g->head == g->n)
            g->head = g->n = 0;
        pthread_cond_broadcast(&g->cv);
        if (op.kind == Q_FENCE && g->cfg.wake != NULL) {
            pthread_mutex_unlock(&g->mu);
            g->cfg.wake(g->cfg.wake_arg);
            pthread_mutex_lock(&g->mu);
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Waits until the GPU has run everything queued (cudaFree, cudaMalloc and
 * growing the fusion buffer wait for the device too). */
static void run_all(hvd_gpu *g) {
    pthread_mutex_lock(&g->mu);
    while (g->head < g->n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

hvd_status hvd_gpu_open(const hvd_gpu_config *cfg, hvd_gpu **out) {
    hvd_gpu *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    g->cfg = *cfg;
    g->seed = 12345u + (unsigned)cfg->device;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, gpu_main, g) != 0) {
        free(g);
        return hvd_error_set(HVD_ERR_INTERNAL, "simulated GPU: no thread");
    }
    HVD_DEBUG("gpu", "simulated GPU %d", cfg->device);
    *out = g;
    return HVD_OK;
}

void hvd_gpu_close(hvd_gpu *g) {
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->fusion);
    free(g->q);
    free(g);
}

void hvd_gpu_abort(hvd_gpu *g) { (void)g; }

hvd_status hvd_gpu_nccl_open(hvd_gpu *g, const uint8_t *id, int rank,
                             int size) {
    (void)g, (void)id, (void)rank, (void)size;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "a simulated GPU has no NCCL");
}

int hvd_gpu_has_nccl(const hvd_gpu *g) {
    (void)g;
    return 0;
}

void hvd_gpu_nccl_close(hvd_gpu *g) { (void)g; }

hvd_status hvd_gpu_fusion(hvd_gpu *g, size_t bytes, void **out) {
    if (bytes > g->fusion_cap) {
        run_all(g); /* as cudaFree waits */
        free(g->fusion);
        g->fusion = malloc(bytes);
        g->fusion_cap = g->fusion != NULL ? bytes : 0;
        if (g->fusion == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    *out = g->fusion;
    return HVD_OK;
}

hvd_status hvd_gpu_copies(hvd_gpu *g, const hvd_gpu_copy *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        qop op = {.kind = Q_COPY,
                  .dst = items[i].dst,
                  .a = items[i].src,
                  .n = items[i].bytes};
        hvd_status st = push(g, op);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

hvd_status hvd_gpu_fill_neutral(hvd_gpu *g, void *buf, size_t count,
                                hvd_dtype dtype, hvd_op op) {
    qop q = {.kind = Q_FILL, .dst = buf, .n = count, .dtype = dtype, .op = op};
    return push(g, q);
}

hvd_status hvd_gpu_scale_div(hvd_gpu *g, void *buf, size_t count,
                             hvd_dtype dtype, int divisor) {
    qop q = {.kind = Q_SCALE,
             .dst = buf,
             .n = count,
             .dtype = dtype,
             .divisor = divisor};
    return push(g, q);
}

static void m_reduce(void *ctx, void *dst, const void *a, const void *b,
                     size_t count, hvd_dtype dtype, hvd_op op) {
    qop q = {.kind = Q_REDUCE,
             .dst = dst,
             .a = a,
             .b = b,
             .n = count,
             .dtype = dtype,
             .op = op};
    push(ctx, q);
}

static void m_scale_div(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                        int divisor) {
    hvd_gpu_scale_div(ctx, buf, count, dtype, divisor);
}

static void m_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    qop q = {.kind = Q_COPY, .dst = dst, .a = src, .n = bytes};
    if (dst != src && bytes > 0)
        push(ctx, q);
}

static hvd_status m_alloc(void *ctx, size_t bytes, void **out) {
    run_all(ctx);
    *out = malloc(bytes);
    return *out != NULL ? HVD_OK
                        : hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
}

static void m_free(void *ctx, void *p) {
    run_all(ctx);
    free(p);
}

const hvd_memops hvd_gpu_memops = {
    .name = "simulated",
    .reduce = m_reduce,
    .scale_div = m_scale_div,
    .copy = m_copy,
    .alloc = m_alloc,
    .free = m_free,
};

hvd_status hvd_gpu_sync(hvd_gpu *g) {
    run_all(g);
    return HVD_OK;
}

static void s_reduce(void *ctx, void *dst, const void *a, const void *b,
                     size_t count, hvd_dtype dtype, hvd_op op) {
    m_reduce(ctx, dst, a, b, count, dtype, op);
    run_all(ctx);
}

static void s_scale_div(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                        int divisor) {
    m_scale_div(ctx, buf, count, dtype, divisor);
    run_all(ctx);
}

static void s_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    m_copy(ctx, dst, src, bytes);
    run_all(ctx);
}

const hvd_memops hvd_gpu_memops_sync = {
    .name = "simulated (synchronous)",
    .reduce = s_reduce,
    .scale_div = s_scale_div,
    .copy = s_copy,
    .alloc = m_alloc,
    .free = m_free,
};

static hvd_status seam_alloc(void *ctx, size_t bytes, void **buf, void **mark) {
    (void)ctx;
    *buf = malloc(bytes);
    *mark = calloc(1, sizeof(uint64_t));
    if (*buf == NULL || *mark == NULL) {
        free(*buf);
        free(*mark);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    return HVD_OK;
}

static void seam_free(void *ctx, void *buf, void *mark) {
    (void)ctx;
    free(buf);
    free(mark);
}

static hvd_status seam_copy(void *ctx, void *dst, const void *src, size_t bytes,
                            void *mark) {
    hvd_gpu *g = ctx;
    qop c = {.kind = Q_COPY, .dst = dst, .a = src, .n = bytes};
    qop m = {.kind = Q_MARK, .mark = mark};
    hvd_status st;

    /* Not reached until the Q_MARK runs (the slot's last copy has). */
    pthread_mutex_lock(&g->mu);
    *(uint64_t *)mark = 0;
    pthread_mutex_unlock(&g->mu);
    st = push(g, c);
    if (st == HVD_OK)
        st = push(g, m);
    return st;
}

static hvd_status seam_query(void *ctx, void *mark, int *done) {
    hvd_gpu *g = ctx;

    pthread_mutex_lock(&g->mu);
    *done = *(uint64_t *)mark != 0;
    pthread_mutex_unlock(&g->mu);
    return HVD_OK;
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

hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    (void)g, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "a simulated GPU has no NCCL");
}

hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *g, void *buf, size_t bytes,
                                  int root) {
    (void)g, (void)buf, (void)bytes, (void)root;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "a simulated GPU has no NCCL");
}

hvd_status hvd_gpu_nccl_allgather(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t bytes) {
    (void)g, (void)sendbuf, (void)recvbuf, (void)bytes;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "a simulated GPU has no NCCL");
}

hvd_status hvd_gpu_fence(hvd_gpu *g, uint64_t *seq_out) {
    qop q = {.kind = Q_FENCE};
    hvd_status st = push(g, q);

    if (st == HVD_OK)
        *seq_out = ++g->fences;
    return st;
}

hvd_status hvd_gpu_poll(hvd_gpu *g, uint64_t *done_out) {
    pthread_mutex_lock(&g->mu);
    *done_out = g->fences_done;
    pthread_mutex_unlock(&g->mu);
    return HVD_OK;
}
