/*
 * Ring algorithms, pipelined in chunks.
 *
 * Allreduce is a reduce-scatter followed by an allgather around the ring
 * (Patarasuk and Yuan): count elements are cut into size segments; in
 * reduce-scatter step s rank r sends segment r-s to its right neighbour and
 * receives segment r-s-1 from its left one, reducing it into its own copy;
 * after size-1 steps rank r holds the full result of segment r+1, and the
 * allgather steps pass the finished segments around. Each rank sends and
 * receives 2(size-1)/size of the data, the bandwidth optimum.
 *
 * Each segment is cut into chunks and the steps are flattened into one
 * sequence of operations, op i = (step i / nchunks, chunk i % nchunks).
 * Op i's send depends only on op i-nchunks having finished, so up to depth
 * receives are in flight while a chunk is reduced: the network and the
 * reduction overlap, and a chunk is forwarded as soon as it is reduced.
 *
 * Out of place costs no extra copy: step 0 sends straight from sendbuf,
 * every received chunk is reduced from (received, sendbuf) into recvbuf, and
 * the allgather receives straight into recvbuf.
 */
#include "collectives/coll.h"

#include <string.h>

#include "collectives/reduce.h"
#include "transport/base/error.h"

typedef struct ring_plan ring_plan;

struct ring_plan {
    hvd_comm *comm;
    size_t nchunks;
    size_t nops;
    size_t slot_bytes; /* receive slot size, 0: receive in place */
    uint8_t *slots;    /* depth slots of slot_bytes */
    /* Op i: what to send and where to receive. */
    void (*op)(const ring_plan *plan, size_t i, const uint8_t **sbuf,
               uint8_t **rbuf, size_t *len);
    /* Op i's receive has landed (in slot, when slot_bytes != 0). */
    void (*done)(const ring_plan *plan, size_t i, const uint8_t *slot);
    /* The collective's own data. */
    const uint8_t *sendbuf;
    uint8_t *recvbuf;
    size_t count;
    size_t esize;
    hvd_dtype dtype;
    hvd_op op_kind;
};

/*
 * Runs a flattened ring plan: recv from the left, send to the right, op i's
 * send after op i-nchunks is done.
 */
static hvd_status ring_run(ring_plan *plan) {
    hvd_comm *comm = plan->comm;
    int depth = comm->cfg.depth;
    int right = (comm->rank + 1) % comm->size;
    int left = (comm->rank - 1 + comm->size) % comm->size;
    hvd_req *rreq = comm->reqs;
    hvd_req *sreq = comm->reqs + depth;
    size_t posted_recv = 0, posted_send = 0, send_done = 0, done = 0;
    hvd_status st = HVD_OK;

    while (done < plan->nops) {
        /* Post receives up to depth ahead of the oldest unfinished one. */
        while (posted_recv < plan->nops && posted_recv - done < (size_t)depth) {
            const uint8_t *sbuf;
            uint8_t *rbuf;
            size_t len;
            int slot = (int)(posted_recv % (size_t)depth);

            plan->op(plan, posted_recv, &sbuf, &rbuf, &len);
            if (plan->slot_bytes != 0)
                rbuf = plan->slots + (size_t)slot * plan->slot_bytes;
            st = hvd_comm_irecv(comm, left, rbuf, len, &rreq[slot]);
            if (st != HVD_OK)
                return st;
            posted_recv++;
        }
        /* Post every send whose data is ready, depth at most in flight. */
        while (posted_send < plan->nops &&
               (posted_send < plan->nchunks ||
                posted_send - plan->nchunks < done)) {
            const uint8_t *sbuf;
            uint8_t *rbuf;
            size_t len;
            int slot = (int)(posted_send % (size_t)depth);

            if (posted_send - send_done == (size_t)depth) {
                st = hvd_comm_wait(comm, &sreq[send_done % (size_t)depth]);
                if (st != HVD_OK)
                    return st;
                send_done++;
            }
            plan->op(plan, posted_send, &sbuf, &rbuf, &len);
            st = hvd_comm_isend(comm, right, sbuf, len, &sreq[slot]);
            if (st != HVD_OK)
                return st;
            posted_send++;
        }
        /* Finish the oldest receive. */
        int slot = (int)(done % (size_t)depth);
        st = hvd_comm_wait(comm, &rreq[slot]);
        if (st != HVD_OK)
            return st;
        plan->done(plan, done,
                   plan->slot_bytes != 0
                       ? plan->slots + (size_t)slot * plan->slot_bytes
                       : NULL);
        done++;
        while (send_done < posted_send &&
               sreq[send_done % (size_t)depth].done) {
            if (sreq[send_done % (size_t)depth].status != HVD_OK)
                return hvd_comm_wait(comm, &sreq[send_done % (size_t)depth]);
            send_done++;
        }
    }
    while (send_done < posted_send) {
        st = hvd_comm_wait(comm, &sreq[send_done % (size_t)depth]);
        if (st != HVD_OK)
            return st;
        send_done++;
    }
    return HVD_OK;
}

static size_t mod(long a, int n) {
    long m = a % n;
    return (size_t)(m < 0 ? m + n : m);
}

