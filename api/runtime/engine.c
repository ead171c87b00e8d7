/* The engine (engine.h): its entry, the top of its files (engine_state.h
 * gives their order): requests, submission (any thread), waiting, start
 * and stop. */

#include "api/runtime/engine_state.h"

/* ------------------------------------------------------------------ */
/* Requests                                                            */

int hvd_request_setup_n(hvd_request *req, int n) {
    req->n = n;
    req->slot = -1;
    if (n <= HVD_REQUEST_INLINE) {
        req->send = memset(req->send_in, 0, sizeof(req->send_in));
        req->recv = memset(req->recv_in, 0, sizeof(req->recv_in));
        req->counts = memset(req->counts_in, 0, sizeof(req->counts_in));
        req->desc.ncounts = (size_t)n;
        req->desc.counts = req->counts;
        return 0;
    }
    req->send = calloc((size_t)n, sizeof(*req->send));
    req->recv = calloc((size_t)n, sizeof(*req->recv));
    req->counts = calloc((size_t)n, sizeof(*req->counts));
    if (req->send == NULL || req->recv == NULL || req->counts == NULL) {
        free(req->send);
        free(req->recv);
        free(req->counts);
        return -1;
    }
    req->desc.ncounts = (size_t)n;
    req->desc.counts = req->counts;
    return 0;
}

hvd_request *hvd_request_new(int n) {
    hvd_request *req = calloc(1, sizeof(*req));

    if (req == NULL || hvd_request_setup(req, n) != 0) {
        free(req);
        return NULL;
    }
    req->heap = 1;
    return req;
}

int hvd_request_name_copy(hvd_request *req, const char *name) {
    size_t len = strlen(name);

    if (len < sizeof(req->name1)) {
        req->name = memcpy(req->name1, name, len + 1);
    } else {
        req->name = strdup(name);
        if (req->name == NULL)
            return -1;
        req->name_owned = 1;
    }
    req->hash = hvd_namemap_hash(req->name);
    return 0;
}

