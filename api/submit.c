/*
 * The collectives' entry points: each call's arguments are checked here,
 * the buffers located (host or device memory), and the operation handed to
 * the engine (api/runtime/engine.h) as a named request through the job
 * (api/job.h); the blocking forms are submit + wait.
 */
#include "hvd/hvd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/hvd_internal.h"
#include "api/job.h"
#include "api/runtime/engine.h"
#include "collectives/coll.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"
#include "transport/base/memtype.h"

/* ------------------------------------------------------------------ */
/* Collectives                                                         */

#define NAME(n) ((n) != NULL ? (n) : "")

/* The process set of the call being submitted (0: the job), set by the
 * hvd_ps_* forms around the job's form of the same call, with its size
 * and this rank's place in it. */
static _Thread_local int t_ps, t_ps_size, t_ps_index;

/* The ranks the call being submitted runs among. */
static int call_size(void) {
    if (t_ps != 0)
        return t_ps_size;
    return hvd_size() > 0 ? hvd_size() : 1;
}

/* Enters process set ps for fn's call (a sentence if this rank cannot
 * submit in it); leave_set() after the call, whatever the outcome. */
static hvd_status enter_set(const char *fn, const char *name, int ps) {
    hvd_status st = HVD_OK;

    t_ps = 0;
    if (ps != 0)
        st = hvd_job_pset(fn, name, ps, &t_ps_size, &t_ps_index);
    if (st == HVD_OK)
        t_ps = ps;
    return st;
}

static void leave_set(void) { t_ps = 0; }

static hvd_status check_buffers(const char *fn, const char *name,
                                const void *sendbuf, const void *recvbuf,
                                size_t count, hvd_dtype dtype) {
    if (!hvd_dtype_valid(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): dtype %d is not an hvd_dtype", fn,
                             NAME(name), (int)dtype);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return hvd_error_set(
            HVD_ERR_INVALID_ARG, "%s('%s'): %s is NULL with count %zu", fn,
            NAME(name), sendbuf == NULL ? "sendbuf" : "recvbuf", count);
    if (count > (SIZE_MAX / 2) / hvd_dtype_size(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): count %zu is too large", fn, NAME(name),
                             count);
    return HVD_OK;
}

/*
 * Where the buffers of an operation are (*mem_out): all in host memory, or
 * all on this rank's GPU. Empty buffers are not looked at. With no CUDA
 * device this costs a load and a branch per buffer.
 */
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

static hvd_status locate(const char *fn, const char *name, int n,
                         const void *const *send, void *const *recv,
                         const size_t *counts, hvd_memtype *mem_out) {
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
                    fn, NAME(name),
                    buffer_label(n, same, first_i, first_k, first_what,
                                 sizeof(first_what)),
                    a, buffer_label(n, same, i, k, what, sizeof(what)), b);
            }
        }
    }
    if (first.type == HVD_MEM_DEVICE) {
        buffer_label(n, same, first_i, first_k, first_what, sizeof(first_what));
        hvd_mem_describe(&first, a, sizeof(a));
        if (!hvd_gpu_built())
            return hvd_error_set(HVD_ERR_UNSUPPORTED,
                                 "%s('%s'): %s is %s, but this hvd was built "
                                 "without CUDA: rebuild it where the CUDA "
                                 "toolkit is installed (docs/gpu.md), or pass "
                                 "host memory",
                                 fn, NAME(name), first_what, a);
        if (first.device != hvd_job_gpu_device())
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s('%s'): %s is %s, but hvd runs this rank's "
                                 "GPU work on CUDA device %d (HVD_GPU_DEVICE, "
                                 "else the local rank): allocate it there or "
                                 "set HVD_GPU_DEVICE=%d",
                                 fn, NAME(name), first_what, a,
                                 hvd_job_gpu_device(), first.device);
    }
    if (first.type == HVD_MEM_DEVICE && t_ps != 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): GPU memory in a process set other "
                             "than the job's (0) is not supported yet: pass "
                             "host memory",
                             fn, NAME(name));
    *mem_out = first.type;
    return HVD_OK;
}

/* Set while a blocking call submits: its request is marked will_wait, so
 * the engine need not be woken for it (the call's wait runs the engine). */
static _Thread_local int t_blocking;

/* Hands req to the engine (api/job.h), marked as a blocking call's. */
static hvd_status hand_over(const char *fn, hvd_request *req, hvd_handle *out) {
    req->will_wait = t_blocking;
    return hvd_job_hand_over(fn, req, out);
}

