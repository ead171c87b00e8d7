/*
 * The collectives. Each entry point picks an algorithm (collectives/select.c)
 * unless one is forced, and runs it over comm's transport. See comm.h for
 * the contract they share.
 */
#ifndef HVD_COLLECTIVES_COLL_H
#define HVD_COLLECTIVES_COLL_H

#include "collectives/comm.h"

hvd_status hvd_coll_allreduce(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype,
                              hvd_op op);
hvd_status hvd_coll_broadcast(hvd_comm *comm, void *buf, size_t count,
                              hvd_dtype dtype, int root);
/* recvbuf gets size * count elements in rank order; sendbuf may be
 * recvbuf + rank * count elements (in place). */
hvd_status hvd_coll_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype);
hvd_status hvd_coll_barrier(hvd_comm *comm);

/* The algorithms, callable directly (tests, hvd-tune). */
hvd_status hvd_ring_allreduce(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype,
                              hvd_op op);
hvd_status hvd_rd_allreduce(hvd_comm *comm, const void *sendbuf, void *recvbuf,
                            size_t count, hvd_dtype dtype, hvd_op op);
hvd_status hvd_tree_broadcast(hvd_comm *comm, void *buf, size_t bytes,
                              int root);
hvd_status hvd_chain_broadcast(hvd_comm *comm, void *buf, size_t bytes,
                               int root);
hvd_status hvd_ring_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t bytes);

/* Which algorithm the selector takes for this call (never AUTO). */
hvd_algo hvd_select_allreduce(const hvd_comm *comm, size_t bytes);
hvd_algo hvd_select_broadcast(const hvd_comm *comm, size_t bytes);

#endif
