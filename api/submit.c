/*
 * The collectives' entry points: each call's arguments are checked once
 * and made one record (api/call.h: its set, the request with its buffers
 * located), which goes to the engine through the job; the blocking forms
 * wait for it, or run it at once where the engine decides so. The forms in
 * a process set (hvd_ps_*) are the same calls with their set.
 */
#include "hvd/hvd.h"

#include <stdlib.h>
#include <string.h>

#include "api/call.h"
#include "api/hvd_internal.h"
#include "api/submit.h"
#include "collectives/coll.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"
#include "transport/base/memtype.h"

#define NAME(n) HVD_CALL_NAME(n)

/* Begins a call (api/call.h), or returns the sentence of its set. */
#define BEGIN(c, fn, name, ps, mode)                                           \
    do {                                                                       \
        hvd_status st_ = hvd_call_begin(c, fn, name, ps, mode);                \
        if (st_ != HVD_OK)                                                     \
            return st_;                                                        \
    } while (0)

#define ASYNC HVD_CALL_ASYNC
#define BLOCKING HVD_CALL_BLOCKING

/* The arguments of a collective of one buffer (a broadcast's: send and
 * recv the same), passed by address: the fast path copies them once. */
typedef struct one_buf {
    const void *send;
    void *recv;
    size_t count;
    int ndim; /* with its shape (ndim >= 1), or without (0) */
    const int64_t *shape;
    hvd_dtype dtype;
    hvd_op op;
    int root;
    hvd_handle *out;
} one_buf;

/*
 * One buffer of kind (allreduce, broadcast, allgather, reducescatter):
 * checked, located, made the call's request and handed over. The caller
 * has checked what is the kind's own (op, root); the other kind's member
 * is 0, as in a new request. An allgather's count must also fit size
 * times over in recvbuf.
 */
static hvd_status submit_one(hvd_call *c, hvd_kind kind, const one_buf *a) {
    size_t count = a->count;
    hvd_dtype dtype = a->dtype;
    hvd_memtype mem = HVD_MEM_HOST;
    hvd_status st = hvd_call_check_buffers(c, a->send, a->recv, count, dtype);

    if (st == HVD_OK && kind == HVD_KIND_ALLGATHER && hvd_size() > 0 &&
        count > (SIZE_MAX / 2) / hvd_dtype_size(dtype) / (size_t)hvd_size())
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): count %zu times %d ranks is too large",
                           c->fn, NAME(c->name), count, hvd_size());
    if (st == HVD_OK && c->mode == ASYNC && a->out == NULL)
        st = hvd_error_set(HVD_ERR_INVALID_ARG, "%s('%s'): handle is NULL",
                           c->fn, NAME(c->name));
    if (st == HVD_OK)
        st = hvd_call_locate(c, 1, &a->send, &a->recv, &a->count, &mem);
    if (st == HVD_OK)
        st = hvd_call_request(c, kind, 1);
    if (st != HVD_OK)
        return st;
    hvd_request *req = c->req;
    req->desc.dtype = dtype;
    req->desc.op = a->op;
    req->desc.root = a->root;
    req->desc.mem = mem;
    req->send[0] = a->send;
    req->recv[0] = a->recv;
    req->counts[0] = count;
    if (a->ndim > 0)
        hvd_opdesc_set_shape(&req->desc, a->ndim, a->shape);
    return hvd_call_run(c, a->out, NULL);
}

/* What Adasum needs (as Horovod's CPU Adasum): a power-of-two number of
 * ranks, a floating dtype Horovod reduces that way, host memory. */
