#include "api/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cache.h"
#include "api/coordinator.h"
#include "api/engine.pb-c.h"
#include "api/namemap.h"
#include "api/timeline.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

#define NS_PER_S 1000000000LL
/* The longest an idle engine waits before looking at its timers again. */
#define IDLE_WAIT_MS 1000

/*
 * Control messages: a 16-byte header, then (if len > 0) a body of len
 * bytes as a second message. Rank 0 always has one header receive posted
 * from every other rank, and every other rank one from rank 0.
 */
enum {
    MSG_DOORBELL = 1,  /* rank -> 0: I have new work (body: none) */
    MSG_START = 2,     /* 0 -> rank: cycle `cycle` begins */
    MSG_REQUESTS = 3,  /* rank -> 0: RequestList */
    MSG_RESPONSES = 4, /* 0 -> rank: ResponseList */
    MSG_STOP = 5,      /* both ways, once every rank stops: the last one */
};

typedef struct msg_header {
    uint32_t type;
    uint32_t cycle;
    uint64_t len;
} msg_header;

_Static_assert(sizeof(msg_header) == 16, "the control header is 16 bytes");

/* Request states, engine-private. */
enum {
    REQ_NEW = 0, /* the coordinator has not heard of it */
    REQ_CACHED,  /* bound to cache slot `slot`; voted for each cycle */
    REQ_SENT,    /* the coordinator has it */
};

/* One header receive per peer. */
typedef struct ctrl_port {
    msg_header hdr;
    hvd_req req;
    int posted;
} ctrl_port;

/* A response of the current cycle, pointing into the cache or into the
 * coordinator's list; nothing is copied. */
typedef struct resp {
    const char *name;
    hvd_opdesc desc;
    hvd_status status;
    const char *error;
    int contributors;
    int self_joined;
    int last_joined;
    int cached;
} resp;

struct hvd_engine {
    int rank;
    int size;
    hvd_transport *tp;
    hvd_comm *data;
    hvd_comm *ctrl;
    hvd_engine_config cfg;
    pthread_t thread;
    int thread_started;

    /* Shared with the submitting threads, under lock. */
    hvd_request *queue_head, *queue_tail;
    hvd_namemap inflight; /* names submitted and not finished */
    int stop_requested;
    int finished;      /* the thread has left its loop */
    hvd_status failed; /* HVD_OK while healthy */
    char failmsg[HVD_ERROR_MAX];
    hvd_status stop_status;

    /* The engine thread's own. */
    hvd_request **pending; /* submitted, not finished */
    int npending, cappending;
    hvd_namemap by_name; /* pending by name */
    hvd_cache cache;
    hvd_coord *coord; /* rank 0 */
    uint64_t cycle;
    int rang; /* a doorbell is out since the last cycle */
    int stop_voted;
    int *doorbell;    /* rank 0: rank r rang */
    ctrl_port *ports; /* rank 0: one per rank; others: [0] from rank 0 */
    uint8_t *vote;
    size_t vote_cap;
    uint8_t *body;
    size_t body_cap;
    resp *resps;
    size_t resps_cap;
    void *fusion;
    size_t fusion_cap;
    hvd_timeline *timeline;
    int64_t stop_deadline;
    /* Counters for the debug log. */
    int n_cached, n_negotiated, n_collectives;
};

/* One lock and condition for every engine: handles outlive an engine
 * (hvd_wait after hvd_shutdown must still work). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* ------------------------------------------------------------------ */
/* Requests                                                            */

hvd_request *hvd_request_new(const char *name, int n) {
    hvd_request *req = calloc(1, sizeof(*req));

    if (req == NULL)
        return NULL;
    req->name = strdup(name);
    req->n = n;
    if (n == 1) {
        req->send = &req->send1;
        req->recv = &req->recv1;
        req->counts = &req->count1;
    } else {
        req->send = calloc((size_t)n, sizeof(*req->send));
        req->recv = calloc((size_t)n, sizeof(*req->recv));
        req->counts = calloc((size_t)n, sizeof(*req->counts));
    }
    req->desc.ncounts = (size_t)n;
    req->desc.counts = req->counts;
    req->slot = -1;
    if (req->name == NULL || req->send == NULL || req->recv == NULL ||
        req->counts == NULL) {
        hvd_request_free(req);
        return NULL;
    }
    return req;
}

void hvd_request_free(hvd_request *req) {
    if (req == NULL)
        return;
    if (req->n != 1) {
        free(req->send);
        free(req->recv);
        free(req->counts);
    }
    free(req->error);
    free(req->name);
    free(req);
}

