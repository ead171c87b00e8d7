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

#include "api/runtime/engine.h"
#include "hvd/hvd.h"

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
    int ps_size;      /* its members (the job's size, at least 1, for 0) */
    int ps_index;     /* this rank's place among them */
    hvd_call_mode mode;
    /* The request: &own when the caller waits at once (no allocation: it
     * lives as long as the call), else on the heap (the handle). */
    hvd_request *req;
    hvd_request own;
} hvd_call;

/*
 * Begins fn's call named name in process set ps: a sentence if this rank
 * cannot call in it (no such set, not a member, hvd not initialized).
 */
hvd_status hvd_call_begin(hvd_call *c, const char *fn, const char *name, int ps,
                          hvd_call_mode mode);

/* dtype valid, both buffers there for count elements, count not too
 * large. */
hvd_status hvd_call_check_buffers(const hvd_call *c, const void *sendbuf,
                                  const void *recvbuf, size_t count,
                                  hvd_dtype dtype);

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

/* c->req: a request of kind for n buffers, in the call's set, marked
 * blocking as the call is; the caller fills in its values. */
hvd_status hvd_call_request(hvd_call *c, hvd_kind kind, int n);

/*
 * Hands the filled request to the engine (through the job, which names
 * it). An asynchronous call gets its handle in *out; a waiting one waits
 * for it (or runs it at once, the express way) and gets a join's last
 * rank in *last_rank (may be NULL). On failure the request is freed here
 * and the sentence set.
 */
hvd_status hvd_call_run(hvd_call *c, hvd_handle *out, int *last_rank);

/* The sentence of a failed request, prefixed with the call. */
hvd_status hvd_call_wait(const char *fn, hvd_handle h, int *last_rank);

#endif