static hvd_status wait_named(const char *fn, hvd_handle h, int *last_rank) {
    char name[256];
    hvd_status st = hvd_engine_wait(h, last_rank, name, sizeof(name));
    if (st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", fn, name, hvd_rank());
    return st;
}

/*
 * The element count of a shape of ndim dimensions, for fn: a sentence if
 * the shape is malformed or its count does not fit a size_t.
 */
static hvd_status shape_count(const char *fn, const char *name, int ndim,
                              const int64_t *shape, size_t *count) {
    size_t n = 1;

    if (ndim < 0 || (ndim > 0 && shape == NULL))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): a shape needs ndim >= 0 (got %d) and "
                             "its dimensions",
                             fn, NAME(name), ndim);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s('%s'): dimension %d of the shape is %lld",
                                 fn, NAME(name), i, (long long)shape[i]);
        if (shape[i] > 0 && n > SIZE_MAX / (uint64_t)shape[i])
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s('%s'): the shape has more elements than "
                                 "a size_t counts",
                                 fn, NAME(name));
        n *= (size_t)shape[i];
    }
    *count = n;
    return HVD_OK;
}

/* The values and the buffer of a one-buffer request. */
static void fill_one(hvd_request *req, hvd_dtype dtype, hvd_op op, int root,
                     hvd_memtype mem, const void *sendbuf, void *recvbuf,
                     size_t count) {
    req->desc.dtype = dtype;
    req->desc.op = op;
    req->desc.root = root;
    req->desc.mem = mem;
    req->send[0] = sendbuf;
    req->recv[0] = recvbuf;
    req->counts[0] = count;
}

/*
 * One buffer of kind (allreduce, broadcast or allgather), with its shape
 * (ndim >= 2) or without (ndim 0): checked, located, made a request of and
 * handed to the engine. The caller has checked what is the kind's own (op,
 * root); the other kind's member is 0, as in a new request. An allgather's
 * count must also fit size times over in recvbuf.
 */
static hvd_status submit_one(const char *fn, const char *name, hvd_kind kind,
                             const void *sendbuf, void *recvbuf, size_t count,
                             int ndim, const int64_t *shape, hvd_dtype dtype,
                             hvd_op op, int root, hvd_handle *out) {
    hvd_request *req;
    hvd_memtype mem = HVD_MEM_HOST;
    hvd_status st = check_buffers(fn, name, sendbuf, recvbuf, count, dtype);

    if (st == HVD_OK && kind == HVD_KIND_ALLGATHER && hvd_size() > 0 &&
        count > (SIZE_MAX / 2) / hvd_dtype_size(dtype) / (size_t)hvd_size())
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): count %zu times %d ranks is too large",
                           fn, NAME(name), count, hvd_size());
    if (st == HVD_OK && out == NULL)
        st = hvd_error_set(HVD_ERR_INVALID_ARG, "%s('%s'): handle is NULL", fn,
                           NAME(name));
    if (st == HVD_OK)
        st = locate(fn, name, 1, &sendbuf, &recvbuf, &count, &mem);
    if (st == HVD_OK)
        st = hvd_job_request(fn, name, kind, t_ps, 1, &req);
    if (st != HVD_OK)
        return st;
    fill_one(req, dtype, op, root, mem, sendbuf, recvbuf, count);
    hvd_opdesc_set_shape(&req->desc, ndim, shape);
    return hand_over(fn, req, out);
}

/* What Adasum needs (as Horovod's CPU Adasum): a power-of-two number of
 * ranks, a floating dtype Horovod reduces that way, host memory. */
static hvd_status adasum_check(const char *fn, const char *name,
                               const void *sendbuf, size_t count,
                               hvd_dtype dtype) {
    hvd_meminfo mi;

    int size = call_size();

    if (!hvd_adasum_supports(size, HVD_FLOAT32))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): op=HVD_ADASUM runs on a power-of-two "
                             "number of ranks, and this %s has %d; use "
                             "HVD_AVERAGE",
                             fn, NAME(name), t_ps ? "process set" : "job",
                             size);
    if (!hvd_adasum_supports(size, dtype))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): op=HVD_ADASUM reduces float16, "
                             "float32 and float64, not %s",
                             fn, NAME(name), hvd_dtype_name(dtype));
    if (count > 0 && sendbuf != NULL) {
        hvd_mem_classify(sendbuf, &mi);
        if (mi.type == HVD_MEM_DEVICE)
            return hvd_error_set(HVD_ERR_UNSUPPORTED,
                                 "%s('%s'): op=HVD_ADASUM on GPU memory is "
                                 "not supported yet: pass host memory",
                                 fn, NAME(name));
    }
    return HVD_OK;
}

/* An allreduce, with its shape (ndim >= 2) or without (ndim 0). */
static hvd_status allreduce_async(const char *fn, const char *name,
                                  const void *sendbuf, void *recvbuf,
                                  size_t count, int ndim, const int64_t *shape,
                                  hvd_dtype dtype, hvd_op op, hvd_handle *out) {
    if (op == HVD_ADASUM) {
        hvd_status st = adasum_check(fn, name, sendbuf, count, dtype);
        if (st != HVD_OK)
            return st;
    } else if (!hvd_op_valid(op)) {
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): op %d is not an hvd_op", fn, NAME(name),
                             (int)op);
    }
    return submit_one(fn, name, HVD_KIND_ALLREDUCE, sendbuf, recvbuf, count,
                      ndim, shape, dtype, op, 0, out);
}