/* Finishes req (engine thread). */
static void complete(hvd_engine *eng, hvd_request *req, hvd_status status,
                     const char *error) {
    for (int i = 0; i < eng->npending; i++) {
        if (eng->pending[i] == req) {
            eng->pending[i] = eng->pending[--eng->npending];
            break;
        }
    }
    hvd_namemap_remove(&eng->by_name, req->name);
    pthread_mutex_lock(&lock);
    req->status = status;
    if (status != HVD_OK)
        req->error = strdup(error != NULL ? error : hvd_strerror(status));
    req->done = 1;
    hvd_namemap_remove(&eng->inflight, req->name);
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

/* Fails everything pending or queued (engine thread, at the end). */
static void fail_all(hvd_engine *eng, hvd_status status, const char *text) {
    hvd_request *queued;

    while (eng->npending > 0)
        complete(eng, eng->pending[0], status, text);
    pthread_mutex_lock(&lock);
    queued = eng->queue_head;
    eng->queue_head = eng->queue_tail = NULL;
    pthread_mutex_unlock(&lock);
    while (queued != NULL) {
        hvd_request *next = queued->next;
        pthread_mutex_lock(&lock);
        queued->status = status;
        queued->error = strdup(text);
        queued->done = 1;
        hvd_namemap_remove(&eng->inflight, queued->name);
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        queued = next;
    }
}

/* The engine cannot go on: remembers why (for later submissions). */
static hvd_status engine_fail(hvd_engine *eng, hvd_status status) {
    pthread_mutex_lock(&lock);
    if (eng->failed == HVD_OK) {
        eng->failed = status;
        snprintf(eng->failmsg, sizeof(eng->failmsg), "%s", hvd_error_get());
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* ------------------------------------------------------------------ */
/* Submission (any thread)                                             */

hvd_status hvd_engine_submit(hvd_engine *eng, hvd_request *req) {
    hvd_status st = HVD_OK;

    req->t_submit = hvd_now_ns();
    req->state = REQ_NEW;
    req->slot = -1;
    req->next = NULL;
    pthread_mutex_lock(&lock);
    if (eng->failed != HVD_OK) {
        st = hvd_error_set(eng->failed, "hvd failed earlier: %s", eng->failmsg);
    } else if (eng->stop_requested || eng->finished) {
        st = hvd_error_set(HVD_ERR_SHUTDOWN,
                           "'%s' submitted while hvd shuts down", req->name);
    } else if (hvd_namemap_get(&eng->inflight, req->name) != NULL) {
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "'%s' is already in flight on rank %d: names must "
                           "be unique among operations in flight",
                           req->name, eng->rank);
    } else if (hvd_namemap_put(&eng->inflight, req->name, req) != 0) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    } else {
        if (eng->queue_tail)
            eng->queue_tail->next = req;
        else
            eng->queue_head = req;
        eng->queue_tail = req;
        pthread_cond_broadcast(&cond);
    }
    pthread_mutex_unlock(&lock);
    if (st == HVD_OK && eng->tp != NULL)
        eng->tp->ops->wake(eng->tp);
    return st;
}

hvd_status hvd_engine_wait(hvd_request *req, int *last_rank_out) {
    hvd_status st;

    pthread_mutex_lock(&lock);
    while (!req->done)
        pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    st = req->status;
    if (st != HVD_OK)
        hvd_error_copy(st, req->error);
    if (last_rank_out != NULL)
        *last_rank_out = req->last_rank;
    hvd_request_free(req);
    return st;
}

hvd_status hvd_engine_test(hvd_request *req, int *done) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&lock);
    *done = req->done;
    if (req->done && req->status != HVD_OK)
        st = hvd_error_copy(req->status, req->error);
    pthread_mutex_unlock(&lock);
    return st;
}

/* ------------------------------------------------------------------ */
/* Control messages                                                    */

static hvd_status post_header(hvd_engine *eng, int peer) {
    ctrl_port *p = &eng->ports[eng->rank == 0 ? peer : 0];

    p->posted = 1;
    return hvd_comm_irecv(eng->ctrl, peer, &p->hdr, sizeof(p->hdr), &p->req);
}

/* Sends a header and its body, and waits until both are out. */
static hvd_status send_msg(hvd_engine *eng, int peer, uint32_t type,
                           const void *body, size_t len) {
    msg_header hdr = {.type = type, .cycle = (uint32_t)eng->cycle, .len = len};
    hvd_req req[2];
    hvd_status st = hvd_comm_isend(eng->ctrl, peer, &hdr, sizeof(hdr), &req[0]);

    if (st == HVD_OK && len > 0)
        st = hvd_comm_isend(eng->ctrl, peer, body, len, &req[1]);
    if (st == HVD_OK)
        st = hvd_comm_waitall(eng->ctrl, req, len > 0 ? 2 : 1);
    return st;
}

static hvd_status body_room(hvd_engine *eng, size_t len) {
    if (len > eng->body_cap) {
        void *p = realloc(eng->body, len);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        eng->body = p;
        eng->body_cap = len;
    }
    return HVD_OK;
}

/*
 * Receives the next message of `type` from peer into eng->body. Doorbells
 * met on the way (rank 0) were rung before the peer saw this cycle's
 * START and so are covered by this cycle.
 */
static hvd_status recv_msg(hvd_engine *eng, int peer, uint32_t type,
                           size_t *len_out, int repost) {
    ctrl_port *p = &eng->ports[eng->rank == 0 ? peer : 0];
    hvd_status st;

    for (;;) {
        st = hvd_comm_wait(eng->ctrl, &p->req);
        if (st != HVD_OK)
            return st;
        msg_header hdr = p->hdr;
        if (hdr.type == MSG_DOORBELL && eng->rank == 0) {
            st = post_header(eng, peer);
            if (st != HVD_OK)
                return st;
            continue;
        }
        if (hdr.type != type || hdr.len > ((uint64_t)1 << 32))
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "control message %u (%llu bytes) from rank "
                                 "%d where %u was expected",
                                 hdr.type, (unsigned long long)hdr.len, peer,
                                 type);
        if (hdr.len > 0) {
            hvd_req body;
            st = body_room(eng, hdr.len);
            if (st == HVD_OK)
                st = hvd_comm_irecv(eng->ctrl, peer, eng->body, hdr.len, &body);
            if (st == HVD_OK)
                st = hvd_comm_wait(eng->ctrl, &body);
            if (st != HVD_OK)
                return st;
        }
        *len_out = hdr.len;
        if (!repost) {
            p->posted = 0;
            return HVD_OK;
        }
        return post_header(eng, peer);
    }
}

/* ------------------------------------------------------------------ */
/* Intake                                                              */

