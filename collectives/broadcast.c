/*
 * Broadcast: a binomial tree for small messages (log2(size) latency
 * steps), and for large ones a chain root -> root+1 -> ... cut into chunks,
 * where every rank forwards chunk c while chunk c+1 arrives, so the time
 * approaches bytes / bandwidth whatever the number of ranks.
 */
#include "collectives/coll.h"

#include <stdint.h>

hvd_status hvd_tree_broadcast(hvd_comm *comm, void *buf, size_t bytes,
                              int root) {
    int p = comm->size, r = comm->rank;
    int vr = (r - root + p) % p;
    int mask = 1, nsend = 0;
    hvd_status st;

    /* Receive from the parent: the rank that differs in vr's lowest set
     * bit. */
    while (mask < p) {
        if (vr & mask) {
            int src = (r - mask + p) % p;
            st = hvd_comm_irecv(comm, src, buf, bytes, &comm->reqs[0]);
            if (st == HVD_OK)
                st = hvd_comm_wait(comm, &comm->reqs[0]);
            if (st != HVD_OK)
                return st;
            break;
        }
        mask <<= 1;
    }
    /* Send to the children, all at once. */
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (vr + mask < p) {
            int dst = (r + mask) % p;
            st = hvd_comm_isend(comm, dst, buf, bytes, &comm->reqs[nsend]);
            if (st != HVD_OK)
                return st;
            nsend++;
        }
    }
    return hvd_comm_waitall(comm, comm->reqs, nsend);
}

hvd_status hvd_chain_broadcast_chunked(hvd_comm *comm, void *buf, size_t bytes,
                                       int root, size_t chunk) {
    int p = comm->size, r = comm->rank;
    int vr = (r - root + p) % p;
    int prev = (r - 1 + p) % p, next = (r + 1) % p;
    int has_prev = vr > 0, has_next = vr + 1 < p;
    size_t depth = (size_t)comm->cfg.depth;
    size_t nchunks = hvd_nchunks(bytes, chunk);
    hvd_req *rreq = comm->reqs, *sreq = comm->reqs + depth;
    size_t posted_recv = 0, done = 0, posted_send = 0, send_done = 0;
    uint8_t *base = buf;
    hvd_status st;

    while (done < nchunks) {
        size_t off, len;

        if (has_prev) {
            while (posted_recv < nchunks && posted_recv - done < depth) {
                hvd_part_range(bytes, nchunks, posted_recv, &off, &len);
                st = hvd_comm_irecv(comm, prev, base + off, len,
                                    &rreq[posted_recv % depth]);
                if (st != HVD_OK)
                    return st;
                posted_recv++;
            }
            st = hvd_comm_wait(comm, &rreq[done % depth]);
            if (st != HVD_OK)
                return st;
        }
        done++;
        /* Forward what has arrived (the root has it all). */
        while (has_next && posted_send < done) {
            if (posted_send - send_done == depth) {
                st = hvd_comm_wait(comm, &sreq[send_done % depth]);
                if (st != HVD_OK)
                    return st;
                send_done++;
            }
            hvd_part_range(bytes, nchunks, posted_send, &off, &len);
            st = hvd_comm_isend(comm, next, base + off, len,
                                &sreq[posted_send % depth]);
            if (st != HVD_OK)
                return st;
            posted_send++;
        }
    }
    while (send_done < posted_send) {
        st = hvd_comm_wait(comm, &sreq[send_done % depth]);
        if (st != HVD_OK)
            return st;
        send_done++;
    }
    return HVD_OK;
}

hvd_status hvd_chain_broadcast(hvd_comm *comm, void *buf, size_t bytes,
                               int root) {
    return hvd_chain_broadcast_chunked(comm, buf, bytes, root,
                                       comm->cfg.chunk_bytes);
}
