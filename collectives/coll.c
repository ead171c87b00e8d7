/*
 * Entry points of the collectives: trivial cases, the choice of algorithm,
 * and the barrier.
 */
#include "collectives/coll.h"

#include <string.h>

#include "collectives/reduce.h"

hvd_algo hvd_select_allreduce(const hvd_comm *comm, size_t bytes) {
    if (comm->cfg.allreduce_algo == HVD_ALGO_RING ||
        comm->cfg.allreduce_algo == HVD_ALGO_RD)
        return comm->cfg.allreduce_algo;
    return bytes <= comm->cfg.allreduce_rd_max ? HVD_ALGO_RD : HVD_ALGO_RING;
}

hvd_algo hvd_select_broadcast(const hvd_comm *comm, size_t bytes) {
    if (comm->cfg.bcast_algo == HVD_ALGO_TREE ||
        comm->cfg.bcast_algo == HVD_ALGO_PIPELINE)
        return comm->cfg.bcast_algo;
    return bytes <= comm->cfg.bcast_tree_max ? HVD_ALGO_TREE
                                             : HVD_ALGO_PIPELINE;
}

hvd_status hvd_coll_allreduce(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype,
                              hvd_op op) {
    size_t bytes = count * hvd_dtype_size(dtype);

    if (comm->size == 1) {
        /* The average of one rank is itself. */
        if (sendbuf != recvbuf && bytes > 0)
            memcpy(recvbuf, sendbuf, bytes);
        comm->last_path = "local";
        return HVD_OK;
    }
    hvd_algo algo = hvd_select_allreduce(comm, bytes);
    comm->last_path = hvd_algo_name(algo);
    if (algo == HVD_ALGO_RD)
        return hvd_rd_allreduce(comm, sendbuf, recvbuf, count, dtype, op);
    return hvd_ring_allreduce(comm, sendbuf, recvbuf, count, dtype, op);
}

hvd_status hvd_coll_broadcast(hvd_comm *comm, void *buf, size_t count,
                              hvd_dtype dtype, int root) {
    size_t bytes = count * hvd_dtype_size(dtype);

    if (comm->size == 1) {
        comm->last_path = "local";
        return HVD_OK;
    }
    hvd_algo algo = hvd_select_broadcast(comm, bytes);
    comm->last_path = hvd_algo_name(algo);
    if (algo == HVD_ALGO_TREE)
        return hvd_tree_broadcast(comm, buf, bytes, root);
    return hvd_chain_broadcast(comm, buf, bytes, root);
}

hvd_status hvd_coll_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype) {
    comm->last_path = comm->size == 1 ? "local" : "ring";
    return hvd_ring_allgather(comm, sendbuf, recvbuf,
                              count * hvd_dtype_size(dtype));
}

/*
 * Dissemination barrier (Hensgen, Finkel and Manber): in round k every rank
 * signals rank + 2^k and waits for rank - 2^k; after ceil(log2(size))
 * rounds every rank has heard, directly or not, from every other.
 */
hvd_status hvd_coll_barrier(hvd_comm *comm) {
    int p = comm->size, r = comm->rank;
    static char none;

    comm->last_path = p == 1 ? "local" : "dissemination";
    for (int k = 1; k < p; k <<= 1) {
        hvd_status st =
            hvd_comm_irecv(comm, (r - k + p) % p, &none, 0, &comm->reqs[0]);
        if (st == HVD_OK)
            st = hvd_comm_isend(comm, (r + k) % p, &none, 0, &comm->reqs[1]);
        if (st == HVD_OK)
            st = hvd_comm_waitall(comm, comm->reqs, 2);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}