static int pending_push(hvd_engine *eng, hvd_request *req) {
    if (eng->npending == eng->cappending) {
        int cap = eng->cappending ? eng->cappending * 2 : 64;
        hvd_request **p = realloc(eng->pending, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return -1;
        eng->pending = p;
        eng->cappending = cap;
    }
    if (hvd_namemap_put(&eng->by_name, req->name, req) != 0)
        return -1;
    eng->pending[eng->npending++] = req;
    return 0;
}

/* Binds req to its cache slot if the cache holds the same operation; a
 * cached name with other values is invalidated on every rank. */
static void classify(hvd_engine *eng, hvd_request *req) {
    int slot =
        req->desc.kind == HVD_KIND_JOIN || req->desc.kind == HVD_KIND_CALL
            ? -1
            : hvd_cache_lookup(&eng->cache, req->name);

    req->state = REQ_NEW;
    req->slot = -1;
    req->inval = 0;
    req->voted = 0;
    if (slot < 0)
        return;
    if (hvd_opdesc_equal(&eng->cache.slots[slot].desc, &req->desc)) {
        req->state = REQ_CACHED;
        req->slot = slot;
    } else {
        req->slot = slot;
        req->inval = 1;
    }
}

/* Takes what the submitters queued. Returns 1 if there was anything. */
static int intake(hvd_engine *eng, int *stop) {
    hvd_request *q;

    pthread_mutex_lock(&lock);
    q = eng->queue_head;
    eng->queue_head = eng->queue_tail = NULL;
    *stop = eng->stop_requested;
    pthread_mutex_unlock(&lock);
    if (q == NULL)
        return 0;
    while (q != NULL) {
        hvd_request *next = q->next;
        q->next = NULL;
        if (pending_push(eng, q) != 0) {
            complete(eng, q, HVD_ERR_NO_MEMORY, "out of memory");
        } else {
            classify(eng, q);
            hvd_timeline_begin(
                eng->timeline, q->name,
                q->desc.kind == HVD_KIND_BROADCAST   ? "NEGOTIATE_BROADCAST"
                : q->desc.kind == HVD_KIND_ALLGATHER ? "NEGOTIATE_ALLGATHER"
                : q->desc.kind == HVD_KIND_ALLREDUCE ? "NEGOTIATE_ALLREDUCE"
                                                     : "NEGOTIATE",
                q->t_submit,
                q->state == REQ_CACHED ? "\"cached\": true"
                                       : "\"cached\": false");
        }
        q = next;
    }
    return 1;
}

/* 1 if this rank has something the others do not know about yet: a
 * request nobody has heard of, or a cached one not voted for yet. */
static int has_news(const hvd_engine *eng, int stop) {
    if (stop && !eng->stop_voted)
        return 1;
    for (int i = 0; i < eng->npending; i++) {
        const hvd_request *req = eng->pending[i];
        if (req->state == REQ_NEW || req->inval || !req->voted)
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Running responses                                                   */

static hvd_status fusion_room(hvd_engine *eng, size_t bytes) {
    if (bytes > eng->fusion_cap) {
        void *p = malloc(bytes);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory for a %zu-byte fusion buffer",
                                 bytes);
        free(eng->fusion);
        eng->fusion = p;
        eng->fusion_cap = bytes;
    }
    return HVD_OK;
}

/* Timeline args of a collective: where it ran and how. */
static void collective_args(hvd_engine *eng, char *out, size_t outlen,
                            const char *algo, int ntensors, size_t bytes) {
    snprintf(out, outlen,
             "\"transport\": \"%s\", \"algorithm\": \"%s\", "
             "\"tensors\": %d, \"bytes\": %zu",
             eng->tp != NULL ? eng->tp->ops->name : "local", algo, ntensors,
             bytes);
}

/*
 * Allreduces resps[first, last): one collective, in place on the caller's
 * buffers for a single tensor, else through the fusion buffer.
 */
static hvd_status run_allreduce(hvd_engine *eng, resp *rs, size_t first,
                                size_t last) {
    const resp *r0 = &rs[first];
    hvd_dtype dtype = r0->desc.dtype;
    size_t esize = hvd_dtype_size(dtype);
    int average_here =
        r0->desc.op == HVD_AVERAGE && r0->contributors != eng->size;
    hvd_op op = average_here ? HVD_SUM : r0->desc.op;
    size_t total = 0, ntensors = 0;
    int64_t t;
    hvd_status st;
    char args[256];

    for (size_t i = first; i < last; i++) {
        total += (size_t)hvd_opdesc_total(&rs[i].desc);
        ntensors += rs[i].desc.ncounts;
    }
    t = hvd_now_ns();
    for (size_t i = first; i < last; i++) {
        hvd_timeline_end(eng->timeline, rs[i].name, t); /* QUEUE */
    }

    /* The path is the selector's choice for this size (what the timeline
     * shows before the collective runs). */
    collective_args(eng, args, sizeof(args),
                    eng->size == 1 ? "local"
                                   : hvd_algo_name(hvd_select_allreduce(
                                         eng->data, total * esize)),
                    (int)ntensors, total * esize);
    if (ntensors == 1 && !r0->self_joined) {
        hvd_request *req = hvd_namemap_get(&eng->by_name, r0->name);
        if (req == NULL)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "rank %d has no request '%s' to run",
                                 eng->rank, r0->name);
        void *recv = req->recv[0];
        hvd_timeline_begin(eng->timeline, r0->name, "ALLREDUCE", t, args);
        st =
            hvd_coll_allreduce(eng->data, req->send[0], recv, total, dtype, op);
        if (st == HVD_OK && average_here)
            hvd_reduce_scale_div(recv, total, dtype, r0->contributors);
        t = hvd_now_ns();
        hvd_timeline_end(eng->timeline, r0->name, t);
        eng->n_collectives++;
        if (st != HVD_OK)
            return st;
        complete(eng, req, HVD_OK, NULL);
        return HVD_OK;
    }

    st = fusion_room(eng, total * esize > 0 ? total * esize : 1);
    if (st != HVD_OK)
        return st;
    uint8_t *fb = eng->fusion;
    size_t off = 0;
    for (size_t i = first; i < last; i++) {
        hvd_request *req = rs[i].self_joined
                               ? NULL
                               : hvd_namemap_get(&eng->by_name, rs[i].name);
        hvd_timeline_begin(eng->timeline, rs[i].name, "MEMCPY_IN_FUSION_BUFFER",
                           t, NULL);
        for (size_t k = 0; k < rs[i].desc.ncounts; k++) {
            size_t n = (size_t)rs[i].desc.counts[k];
            if (req == NULL)
                hvd_reduce_fill_neutral(fb + off, n, dtype, op);
            else if (n > 0)
                memcpy(fb + off, req->send[k], n * esize);
            off += n * esize;
        }
    }
    t = hvd_now_ns();
    for (size_t i = first; i < last; i++) {
        hvd_timeline_end(eng->timeline, rs[i].name, t);
        hvd_timeline_begin(eng->timeline, rs[i].name, "ALLREDUCE", t, args);
    }
    st = hvd_coll_allreduce(eng->data, fb, fb, total, dtype, op);
    if (st == HVD_OK && average_here)
        hvd_reduce_scale_div(fb, total, dtype, r0->contributors);
    eng->n_collectives++;
    t = hvd_now_ns();
    for (size_t i = first; i < last; i++) {
        hvd_timeline_end(eng->timeline, rs[i].name, t);
        hvd_timeline_begin(eng->timeline, rs[i].name,
                           "MEMCPY_OUT_FUSION_BUFFER", t, NULL);
    }
    if (st != HVD_OK)
        return st;
    off = 0;
    for (size_t i = first; i < last; i++) {
        hvd_request *req = rs[i].self_joined
                               ? NULL
                               : hvd_namemap_get(&eng->by_name, rs[i].name);
        for (size_t k = 0; k < rs[i].desc.ncounts; k++) {
            size_t n = (size_t)rs[i].desc.counts[k];
            if (req != NULL && n > 0)
                memcpy(req->recv[k], fb + off, n * esize);
            off += n * esize;
        }
        hvd_timeline_end(eng->timeline, rs[i].name, hvd_now_ns());
        if (req != NULL)
            complete(eng, req, HVD_OK, NULL);
    }
    return HVD_OK;
}

/* Runs one broadcast, allgather, barrier, join or call response. */
static hvd_status run_other(hvd_engine *eng, const resp *r) {
    hvd_request *req = hvd_namemap_get(&eng->by_name, r->name);
    hvd_status st = HVD_OK;
    int64_t t = hvd_now_ns();
    char args[256];

    hvd_timeline_end(eng->timeline, r->name, t); /* QUEUE */
    if (req == NULL) {
        /* Only a joined rank meets an operation it did not ask for, and
         * only for what can complete without it (allreduce, barrier). */
        if (r->desc.kind == HVD_KIND_BARRIER)
            return HVD_OK;
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "rank %d has no request '%s' to run", eng->rank,
                             r->name);
    }
    switch (r->desc.kind) {
    case HVD_KIND_BROADCAST:
        st = hvd_coll_broadcast(eng->data, req->recv[0], req->counts[0],
                                r->desc.dtype, r->desc.root);
        eng->n_collectives++;
        break;
    case HVD_KIND_ALLGATHER:
        st = hvd_coll_allgather(eng->data, req->send[0], req->recv[0],
                                req->counts[0], r->desc.dtype);
        eng->n_collectives++;
        break;
    case HVD_KIND_CALL:
        req->fn(req->fn_arg, eng->data);
        break;
    case HVD_KIND_JOIN:
        req->last_rank = r->last_joined;
        break;
    default: /* barrier: that every rank asked is the barrier */
        break;
    }
    if (st != HVD_OK)
        return st;
    if (r->desc.kind == HVD_KIND_BROADCAST ||
        r->desc.kind == HVD_KIND_ALLGATHER) {
        collective_args(eng, args, sizeof(args), eng->data->last_path, 1,
                        (size_t)req->counts[0] * hvd_dtype_size(r->desc.dtype));
        hvd_timeline_begin(eng->timeline, r->name,
                           r->desc.kind == HVD_KIND_BROADCAST ? "BROADCAST"
                                                              : "ALLGATHER",
                           t, args);
        hvd_timeline_end(eng->timeline, r->name, hvd_now_ns());
    }
    complete(eng, req, HVD_OK, NULL);
    return HVD_OK;
}