hvd_status hvd_allreduce_async(const char *name, const void *sendbuf,
                               void *recvbuf, size_t count, hvd_dtype dtype,
                               hvd_op op, hvd_handle *out) {
    return allreduce_async("hvd_allreduce", name, sendbuf, recvbuf, count, 0,
                           NULL, dtype, op, out);
}

hvd_status hvd_allreduce_shaped_async(const char *name, const void *sendbuf,
                                      void *recvbuf, int ndim,
                                      const int64_t *shape, hvd_dtype dtype,
                                      hvd_op op, hvd_handle *out) {
    static const char fn[] = "hvd_allreduce";
    size_t count = 0;
    hvd_status st = shape_count(fn, name, ndim, shape, &count);

    return st != HVD_OK ? st
                        : allreduce_async(fn, name, sendbuf, recvbuf, count,
                                          ndim, shape, dtype, op, out);
}

/*
 * n buffers of kind (allreduce, allgather or reducescatter) as one
 * operation: one name, negotiated once. Buffer i has counts[i] elements
 * (an allgather's recvbufs[i] then holds size times as many, a
 * reduce-scatter's this rank's block of them).
 */
static hvd_status grouped_async(const char *fn, const char *name, hvd_kind kind,
                                int n, const void *const *sendbufs,
                                void *const *recvbufs, const size_t *counts,
                                hvd_dtype dtype, hvd_op op, hvd_handle *out) {
    hvd_request *req;
    hvd_memtype mem = HVD_MEM_HOST;
    hvd_status st = HVD_OK;

    if (n < 1 || sendbufs == NULL || recvbufs == NULL || counts == NULL ||
        out == NULL)
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): needs n >= 1 (got %d) and non-NULL "
                           "arrays and handle",
                           fn, NAME(name), n);
    for (int i = 0; st == HVD_OK && i < n; i++)
        st =
            check_buffers(fn, name, sendbufs[i], recvbufs[i], counts[i], dtype);
    if (st == HVD_OK && kind != HVD_KIND_ALLGATHER && op == HVD_ADASUM)
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "%s('%s'): a grouped %s with HVD_ADASUM is not "
                           "supported: reduce each tensor on its own",
                           fn, NAME(name), hvd_kind_name(kind));
    else if (st == HVD_OK && kind != HVD_KIND_ALLGATHER && !hvd_op_valid(op))
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): op %d is not an hvd_op", fn, NAME(name),
                           (int)op);
    if (st == HVD_OK)
        st = locate(fn, name, n, sendbufs, recvbufs, counts, &mem);
    if (st == HVD_OK && kind != HVD_KIND_ALLREDUCE && mem == HVD_MEM_DEVICE)
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "%s('%s'): GPU memory is not supported by a "
                           "grouped %s yet: pass host memory",
                           fn, NAME(name), hvd_kind_name(kind));
    if (st == HVD_OK)
        st = hvd_job_request(fn, name, kind, t_ps, n, &req);
    if (st != HVD_OK)
        return st;
    req->desc.dtype = dtype;
    req->desc.op = kind != HVD_KIND_ALLGATHER ? op : (hvd_op)0;
    req->desc.mem = mem;
    for (int i = 0; i < n; i++) {
        req->send[i] = sendbufs[i];
        req->recv[i] = recvbufs[i];
        req->counts[i] = counts[i];
    }
    return hand_over(fn, req, out);
}

hvd_status hvd_grouped_allreduce_async(const char *name, int n,
                                       const void *const *sendbufs,
                                       void *const *recvbufs,
                                       const size_t *counts, hvd_dtype dtype,
                                       hvd_op op, hvd_handle *out) {
    return grouped_async("hvd_grouped_allreduce", name, HVD_KIND_ALLREDUCE, n,
                         sendbufs, recvbufs, counts, dtype, op, out);
}

hvd_status hvd_grouped_allgather_async(const char *name, int n,
                                       const void *const *sendbufs,
                                       void *const *recvbufs,
                                       const size_t *counts, hvd_dtype dtype,
                                       hvd_handle *out) {
    return grouped_async("hvd_grouped_allgather", name, HVD_KIND_ALLGATHER, n,
                         sendbufs, recvbufs, counts, dtype, (hvd_op)0, out);
}

hvd_status hvd_grouped_reducescatter_async(
    const char *name, int n, const void *const *sendbufs, void *const *recvbufs,
    const size_t *counts, hvd_dtype dtype, hvd_op op, hvd_handle *out) {
    return grouped_async("hvd_grouped_reducescatter", name,
                         HVD_KIND_REDUCESCATTER, n, sendbufs, recvbufs, counts,
                         dtype, op, out);
}

