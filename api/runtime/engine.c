#include "api/runtime/engine.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/cache.h"
#include "api/runtime/coordinator.h"
#include "api/runtime/ctrlmsg.h"
#include "api/runtime/engine.pb-c.h"
#include "api/runtime/namemap.h"
#include "api/runtime/timeline.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/grow.h"
#include "transport/base/log.h"

#define NS_PER_S 1000000000LL
/* The longest an idle engine waits before looking at its timers again. */
#define IDLE_WAIT_MS 1000
/*
 * Rank 0 holds small operations every rank has ready for at most
 * FUSION_WAIT_S while others are ready on some ranks only and votes keep
 * coming (none for FUSION_QUIET_S ends the wait), so that a burst of
 * gradients fuses instead of taking one cycle each.
 */
#define FUSION_WAIT_S 0.002
#define FUSION_QUIET_S 0.0002

/*
 * Control messages travel on the control channel as a 16-byte header and,
 * if len > 0, a body of len bytes as a second message. Rank 0 always has
 * one header receive posted from every other rank, and every other rank
 * one from rank 0.
 */
enum {
    MSG_UPDATE = 1, /* rank -> 0: Update, whenever its state changes */
    MSG_CYCLE = 2,  /* 0 -> rank: Cycle */
    MSG_STOP = 3,   /* both ways, after the last cycle */
};

typedef struct msg_header {
    uint32_t type;
    uint32_t reserved;
    uint64_t len;
} msg_header;

_Static_assert(sizeof(msg_header) == 16, "the control header is 16 bytes");

/* Request states, engine-private. */
enum {
    REQ_NEW = 0, /* rank 0 has not heard of it */
    REQ_CACHED,  /* bound to cache slot `slot`: voted for, not negotiated */
    REQ_SENT,    /* the coordinator has it */
};

/* While device operations are in flight the idle engine looks at the GPU
 * (NCCL's asynchronous errors) at least this often; a host callback wakes
 * it as soon as one finishes. */
#define DEV_POLL_MS 100

/* A request whose device work is queued: done when fence seq is. */
typedef struct devwait {
    hvd_request *req;
    uint64_t seq;
} devwait;

/* One header receive per peer. */
typedef struct ctrl_port {
    msg_header hdr;
    hvd_req req;
} ctrl_port;

/* A response of the current cycle, pointing into the cache or into the
 * cycle's message; nothing is copied. */
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

/*
 * Rank 0's view of the votes: which ranks have a request ready for each
 * cache slot. A slot every rank votes for runs in the next cycle.
 */
typedef struct vote_table {
    int capacity;
    uint8_t *votes;     /* [rank * capacity + slot] */
    int *count;         /* ranks voting per slot */
    double *first;      /* when the first vote came (s) */
    double *warned;     /* when the stall inspector last warned */
    double small_since; /* small ready operations wait since (0: none) */
    double last_vote;   /* when a vote last changed */
    uint64_t *changed;  /* last cycle that ran, erased or reused it */
    uint8_t *erase;     /* invalidated by some rank: erase next cycle */
    uint8_t *stop;      /* per rank: it has called hvd_shutdown */
} vote_table;

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
    int stop_seen;     /* the engine thread has taken stop_requested in */
    int finished;      /* the thread has left its loop */
    hvd_status failed; /* HVD_OK while healthy */
    char failmsg[HVD_ERROR_MAX];
    hvd_status stop_status;

    /* The engine thread's own. */
    hvd_request **pending; /* submitted, not finished */
    int npending, cappending;
    hvd_namemap by_name; /* pending by name */
    hvd_cache cache;
    uint64_t cycle;  /* the last cycle run */
    int paused;      /* a rank is joined: no cache path */
    int stop_told;   /* rank 0 knows this rank stops */
    uint32_t *inval; /* slots to tell rank 0 about */
    int ninval;
    ctrl_port *ports; /* rank 0: one per rank; others: [0] from rank 0 */
    uint8_t *body;
    size_t body_cap;
    resp *resps;
    size_t resps_cap;
    void *fusion;
    size_t fusion_cap;
    hvd_timeline *timeline;
    int mark_cycles; /* CYCLE_START marks in the timeline */
    /* A timeline to switch to (hvd_engine_set_timeline), under the lock. */
    hvd_timeline *tl_next;
    int tl_next_marks;
    int tl_swap;
    int64_t stop_deadline;
    /* Rank 0. */
    hvd_coord *coord;
    vote_table vt;
    /* Counters for the debug log. */
    int n_cached, n_negotiated, n_collectives;
    /* Device tensors (api/runtime/devexec.h). */
    hvd_devexec *dev;
    devwait *devq; /* a ring, in fence order */
    size_t devq_head, devq_n, devq_cap;
    hvd_dev_tensor *dtens;
    size_t dtens_cap;
    int gpu_woken; /* under lock: a fence was reached (job of one) */
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

/* Takes req off the engine thread's books: it has run (engine thread). */
static void retire(hvd_engine *eng, hvd_request *req) {
    for (int i = 0; i < eng->npending; i++) {
        if (eng->pending[i] == req) {
            eng->pending[i] = eng->pending[--eng->npending];
            break;
        }
    }
    hvd_namemap_remove(&eng->by_name, req->name);
}

/* Runs req's completion function, if it has one, and frees req: nobody
 * waits for it (outside the lock). */
static void call_back(hvd_request *req) {
    req->on_done(
        req->status,
        req->status != HVD_OK
            ? (req->error != NULL ? req->error : hvd_strerror(req->status))
            : NULL,
        req->on_done_arg);
    hvd_request_free(req);
}

/* Tells req's waiter the outcome (engine thread). */
static void finish(hvd_engine *eng, hvd_request *req, hvd_status status,
                   const char *error) {
    int called_back;

    pthread_mutex_lock(&lock);
    req->status = status;
    if (status != HVD_OK)
        req->error = strdup(error != NULL ? error : hvd_strerror(status));
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    hvd_namemap_remove(&eng->inflight, req->name);
    called_back = req->on_done != NULL;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    if (called_back)
        call_back(req);
}