/* Whether rs[i] may join the fusion group that starts at rs[first]. */
static int fuses(const hvd_engine *eng, const resp *rs, size_t first, size_t i,
                 size_t group_bytes) {
    const resp *a = &rs[first], *b = &rs[i];
    size_t bytes =
        (size_t)hvd_opdesc_total(&b->desc) * hvd_dtype_size(b->desc.dtype);

    return b->status == HVD_OK && b->desc.kind == HVD_KIND_ALLREDUCE &&
           b->desc.dtype == a->desc.dtype && b->desc.op == a->desc.op &&
           b->contributors == a->contributors &&
           b->self_joined == a->self_joined &&
           bytes <= eng->cfg.fusion_tensor_max &&
           group_bytes + bytes <= eng->cfg.fusion_threshold;
}

/* Runs the cycle's responses in order, fusing neighbouring allreduces. */
static hvd_status run_responses(hvd_engine *eng, resp *rs, size_t n) {
    int64_t t = hvd_now_ns();

    for (size_t i = 0; i < n; i++) {
        hvd_request *req = hvd_namemap_get(&eng->by_name, rs[i].name);
        if (req != NULL) {
            hvd_timeline_end(eng->timeline, rs[i].name, t); /* NEGOTIATE */
            hvd_timeline_begin(eng->timeline, rs[i].name, "QUEUE", t, NULL);
        } else if (rs[i].status == HVD_OK) {
            /* A joined rank: give it a row all the same. */
            hvd_timeline_begin(eng->timeline, rs[i].name, "QUEUE", t, NULL);
        }
    }
    for (size_t i = 0; i < n;) {
        resp *r = &rs[i];
        hvd_status st;

        if (r->status != HVD_OK) {
            hvd_request *req = hvd_namemap_get(&eng->by_name, r->name);
            if (req != NULL) {
                hvd_timeline_end(eng->timeline, r->name, t); /* QUEUE */
                complete(eng, req, r->status, r->error);
            }
            i++;
            continue;
        }
        if (r->desc.kind != HVD_KIND_ALLREDUCE) {
            st = run_other(eng, r);
            if (st != HVD_OK)
                return st;
            i++;
            continue;
        }
        size_t last = i + 1;
        size_t bytes =
            (size_t)hvd_opdesc_total(&r->desc) * hvd_dtype_size(r->desc.dtype);
        if (r->desc.ncounts == 1 && bytes <= eng->cfg.fusion_tensor_max &&
            bytes <= eng->cfg.fusion_threshold) {
            while (last < n && fuses(eng, rs, i, last, bytes)) {
                bytes += (size_t)hvd_opdesc_total(&rs[last].desc) *
                         hvd_dtype_size(rs[last].desc.dtype);
                last++;
            }
        }
        st = run_allreduce(eng, rs, i, last);
        if (st != HVD_OK)
            return st;
        i = last;
    }
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* A cycle                                                             */

static hvd_status resps_room(hvd_engine *eng, size_t n) {
    if (n > eng->resps_cap) {
        size_t cap = n < 64 ? 64 : n * 2;
        resp *p = realloc(eng->resps, cap * sizeof(*p));
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        eng->resps = p;
        eng->resps_cap = cap;
    }
    return HVD_OK;
}

static int in_list(const uint32_t *v, size_t n, int x) {
    for (size_t i = 0; i < n; i++)
        if (v[i] == (uint32_t)x)
            return 1;
    return 0;
}

/* This rank's new requests as a RequestList (marks them sent). */
static hvd_status pack_requests(hvd_engine *eng, uint8_t **buf_out,
                                size_t *len_out) {
    Hvd__Engine__RequestList list = HVD__ENGINE__REQUEST_LIST__INIT;
    Hvd__Engine__Request *items = NULL, **ptrs = NULL;
    int64_t now = hvd_now_ns();
    size_t n = 0, len;
    hvd_status st = HVD_OK;

    for (int i = 0; i < eng->npending; i++)
        n += eng->pending[i]->state == REQ_NEW;
    if (n > 0) {
        items = calloc(n, sizeof(*items));
        ptrs = calloc(n, sizeof(*ptrs));
        if (items == NULL || ptrs == NULL) {
            st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
    }
    n = 0;
    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->state != REQ_NEW)
            continue;
        Hvd__Engine__Request *it = &items[n];
        hvd__engine__request__init(it);
        it->name = req->name;
        it->kind = req->desc.kind;
        it->dtype = req->desc.dtype;
        it->op = req->desc.op;
        it->root = req->desc.root;
        it->n_counts = req->desc.ncounts;
        it->counts = req->counts;
        it->age_s = (double)(now - req->t_submit) / 1e9;
        ptrs[n++] = it;
        req->state = REQ_SENT;
        req->voted = 1;
    }
    list.n_requests = n;
    list.requests = ptrs;
    len = hvd__engine__request_list__get_packed_size(&list);
    st = body_room(eng, len ? len : 1);
    if (st == HVD_OK) {
        hvd__engine__request_list__pack(&list, eng->body);
        *buf_out = eng->body;
        *len_out = len;
    }
out:
    free(items);
    free(ptrs);
    return st;
}