static hvd_status adasum_check(const hvd_call *c, const void *sendbuf,
                               size_t count, hvd_dtype dtype) {
    const char *fn = c->fn, *name = NAME(c->name);
    int size = hvd_call_size(c);
    hvd_meminfo mi;

    if (!hvd_adasum_supports(size, HVD_FLOAT32))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): op=HVD_ADASUM runs on a power-of-two "
                             "number of ranks, and this %s has %d; use "
                             "HVD_AVERAGE",
                             fn, name, c->ps ? "process set" : "job", size);
    if (!hvd_adasum_supports(size, dtype))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "%s('%s'): op=HVD_ADASUM reduces float16, "
                             "float32 and float64, not %s",
                             fn, name, hvd_dtype_name(dtype));
    if (count > 0 && sendbuf != NULL) {
        hvd_mem_classify(sendbuf, &mi);
        if (mi.type == HVD_MEM_DEVICE)
            return hvd_error_set(HVD_ERR_UNSUPPORTED,
                                 "%s('%s'): op=HVD_ADASUM on GPU memory is "
                                 "not supported yet: pass host memory",
                                 fn, name);
    }
    return HVD_OK;
}

/* An allreduce, with its shape (ndim >= 2) or without (ndim 0). */
static hvd_status allreduce(hvd_call *c, const one_buf *a) {
    if (a->op == HVD_ADASUM) {
        hvd_status st = adasum_check(c, a->send, a->count, a->dtype);
        if (st != HVD_OK)
            return st;
    } else if (!hvd_op_valid(a->op)) {
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): op %d is not an hvd_op", c->fn,
                             NAME(c->name), (int)a->op);
    }
    return submit_one(c, HVD_KIND_ALLREDUCE, a);
}

hvd_status hvd_submit_allreduce(int ps, hvd_call_mode mode, const char *name,
                                const void *sendbuf, void *recvbuf,
                                size_t count, hvd_dtype dtype, hvd_op op,
                                hvd_handle *out) {
    hvd_call c;

    BEGIN(&c, "hvd_allreduce", name, ps, mode);
    return allreduce(
        &c, &(one_buf){sendbuf, recvbuf, count, 0, NULL, dtype, op, 0, out});
}

hvd_status hvd_submit_allreduce_shaped(int ps, hvd_call_mode mode,
                                       const char *name, const void *sendbuf,
                                       void *recvbuf, int ndim,
                                       const int64_t *shape, hvd_dtype dtype,
                                       hvd_op op, hvd_handle *out) {
    hvd_call c;
    size_t count = 0;

    BEGIN(&c, "hvd_allreduce", name, ps, mode);
    hvd_status st = hvd_call_shape_count(&c, ndim, shape, &count);
    return st != HVD_OK
               ? st
               : allreduce(&c, &(one_buf){sendbuf, recvbuf, count, ndim, shape,
                                          dtype, op, 0, out});
}

/*
 * n buffers of kind (allreduce, allgather or reducescatter) as one
 * operation: one name, negotiated once. Buffer i has counts[i] elements
 * (an allgather's recvbufs[i] then holds size times as many, a
 * reduce-scatter's this rank's block of them).
 */
