/*
 * hvd: data-parallel collectives for deep-learning training.
 *
 * A trainer calls hvd_init() once per process, then hvd_allreduce() (and
 * friends) on its gradients, then hvd_shutdown(). Processes are started by
 * hvdrun, mpirun, srun or any launcher that sets the variables described in
 * docs/environment.md.
 *
 * Every function that can fail returns an hvd_status; hvd_last_error() then
 * gives a sentence on what failed, on which rank, with which peer, and what
 * to do. The library never calls exit() or abort().
 */
#ifndef HVD_HVD_H
#define HVD_HVD_H

#include <stddef.h>
#include <stdint.h>

/* hvd_status (and its table HVD_STATUS_MAP), hvd_dtype, hvd_dtype_size(),
 * hvd_op and HVD_EXPORT. */
#include <hvd/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HVD_VERSION_MAJOR 0
#define HVD_VERSION_MINOR 1
#define HVD_VERSION_PATCH 0
#define HVD_VERSION_STRING "0.1.0"

/** An operation in flight, returned by the _async forms. */
typedef struct hvd_request *hvd_handle;

/**
 * Joins the job: discovers rank and size from the launcher's variables,
 * authenticates with every peer and connects the transport.
 * Calling it again after success is a no-op that returns HVD_OK.
 */
HVD_EXPORT hvd_status hvd_init(void);

/**
 * Leaves the job: tells every peer, waits (bounded) for them to do the same
 * and frees everything. After it, hvd_init() may be called again.
 */
HVD_EXPORT hvd_status hvd_shutdown(void);

/** @return 1 once hvd_init() has succeeded and until hvd_shutdown(). */
HVD_EXPORT int hvd_initialized(void);

HVD_EXPORT int hvd_rank(void); /**< -1 before init */
HVD_EXPORT int hvd_size(void); /**< -1 before init */
HVD_EXPORT int hvd_local_rank(void);
HVD_EXPORT int hvd_local_size(void);
HVD_EXPORT int hvd_cross_rank(void); /**< index of this host */
HVD_EXPORT int hvd_cross_size(void); /**< number of hosts */

/** @return a constant description of a status, never NULL. */
HVD_EXPORT const char *hvd_strerror(hvd_status status);

/** @return the detail of this thread's last failure ("" if none). The
 *  string stays valid until this thread's next hvd call. */
HVD_EXPORT const char *hvd_last_error(void);

/*
 * Collectives are matched across ranks by name: every rank submits an
 * operation of the same name (from any thread, in any order), and it runs
 * once all have. Names must be unique among the operations in flight on a
 * rank (a duplicate is HVD_ERR_INVALID_ARG). A NULL name is allowed: the
 * k-th unnamed operation of a kind matches the k-th on every rank.
 * Ranks must agree on kind, dtype, count, op and root; if they do not,
 * every rank gets HVD_ERR_MISMATCH and a sentence with each rank's values.
 *
 * The blocking forms are submit + wait. sendbuf == recvbuf means in place.
 * count may be 0.
 *
 * Buffers are host memory or CUDA device memory on this rank's GPU
 * (HVD_GPU_DEVICE, else the local rank), all of one operation the same
 * kind, and the same kind on every rank for a name; device memory must
 * hold its data when the call is made (docs/gpu.md). A build without CUDA
 * refuses device memory with HVD_ERR_UNSUPPORTED.
 */

/**
 * Reduces count elements across all ranks; every rank gets the same result.
 * @param [in]  name    names the operation in messages (may be NULL).
 * @param [in]  sendbuf count elements of dtype.
 * @param [out] recvbuf count elements; may equal sendbuf.
 */
HVD_EXPORT hvd_status hvd_allreduce(const char *name, const void *sendbuf,
                                    void *recvbuf, size_t count,
                                    hvd_dtype dtype, hvd_op op);

/**
 * Copies count elements from rank root to every rank.
 * @param [in,out] buf  root's input; every other rank's output.
 */
