/*
 * One call of the collectives (api/call.h): its set, the checks its
 * arguments share, its request, and handing it over (the job names it, the
 * engine decides once how it runs), then waiting.
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
    c->fn = fn;
    c->name = name;
    c->ps = 0;
    c->mode = mode;
    c->req = NULL;
    if (ps != 0) {
        hvd_status st = hvd_job_pset(fn, name, ps, &c->ps_size, &c->ps_index);
        if (st != HVD_OK)
            return st;
        c->ps = ps;
        return HVD_OK;
    }
    c->ps_size = hvd_size() > 0 ? hvd_size() : 1;
    c->ps_index = hvd_rank();
    return HVD_OK;
}

hvd_status hvd_call_check_buffers(const hvd_call *c, const void *sendbuf,
                                  const void *recvbuf, size_t count,
                                  hvd_dtype dtype) {
    const char *fn = c->fn, *name = HVD_CALL_NAME(c->name);

    if (!hvd_dtype_valid(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): dtype %d is not an hvd_dtype", fn, name,
                             (int)dtype);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): %s is NULL with count %zu", fn, name,
                             sendbuf == NULL ? "sendbuf" : "recvbuf", count);
    if (count > (SIZE_MAX / 2) / hvd_dtype_size(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): count %zu is too large", fn, name,
                             count);
    return HVD_OK;
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

hvd_status hvd_call_locate(const hvd_call *c, int n, const void *const *send,
                           void *const *recv, const size_t *counts,
                           hvd_memtype *mem_out) {
    hvd_meminfo first = {HVD_MEM_HOST, -1, 0}, mi;
    char first_what[32] = "", what[32], a[64], b[64];
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
                hvd_mem_describe(&first, a, sizeof(a));
                hvd_mem_describe(&mi, b, sizeof(b));
                return hvd_error_set(
                    HVD_ERR_INVALID_ARG,
                    "%s('%s'): %s is %s but %s is %s: the buffers of one "
                    "operation must all be host memory or all on this "
                    "rank's GPU",
                    c->fn, HVD_CALL_NAME(c->name),
                    buffer_label(n, same, first_i, first_k, first_what,
                                 sizeof(first_what)),
                    a, buffer_label(n, same, i, k, what, sizeof(what)), b);
            }
        }
    }
    if (first.type == HVD_MEM_DEVICE) {
        hvd_status st =
            check_device(c, &first,
                         buffer_label(n, same, first_i, first_k, first_what,
                                      sizeof(first_what)));
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

hvd_status hvd_call_request(hvd_call *c, hvd_kind kind, int n) {
    hvd_request *req;

    /* A blocking call's request lives in the call; a join or an internal
     * call, which the engine thread runs, has one on the heap as a
     * handle's. */
    if (c->mode != HVD_CALL_BLOCKING) {
        req = hvd_request_new(n);
    } else {
        req = &c->own;
        memset(req, 0, sizeof(*req));
        if (hvd_request_setup(req, n) != 0)
            req = NULL;
    }
    if (req == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "%s('%s'): out of memory",
                             c->fn, HVD_CALL_NAME(c->name));
    req->desc.kind = kind;
    req->desc.pset = c->ps;
    req->will_wait = c->mode == HVD_CALL_BLOCKING;
    c->req = req;
    return HVD_OK;
}

hvd_status hvd_call_wait(const char *fn, hvd_handle h, int *last_rank) {
    char name[256];
    hvd_status st = hvd_engine_wait(h, last_rank, name, sizeof(name));
    if (st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", fn, name, hvd_rank());
    return st;
}

hvd_status hvd_call_run(hvd_call *c, hvd_handle *out, int *last_rank) {
    hvd_request *req = c->req;
    int express = 0;
    hvd_status st = hvd_job_submit(c->fn, c->name, req, &express);

    if (st != HVD_OK) {
        hvd_request_free(req);
        return st;
    }
    if (c->mode == HVD_CALL_ASYNC) {
        *out = req;
        return HVD_OK;
    }
    if (!express)
        return hvd_call_wait(c->fn, req, last_rank);
    /* Taken by this thread: it runs the request to its end now. */
    st = hvd_engine_express_run(req->eng, req);
    if (st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", c->fn, req->name, hvd_rank());
    hvd_request_free(req);
    return st;
}
