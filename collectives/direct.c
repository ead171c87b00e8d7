/*
 * Direct algorithms, for ranks that can read each other's memory (the shm
 * transport's one-sided get, process_vm_readv): no data message at all.
 *
 * Allreduce: every rank tells the others where its buffers are; rank r
 * reduces segment r by reading it straight out of every peer's send
 * buffer, a cache-sized chunk at a time, into its receive buffer; once
 * every rank says its segment is done, each reads the other segments
 * straight out of their owners' receive buffers into its own; a last
 * round of messages says everyone is done reading, so no buffer is
 * released while a peer may still read it. Each rank reads 2(p-1)/p of
 * the data once and reduces (p-1)/p of it: a single copy, no staging.
 *
 * The rounds of small messages are the only synchronization; they also
 * order the phases (messages between two ranks arrive in order).
 */
#include "collectives/coll.h"

#include <stdlib.h>
#include <string.h>

#include "collectives/reduce.h"
#include "transport/base/error.h"

/* Where each peer's buffers are: send, recv, and its progress counter
 * (elements of its segment reduced so far, in the pipelined allreduce). */
typedef struct addrs {
    uint64_t send;
    uint64_t recv;
    uint64_t done;
} addrs;

/*
 * comm->peer_addrs holds size + 1 entries: one per comm rank, and after
 * them this rank's own progress counter (in .send), which the peers read.
 */
static uint64_t *my_counter(hvd_comm *comm) {
    return &((addrs *)comm->peer_addrs)[comm->size].send;
}