/* 1 if rank r is a member of process set ps. */
static int in_set(int ps, int r) {
    int ranks[64], *v = ranks, n = hvd_process_set_ranks(ps, ranks, 64), in = 0;

    if (n > 64 && (v = malloc((size_t)n * sizeof(*v))) != NULL)
        n = hvd_process_set_ranks(ps, v, n);
    for (int i = 0; v != NULL && i < n; i++)
        in |= v[i] == r;
    if (v != ranks)
        free(v);
    return in;
}

/* A broadcast, with its shape (ndim >= 2) or without (ndim 0). */
static hvd_status broadcast_async(const char *fn, const char *name, void *buf,
                                  size_t count, int ndim, const int64_t *shape,
                                  hvd_dtype dtype, int root, hvd_handle *out) {
    if (root < 0 || (hvd_size() > 0 && root >= hvd_size()))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): root %d is not a rank of this job of "
                             "%d",
                             fn, NAME(name), root, hvd_size());
    if (t_ps != 0 && !in_set(t_ps, root))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): root %d is not a member of process "
                             "set %d (the root is a rank of the job, as in "
                             "Horovod)",
                             fn, NAME(name), root, t_ps);
    return submit_one(fn, name, HVD_KIND_BROADCAST, buf, buf, count, ndim,
                      shape, dtype, (hvd_op)0, root, out);
}

hvd_status hvd_broadcast_async(const char *name, void *buf, size_t count,
                               hvd_dtype dtype, int root, hvd_handle *out) {
    return broadcast_async("hvd_broadcast", name, buf, count, 0, NULL, dtype,
                           root, out);
}

hvd_status hvd_broadcast_shaped_async(const char *name, void *buf, int ndim,
                                      const int64_t *shape, hvd_dtype dtype,
                                      int root, hvd_handle *out) {
    static const char fn[] = "hvd_broadcast";
    size_t count = 0;
    hvd_status st = shape_count(fn, name, ndim, shape, &count);

    return st != HVD_OK ? st
                        : broadcast_async(fn, name, buf, count, ndim, shape,
                                          dtype, root, out);
}

hvd_status hvd_allgather_async(const char *name, const void *sendbuf,
                               void *recvbuf, size_t count, hvd_dtype dtype,
                               hvd_handle *out) {
    return submit_one("hvd_allgather", name, HVD_KIND_ALLGATHER, sendbuf,
                      recvbuf, count, 0, NULL, dtype, 0, 0, out);
}

hvd_status hvd_alltoall_async(const char *name, const void *sendbuf,
                              size_t count, const size_t *sendcounts,
                              void *recvbuf, size_t recvcap,
                              size_t *recvcounts_out, hvd_dtype dtype,
                              hvd_handle *out) {
    static const char fn[] = "hvd_alltoall";
    int p = call_size();
    size_t sum = 0;
    hvd_memtype mem = HVD_MEM_HOST, rmem = HVD_MEM_HOST;
    hvd_request *req;
    hvd_status st = check_buffers(fn, name, sendbuf, sendbuf, count, dtype);

    if (st == HVD_OK)
        st = check_buffers(fn, name, recvbuf, recvbuf, recvcap, dtype);
    if (st == HVD_OK && out == NULL)
        st = hvd_error_set(HVD_ERR_INVALID_ARG, "%s('%s'): handle is NULL", fn,
                           NAME(name));
    if (st == HVD_OK && p > 0 && sendcounts == NULL && count % (size_t)p != 0)
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): without sendcounts, count %zu must be a "
                           "multiple of the %d ranks",
                           fn, NAME(name), count, p);
    for (int k = 0; st == HVD_OK && sendcounts != NULL && k < p; k++) {
        sum += sendcounts[k];
        if (sendcounts[k] > count || sum > count)
            st = hvd_error_set(HVD_ERR_INVALID_ARG,
                               "%s('%s'): sendcounts add up to more than "
                               "count %zu (at rank %d)",
                               fn, NAME(name), count, k);
    }
    if (st == HVD_OK)
        st = locate(fn, name, 1, &sendbuf, (void *const *)&sendbuf, &count,
                    &mem);
    if (st == HVD_OK)
        st = locate(fn, name, 1, (const void *const *)&recvbuf, &recvbuf,
                    &recvcap, &rmem);
    if (st == HVD_OK && (mem == HVD_MEM_DEVICE || rmem == HVD_MEM_DEVICE))
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "%s('%s'): GPU memory is not supported by alltoall "
                           "yet: pass host memory",
                           fn, NAME(name));
    if (st == HVD_OK)
        st = hvd_job_request(fn, name, HVD_KIND_ALLTOALL, t_ps, p, &req);
    if (st != HVD_OK)
        return st;
    size_t off = 0, es = hvd_dtype_size(dtype);
    for (int k = 0; k < p; k++) {
        req->counts[k] = sendcounts != NULL ? sendcounts[k] : count / (size_t)p;
        req->send[k] = (const uint8_t *)sendbuf + off * es;
        req->recv[k] = recvbuf;
        off += (size_t)req->counts[k];
    }
    req->desc.dtype = dtype;
    req->desc.mem = mem;
    req->recv_cap = recvcap;
    req->recv_counts = recvcounts_out;
    return hand_over(fn, req, out);
}