static hvd_status grouped(hvd_call *c, hvd_kind kind, int n,
                          const void *const *sendbufs, void *const *recvbufs,
                          const size_t *counts, hvd_dtype dtype, hvd_op op,
                          hvd_handle *out) {
    const char *fn = c->fn, *name = NAME(c->name);
    hvd_memtype mem = HVD_MEM_HOST;
    hvd_status st = HVD_OK;

    if (n < 1 || sendbufs == NULL || recvbufs == NULL || counts == NULL ||
        (c->mode == ASYNC && out == NULL))
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): needs n >= 1 (got %d) and non-NULL "
                           "arrays and handle",
                           fn, name, n);
    for (int i = 0; st == HVD_OK && i < n; i++)
        st = hvd_call_check_buffers(c, sendbufs[i], recvbufs[i], counts[i],
                                    dtype);
    if (st == HVD_OK && kind != HVD_KIND_ALLGATHER && op == HVD_ADASUM)
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "%s('%s'): a grouped %s with HVD_ADASUM is not "
                           "supported: reduce each tensor on its own",
                           fn, name, hvd_kind_name(kind));
    else if (st == HVD_OK && kind != HVD_KIND_ALLGATHER && !hvd_op_valid(op))
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s('%s'): op %d is not an hvd_op", fn, name,
                           (int)op);
    if (st == HVD_OK)
        st = hvd_call_locate(c, n, sendbufs, recvbufs, counts, &mem);
    if (st == HVD_OK && kind != HVD_KIND_ALLREDUCE && mem == HVD_MEM_DEVICE)
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "%s('%s'): GPU memory is not supported by a "
                           "grouped %s yet: pass host memory",
                           fn, name, hvd_kind_name(kind));
    if (st == HVD_OK)
        st = hvd_call_request(c, kind, n);
    if (st != HVD_OK)
        return st;
    hvd_request *req = c->req;
    req->desc.dtype = dtype;
    req->desc.op = kind != HVD_KIND_ALLGATHER ? op : (hvd_op)0;
    req->desc.mem = mem;
    for (int i = 0; i < n; i++) {
        req->send[i] = sendbufs[i];
        req->recv[i] = recvbufs[i];
        req->counts[i] = counts[i];
    }
    return hvd_call_run(c, out, NULL);
}

/* The grouped call of kind (fn) in set ps. */
hvd_status hvd_submit_grouped(int ps, hvd_call_mode mode, const char *fn,
                              hvd_kind kind, const char *name, int n,
                              const void *const *sendbufs,
                              void *const *recvbufs, const size_t *counts,
                              hvd_dtype dtype, hvd_op op, hvd_handle *out) {
    hvd_call c;

    BEGIN(&c, fn, name, ps, mode);
    return grouped(&c, kind, n, sendbufs, recvbufs, counts, dtype, op, out);
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
static hvd_status broadcast(hvd_call *c, void *buf, size_t count, int ndim,
                            const int64_t *shape, hvd_dtype dtype, int root,
                            hvd_handle *out) {
    if (root < 0 || (hvd_size() > 0 && root >= hvd_size()))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): root %d is not a rank of this job of "
                             "%d",
                             c->fn, NAME(c->name), root, hvd_size());
    if (c->ps != 0 && !in_set(c->ps, root))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): root %d is not a member of process "
                             "set %d (the root is a rank of the job, as in "
                             "Horovod)",
                             c->fn, NAME(c->name), root, c->ps);
    return submit_one(
        c, HVD_KIND_BROADCAST,
        &(one_buf){buf, buf, count, ndim, shape, dtype, (hvd_op)0, root, out});
}

hvd_status hvd_submit_broadcast(int ps, hvd_call_mode mode, const char *name,
                                void *buf, size_t count, hvd_dtype dtype,
                                int root, hvd_handle *out) {
    hvd_call c;

    BEGIN(&c, "hvd_broadcast", name, ps, mode);
    return broadcast(&c, buf, count, 0, NULL, dtype, root, out);
}

hvd_status hvd_submit_broadcast_shaped(int ps, hvd_call_mode mode,
                                       const char *name, void *buf, int ndim,
                                       const int64_t *shape, hvd_dtype dtype,
                                       int root, hvd_handle *out) {
    hvd_call c;
    size_t count = 0;

    BEGIN(&c, "hvd_broadcast", name, ps, mode);
    hvd_status st = hvd_call_shape_count(&c, ndim, shape, &count);
    return st != HVD_OK
               ? st
               : broadcast(&c, buf, count, ndim, shape, dtype, root, out);
}

hvd_status hvd_submit_allgather(int ps, hvd_call_mode mode, const char *name,
                                const void *sendbuf, void *recvbuf,
                                size_t count, hvd_dtype dtype,
                                hvd_handle *out) {
    hvd_call c;

    BEGIN(&c, "hvd_allgather", name, ps, mode);
    return submit_one(
        &c, HVD_KIND_ALLGATHER,
        &(one_buf){sendbuf, recvbuf, count, 0, NULL, dtype, (hvd_op)0, 0, out});
}

