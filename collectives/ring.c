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

#include "transport/base/dtype.h"
#include "transport/base/error.h"

typedef struct ring_plan ring_plan;

/* The phases of a ring allreduce a plan runs. */
enum { RING_BOTH, RING_SCATTER, RING_ALLGATHER };

struct ring_plan {
    hvd_comm *comm;
    size_t nchunks;
    size_t first; /* op index of the plan's first op (a phase alone) */
    size_t nops;
    size_t slot_bytes; /* receive slot size, 0: receive in place */
    uint8_t *slots;    /* depth slots of slot_bytes */
    /* Op i: what to send, and where to receive (slot is op i's receive
     * slot when slot_bytes != 0). */
    void (*op)(const ring_plan *plan, size_t i, uint8_t *slot,
               const uint8_t **sbuf, size_t *slen, uint8_t **rbuf,
               size_t *rlen);
    /* Op i's receive has landed (in slot, when slot_bytes != 0). */
    void (*done)(const ring_plan *plan, size_t i, const uint8_t *slot);
    /* The collective's own data. */
    const uint8_t *sendbuf;
    uint8_t *recvbuf;
    size_t count;
    size_t esize;
    hvd_dtype dtype;
    hvd_op op_kind;
    /* Segments are cut in whole units of unit elements (rows); rank r
     * plays the part of rank r + shift in the reduce-scatter, so that it
     * ends with segment r + shift + 1. */
    size_t unit;
    int shift;
};

static uint8_t *slot_ptr(const ring_plan *plan, int slot) {
    return plan->slot_bytes != 0 ? plan->slots + (size_t)slot * plan->slot_bytes
                                 : NULL;
}

/*
 * Runs a flattened ring plan: recv from the left, send to the right, op i's
 * send after op i-nchunks is done.
 *
 * The loop never blocks on one request: a send can only complete once the
 * right neighbour has posted the matching receive, which it does only as
 * it finishes earlier receives, so every iteration posts what it can,
 * retires whatever has finished (receives in order, then sends), and waits
 * for the network only when nothing moved.
 */
static hvd_status ring_run(ring_plan *plan) {
    hvd_comm *comm = plan->comm;
    size_t depth = (size_t)comm->cfg.depth;
    int right = (comm->rank + 1) % comm->size;
    int left = (comm->rank - 1 + comm->size) % comm->size;
    hvd_req *rreq = comm->reqs;
    hvd_req *sreq = comm->reqs + depth;
    size_t posted_recv = 0, posted_send = 0, send_done = 0, done = 0;
    hvd_status st;

    while (done < plan->nops || send_done < plan->nops) {
        const uint8_t *sbuf;
        uint8_t *rbuf;
        size_t slen, rlen;
        int moved = 0;

        /* Post receives up to depth ahead of the oldest unfinished one. */
        while (posted_recv < plan->nops && posted_recv - done < depth) {
            uint8_t *slot = slot_ptr(plan, (int)(posted_recv % depth));
            plan->op(plan, posted_recv, slot, &sbuf, &slen, &rbuf, &rlen);
            st = hvd_comm_irecv(comm, left, rbuf, rlen,
                                &rreq[posted_recv % depth]);
            if (st != HVD_OK)
                return st;
            posted_recv++;
        }
        /* Post every send whose data is ready, depth at most in flight. */
        while (posted_send < plan->nops && posted_send - send_done < depth &&
               (posted_send < plan->nchunks ||
                posted_send - plan->nchunks < done)) {
            plan->op(plan, posted_send, NULL, &sbuf, &slen, &rbuf, &rlen);
            st = hvd_comm_isend(comm, right, sbuf, slen,
                                &sreq[posted_send % depth]);
            if (st != HVD_OK)
                return st;
            posted_send++;
        }
        /* Retire what has finished. */
        while (done < posted_recv && rreq[done % depth].done) {
            if (rreq[done % depth].status != HVD_OK)
                return hvd_comm_wait(comm, &rreq[done % depth]);
            plan->done(plan, done, slot_ptr(plan, (int)(done % depth)));
            done++;
            moved = 1;
        }
        while (send_done < posted_send && sreq[send_done % depth].done) {
            if (sreq[send_done % depth].status != HVD_OK)
                return hvd_comm_wait(comm, &sreq[send_done % depth]);
            send_done++;
            moved = 1;
        }
        if (!moved) {
            st = hvd_comm_progress(comm);
            if (st != HVD_OK)
                return st;
        }
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

    hvd_part_range(plan->count / plan->unit, (size_t)plan->comm->size, seg,
                   &soff, &scnt);
    soff *= plan->unit;
    scnt *= plan->unit;
    hvd_part_range(scnt, plan->nchunks, c, &coff, cnt);
    *off = soff + coff;
}

/* ---- allreduce ---- */

static void ar_op(const ring_plan *plan, size_t i, uint8_t *slot,
                  const uint8_t **sbuf, size_t *slen, uint8_t **rbuf,
                  size_t *rlen) {
    int p = plan->comm->size, r = (plan->comm->rank + plan->shift + p) % p;
    long step = (long)((i + plan->first) / plan->nchunks);
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
        slot = NULL;
    }
    chunk_of(plan, sseg, c, &off, &cnt);
    *sbuf = src + off * plan->esize;
    *slen = cnt * plan->esize;
    /* The left neighbour sends this op the segment it holds as its sseg,
     * which is this rank's rseg: same range, same length. */
    chunk_of(plan, rseg, c, &off, &cnt);
    *rbuf = slot != NULL ? slot : plan->recvbuf + off * plan->esize;
    *rlen = cnt * plan->esize;
}

