/*
 * Process sets at the public API: creating and removing one (operations
 * of the whole job), and the collectives in a set (hvd_ps_*), the job's
 * calls with their set (api/submit.h).
 */
#include "hvd/hvd.h"

#include <stdlib.h>
#include <string.h>

#include "api/submit.h"
#include "transport/base/error.h"

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* n ranks of this job of size, each once (sorted: ascending). */
static hvd_status check_ranks(const char *fn, const int *sorted, int n,
                              int size) {
    for (int i = 0; i < n; i++) {
        if (sorted[i] < 0 || (size > 0 && sorted[i] >= size))
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s: rank %d is not a rank of this job of %d",
                                 fn, sorted[i], size);
        if (i > 0 && sorted[i] == sorted[i - 1])
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s: rank %d is listed twice", fn, sorted[i]);
    }
    return HVD_OK;
}

hvd_status hvd_process_set_create(const int *ranks, int n, int *id_out) {
    static const char fn[] = "hvd_process_set_create";
    int size = hvd_size(), last = -1;
    hvd_call c;
    hvd_status st;
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
    st = check_ranks(fn, sorted, n, size);
    /* Every rank of the job asks, with the same ranks: rank 0 gives the
     * set its id, and every rank registers it in the same cycle. */
    if (st == HVD_OK)
        st = hvd_call_begin(&c, fn, NULL, 0, HVD_CALL_BLOCKING);
    if (st == HVD_OK)
        st = hvd_call_request(&c, HVD_KIND_PSET, n);
    if (st == HVD_OK) {
        c.req->desc.op = (hvd_op)HVD_PSET_CREATE;
        for (int i = 0; i < n; i++)
            c.req->counts[i] = (uint64_t)sorted[i];
        st = hvd_call_run(&c, NULL, &last);
    }
    free(sorted);
    if (st == HVD_OK)
        *id_out = last;
    return st;
}

