/*
 * The staging pipeline: a transport that carries device memory over a
 * transport that only reads host memory (tcp, shm, mpi).
 *
 * It is an hvd_transport itself (isend, irecv, progress, wake), wrapped
 * around the inner one, so that the collectives run unchanged on device
 * buffers (their reductions go through the device memops of
 * collectives/comm.h, on the same stream as the copies here).
 *
 * A message of len bytes is cut into pieces of piece_bytes (the last one
 * shorter; an empty message is one empty piece), and each piece travels
 * through a slot: a pinned host buffer with a completion mark (a CUDA
 * event).
 * - Send, piece k: the device -> slot copy is queued on the copy stream
 *   and marked; once the mark is reached the inner isend of the slot is
 *   posted; once that send is done the slot is free again. Up to depth
 *   pieces of a message are in flight, so piece k's copy runs while piece
 *   k-1 is on the wire; and since every copy is queued at once, the copies
 *   of the next messages run while this one is sent.
 * - Receive, piece k: the inner irecv into a slot is posted; once it is
 *   done the slot -> device copy is queued and marked; once the mark is
 *   reached the slot is free. Up to depth pieces are posted at once.
 * - A request completes when all its pieces have.
 *
 * Both sides cut a message the same way (piece_bytes must be the same on
 * every rank), so the inner transport sees matching sends and receives.
 * Inner sends and receives are posted in the order the requests were made
 * per peer and channel, as the inner transport's matching needs; requests
 * to different peers do not wait for each other.
 *
 * Slots come from a pool that grows to the most pieces ever in flight at
 * once (depth per request in flight) and is released at close: after the
 * first collectives of a job nothing is allocated per message.
 *
 * The CUDA calls are behind a seam (hvd_stage_seam), so this is plain C:
 * gpu/cuda.c gives the real one (cudaHostAlloc'd slots, cudaMemcpyAsync on
 * the copy stream, cudaEventRecord/cudaEventQuery marks), and the unit
 * tests a simulated stream.
 *
 * While copies are in flight and nothing else can move, progress does not
 * sleep in the inner transport (it polls the marks and the network), so a
 * copy's end is seen within microseconds; with no copy in flight it waits
 * in the inner transport as long as the caller allows.
 *
 * Errors: a failure of the inner transport or of a copy fails every
 * request in flight with that status and makes every later call return
 * it (the caller treats it as fatal: slots may still be referenced by the
 * inner transport until it is closed).
 */
#ifndef HVD_GPU_STAGE_H
#define HVD_GPU_STAGE_H

#include <stddef.h>

#include "hvd/types.h"
#include "transport/transport.h"

typedef struct hvd_stage_seam {
    void *ctx;
    /* A slot: a host buffer of bytes the device can copy to and from at
     * full speed (pinned), and a completion mark. */
    hvd_status (*slot_alloc)(void *ctx, size_t bytes, void **buf_out,
                             void **mark_out);
    void (*slot_free)(void *ctx, void *buf, void *mark);
    /* Queues a copy of bytes (> 0) from src to dst after everything
     * already queued on the copy stream, then sets mark after it. */
    hvd_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes,
                       void *mark);
    /* *done_out = 1 once everything queued before mark has finished. */
    hvd_status (*query)(void *ctx, void *mark, int *done_out);
} hvd_stage_seam;

typedef struct hvd_stage_config {
    size_t piece_bytes; /* >= 1; the same on every rank */
    int depth;          /* pieces in flight per request, >= 1 */
} hvd_stage_config;

/* What the pipeline has done, for tests and the debug log. */
typedef struct hvd_stage_stats {
    size_t slots;          /* slots allocated (the pool's size) */
    size_t pieces;         /* pieces sent or received */
    size_t copies;         /* copies queued */
    size_t max_inflight;   /* most pieces of one request in flight */
    size_t max_slots_used; /* most slots in use at once */
} hvd_stage_stats;

/*
 * Opens a pipeline over inner (borrowed: it must outlive the pipeline and
 * is not closed with it) for a job of size ranks. seam is copied. The
 * result is closed with (*out)->ops->close(*out).
 */
hvd_status hvd_stage_open(hvd_transport *inner, int size,
                          const hvd_stage_config *cfg,
                          const hvd_stage_seam *seam, hvd_transport **out);

void hvd_stage_stats_get(hvd_transport *stage, hvd_stage_stats *out);

#endif