/* An alltoall's arguments beyond its buffers' own checks: the handle,
 * and counts that add up. */
static hvd_status alltoall_counts(const hvd_call *c, size_t count,
                                  const size_t *sendcounts, hvd_handle *out) {
    const char *fn = c->fn, *name = NAME(c->name);
    int p = hvd_call_size(c);
    size_t sum = 0;

    if (c->mode == ASYNC && out == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s('%s'): handle is NULL",
                             fn, name);
    if (p > 0 && sendcounts == NULL && count % (size_t)p != 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): without sendcounts, count %zu must be "
                             "a multiple of the %d ranks",
                             fn, name, count, p);
    for (int k = 0; sendcounts != NULL && k < p; k++) {
        sum += sendcounts[k];
        if (sendcounts[k] > count || sum > count)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s('%s'): sendcounts add up to more than "
                                 "count %zu (at rank %d)",
                                 fn, name, count, k);
    }
    return HVD_OK;
}

hvd_status hvd_submit_alltoall(int ps, hvd_call_mode mode, const char *name,
                               const void *sendbuf, size_t count,
                               const size_t *sendcounts, void *recvbuf,
                               size_t recvcap, size_t *recvcounts_out,
                               hvd_dtype dtype, hvd_handle *out) {
    hvd_call c;
    hvd_memtype mem = HVD_MEM_HOST, rmem = HVD_MEM_HOST;

    BEGIN(&c, "hvd_alltoall", name, ps, mode);
    int p = hvd_call_size(&c);
    hvd_status st = hvd_call_check_buffers(&c, sendbuf, sendbuf, count, dtype);
    if (st == HVD_OK)
        st = hvd_call_check_buffers(&c, recvbuf, recvbuf, recvcap, dtype);
    if (st == HVD_OK)
        st = alltoall_counts(&c, count, sendcounts, out);
    if (st == HVD_OK)
        st = hvd_call_locate(&c, 1, &sendbuf, (void *const *)&sendbuf, &count,
                             &mem);
    if (st == HVD_OK)
        st = hvd_call_locate(&c, 1, (const void *const *)&recvbuf, &recvbuf,
                             &recvcap, &rmem);
    if (st == HVD_OK && (mem == HVD_MEM_DEVICE || rmem == HVD_MEM_DEVICE))
        st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                           "%s('%s'): GPU memory is not supported by alltoall "
                           "yet: pass host memory",
                           c.fn, NAME(name));
    if (st == HVD_OK)
        st = hvd_call_request(&c, HVD_KIND_ALLTOALL, p);
    if (st != HVD_OK)
        return st;
    hvd_request *req = c.req;
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
    return hvd_call_run(&c, out, NULL);
}

size_t hvd_reducescatter_count(size_t count, int size, int r) {
    if (size < 1 || r < 0 || r >= size)
        return 0;
    return count / (size_t)size + ((size_t)r < count % (size_t)size ? 1 : 0);
}

/* A reduce-scatter, with its shape (ndim >= 1) or without (ndim 0). */
static hvd_status reducescatter(hvd_call *c, const void *sendbuf, void *recvbuf,
                                size_t count, int ndim, const int64_t *shape,
                                hvd_dtype dtype, hvd_op op, hvd_handle *out) {
    const char *fn = c->fn, *name = NAME(c->name);
    hvd_meminfo mi;

    if (op == HVD_ADASUM)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): HVD_ADASUM is for allreduce only (as "
                             "in Horovod)",
                             fn, name);
    if (!hvd_op_valid(op))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): op %d is not an hvd_op", fn, name,
                             (int)op);
    if (ndim > 0 && shape[0] == 0 && count > 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): a shape of 0 rows has no elements", fn,
                             name);
    /* submit_one checks and locates both buffers as count elements; the
     * receive side holds only this rank's block, so it is checked here. */
    if (count > 0 && recvbuf != NULL) {
        hvd_mem_classify(recvbuf, &mi);
        if (mi.type == HVD_MEM_DEVICE)
            return hvd_error_set(HVD_ERR_UNSUPPORTED,
                                 "%s('%s'): GPU memory is not supported by "
                                 "reducescatter yet: pass host memory",
                                 fn, name);
    }
    return submit_one(
        c, HVD_KIND_REDUCESCATTER,
        &(one_buf){sendbuf, recvbuf, count, ndim, shape, dtype, op, 0, out});
}