static void ar_done(const ring_plan *plan, size_t i, const uint8_t *slot) {
    int p = plan->comm->size, r = (plan->comm->rank + plan->shift + p) % p;
    long step = (long)((i + plan->first) / plan->nchunks);
    size_t off, cnt;

    if (step >= p - 1)
        return; /* allgather: received in place */
    chunk_of(plan, mod(r - step - 1, p), i % plan->nchunks, &off, &cnt);
    hvd_comm_reduce(plan->comm, plan->recvbuf + off * plan->esize, slot,
                    plan->sendbuf + off * plan->esize, cnt, plan->dtype,
                    plan->op_kind);
    if (step == p - 2 && plan->op_kind == HVD_AVERAGE)
        hvd_comm_scale_div(plan->comm, plan->recvbuf + off * plan->esize, cnt,
                           plan->dtype, p);
}

/* Plans the phases of the ring allreduce (segments of whole units,
 * shifted: ring_plan), in chunks of chunk_bytes. */
static hvd_status ar_plan(hvd_comm *comm, const void *sendbuf, void *recvbuf,
                          size_t count, hvd_dtype dtype, hvd_op op, int phases,
                          size_t unit, int shift, size_t chunk_bytes) {
    size_t esize = hvd_dtype_size(dtype);
    size_t chunk = chunk_bytes / esize;
    size_t maxseg =
        (count / unit + (size_t)comm->size - 1) / (size_t)comm->size * unit;
    size_t steps = (size_t)(comm->size - 1);
    ring_plan plan;
    void *slots;
    hvd_status st;

    if (chunk == 0)
        chunk = 1;
    memset(&plan, 0, sizeof(plan));
    plan.comm = comm;
    plan.nchunks = hvd_nchunks(maxseg, chunk);
    plan.first = phases == RING_ALLGATHER ? steps * plan.nchunks : 0;
    plan.nops = (phases == RING_BOTH ? 2 : 1) * steps * plan.nchunks;
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
    plan.unit = unit;
    plan.shift = shift;
    return ring_run(&plan);
}

hvd_status hvd_ring_allreduce_chunked(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op,
                                      size_t chunk) {
    if (comm->size == 1) { /* as the other ring forms: a copy */
        if (sendbuf != recvbuf && count > 0)
            hvd_comm_copy(comm, recvbuf, sendbuf,
                          count * hvd_dtype_size(dtype));
        return HVD_OK;
    }
    return ar_plan(comm, sendbuf, recvbuf, count, dtype, op, RING_BOTH, 1, 0,
                   chunk);
}

hvd_status hvd_ring_allreduce(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype,
                              hvd_op op) {
    return hvd_ring_allreduce_chunked(comm, sendbuf, recvbuf, count, dtype, op,
                                      comm->cfg.chunk_bytes);
}