/* Element range of chunk c of segment seg. */
static void chunk_of(const ring_plan *plan, size_t seg, size_t c, size_t *off,
                     size_t *cnt) {
    size_t soff, scnt, coff;

    hvd_part_range(plan->count, (size_t)plan->comm->size, seg, &soff, &scnt);
    hvd_part_range(scnt, plan->nchunks, c, &coff, cnt);
    *off = soff + coff;
}

/* ---- allreduce ---- */

static void ar_op(const ring_plan *plan, size_t i, const uint8_t **sbuf,
                  uint8_t **rbuf, size_t *len) {
    int p = plan->comm->size, r = plan->comm->rank;
    long step = (long)(i / plan->nchunks);
    size_t c = i % plan->nchunks, off, cnt, sseg, rseg;
    const uint8_t *src;

    if (step < p - 1) { /* reduce-scatter */
        sseg = mod(r - step, p);
        rseg = mod(r - step - 1, p);
        src = step == 0 ? plan->sendbuf : plan->recvbuf;
    } else { /* allgather */
        long t = step - (p - 1);
        sseg = mod(r + 1 - t, p);
        rseg = mod(r - t, p);
        src = plan->recvbuf;
    }
    chunk_of(plan, sseg, c, &off, &cnt);
    *sbuf = src + off * plan->esize;
    *len = cnt * plan->esize;
    chunk_of(plan, rseg, c, &off, &cnt);
    *rbuf = plan->recvbuf + off * plan->esize;
    /* Matching sends and receives of one op have equal lengths: the
     * segment sent by the left neighbour is the one received here. */
}

static void ar_done(const ring_plan *plan, size_t i, const uint8_t *slot) {
    int p = plan->comm->size, r = plan->comm->rank;
    long step = (long)(i / plan->nchunks);
    size_t off, cnt;

    if (step >= p - 1)
        return; /* allgather: received in place */
    chunk_of(plan, mod(r - step - 1, p), i % plan->nchunks, &off, &cnt);
    hvd_reduce(plan->recvbuf + off * plan->esize, slot,
               plan->sendbuf + off * plan->esize, cnt, plan->dtype,
               plan->op_kind);
    if (step == p - 2 && plan->op_kind == HVD_AVERAGE)
        hvd_reduce_scale_div(plan->recvbuf + off * plan->esize, cnt,
                             plan->dtype, p);
}

hvd_status hvd_ring_allreduce(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype,
                              hvd_op op) {
    size_t esize = hvd_dtype_size(dtype);
    size_t chunk = comm->cfg.chunk_bytes / esize;
    size_t maxseg = (count + (size_t)comm->size - 1) / (size_t)comm->size;
    ring_plan plan;
    void *slots;
    hvd_status st;

    if (chunk == 0)
        chunk = 1;
    memset(&plan, 0, sizeof(plan));
    plan.comm = comm;
    plan.nchunks = hvd_nchunks(maxseg, chunk);
    plan.nops = 2 * (size_t)(comm->size - 1) * plan.nchunks;
    /* A chunk never exceeds ceil(maxseg / nchunks) <= chunk elements. */
    plan.slot_bytes = ((maxseg + plan.nchunks - 1) / plan.nchunks) * esize;
    if (plan.slot_bytes == 0)
        plan.slot_bytes = esize;
    st = hvd_comm_scratch(comm, plan.slot_bytes * (size_t)comm->cfg.depth,
                          &slots);
    if (st != HVD_OK)
        return st;
    plan.slots = slots;
    plan.op = ar_op;
    plan.done = ar_done;
    plan.sendbuf = sendbuf;
    plan.recvbuf = recvbuf;
    plan.count = count;
    plan.esize = esize;
    plan.dtype = dtype;
    plan.op_kind = op;
    return ring_run(&plan);
}

/* ---- allgather ---- */

/* Here count counts bytes: block b of recvbuf is [b * count, (b+1) * count).
 */
static void ag_op(const ring_plan *plan, size_t i, const uint8_t **sbuf,
                  uint8_t **rbuf, size_t *len) {
    int p = plan->comm->size, r = plan->comm->rank;
    long step = (long)(i / plan->nchunks);
    size_t c = i % plan->nchunks, off, cnt;
    size_t sblk = mod(r - step, p), rblk = mod(r - step - 1, p);

    hvd_part_range(plan->count, plan->nchunks, c, &off, &cnt);
    *sbuf = plan->recvbuf + sblk * plan->count + off;
    *rbuf = plan->recvbuf + rblk * plan->count + off;
    *len = cnt;
}

static void ag_done(const ring_plan *plan, size_t i, const uint8_t *slot) {
    (void)plan;
    (void)i;
    (void)slot;
}

hvd_status hvd_ring_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t bytes) {
    uint8_t *mine = (uint8_t *)recvbuf + (size_t)comm->rank * bytes;
    ring_plan plan;

    if (sendbuf != mine && bytes > 0)
        memmove(mine, sendbuf, bytes);
    if (comm->size == 1)
        return HVD_OK;
    memset(&plan, 0, sizeof(plan));
    plan.comm = comm;
    plan.nchunks = hvd_nchunks(bytes, comm->cfg.chunk_bytes);
    plan.nops = (size_t)(comm->size - 1) * plan.nchunks;
    plan.op = ag_op;
    plan.done = ag_done;
    plan.recvbuf = recvbuf;
    plan.count = bytes;
    return ring_run(&plan);
}