hvd_status hvd_submit_reducescatter(int ps, hvd_call_mode mode,
                                    const char *name, const void *sendbuf,
                                    void *recvbuf, size_t count,
                                    hvd_dtype dtype, hvd_op op,
                                    hvd_handle *out) {
    hvd_call c;

    BEGIN(&c, "hvd_reducescatter", name, ps, mode);
    return reducescatter(&c, sendbuf, recvbuf, count, 0, NULL, dtype, op, out);
}

hvd_status hvd_submit_reducescatter_shaped(int ps, hvd_call_mode mode,
                                           const char *name,
                                           const void *sendbuf, void *recvbuf,
                                           int ndim, const int64_t *shape,
                                           hvd_dtype dtype, hvd_op op,
                                           hvd_handle *out) {
    hvd_call c;
    size_t count = 0;

    BEGIN(&c, "hvd_reducescatter", name, ps, mode);
    hvd_status st = hvd_call_shape_count(&c, ndim, shape, &count);
    return st != HVD_OK ? st
                        : reducescatter(&c, sendbuf, recvbuf, count, ndim,
                                        shape, dtype, op, out);
}

hvd_status hvd_submit_barrier(int ps) {
    hvd_call c;

    BEGIN(&c, "hvd_barrier", NULL, ps, BLOCKING);
    hvd_status st = hvd_call_request(&c, HVD_KIND_BARRIER, 1);
    return st != HVD_OK ? st : hvd_call_run(&c, NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* The job's forms                                                     */

hvd_status hvd_allreduce(const char *name, const void *sendbuf, void *recvbuf,
                         size_t count, hvd_dtype dtype, hvd_op op) {
    hvd_call c;

    one_buf a = {sendbuf, recvbuf, count, 0, NULL, dtype, op, 0, NULL};

    /* The fast path of a training loop: as few calls as it takes (an op
     * that is not a plain valid one goes through allreduce's checks). */
    hvd_call_start(&c, "hvd_allreduce", name, BLOCKING);
    if (op == HVD_ADASUM || !hvd_op_valid(op))
        return allreduce(&c, &a);
    return submit_one(&c, HVD_KIND_ALLREDUCE, &a);
}

hvd_status hvd_allreduce_async(const char *name, const void *sendbuf,
                               void *recvbuf, size_t count, hvd_dtype dtype,
                               hvd_op op, hvd_handle *out) {
    return hvd_submit_allreduce(0, ASYNC, name, sendbuf, recvbuf, count, dtype,
                                op, out);
}

hvd_status hvd_allreduce_shaped_async(const char *name, const void *sendbuf,
                                      void *recvbuf, int ndim,
                                      const int64_t *shape, hvd_dtype dtype,
                                      hvd_op op, hvd_handle *out) {
    return hvd_submit_allreduce_shaped(0, ASYNC, name, sendbuf, recvbuf, ndim,
                                       shape, dtype, op, out);
}

hvd_status hvd_allreduce_shaped(const char *name, const void *sendbuf,
                                void *recvbuf, int ndim, const int64_t *shape,
                                hvd_dtype dtype, hvd_op op) {
    return hvd_submit_allreduce_shaped(0, BLOCKING, name, sendbuf, recvbuf,
                                       ndim, shape, dtype, op, NULL);
}

hvd_status hvd_grouped_allreduce(const char *name, int n,
                                 const void *const *sendbufs,
                                 void *const *recvbufs, const size_t *counts,
                                 hvd_dtype dtype, hvd_op op) {
    return hvd_submit_grouped(0, BLOCKING, HVD_GROUPED_ALLREDUCE, name, n,
                              sendbufs, recvbufs, counts, dtype, op, NULL);
}

hvd_status hvd_grouped_allreduce_async(const char *name, int n,
                                       const void *const *sendbufs,
                                       void *const *recvbufs,
                                       const size_t *counts, hvd_dtype dtype,
                                       hvd_op op, hvd_handle *out) {
    return hvd_submit_grouped(0, ASYNC, HVD_GROUPED_ALLREDUCE, name, n,
                              sendbufs, recvbufs, counts, dtype, op, out);
}

hvd_status hvd_grouped_allgather(const char *name, int n,
                                 const void *const *sendbufs,
                                 void *const *recvbufs, const size_t *counts,
                                 hvd_dtype dtype) {
    return hvd_submit_grouped(0, BLOCKING, HVD_GROUPED_ALLGATHER, name, n,
                              sendbufs, recvbufs, counts, dtype, (hvd_op)0,
                              NULL);
}

hvd_status hvd_grouped_allgather_async(const char *name, int n,
                                       const void *const *sendbufs,
                                       void *const *recvbufs,
                                       const size_t *counts, hvd_dtype dtype,
                                       hvd_handle *out) {
    return hvd_submit_grouped(0, ASYNC, HVD_GROUPED_ALLGATHER, name, n,
                              sendbufs, recvbufs, counts, dtype, (hvd_op)0,
                              out);
}

hvd_status hvd_grouped_reducescatter(const char *name, int n,
                                     const void *const *sendbufs,
                                     void *const *recvbufs,
                                     const size_t *counts, hvd_dtype dtype,
                                     hvd_op op) {
    return hvd_submit_grouped(0, BLOCKING, HVD_GROUPED_REDUCESCATTER, name, n,
                              sendbufs, recvbufs, counts, dtype, op, NULL);
}

hvd_status hvd_grouped_reducescatter_async(
    const char *name, int n, const void *const *sendbufs, void *const *recvbufs,
    const size_t *counts, hvd_dtype dtype, hvd_op op, hvd_handle *out) {
    return hvd_submit_grouped(0, ASYNC, HVD_GROUPED_REDUCESCATTER, name, n,
                              sendbufs, recvbufs, counts, dtype, op, out);
}

hvd_status hvd_broadcast(const char *name, void *buf, size_t count,
                         hvd_dtype dtype, int root) {
    return hvd_submit_broadcast(0, BLOCKING, name, buf, count, dtype, root,
                                NULL);
}

hvd_status hvd_broadcast_async(const char *name, void *buf, size_t count,
                               hvd_dtype dtype, int root, hvd_handle *out) {
    return hvd_submit_broadcast(0, ASYNC, name, buf, count, dtype, root, out);
}

hvd_status hvd_broadcast_shaped_async(const char *name, void *buf, int ndim,
                                      const int64_t *shape, hvd_dtype dtype,
                                      int root, hvd_handle *out) {
    return hvd_submit_broadcast_shaped(0, ASYNC, name, buf, ndim, shape, dtype,
                                       root, out);
}

hvd_status hvd_broadcast_shaped(const char *name, void *buf, int ndim,
                                const int64_t *shape, hvd_dtype dtype,
                                int root) {
    return hvd_submit_broadcast_shaped(0, BLOCKING, name, buf, ndim, shape,
                                       dtype, root, NULL);
}

hvd_status hvd_allgather(const char *name, const void *sendbuf, void *recvbuf,
                         size_t count, hvd_dtype dtype) {
    return hvd_submit_allgather(0, BLOCKING, name, sendbuf, recvbuf, count,
                                dtype, NULL);
}

hvd_status hvd_allgather_async(const char *name, const void *sendbuf,
                               void *recvbuf, size_t count, hvd_dtype dtype,
                               hvd_handle *out) {
    return hvd_submit_allgather(0, ASYNC, name, sendbuf, recvbuf, count, dtype,
                                out);
}

hvd_status hvd_alltoall(const char *name, const void *sendbuf, size_t count,
                        const size_t *sendcounts, void *recvbuf, size_t recvcap,
                        size_t *recvcounts_out, hvd_dtype dtype) {
    return hvd_submit_alltoall(0, BLOCKING, name, sendbuf, count, sendcounts,
                               recvbuf, recvcap, recvcounts_out, dtype, NULL);
}

hvd_status hvd_alltoall_async(const char *name, const void *sendbuf,
                              size_t count, const size_t *sendcounts,
                              void *recvbuf, size_t recvcap,
                              size_t *recvcounts_out, hvd_dtype dtype,
                              hvd_handle *out) {
    return hvd_submit_alltoall(0, ASYNC, name, sendbuf, count, sendcounts,
                               recvbuf, recvcap, recvcounts_out, dtype, out);
}

hvd_status hvd_reducescatter(const char *name, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype,
                             hvd_op op) {
    return hvd_submit_reducescatter(0, BLOCKING, name, sendbuf, recvbuf, count,
                                    dtype, op, NULL);
}

hvd_status hvd_reducescatter_async(const char *name, const void *sendbuf,
                                   void *recvbuf, size_t count, hvd_dtype dtype,
                                   hvd_op op, hvd_handle *out) {
    return hvd_submit_reducescatter(0, ASYNC, name, sendbuf, recvbuf, count,
                                    dtype, op, out);
}

hvd_status hvd_reducescatter_shaped_async(const char *name, const void *sendbuf,
                                          void *recvbuf, int ndim,
                                          const int64_t *shape, hvd_dtype dtype,
                                          hvd_op op, hvd_handle *out) {
    return hvd_submit_reducescatter_shaped(0, ASYNC, name, sendbuf, recvbuf,
                                           ndim, shape, dtype, op, out);
}

hvd_status hvd_reducescatter_shaped(const char *name, const void *sendbuf,
                                    void *recvbuf, int ndim,
                                    const int64_t *shape, hvd_dtype dtype,
                                    hvd_op op) {
    return hvd_submit_reducescatter_shaped(0, BLOCKING, name, sendbuf, recvbuf,
                                           ndim, shape, dtype, op, NULL);
}

hvd_status hvd_barrier(void) { return hvd_submit_barrier(0); }

hvd_status hvd_join(int *last_rank_out) {
    hvd_call c;
    int last = -1;

    /* One join in flight per rank; the coordinator knows it by this name.
     * The engine thread runs it (it may wait long). */
    BEGIN(&c, "hvd_join", "hvd.join", 0, HVD_CALL_WAITS);
    hvd_status st = hvd_call_request(&c, HVD_KIND_JOIN, 1);
    if (st == HVD_OK)
        st = hvd_call_run(&c, NULL, &last);
    if (st == HVD_OK && last_rank_out != NULL)
        *last_rank_out = last;
    return st;
}

hvd_status hvd_internal_call(const char *name, hvd_engine_fn fn, void *arg) {
    hvd_call c;

    BEGIN(&c, "hvd_internal_call", name, 0, HVD_CALL_WAITS);
    hvd_status st = hvd_call_request(&c, HVD_KIND_CALL, 1);
    if (st != HVD_OK)
        return st;
    c.req->fn = fn;
    c.req->fn_arg = arg;
    return hvd_call_run(&c, NULL, NULL);
}

hvd_status hvd_wait(hvd_handle handle) {
    if (handle == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "hvd_wait: handle is NULL");
    return hvd_call_wait("hvd_wait", handle, NULL);
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
