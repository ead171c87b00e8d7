/*
 * gpu/gpu.h in a build without the CUDA toolkit: nothing can be opened.
 * hvd_init and the collectives refuse device memory before any of this is
 * reached (api/hvd.c); these answer for completeness.
 */
#include "gpu/gpu.h"

#include <stdio.h>

#include "transport/base/error.h"

#define NO_CUDA                                                                \
    hvd_error_set(HVD_ERR_UNSUPPORTED,                                         \
                  "this hvd was built without CUDA: rebuild it where the "     \
                  "CUDA toolkit is installed (docs/gpu.md)")

int hvd_gpu_built(void) { return 0; }

int hvd_gpu_simulated(void) { return 0; }

int hvd_gpu_nccl_built(void) { return 0; }

int hvd_gpu_nccl_version(void) { return 0; }

int hvd_gpu_nccl_usable(char *why, size_t whylen) {
    snprintf(why, whylen, "this hvd was built without CUDA and NCCL");
    return 0;
}

hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]) {
    (void)id_out;
    return NO_CUDA;
}

hvd_status hvd_gpu_bus_id(int device, char *out, size_t outlen) {
    (void)device, (void)out, (void)outlen;
    return NO_CUDA;
}

hvd_status hvd_gpu_open(const hvd_gpu_config *cfg, hvd_gpu **out) {
    (void)cfg, (void)out;
    return NO_CUDA;
}

void hvd_gpu_close(hvd_gpu *gpu) { (void)gpu; }

void hvd_gpu_abort(hvd_gpu *gpu) { (void)gpu; }

hvd_status hvd_gpu_nccl_open(hvd_gpu *gpu, const uint8_t *id, int rank,
                             int size) {
    (void)gpu, (void)id, (void)rank, (void)size;
    return NO_CUDA;
}

int hvd_gpu_has_nccl(const hvd_gpu *gpu) {
    (void)gpu;
    return 0;
}

void hvd_gpu_nccl_close(hvd_gpu *gpu) { (void)gpu; }

hvd_status hvd_gpu_fusion(hvd_gpu *gpu, size_t bytes, void **out) {
    (void)gpu, (void)bytes, (void)out;
    return NO_CUDA;
}

hvd_status hvd_gpu_copies(hvd_gpu *gpu, const hvd_gpu_copy *items, size_t n) {
    (void)gpu, (void)items, (void)n;
    return NO_CUDA;
}

hvd_status hvd_gpu_fill_neutral(hvd_gpu *gpu, void *buf, size_t count,
                                hvd_dtype dtype, hvd_op op) {
    (void)gpu, (void)buf, (void)count, (void)dtype, (void)op;
    return NO_CUDA;
}

hvd_status hvd_gpu_scale_div(hvd_gpu *gpu, void *buf, size_t count,
                             hvd_dtype dtype, int divisor) {
    (void)gpu, (void)buf, (void)count, (void)dtype, (void)divisor;
    return NO_CUDA;
}

static void m_reduce(void *ctx, void *dst, const void *a, const void *b,
                     size_t count, hvd_dtype dtype, hvd_op op) {
    (void)ctx, (void)dst, (void)a, (void)b, (void)count, (void)dtype, (void)op;
}

static void m_scale_div(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                        int divisor) {
    (void)ctx, (void)buf, (void)count, (void)dtype, (void)divisor;
}

static void m_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx, (void)dst, (void)src, (void)bytes;
}

static hvd_status m_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx, (void)bytes, (void)out;
    return NO_CUDA;
}

static void m_free(void *ctx, void *p) { (void)ctx, (void)p; }

const hvd_memops hvd_gpu_memops = {
    .name = "none",
    .reduce = m_reduce,
    .scale_div = m_scale_div,
    .copy = m_copy,
    .alloc = m_alloc,
    .free = m_free,
};

const hvd_memops hvd_gpu_memops_sync = {
    .name = "none",
    .reduce = m_reduce,
    .scale_div = m_scale_div,
    .copy = m_copy,
    .alloc = m_alloc,
    .free = m_free,
};

hvd_status hvd_gpu_sync(hvd_gpu *gpu) {
    (void)gpu;
    return NO_CUDA;
}

hvd_status hvd_gpu_stage_open(hvd_gpu *gpu, hvd_transport *inner, int size,
                              hvd_transport **out) {
    (void)gpu, (void)inner, (void)size, (void)out;
    return NO_CUDA;
}

hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *gpu, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    (void)gpu, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op;
    return NO_CUDA;
}

hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *gpu, void *buf, size_t bytes,
                                  int root) {
    (void)gpu, (void)buf, (void)bytes, (void)root;
    return NO_CUDA;
}

hvd_status hvd_gpu_nccl_allgather(hvd_gpu *gpu, const void *sendbuf,
                                  void *recvbuf, size_t bytes) {
    (void)gpu, (void)sendbuf, (void)recvbuf, (void)bytes;
    return NO_CUDA;
}

hvd_status hvd_gpu_fence(hvd_gpu *gpu, uint64_t *seq_out) {
    (void)gpu, (void)seq_out;
    return NO_CUDA;
}

hvd_status hvd_gpu_poll(hvd_gpu *gpu, uint64_t *done_out) {
    (void)gpu, (void)done_out;
    return NO_CUDA;
}
