/*
 * The collectives. Each entry point picks an algorithm (collectives/select.c)
 * unless one is forced, and runs it over comm's transport. See comm.h for
 * the contract they share.
 */
#ifndef HVD_COLLECTIVES_COLL_H
#define HVD_COLLECTIVES_COLL_H

#include "collectives/comm.h"
#include "collectives/select.h"

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

/*
 * Reduce-scatter: count elements (a multiple of unit) from every rank are
 * reduced, and this rank gets its block (hvd_ring_reduce_scatter_blocks's
 * split: the first (count / unit) % size ranks one unit more) in recvbuf.
 * Direct (hvd_direct_reduce_scatter_blocks) where the selector takes it
 * for an allgather of the size, else the ring; scratch holds count
 * elements (the ring's working space; it may be sendbuf's memory only if
 * sendbuf may be overwritten).
 */
hvd_status hvd_coll_reducescatter(hvd_comm *comm, const void *sendbuf,
                                  void *recvbuf, void *scratch, size_t count,
                                  size_t unit, hvd_dtype dtype, hvd_op op);

/*
 * Alltoall: this rank sends sendbytes[d] bytes from sendbuf + sdispls[d]
 * to every rank d and receives recvbytes[s] bytes from every rank s into
 * recvbuf + rdispls[s] (size entries each; every pair agrees on its
 * lengths); peer_offs[s] is where this rank's part starts in rank s's
 * sendbuf. Where the peers' memory can be read and the selector takes
 * the direct path for an allgather of the size, each rank reads its parts
 * out of the peers' sendbufs (hvd_direct_alltoall); else pairwise
 * exchange: every receive posted, then the sends in the order rank + 1,
 * rank + 2, ..., so that no two ranks send to the same peer first. This
 * rank's own part is a copy. The path is chosen by agreed_bytes, which
 * every rank must pass the same (what ranks send differs: each deciding
 * by its own would let two ranks take different paths).
 */
hvd_status hvd_coll_alltoall(hvd_comm *comm, const void *sendbuf,
                             const size_t *sendbytes, const size_t *sdispls,
                             void *recvbuf, const size_t *recvbytes,
                             const size_t *rdispls, const size_t *peer_offs,
                             size_t agreed_bytes);

/* How a collective of bytes will run on comm (base): which communicator
 * (base itself, or one of its paths), algorithm (LOCAL: one rank, nothing
 * to send) and chunk (the pipeline unit of the ring and chain algorithms,
 * passed to them). Computed once per collective (hvd_coll_plan) and
 * carried to it (hvd_coll_*_planned), so that what a timeline shows is
 * what runs. */
typedef struct hvd_plan {
    hvd_comm *base;
    hvd_comm *comm;
    hvd_algo algo;
    size_t chunk;
} hvd_plan;

void hvd_coll_plan(hvd_comm *comm, hvd_coll_kind kind, size_t bytes,
                   hvd_dtype dtype, hvd_plan *out);
/* The plan of a reduce-scatter or alltoall of bytes: the transport of an
 * allgather of that size, and its direct path from 64 KiB on (algo DIRECT;
 * else RING, which for an alltoall means pairwise). */
void hvd_coll_plan_scatter(hvd_comm *comm, size_t bytes, hvd_dtype dtype,
                           hvd_plan *plan);

/* The collectives above, run as plan says (plan made by hvd_coll_plan
 * for their kind and bytes: count elements; an allgather's size times
 * over). */
hvd_status hvd_coll_allreduce_planned(const hvd_plan *plan, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op);
hvd_status hvd_coll_broadcast_planned(const hvd_plan *plan, void *buf,
                                      size_t count, hvd_dtype dtype, int root);
hvd_status hvd_coll_allgather_planned(const hvd_plan *plan, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype);
/* "tcp", "shm", "mpi", "shm+tcp" (hier) or "local". */
const char *hvd_plan_transport(const hvd_plan *plan);

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
hvd_status hvd_rabenseifner_allreduce(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op);
/* The ring and chain algorithms (and the direct allreduce, whose chunks
 * are what it reduces at a time) with their chunk in bytes given, as a
 * plan gives it; the forms without _chunked take comm->cfg.chunk_bytes. */
hvd_status hvd_ring_allreduce_chunked(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op, size_t chunk);
hvd_status hvd_chain_broadcast_chunked(hvd_comm *comm, void *buf, size_t bytes,
                                       int root, size_t chunk);
hvd_status hvd_ring_allgather_chunked(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t bytes,
                                      size_t chunk);
hvd_status hvd_ring_reduce_scatter_blocks_chunked(hvd_comm *comm,
                                                  const void *sendbuf,
                                                  void *scratch, size_t count,
                                                  size_t unit, hvd_dtype dtype,
                                                  hvd_op op, size_t chunk);
hvd_status hvd_direct_allreduce_chunked(hvd_comm *comm, const void *sendbuf,
                                        void *recvbuf, size_t count,
                                        hvd_dtype dtype, hvd_op op,
                                        size_t chunk);