HVD_EXPORT hvd_status hvd_broadcast(const char *name, void *buf, size_t count,
                                    hvd_dtype dtype, int root);

/**
 * Each rank contributes count elements; recvbuf gets size*count elements in
 * rank order. In place either way: sendbuf == recvbuf + rank*count elements
 * (the input is already in its block, as with MPI_IN_PLACE), or
 * sendbuf == recvbuf (the input is at the start and is moved to its block).
 */
HVD_EXPORT hvd_status hvd_allgather(const char *name, const void *sendbuf,
                                    void *recvbuf, size_t count,
                                    hvd_dtype dtype);

/** Returns once every rank has entered it. */
HVD_EXPORT hvd_status hvd_barrier(void);

/**
 * Reduces n buffers as one operation: one name, negotiated once, reduced in
 * one collective (fused whatever HVD_FUSION_THRESHOLD says). Buffer i has
 * counts[i] elements; sendbufs[i] == recvbufs[i] means in place. The three
 * arrays are read during the call only.
 */
HVD_EXPORT hvd_status hvd_grouped_allreduce(const char *name, int n,
                                            const void *const *sendbufs,
                                            void *const *recvbufs,
                                            const size_t *counts,
                                            hvd_dtype dtype, hvd_op op);

/**
 * Every rank sends a part of sendbuf to every rank, as MPI_Alltoallv:
 * sendbuf holds count elements, in rank order, sendcounts[r] of them for
 * rank r (size entries summing to at most count; NULL: count / size to
 * each, count then a multiple of size). Each rank receives, in rank order,
 * what every rank sent it, into recvbuf, which holds recvcap elements;
 * recvcounts_out[r] (size entries, may be NULL) gets how many came from
 * rank r. The counts are exchanged with the operation: a receiver need not
 * know them beforehand, only bound them. A rank whose recvbuf is too small
 * fails with HVD_ERR_INVALID_ARG saying how much arrived; the others
 * complete. Zero counts are fine. Ranks must agree on the dtype and the
 * memory (host or GPU); alltoall refuses GPU memory for now
 * (HVD_ERR_UNSUPPORTED), and fails while a rank is joined, as in Horovod.
 */
HVD_EXPORT hvd_status hvd_alltoall(const char *name, const void *sendbuf,
                                   size_t count, const size_t *sendcounts,
                                   void *recvbuf, size_t recvcap,
                                   size_t *recvcounts_out, hvd_dtype dtype);

/**
 * Reduces count elements across ranks and scatters the result: the count
 * elements are cut into size blocks in rank order, block r of
 * hvd_reducescatter_count(count, size, r) elements (count / size, one more
 * for the first count % size ranks, as Horovod splits rows), and recvbuf
 * gets this rank's reduced block. Every op; HVD_AVERAGE divides by size.
 * sendbuf == recvbuf is allowed (recvbuf then needs count elements).
 */
HVD_EXPORT hvd_status hvd_reducescatter(const char *name, const void *sendbuf,
                                        void *recvbuf, size_t count,
                                        hvd_dtype dtype, hvd_op op);

/** The elements rank r of size gets from a reduce-scatter of count. */
HVD_EXPORT size_t hvd_reducescatter_count(size_t count, int size, int r);

/**
 * n allgathers, or n reduce-scatters, as one operation (one name,
 * negotiated once, as hvd_grouped_allreduce): buffer i has counts[i]
 * elements on every rank; an allgather's recvbufs[i] gets size * counts[i]
 * of them (rank order), a reduce-scatter's recvbufs[i] this rank's block
 * of counts[i] (hvd_reducescatter_count). Host memory only for now.
 */
HVD_EXPORT hvd_status hvd_grouped_allgather(const char *name, int n,
                                            const void *const *sendbufs,
                                            void *const *recvbufs,
                                            const size_t *counts,
                                            hvd_dtype dtype);