void hvd_engine_set_timeline(hvd_engine *eng, hvd_timeline *tl,
                             int mark_cycles) {
    hvd_timeline *replaced = NULL;

    pthread_mutex_lock(&hvd_eng_lock);
    if (eng->tl_swap)
        replaced = eng->tl_next; /* never taken: nothing was written */
    eng->tl_next = tl;
    eng->tl_next_marks = mark_cycles;
    __atomic_store_n(&eng->tl_swap, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&hvd_eng_cond);
    pthread_cond_broadcast(&eng->turn_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
    hvd_timeline_close(replaced);
    if (eng->tp != NULL)
        eng->tp->ops->wake(eng->tp);
}

/* ------------------------------------------------------------------ */
/* Submission (any thread)                                             */

/* Whether the engine is free for the express way (under the lock):
 * nobody runs it or wants to, nothing is queued, pending or in flight, no
 * timeline and no GPU work. The engine's own state (pending, timeline) is
 * read here while nobody runs it. */
static int express_free(const hvd_engine *eng);

/* Whether req may go the express way: a blocking collective (allreduce,
 * broadcast, allgather, alltoall, reduce-scatter, barrier; grouped or
 * not) of host memory, in any process set. Whether its data then travels
 * in the step is the step's to say (hvd_eng_carries: the job's set
 * only); a join, a process set's creation and an internal call are the
 * engine thread's. */
static int express_kind(const hvd_request *req) {
    if (!req->will_wait || req->desc.mem != HVD_MEM_HOST)
        return 0;
    switch (req->desc.kind) {
    case HVD_KIND_ALLREDUCE:
    case HVD_KIND_BROADCAST:
    case HVD_KIND_ALLGATHER:
    case HVD_KIND_ALLTOALL:
    case HVD_KIND_REDUCESCATTER:
    case HVD_KIND_BARRIER:
        return 1;
    default:
        return 0;
    }
}

/* Puts req in the submission queue (under the lock): a sentence if the
 * engine failed or stops, or the name is in flight. Kept out of
 * hvd_engine_submit, whose express way is the fast path. */
__attribute__((noinline)) static hvd_status
enqueue(hvd_engine *eng, hvd_request *req, int wake) {
    if (eng->failed != HVD_OK)
        return hvd_error_set(eng->failed, "hvd failed earlier: %s",
                             eng->failmsg);
    if (eng->stop_requested || eng->finished)
        return hvd_error_set(HVD_ERR_SHUTDOWN,
                             "'%s' submitted while hvd shuts down", req->name);
    if (hvd_namemap_get_h(&eng->inflight, req->name, req->hash) != NULL ||
        (eng->express != NULL && eng->express->hash == req->hash &&
         strcmp(eng->express->name, req->name) == 0))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "'%s' is already in flight on rank %d: names must "
                             "be unique among operations in flight",
                             req->name, eng->rank);
    if (hvd_namemap_put_h(&eng->inflight, req->name, req->hash, req) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    req->t_submit = hvd_now_ns();
    if (eng->queue_tail)
        eng->queue_tail->next = req;
    else /* hvd_eng_intake looks without the lock */
        __atomic_store_n(&eng->queue_head, req, __ATOMIC_RELEASE);
    eng->queue_tail = req;
    /* A blocking call runs the engine itself (hvd_engine_wait), or wakes
     * the engine thread there if it cannot. */
    if (wake) {
        eng->async_queued = 1;
        pthread_cond_broadcast(&eng->turn_cond);
        pthread_cond_broadcast(&hvd_eng_cond);
    }
    return HVD_OK;
}

hvd_status hvd_engine_submit(hvd_engine *eng, hvd_request *req, int *express) {
    int fast = express_kind(req), wake;
    hvd_status st;

    /* Its state (REQ_NEW), slot (-1) and next (NULL) are as
     * hvd_request_setup left them: it is submitted once. */
    req->eng = eng;
    pthread_mutex_lock(&hvd_eng_lock);
    if (fast && express_free(eng)) {
        /* The express way (docs/design.md, "Who runs the engine"): this
         * thread takes the engine at once and puts req straight among the
         * pending requests (hvd_engine_express_run): no submission queue,
         * no wake-up. It is the only name in flight (enqueue refuses it
         * meanwhile). What goes on the wire is what the queued way
         * sends. */
        eng->express = req;
        eng->driving = 1;
        eng->waiters++;
        pthread_mutex_unlock(&hvd_eng_lock);
        req->t_submit = hvd_coarse_ns();
        *express = 1;
        return HVD_OK;
    }
    *express = 0;
    wake = !req->will_wait || !eng->cfg.caller_progress;
    st = enqueue(eng, req, wake);
    pthread_mutex_unlock(&hvd_eng_lock);
    if (st == HVD_OK && wake && eng->tp != NULL)
        eng->tp->ops->wake(eng->tp);
    return st;
}

/* How long hvd_engine_wait looks at a request before it sleeps: a small
 * operation is often done sooner than a sleeping thread would wake. */
#define WAIT_SPIN_NS (50 * 1000LL)

/* Whether a waiting thread may run the engine (under the lock). */
static int may_drive(const hvd_engine *eng) {
    return eng->cfg.caller_progress && !eng->finished &&
           eng->failed == HVD_OK && eng->drive_status == HVD_OK &&
           !eng->drive_last;
}

/*
 * Runs the engine's passes in this thread until req is done, the job
 * fails or the last step ran (*last): polls for spin_ns (hvd_eng_spin), then
 * blocks in the transport. The caller drives (eng->driving), without the
 * lock.
 */
static hvd_status run_until_done(hvd_engine *eng, hvd_request *req, int *last) {
    hvd_status st = HVD_OK;
    hvd_eng_spinner spinner = {0};
    int spin = eng->cfg.spin_ns > 0;

    for (unsigned n = 1; !__atomic_load_n(&req->done, __ATOMIC_ACQUIRE); n++) {
        st = hvd_eng_pass(eng, !spin, last);
        if (st != HVD_OK || *last)
            break;
        if (spin) {
            spin = hvd_eng_spin(eng, n, &spinner);
            if (!spin)
                hvd_eng_spin_end(eng, &spinner);
        }
    }
    if (spin)
        hvd_eng_spin_end(eng, &spinner);
    return st;
}

/* The driver lets go of the engine (under the lock): a failure st is
 * handed to the engine thread, which takes over now if anything else
 * needs it. */
static void let_go(hvd_engine *eng, hvd_status st, int last) {
    eng->driving = 0;
    eng->drives++;
    if (st != HVD_OK) {
        eng->drive_status = st;
        snprintf(eng->drive_text, sizeof(eng->drive_text), "%s",
                 hvd_error_get());
    }
    eng->drive_last = last;
    if (st != HVD_OK || last || eng->npending > 0 || eng->queue_head != NULL ||
        eng->stop_requested)
        pthread_cond_broadcast(&eng->turn_cond);
    if (eng->wanted > 0)
        pthread_cond_broadcast(&hvd_eng_cond);
}

/*
 * Runs the engine's passes in this thread until req is done, once the
 * engine thread has stood aside (it is woken out of the transport's wait
 * if it is in one): no hand-off to the engine thread and back. Leaves the
 * engine to the engine thread when req is done or the job fails or ends.
 * Called and returns with the lock held.
 */
static void drive(hvd_engine *eng, hvd_request *req) {
    hvd_status st;
    int last = 0, woke = 0;

    eng->wanted++;
    while (!req->done && may_drive(eng) && (eng->driving || eng->engine_busy)) {
        if (eng->engine_busy && !woke) {
            /* Out of the transport's wait (or, in a job of one, the
             * engine's own). */
            woke = 1;
            if (eng->tp == NULL) {
                pthread_cond_broadcast(&hvd_eng_cond);
                continue;
            }
            pthread_mutex_unlock(&hvd_eng_lock);
            eng->tp->ops->wake(eng->tp);
            pthread_mutex_lock(&hvd_eng_lock);
            continue;
        }
        pthread_cond_wait(&hvd_eng_cond, &hvd_eng_lock);
    }
    eng->wanted--;
    if (req->done || !may_drive(eng))
        return;
    eng->driving = 1;
    pthread_mutex_unlock(&hvd_eng_lock);
    st = run_until_done(eng, req, &last);
    pthread_mutex_lock(&hvd_eng_lock);
    let_go(eng, st, last);
}

/* Waits (under the lock) until the engine is done with req. */
static void wait_done(hvd_request *req) {
    if (!req->done) {
        int64_t spin_end = hvd_now_ns() + WAIT_SPIN_NS;

        /* Yield while looking, so an engine thread that shares the core
         * runs. */
        pthread_mutex_unlock(&hvd_eng_lock);
        while (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) &&
               hvd_now_ns() < spin_end)
            sched_yield();
        pthread_mutex_lock(&hvd_eng_lock);
        while (!req->done)
            pthread_cond_wait(&hvd_eng_cond, &hvd_eng_lock);
    }
}