static hvd_status peer_addrs(hvd_comm *comm, addrs **out) {
    if (comm->peer_addrs == NULL) {
        comm->peer_addrs = calloc((size_t)comm->size + 1, sizeof(addrs));
        if (comm->peer_addrs == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    *out = comm->peer_addrs;
    return HVD_OK;
}

/*
 * One round: sends mine (len bytes, may be 0) to every peer and receives
 * each peer's into all[peer] (stride len). A round is also a barrier.
 */
static hvd_status round_all(hvd_comm *comm, const void *mine, void *all,
                            size_t len) {
    int p = comm->size, r = comm->rank, n = 0;
    hvd_req *req = comm->reqs;
    hvd_status st = HVD_OK;

    for (int k = 1; k < p && st == HVD_OK; k++) {
        int from = (r - k + p) % p;
        st = hvd_comm_irecv(comm, from, (uint8_t *)all + (size_t)from * len,
                            len, &req[n++]);
    }
    for (int k = 1; k < p && st == HVD_OK; k++)
        st = hvd_comm_isend(comm, (r + k) % p, mine, len, &req[n++]);
    if (st == HVD_OK)
        st = hvd_comm_waitall(comm, req, n);
    return st;
}

static hvd_status barrier_round(hvd_comm *comm) {
    static char none;
    /* Zero-length messages: all[peer] is never written. */
    return round_all(comm, &none, &none, 0);
}

hvd_status hvd_direct_begin(hvd_comm *comm, const void *sendbuf, size_t sendlen,
                            void *recvbuf, size_t recvlen) {
    addrs mine = {(uint64_t)(uintptr_t)sendbuf, (uint64_t)(uintptr_t)recvbuf,
                  0};
    addrs *all = NULL;
    hvd_status st = peer_addrs(comm, &all);

    if (st != HVD_OK)
        return st;
    hvd_comm_expose(comm, sendbuf, sendlen);
    if (recvbuf != sendbuf)
        hvd_comm_expose(comm, recvbuf, recvlen);
    /* Reset before the round: a peer reads it only after this round's
     * message, and the last call's readers are done (its end round). */
    __atomic_store_n(my_counter(comm), 0, __ATOMIC_RELEASE);
    mine.done = (uint64_t)(uintptr_t)my_counter(comm);
    return round_all(comm, &mine, all, sizeof(mine));
}

/*
 * dst = a op b (AVERAGE also divided by p), STREAM_SUB bytes at a time:
 * each sub-block is combined into b, which is in cache, and copied to dst
 * with non-temporal stores while it is still in L1. dst is written once
 * and not read soon (a peer reads it after a round of messages, or the
 * caller after the collective), so it skips the caches and the read for
 * ownership a plain store costs: a third less memory traffic on the
 * write, and the peers' buffers stay in the cache.
 */
#define STREAM_SUB (16 * 1024)

static void combine_stream(uint8_t *dst, const uint8_t *a, uint8_t *b, size_t n,
                           hvd_dtype dtype, hvd_op op, int p) {
    size_t es = hvd_dtype_size(dtype), sub = STREAM_SUB / es;

    for (size_t i = 0; i < n; i += sub) {
        size_t m = n - i < sub ? n - i : sub;
        uint8_t *t = b + i * es;
        hvd_reduce(t, a + i * es, t, m, dtype, op);
        if (op == HVD_AVERAGE)
            hvd_reduce_scale_div(t, m, dtype, p);
        hvd_copy_stream(dst + i * es, t, m * es);
    }
}

/*
 * One chunk of n elements at byte offset at of every rank's sendbuf,
 * reduced into dst, peers in turn (not all on one at once), in the order
 * sendbuf op peer r+1 op peer r+2 ... whichever way it is written. Plain:
 * each peer's chunk is read into tmp and reduced into dst. Streamed: the
 * partial result stays in acc (cache) and only the last combine writes
 * dst, with non-temporal stores; tmp is used from the third rank on.
 */
static hvd_status reduce_chunk(hvd_comm *comm, const uint8_t *send,
                               uint8_t *dst, size_t at, size_t n,
                               hvd_dtype dtype, hvd_op op, uint8_t *acc,
                               uint8_t *tmp, int stream) {
    size_t bytes = n * hvd_dtype_size(dtype);
    int p = comm->size, r = comm->rank;
    const addrs *all = comm->peer_addrs;
    hvd_status st = HVD_OK;

    for (int k = 1; k < p && st == HVD_OK; k++) {
        int q = (r + k) % p;
        uint8_t *in = stream && k == 1 ? acc : tmp;
        st = hvd_comm_get(comm, q, in, all[q].send + at, bytes);
        if (st != HVD_OK)
            break;
        if (!stream) {
            hvd_reduce(dst, k == 1 ? send + at : dst, tmp, n, dtype, op);
        } else if (k == p - 1) {
            combine_stream(dst, k == 1 ? send + at : tmp, acc, n, dtype, op, p);
        } else {
            hvd_reduce(acc, k == 1 ? send + at : tmp, acc, n, dtype, op);
        }
    }
    if (st == HVD_OK && p == 1 && send + at != dst)
        memmove(dst, send + at, bytes);
    if (st == HVD_OK && op == HVD_AVERAGE && !(stream && p > 1))
        hvd_reduce_scale_div(dst, n, dtype, p);
    return st;
}

/*
 * Elements [off, off + cnt) of the reduction, out of every rank's sendbuf
 * (hvd_direct_begin has published them), into dst[0 .. cnt), a chunk of
 * chunk_bytes at a time; streamed (reduce_chunk) if stream and there are
 * peers.
 */
static hvd_status reduce_range(hvd_comm *comm, const void *sendbuf,
                               uint8_t *dst, size_t off, size_t cnt, int stream,
                               hvd_dtype dtype, hvd_op op, size_t chunk_bytes) {
    size_t es = hvd_dtype_size(dtype);
    size_t chunk = chunk_bytes / es;
    uint8_t *acc, *tmp;
    hvd_status st;

    stream = stream && comm->size > 1;
    if (chunk == 0)
        chunk = 1;
    if (cnt < chunk)
        chunk = cnt;
    /* Streamed, acc and tmp are two chunks; plain, tmp is the only one. */
    st = hvd_comm_scratch(comm, chunk * es * (stream ? 2 : 1) + 1,
                          (void **)&acc);
    tmp = stream ? acc + chunk * es : acc;
    for (size_t c = 0; st == HVD_OK && c < cnt; c += chunk) {
        size_t n = cnt - c < chunk ? cnt - c : chunk;
        st = reduce_chunk(comm, sendbuf, dst + c * es, (off + c) * es, n, dtype,
                          op, acc, tmp, stream);
    }
    return st;
}

/*
 * Whether a reduction whose whole buffer is bytes long writes its result
 * with non-temporal stores: from cfg.stream_min on, where that buffer and
 * the peers' cannot stay in the cache anyway.
 */
static int streamed(const hvd_comm *comm, size_t bytes) {
    return bytes >= comm->cfg.stream_min;
}

/* The reduce-scatter of the allreduce: segment rank into recvbuf. */
static hvd_status reduce_scatter(hvd_comm *comm, const void *sendbuf,
                                 void *recvbuf, size_t count, hvd_dtype dtype,
                                 hvd_op op, size_t chunk_bytes, int stream) {
    size_t es = hvd_dtype_size(dtype), off, cnt;

    hvd_part_range(count, (size_t)comm->size, (size_t)comm->rank, &off, &cnt);
    return reduce_range(comm, sendbuf, (uint8_t *)recvbuf + off * es, off, cnt,
                        stream, dtype, op, chunk_bytes);
}

/* Hier's: its segment is what the cross-host allreduce reads next, so it
 * is written the plain way, into the cache. */
hvd_status hvd_direct_reduce_scatter(hvd_comm *comm, const void *sendbuf,
                                     void *recvbuf, size_t count,
                                     hvd_dtype dtype, hvd_op op) {
    return reduce_scatter(comm, sendbuf, recvbuf, count, dtype, op,
                          comm->cfg.chunk_bytes, 0);
}

hvd_status hvd_direct_reduce_scatter_blocks(hvd_comm *comm, const void *sendbuf,
                                            void *block, size_t count,
                                            size_t unit, hvd_dtype dtype,
                                            hvd_op op) {
    size_t es = hvd_dtype_size(dtype), off, cnt;
    hvd_status st = hvd_direct_begin(comm, sendbuf, count * es, block, 0);

    hvd_part_range(count / unit, (size_t)comm->size, (size_t)comm->rank, &off,
                   &cnt);
    if (st == HVD_OK)
        st = reduce_range(comm, sendbuf, block, off * unit, cnt * unit,
                          streamed(comm, count * es), dtype, op,
                          comm->cfg.chunk_bytes);
    /* Nobody leaves while a peer may still read its sendbuf. */
    if (st == HVD_OK)
        st = hvd_direct_end(comm);
    return st;
}

hvd_status hvd_direct_alltoall(hvd_comm *comm, const void *sendbuf,
                               void *recvbuf, const size_t *recvbytes,
                               const size_t *rdispls, const size_t *peer_offs) {
    int p = comm->size, r = comm->rank;
    const addrs *all;
    /* Its length is not known here (what each peer reads is): left as it
     * is. */
    hvd_status st = hvd_direct_begin(comm, sendbuf, 0, recvbuf, 0);

    all = comm->peer_addrs;
    for (int k = 1; k < p && st == HVD_OK; k++) {
        int q = (r + k) % p; /* peers in turn: not all on one at once */
        if (recvbytes[q] > 0)
            st = hvd_comm_get(comm, q, (uint8_t *)recvbuf + rdispls[q],
                              all[q].send + peer_offs[q], recvbytes[q]);
    }
    if (st == HVD_OK)
        st = hvd_direct_end(comm);
    return st;
}

hvd_status hvd_direct_allgather_segments(hvd_comm *comm, void *recvbuf,
                                         size_t count, hvd_dtype dtype) {
    size_t es = hvd_dtype_size(dtype);
    int p = comm->size, r = comm->rank;
    const addrs *all = comm->peer_addrs;
    hvd_status st = barrier_round(comm); /* every segment is done */

    for (int k = 1; k < p && st == HVD_OK; k++) {
        int q = (r + k) % p;
        size_t off, cnt;
        hvd_part_range(count, (size_t)p, (size_t)q, &off, &cnt);
        if (cnt > 0)
            st = hvd_comm_get(comm, q, (uint8_t *)recvbuf + off * es,
                              all[q].recv + off * es, cnt * es);
    }
    return st;
}

hvd_status hvd_direct_end(hvd_comm *comm) { return barrier_round(comm); }

/*
 * Copies into recvbuf what peer q has reduced of its segment (elements
 * [off, off + cnt) of the whole) beyond the *copied elements this rank has
 * already: all of it if final (after a round that says it is done), else
 * what q's progress counter says, if that is at least min elements more.
 */
static hvd_status copy_ready(hvd_comm *comm, int q, uint8_t *recvbuf,
                             size_t off, size_t cnt, size_t es, size_t *copied,
                             size_t min, int final) {
    const addrs *all = comm->peer_addrs;
    uint64_t done = cnt;
    hvd_status st = HVD_OK;

    if (!final) {
        st = hvd_comm_get(comm, q, &done, all[q].done, sizeof(done));
        /* The counter is written after the data it counts (release). */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (done > cnt)
            done = cnt;
    }
    if (st == HVD_OK && done > *copied && (final || done - *copied >= min)) {
        size_t at = (off + *copied) * es;
        st = hvd_comm_get(comm, q, recvbuf + at, all[q].recv + at,
                          (done - *copied) * es);
        if (st == HVD_OK)
            *copied = done;
    }
    return st;
}

/*
 * The allreduce of two ranks, pipelined: after each chunk of its own
 * segment a rank publishes how far it is (its progress counter) and
 * copies whatever the peer has finished of the other segment since,
 * while that is still in the cache the peer wrote it into, instead of
 * re-reading all of it from memory after a round. What is left is copied
 * after the round that says both segments are done.
 */
static hvd_status allreduce_pipelined(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op,
                                      size_t chunk) {
    size_t es = hvd_dtype_size(dtype), off, cnt, qoff, qcnt, copied = 0;
    int q = 1 - comm->rank;
    uint8_t *tmp, *recv = recvbuf;
    hvd_status st =
        hvd_direct_begin(comm, sendbuf, count * es, recvbuf, count * es);

    chunk /= es;
    if (chunk == 0)
        chunk = 1;
    hvd_part_range(count, 2, (size_t)comm->rank, &off, &cnt);
    hvd_part_range(count, 2, (size_t)q, &qoff, &qcnt);
    if (st == HVD_OK)
        st = hvd_comm_scratch(comm, (cnt < chunk ? cnt : chunk) * es + 1,
                              (void **)&tmp);
    for (size_t c = 0; st == HVD_OK && c < cnt; c += chunk) {
        size_t n = cnt - c < chunk ? cnt - c : chunk;
        st = reduce_chunk(comm, sendbuf, recv + (off + c) * es, (off + c) * es,
                          n, dtype, op, tmp, tmp, 0);
        if (st != HVD_OK)
            break;
        __atomic_store_n(my_counter(comm), (uint64_t)(c + n), __ATOMIC_RELEASE);
        st = copy_ready(comm, q, recv, qoff, qcnt, es, &copied, chunk, 0);
    }
    if (st == HVD_OK)
        st = barrier_round(comm); /* both segments are done */
    if (st == HVD_OK)
        st = copy_ready(comm, q, recv, qoff, qcnt, es, &copied, 0, 1);
    if (st == HVD_OK)
        st = hvd_direct_end(comm);
    return st;
}

hvd_status hvd_direct_allreduce_chunked(hvd_comm *comm, const void *sendbuf,
                                        void *recvbuf, size_t count,
                                        hvd_dtype dtype, hvd_op op,
                                        size_t chunk) {
    hvd_status st;

    if (comm->size == 2 && count * hvd_dtype_size(dtype) >= comm->cfg.pipe_min)
        return allreduce_pipelined(comm, sendbuf, recvbuf, count, dtype, op,
                                   chunk);
    st = hvd_direct_begin(comm, sendbuf, count * hvd_dtype_size(dtype), recvbuf,
                          count * hvd_dtype_size(dtype));
    if (st == HVD_OK)
        st = reduce_scatter(comm, sendbuf, recvbuf, count, dtype, op, chunk,
                            streamed(comm, count * hvd_dtype_size(dtype)));
    if (st == HVD_OK)
        st = hvd_direct_allgather_segments(comm, recvbuf, count, dtype);
    if (st == HVD_OK)
        st = hvd_direct_end(comm);
    return st;
}

hvd_status hvd_direct_allreduce(hvd_comm *comm, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype,
                                hvd_op op) {
    return hvd_direct_allreduce_chunked(comm, sendbuf, recvbuf, count, dtype,
                                        op, comm->cfg.chunk_bytes);
}

hvd_status hvd_direct_allgather(hvd_comm *comm, const void *sendbuf,
                                void *recvbuf, size_t bytes) {
    int p = comm->size, r = comm->rank;
    uint8_t *base = recvbuf, *mine = base + (size_t)r * bytes;
    const uint8_t *src = sendbuf;
    addrs *all = NULL;
    hvd_status st;

    /* The peers read the block where the caller put it, and the local
     * copy runs after the round, beside their reads: lines this rank has
     * only read come out of its cache faster than lines it has just
     * written (docs/benchmarks.md, "Issue 35: the allgather's block").
     * A sendbuf that overlaps recvbuf elsewhere than at its block would
     * be overwritten while read: it is moved first, as is a lone rank's. */
    if (bytes > 0 && src != mine &&
        (p == 1 || ((uintptr_t)src < (uintptr_t)base + (size_t)p * bytes &&
                    (uintptr_t)src + bytes > (uintptr_t)base))) {
        memmove(mine, src, bytes);
        src = mine;
    }
    if (p == 1)
        return HVD_OK;
    addrs where = {(uint64_t)(uintptr_t)src, 0, 0};
    st = peer_addrs(comm, &all);
    if (st == HVD_OK)
        hvd_comm_expose(comm, src, bytes);
    if (st == HVD_OK)
        st = round_all(comm, &where, all, sizeof(where));
    if (st == HVD_OK && src != mine && bytes > 0)
        memmove(mine, src, bytes);
    for (int k = 1; k < p && st == HVD_OK; k++) {
        int q = (r + k) % p;
        if (bytes > 0)
            st = hvd_comm_get(comm, q, (uint8_t *)recvbuf + (size_t)q * bytes,
                              all[q].send, bytes);
    }
    if (st == HVD_OK)
        st = barrier_round(comm);
    return st;
}

hvd_status hvd_direct_broadcast(hvd_comm *comm, void *buf, size_t bytes,
                                int root) {
    int p = comm->size, r = comm->rank, n = 0;
    hvd_req *req = comm->reqs;
    uint64_t where = (uint64_t)(uintptr_t)buf;
    hvd_status st = HVD_OK;
    static char none;

    if (p == 1)
        return HVD_OK;
    if (r == root) {
        hvd_comm_expose(comm, buf, bytes);
        /* Tell everyone where the data is; wait until all have read it. */
        for (int q = 0; q < p && st == HVD_OK; q++)
            if (q != root)
                st = hvd_comm_irecv(comm, q, &none, 0, &req[n++]);
        for (int q = 0; q < p && st == HVD_OK; q++)
            if (q != root)
                st = hvd_comm_isend(comm, q, &where, sizeof(where), &req[n++]);
        return st == HVD_OK ? hvd_comm_waitall(comm, req, n) : st;
    }
    st = hvd_comm_irecv(comm, root, &where, sizeof(where), &req[0]);
    if (st == HVD_OK)
        st = hvd_comm_wait(comm, &req[0]);
    if (st == HVD_OK && bytes > 0)
        st = hvd_comm_get(comm, root, buf, where, bytes);
    if (st == HVD_OK)
        st = hvd_comm_isend(comm, root, &none, 0, &req[0]);
    if (st == HVD_OK)
        st = hvd_comm_wait(comm, &req[0]);
    return st;
}
