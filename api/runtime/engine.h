/*
 * The engine: one per process, run by its background thread or by the
 * thread of a blocking call. Threads submit named requests; the engine
 * matches them across ranks, fuses small allreduces, and runs the
 * collectives over collectives/ in the same order on every rank.
 *
 * It advances in steps (docs/design.md, "Steps"): in step k every rank
 * sends every other rank the cache slots it has requests for, the data of
 * the small collectives among them and, rank 0 only, what it decided
 * (negotiated responses, erasures, join, stop); once a rank holds every
 * part it runs cycle k, the same on every rank. Requests the response
 * cache does not know go to rank 0 (the coordinator) in an update first.
 * An idle job sends nothing but transport heartbeats. A blocking call on
 * a free engine takes it at once, its request on the caller's stack (the
 * express way, hvd_engine_submit).
 */
#ifndef HVD_API_ENGINE_H
#define HVD_API_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "api/runtime/devexec.h"
#include "api/runtime/namemap.h"
#include "api/runtime/opdesc.h"
#include "api/runtime/timeline.h"
#include "collectives/comm.h"
#include "hvd/types.h"
#include "transport/transport.h"

typedef struct hvd_engine_config {
    size_t fusion_threshold;   /* bytes; 0: no fusion */
    size_t fusion_tensor_max;  /* larger allreduces run alone, in place */
    size_t step_carry_bytes;   /* cached allreduce data in step messages */
    size_t carry_part_max;     /* of it, a part of another kind */
    int carry_counts_free;     /* an alltoall's counts not counted in it */
    int caller_progress;       /* a waiting thread may run the engine */
    int64_t spin_ns;           /* it polls this long before it blocks */
    int64_t spin_calm_ns;      /* the first of it with no yield */
    int spin_yield;            /* and yields the core between looks */
    int cache_capacity;        /* 0: no response cache */
    int cycle_time_ms;         /* batching window after work arrives */
    double stall_check_s;      /* 0: no stall warnings */
    double stall_shutdown_s;   /* 0: stalled operations only warned about */
    int64_t timeout_ns;        /* bound on waiting for the others to stop */
    const char *timeline_path; /* NULL: no timeline (rank 0 only) */
    int timeline_mark_cycles;  /* CYCLE_START marks in it */
    int elastic; /* a lost peer fails operations with PEERS_CHANGED */
    /* Device tensors: the GPU and NCCL settings, and the transport's
     * mem_types; the engine fills in rank, size, tp, its communicators
     * and the wake-up. */
    hvd_devexec_config dev;
} hvd_engine_config;

typedef struct hvd_engine hvd_engine;

/* A function run on the engine thread (HVD_KIND_CALL). */
typedef void (*hvd_engine_fn)(void *arg, hvd_comm *comm);

/* Buffers a request holds without arrays of its own. */
#define HVD_REQUEST_INLINE 4

/*
 * One submitted operation, the engine's record of a call: built by the
 * API (api/call.c), owned by the engine from submission to completion,
 * freed by hvd_engine_wait. Buffers stay the caller's. It lives on the
 * heap (hvd_request_new: a handle) or in a blocking call's frame
 * (hvd_request_setup: that call waits for it before it returns).
 */

typedef struct hvd_request {
    /* Set by the submitter where it is not zero. */
    hvd_engine_fn fn; /* HVD_KIND_CALL */
    void *fn_arg;
    int heap;       /* hvd_request_new's: freed with its parts */
    int name_owned; /* name is a copy of its own (too long for name1) */
    /* An alltoall: recv[0] holds recv_cap elements; what came from each
     * rank is written to recv_counts (size entries, may be NULL). */
    uint64_t recv_cap;
    size_t *recv_counts;

    /* Engine-private. */
    struct hvd_request *next;
    int state;       /* REQ_NEW (0) until the engine has it */
    int inval;       /* its cache slot must be invalidated on every rank */
    int voted;       /* the others have heard of it (vote or coordinator) */
    int counts_only; /* an alltoall whose step part is its counts alone */

    /* Called once it has finished instead of being waited for
     * (hvd_engine_on_done), outside the engine's lock. */
    void (*on_done)(hvd_status status, const char *error, void *arg);
    void *on_done_arg;

    /* The outcome, under the engine's lock. */
    int done;
    hvd_status status;
    char *error;
    int last_rank; /* join */

    /* Set by the submitter. Last among what starts zeroed: a request set up
     * in a call's frame is zeroed up to its shape's dimensions only
     * (HVD_REQUEST_ZEROED); they, and all that follows, are written before
     * anything reads them (dims up to desc.ndims, which starts 0). */
    hvd_opdesc desc; /* desc.counts points at counts */
    char *name;
    uint64_t hash; /* hvd_namemap_hash(name), for the engine's maps */
    int n;         /* buffers */
    const void **send;
    void **recv;
    uint64_t *counts;
    int slot;               /* engine-private; -1 until it has one */
    int will_wait;          /* its submitter waits for it at once */
    int64_t t_submit;       /* engine-private: set by hvd_engine_submit */
    struct hvd_engine *eng; /* the engine it was submitted to (idem) */
    /* A name that fits (most do), instead of a copy. */
    char name1[48];
    /* Storage for the buffers of a request of up to HVD_REQUEST_INLINE
     * (a single one, an alltoall's parts, a small group), so that none
     * allocates; a larger one has arrays of its own. */
    const void *send_in[HVD_REQUEST_INLINE];
    void *recv_in[HVD_REQUEST_INLINE];
    uint64_t counts_in[HVD_REQUEST_INLINE];
} hvd_request;