HVD_EXPORT hvd_status hvd_grouped_allgather_async(
    const char *name, int n, const void *const *sendbufs, void *const *recvbufs,
    const size_t *counts, hvd_dtype dtype, hvd_handle *out);
HVD_EXPORT hvd_status hvd_grouped_reducescatter(const char *name, int n,
                                                const void *const *sendbufs,
                                                void *const *recvbufs,
                                                const size_t *counts,
                                                hvd_dtype dtype, hvd_op op);
HVD_EXPORT hvd_status hvd_grouped_reducescatter_async(
    const char *name, int n, const void *const *sendbufs, void *const *recvbufs,
    const size_t *counts, hvd_dtype dtype, hvd_op op, hvd_handle *out);

/**
 * For a rank that has run out of data: while it is joined, the other
 * ranks' allreduces complete without it, as if it had contributed the
 * neutral element (0 for sum and average, 1 for product, the largest or
 * smallest value for min and max); an average still divides by the job's
 * size, as in Horovod (the joined rank counts as a zero). Broadcasts,
 * allgathers, alltoalls and reducescatters cannot complete without a rank
 * and fail with HVD_ERR_INVALID_ARG while one is joined.
 * Returns once every rank has called hvd_join.
 * @param [out] last_rank_out the last rank to join (may be NULL).
 */
HVD_EXPORT hvd_status hvd_join(int *last_rank_out);

/*
 * Asynchronous forms: return at once; buffers stay the caller's and must
 * not be touched until hvd_wait (or a successful hvd_test) reports done.
 * hvd_wait releases the handle.
 */
HVD_EXPORT hvd_status hvd_allreduce_async(const char *name, const void *sendbuf,
                                          void *recvbuf, size_t count,
                                          hvd_dtype dtype, hvd_op op,
                                          hvd_handle *out);
HVD_EXPORT hvd_status hvd_broadcast_async(const char *name, void *buf,
                                          size_t count, hvd_dtype dtype,
                                          int root, hvd_handle *out);
HVD_EXPORT hvd_status hvd_allgather_async(const char *name, const void *sendbuf,
                                          void *recvbuf, size_t count,
                                          hvd_dtype dtype, hvd_handle *out);
HVD_EXPORT hvd_status hvd_grouped_allreduce_async(
    const char *name, int n, const void *const *sendbufs, void *const *recvbufs,
    const size_t *counts, hvd_dtype dtype, hvd_op op, hvd_handle *out);
/* sendcounts is read during the call; recvcounts_out is written when the
 * operation is done. */
HVD_EXPORT hvd_status hvd_alltoall_async(const char *name, const void *sendbuf,
                                         size_t count, const size_t *sendcounts,
                                         void *recvbuf, size_t recvcap,
                                         size_t *recvcounts_out,
                                         hvd_dtype dtype, hvd_handle *out);
HVD_EXPORT hvd_status hvd_reducescatter_async(const char *name,
                                              const void *sendbuf,
                                              void *recvbuf, size_t count,
                                              hvd_dtype dtype, hvd_op op,
                                              hvd_handle *out);

/**
 * A reduce-scatter of a tensor of a shape (ndim >= 1 dimensions): its
 * first dimension is cut (rank r gets hvd_reducescatter_count(shape[0],
 * size, r) rows of the product of the other dimensions), and ranks must
 * agree on the whole shape.
 */
HVD_EXPORT hvd_status hvd_reducescatter_shaped_async(
    const char *name, const void *sendbuf, void *recvbuf, int ndim,
    const int64_t *shape, hvd_dtype dtype, hvd_op op, hvd_handle *out);

