/*
 * Entry points of the collectives: trivial cases, the choice of path
 * (select.h's table where the communicator has one, else its config), and
 * the barrier.
 */
#include "collectives/coll.h"

#include <string.h>

#include "collectives/reduce.h"
#include "collectives/select.h"
#include "transport/base/log.h"

hvd_algo hvd_select_allreduce(const hvd_comm *comm, size_t bytes) {
    hvd_algo forced = comm->cfg.allreduce_algo;

    if (forced == HVD_ALGO_RING || forced == HVD_ALGO_RD ||
        forced == HVD_ALGO_RABENSEIFNER ||
        (forced == HVD_ALGO_DIRECT && hvd_comm_can_get(comm)))
        return forced;
    /* A transport's own collectives (MPI's) know their fabric: auto takes
     * them where they exist. */
    if (comm->cfg.native && forced != HVD_ALGO_RING)
        return HVD_ALGO_NATIVE;
    return bytes <= comm->cfg.allreduce_rd_max ? HVD_ALGO_RD : HVD_ALGO_RING;
}

hvd_algo hvd_select_broadcast(const hvd_comm *comm, size_t bytes) {
    hvd_algo forced = comm->cfg.bcast_algo;

    if (forced == HVD_ALGO_TREE || forced == HVD_ALGO_PIPELINE ||
        (forced == HVD_ALGO_DIRECT && hvd_comm_can_get(comm)))
        return forced;
    if (comm->cfg.native)
        return HVD_ALGO_NATIVE;
    return bytes <= comm->cfg.bcast_tree_max ? HVD_ALGO_TREE
                                             : HVD_ALGO_PIPELINE;
}

static hvd_algo select_allgather(const hvd_comm *comm) {
    hvd_algo forced = comm->cfg.allreduce_algo;

    if (forced == HVD_ALGO_DIRECT && hvd_comm_can_get(comm))
        return HVD_ALGO_DIRECT;
    if (comm->cfg.native && forced != HVD_ALGO_RING)
        return HVD_ALGO_NATIVE;
    return HVD_ALGO_RING;
}

void hvd_coll_plan(hvd_comm *comm, hvd_coll_kind kind, size_t bytes,
                   hvd_dtype dtype, hvd_plan *out) {
    memset(out, 0, sizeof(*out));
    out->base = comm;
    out->comm = comm;
    out->chunk = comm->cfg.chunk_bytes;
    if (comm->size == 1) {
        out->algo = HVD_ALGO_LOCAL;
        return;
    }
    if (comm->paths != NULL) {
        hvd_paths *paths = comm->paths;
        hvd_peer_class cls =
            paths->single_host ? HVD_CLASS_SAME_HOST : HVD_CLASS_OTHER_HOST;
        const hvd_choice *e = &paths->sel.t[kind][cls][hvd_sel_bucket(bytes)];
        out->algo = (hvd_algo)e->algo;
        out->chunk = e->chunk;
        if (e->tp == HVD_TP_SHM && paths->shm != NULL)
            out->comm = paths->shm;
    } else {
        out->algo =
            kind == HVD_COLL_ALLREDUCE   ? hvd_select_allreduce(comm, bytes)
            : kind == HVD_COLL_BROADCAST ? hvd_select_broadcast(comm, bytes)
                                         : select_allgather(comm);
    }
    /* MPI has no float16/bfloat16. */
    if (out->algo == HVD_ALGO_NATIVE &&
        (dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16))
        out->algo = kind == HVD_COLL_ALLREDUCE
                        ? (bytes <= comm->cfg.allreduce_rd_max ? HVD_ALGO_RD
                                                               : HVD_ALGO_RING)
                    : kind == HVD_COLL_BROADCAST ? HVD_ALGO_TREE
                                                 : HVD_ALGO_RING;
}

const char *hvd_plan_transport(const hvd_plan *plan) {
    if (plan->algo == HVD_ALGO_LOCAL)
        return "local";
    if (plan->algo == HVD_ALGO_HIER)
        return plan->comm->paths->hier_name;
    return plan->comm->tp != NULL ? plan->comm->tp->ops->name : "local";
}

/* Runs a flat allreduce algorithm on comm (no paths involved), in chunks
 * of chunk bytes where it pipelines. */