/* The bytes of a request that start zeroed (hvd_request_setup): all but
 * what is written before it is read (see desc). */
#define HVD_REQUEST_ZEROED offsetof(hvd_request, desc.dims)

/* Sets up a request, zeroed (its first HVD_REQUEST_ZEROED bytes at least), for
 * n buffers (n >= 1; arrays of its own beyond HVD_REQUEST_INLINE). -1 when
 * out of memory (nothing to free then). Inline for one buffer: a blocking
 * call's fast path.
 */
int hvd_request_setup_n(hvd_request *req, int n);
static inline int hvd_request_setup(hvd_request *req, int n) {
    if (n != 1)
        return hvd_request_setup_n(req, n);
    req->n = 1;
    req->slot = -1;
    req->send = req->send_in;
    req->recv = req->recv_in;
    req->counts = req->counts_in;
    req->send_in[0] = NULL; /* what a barrier, a join ... leave */
    req->recv_in[0] = NULL;
    req->counts_in[0] = 0;
    req->desc.ncounts = 1;
    req->desc.counts = req->counts;
    return 0;
}
/* A request on the heap for n buffers (hvd_request_setup), NULL when out
 * of memory. */
hvd_request *hvd_request_new(int n);
/* Names req: name is copied, or borrowed if borrow (it must outlive the
 * request: a blocking call's own). -1 when out of memory. Inline where it
 * borrows: a blocking call's fast path. */
int hvd_request_name_copy(hvd_request *req, const char *name);
static inline int hvd_request_name(hvd_request *req, const char *name,
                                   int borrow) {
    if (!borrow)
        return hvd_request_name_copy(req, name);
    req->name = (char *)name;
    req->hash = hvd_namemap_hash(name);
    return 0;
}
/* Frees what req owns, and req itself if it is on the heap. */
void hvd_request_free(hvd_request *req);

/* 1 if req has arrays of its own (more than HVD_REQUEST_INLINE buffers). */
static inline int hvd_request_owns_arrays(const hvd_request *req) {
    return req->send != req->send_in;
}

/*
 * Starts the engine over tp (NULL in a job of one), on tp's data and
 * control channels. paths (borrowed, NULL: tp only) gives the collectives
 * their other ways and the selector (collectives/select.h).
 */
hvd_status hvd_engine_start(int rank, int size, hvd_transport *tp,
                            const hvd_comm_config *comm_cfg,
                            struct hvd_paths *paths,
                            const hvd_engine_config *cfg, hvd_engine **out);

/*
 * Asks to stop, waits until every rank has asked (bounded by the
 * timeout), fails what is still pending with HVD_ERR_SHUTDOWN and frees
 * the engine. Returns HVD_OK if the ranks agreed (the transport can then
 * say goodbye), else why not.
 */
hvd_status hvd_engine_stop(hvd_engine *eng);

/* Before hvd_engine_stop for hvd_elastic_reset: what is still pending then
 * fails with HVD_ERR_PEERS_CHANGED instead of HVD_ERR_SHUTDOWN. */
void hvd_engine_mark_reset(hvd_engine *eng);

/* The engine's data communicator (its paths and table are read-only once
 * the engine runs, so other threads may plan with it: hvd_coll_plan). */
hvd_comm *hvd_engine_data(hvd_engine *eng);

/* The transport's name if a cached allreduce of bytes bytes of host memory
 * travels in the engine's step messages (docs/design.md, "Steps"), else
 * NULL. */
const char *hvd_engine_step_path(const hvd_engine *eng, size_t bytes);

/*
 * The engine's one entry for a call's request (named, filled): decides,
 * once and under the engine's lock, whether the calling thread runs it at
 * once (the express way: a blocking collective of host memory, when
 * nobody runs the engine and nothing is queued or pending; *express = 1, and
 * the engine is this thread's until hvd_engine_express_run has run req to its
 * end) or it is queued
 * (*express = 0; wait for it with hvd_engine_wait). On failure req is
 * untouched (still the caller's) and the sentence is set.
 */
hvd_status hvd_engine_submit(hvd_engine *eng, hvd_request *req, int *express);
/* Runs an express request to its end; its outcome (the sentence set on
 * failure). */
hvd_status hvd_engine_express_run(hvd_engine *eng, hvd_request *req);

/* Waits for req, copies its sentence to this thread on failure (and its
 * name to name_out, namelen bytes, if not NULL), frees it. */
hvd_status hvd_engine_wait(hvd_request *req, int *last_rank_out, char *name_out,
                           size_t namelen);

/* Rank 0: the engine writes tl from its next cycle on (NULL: none), with
 * CYCLE_START marks if mark_cycles; the one before is closed. Takes tl. */
void hvd_engine_set_timeline(hvd_engine *eng, hvd_timeline *tl,
                             int mark_cycles);

/*
 * Process set id as this rank's engine knows it now: its members (*size),
 * this rank's place among them (*index, -1: not a member) and the first
 * cap of their ranks (ranks may be NULL). HVD_ERR_INVALID_ARG (no
 * sentence) if there is no such set. Any thread.
 */
hvd_status hvd_engine_pset(hvd_engine *eng, int id, int *size, int *index,
                           int *ranks, int cap);

/* *done = 1 if req has finished; returns its status then. */
hvd_status hvd_engine_test(hvd_request *req, int *done);

/* Instead of hvd_engine_wait: fn(status, error, arg) runs once req has
 * finished (on the engine thread, or here at once if it already has), and
 * req is freed after it. error is NULL on success. */
void hvd_engine_on_done(hvd_request *req,
                        void (*fn)(hvd_status, const char *, void *),
                        void *arg);

#endif