static int express_free(const hvd_engine *eng) {
    return may_drive(eng) && !eng->driving && !eng->engine_busy &&
           eng->wanted == 0 && eng->queue_head == NULL &&
           eng->express == NULL && !eng->stop_requested && !eng->tl_swap &&
           eng->npending == 0 && eng->devq_n == 0 && eng->timeline == NULL &&
           eng->inflight.count == 0;
}

hvd_status hvd_engine_express_run(hvd_engine *eng, hvd_request *req) {
    hvd_status st;
    int last = 0;

    hvd_eng_express_req = req;
    hvd_eng_take(eng, req);
    st = hvd_eng_express_step(eng, req, &last);
    if (st == HVD_OK && !last)
        st = run_until_done(eng, req, &last);
    hvd_eng_express_req = NULL;
    pthread_mutex_lock(&hvd_eng_lock);
    let_go(eng, st, last);
    /* If the job failed, the engine thread fails req too. */
    wait_done(req);
    eng->express = NULL;
    if (--eng->waiters == 0)
        pthread_cond_broadcast(&hvd_eng_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
    st = req->status;
    if (st != HVD_OK)
        hvd_error_copy(st, req->error);
    free(req->error);
    req->error = NULL;
    return st;
}

/* How far into the submission queue a waiter looks for its asynchronous
 * request (under the lock, so the look is bounded): one deeper in a longer
 * queue, and not its tail, is left to the engine thread. */
#define WAIT_QUEUE_LOOK 16

/*
 * Whether the waiter of an asynchronous request runs the engine for it
 * (under the lock): only while it has not started, that is while it is
 * still among the first in the submission queue (the engine has not
 * taken it in), nobody runs the engine or wants to (the engine thread is
 * not in a pass), and it is host memory. The submission woke the engine
 * thread: one already in its pass takes the request in next, and taking
 * the engine from it would cost more hand-offs than it saves (measured:
 * 4-byte allreduce_async_ + synchronize at np 2 took twice as long). Once
 * the engine has it, the engine thread may be running a burst of them,
 * which a waiter taking over would only slow down; GPU work stays with
 * the engine thread, which watches the device.
 */
static int async_not_started(const hvd_engine *eng, const hvd_request *req) {
    const hvd_request *q = eng->queue_head;

    if (req->desc.mem != HVD_MEM_HOST || eng->driving || eng->wanted > 0 ||
        eng->engine_busy)
        return 0;
    if (eng->queue_tail == req)
        return 1;
    /* Only the queue's own links are read: the engine unlinks what it
     * took after it has detached it from the queue. */
    for (int n = 0; q != NULL && n < WAIT_QUEUE_LOOK; n++, q = q->next)
        if (q == req)
            return 1;
    return 0;
}

hvd_status hvd_engine_wait(hvd_request *req, int *last_rank_out, char *name_out,
                           size_t namelen) {
    hvd_status st;

    /* A blocking call runs the engine itself; so does the wait of an
     * asynchronous request that has not started (async_not_started). The
     * engine is alive while req is not done; waiters keeps it so. */
    pthread_mutex_lock(&hvd_eng_lock);
    if (!req->done && req->eng != NULL && may_drive(req->eng) &&
        (req->will_wait || async_not_started(req->eng, req))) {
        hvd_engine *eng = req->eng;
        eng->waiters++;
        drive(eng, req);
        if (--eng->waiters == 0)
            pthread_cond_broadcast(&hvd_eng_cond);
    }
    wait_done(req);
    pthread_mutex_unlock(&hvd_eng_lock);
    st = req->status;
    if (st != HVD_OK)
        hvd_error_copy(st, req->error);
    if (st != HVD_OK && name_out != NULL)
        snprintf(name_out, namelen, "%s", req->name);
    if (last_rank_out != NULL)
        *last_rank_out = req->last_rank;
    hvd_request_free(req);
    return st;
}

void hvd_engine_on_done(hvd_request *req,
                        void (*fn)(hvd_status, const char *, void *),
                        void *arg) {
    int done;

    pthread_mutex_lock(&hvd_eng_lock);
    req->on_done_arg = arg;
    req->on_done = fn;
    done = req->done;
    pthread_mutex_unlock(&hvd_eng_lock);
    if (done)
        hvd_eng_call_back(req);
}

hvd_status hvd_engine_test(hvd_request *req, int *done) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&hvd_eng_lock);
    *done = req->done;
    if (req->done && req->status != HVD_OK)
        st = hvd_error_copy(req->status, req->error);
    pthread_mutex_unlock(&hvd_eng_lock);
    return st;
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
    hvd_eng_step_free(eng);
    free(eng->ports);
    free(eng->inval);
    free(eng->body);
    hvd_eng_vote_free(&eng->vt);
    pthread_cond_destroy(&eng->turn_cond);
    free(eng->resps);
    free(eng->fusion);
    free(eng->a2a);
    free(eng->a2a_msg);
    hvd_eng_pset_free(eng);
    if (eng->load_on)
        hvd_hostload_close(&eng->load);
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
    /* Where this host's ranks outnumber its cores the polling yields at
     * every look anyway (the cores are the ranks'). */
    if (cfg->spin_ns > 0 && !cfg->spin_yield) {
        hvd_hostload_open(&eng->load, NULL, 0);
        eng->load_on = 1;
    }
    pthread_cond_init(&eng->turn_cond, NULL);
    /* Both hold requests by their own names. */
    hvd_namemap_init_borrowed(&eng->inflight);
    hvd_namemap_init_borrowed(&eng->by_name);
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
        dc.gpu.wake = hvd_eng_dev_wake;
        dc.gpu.wake_arg = eng;
        st = hvd_devexec_create(&dc, &eng->dev);
    }
    if (st != HVD_OK)
        goto fail;
    eng->data->paths = paths;
    if (hvd_eng_pset_init(eng) != 0 ||
        hvd_cache_init(&eng->cache, cfg->cache_capacity) != 0) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    eng->ports = calloc((size_t)size, sizeof(*eng->ports));
    eng->inval =
        calloc((size_t)(cfg->cache_capacity > 0 ? cfg->cache_capacity : 1),
               sizeof(*eng->inval));
    eng->a2a = calloc(8 * (size_t)size, sizeof(*eng->a2a));
    eng->a2a_msg = calloc(6 * (size_t)size, sizeof(*eng->a2a_msg));
    if (eng->ports == NULL || eng->inval == NULL || eng->a2a == NULL ||
        eng->a2a_msg == NULL || hvd_eng_step_init(eng) != 0 ||
        (rank == 0 &&
         hvd_eng_vote_init(&eng->vt, size, cfg->cache_capacity) != 0)) {
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
    /* The engine thread's until it has posted its receives. */
    eng->engine_busy = 1;
    if (pthread_create(&eng->thread, NULL, hvd_eng_main, eng) != 0) {
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

const char *hvd_engine_step_path(const hvd_engine *eng, size_t bytes) {
    if (eng->size == 1 || eng->tp == NULL || eng->cfg.cache_capacity == 0 ||
        bytes > eng->cfg.fusion_tensor_max ||
        ((bytes + 7) & ~(size_t)7) > eng->cfg.step_carry_bytes)
        return NULL;
    return eng->tp->ops->name;
}

void hvd_engine_mark_reset(hvd_engine *eng) {
    __atomic_store_n(&eng->resetting, 1, __ATOMIC_RELEASE);
}

hvd_status hvd_engine_stop(hvd_engine *eng) {
    hvd_status st;

    pthread_mutex_lock(&hvd_eng_lock);
    __atomic_store_n(&eng->stop_requested, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&hvd_eng_cond);
    pthread_cond_broadcast(&eng->turn_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
    if (eng->tp != NULL)
        eng->tp->ops->wake(eng->tp);
    if (eng->thread_started)
        pthread_join(eng->thread, NULL);
    /* A thread still in hvd_engine_wait may look at eng until it leaves. */
    pthread_mutex_lock(&hvd_eng_lock);
    while (eng->waiters > 0)
        pthread_cond_wait(&hvd_eng_cond, &hvd_eng_lock);
    pthread_mutex_unlock(&hvd_eng_lock);
    st = eng->stop_status;
    if (st != HVD_OK)
        hvd_error_copy(st, eng->failed != HVD_OK ? eng->failmsg : "");
    engine_free(eng);
    return st;
}