size_t hvd_reducescatter_count(size_t count, int size, int r) {
    if (size < 1 || r < 0 || r >= size)
        return 0;
    return count / (size_t)size + ((size_t)r < count % (size_t)size ? 1 : 0);
}

/* A reduce-scatter, with its shape (ndim >= 1) or without (ndim 0). */
static hvd_status reducescatter_async(const char *fn, const char *name,
                                      const void *sendbuf, void *recvbuf,
                                      size_t count, int ndim,
                                      const int64_t *shape, hvd_dtype dtype,
                                      hvd_op op, hvd_handle *out) {
    if (op == HVD_ADASUM)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): HVD_ADASUM is for allreduce only (as "
                             "in Horovod)",
                             fn, NAME(name));
    if (!hvd_op_valid(op))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): op %d is not an hvd_op", fn, NAME(name),
                             (int)op);
    if (ndim > 0 && shape[0] == 0 && count > 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): a shape of 0 rows has no elements", fn,
                             NAME(name));
    /* submit_one checks and locates both buffers as count elements; the
     * receive side holds only this rank's block, so it is checked here. */
    hvd_meminfo mi;
    if (count > 0 && recvbuf != NULL) {
        hvd_mem_classify(recvbuf, &mi);
        if (mi.type == HVD_MEM_DEVICE)
            return hvd_error_set(HVD_ERR_UNSUPPORTED,
                                 "%s('%s'): GPU memory is not supported by "
                                 "reducescatter yet: pass host memory",
                                 fn, NAME(name));
    }
    return submit_one(fn, name, HVD_KIND_REDUCESCATTER, sendbuf, recvbuf, count,
                      ndim, shape, dtype, op, 0, out);
}

hvd_status hvd_reducescatter_async(const char *name, const void *sendbuf,
                                   void *recvbuf, size_t count, hvd_dtype dtype,
                                   hvd_op op, hvd_handle *out) {
    return reducescatter_async("hvd_reducescatter", name, sendbuf, recvbuf,
                               count, 0, NULL, dtype, op, out);
}

hvd_status hvd_reducescatter_shaped_async(const char *name, const void *sendbuf,
                                          void *recvbuf, int ndim,
                                          const int64_t *shape, hvd_dtype dtype,
                                          hvd_op op, hvd_handle *out) {
    static const char fn[] = "hvd_reducescatter";
    size_t count = 0;
    hvd_status st = shape_count(fn, name, ndim, shape, &count);

    return st != HVD_OK ? st
                        : reducescatter_async(fn, name, sendbuf, recvbuf, count,
                                              ndim, shape, dtype, op, out);
}

hvd_status hvd_wait(hvd_handle handle) {
    if (handle == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "hvd_wait: handle is NULL");
    return wait_named("hvd_wait", handle, NULL);
}