hvd_status hvd_process_set_remove(int id) {
    hvd_call c;
    hvd_status st;

    if (id <= 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s(%d): %s",
                             "hvd_process_set_remove", id,
                             id == 0 ? "the job's process set (0) cannot be "
                                       "removed"
                                     : "not a process set id");
    st = hvd_call_begin(&c, "hvd_process_set_remove", NULL, 0,
                        HVD_CALL_BLOCKING);
    if (st == HVD_OK)
        st = hvd_call_request(&c, HVD_KIND_PSET, 1);
    if (st != HVD_OK)
        return st;
    c.req->desc.op = (hvd_op)HVD_PSET_REMOVE;
    c.req->desc.root = id;
    c.req->counts[0] = 0;
    return hvd_call_run(&c, NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* The collectives in a set                                            */

#define ASYNC HVD_CALL_ASYNC
#define BLOCKING HVD_CALL_BLOCKING

hvd_status hvd_ps_allreduce(int ps, const char *name, const void *sendbuf,
                            void *recvbuf, size_t count, hvd_dtype dtype,
                            hvd_op op) {
    return hvd_submit_allreduce(ps, BLOCKING, name, sendbuf, recvbuf, count,
                                dtype, op, NULL);
}

hvd_status hvd_ps_allreduce_async(int ps, const char *name, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op, hvd_handle *out) {
    return hvd_submit_allreduce(ps, ASYNC, name, sendbuf, recvbuf, count, dtype,
                                op, out);
}

hvd_status hvd_ps_allreduce_shaped_async(int ps, const char *name,
                                         const void *sendbuf, void *recvbuf,
                                         int ndim, const int64_t *shape,
                                         hvd_dtype dtype, hvd_op op,
                                         hvd_handle *out) {
    return hvd_submit_allreduce_shaped(ps, ASYNC, name, sendbuf, recvbuf, ndim,
                                       shape, dtype, op, out);
}

hvd_status hvd_ps_allreduce_shaped(int ps, const char *name,
                                   const void *sendbuf, void *recvbuf, int ndim,
                                   const int64_t *shape, hvd_dtype dtype,
                                   hvd_op op) {
    return hvd_submit_allreduce_shaped(ps, BLOCKING, name, sendbuf, recvbuf,
                                       ndim, shape, dtype, op, NULL);
}

hvd_status hvd_ps_grouped_allreduce(int ps, const char *name, int n,
                                    const void *const *sendbufs,
                                    void *const *recvbufs, const size_t *counts,
                                    hvd_dtype dtype, hvd_op op) {
    return hvd_submit_grouped(ps, BLOCKING, HVD_GROUPED_ALLREDUCE, name, n,
                              sendbufs, recvbufs, counts, dtype, op, NULL);
}

hvd_status hvd_ps_grouped_allreduce_async(int ps, const char *name, int n,
                                          const void *const *sendbufs,
                                          void *const *recvbufs,
                                          const size_t *counts, hvd_dtype dtype,
                                          hvd_op op, hvd_handle *out) {
    return hvd_submit_grouped(ps, ASYNC, HVD_GROUPED_ALLREDUCE, name, n,
                              sendbufs, recvbufs, counts, dtype, op, out);
}

hvd_status hvd_ps_grouped_allgather(int ps, const char *name, int n,
                                    const void *const *sendbufs,
                                    void *const *recvbufs, const size_t *counts,
                                    hvd_dtype dtype) {
    return hvd_submit_grouped(ps, BLOCKING, HVD_GROUPED_ALLGATHER, name, n,
                              sendbufs, recvbufs, counts, dtype, (hvd_op)0,
                              NULL);
}

hvd_status hvd_ps_grouped_allgather_async(int ps, const char *name, int n,
                                          const void *const *sendbufs,
                                          void *const *recvbufs,
                                          const size_t *counts, hvd_dtype dtype,
                                          hvd_handle *out) {
    return hvd_submit_grouped(ps, ASYNC, HVD_GROUPED_ALLGATHER, name, n,
                              sendbufs, recvbufs, counts, dtype, (hvd_op)0,
                              out);
}

hvd_status hvd_ps_grouped_reducescatter(int ps, const char *name, int n,
                                        const void *const *sendbufs,
                                        void *const *recvbufs,
                                        const size_t *counts, hvd_dtype dtype,
                                        hvd_op op) {
    return hvd_submit_grouped(ps, BLOCKING, HVD_GROUPED_REDUCESCATTER, name, n,
                              sendbufs, recvbufs, counts, dtype, op, NULL);
}

hvd_status hvd_ps_grouped_reducescatter_async(int ps, const char *name, int n,
                                              const void *const *sendbufs,
                                              void *const *recvbufs,
                                              const size_t *counts,
                                              hvd_dtype dtype, hvd_op op,
                                              hvd_handle *out) {
    return hvd_submit_grouped(ps, ASYNC, HVD_GROUPED_REDUCESCATTER, name, n,
                              sendbufs, recvbufs, counts, dtype, op, out);
}

hvd_status hvd_ps_broadcast(int ps, const char *name, void *buf, size_t count,
                            hvd_dtype dtype, int root) {
    return hvd_submit_broadcast(ps, BLOCKING, name, buf, count, dtype, root,
                                NULL);
}

hvd_status hvd_ps_broadcast_async(int ps, const char *name, void *buf,
                                  size_t count, hvd_dtype dtype, int root,
                                  hvd_handle *out) {
    return hvd_submit_broadcast(ps, ASYNC, name, buf, count, dtype, root, out);
}

hvd_status hvd_ps_broadcast_shaped_async(int ps, const char *name, void *buf,
                                         int ndim, const int64_t *shape,
                                         hvd_dtype dtype, int root,
                                         hvd_handle *out) {
    return hvd_submit_broadcast_shaped(ps, ASYNC, name, buf, ndim, shape, dtype,
                                       root, out);
}

hvd_status hvd_ps_broadcast_shaped(int ps, const char *name, void *buf,
                                   int ndim, const int64_t *shape,
                                   hvd_dtype dtype, int root) {
    return hvd_submit_broadcast_shaped(ps, BLOCKING, name, buf, ndim, shape,
                                       dtype, root, NULL);
}

hvd_status hvd_ps_allgather(int ps, const char *name, const void *sendbuf,
                            void *recvbuf, size_t count, hvd_dtype dtype) {
    return hvd_submit_allgather(ps, BLOCKING, name, sendbuf, recvbuf, count,
                                dtype, NULL);
}

hvd_status hvd_ps_allgather_async(int ps, const char *name, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_handle *out) {
    return hvd_submit_allgather(ps, ASYNC, name, sendbuf, recvbuf, count, dtype,
                                out);
}

hvd_status hvd_ps_alltoall(int ps, const char *name, const void *sendbuf,
                           size_t count, const size_t *sendcounts,
                           void *recvbuf, size_t recvcap,
                           size_t *recvcounts_out, hvd_dtype dtype) {
    return hvd_submit_alltoall(ps, BLOCKING, name, sendbuf, count, sendcounts,
                               recvbuf, recvcap, recvcounts_out, dtype, NULL);
}

hvd_status hvd_ps_alltoall_async(int ps, const char *name, const void *sendbuf,
                                 size_t count, const size_t *sendcounts,
                                 void *recvbuf, size_t recvcap,
                                 size_t *recvcounts_out, hvd_dtype dtype,
                                 hvd_handle *out) {
    return hvd_submit_alltoall(ps, ASYNC, name, sendbuf, count, sendcounts,
                               recvbuf, recvcap, recvcounts_out, dtype, out);
}

hvd_status hvd_ps_reducescatter(int ps, const char *name, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype,
                                hvd_op op) {
    return hvd_submit_reducescatter(ps, BLOCKING, name, sendbuf, recvbuf, count,
                                    dtype, op, NULL);
}

hvd_status hvd_ps_reducescatter_async(int ps, const char *name,
                                      const void *sendbuf, void *recvbuf,
                                      size_t count, hvd_dtype dtype, hvd_op op,
                                      hvd_handle *out) {
    return hvd_submit_reducescatter(ps, ASYNC, name, sendbuf, recvbuf, count,
                                    dtype, op, out);
}

hvd_status hvd_ps_reducescatter_shaped_async(int ps, const char *name,
                                             const void *sendbuf, void *recvbuf,
                                             int ndim, const int64_t *shape,
                                             hvd_dtype dtype, hvd_op op,
                                             hvd_handle *out) {
    return hvd_submit_reducescatter_shaped(ps, ASYNC, name, sendbuf, recvbuf,
                                           ndim, shape, dtype, op, out);
}

hvd_status hvd_ps_reducescatter_shaped(int ps, const char *name,
                                       const void *sendbuf, void *recvbuf,
                                       int ndim, const int64_t *shape,
                                       hvd_dtype dtype, hvd_op op) {
    return hvd_submit_reducescatter_shaped(ps, BLOCKING, name, sendbuf, recvbuf,
                                           ndim, shape, dtype, op, NULL);
}

hvd_status hvd_ps_barrier(int ps) { return hvd_submit_barrier(ps); }