int hvd_ring_owned_segment(const hvd_comm *comm) {
    return (comm->rank + 1) % comm->size;
}

hvd_status hvd_ring_reduce_scatter(hvd_comm *comm, const void *sendbuf,
                                   void *recvbuf, size_t count, hvd_dtype dtype,
                                   hvd_op op) {
    if (comm->size == 1) {
        if (sendbuf != recvbuf && count > 0)
            hvd_comm_copy(comm, recvbuf, sendbuf,
                          count * hvd_dtype_size(dtype));
        return HVD_OK;
    }
    return ar_plan(comm, sendbuf, recvbuf, count, dtype, op, RING_SCATTER, 1, 0,
                   comm->cfg.chunk_bytes);
}

hvd_status hvd_ring_reduce_scatter_blocks_chunked(hvd_comm *comm,
                                                  const void *sendbuf,
                                                  void *scratch, size_t count,
                                                  size_t unit, hvd_dtype dtype,
                                                  hvd_op op, size_t chunk) {
    if (comm->size == 1) {
        if (sendbuf != scratch && count > 0)
            hvd_comm_copy(comm, scratch, sendbuf,
                          count * hvd_dtype_size(dtype));
        return HVD_OK;
    }
    /* Playing rank r - 1's part, rank r ends with segment r. */
    return ar_plan(comm, sendbuf, scratch, count, dtype, op, RING_SCATTER, unit,
                   -1, chunk);
}

hvd_status hvd_ring_reduce_scatter_blocks(hvd_comm *comm, const void *sendbuf,
                                          void *scratch, size_t count,
                                          size_t unit, hvd_dtype dtype,
                                          hvd_op op) {
    return hvd_ring_reduce_scatter_blocks_chunked(
        comm, sendbuf, scratch, count, unit, dtype, op, comm->cfg.chunk_bytes);
}

hvd_status hvd_ring_allgather_segments(hvd_comm *comm, void *buf, size_t count,
                                       hvd_dtype dtype) {
    if (comm->size == 1)
        return HVD_OK;
    return ar_plan(comm, buf, buf, count, dtype, HVD_SUM, RING_ALLGATHER, 1, 0,
                   comm->cfg.chunk_bytes);
}

/* ---- allgather ---- */

/* Here count counts bytes: block b of recvbuf is [b * count, (b+1) * count).
 */
static void ag_op(const ring_plan *plan, size_t i, uint8_t *slot,
                  const uint8_t **sbuf, size_t *slen, uint8_t **rbuf,
                  size_t *rlen) {
    int p = plan->comm->size, r = plan->comm->rank;
    long step = (long)(i / plan->nchunks);
    size_t c = i % plan->nchunks, off, cnt;
    size_t sblk = mod(r - step, p), rblk = mod(r - step - 1, p);

    (void)slot;
    hvd_part_range(plan->count, plan->nchunks, c, &off, &cnt);
    *sbuf = plan->recvbuf + sblk * plan->count + off;
    *rbuf = plan->recvbuf + rblk * plan->count + off;
    *slen = *rlen = cnt;
}

static void ag_done(const ring_plan *plan, size_t i, const uint8_t *slot) {
    (void)plan;
    (void)i;
    (void)slot;
}

hvd_status hvd_ring_allgather_chunked(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t bytes,
                                      size_t chunk) {
    uint8_t *mine = (uint8_t *)recvbuf + (size_t)comm->rank * bytes;
    ring_plan plan;

    hvd_comm_copy(comm, mine, sendbuf, bytes);
    if (comm->size == 1)
        return HVD_OK;
    memset(&plan, 0, sizeof(plan));
    plan.comm = comm;
    plan.nchunks = hvd_nchunks(bytes, chunk);
    plan.nops = (size_t)(comm->size - 1) * plan.nchunks;
    plan.op = ag_op;
    plan.done = ag_done;
    plan.recvbuf = recvbuf;
    plan.count = bytes;
    return ring_run(&plan);
}

hvd_status hvd_ring_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t bytes) {
    return hvd_ring_allgather_chunked(comm, sendbuf, recvbuf, bytes,
                                      comm->cfg.chunk_bytes);
}