/* Rank 0: feeds the coordinator one rank's RequestList. */
static hvd_status coord_take(hvd_engine *eng, int rank, const uint8_t *buf,
                             size_t len, double now) {
    Hvd__Engine__RequestList *list =
        hvd__engine__request_list__unpack(NULL, len, buf);
    hvd_status st = HVD_OK;

    if (list == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "malformed request list from rank %d", rank);
    for (size_t i = 0; i < list->n_requests && st == HVD_OK; i++) {
        const Hvd__Engine__Request *it = list->requests[i];
        hvd_opdesc d = {.kind = (hvd_kind)it->kind,
                        .dtype = (hvd_dtype)it->dtype,
                        .op = (hvd_op)it->op,
                        .root = it->root,
                        .ncounts = it->n_counts,
                        .counts = it->counts};
        if (it->kind >= HVD_KIND_COUNT || it->n_counts < 1)
            st = hvd_error_set(HVD_ERR_TRANSPORT,
                               "malformed request '%s' from rank %d", it->name,
                               rank);
        else
            st = hvd_coord_add(eng->coord, rank, it->name, &d, it->age_s, now);
    }
    hvd__engine__request_list__free_unpacked(list, NULL);
    return st;
}

/*
 * Converts requests that have waited long in the cache path into
 * requests the coordinator hears about, so that the stall inspector can
 * say which ranks are missing; the slot is invalidated on every rank.
 */
static void uncache_stalled(hvd_engine *eng, int64_t now) {
    int64_t limit = (int64_t)(eng->cfg.stall_check_s * NS_PER_S / 2);

    if (eng->cfg.stall_check_s <= 0)
        return;
    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->state == REQ_CACHED && now - req->t_submit > limit) {
            req->state = REQ_NEW;
            req->inval = 1;
            req->voted = 0;
        }
    }
}

/*
 * One cycle. Sets *all_stop when every rank has asked to stop.
 */
