/*
 * One call of the public API's collectives (api/submit.c), checked once and
 * made one record: who called (for sentences), the process set it runs in,
 * and the engine's record of it, the request (kind, dtype, op, root, the
 * buffers located and their memory type, counts, blocking or not). The job
 * names the request and hands it to the engine's one entry
 * (hvd_engine_submit), which decides there, once, whether the calling
 * thread runs it at once (the express way) or it is queued.
 */
#ifndef HVD_API_CALL_H
#define HVD_API_CALL_H

#include <string.h>

#include "api/job.h"
#include "api/runtime/engine.h"
#include "hvd/hvd.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"

#define HVD_CALL_NAME(n) ((n) != NULL ? (n) : "")

/* How the caller waits for the call. */
typedef enum {
    HVD_CALL_ASYNC,    /* a handle, waited for later (hvd_wait) */
    HVD_CALL_BLOCKING, /* waited for at once; this thread may run the
                          engine meanwhile (the request's will_wait) */
    HVD_CALL_WAITS,    /* waited for at once, run by the engine thread
                          (join, an internal call) */
} hvd_call_mode;

typedef struct hvd_call {
    const char *fn;   /* the public function, for sentences */
    const char *name; /* the caller's name; NULL: unnamed */
    int ps;           /* the process set (0: the job) */
    int ps_size;      /* a set's members (hvd_call_size for any set) */
    int ps_index;     /* this rank's place among them (in a set) */
    hvd_call_mode mode;
    /* The request: &own when the caller waits at once (no allocation: it
     * lives as long as the call), else on the heap (the handle). */
    hvd_request *req;
    hvd_request own;
} hvd_call;

/* Begins fn's call named name in the job's set (inline: the fast path of
 * a blocking allreduce starts here). */
static inline void hvd_call_start(hvd_call *c, const char *fn, const char *name,
                                  hvd_call_mode mode) {
    c->fn = fn;
    c->name = name;
    c->ps = 0;
    c->mode = mode;
    c->req = NULL;
}

/*
 * Begins fn's call named name in process set ps: a sentence if this rank
 * cannot call in it (no such set, not a member, hvd not initialized).
 */
hvd_status hvd_call_begin(hvd_call *c, const char *fn, const char *name, int ps,
                          hvd_call_mode mode);

/* The ranks the call runs among (its set's members; the job's size, at
 * least 1, in set 0). */
int hvd_call_size(const hvd_call *c);

/* dtype valid, both buffers there for count elements, count not too
 * large (inline: the fast path checks here). */
static inline hvd_status hvd_call_check_buffers(const hvd_call *c,
                                                const void *sendbuf,
                                                const void *recvbuf,
                                                size_t count, hvd_dtype dtype) {
    const char *fn = c->fn, *name = HVD_CALL_NAME(c->name);

    if (!hvd_dtype_valid(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): dtype %d is not an hvd_dtype", fn, name,
                             (int)dtype);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): %s is NULL with count %zu", fn, name,
                             sendbuf == NULL ? "sendbuf" : "recvbuf", count);
    if (count > (SIZE_MAX / 2) / hvd_dtype_size(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): count %zu is too large", fn, name,
                             count);
    return HVD_OK;
}

/*
 * Where the n buffers of the call are (*mem_out): all in host memory, or
 * all on this rank's GPU (a sentence otherwise). Empty buffers are not
 * looked at. With no CUDA device this costs a load and a branch per
 * buffer.
 */
hvd_status hvd_call_locate(const hvd_call *c, int n, const void *const *send,
                           void *const *recv, const size_t *counts,
                           hvd_memtype *mem_out);

/* The element count of a shape of ndim dimensions: a sentence if the shape
 * is malformed or its count does not fit a size_t. */
hvd_status hvd_call_shape_count(const hvd_call *c, int ndim,
                                const int64_t *shape, size_t *count);

/* Waits for h; the sentence of a failed request, prefixed with the call. */
hvd_status hvd_call_wait(const char *fn, hvd_handle h, int *last_rank);

/* The request and handing it over are inline: the fast path of a
 * blocking allreduce runs through them. */

/* c->req: a request of kind for n buffers, in the call's set, marked
 * blocking as the call is; the caller fills in its values. */
static inline hvd_status hvd_call_request(hvd_call *c, hvd_kind kind, int n) {
    hvd_request *req;

    /* A blocking call's request lives in the call; a join or an internal
     * call, which the engine thread runs, has one on the heap as a
     * handle's. */
    if (c->mode != HVD_CALL_BLOCKING) {
        req = hvd_request_new(n);
    } else {
        req = &c->own;
        memset(req, 0, HVD_REQUEST_ZEROED);
        if (hvd_request_setup(req, n) != 0)
            req = NULL;
    }
    if (req == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "%s('%s'): out of memory",
                             c->fn, HVD_CALL_NAME(c->name));
    req->desc.kind = kind;
    req->desc.pset = c->ps;
    req->will_wait = c->mode == HVD_CALL_BLOCKING;
    c->req = req;
    return HVD_OK;
}

/*
 * Hands the filled request to the engine (through the job, which names
 * it). An asynchronous call gets its handle in *out; a waiting one waits
 * for it (or runs it at once, the express way) and gets a join's last
 * rank in *last_rank (may be NULL). On failure the request is freed here
 * and the sentence set.
 */
static inline hvd_status hvd_call_run(hvd_call *c, hvd_handle *out,
                                      int *last_rank) {
    hvd_request *req = c->req;
    int express = 0;
    hvd_status st = hvd_job_submit(c->fn, c->name, req, &express);

    if (st != HVD_OK) {
        hvd_request_free(req);
        return st;
    }
    if (c->mode == HVD_CALL_ASYNC) {
        *out = req;
        return HVD_OK;
    }
    if (!express)
        return hvd_call_wait(c->fn, req, last_rank);
    /* Taken by this thread: it runs the request to its end now. */
    st = hvd_engine_express_run(req->eng, req);
    if (st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", c->fn, req->name, hvd_rank());
    /* All it may own: its name, its arrays of many buffers (its error
     * was freed). */
    if (req->name_owned || hvd_request_owns_arrays(req))
        hvd_request_free(req);
    return st;
}

#endif
