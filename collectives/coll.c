/*
 * Entry points of the collectives: trivial cases, the choice of algorithm,
 * and the barrier.
 */
#include "collectives/coll.h"

#include <string.h>

#include "collectives/reduce.h"

hvd_algo hvd_select_allreduce(const hvd_comm *comm, size_t bytes) {
    hvd_algo forced = comm->cfg.allreduce_algo;

    if (forced == HVD_ALGO_RING || forced == HVD_ALGO_RD)
        return forced;
    /* A transport's own collectives (MPI's) know their fabric: auto takes
     * them where they exist. */
    if (comm->cfg.native && forced != HVD_ALGO_RING)
        return HVD_ALGO_NATIVE;
    return bytes <= comm->cfg.allreduce_rd_max ? HVD_ALGO_RD : HVD_ALGO_RING;
}

hvd_algo hvd_select_broadcast(const hvd_comm *comm, size_t bytes) {
    hvd_algo forced = comm->cfg.bcast_algo;

    if (forced == HVD_ALGO_TREE || forced == HVD_ALGO_PIPELINE)
        return forced;
    if (comm->cfg.native)
        return HVD_ALGO_NATIVE;
    return bytes <= comm->cfg.bcast_tree_max ? HVD_ALGO_TREE
                                             : HVD_ALGO_PIPELINE;
}

/* The fallback when a native collective does not take this dtype (MPI
 * has no float16/bfloat16). */
static hvd_algo without_native(const hvd_comm *comm, size_t bytes) {
    return bytes <= comm->cfg.allreduce_rd_max ? HVD_ALGO_RD : HVD_ALGO_RING;
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
    if (algo == HVD_ALGO_NATIVE) {
        hvd_op native_op = op == HVD_AVERAGE ? HVD_SUM : op;
        hvd_status st = comm->tp->ops->allreduce(comm->tp, sendbuf, recvbuf,
                                                 count, dtype, native_op);
        if (st == HVD_OK) {
            comm->last_path = "native";
            if (op == HVD_AVERAGE)
                hvd_reduce_scale_div(recvbuf, count, dtype, comm->size);
            return HVD_OK;
        }
        if (st != HVD_ERR_UNSUPPORTED)
            return st;
        algo = without_native(comm, bytes);
    }
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
    if (algo == HVD_ALGO_NATIVE)
        return comm->tp->ops->broadcast(comm->tp, buf, count, dtype, root);
    if (algo == HVD_ALGO_TREE)
        return hvd_tree_broadcast(comm, buf, bytes, root);
    return hvd_chain_broadcast(comm, buf, bytes, root);
}

hvd_status hvd_coll_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype) {
    if (comm->size > 1 && comm->cfg.native &&
        comm->cfg.allreduce_algo != HVD_ALGO_RING) {
        comm->last_path = "native";
        return comm->tp->ops->allgather(comm->tp, sendbuf, recvbuf, count,
                                        dtype);
    }
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
