/*
 * Recursive-doubling allreduce, for small messages where latency rules:
 * log2(size) exchange steps of the whole buffer. For a size that is not a
 * power of two, the first 2*rem ranks fold pairwise first (the even rank
 * hands its data to the odd one and sits out), the remaining power of two
 * run the doubling, and the odd ranks hand the result back (Thakur,
 * Rabenseifner and Gropp, "Optimization of collective communication
 * operations in MPICH").
 *
 * Both partners of a step combine the same two operands and the reduction
 * ops are commutative, so every rank ends with bitwise the same result.
 */
#include "collectives/coll.h"

#include <string.h>

#include "transport/base/dtype.h"

hvd_status hvd_rd_allreduce(hvd_comm *comm, const void *sendbuf, void *recvbuf,
                            size_t count, hvd_dtype dtype, hvd_op op) {
    size_t bytes = count * hvd_dtype_size(dtype);
    int p = comm->size, r = comm->rank;
    int p2 = 1, rem, newrank;
    hvd_req *req = comm->reqs;
    void *tmp;
    hvd_status st;

    hvd_comm_copy(comm, recvbuf, sendbuf, bytes);
    while (p2 * 2 <= p)
        p2 *= 2;
    rem = p - p2;
    st = hvd_comm_scratch(comm, bytes ? bytes : 1, &tmp);
    if (st != HVD_OK)
        return st;

    st = hvd_fold(comm, recvbuf, tmp, count, dtype, op, rem, &newrank);
    if (st != HVD_OK)
        return st;

    if (newrank >= 0) {
        for (int mask = 1; mask < p2; mask <<= 1) {
            int newpartner = newrank ^ mask;
            int partner =
                newpartner < rem ? newpartner * 2 + 1 : newpartner + rem;
            st = hvd_comm_irecv(comm, partner, tmp, bytes, &req[0]);
            if (st == HVD_OK)
                st = hvd_comm_isend(comm, partner, recvbuf, bytes, &req[1]);
            if (st == HVD_OK)
                st = hvd_comm_waitall(comm, req, 2);
            if (st != HVD_OK)
                return st;
            /* Lower rank's data first: both partners compute a op b with
             * the same a and b. */
            if (partner < r)
                hvd_comm_reduce(comm, recvbuf, tmp, recvbuf, count, dtype, op);
            else
                hvd_comm_reduce(comm, recvbuf, recvbuf, tmp, count, dtype, op);
        }
    }

    if (op == HVD_AVERAGE && newrank >= 0)
        hvd_comm_scale_div(comm, recvbuf, count, dtype, p);
    return hvd_unfold(comm, recvbuf, bytes, rem);
}

hvd_status hvd_fold(hvd_comm *comm, void *buf, void *tmp, size_t count,
                    hvd_dtype dtype, hvd_op op, int rem, int *newrank_out) {
    size_t bytes = count * hvd_dtype_size(dtype);
    int r = comm->rank;
    hvd_req *req = comm->reqs;
    hvd_status st = HVD_OK;

    if (r >= 2 * rem) {
        *newrank_out = r - rem;
        return HVD_OK;
    }
    if (r % 2 == 0) {
        st = hvd_comm_isend(comm, r + 1, buf, bytes, &req[0]);
        if (st == HVD_OK)
            st = hvd_comm_wait(comm, &req[0]);
        *newrank_out = -1;
        return st;
    }
    st = hvd_comm_irecv(comm, r - 1, tmp, bytes, &req[0]);
    if (st == HVD_OK)
        st = hvd_comm_wait(comm, &req[0]);
    if (st == HVD_OK)
        hvd_comm_reduce(comm, buf, tmp, buf, count, dtype, op);
    *newrank_out = r / 2;
    return st;
}

hvd_status hvd_unfold(hvd_comm *comm, void *buf, size_t bytes, int rem) {
    int r = comm->rank;
    hvd_req *req = comm->reqs;
    hvd_status st;

    if (r >= 2 * rem)
        return HVD_OK;
    if (r % 2 == 1)
        st = hvd_comm_isend(comm, r - 1, buf, bytes, &req[0]);
    else
        st = hvd_comm_irecv(comm, r + 1, buf, bytes, &req[0]);
    if (st == HVD_OK)
        st = hvd_comm_wait(comm, &req[0]);
    return st;
}