/*
 * The fold around an allreduce over a group of a size p that is not a
 * power of two (rd, Rabenseifner): with rem = p - (the largest power of
 * two <= p), the even rank of each of the first rem pairs hands its count
 * elements of buf to the odd one (which reduces them into its own, using
 * tmp) and sits out. *newrank_out is the rank in the power-of-two group,
 * -1 for one that sits out. After the group's allreduce, hvd_unfold gives
 * those that sat out the result.
 */
hvd_status hvd_fold(hvd_comm *comm, void *buf, void *tmp, size_t count,
                    hvd_dtype dtype, hvd_op op, int rem, int *newrank_out);
hvd_status hvd_unfold(hvd_comm *comm, void *buf, size_t bytes, int rem);

/*
 * The ring's two phases alone. After hvd_ring_reduce_scatter, segment
 * hvd_ring_owned_segment (of size parts, hvd_part_range) of recvbuf holds
 * the reduced result (AVERAGE divided by size); the rest of recvbuf is
 * scratch. hvd_ring_allgather_segments then gives every rank every
 * segment from its owner.
 */
hvd_status hvd_ring_reduce_scatter(hvd_comm *comm, const void *sendbuf,
                                   void *recvbuf, size_t count, hvd_dtype dtype,
                                   hvd_op op);
int hvd_ring_owned_segment(const hvd_comm *comm);
/*
 * A reduce-scatter of count elements cut into size blocks of whole units
 * (unit elements each; count a multiple of unit), block b of
 * hvd_part_range(count / unit, size, b) units: afterwards block rank of
 * scratch (count elements) holds the reduction (AVERAGE divided by
 * size); the rest of scratch is overwritten.
 */
hvd_status hvd_ring_reduce_scatter_blocks(hvd_comm *comm, const void *sendbuf,
                                          void *scratch, size_t count,
                                          size_t unit, hvd_dtype dtype,
                                          hvd_op op);
hvd_status hvd_ring_allgather_segments(hvd_comm *comm, void *buf, size_t count,
                                       hvd_dtype dtype);

/*
 * Direct algorithms (direct.c): every peer readable with hvd_comm_get
 * (hvd_comm_can_get). The phases of the allreduce, for hier: begin
 * publishes the buffers (and exposes sendlen and recvlen bytes of them,
 * hvd_comm_expose; 0: not known); reduce_scatter leaves segment rank
 * (hvd_part_range of size parts) reduced in recvbuf; allgather_segments reads
 * the others' segments once each owner's is done; end waits until every peer is
 * done reading this rank's buffers.
 */
hvd_status hvd_direct_allreduce(hvd_comm *comm, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype,
                                hvd_op op);
hvd_status hvd_direct_begin(hvd_comm *comm, const void *sendbuf, size_t sendlen,
                            void *recvbuf, size_t recvlen);
hvd_status hvd_direct_reduce_scatter(hvd_comm *comm, const void *sendbuf,
                                     void *recvbuf, size_t count,
                                     hvd_dtype dtype, hvd_op op);
hvd_status hvd_direct_allgather_segments(hvd_comm *comm, void *recvbuf,
                                         size_t count, hvd_dtype dtype);
hvd_status hvd_direct_end(hvd_comm *comm);
/* A reduce-scatter of whole units (as hvd_ring_reduce_scatter_blocks)
 * that writes this rank's block straight into block, reading the peers'
 * sendbufs; the other alltoall's part, read out of each peer's sendbuf at
 * peer_offs[q] (this rank's place there). Both begin and end themselves. */
hvd_status hvd_direct_reduce_scatter_blocks(hvd_comm *comm, const void *sendbuf,
                                            void *block, size_t count,
                                            size_t unit, hvd_dtype dtype,
                                            hvd_op op);
hvd_status hvd_direct_alltoall(hvd_comm *comm, const void *sendbuf,
                               void *recvbuf, const size_t *recvbytes,
                               const size_t *rdispls, const size_t *peer_offs);
hvd_status hvd_direct_allgather(hvd_comm *comm, const void *sendbuf,
                                void *recvbuf, size_t bytes);
hvd_status hvd_direct_broadcast(hvd_comm *comm, void *buf, size_t bytes,
                                int root);

/*
 * Adasum (adasum.c): the allreduce that combines gradients by adaptive
 * summation instead of adding them, as Horovod's CPU Adasum; count
 * elements of float16, float32 or float64 on a power-of-two number of
 * ranks (hvd_adasum_supports), sendbuf == recvbuf allowed.
 */
int hvd_adasum_supports(int size, hvd_dtype dtype);
hvd_status hvd_adasum_allreduce(hvd_comm *comm, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype);

/* Which algorithm the selector takes for this call (never UNFORCED or
 * LOCAL). */
hvd_algo hvd_select_allreduce(const hvd_comm *comm, size_t bytes);
hvd_algo hvd_select_broadcast(const hvd_comm *comm, size_t bytes);

#endif