/* Finishes req (engine thread). */
static void complete(hvd_engine *eng, hvd_request *req, hvd_status status,
                     const char *error) {
    retire(eng, req);
    finish(eng, req, status, error);
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
        finish(eng, queued, status, text);
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

/* Takes a timeline handed over by hvd_engine_set_timeline (engine thread,
 * rank 0): the old one is closed, a valid file. */
static void swap_timeline(hvd_engine *eng) {
    hvd_timeline *next;
    int swap, marks;

    /* Every loop of the engine asks: without the lock while nothing came. */
    if (!__atomic_load_n(&eng->tl_swap, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&lock);
    swap = eng->tl_swap;
    next = eng->tl_next;
    marks = eng->tl_next_marks;
    __atomic_store_n(&eng->tl_swap, 0, __ATOMIC_RELEASE);
    eng->tl_next = NULL;
    pthread_mutex_unlock(&lock);
    if (!swap)
        return;
    hvd_timeline_close(eng->timeline);
    eng->timeline = next;
    eng->mark_cycles = next != NULL && marks;
}

void hvd_engine_set_timeline(hvd_engine *eng, hvd_timeline *tl,
                             int mark_cycles) {
    hvd_timeline *replaced = NULL;

    pthread_mutex_lock(&lock);
    if (eng->tl_swap)
        replaced = eng->tl_next; /* never taken: nothing was written */
    eng->tl_next = tl;
    eng->tl_next_marks = mark_cycles;
    __atomic_store_n(&eng->tl_swap, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    hvd_timeline_close(replaced);
    if (eng->tp != NULL)
        eng->tp->ops->wake(eng->tp);
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

/* How long hvd_engine_wait looks at a request before it sleeps: a small
 * operation is often done sooner than a sleeping thread would wake. */
#define WAIT_SPIN_NS (50 * 1000LL)

hvd_status hvd_engine_wait(hvd_request *req, int *last_rank_out) {
    hvd_status st;
    int64_t spin_end = hvd_now_ns() + WAIT_SPIN_NS;

    /* Yield while looking, so an engine thread that shares the core runs. */
    while (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) &&
           hvd_now_ns() < spin_end)
        sched_yield();
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

void hvd_engine_on_done(hvd_request *req,
                        void (*fn)(hvd_status, const char *, void *),
                        void *arg) {
    int done;

    pthread_mutex_lock(&lock);
    req->on_done_arg = arg;
    req->on_done = fn;
    done = req->done;
    pthread_mutex_unlock(&lock);
    if (done)
        call_back(req);
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

    return hvd_comm_irecv(eng->ctrl, peer, &p->hdr, sizeof(p->hdr), &p->req);
}

/* Sends a header and its body, and waits until both are out. */
static hvd_status send_msg(hvd_engine *eng, int peer, uint32_t type,
                           const void *body, size_t len) {
    msg_header hdr = {.type = type, .len = len};
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
        size_t cap = hvd_grow_cap(len, 0);
        void *p = realloc(eng->body, cap);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        eng->body = p;
        eng->body_cap = cap;
    }
    return HVD_OK;
}

/*
 * Waits for the header receive from peer, checks it, receives the body
 * into eng->body (it follows at once) and posts the next header receive,
 * unless this was the peer's last message (STOP). *type_out and *len_out
 * describe the message.
 */
static hvd_status take_msg(hvd_engine *eng, int peer, uint32_t *type_out,
                           size_t *len_out) {
    ctrl_port *p = &eng->ports[eng->rank == 0 ? peer : 0];
    msg_header hdr;
    hvd_status st = hvd_comm_wait(eng->ctrl, &p->req);

    if (st != HVD_OK)
        return st;
    hdr = p->hdr;
    if (hdr.type < MSG_UPDATE || hdr.type > MSG_STOP ||
        hdr.len > ((uint64_t)1 << 32))
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "malformed control message (type %u, %llu "
                             "bytes) from rank %d",
                             hdr.type, (unsigned long long)hdr.len, peer);
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
    *type_out = hdr.type;
    *len_out = hdr.len;
    return hdr.type == MSG_STOP ? HVD_OK : post_header(eng, peer);
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

static int invalidate(hvd_engine *eng, int slot) {
    for (int i = 0; i < eng->ninval; i++)
        if (eng->inval[i] == (uint32_t)slot)
            return 0;
    if (eng->ninval == eng->cache.capacity)
        return 0; /* cannot happen: one entry per slot */
    eng->inval[eng->ninval++] = (uint32_t)slot;
    return 1;
}

/*
 * Binds a request rank 0 has not heard of to its cache slot if the cache
 * holds the same operation; a cached name with other values makes this
 * rank ask every rank to drop that slot.
 */
static void classify(hvd_engine *eng, hvd_request *req) {
    int slot;

    if (req->state != REQ_NEW || req->desc.kind == HVD_KIND_JOIN ||
        req->desc.kind == HVD_KIND_CALL || eng->paused)
        return;
    slot = hvd_cache_lookup(&eng->cache, req->name);
    if (slot < 0)
        return;
    if (hvd_opdesc_equal(&eng->cache.slots[slot].desc, &req->desc)) {
        req->state = REQ_CACHED;
        req->slot = slot;
        req->voted = 0;
    } else {
        invalidate(eng, slot);
    }
}

static const char *negotiate_event(hvd_kind kind) {
    switch (kind) {
    case HVD_KIND_ALLREDUCE:
        return "NEGOTIATE_ALLREDUCE";
    case HVD_KIND_BROADCAST:
        return "NEGOTIATE_BROADCAST";
    case HVD_KIND_ALLGATHER:
        return "NEGOTIATE_ALLGATHER";
    default:
        return "NEGOTIATE";
    }
}

/* Takes what the submitters queued; *stop says whether to stop. */
static void intake(hvd_engine *eng, int *stop) {
    hvd_request *q;

    pthread_mutex_lock(&lock);
    q = eng->queue_head;
    eng->queue_head = eng->queue_tail = NULL;
    *stop = eng->stop_requested;
    eng->stop_seen = eng->stop_requested;
    pthread_mutex_unlock(&lock);
    while (q != NULL) {
        hvd_request *next = q->next;
        q->next = NULL;
        if (pending_push(eng, q) != 0) {
            complete(eng, q, HVD_ERR_NO_MEMORY, "out of memory");
        } else {
            classify(eng, q);
            hvd_timeline_begin(eng->timeline, q->name,
                               negotiate_event(q->desc.kind), q->t_submit,
                               q->state == REQ_CACHED ? "\"cached\": true"
                                                      : "\"cached\": false");
        }
        q = next;
    }
}

/* 1 if rank 0 does not know all of this rank's state yet. */
static int has_news(const hvd_engine *eng, int stop) {
    if ((stop && !eng->stop_told) || eng->ninval > 0)
        return 1;
    for (int i = 0; i < eng->npending; i++) {
        const hvd_request *req = eng->pending[i];
        if (req->state == REQ_NEW || (req->state == REQ_CACHED && !req->voted))
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Running responses                                                   */

static hvd_status fusion_room(hvd_engine *eng, size_t bytes) {
    if (bytes > eng->fusion_cap) {
        size_t cap = hvd_grow_cap(bytes, eng->cfg.fusion_threshold);
        void *p = malloc(cap);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory for a %zu-byte fusion buffer",
                                 cap);
        free(eng->fusion);
        eng->fusion = p;
        eng->fusion_cap = cap;
    }
    return HVD_OK;
}

/* Now, if a timeline is written (clock reads cost nothing otherwise). */
static int64_t stamp(const hvd_engine *eng) {
    return eng->timeline != NULL ? hvd_now_ns() : 0;
}

/* Timeline args of a collective: where it runs and how (the selector's
 * plan for it, which is what hvd_coll_* then runs). */
static void collective_args(hvd_engine *eng, char *out, size_t outlen,
                            hvd_coll_kind kind, hvd_dtype dtype, int ntensors,
                            size_t bytes) {
    hvd_plan plan;

    hvd_coll_plan(eng->data, kind, bytes, dtype, &plan);
    snprintf(out, outlen,
             "\"transport\": \"%s\", \"algorithm\": \"%s\", "
             "\"chunk\": %zu, \"tensors\": %d, \"bytes\": %zu",
             hvd_plan_transport(&plan),
             plan.algo == HVD_ALGO_AUTO ? "local" : hvd_algo_name(plan.algo),
             plan.chunk, ntensors, bytes);
}

/* ------------------------------------------------------------------ */
/* Device tensors (api/runtime/devexec.h) */

/* A fence may have been reached: wakes the engine (any thread; a CUDA
 * host callback). */
static void dev_wake(void *arg) {
    hvd_engine *eng = arg;

    if (eng->tp != NULL) {
        eng->tp->ops->wake(eng->tp);
        return;
    }
    pthread_mutex_lock(&lock);
    eng->gpu_woken = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

static hvd_status devq_push(hvd_engine *eng, hvd_request *req, uint64_t seq) {
    if (eng->devq_n == eng->devq_cap) {
        size_t cap = eng->devq_cap ? 2 * eng->devq_cap : 64;
        devwait *q = malloc(cap * sizeof(*q));
        if (q == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        for (size_t i = 0; i < eng->devq_n; i++)
            q[i] = eng->devq[(eng->devq_head + i) % eng->devq_cap];
        free(eng->devq);
        eng->devq = q;
        eng->devq_cap = cap;
        eng->devq_head = 0;
    }
    eng->devq[(eng->devq_head + eng->devq_n) % eng->devq_cap] =
        (devwait){.req = req, .seq = seq};
    eng->devq_n++;
    return HVD_OK;
}

/* Completes the device requests whose fence the GPU has reached. */
static hvd_status dev_reap(hvd_engine *eng) {
    uint64_t done;
    hvd_status st;
    int64_t t;

    if (eng->devq_n == 0)
        return HVD_OK;
    st = hvd_devexec_poll(eng->dev, &done);
    if (st != HVD_OK)
        return st;
    t = stamp(eng);
    while (eng->devq_n > 0 && eng->devq[eng->devq_head].seq <= done) {
        hvd_request *req = eng->devq[eng->devq_head].req;
        eng->devq_head = (eng->devq_head + 1) % eng->devq_cap;
        eng->devq_n--;
        hvd_timeline_end(eng->timeline, req->name, t);
        finish(eng, req, HVD_OK, NULL);
    }
    return HVD_OK;
}

/* 1 if dev_reap has something to do (or an error to report). */
static int dev_ready(hvd_engine *eng) {
    uint64_t done;

    if (eng->devq_n == 0)
        return 0;
    return hvd_devexec_poll(eng->dev, &done) != HVD_OK ||
           done >= eng->devq[eng->devq_head].seq;
}

/* At the end: waits (bounded) for the device work still in flight. */
static hvd_status dev_drain(hvd_engine *eng) {
    int64_t deadline = hvd_now_ns() + eng->cfg.timeout_ns;

    for (;;) {
        hvd_status st = dev_reap(eng);
        if (st != HVD_OK || eng->devq_n == 0)
            return st;
        if (hvd_now_ns() > deadline)
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "rank %d: the GPU did not finish '%s' "
                                 "within %.0f s of shutdown",
                                 eng->rank, eng->devq[eng->devq_head].req->name,
                                 (double)eng->cfg.timeout_ns / 1e9);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The job failed: so do the device requests in flight. */
static void dev_fail_all(hvd_engine *eng, hvd_status status, const char *text) {
    while (eng->devq_n > 0) {
        hvd_request *req = eng->devq[eng->devq_head].req;
        eng->devq_head = (eng->devq_head + 1) % eng->devq_cap;
        eng->devq_n--;
        finish(eng, req, status, text);
    }
}

/*
 * After a device operation was handed to the GPU (st == HVD_OK, fence
 * seq) or was refused: reqs (NULL entries: joined) then wait for the fence,
 * or fail alike on every rank when the GPU cannot be used (not fatal).
 */
static hvd_status dev_handed(hvd_engine *eng, hvd_request **reqs, size_t n,
                             hvd_status st, int fatal, uint64_t seq,
                             const char *event, int64_t t, int ntensors,
                             size_t bytes) {
    char args[256], text[HVD_ERROR_MAX];

    eng->n_collectives++;
    if (st != HVD_OK && fatal)
        return st;
    if (st != HVD_OK) {
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        for (size_t i = 0; i < n; i++)
            if (reqs[i] != NULL)
                complete(eng, reqs[i], st, text);
        return HVD_OK;
    }
    snprintf(args, sizeof(args),
             "\"transport\": \"%s\", \"memory\": \"device\", "
             "\"tensors\": %d, \"bytes\": %zu",
             hvd_devexec_path(eng->dev), ntensors, bytes);
    for (size_t i = 0; i < n; i++) {
        if (reqs[i] == NULL)
            continue;
        hvd_timeline_begin(eng->timeline, reqs[i]->name, event, t, args);
        retire(eng, reqs[i]);
        st = devq_push(eng, reqs[i], seq);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

/* Allreduces resps[first, last) of device tensors (one collective). */
static hvd_status run_device_allreduce(hvd_engine *eng, resp *rs, size_t first,
                                       size_t last) {
    const resp *r0 = &rs[first];
    size_t n = 0, k = 0, total = 0, nreq = last - first;
    hvd_request **reqs;
    uint64_t seq = 0;
    int fatal = 1;
    int64_t t = stamp(eng);
    hvd_status st;

    for (size_t i = first; i < last; i++) {
        n += rs[i].desc.ncounts;
        total += (size_t)hvd_opdesc_total(&rs[i].desc);
    }
    /* The tensors, then the requests after them in the same array. */
    size_t need = n * sizeof(hvd_dev_tensor) + nreq * sizeof(hvd_request *);
    if (need > eng->dtens_cap * sizeof(hvd_dev_tensor)) {
        size_t cap = need / sizeof(hvd_dev_tensor) + 1;
        hvd_dev_tensor *p = realloc(eng->dtens, cap * sizeof(*p));
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        eng->dtens = p;
        eng->dtens_cap = cap;
    }
    reqs = (hvd_request **)(void *)(eng->dtens + n);
    for (size_t i = first; i < last; i++) {
        hvd_request *req = rs[i].self_joined
                               ? NULL
                               : hvd_namemap_get(&eng->by_name, rs[i].name);
        if (!rs[i].self_joined && req == NULL)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "rank %d has no request '%s' to run",
                                 eng->rank, rs[i].name);
        reqs[i - first] = req;
        for (size_t c = 0; c < rs[i].desc.ncounts; c++)
            eng->dtens[k++] =
                (hvd_dev_tensor){.send = req != NULL ? req->send[c] : NULL,
                                 .recv = req != NULL ? req->recv[c] : NULL,
                                 .count = rs[i].desc.counts[c]};
    }
    st = hvd_devexec_allreduce(eng->dev, eng->dtens, n, r0->desc.dtype,
                               r0->desc.op, r0->contributors, &seq, &fatal);
    return dev_handed(eng, reqs, nreq, st, fatal, seq, "ALLREDUCE", t, (int)n,
                      total * hvd_dtype_size(r0->desc.dtype));
}

/* A broadcast or allgather of device tensors. */
static hvd_status run_device_other(hvd_engine *eng, const resp *r,
                                   hvd_request *req) {
    uint64_t seq = 0;
    int fatal = 1;
    int64_t t = stamp(eng);
    hvd_status st;

    if (r->desc.kind == HVD_KIND_BROADCAST)
        st = hvd_devexec_broadcast(eng->dev, req->recv[0], req->counts[0],
                                   r->desc.dtype, r->desc.root, &seq, &fatal);
    else
        st = hvd_devexec_allgather(eng->dev, req->send[0], req->recv[0],
                                   req->counts[0], r->desc.dtype, &seq, &fatal);
    return dev_handed(
        eng, &req, 1, st, fatal, seq,
        r->desc.kind == HVD_KIND_BROADCAST ? "BROADCAST" : "ALLGATHER", t, 1,
        (size_t)req->counts[0] * hvd_dtype_size(r->desc.dtype));
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
    if (r0->desc.mem == HVD_MEM_DEVICE)
        return run_device_allreduce(eng, rs, first, last);

    /* The path is the selector's choice for this size (what the timeline
     * shows before the collective runs). */
    collective_args(eng, args, sizeof(args), HVD_COLL_ALLREDUCE, dtype,
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
                           stamp(eng), NULL);
        for (size_t k = 0; k < rs[i].desc.ncounts; k++) {
            size_t n = (size_t)rs[i].desc.counts[k];
            if (req == NULL)
                hvd_reduce_fill_neutral(fb + off, n, dtype, op);
            else if (n > 0)
                memcpy(fb + off, req->send[k], n * esize);
            off += n * esize;
        }
        hvd_timeline_end(eng->timeline, rs[i].name, stamp(eng));
    }
    t = stamp(eng);
    for (size_t i = first; i < last; i++)
        hvd_timeline_begin(eng->timeline, rs[i].name, "ALLREDUCE", t, args);
    st = hvd_coll_allreduce(eng->data, fb, fb, total, dtype, op);
    if (st == HVD_OK && average_here)
        hvd_reduce_scale_div(fb, total, dtype, r0->contributors);
    eng->n_collectives++;
    t = stamp(eng);
    for (size_t i = first; i < last; i++)
        hvd_timeline_end(eng->timeline, rs[i].name, t);
    if (st != HVD_OK)
        return st;
    off = 0;
    for (size_t i = first; i < last; i++) {
        hvd_request *req = rs[i].self_joined
                               ? NULL
                               : hvd_namemap_get(&eng->by_name, rs[i].name);
        hvd_timeline_begin(eng->timeline, rs[i].name,
                           "MEMCPY_OUT_FUSION_BUFFER", stamp(eng), NULL);
        for (size_t k = 0; k < rs[i].desc.ncounts; k++) {
            size_t n = (size_t)rs[i].desc.counts[k];
            if (req != NULL && n > 0)
                memcpy(req->recv[k], fb + off, n * esize);
            off += n * esize;
        }
        hvd_timeline_end(eng->timeline, rs[i].name, stamp(eng));
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
    if (r->desc.mem == HVD_MEM_DEVICE && (r->desc.kind == HVD_KIND_BROADCAST ||
                                          r->desc.kind == HVD_KIND_ALLGATHER))
        return run_device_other(eng, r, req);
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
        size_t bytes = (size_t)req->counts[0] * hvd_dtype_size(r->desc.dtype);
        int bc = r->desc.kind == HVD_KIND_BROADCAST;
        collective_args(eng, args, sizeof(args),
                        bc ? HVD_COLL_BROADCAST : HVD_COLL_ALLGATHER,
                        r->desc.dtype, 1,
                        bc ? bytes : bytes * (size_t)eng->size);
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
           b->desc.mem == a->desc.mem && b->contributors == a->contributors &&
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
/* Rank 0: votes and decisions                                         */

static int vote_init(vote_table *vt, int size, int capacity) {
    memset(vt, 0, sizeof(*vt));
    vt->capacity = capacity;
    vt->stop = calloc((size_t)size, 1);
    if (vt->stop == NULL)
        return -1;
    if (capacity == 0)
        return 0;
    vt->votes = calloc((size_t)size * (size_t)capacity, 1);
    vt->count = calloc((size_t)capacity, sizeof(*vt->count));
    vt->first = calloc((size_t)capacity, sizeof(*vt->first));
    vt->warned = calloc((size_t)capacity, sizeof(*vt->warned));
    vt->changed = calloc((size_t)capacity, sizeof(*vt->changed));
    vt->erase = calloc((size_t)capacity, 1);
    return vt->votes && vt->count && vt->first && vt->warned && vt->changed &&
                   vt->erase
               ? 0
               : -1;
}

static void vote_free(vote_table *vt) {
    free(vt->votes);
    free(vt->count);
    free(vt->first);
    free(vt->warned);
    free(vt->changed);
    free(vt->erase);
    free(vt->stop);
}

static void vote_set(vote_table *vt, int rank, int slot, double now) {
    uint8_t *v = &vt->votes[(size_t)rank * (size_t)vt->capacity + (size_t)slot];

    if (*v)
        return;
    *v = 1;
    vt->last_vote = now;
    if (vt->count[slot]++ == 0) {
        vt->first[slot] = now;
        vt->warned[slot] = -1;
    }
}

/* Forgets every vote for slot: it ran, was erased or now names another
 * operation (from cycle on). */
static void vote_reset(vote_table *vt, int size, int slot, uint64_t cycle) {
    for (int r = 0; r < size; r++)
        vt->votes[(size_t)r * (size_t)vt->capacity + (size_t)slot] = 0;
    vt->count[slot] = 0;
    vt->erase[slot] = 0;
    vt->changed[slot] = cycle;
}

/* Forgets the votes for slot, nothing else. */
static void vote_clear(vote_table *vt, int size, int slot) {
    for (int r = 0; r < size; r++)
        vt->votes[(size_t)r * (size_t)vt->capacity + (size_t)slot] = 0;
    vt->count[slot] = 0;
}

/* Rank 0 records its own news as if it had sent itself an Update. */
static hvd_status local_update(hvd_engine *eng, int stop, double now) {
    vote_table *vt = &eng->vt;

    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->state == REQ_CACHED && !req->voted) {
            vote_set(vt, 0, req->slot, now);
            req->voted = 1;
        } else if (req->state == REQ_NEW) {
            hvd_status st =
                hvd_coord_add(eng->coord, 0, req->name, &req->desc, 0, now);
            if (st != HVD_OK)
                return st;
            req->state = REQ_SENT;
        }
    }
    for (int i = 0; i < eng->ninval; i++)
        vt->erase[eng->inval[i]] = 1;
    eng->ninval = 0;
    if (stop) {
        vt->stop[0] = 1;
        eng->stop_told = 1;
    }
    return HVD_OK;
}

/* Rank 0 takes another rank's Update. */
static hvd_status apply_update(hvd_engine *eng, int rank, const uint8_t *buf,
                               size_t len, double now) {
    vote_table *vt = &eng->vt;
    Hvd__Engine__Update *u = hvd__engine__update__unpack(NULL, len, buf);
    hvd_status st = HVD_OK;

    if (u == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT, "malformed update from rank %d",
                             rank);
    /* Its votes now: the slots it lists, unless the slot has run, been
     * erased or reused since the cycle it had seen (a vote sent while a
     * cycle was on its way). */
    for (int s = 0; s < vt->capacity; s++) {
        uint8_t *v =
            &vt->votes[(size_t)rank * (size_t)vt->capacity + (size_t)s];
        if (*v) {
            *v = 0;
            vt->count[s]--;
        }
    }
    for (size_t i = 0; i < u->n_ready; i++) {
        uint32_t s = u->ready[i];
        if (s < (uint32_t)vt->capacity && vt->changed[s] <= u->seen_cycle)
            vote_set(vt, rank, (int)s, now);
    }
    for (size_t i = 0; i < u->n_invalidate; i++)
        if (u->invalidate[i] < (uint32_t)vt->capacity)
            vt->erase[u->invalidate[i]] = 1;
    for (size_t i = 0; i < u->n_requests && st == HVD_OK; i++) {
        const Hvd__Engine__Request *it = u->requests[i];
        hvd_opdesc d;
        st = hvd_ctrl_check_request(it, eng->size, &d);
        if (st != HVD_OK)
            hvd_error_prefix("malformed update from rank %d: ", rank);
        else
            st = hvd_coord_add(eng->coord, rank, it->name, &d, it->age_s, now);
    }
    if (u->stop)
        vt->stop[rank] = 1;
    hvd__engine__update__free_unpacked(u, NULL);
    return st;
}

/* Rank 0 reads every Update that has arrived. */
static hvd_status read_updates(hvd_engine *eng, double now) {
    for (int r = 1; r < eng->size; r++) {
        while (eng->ports[r].req.done) {
            uint32_t type;
            size_t len;
            hvd_status st = take_msg(eng, r, &type, &len);
            if (st != HVD_OK)
                return st;
            if (type != MSG_UPDATE)
                return hvd_error_set(HVD_ERR_TRANSPORT,
                                     "control message %u from rank %d where "
                                     "an update was expected",
                                     type, r);
            st = apply_update(eng, r, eng->body, len, now);
            if (st != HVD_OK)
                return st;
        }
    }
    return HVD_OK;
}

/* "1,3" for the ranks that do (want = 1) or do not vote for slot. */
static void voters(const hvd_engine *eng, int slot, int want, char *out,
                   size_t outlen) {
    size_t off = 0;

    out[0] = '\0';
    for (int r = 0; r < eng->size && off + 16 < outlen; r++)
        if (eng->vt.votes[(size_t)r * (size_t)eng->vt.capacity +
                          (size_t)slot] == want)
            off += (size_t)snprintf(out + off, outlen - off, "%s%d",
                                    off ? "," : "", r);
}

/* When a cached operation some ranks wait for needs the stall inspector
 * (a time in seconds), or -1. */
static double vote_deadline(const hvd_engine *eng) {
    const vote_table *vt = &eng->vt;
    double next = -1;

    for (int s = 0; s < eng->cache.nslots; s++) {
        double t = -1;
        if (vt->count[s] == 0 || vt->count[s] == eng->size)
            continue;
        if (eng->cfg.stall_check_s > 0)
            t = (vt->warned[s] < 0 ? vt->first[s] : vt->warned[s]) +
                eng->cfg.stall_check_s;
        if (eng->cfg.stall_shutdown_s > 0) {
            double d = vt->first[s] + eng->cfg.stall_shutdown_s;
            if (t < 0 || d < t)
                t = d;
        }
        if (t >= 0 && (next < 0 || t < next))
            next = t;
    }
    return next;
}

static Hvd__Engine__Response *timeout_response(const hvd_cache_entry *e,
                                               const char *text) {
    Hvd__Engine__Response *r = malloc(sizeof(*r));

    if (r == NULL)
        return NULL;
    hvd__engine__response__init(r);
    r->kind = e->desc.kind;
    r->name = strdup(e->name);
    r->dtype = e->desc.dtype;
    r->op = e->desc.op;
    r->root = e->desc.root;
    r->mem = e->desc.mem;
    r->counts = malloc(e->desc.ncounts * sizeof(uint64_t));
    r->shape =
        malloc((e->desc.ndims ? (size_t)e->desc.ndims : 1) * sizeof(int64_t));
    r->status = HVD_ERR_TIMEOUT;
    r->error = strdup(text);
    r->last_joined = -1;
    if (r->name == NULL || r->counts == NULL || r->shape == NULL ||
        r->error == NULL) {
        hvd__engine__response__free_unpacked(r, NULL);
        return NULL;
    }
    r->n_counts = e->desc.ncounts;
    memcpy(r->counts, e->desc.counts, e->desc.ncounts * sizeof(uint64_t));
    r->n_shape = (size_t)e->desc.ndims;
    memcpy(r->shape, e->desc.dims, (size_t)e->desc.ndims * sizeof(int64_t));
    return r;
}

/*
 * The stall inspector for cached operations: some ranks have voted for a
 * slot, others not, for a long time. Warns, and with
 * HVD_STALL_SHUTDOWN_SECONDS adds a TIMEOUT response.
 */
static hvd_status vote_stalls(hvd_engine *eng, double now,
                              Hvd__Engine__ResponseList *list) {
    vote_table *vt = &eng->vt;

    for (int s = 0; s < eng->cache.nslots; s++) {
        char missing[128], have[128], text[HVD_ERROR_MAX];
        const hvd_cache_entry *e = &eng->cache.slots[s];
        double age;

        if (vt->count[s] == 0 || vt->count[s] == eng->size || e->name == NULL)
            continue;
        age = now - vt->first[s];
        voters(eng, s, 0, missing, sizeof(missing));
        voters(eng, s, 1, have, sizeof(have));
        if (eng->cfg.stall_shutdown_s > 0 && age >= eng->cfg.stall_shutdown_s) {
            snprintf(text, sizeof(text),
                     "'%s' waited %.0f s for rank(s) %s to submit it; "
                     "failing it (HVD_STALL_SHUTDOWN_SECONDS=%g)",
                     e->name, age, missing, eng->cfg.stall_shutdown_s);
            HVD_ERROR("engine", "%s", text);
            Hvd__Engine__Response *r = timeout_response(e, text);
            Hvd__Engine__Response **v =
                realloc(list->responses, (list->n_responses + 1) * sizeof(*v));
            if (r == NULL || v == NULL) {
                if (r != NULL)
                    hvd__engine__response__free_unpacked(r, NULL);
                if (v != NULL)
                    list->responses = v;
                return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
            }
            v[list->n_responses++] = r;
            list->responses = v;
            vote_clear(vt, eng->size, s);
        } else if (eng->cfg.stall_check_s > 0 &&
                   age >= eng->cfg.stall_check_s &&
                   (vt->warned[s] < 0 ||
                    now - vt->warned[s] >= eng->cfg.stall_check_s)) {
            HVD_WARN("engine",
                     "stall: '%s' waits %.0f s for rank(s) %s (submitted by "
                     "%s): a rank skipped it, submits it later, or runs "
                     "another branch",
                     e->name, age, missing, have);
            vt->warned[s] = now;
        }
    }
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* Every rank: a cycle                                                 */

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

/* A request bound to slot that no longer holds it goes back to rank 0's
 * table (via the next update). */
static void unbind(hvd_request *req) {
    req->state = REQ_NEW;
    req->slot = -1;
    req->voted = 0;
}

/* Runs cycle c; every rank runs every cycle, in number order. */
static hvd_status run_cycle(hvd_engine *eng, const Hvd__Engine__Cycle *c) {
    hvd_cache *cache = &eng->cache;
    size_t nresp = 0;
    hvd_status st;

    eng->cycle = c->number;
    eng->n_cached = eng->n_negotiated = eng->n_collectives = 0;
    if (eng->mark_cycles)
        hvd_timeline_mark(eng->timeline, "CYCLE_START", hvd_now_ns());

    /* Slots some rank invalidated are dropped everywhere. */
    for (size_t i = 0; i < c->n_erase; i++) {
        int s = (int)c->erase[i];
        if (s >= cache->nslots)
            return hvd_error_set(
                HVD_ERR_TRANSPORT, "cycle %llu erases slot %d of %d",
                (unsigned long long)c->number, s, cache->nslots);
        for (int k = 0; k < eng->npending; k++)
            if (eng->pending[k]->slot == s &&
                eng->pending[k]->state == REQ_CACHED)
                unbind(eng->pending[k]);
        hvd_cache_erase(cache, s);
        if (eng->rank == 0)
            vote_reset(&eng->vt, eng->size, s, c->number);
    }

    st = resps_room(eng, c->n_run + c->n_responses);
    if (st != HVD_OK)
        return st;
    for (size_t i = 0; i < c->n_run; i++) {
        int s = (int)c->run[i];
        if (s >= cache->nslots || cache->slots[s].name == NULL)
            return hvd_error_set(HVD_ERR_TRANSPORT,
                                 "cycle %llu runs empty cache slot %d",
                                 (unsigned long long)c->number, s);
        resp *r = &eng->resps[nresp++];
        memset(r, 0, sizeof(*r));
        r->name = cache->slots[s].name;
        r->desc = cache->slots[s].desc;
        r->status = HVD_OK;
        r->contributors = eng->size;
        r->cached = 1;
        hvd_cache_touch(cache, s, c->number);
        if (eng->rank == 0)
            vote_reset(&eng->vt, eng->size, s, c->number);
        eng->n_cached++;
    }
    for (size_t i = 0; i < c->n_responses; i++) {
        const Hvd__Engine__Response *g = c->responses[i];
        resp *r = &eng->resps[nresp++];
        memset(r, 0, sizeof(*r));
        st = hvd_ctrl_check_response(g, eng->size, &r->desc);
        if (st != HVD_OK) {
            hvd_error_prefix("malformed cycle %llu from rank 0: ",
                             (unsigned long long)c->number);
            return st;
        }
        r->name = g->name;
        r->status = (hvd_status)g->status;
        r->error = g->error;
        r->contributors = (int)g->contributors;
        r->last_joined = g->last_joined;
        r->self_joined = in_list(g->joined, g->n_joined, eng->rank);
        /* The collective runs over this rank's buffers, sized by its own
         * request: rank 0 must have decided the same operation. */
        const hvd_request *req = hvd_namemap_get(&eng->by_name, r->name);
        if (req != NULL && r->status == HVD_OK &&
            !hvd_opdesc_equal(&req->desc, &r->desc)) {
            char mine[160], theirs[160];
            hvd_opdesc_format(&req->desc, mine, sizeof(mine));
            hvd_opdesc_format(&r->desc, theirs, sizeof(theirs));
            return hvd_error_set(HVD_ERR_TRANSPORT,
                                 "cycle %llu from rank 0 runs '%s' as %s, but "
                                 "rank %d asked for %s",
                                 (unsigned long long)c->number, r->name, theirs,
                                 eng->rank, mine);
        }
        eng->n_negotiated++;
    }

    st = run_responses(eng, eng->resps, nresp);
    if (st != HVD_OK)
        return st;

    /* The cache learns the negotiated operations, in order, on every
     * rank alike. */
    for (size_t i = 0; i < nresp; i++) {
        resp *r = &eng->resps[i];
        if (r->cached || r->status != HVD_OK || r->desc.kind == HVD_KIND_JOIN ||
            r->desc.kind == HVD_KIND_CALL || r->contributors != eng->size ||
            cache->capacity == 0)
            continue;
        int s = hvd_cache_put(cache, r->name, &r->desc, c->number);
        if (s < 0)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory in the response cache");
        if (eng->rank == 0)
            vote_reset(&eng->vt, eng->size, s, c->number);
    }

    /* Requests whose slot changed hands go back to rank 0's table; new
     * ones the cache now knows take the cache path. */
    eng->paused = c->paused;
    for (int k = 0; k < eng->npending; k++) {
        hvd_request *req = eng->pending[k];
        if (req->state == REQ_CACHED &&
            (eng->paused || cache->slots[req->slot].name == NULL ||
             strcmp(cache->slots[req->slot].name, req->name) != 0 ||
             !hvd_opdesc_equal(&cache->slots[req->slot].desc, &req->desc)))
            unbind(req);
        else if (req->state == REQ_NEW)
            classify(eng, req);
    }
    HVD_DEBUG("engine", "cycle %llu: %d cached, %d negotiated, %d collectives",
              (unsigned long long)c->number, eng->n_cached, eng->n_negotiated,
              eng->n_collectives);
    hvd_timeline_flush(eng->timeline);
    return HVD_OK;
}

/* Rank 0: decides a cycle if there is anything to run, sends it to every
 * rank and runs it. *ran says whether it did; *stop whether it was the
 * last. */
static hvd_status decide(hvd_engine *eng, double now, int *ran, int *stop) {
    vote_table *vt = &eng->vt;
    Hvd__Engine__Cycle c = HVD__ENGINE__CYCLE__INIT;
    Hvd__Engine__ResponseList list = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint32_t *run = NULL, *erase = NULL;
    int ns = eng->cache.nslots, votes = 0, all_stop = 1;
    hvd_status st;

    *ran = 0;
    *stop = 0;
    st = hvd_coord_collect(eng->coord, now, &list);
    if (st == HVD_OK && vt->capacity > 0)
        st = vote_stalls(eng, now, &list);
    if (st != HVD_OK)
        goto out;
    int paused = hvd_coord_joined(eng->coord) > 0;
    if (ns > 0) {
        run = malloc((size_t)ns * sizeof(*run));
        erase = malloc((size_t)ns * sizeof(*erase));
        if (run == NULL || erase == NULL) {
            st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
    }
    /* Small operations ready on every rank wait (briefly) while others
     * are ready on some ranks only, so that they fuse; large ones run at
     * once (they run alone anyway). */
    int partial = 0, small = 0, nrun_big = 0;
    for (int s = 0; s < ns; s++)
        partial |= vt->count[s] > 0 && vt->count[s] < eng->size;
    int hold = partial && !paused && vt->small_since != 0 &&
               now - vt->small_since < FUSION_WAIT_S &&
               now - vt->last_vote < FUSION_QUIET_S;
    for (int s = 0; s < ns; s++) {
        votes |= vt->count[s] > 0;
        if (vt->erase[s]) {
            erase[c.n_erase++] = (uint32_t)s;
        } else if (vt->count[s] == eng->size && !paused) {
            const hvd_opdesc *d = &eng->cache.slots[s].desc;
            size_t bytes =
                (size_t)hvd_opdesc_total(d) * hvd_dtype_size(d->dtype);
            int fusable = d->kind == HVD_KIND_ALLREDUCE &&
                          bytes <= eng->cfg.fusion_tensor_max &&
                          bytes <= eng->cfg.fusion_threshold;
            if (!fusable) {
                run[c.n_run++] = (uint32_t)s;
                nrun_big++;
            } else if (partial && vt->small_since == 0) {
                small++; /* the wait starts now */
            } else if (hold) {
                small++;
            } else {
                run[c.n_run++] = (uint32_t)s;
            }
        }
    }
    if (small > 0 && vt->small_since == 0)
        vt->small_since = now;
    if (small == 0 && c.n_run > (size_t)nrun_big)
        vt->small_since = 0;
    for (int r = 0; r < eng->size; r++)
        all_stop &= vt->stop[r];
    /* A joined rank does not vote, so while one is, cached requests are
     * sent back to the table: an (empty) cycle tells every rank. */
    if (c.n_run == 0 && c.n_erase == 0 && list.n_responses == 0 && !all_stop &&
        !(paused && votes) && paused == eng->paused)
        goto out;
    if (paused)
        for (int s = 0; s < ns; s++)
            vote_clear(vt, eng->size, s);

    c.number = eng->cycle + 1;
    c.run = run;
    c.erase = erase;
    c.n_responses = list.n_responses;
    c.responses = list.responses;
    c.paused = paused;
    c.stop = all_stop;
    if (eng->size > 1) {
        size_t len = hvd__engine__cycle__get_packed_size(&c);
        st = body_room(eng, len ? len : 1);
        if (st != HVD_OK)
            goto out;
        hvd__engine__cycle__pack(&c, eng->body);
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            st = send_msg(eng, r, MSG_CYCLE, eng->body, len);
        if (st != HVD_OK)
            goto out;
    }
    st = run_cycle(eng, &c);
    *ran = 1;
    *stop = all_stop;
out:
    hvd_coord_free_responses(&list);
    free(run);
    free(erase);
    return st;
}

/* Another rank: tells rank 0 what changed. */
static hvd_status send_update(hvd_engine *eng, int stop) {
    Hvd__Engine__Update u = HVD__ENGINE__UPDATE__INIT;
    Hvd__Engine__Request *items = NULL, **ptrs = NULL;
    uint32_t *ready = NULL;
    int64_t now = hvd_now_ns();
    size_t nnew = 0, nready = 0, len;
    hvd_status st = HVD_OK;

    for (int i = 0; i < eng->npending; i++) {
        nnew += eng->pending[i]->state == REQ_NEW;
        nready += eng->pending[i]->state == REQ_CACHED;
    }
    items = calloc(nnew ? nnew : 1, sizeof(*items));
    ptrs = calloc(nnew ? nnew : 1, sizeof(*ptrs));
    ready = calloc(nready ? nready : 1, sizeof(*ready));
    if (items == NULL || ptrs == NULL || ready == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->state == REQ_CACHED) {
            ready[u.n_ready++] = (uint32_t)req->slot;
            req->voted = 1;
        } else if (req->state == REQ_NEW) {
            Hvd__Engine__Request *it = &items[u.n_requests];
            hvd__engine__request__init(it);
            it->name = req->name;
            it->kind = req->desc.kind;
            it->dtype = req->desc.dtype;
            it->op = req->desc.op;
            it->root = req->desc.root;
            it->mem = req->desc.mem;
            it->n_counts = req->desc.ncounts;
            it->counts = req->counts;
            it->n_shape = (size_t)req->desc.ndims;
            it->shape = req->desc.dims;
            it->age_s = (double)(now - req->t_submit) / 1e9;
            ptrs[u.n_requests++] = it;
            req->state = REQ_SENT;
        }
    }
    u.seen_cycle = eng->cycle;
    u.ready = ready;
    u.requests = ptrs;
    u.n_invalidate = (size_t)eng->ninval;
    u.invalidate = eng->inval;
    u.stop = stop;
    len = hvd__engine__update__get_packed_size(&u);
    st = body_room(eng, len ? len : 1);
    if (st == HVD_OK) {
        hvd__engine__update__pack(&u, eng->body);
        st = send_msg(eng, 0, MSG_UPDATE, eng->body, len);
    }
    eng->ninval = 0;
    if (stop)
        eng->stop_told = 1;
out:
    free(items);
    free(ptrs);
    free(ready);
    return st;
}

/* ------------------------------------------------------------------ */
/* The thread                                                          */

static double now_s(void) { return (double)hvd_now_ns() / 1e9; }

/* How long the idle engine may wait (ms) before a timer needs it. */
static int idle_timeout_ms(hvd_engine *eng) {
    double now = now_s(), next = now + IDLE_WAIT_MS / 1000.0;

    if (eng->rank == 0) {
        double a = hvd_coord_next_deadline(eng->coord);
        double b = eng->vt.capacity > 0 ? vote_deadline(eng) : -1;
        if (a >= 0 && a < next)
            next = a;
        if (b >= 0 && b < next)
            next = b;
        if (eng->vt.small_since != 0) {
            double c = eng->vt.small_since + FUSION_WAIT_S;
            double q = eng->vt.last_vote + FUSION_QUIET_S;
            double d = c < q ? c : q;
            if (d < next)
                next = d;
        }
    }
    double ms = (next - now) * 1000.0;
    return ms <= 0 ? 0 : (int)ms + 1;
}

/*
 * 1 if something is already there to handle. A wake-up (or a message)
 * may have been consumed by a progress call inside another wait of the
 * engine; looking before blocking keeps it from being lost.
 */
static int work_waiting(hvd_engine *eng) {
    int waiting;

    pthread_mutex_lock(&lock);
    waiting =
        eng->queue_head != NULL || (eng->stop_requested && !eng->stop_seen);
    pthread_mutex_unlock(&lock);
    waiting = waiting || dev_ready(eng);
    for (int r = 0; r < eng->size && !waiting && eng->size > 1; r++)
        if ((eng->rank == 0) != (r == 0))
            waiting = eng->ports[eng->rank == 0 ? r : 0].req.done;
    return waiting;
}

/* Waits for work, a message or a timer. */
static hvd_status idle_wait(hvd_engine *eng, int timeout_ms) {
    if (work_waiting(eng))
        return HVD_OK;
    if (eng->devq_n > 0 && (timeout_ms < 0 || timeout_ms > DEV_POLL_MS))
        timeout_ms = DEV_POLL_MS;
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
    if (eng->queue_head == NULL && !eng->stop_requested && !eng->gpu_woken)
        pthread_cond_timedwait(&cond, &lock, &ts);
    eng->gpu_woken = 0;
    pthread_mutex_unlock(&lock);
    return HVD_OK;
}

/*
 * Every rank has stopped: the header receives still posted are completed
 * by a last STOP message each way (updates sent before it are read and
 * dropped), so nothing is in flight when the transport says goodbye.
 */
static hvd_status close_ports(hvd_engine *eng) {
    hvd_status st = HVD_OK;
    uint32_t type = 0;
    size_t len;

    if (eng->size == 1)
        return HVD_OK;
    if (eng->rank == 0) {
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            st = send_msg(eng, r, MSG_STOP, NULL, 0);
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            for (type = 0; st == HVD_OK && type != MSG_STOP;)
                st = take_msg(eng, r, &type, &len);
    } else {
        st = send_msg(eng, 0, MSG_STOP, NULL, 0);
        while (st == HVD_OK && type != MSG_STOP)
            st = take_msg(eng, 0, &type, &len);
    }
    return st;
}

static hvd_status engine_loop(hvd_engine *eng) {
    hvd_status st;
    int stop = 0;

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
        st = dev_reap(eng);
        if (st != HVD_OK)
            return st;
        intake(eng, &stop);
        if (stop && eng->stop_deadline == 0)
            eng->stop_deadline = hvd_now_ns() + eng->cfg.timeout_ns;
        if (stop && hvd_now_ns() > eng->stop_deadline)
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "rank %d: not every rank called hvd_shutdown "
                                 "within %.0f s; leaving without them",
                                 eng->rank, (double)eng->cfg.timeout_ns / 1e9);

        if (eng->rank == 0) {
            int ran = 0, last = 0;
            int news;
            swap_timeline(eng);
            news = has_news(eng, stop);
            if (news && eng->cfg.cycle_time_ms > 0) {
                /* Batching window: let more work arrive first. */
                int64_t end =
                    hvd_now_ns() + (int64_t)eng->cfg.cycle_time_ms * 1000000;
                while (hvd_now_ns() < end) {
                    st = idle_wait(eng,
                                   (int)((end - hvd_now_ns()) / 1000000) + 1);
                    if (st != HVD_OK)
                        return st;
                    intake(eng, &stop);
                }
            }
            st = local_update(eng, stop, now_s());
            if (st == HVD_OK && eng->size > 1)
                st = read_updates(eng, now_s());
            if (st == HVD_OK)
                st = decide(eng, now_s(), &ran, &last);
            if (st != HVD_OK)
                return st;
            if (last)
                return close_ports(eng);
            if (ran)
                continue;
        } else {
            ctrl_port *p = &eng->ports[0];
            if (has_news(eng, stop)) {
                st = send_update(eng, stop);
                if (st != HVD_OK)
                    return st;
            }
            if (p->req.done) {
                uint32_t type;
                size_t len;
                st = take_msg(eng, 0, &type, &len);
                if (st != HVD_OK)
                    return st;
                if (type != MSG_CYCLE)
                    return hvd_error_set(HVD_ERR_TRANSPORT,
                                         "control message %u from rank 0 "
                                         "where a cycle was expected",
                                         type);
                Hvd__Engine__Cycle *c =
                    hvd__engine__cycle__unpack(NULL, len, eng->body);
                if (c == NULL)
                    return hvd_error_set(HVD_ERR_TRANSPORT,
                                         "malformed cycle from rank 0");
                if (c->number != eng->cycle + 1) {
                    st = hvd_error_set(HVD_ERR_TRANSPORT,
                                       "cycle %llu from rank 0 after cycle "
                                       "%llu",
                                       (unsigned long long)c->number,
                                       (unsigned long long)eng->cycle);
                } else {
                    st = run_cycle(eng, c);
                }
                int last = c->stop;
                hvd__engine__cycle__free_unpacked(c, NULL);
                if (st != HVD_OK)
                    return st;
                if (last)
                    return close_ports(eng);
                continue;
            }
        }
        st = idle_wait(eng, idle_timeout_ms(eng));
        if (st != HVD_OK)
            return st;
    }
}

static void *engine_main(void *arg) {
    hvd_engine *eng = arg;
    hvd_status st;

    hvd_log_set_rank(eng->rank);
    st = engine_loop(eng);
    if (st == HVD_OK)
        st = dev_drain(eng);
    if (st != HVD_OK) {
        engine_fail(eng, st);
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        hvd_devexec_abort(eng->dev);
        dev_fail_all(eng, st, text);
        fail_all(eng, st, text);
    } else {
        char text[160];
        snprintf(text, sizeof(text),
                 "hvd shut down on rank %d before this operation ran",
                 eng->rank);
        fail_all(eng, HVD_ERR_SHUTDOWN, text);
    }
    /* The GPU is released by the thread that used it. */
    hvd_devexec_destroy(eng->dev, eng->cfg.timeout_ns);
    eng->dev = NULL;
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
    hvd_devexec_destroy(eng->dev, 0);
    free(eng->devq);
    free(eng->dtens);
    hvd_comm_destroy(eng->data);
    hvd_comm_destroy(eng->ctrl);
    hvd_cache_destroy(&eng->cache);
    hvd_coord_destroy(eng->coord);
    hvd_namemap_destroy(&eng->inflight);
    hvd_namemap_destroy(&eng->by_name);
    hvd_timeline_close(eng->timeline);
    hvd_timeline_close(eng->tl_next);
    free(eng->pending);
    free(eng->ports);
    free(eng->inval);
    free(eng->body);
    vote_free(&eng->vt);
    free(eng->resps);
    free(eng->fusion);
    free(eng);
}

hvd_status hvd_engine_start(int rank, int size, hvd_transport *tp,
                            const hvd_comm_config *comm_cfg,
                            struct hvd_paths *paths,
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
    if (st == HVD_OK) {
        hvd_devexec_config dc = cfg->dev;
        dc.rank = rank;
        dc.size = size;
        dc.tp = tp;
        dc.host = eng->data;
        dc.comm = *comm_cfg;
        dc.gpu.wake = dev_wake;
        dc.gpu.wake_arg = eng;
        st = hvd_devexec_create(&dc, &eng->dev);
    }
    if (st != HVD_OK)
        goto fail;
    eng->data->paths = paths;
    if (hvd_cache_init(&eng->cache, cfg->cache_capacity) != 0) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    eng->ports = calloc((size_t)size, sizeof(*eng->ports));
    eng->inval =
        calloc((size_t)(cfg->cache_capacity > 0 ? cfg->cache_capacity : 1),
               sizeof(*eng->inval));
    if (eng->ports == NULL || eng->inval == NULL ||
        (rank == 0 && vote_init(&eng->vt, size, cfg->cache_capacity) != 0)) {
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
            eng->mark_cycles = cfg->timeline_mark_cycles;
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

hvd_comm *hvd_engine_data(hvd_engine *eng) { return eng->data; }

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