/**
 * hvd_allreduce_async and hvd_broadcast_async for a tensor of a shape
 * (ndim dimensions; the count is their product, ndim 0 a scalar): ranks
 * must then agree on the shape too, as Horovod's frameworks require, so a
 * rank passing [2, 3] where another passes [3, 2] gets HVD_ERR_MISMATCH
 * (`rank 0: allreduce float32 sum shape [2, 3]; rank 1: ... shape [3, 2]`)
 * instead of a result. Shapes of one dimension (or none) compare as their
 * count; up to 8 dimensions are compared in full, dimensions beyond the
 * eighth by their product. A rank that passes a shape and one that passes
 * only a count do not agree when the shape has two or more dimensions.
 */
HVD_EXPORT hvd_status hvd_allreduce_shaped_async(
    const char *name, const void *sendbuf, void *recvbuf, int ndim,
    const int64_t *shape, hvd_dtype dtype, hvd_op op, hvd_handle *out);
HVD_EXPORT hvd_status hvd_broadcast_shaped_async(const char *name, void *buf,
                                                 int ndim, const int64_t *shape,
                                                 hvd_dtype dtype, int root,
                                                 hvd_handle *out);

/**
 * The blocking forms of the three shaped calls above: the calling thread
 * may run the engine while it waits, as hvd_allreduce's does (the
 * synchronous calls of the Python packages use them, so that a tensor of
 * two or more dimensions is checked by its shape without a handle).
 */
HVD_EXPORT hvd_status hvd_allreduce_shaped(const char *name,
                                           const void *sendbuf, void *recvbuf,
                                           int ndim, const int64_t *shape,
                                           hvd_dtype dtype, hvd_op op);
HVD_EXPORT hvd_status hvd_broadcast_shaped(const char *name, void *buf,
                                           int ndim, const int64_t *shape,
                                           hvd_dtype dtype, int root);
HVD_EXPORT hvd_status hvd_reducescatter_shaped(const char *name,
                                               const void *sendbuf,
                                               void *recvbuf, int ndim,
                                               const int64_t *shape,
                                               hvd_dtype dtype, hvd_op op);

/* ---- Process sets ------------------------------------------------------ */

/**
 * A process set is a group of the job's ranks whose collectives run among
 * them alone (model parallelism, pipeline stages, evaluation on a subset),
 * as Horovod's process sets. Set 0 is the whole job; hvd_process_set_create
 * gives each new set the next id (ids are not reused).
 *
 * Creating and removing a set is itself a collective of the whole job:
 * every rank calls it, in the same order, with the same ranks (in any
 * order, each once). A second set of the same ranks, a set of no ranks or
 * of a rank outside the job is refused with a sentence. Removing a set
 * fails the operations still waiting in it.
 *
 * Every collective has a form in a set: hvd_ps_<call>(ps, <the arguments of
 * hvd_<call>>). Only the set's members call it; names are the set's own (an
 * operation "g" in set 1 and one "g" in set 2 are two operations); a
 * broadcast's root is a rank of the job that is a member of the set (as in
 * Horovod); an alltoall's sendcounts and recvcounts_out have one entry per
 * member, in rank order; a reduce-scatter cuts its rows among the members;
 * an average divides by the set's size. Each set negotiates, fuses and
 * caches its own operations, and the collectives of disjoint sets run at
 * the same time. GPU memory is supported in set 0 only for now. A set's
 * collective fails with HVD_ERR_INVALID_ARG while a member is joined
 * (hvd_join is the job's).
 */
HVD_EXPORT hvd_status hvd_process_set_create(const int *ranks, int n,
                                             int *id_out);
HVD_EXPORT hvd_status hvd_process_set_remove(int id);
/** Members of set id, or -1 if there is none. */
HVD_EXPORT int hvd_process_set_size(int id);
/** This rank's place in set id (0 .. size-1), or -1 if it is not a member
 * or there is no such set. */
HVD_EXPORT int hvd_process_set_rank(int id);
/** Writes the first cap ranks of set id (ascending) to ranks; returns its
 * size, or -1 if there is no such set. */
HVD_EXPORT int hvd_process_set_ranks(int id, int *ranks, int cap);