static hvd_status run_cycle(hvd_engine *eng, int stop, int *all_stop) {
    hvd_cache *cache = &eng->cache;
    int ns = cache->nslots;
    size_t vlen = 2 * (size_t)ns + 3;
    uint8_t *v;
    int self_joined = 0;
    int coord_due = 0;
    Hvd__Engine__ResponseList built = HVD__ENGINE__RESPONSE_LIST__INIT;
    Hvd__Engine__ResponseList *got = NULL;
    size_t nresp = 0;
    hvd_status st = HVD_OK;
    int64_t now = hvd_now_ns();

    eng->n_cached = eng->n_negotiated = eng->n_collectives = 0;
    uncache_stalled(eng, now);
    if (eng->rank == 0) {
        double dl = hvd_coord_next_deadline(eng->coord);
        coord_due = dl >= 0 && dl * NS_PER_S <= (double)now;
    }

    /* 1. The vote. */
    if (vlen > eng->vote_cap) {
        uint8_t *p = realloc(eng->vote, vlen * 2);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        eng->vote = p;
        eng->vote_cap = vlen * 2;
    }
    v = eng->vote;
    memset(v, 0, (size_t)ns);
    memset(v + ns, 1, (size_t)ns);
    v[2 * ns] = 1;     /* 1 - "I have requests for the coordinator" */
    v[2 * ns + 1] = 1; /* 1 - "I am joined" */
    v[2 * ns + 2] = (uint8_t)(stop != 0);
    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->inval && req->slot >= 0 && req->slot < ns) {
            v[ns + req->slot] = 0;
            req->inval = 0;
        }
        if (req->state == REQ_CACHED) {
            v[req->slot] = 1;
            req->voted = 1;
        }
        if (req->state == REQ_NEW)
            v[2 * ns] = 0;
        if (req->desc.kind == HVD_KIND_JOIN && req->state == REQ_SENT)
            self_joined = 1;
    }
    if (coord_due)
        v[2 * ns] = 0;
    if (self_joined)
        v[2 * ns + 1] = 0;
    if (stop)
        eng->stop_voted = 1;
    if (eng->size > 1) {
        st = hvd_coll_allreduce(eng->data, v, v, vlen, HVD_UINT8, HVD_MIN);
        if (st != HVD_OK)
            return st;
    }
    int gather = v[2 * ns] == 0;
    int any_joined = v[2 * ns + 1] == 0;
    *all_stop = v[2 * ns + 2] == 1;

    /* Cached operations every rank has ready. While a rank is joined the
     * cache path pauses: joined ranks do not vote, so those operations go
     * to the coordinator, which knows who is joined. */
    st = resps_room(eng, (size_t)ns);
    if (st != HVD_OK)
        return st;
    for (int s = 0; s < ns; s++) {
        if (v[s] != 1 || any_joined)
            continue;
        hvd_cache_entry *e = &cache->slots[s];
        resp *r = &eng->resps[nresp++];
        memset(r, 0, sizeof(*r));
        r->name = e->name;
        r->desc = e->desc;
        r->status = HVD_OK;
        r->contributors = eng->size;
        r->cached = 1;
        hvd_cache_touch(cache, s, eng->cycle);
        eng->n_cached++;
    }
    if (any_joined) {
        int moved = 0;
        for (int i = 0; i < eng->npending; i++) {
            if (eng->pending[i]->state == REQ_CACHED) {
                eng->pending[i]->state = REQ_NEW;
                eng->pending[i]->voted = 0;
                moved = 1;
            }
        }
        if (moved)
            eng->rang = 0; /* ring again for the next cycle */
    }
    /* Invalidated slots: erased everywhere; their requests go to the
     * coordinator next. */
    for (int s = 0; s < ns; s++) {
        if (v[ns + s] != 0)
            continue;
        for (int i = 0; i < eng->npending; i++) {
            hvd_request *req = eng->pending[i];
            if (req->slot == s) {
                req->slot = -1;
                if (req->state == REQ_CACHED) {
                    req->state = REQ_NEW;
                    req->voted = 0;
                }
            }
        }
        hvd_cache_erase(cache, s);
    }

    /* 2. Negotiation through rank 0. */
    if (gather) {
        uint8_t *buf;
        size_t len;
        double tnow = (double)hvd_now_ns() / 1e9;

        if (eng->rank == 0) {
            st = pack_requests(eng, &buf, &len);
            if (st == HVD_OK)
                st = coord_take(eng, 0, buf, len, tnow);
            for (int r = 1; r < eng->size && st == HVD_OK; r++) {
                st = recv_msg(eng, r, MSG_REQUESTS, &len, 1);
                if (st == HVD_OK)
                    st = coord_take(eng, r, eng->body, len, tnow);
            }
            if (st == HVD_OK)
                st = hvd_coord_collect(eng->coord, tnow, &built);
            if (st == HVD_OK) {
                len = hvd__engine__response_list__get_packed_size(&built);
                st = body_room(eng, len ? len : 1);
                if (st == HVD_OK)
                    hvd__engine__response_list__pack(&built, eng->body);
                for (int r = 1; r < eng->size && st == HVD_OK; r++)
                    st = send_msg(eng, r, MSG_RESPONSES, eng->body, len);
            }
            got = &built;
        } else {
            st = pack_requests(eng, &buf, &len);
            if (st == HVD_OK)
                st = send_msg(eng, 0, MSG_REQUESTS, buf, len);
            if (st == HVD_OK)
                st = recv_msg(eng, 0, MSG_RESPONSES, &len, 1);
            if (st == HVD_OK) {
                got = hvd__engine__response_list__unpack(NULL, len, eng->body);
                if (got == NULL)
                    st = hvd_error_set(HVD_ERR_TRANSPORT,
                                       "malformed response list from rank 0");
            }
        }
        if (st != HVD_OK)
            goto out;
        st = resps_room(eng, nresp + got->n_responses);
        if (st != HVD_OK)
            goto out;
        for (size_t i = 0; i < got->n_responses; i++) {
            const Hvd__Engine__Response *g = got->responses[i];
            resp *r = &eng->resps[nresp++];
            memset(r, 0, sizeof(*r));
            r->name = g->name;
            r->desc.kind = (hvd_kind)g->kind;
            r->desc.dtype = (hvd_dtype)g->dtype;
            r->desc.op = (hvd_op)g->op;
            r->desc.root = g->root;
            r->desc.ncounts = g->n_counts;
            r->desc.counts = g->counts;
            r->status = (hvd_status)g->status;
            r->error = g->error;
            r->contributors = (int)g->contributors;
            r->last_joined = g->last_joined;
            r->self_joined = in_list(g->joined, g->n_joined, eng->rank);
            if (r->desc.kind >= HVD_KIND_COUNT || r->desc.ncounts < 1 ||
                !hvd_dtype_valid(r->desc.dtype) || !hvd_op_valid(r->desc.op)) {
                st = hvd_error_set(HVD_ERR_TRANSPORT,
                                   "malformed response '%s' from rank 0",
                                   r->name);
                goto out;
            }
            eng->n_negotiated++;
        }
    }

    /* 3. Run them, in the same order everywhere. */
    st = run_responses(eng, eng->resps, nresp);
    if (st != HVD_OK)
        goto out;

    /* The cache learns the negotiated operations, in order. */
    for (size_t i = 0; i < nresp; i++) {
        resp *r = &eng->resps[i];
        if (r->cached || r->status != HVD_OK || r->desc.kind == HVD_KIND_JOIN ||
            r->desc.kind == HVD_KIND_CALL || r->contributors != eng->size)
            continue;
        if (eng->cache.capacity > 0 &&
            hvd_cache_put(cache, r->name, &r->desc, eng->cycle) < 0) {
            st = hvd_error_set(HVD_ERR_NO_MEMORY,
                               "out of memory in the response cache");
            goto out;
        }
    }
    HVD_DEBUG("engine", "cycle %llu: %d cached, %d negotiated, %d collectives",
              (unsigned long long)eng->cycle, eng->n_cached, eng->n_negotiated,
              eng->n_collectives);
    hvd_timeline_flush(eng->timeline);