static hvd_status run_allreduce(hvd_comm *comm, hvd_algo algo,
                                const void *sendbuf, void *recvbuf,
                                size_t count, hvd_dtype dtype, hvd_op op,
                                size_t chunk) {
    switch (algo) {
    case HVD_ALGO_NATIVE: {
        hvd_op native_op = op == HVD_AVERAGE ? HVD_SUM : op;
        hvd_status st = comm->tp->ops->allreduce(comm->tp, sendbuf, recvbuf,
                                                 count, dtype, native_op);
        if (st == HVD_OK && op == HVD_AVERAGE)
            hvd_reduce_scale_div(recvbuf, count, dtype, comm->size);
        return st;
    }
    case HVD_ALGO_RD:
        return hvd_rd_allreduce(comm, sendbuf, recvbuf, count, dtype, op);
    case HVD_ALGO_RABENSEIFNER:
        return hvd_rabenseifner_allreduce(comm, sendbuf, recvbuf, count, dtype,
                                          op);
    case HVD_ALGO_DIRECT:
        return hvd_direct_allreduce_chunked(comm, sendbuf, recvbuf, count,
                                            dtype, op, chunk);
    default:
        return hvd_ring_allreduce_chunked(comm, sendbuf, recvbuf, count, dtype,
                                          op, chunk);
    }
}

/*
 * Hierarchical allreduce: a reduce-scatter among this host's ranks (shared
 * memory), an allreduce of this rank's shard among the ranks of the same
 * local rank on every host, an allgather among this host's ranks. Only
 * 1/local_size of the data crosses the network from each rank, and every
 * local rank drives its own share of it.
 */
static hvd_status hier_allreduce(hvd_comm *world, const void *sendbuf,
                                 void *recvbuf, size_t count, hvd_dtype dtype,
                                 hvd_op op) {
    hvd_paths *paths = world->paths;
    hvd_comm *L = paths->local, *X = paths->cross;
    hvd_op sub = op == HVD_AVERAGE ? HVD_SUM : op;
    size_t es = hvd_dtype_size(dtype), off, cnt;
    int direct = paths->model.direct, owned;
    hvd_status st;

    if (direct) {
        st = hvd_direct_begin(L, sendbuf, count * es, recvbuf, count * es);
        if (st == HVD_OK)
            st = hvd_direct_reduce_scatter(L, sendbuf, recvbuf, count, dtype,
                                           sub);
        owned = L->rank;
    } else {
        st = hvd_ring_reduce_scatter(L, sendbuf, recvbuf, count, dtype, sub);
        owned = hvd_ring_owned_segment(L);
    }
    if (st != HVD_OK)
        return st;
    hvd_part_range(count, (size_t)L->size, (size_t)owned, &off, &cnt);
    if (X != NULL && X->size > 1) {
        const hvd_choice *e = &paths->sel.t[HVD_COLL_ALLREDUCE][HVD_CLASS_CROSS]
                                           [hvd_sel_bucket(cnt * es)];
        hvd_algo algo = (hvd_algo)e->algo;
        if (algo != HVD_ALGO_RD && algo != HVD_ALGO_RABENSEIFNER)
            algo = HVD_ALGO_RING;
        void *shard = (uint8_t *)recvbuf + off * es;
        st = run_allreduce(X, algo, shard, shard, cnt, dtype, sub, e->chunk);
        if (st != HVD_OK)
            return st;
    }
    if (op == HVD_AVERAGE)
        hvd_reduce_scale_div((uint8_t *)recvbuf + off * es, cnt, dtype,
                             world->size);
    if (direct) {
        st = hvd_direct_allgather_segments(L, recvbuf, count, dtype);
        if (st == HVD_OK)
            st = hvd_direct_end(L);
        return st;
    }
    return hvd_ring_allgather_segments(L, recvbuf, count, dtype);
}

static void note(hvd_comm *comm, const hvd_plan *plan, const char *what,
                 size_t bytes) {
    comm->last_path = hvd_algo_name(plan->algo);
    comm->last_transport = hvd_plan_transport(plan);
    HVD_DEBUG("coll", "%s of %zu bytes: %s/%s, chunk %zu", what, bytes,
              comm->last_transport, comm->last_path, plan->chunk);
}

hvd_status hvd_coll_allreduce_planned(const hvd_plan *plan, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op) {
    size_t bytes = count * hvd_dtype_size(dtype);

    note(plan->base, plan, "allreduce", bytes);
    if (plan->algo == HVD_ALGO_LOCAL) {
        /* One rank: the average of one is itself. */
        hvd_comm_copy(plan->base, recvbuf, sendbuf, bytes);
        return HVD_OK;
    }
    if (plan->algo == HVD_ALGO_HIER)
        return hier_allreduce(plan->base, sendbuf, recvbuf, count, dtype, op);
    return run_allreduce(plan->comm, plan->algo, sendbuf, recvbuf, count, dtype,
                         op, plan->chunk);
}

