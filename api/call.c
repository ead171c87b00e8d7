/*
 * One call of the collectives (api/call.h): its set, locating its
 * buffers, a shape's count, waiting. What the fast path of a blocking
 * allreduce runs through (checking its buffers, its request, handing it
 * over) is inline in api/call.h.
 */
#include "api/call.h"

#include <stdio.h>
#include <string.h>

#include "api/job.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"
#include "transport/base/memtype.h"

hvd_status hvd_call_begin(hvd_call *c, const char *fn, const char *name, int ps,
                          hvd_call_mode mode) {
    hvd_call_start(c, fn, name, mode);
    if (ps != 0) {
        hvd_status st = hvd_job_pset(fn, name, ps, &c->ps_size, &c->ps_index);
        if (st != HVD_OK)
            return st;
        c->ps = ps;
    }
    return HVD_OK;
}

int hvd_call_size(const hvd_call *c) {
    if (c->ps != 0)
        return c->ps_size;
    return hvd_size() > 0 ? hvd_size() : 1;
}

/* What the caller calls buffer k (0 send, 1 receive) of part i, for an
 * error message. */
static const char *buffer_label(int n, int same, int i, int k, char *buf,
                                size_t len) {
    if (n > 1)
        snprintf(buf, len, "%s[%d]", k == 0 ? "sendbufs" : "recvbufs", i);
    else
        snprintf(buf, len, "%s", same ? "buf" : k == 0 ? "sendbuf" : "recvbuf");
    return buf;
}

/* Device memory of the first buffer, first (first_what: what the caller
 * calls it): a sentence unless this hvd has CUDA, the memory is on this
 * rank's GPU and the call is in the job's set. */
static hvd_status check_device(const hvd_call *c, const hvd_meminfo *first,
                               const char *first_what) {
    const char *fn = c->fn, *name = HVD_CALL_NAME(c->name);
    char a[64];

    hvd_mem_describe(first, a, sizeof(a));
    if (!hvd_gpu_built())
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): %s is %s, but this hvd was built "
                             "without CUDA: rebuild it where the CUDA "
                             "toolkit is installed (docs/gpu.md), or pass "
                             "host memory",
                             fn, name, first_what, a);
    if (first->device != hvd_job_gpu_device())
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): %s is %s, but hvd runs this rank's "
                             "GPU work on CUDA device %d (HVD_GPU_DEVICE, "
                             "else the local rank): allocate it there or "
                             "set HVD_GPU_DEVICE=%d",
                             fn, name, first_what, a, hvd_job_gpu_device(),
                             first->device);
    if (c->ps != 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): GPU memory in a process set other "
                             "than the job's (0) is not supported yet: pass "
                             "host memory",
                             fn, name);
    return HVD_OK;
}

/* The sentence of buffers in different memory: buffer k of part i is mi,
 * unlike the first one (k0 of part i0, first). Kept out of the fast path,
 * for its buffers. */
__attribute__((noinline)) static hvd_status
mixed_memory(const hvd_call *c, int n, int same, int i0, int k0,
             const hvd_meminfo *first, int i, int k, const hvd_meminfo *mi) {
    char first_what[32], what[32], a[64], b[64];

    hvd_mem_describe(first, a, sizeof(a));
    hvd_mem_describe(mi, b, sizeof(b));
    return hvd_error_set(
        HVD_ERR_INVALID_ARG,
        "%s('%s'): %s is %s but %s is %s: the buffers of one operation must "
        "all be host memory or all on this rank's GPU",
        c->fn, HVD_CALL_NAME(c->name),
        buffer_label(n, same, i0, k0, first_what, sizeof(first_what)), a,
        buffer_label(n, same, i, k, what, sizeof(what)), b);
}

/* check_device for the first buffer (k0 of part i0). */
__attribute__((noinline)) static hvd_status
check_device_of(const hvd_call *c, int n, int same, int i0, int k0,
                const hvd_meminfo *first) {
    char first_what[32];

    return check_device(
        c, first,
        buffer_label(n, same, i0, k0, first_what, sizeof(first_what)));
}

hvd_status hvd_call_locate(const hvd_call *c, int n, const void *const *send,
                           void *const *recv, const size_t *counts,
                           hvd_memtype *mem_out) {
    hvd_meminfo first = {HVD_MEM_HOST, -1, 0}, mi;
    int first_i = -1, first_k = 0, same = n == 1 && send[0] == recv[0];

    for (int i = 0; i < n; i++) {
        if (counts[i] == 0)
            continue;
        for (int k = 0; k < 2; k++) {
            hvd_mem_classify(k == 0 ? send[i] : recv[i], &mi);
            if (first_i < 0) {
                first = mi;
                first_i = i;
                first_k = k;
            } else if (mi.type != first.type || mi.device != first.device) {
                return mixed_memory(c, n, same, first_i, first_k, &first, i, k,
                                    &mi);
            }
        }
    }
    if (first.type == HVD_MEM_DEVICE) {
        hvd_status st = check_device_of(c, n, same, first_i, first_k, &first);
        if (st != HVD_OK)
            return st;
    }
    *mem_out = first.type;
    return HVD_OK;
}

hvd_status hvd_call_shape_count(const hvd_call *c, int ndim,
                                const int64_t *shape, size_t *count) {
    const char *fn = c->fn, *name = HVD_CALL_NAME(c->name);
    size_t n = 1;

    if (ndim < 0 || (ndim > 0 && shape == NULL))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): a shape needs ndim >= 0 (got %d) and "
                             "its dimensions",
                             fn, name, ndim);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s('%s'): dimension %d of the shape is %lld",
                                 fn, name, i, (long long)shape[i]);
        if (shape[i] > 0 && n > SIZE_MAX / (uint64_t)shape[i])
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s('%s'): the shape has more elements than "
                                 "a size_t counts",
                                 fn, name);
        n *= (size_t)shape[i];
    }
    *count = n;
    return HVD_OK;
}

hvd_status hvd_call_wait(const char *fn, hvd_handle h, int *last_rank) {
    char name[256];
    hvd_status st = hvd_engine_wait(h, last_rank, name, sizeof(name));
    if (st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", fn, name, hvd_rank());
    return st;
}