out:
    if (eng->rank == 0)
        hvd_coord_free_responses(&built);
    else if (got != NULL)
        hvd__engine__response_list__free_unpacked(got, NULL);
    return st;
}

/* ------------------------------------------------------------------ */
/* The thread                                                          */

/* How long the idle engine may wait (ms) before a timer needs it. */
static int idle_timeout_ms(hvd_engine *eng, int64_t now) {
    int64_t next = now + (int64_t)IDLE_WAIT_MS * 1000000;

    if (eng->cfg.stall_check_s > 0) {
        int64_t limit = (int64_t)(eng->cfg.stall_check_s * NS_PER_S / 2);
        for (int i = 0; i < eng->npending; i++)
            if (eng->pending[i]->state == REQ_CACHED &&
                eng->pending[i]->t_submit + limit + 1 < next)
                next = eng->pending[i]->t_submit + limit + 1;
    }
    if (eng->rank == 0) {
        double dl = hvd_coord_next_deadline(eng->coord);
        if (dl >= 0 && (int64_t)(dl * NS_PER_S) < next)
            next = (int64_t)(dl * NS_PER_S);
    }
    int64_t ms = (next - now + 999999) / 1000000;
    return ms < 0 ? 0 : (int)ms;
}

/* Waits for work, a message or a timer. */
static hvd_status idle_wait(hvd_engine *eng, int timeout_ms) {
    if (eng->tp != NULL)
        return eng->tp->ops->progress(eng->tp, timeout_ms);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&lock);
    if (eng->queue_head == NULL && !eng->stop_requested)
        pthread_cond_timedwait(&cond, &lock, &ts);
    pthread_mutex_unlock(&lock);
    return HVD_OK;
}

/* Batching window: gives other threads HVD_CYCLE_TIME_MS to add work. */
static void batch_window(hvd_engine *eng) {
    int64_t end = hvd_now_ns() + (int64_t)eng->cfg.cycle_time_ms * 1000000;
    int stop;

    while (eng->cfg.cycle_time_ms > 0) {
        int64_t left = end - hvd_now_ns();
        if (left <= 0)
            break;
        if (idle_wait(eng, (int)((left + 999999) / 1000000)) != HVD_OK)
            break;
        intake(eng, &stop);
    }
}

