/*
 * The collectives of the public API in process set ps (0: the job), as the
 * entry points of the job (api/submit.c) and of a set (api/process_set.c)
 * call them: each begins one call (api/call.h) and checks, builds and
 * hands over its record. mode says how the caller waits; out is the
 * handle of an asynchronous call (unused otherwise).
 */
#ifndef HVD_API_SUBMIT_H
#define HVD_API_SUBMIT_H

#include "api/call.h"

hvd_status hvd_submit_allreduce(int ps, hvd_call_mode mode, const char *name,
                                const void *sendbuf, void *recvbuf,
                                size_t count, hvd_dtype dtype, hvd_op op,
                                hvd_handle *out);
hvd_status hvd_submit_allreduce_shaped(int ps, hvd_call_mode mode,
                                       const char *name, const void *sendbuf,
                                       void *recvbuf, int ndim,
                                       const int64_t *shape, hvd_dtype dtype,
                                       hvd_op op, hvd_handle *out);
/* fn and kind: one of the HVD_GROUPED_* pairs below. */
hvd_status hvd_submit_grouped(int ps, hvd_call_mode mode, const char *fn,
                              hvd_kind kind, const char *name, int n,
                              const void *const *sendbufs,
                              void *const *recvbufs, const size_t *counts,
                              hvd_dtype dtype, hvd_op op, hvd_handle *out);
#define HVD_GROUPED_ALLREDUCE "hvd_grouped_allreduce", HVD_KIND_ALLREDUCE
#define HVD_GROUPED_ALLGATHER "hvd_grouped_allgather", HVD_KIND_ALLGATHER
#define HVD_GROUPED_REDUCESCATTER                                              \
    "hvd_grouped_reducescatter", HVD_KIND_REDUCESCATTER
hvd_status hvd_submit_broadcast(int ps, hvd_call_mode mode, const char *name,
                                void *buf, size_t count, hvd_dtype dtype,
                                int root, hvd_handle *out);
hvd_status hvd_submit_broadcast_shaped(int ps, hvd_call_mode mode,
                                       const char *name, void *buf, int ndim,
                                       const int64_t *shape, hvd_dtype dtype,
                                       int root, hvd_handle *out);
hvd_status hvd_submit_allgather(int ps, hvd_call_mode mode, const char *name,
                                const void *sendbuf, void *recvbuf,
                                size_t count, hvd_dtype dtype, hvd_handle *out);
hvd_status hvd_submit_alltoall(int ps, hvd_call_mode mode, const char *name,
                               const void *sendbuf, size_t count,
                               const size_t *sendcounts, void *recvbuf,
                               size_t recvcap, size_t *recvcounts_out,
                               hvd_dtype dtype, hvd_handle *out);
hvd_status hvd_submit_reducescatter(int ps, hvd_call_mode mode,
                                    const char *name, const void *sendbuf,
                                    void *recvbuf, size_t count,
                                    hvd_dtype dtype, hvd_op op,
                                    hvd_handle *out);
hvd_status hvd_submit_reducescatter_shaped(int ps, hvd_call_mode mode,
                                           const char *name,
                                           const void *sendbuf, void *recvbuf,
                                           int ndim, const int64_t *shape,
                                           hvd_dtype dtype, hvd_op op,
                                           hvd_handle *out);
hvd_status hvd_submit_barrier(int ps);

#endif