hvd_status hvd_coll_allreduce(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype,
                              hvd_op op) {
    hvd_plan plan;

    hvd_coll_plan(comm, HVD_COLL_ALLREDUCE, count * hvd_dtype_size(dtype),
                  dtype, &plan);
    return hvd_coll_allreduce_planned(&plan, sendbuf, recvbuf, count, dtype,
                                      op);
}

hvd_status hvd_coll_broadcast_planned(const hvd_plan *plan, void *buf,
                                      size_t count, hvd_dtype dtype, int root) {
    size_t bytes = count * hvd_dtype_size(dtype);
    hvd_comm *c = plan->comm;

    note(plan->base, plan, "broadcast", bytes);
    switch (plan->algo) {
    case HVD_ALGO_LOCAL:
        return HVD_OK;
    case HVD_ALGO_NATIVE:
        return c->tp->ops->broadcast(c->tp, buf, count, dtype, root);
    case HVD_ALGO_DIRECT:
        return hvd_direct_broadcast(c, buf, bytes, root);
    case HVD_ALGO_PIPELINE:
        return hvd_chain_broadcast_chunked(c, buf, bytes, root, plan->chunk);
    default:
        return hvd_tree_broadcast(c, buf, bytes, root);
    }
}

hvd_status hvd_coll_broadcast(hvd_comm *comm, void *buf, size_t count,
                              hvd_dtype dtype, int root) {
    hvd_plan plan;

    hvd_coll_plan(comm, HVD_COLL_BROADCAST, count * hvd_dtype_size(dtype),
                  dtype, &plan);
    return hvd_coll_broadcast_planned(&plan, buf, count, dtype, root);
}

hvd_status hvd_coll_allgather_planned(const hvd_plan *plan, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype) {
    size_t bytes = count * hvd_dtype_size(dtype);
    hvd_comm *c = plan->comm;

    note(plan->base, plan, "allgather", bytes * (size_t)plan->base->size);
    if (plan->algo == HVD_ALGO_LOCAL) {
        hvd_comm_copy(plan->base, recvbuf, sendbuf, bytes);
        return HVD_OK;
    }
    if (plan->algo == HVD_ALGO_NATIVE)
        return c->tp->ops->allgather(c->tp, sendbuf, recvbuf, count, dtype);
    if (plan->algo == HVD_ALGO_DIRECT)
        return hvd_direct_allgather(c, sendbuf, recvbuf, bytes);
    return hvd_ring_allgather_chunked(c, sendbuf, recvbuf, bytes, plan->chunk);
}

hvd_status hvd_coll_allgather(hvd_comm *comm, const void *sendbuf,
                              void *recvbuf, size_t count, hvd_dtype dtype) {
    hvd_plan plan;

    hvd_coll_plan(comm, HVD_COLL_ALLGATHER,
                  count * hvd_dtype_size(dtype) * (size_t)comm->size, dtype,
                  &plan);
    return hvd_coll_allgather_planned(&plan, sendbuf, recvbuf, count, dtype);
}

/*
 * Dissemination barrier (Hensgen, Finkel and Manber): in round k every rank
 * signals rank + 2^k and waits for rank - 2^k; after ceil(log2(size))
 * rounds every rank has heard, directly or not, from every other.
 */