hvd_status hvd_on_done(hvd_handle handle, hvd_done_fn fn, void *arg) {
    if (handle == NULL || fn == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_on_done: handle or fn is NULL");
    hvd_engine_on_done(handle, fn, arg);
    return HVD_OK;
}

hvd_status hvd_test(hvd_handle handle, int *done) {
    if (handle == NULL || done == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_test: handle or done is NULL");
    return hvd_engine_test(handle, done);
}

/*
 * A blocking allreduce of host memory by the express way (api/job.h):
 * its request on this stack, run at once by this thread if the engine is
 * free. 0 if it must go the usual way (which also reports what is wrong
 * with the call).
 */
static int express_allreduce(const char *name, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype,
                             hvd_op op, hvd_status *st) {
    static const char fn[] = "hvd_allreduce";
    hvd_memtype mem = HVD_MEM_HOST;
    hvd_request req;

    if (name == NULL || t_ps != 0 || op == HVD_ADASUM || !hvd_op_valid(op) ||
        check_buffers(fn, name, sendbuf, recvbuf, count, dtype) != HVD_OK ||
        locate(fn, name, 1, &sendbuf, &recvbuf, &count, &mem) != HVD_OK ||
        mem != HVD_MEM_HOST)
        return 0;
    memset(&req, 0, sizeof(req));
    hvd_request_init_one(&req, (char *)name); /* the call lasts as long */
    req.desc.kind = HVD_KIND_ALLREDUCE;
    fill_one(&req, dtype, op, 0, mem, sendbuf, recvbuf, count);
    if (!hvd_job_express(&req, st))
        return 0;
    if (*st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", fn, name, hvd_rank());
    return 1;
}

hvd_status hvd_allreduce(const char *name, const void *sendbuf, void *recvbuf,
                         size_t count, hvd_dtype dtype, hvd_op op) {
    hvd_handle h;
    hvd_status xst;

    if (express_allreduce(name, sendbuf, recvbuf, count, dtype, op, &xst))
        return xst;
    t_blocking = 1;
    hvd_status st =
        hvd_allreduce_async(name, sendbuf, recvbuf, count, dtype, op, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_allreduce", h, NULL);
}

hvd_status hvd_grouped_allreduce(const char *name, int n,
                                 const void *const *sendbufs,
                                 void *const *recvbufs, const size_t *counts,
                                 hvd_dtype dtype, hvd_op op) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st = hvd_grouped_allreduce_async(name, n, sendbufs, recvbufs,
                                                counts, dtype, op, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_grouped_allreduce", h, NULL);
}

hvd_status hvd_grouped_allgather(const char *name, int n,
                                 const void *const *sendbufs,
                                 void *const *recvbufs, const size_t *counts,
                                 hvd_dtype dtype) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st = hvd_grouped_allgather_async(name, n, sendbufs, recvbufs,
                                                counts, dtype, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_grouped_allgather", h, NULL);
}

hvd_status hvd_grouped_reducescatter(const char *name, int n,
                                     const void *const *sendbufs,
                                     void *const *recvbufs,
                                     const size_t *counts, hvd_dtype dtype,
                                     hvd_op op) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st = hvd_grouped_reducescatter_async(name, n, sendbufs, recvbufs,
                                                    counts, dtype, op, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_grouped_reducescatter", h, NULL);
}

hvd_status hvd_broadcast(const char *name, void *buf, size_t count,
                         hvd_dtype dtype, int root) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st = hvd_broadcast_async(name, buf, count, dtype, root, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_broadcast", h, NULL);
}

hvd_status hvd_allgather(const char *name, const void *sendbuf, void *recvbuf,
                         size_t count, hvd_dtype dtype) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st =
        hvd_allgather_async(name, sendbuf, recvbuf, count, dtype, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_allgather", h, NULL);
}

hvd_status hvd_alltoall(const char *name, const void *sendbuf, size_t count,
                        const size_t *sendcounts, void *recvbuf, size_t recvcap,
                        size_t *recvcounts_out, hvd_dtype dtype) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st =
        hvd_alltoall_async(name, sendbuf, count, sendcounts, recvbuf, recvcap,
                           recvcounts_out, dtype, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_alltoall", h, NULL);
}

hvd_status hvd_reducescatter(const char *name, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype,
                             hvd_op op) {
    hvd_handle h;
    t_blocking = 1;
    hvd_status st =
        hvd_reducescatter_async(name, sendbuf, recvbuf, count, dtype, op, &h);
    t_blocking = 0;

    return st != HVD_OK ? st : wait_named("hvd_reducescatter", h, NULL);
}

hvd_status hvd_barrier(void) {
    static const char fn[] = "hvd_barrier";
    hvd_request *req;
    hvd_handle h;
    hvd_status st = hvd_job_request(fn, NULL, HVD_KIND_BARRIER, t_ps, 1, &req);

    t_blocking = 1;
    if (st == HVD_OK)
        st = hand_over(fn, req, &h);
    t_blocking = 0;
    return st != HVD_OK ? st : wait_named(fn, h, NULL);
}

hvd_status hvd_join(int *last_rank_out) {
    static const char fn[] = "hvd_join";
    hvd_request *req;
    hvd_handle h;
    int last = -1;
    /* One join in flight per rank; the coordinator knows it by this name. */
    hvd_status st = hvd_job_request(fn, "hvd.join", HVD_KIND_JOIN, 0, 1, &req);

    if (st == HVD_OK)
        st = hand_over(fn, req, &h);
    if (st == HVD_OK)
        st = wait_named(fn, h, &last);
    if (st == HVD_OK && last_rank_out != NULL)
        *last_rank_out = last;
    return st;
}

hvd_status hvd_internal_call(const char *name, hvd_engine_fn fn, void *arg) {
    hvd_request *req;
    hvd_handle h;
    hvd_status st =
        hvd_job_request("hvd_internal_call", name, HVD_KIND_CALL, 0, 1, &req);

    if (st != HVD_OK)
        return st;
    req->fn = fn;
    req->fn_arg = arg;
    st = hand_over("hvd_internal_call", req, &h);
    return st != HVD_OK ? st : wait_named("hvd_internal_call", h, NULL);
}

/* ------------------------------------------------------------------ */
/* Process sets                                                        */

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

hvd_status hvd_process_set_create(const int *ranks, int n, int *id_out) {
    static const char fn[] = "hvd_process_set_create";
    int size = hvd_size(), last = -1;
    hvd_request *req = NULL;
    hvd_handle h;
    hvd_status st = HVD_OK;
    int *sorted;

    if (ranks == NULL || id_out == NULL || n < 1 || (size > 0 && n > size))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s: needs 1 to %d ranks (got %d) and non-NULL "
                             "ranks and id_out",
                             fn, size, n);
    sorted = malloc((size_t)n * sizeof(*sorted));
    if (sorted == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
    memcpy(sorted, ranks, (size_t)n * sizeof(*sorted));
    qsort(sorted, (size_t)n, sizeof(*sorted), cmp_int);
    for (int i = 0; i < n && st == HVD_OK; i++) {
        if (sorted[i] < 0 || (size > 0 && sorted[i] >= size))
            st = hvd_error_set(HVD_ERR_INVALID_ARG,
                               "%s: rank %d is not a rank of this job of %d",
                               fn, sorted[i], size);
        else if (i > 0 && sorted[i] == sorted[i - 1])
            st = hvd_error_set(HVD_ERR_INVALID_ARG,
                               "%s: rank %d is listed twice", fn, sorted[i]);
    }
    /* Every rank of the job asks, with the same ranks: rank 0 gives the
     * set its id, and every rank registers it in the same cycle. */
    if (st == HVD_OK)
        st = hvd_job_request(fn, NULL, HVD_KIND_PSET, 0, n, &req);
    if (st == HVD_OK) {
        req->desc.op = (hvd_op)HVD_PSET_CREATE;
        for (int i = 0; i < n; i++)
            req->counts[i] = (uint64_t)sorted[i];
        t_blocking = 1;
        st = hand_over(fn, req, &h);
        t_blocking = 0;
        if (st == HVD_OK)
            st = wait_named(fn, h, &last);
    }
    free(sorted);
    if (st == HVD_OK)
        *id_out = last;
    return st;
}

hvd_status hvd_process_set_remove(int id) {
    static const char fn[] = "hvd_process_set_remove";
    hvd_request *req;
    hvd_handle h;
    hvd_status st;

    if (id <= 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s(%d): %s", fn, id,
                             id == 0 ? "the job's process set (0) cannot be "
                                       "removed"
                                     : "not a process set id");
    st = hvd_job_request(fn, NULL, HVD_KIND_PSET, 0, 1, &req);
    if (st != HVD_OK)
        return st;
    req->desc.op = (hvd_op)HVD_PSET_REMOVE;
    req->desc.root = id;
    req->counts[0] = 0;
    t_blocking = 1;
    st = hand_over(fn, req, &h);
    t_blocking = 0;
    return st != HVD_OK ? st : wait_named(fn, h, NULL);
}

/*
 * The collectives in a process set: each enters the set, then runs the
 * job's form of the same call (which reads the set from t_ps).
 */
#define IN_SET(fn, name, ps, call)                                             \
    do {                                                                       \
        hvd_status st_ = enter_set(fn, name, ps);                              \
        if (st_ == HVD_OK)                                                     \
            st_ = call;                                                        \
        leave_set();                                                           \
        return st_;                                                            \
    } while (0)

hvd_status hvd_ps_allreduce(int ps, const char *name, const void *sendbuf,
                            void *recvbuf, size_t count, hvd_dtype dtype,
                            hvd_op op) {
    IN_SET("hvd_allreduce", name, ps,
           hvd_allreduce(name, sendbuf, recvbuf, count, dtype, op));
}

hvd_status hvd_ps_allreduce_async(int ps, const char *name, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op, hvd_handle *out) {
    IN_SET("hvd_allreduce", name, ps,
           hvd_allreduce_async(name, sendbuf, recvbuf, count, dtype, op, out));
}

hvd_status hvd_ps_allreduce_shaped_async(int ps, const char *name,
                                         const void *sendbuf, void *recvbuf,
                                         int ndim, const int64_t *shape,
                                         hvd_dtype dtype, hvd_op op,
                                         hvd_handle *out) {
    IN_SET("hvd_allreduce", name, ps,
           hvd_allreduce_shaped_async(name, sendbuf, recvbuf, ndim, shape,
                                      dtype, op, out));
}

hvd_status hvd_ps_grouped_allreduce(int ps, const char *name, int n,
                                    const void *const *sendbufs,
                                    void *const *recvbufs, const size_t *counts,
                                    hvd_dtype dtype, hvd_op op) {
    IN_SET(
        "hvd_grouped_allreduce", name, ps,
        hvd_grouped_allreduce(name, n, sendbufs, recvbufs, counts, dtype, op));
}

hvd_status hvd_ps_grouped_allreduce_async(int ps, const char *name, int n,
                                          const void *const *sendbufs,
                                          void *const *recvbufs,
                                          const size_t *counts, hvd_dtype dtype,
                                          hvd_op op, hvd_handle *out) {
    IN_SET("hvd_grouped_allreduce", name, ps,
           hvd_grouped_allreduce_async(name, n, sendbufs, recvbufs, counts,
                                       dtype, op, out));
}

hvd_status hvd_ps_grouped_allgather(int ps, const char *name, int n,
                                    const void *const *sendbufs,
                                    void *const *recvbufs, const size_t *counts,
                                    hvd_dtype dtype) {
    IN_SET("hvd_grouped_allgather", name, ps,
           hvd_grouped_allgather(name, n, sendbufs, recvbufs, counts, dtype));
}

hvd_status hvd_ps_grouped_allgather_async(int ps, const char *name, int n,
                                          const void *const *sendbufs,
                                          void *const *recvbufs,
                                          const size_t *counts, hvd_dtype dtype,
                                          hvd_handle *out) {
    IN_SET("hvd_grouped_allgather", name, ps,
           hvd_grouped_allgather_async(name, n, sendbufs, recvbufs, counts,
                                       dtype, out));
}

hvd_status hvd_ps_grouped_reducescatter(int ps, const char *name, int n,
                                        const void *const *sendbufs,
                                        void *const *recvbufs,
                                        const size_t *counts, hvd_dtype dtype,
                                        hvd_op op) {
    IN_SET("hvd_grouped_reducescatter", name, ps,
           hvd_grouped_reducescatter(name, n, sendbufs, recvbufs, counts, dtype,
                                     op));
}

hvd_status hvd_ps_grouped_reducescatter_async(int ps, const char *name, int n,
                                              const void *const *sendbufs,
                                              void *const *recvbufs,
                                              const size_t *counts,
                                              hvd_dtype dtype, hvd_op op,
                                              hvd_handle *out) {
    IN_SET("hvd_grouped_reducescatter", name, ps,
           hvd_grouped_reducescatter_async(name, n, sendbufs, recvbufs, counts,
                                           dtype, op, out));
}

hvd_status hvd_ps_broadcast(int ps, const char *name, void *buf, size_t count,
                            hvd_dtype dtype, int root) {
    IN_SET("hvd_broadcast", name, ps,
           hvd_broadcast(name, buf, count, dtype, root));
}

hvd_status hvd_ps_broadcast_async(int ps, const char *name, void *buf,
                                  size_t count, hvd_dtype dtype, int root,
                                  hvd_handle *out) {
    IN_SET("hvd_broadcast", name, ps,
           hvd_broadcast_async(name, buf, count, dtype, root, out));
}

hvd_status hvd_ps_broadcast_shaped_async(int ps, const char *name, void *buf,
                                         int ndim, const int64_t *shape,
                                         hvd_dtype dtype, int root,
                                         hvd_handle *out) {
    IN_SET(
        "hvd_broadcast", name, ps,
        hvd_broadcast_shaped_async(name, buf, ndim, shape, dtype, root, out));
}

hvd_status hvd_ps_allgather(int ps, const char *name, const void *sendbuf,
                            void *recvbuf, size_t count, hvd_dtype dtype) {
    IN_SET("hvd_allgather", name, ps,
           hvd_allgather(name, sendbuf, recvbuf, count, dtype));
}

hvd_status hvd_ps_allgather_async(int ps, const char *name, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_handle *out) {
    IN_SET("hvd_allgather", name, ps,
           hvd_allgather_async(name, sendbuf, recvbuf, count, dtype, out));
}

hvd_status hvd_ps_alltoall(int ps, const char *name, const void *sendbuf,
                           size_t count, const size_t *sendcounts,
                           void *recvbuf, size_t recvcap,
                           size_t *recvcounts_out, hvd_dtype dtype) {
    IN_SET("hvd_alltoall", name, ps,
           hvd_alltoall(name, sendbuf, count, sendcounts, recvbuf, recvcap,
                        recvcounts_out, dtype));
}

hvd_status hvd_ps_alltoall_async(int ps, const char *name, const void *sendbuf,
                                 size_t count, const size_t *sendcounts,
                                 void *recvbuf, size_t recvcap,
                                 size_t *recvcounts_out, hvd_dtype dtype,
                                 hvd_handle *out) {
    IN_SET("hvd_alltoall", name, ps,
           hvd_alltoall_async(name, sendbuf, count, sendcounts, recvbuf,
                              recvcap, recvcounts_out, dtype, out));
}

hvd_status hvd_ps_reducescatter(int ps, const char *name, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype,
                                hvd_op op) {
    IN_SET("hvd_reducescatter", name, ps,
           hvd_reducescatter(name, sendbuf, recvbuf, count, dtype, op));
}

hvd_status hvd_ps_reducescatter_async(int ps, const char *name,
                                      const void *sendbuf, void *recvbuf,
                                      size_t count, hvd_dtype dtype, hvd_op op,
                                      hvd_handle *out) {
    IN_SET(
        "hvd_reducescatter", name, ps,
        hvd_reducescatter_async(name, sendbuf, recvbuf, count, dtype, op, out));
}

hvd_status hvd_ps_reducescatter_shaped_async(int ps, const char *name,
                                             const void *sendbuf, void *recvbuf,
                                             int ndim, const int64_t *shape,
                                             hvd_dtype dtype, hvd_op op,
                                             hvd_handle *out) {
    IN_SET("hvd_reducescatter", name, ps,
           hvd_reducescatter_shaped_async(name, sendbuf, recvbuf, ndim, shape,
                                          dtype, op, out));
}

hvd_status hvd_ps_barrier(int ps) {
    IN_SET("hvd_barrier", NULL, ps, hvd_barrier());
}