/* Rank 0, idle: which ranks rang since the last cycle. */
static hvd_status check_doorbells(hvd_engine *eng, int *rung) {
    *rung = 0;
    for (int r = 1; r < eng->size; r++) {
        ctrl_port *p = &eng->ports[r];
        if (!p->req.done)
            continue;
        if (p->req.status != HVD_OK)
            return hvd_comm_wait(eng->ctrl, &p->req);
        if (p->hdr.type != MSG_DOORBELL)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "control message %u from rank %d between "
                                 "cycles",
                                 p->hdr.type, r);
        /* A doorbell rung before that rank saw the last cycle begin was
         * covered by it. */
        if (p->hdr.cycle == (uint32_t)eng->cycle)
            *rung = 1;
        hvd_status st = post_header(eng, r);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

/*
 * Every rank has stopped: the header receives still posted are completed
 * by a last STOP message each way, so nothing is in flight when the
 * transport says goodbye.
 */
static hvd_status close_ports(hvd_engine *eng) {
    hvd_status st = HVD_OK;
    size_t len;

    if (eng->size == 1)
        return HVD_OK;
    if (eng->rank == 0) {
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            st = send_msg(eng, r, MSG_STOP, NULL, 0);
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            st = recv_msg(eng, r, MSG_STOP, &len, 0);
    } else {
        st = send_msg(eng, 0, MSG_STOP, NULL, 0);
        if (st == HVD_OK)
            st = recv_msg(eng, 0, MSG_STOP, &len, 0);
    }
    return st;
}

static hvd_status engine_loop(hvd_engine *eng) {
    hvd_status st;
    int stop = 0, all_stop = 0;

    if (eng->size > 1) {
        for (int r = 0; r < eng->size; r++) {
            if ((eng->rank == 0) == (r == 0))
                continue;
            st = post_header(eng, r);
            if (st != HVD_OK)
                return st;
        }
    }
    for (;;) {
        int begin = 0;

        intake(eng, &stop);
        if (stop && eng->stop_deadline == 0)
            eng->stop_deadline = hvd_now_ns() + eng->cfg.timeout_ns;
        if (stop && hvd_now_ns() > eng->stop_deadline)
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "rank %d: not every rank called hvd_shutdown "
                                 "within %.0f s; leaving without them",
                                 eng->rank, (double)eng->cfg.timeout_ns / 1e9);
        int news = has_news(eng, stop);

        if (eng->rank == 0) {
            int rung = 0;
            if (eng->size > 1) {
                st = check_doorbells(eng, &rung);
                if (st != HVD_OK)
                    return st;
            }
            double dl = hvd_coord_next_deadline(eng->coord);
            int due = dl >= 0 && dl * NS_PER_S <= (double)hvd_now_ns();
            begin = news || rung || due;
            if (begin) {
                if (news)
                    batch_window(eng);
                eng->cycle++;
                for (int r = 1; r < eng->size; r++) {
                    msg_header h = {.type = MSG_START,
                                    .cycle = (uint32_t)eng->cycle};
                    hvd_req req;
                    st = hvd_comm_isend(eng->ctrl, r, &h, sizeof(h), &req);
                    if (st == HVD_OK)
                        st = hvd_comm_wait(eng->ctrl, &req);
                    if (st != HVD_OK)
                        return st;
                }
            }
        } else {
            ctrl_port *p = &eng->ports[0];
            if (news && !eng->rang) {
                st = send_msg(eng, 0, MSG_DOORBELL, NULL, 0);
                if (st != HVD_OK)
                    return st;
                eng->rang = 1;
            }
            if (p->req.done) {
                if (p->req.status != HVD_OK)
                    return hvd_comm_wait(eng->ctrl, &p->req);
                if (p->hdr.type != MSG_START)
                    return hvd_error_set(HVD_ERR_INTERNAL,
                                         "control message %u from rank 0 "
                                         "between cycles",
                                         p->hdr.type);
                eng->cycle = p->hdr.cycle;
                st = post_header(eng, 0);
                if (st != HVD_OK)
                    return st;
                eng->rang = 0;
                begin = 1;
            }
        }
        if (begin) {
            /* Anything that arrived meanwhile rides in this cycle. */
            intake(eng, &stop);
            st = run_cycle(eng, stop, &all_stop);
            if (st != HVD_OK)
                return st;
            if (all_stop)
                return close_ports(eng);
            continue;
        }
        st = idle_wait(eng, idle_timeout_ms(eng, hvd_now_ns()));
        if (st != HVD_OK)
            return st;
    }
}

static void *engine_main(void *arg) {
    hvd_engine *eng = arg;
    hvd_status st;

    hvd_log_set_rank(eng->rank);
    st = engine_loop(eng);
    if (st != HVD_OK) {
        engine_fail(eng, st);
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        fail_all(eng, st, text);
    } else {
        char text[160];
        snprintf(text, sizeof(text),
                 "hvd shut down on rank %d before this operation ran",
                 eng->rank);
        fail_all(eng, HVD_ERR_SHUTDOWN, text);
    }
    pthread_mutex_lock(&lock);
    eng->finished = 1;
    eng->stop_status = st;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Start and stop                                                      */

static void engine_free(hvd_engine *eng) {
    hvd_comm_destroy(eng->data);
    hvd_comm_destroy(eng->ctrl);
    hvd_cache_destroy(&eng->cache);
    hvd_coord_destroy(eng->coord);
    hvd_namemap_destroy(&eng->inflight);
    hvd_namemap_destroy(&eng->by_name);
    hvd_timeline_close(eng->timeline);
    free(eng->pending);
    free(eng->doorbell);
    free(eng->ports);
    free(eng->vote);
    free(eng->body);
    free(eng->resps);
    free(eng->fusion);
    free(eng);
}

hvd_status hvd_engine_start(int rank, int size, hvd_transport *tp,
                            const hvd_comm_config *comm_cfg,
                            const hvd_engine_config *cfg, hvd_engine **out) {
    hvd_engine *eng = calloc(1, sizeof(*eng));
    hvd_status st;

    if (eng == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    eng->rank = rank;
    eng->size = size;
    eng->tp = tp;
    eng->cfg = *cfg;
    hvd_namemap_init(&eng->inflight);
    hvd_namemap_init(&eng->by_name);
    st =
        hvd_comm_create(rank, size, tp, HVD_CHANNEL_DATA, comm_cfg, &eng->data);
    if (st == HVD_OK)
        st = hvd_comm_create(rank, size, tp, HVD_CHANNEL_CONTROL, comm_cfg,
                             &eng->ctrl);
    if (st != HVD_OK)
        goto fail;
    if (hvd_cache_init(&eng->cache, cfg->cache_capacity) != 0) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    eng->ports = calloc((size_t)size, sizeof(*eng->ports));
    if (eng->ports == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    if (rank == 0) {
        st = hvd_coord_create(size, cfg->stall_check_s, cfg->stall_shutdown_s,
                              &eng->coord);
        if (st != HVD_OK)
            goto fail;
        if (cfg->timeline_path != NULL && cfg->timeline_path[0] != '\0') {
            st = hvd_timeline_open(cfg->timeline_path, &eng->timeline);
            if (st != HVD_OK)
                goto fail;
        }
    }
    if (pthread_create(&eng->thread, NULL, engine_main, eng) != 0) {
        st = hvd_error_set(HVD_ERR_INTERNAL, "pthread_create failed: %s",
                           strerror(errno));
        goto fail;
    }
    eng->thread_started = 1;
    *out = eng;
    return HVD_OK;
fail:
    engine_free(eng);
    return st;
}

hvd_status hvd_engine_stop(hvd_engine *eng) {
    hvd_status st;

    pthread_mutex_lock(&lock);
    eng->stop_requested = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    if (eng->tp != NULL)
        eng->tp->ops->wake(eng->tp);
    if (eng->thread_started)
        pthread_join(eng->thread, NULL);
    st = eng->stop_status;
    if (st != HVD_OK)
        hvd_error_copy(st, eng->failed != HVD_OK ? eng->failmsg : "");
    engine_free(eng);
    return st;
}