HVD_EXPORT hvd_status hvd_ps_allreduce(int ps, const char *name,
                                       const void *sendbuf, void *recvbuf,
                                       size_t count, hvd_dtype dtype,
                                       hvd_op op);
HVD_EXPORT hvd_status hvd_ps_allreduce_async(int ps, const char *name,
                                             const void *sendbuf, void *recvbuf,
                                             size_t count, hvd_dtype dtype,
                                             hvd_op op, hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_allreduce_shaped_async(
    int ps, const char *name, const void *sendbuf, void *recvbuf, int ndim,
    const int64_t *shape, hvd_dtype dtype, hvd_op op, hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_allreduce_shaped(int ps, const char *name,
                                              const void *sendbuf,
                                              void *recvbuf, int ndim,
                                              const int64_t *shape,
                                              hvd_dtype dtype, hvd_op op);
HVD_EXPORT hvd_status hvd_ps_grouped_allreduce(int ps, const char *name, int n,
                                               const void *const *sendbufs,
                                               void *const *recvbufs,
                                               const size_t *counts,
                                               hvd_dtype dtype, hvd_op op);
HVD_EXPORT hvd_status hvd_ps_grouped_allreduce_async(
    int ps, const char *name, int n, const void *const *sendbufs,
    void *const *recvbufs, const size_t *counts, hvd_dtype dtype, hvd_op op,
    hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_grouped_allgather(int ps, const char *name, int n,
                                               const void *const *sendbufs,
                                               void *const *recvbufs,
                                               const size_t *counts,
                                               hvd_dtype dtype);
HVD_EXPORT hvd_status hvd_ps_grouped_allgather_async(
    int ps, const char *name, int n, const void *const *sendbufs,
    void *const *recvbufs, const size_t *counts, hvd_dtype dtype,
    hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_grouped_reducescatter(
    int ps, const char *name, int n, const void *const *sendbufs,
    void *const *recvbufs, const size_t *counts, hvd_dtype dtype, hvd_op op);
HVD_EXPORT hvd_status hvd_ps_grouped_reducescatter_async(
    int ps, const char *name, int n, const void *const *sendbufs,
    void *const *recvbufs, const size_t *counts, hvd_dtype dtype, hvd_op op,
    hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_broadcast(int ps, const char *name, void *buf,
                                       size_t count, hvd_dtype dtype, int root);
HVD_EXPORT hvd_status hvd_ps_broadcast_async(int ps, const char *name,
                                             void *buf, size_t count,
                                             hvd_dtype dtype, int root,
                                             hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_broadcast_shaped_async(int ps, const char *name,
                                                    void *buf, int ndim,
                                                    const int64_t *shape,
                                                    hvd_dtype dtype, int root,
                                                    hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_broadcast_shaped(int ps, const char *name,
                                              void *buf, int ndim,
                                              const int64_t *shape,
                                              hvd_dtype dtype, int root);
HVD_EXPORT hvd_status hvd_ps_allgather(int ps, const char *name,
                                       const void *sendbuf, void *recvbuf,
                                       size_t count, hvd_dtype dtype);
HVD_EXPORT hvd_status hvd_ps_allgather_async(int ps, const char *name,
                                             const void *sendbuf, void *recvbuf,
                                             size_t count, hvd_dtype dtype,
                                             hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_alltoall(int ps, const char *name,
                                      const void *sendbuf, size_t count,
                                      const size_t *sendcounts, void *recvbuf,
                                      size_t recvcap, size_t *recvcounts_out,
                                      hvd_dtype dtype);
HVD_EXPORT hvd_status hvd_ps_alltoall_async(int ps, const char *name,
                                            const void *sendbuf, size_t count,
                                            const size_t *sendcounts,
                                            void *recvbuf, size_t recvcap,
                                            size_t *recvcounts_out,
                                            hvd_dtype dtype, hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_reducescatter(int ps, const char *name,
                                           const void *sendbuf, void *recvbuf,
                                           size_t count, hvd_dtype dtype,
                                           hvd_op op);
HVD_EXPORT hvd_status hvd_ps_reducescatter_async(int ps, const char *name,
                                                 const void *sendbuf,
                                                 void *recvbuf, size_t count,
                                                 hvd_dtype dtype, hvd_op op,
                                                 hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_reducescatter_shaped_async(
    int ps, const char *name, const void *sendbuf, void *recvbuf, int ndim,
    const int64_t *shape, hvd_dtype dtype, hvd_op op, hvd_handle *out);
HVD_EXPORT hvd_status hvd_ps_reducescatter_shaped(int ps, const char *name,
                                                  const void *sendbuf,
                                                  void *recvbuf, int ndim,
                                                  const int64_t *shape,
                                                  hvd_dtype dtype, hvd_op op);
HVD_EXPORT hvd_status hvd_ps_barrier(int ps);

/**
 * Waits for the operation and releases the handle. Returns its status;
 * on failure hvd_last_error() (of the calling thread) gives the sentence.
 */
HVD_EXPORT hvd_status hvd_wait(hvd_handle handle);

/**
 * Sets *done to 1 if the operation has finished (its buffers are then
 * the caller's again), else 0. Does not release the handle: call hvd_wait
 * for that (it returns at once). Returns HVD_OK, or the operation's
 * failure once done.
 */
HVD_EXPORT hvd_status hvd_test(hvd_handle handle, int *done);

/** What hvd_on_done calls: the operation's status, on failure its
 *  sentence (NULL on success; valid during the call only), and arg. */
typedef void (*hvd_done_fn)(hvd_status status, const char *error, void *arg);

/**
 * Instead of hvd_wait: fn(status, error, arg) is called once the operation
 * has finished, on hvd's engine thread, or at once on the calling thread if
 * it already has; the handle is released when fn returns and must not be
 * used after this call. Its buffers are the caller's again when fn runs.
 * fn must return quickly and must not call hvd functions (it runs on the
 * thread that drives every operation): hand longer work to a thread of
 * your own. For frameworks whose kernels complete through a callback
 * (TensorFlow's asynchronous kernels).
 * @return HVD_OK, or HVD_ERR_INVALID_ARG for a NULL handle or fn (the
 *         handle is then untouched).
 */
HVD_EXPORT hvd_status hvd_on_done(hvd_handle handle, hvd_done_fn fn, void *arg);

/**
 * Tells whether this build of libhvd has a part: "tcp", "shm" (always),
 * "mpi", "verbs", "cuda", "nccl" (when found at build time). Says nothing
 * about this machine: a built part may still be unusable here (no RDMA
 * device, no GPU). Works before hvd_init().
 * @param [in] part one of the names above.
 * @return 1 if built in, 0 if not or if part is unknown.
 */
HVD_EXPORT int hvd_built(const char *part);

/** NCCL_VERSION_CODE of the NCCL headers this libhvd was built with (21805
 *  for 2.18.5), 0 if it was built without NCCL (as Horovod's
 *  nccl_built() returns). */
HVD_EXPORT int hvd_nccl_version(void);

/**
 * 1 if every host of the job runs the same number of ranks, 0 if not, -1
 * before hvd_init(). Every rank gets the same answer.
 */
HVD_EXPORT int hvd_is_homogeneous(void);

/**
 * Starts writing the timeline (as HVD_TIMELINE does from init) to path,
 * from the engine's next cycle on; with mark_cycles, each cycle's start is
 * an instant event CYCLE_START. A timeline already being written is
 * closed first. Only rank 0 writes; other ranks return HVD_OK at once.
 * @return HVD_ERR_INVALID_ARG (with the reason) when path cannot be
 *         opened, HVD_ERR_NOT_INITIALIZED before hvd_init().
 */
HVD_EXPORT hvd_status hvd_start_timeline(const char *path, int mark_cycles);

/** Stops writing the timeline and closes its file, a complete JSON array,
 *  from the engine's next cycle on. HVD_OK when none is written. */
HVD_EXPORT hvd_status hvd_stop_timeline(void);

/* hvd_dtype_size(dtype): in <hvd/types.h>, beside hvd_dtype. */

/**
 * Describes the path a collective of bytes bytes (per rank; allgather: the
 * gathered total) takes in this job: "<transport>/<algorithm>/<chunk
 * bytes>", e.g. "shm/direct/262144", "tcp/ring/524288", "shm+tcp/hier/..."
 * (hierarchical), or "local" in a job of one. An allreduce small enough to
 * travel inside the engine's step messages once its name is cached
 * (HVD_STEP_CARRY_BYTES) is "<transport>/step/<that limit>": the path of its
 * repeats, the first call runs the collective. Every rank gets the same
 * answer; the debug log and the timeline show the same for each operation.
 * Alltoall (bytes: what a rank sends) is "<transport>/pairwise/<chunk>",
 * reducescatter (bytes: a rank's input) "<transport>/ring/<chunk>".
 * @param [in]  collective "allreduce", "allgather", "broadcast",
 *                         "alltoall" or "reducescatter".
 * @param [out] out        outlen bytes, NUL-terminated.
 */
HVD_EXPORT hvd_status hvd_path(const char *collective, size_t bytes,
                               hvd_dtype dtype, char *out, size_t outlen);

/* ---- Elastic jobs (docs/elastic.md) ----
 *
 * Under hvdrun --min-np/--max-np/--host-discovery-script the job may lose
 * and gain ranks while it runs. A lost peer then fails every pending and
 * later operation with HVD_ERR_PEERS_CHANGED (not HVD_ERR_PEER_LOST), and
 * so does a reset while operations are pending. The trainer restores its
 * last committed state, calls hvd_elastic_reset() and re-syncs its state
 * from rank 0 of the new generation (hvd.elastic does all of that). */

/** 1 if this process runs in an elastic job (hvdrun set HVD_ELASTIC=1),
 *  0 if not. Works before hvd_init(). */
HVD_EXPORT int hvd_elastic_enabled(void);

/**
 * Re-forms the job without restarting the process: fails what is pending
 * with HVD_ERR_PEERS_CHANGED, drops the transport and the process sets,
 * joins the launcher's rendezvous for its next generation, waits (up to
 * HVD_ELASTIC_TIMEOUT_SECONDS) until the launcher has placed every live
 * worker in it, and sets the job up again. hvd_rank(), hvd_size() and the
 * others then give the new values; the oldest surviving worker is rank 0.
 * No message of an old generation is taken by a new one: each generation
 * has its own job id in every handshake and shared-memory name.
 * @return HVD_OK; HVD_ERR_UNSUPPORTED when the job is not elastic;
 *         HVD_ERR_AUTH when the launcher removed this worker (it was
 *         declared dead: it is not silently re-admitted); HVD_ERR_SHUTDOWN
 *         when the launcher ended the job (fewer than --min-np workers past
 *         --elastic-timeout, or --reset-limit reached); HVD_ERR_TIMEOUT.
 *         On failure hvd is not initialized.
 */
HVD_EXPORT hvd_status hvd_elastic_reset(void);

/**
 * 1 if the launcher announced, since this generation formed, that the
 * job's workers will change (a host added or removed by the discovery
 * script, a new worker waiting to join, a worker gone): the trainer should
 * commit and reset at its next safe point. 0 if not (and outside an
 * elastic job). Does not block. Every rank of a generation gets the notice,
 * but not necessarily at the same moment.
 */
HVD_EXPORT int hvd_elastic_hosts_updated(void);

/** The generation this rank belongs to: 0 for the job as started, one
 *  more at each re-formation that took place; -1 before hvd_init(). */
HVD_EXPORT int hvd_elastic_generation(void);

#ifdef __cplusplus
}
#endif

#endif /* HVD_HVD_H */