hvd_status hvd_coll_barrier(hvd_comm *comm) {
    int p = comm->size, r = comm->rank;
    static char none;

    /* Shared memory carries the zero-byte messages faster, where every
     * rank has it. */
    if (comm->paths != NULL && comm->paths->shm != NULL)
        comm = comm->paths->shm;
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

/* Below this many bytes the direct path's two rounds of messages (the
 * addresses, then "done reading") cost more than the copies it saves:
 * measured at np 4 on one host, small alltoalls and reduce-scatters took
 * 60-100 us direct against a few pairwise. */
#define DIRECT_MIN_BYTES (64 * 1024)

/* The plan of an allgather of bytes: reduce-scatter and alltoall move what
 * it moves, and take its transport, and its direct path where it does
 * (from DIRECT_MIN_BYTES on, unless forced). */
void hvd_coll_plan_scatter(hvd_comm *comm, size_t bytes, hvd_dtype dtype,
                           hvd_plan *plan) {
    hvd_coll_plan(comm, HVD_COLL_ALLGATHER, bytes, dtype, plan);
    if (plan->algo == HVD_ALGO_DIRECT &&
        (!hvd_comm_can_get(plan->comm) ||
         (bytes < DIRECT_MIN_BYTES &&
          comm->cfg.allreduce_algo != HVD_ALGO_DIRECT)))
        plan->algo = HVD_ALGO_RING;
}

hvd_status hvd_coll_reducescatter(hvd_comm *comm, const void *sendbuf,
                                  void *recvbuf, void *scratch, size_t count,
                                  size_t unit, hvd_dtype dtype, hvd_op op) {
    size_t es = hvd_dtype_size(dtype), off, cnt;
    hvd_plan plan;
    hvd_status st;

    hvd_coll_plan_scatter(comm, count * es, dtype, &plan);
    hvd_comm *c = plan.comm;
    int direct = plan.algo == HVD_ALGO_DIRECT;
    comm->last_path = comm->size == 1 ? "local" : direct ? "direct" : "ring";
    comm->last_transport = hvd_plan_transport(&plan);
    HVD_DEBUG("coll", "reducescatter of %zu bytes: %s/%s", count * es,
              comm->last_transport, comm->last_path);
    hvd_part_range(count / unit, (size_t)comm->size, (size_t)comm->rank, &off,
                   &cnt);
    off *= unit * es;
    cnt *= unit * es;
    if (direct) {
        /* In place, the peers still read the sendbuf this rank's block
         * would overwrite: the block waits in scratch until they are
         * done. */
        const uint8_t *s = sendbuf, *d = recvbuf;
        int overlap = d < s + count * es && s < d + cnt;
        void *block = overlap ? (uint8_t *)scratch + off : recvbuf;
        st = hvd_direct_reduce_scatter_blocks(c, sendbuf, block, count, unit,
                                              dtype, op);
        if (st == HVD_OK && overlap && cnt > 0)
            memmove(recvbuf, block, cnt);
        return st;
    }
    st = hvd_ring_reduce_scatter_blocks_chunked(c, sendbuf, scratch, count,
                                                unit, dtype, op, plan.chunk);
    if (st != HVD_OK)
        return st;
    if (cnt > 0 && (uint8_t *)scratch + off != recvbuf)
        hvd_comm_copy(comm, recvbuf, (uint8_t *)scratch + off, cnt);
    return HVD_OK;
}

/* An alltoall's part from this rank to itself. */
static void copy_own(hvd_comm *comm, const void *sendbuf,
                     const size_t *sendbytes, const size_t *sdispls,
                     void *recvbuf, const size_t *rdispls) {
    int r = comm->rank;

    if (sendbytes[r] > 0)
        hvd_comm_copy(comm, (uint8_t *)recvbuf + rdispls[r],
                      (const uint8_t *)sendbuf + sdispls[r], sendbytes[r]);
}

hvd_status hvd_coll_alltoall(hvd_comm *comm, const void *sendbuf,
                             const size_t *sendbytes, const size_t *sdispls,
                             void *recvbuf, const size_t *recvbytes,
                             const size_t *rdispls, const size_t *peer_offs,
                             size_t agreed_bytes) {
    int p = comm->size, r = comm->rank;
    hvd_plan plan;
    hvd_status st = HVD_OK;

    hvd_coll_plan_scatter(comm, agreed_bytes, HVD_UINT8, &plan);
    hvd_comm *c = plan.comm;
    int direct = plan.algo == HVD_ALGO_DIRECT;
    comm->last_path = p == 1 ? "local" : direct ? "direct" : "pairwise";
    comm->last_transport = hvd_plan_transport(&plan);
    HVD_DEBUG("coll", "alltoall of %zu bytes a rank: %s/%s", agreed_bytes,
              comm->last_transport, comm->last_path);
    /* This rank's own part: before the direct reads (the peers read the
     * sendbuf, not this copy), else while the others' parts are on their
     * way. */
    if (p == 1 || direct) {
        copy_own(comm, sendbuf, sendbytes, sdispls, recvbuf, rdispls);
        return p == 1 ? HVD_OK
                      : hvd_direct_alltoall(c, sendbuf, recvbuf, recvbytes,
                                            rdispls, peer_offs);
    }
    /* Receives first (p - 1 of them), then the sends: comm->reqs holds
     * 2 * size requests and more. */
    for (int k = 1; k < p && st == HVD_OK; k++) {
        int from = (r - k + p) % p;
        st = hvd_comm_irecv(c, from, (uint8_t *)recvbuf + rdispls[from],
                            recvbytes[from], &c->reqs[k - 1]);
    }
    for (int k = 1; k < p && st == HVD_OK; k++) {
        int to = (r + k) % p;
        st = hvd_comm_isend(c, to, (const uint8_t *)sendbuf + sdispls[to],
                            sendbytes[to], &c->reqs[p - 1 + k - 1]);
    }
    if (st != HVD_OK)
        return st;
    copy_own(comm, sendbuf, sendbytes, sdispls, recvbuf, rdispls);
    return hvd_comm_waitall(c, c->reqs, 2 * (p - 1));
}
