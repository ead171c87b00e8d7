/* The engine (engine.h): its passes, when a step starts and a cycle runs,
 * rank 0's decisions, the express step and the engine thread's loop. */

#include "api/runtime/engine_state.h"

/* ------------------------------------------------------------------ */
/* Rank 0's decisions, and what every rank tells rank 0                */

/*
 * Rank 0: what it decides for the next step: the negotiated responses,
 * the slots to erase, whether a rank is joined (the cache path pauses)
 * and whether every rank stops, in eng->decision. *has says whether
 * there is any of it (the step must then run).
 */
static hvd_status decide(hvd_engine *eng, double now, int *has) {
    vote_table *vt = &eng->vt;
    Hvd__Engine__Cycle *c = &eng->decision;
    int all_stop = 1;
    hvd_status st;

    *has = 0;
    hvd__engine__cycle__init(c);
    st = hvd_coord_collect(eng->coord, now, &eng->dec_list);
    if (st == HVD_OK && vt->capacity > 0)
        st = hvd_eng_vote_stalls(eng, now, &eng->dec_list);
    if (st != HVD_OK)
        return st;
    c->paused = hvd_coord_joined(eng->coord) > 0;
    c->erase = eng->dec_erase;
    for (int s = 0; s < eng->cache.nslots && vt->nerase > 0; s++)
        if (vt->erase[s])
            c->erase[c->n_erase++] = (uint32_t)s;
    for (int r = 0; r < eng->size; r++)
        all_stop &= vt->stop[r];
    c->stop = all_stop;
    c->n_responses = eng->dec_list.n_responses;
    c->responses = eng->dec_list.responses;
    *has = c->n_erase > 0 || c->n_responses > 0 || c->stop ||
           c->paused != eng->paused;
    return HVD_OK;
}

/* Another rank: tells rank 0 what changed. */
static hvd_status send_update(hvd_engine *eng, int stop) {
    Hvd__Engine__Update u = HVD__ENGINE__UPDATE__INIT;
    Hvd__Engine__Request *items = NULL, **ptrs = NULL;
    int64_t now = hvd_now_ns();
    size_t nnew = 0, len;
    hvd_status st = HVD_OK;

    for (int i = 0; i < eng->npending; i++)
        nnew += eng->pending[i]->state == REQ_NEW;
    items = calloc(nnew ? nnew : 1, sizeof(*items));
    ptrs = calloc(nnew ? nnew : 1, sizeof(*ptrs));
    if (items == NULL || ptrs == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->state == REQ_NEW) {
            Hvd__Engine__Request *it = &items[u.n_requests];
            hvd__engine__request__init(it);
            it->name = req->name;
            it->kind = req->desc.kind;
            it->dtype = req->desc.dtype;
            it->op = req->desc.op;
            it->root = req->desc.root;
            it->mem = req->desc.mem;
            it->process_set = (uint32_t)req->desc.pset;
            it->n_counts = req->desc.ncounts;
            it->counts = req->counts;
            it->n_shape = (size_t)req->desc.ndims;
            it->shape = req->desc.dims;
            it->age_s = (double)(now - req->t_submit) / 1e9;
            ptrs[u.n_requests++] = it;
            req->state = REQ_SENT;
        }
    }
    u.requests = ptrs;
    u.n_invalidate = (size_t)eng->ninval;
    u.invalidate = eng->inval;
    u.stop = stop;
    len = hvd__engine__update__get_packed_size(&u);
    st = hvd_eng_body_room(eng, len ? len : 1);
    if (st == HVD_OK) {
        hvd__engine__update__pack(&u, eng->body);
        st = hvd_eng_send_msg(eng, 0, MSG_UPDATE, eng->body, len);
    }
    eng->ninval = 0;
    if (stop)
        eng->stop_told = 1;
out:
    free(items);
    free(ptrs);
    return st;
}

/* ------------------------------------------------------------------ */
/* The thread                                                          */

static double seconds_now(void) { return (double)hvd_now_ns() / 1e9; }

/* The same clock a few ms behind, for what counts seconds (votes, stalls,
 * the coordinator's deadlines): a pass reads it at no cost. */
static double coarse_s(void) { return (double)hvd_coarse_ns() / 1e9; }

/* How long the idle engine may wait (ms) before a timer needs it. */
static int idle_timeout_ms(hvd_engine *eng) {
    double now = seconds_now(), next = now + IDLE_WAIT_MS / 1000.0;

    if (eng->rank == 0) {
        double a = hvd_coord_next_deadline(eng->coord);
        double b = eng->vt.capacity > 0 ? hvd_eng_vote_deadline(eng) : -1;
        if (a >= 0 && a < next)
            next = a;
        if (b >= 0 && b < next)
            next = b;
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
    return hvd_eng_queued(eng) || hvd_eng_dev_ready(eng) ||
           hvd_eng_port_ready(eng) || hvd_eng_step_complete(eng);
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
    pthread_mutex_lock(&hvd_eng_lock);
    if (eng->queue_head == NULL && !eng->stop_requested && !eng->gpu_woken &&
        eng->wanted == 0)
        pthread_cond_timedwait(&hvd_eng_cond, &hvd_eng_lock, &ts);
    eng->gpu_woken = 0;
    pthread_mutex_unlock(&hvd_eng_lock);
    return HVD_OK;
}

/* Takes a timeline handed over by hvd_engine_set_timeline (engine thread,
 * rank 0): the old one is closed, a valid file. */
static void swap_timeline(hvd_engine *eng) {
    hvd_timeline *next;
    int swap, marks;

    /* Every loop of the engine asks: without the lock while nothing came. */
    if (!__atomic_load_n(&eng->tl_swap, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&hvd_eng_lock);
    swap = eng->tl_swap;
    next = eng->tl_next;
    marks = eng->tl_next_marks;
    __atomic_store_n(&eng->tl_swap, 0, __ATOMIC_RELEASE);
    eng->tl_next = NULL;
    pthread_mutex_unlock(&hvd_eng_lock);
    if (!swap)
        return;
    hvd_timeline_close(eng->timeline);
    eng->timeline = next;
    eng->mark_cycles = next != NULL && marks;
}

/*
 * One pass of the engine, by the engine thread or by a thread that waits
 * (hvd_engine_wait): takes submitted requests in, tells rank 0 what is
 * new, takes control messages, starts and finishes a step. If none of it
 * had anything to do, waits for the network up to the engine's timers
 * (block) or only looks (!block). *last: the last step ran.
 */
hvd_status hvd_eng_pass(hvd_engine *eng, int block, int *last) {
    hvd_status st = HVD_OK;
    int stop = 0, has = 0;

    *last = 0;
    st = hvd_eng_dev_reap(eng);
    if (st != HVD_OK)
        return st;
    hvd_eng_intake(eng, &stop);
    if (stop && eng->stop_deadline == 0)
        eng->stop_deadline = hvd_now_ns() + eng->cfg.timeout_ns;
    if (stop && hvd_now_ns() > eng->stop_deadline)
        return hvd_error_set(HVD_ERR_TIMEOUT,
                             "rank %d: not every rank called hvd_shutdown "
                             "within %.0f s; leaving without them",
                             eng->rank, (double)eng->cfg.timeout_ns / 1e9);

    /* What rank 0 must hear of: new names, invalidations, stop. Only
     * rank 0 keeps time (votes, stalls, the coordinator). */
    double now = eng->rank == 0 ? coarse_s() : 0;
    if (eng->rank == 0) {
        swap_timeline(eng);
        if (!eng->in_step && eng->cfg.cycle_time_ms > 0 &&
            (hvd_eng_has_news(eng, stop) || hvd_eng_has_offers(eng))) {
            /* Batching window: let more work arrive first. */
            int64_t end =
                hvd_now_ns() + (int64_t)eng->cfg.cycle_time_ms * 1000000;
            while (hvd_now_ns() < end) {
                st = idle_wait(eng, (int)((end - hvd_now_ns()) / 1000000) + 1);
                if (st != HVD_OK)
                    return st;
                hvd_eng_intake(eng, &stop);
            }
            now = seconds_now();
        }
    }
    /* Rank 0 hears that this rank stops only once every cached request it
     * has went out in a step: from then on rank 0 may fail what this rank
     * has not asked for (hvd_coord_stopped), as it never will. */
    int tell = stop && !hvd_eng_has_offers(eng);
    if (eng->rank == 0)
        st = hvd_eng_local_update(eng, tell, now);
    else if (hvd_eng_has_news(eng, tell))
        st = send_update(eng, tell);
    if (st == HVD_OK)
        st = hvd_eng_pump(eng, now);
    if (st != HVD_OK)
        return st;

    /* A step starts when this rank has something to offer or decide, or
     * another rank has started it. */
    if (!eng->in_step) {
        if (eng->rank == 0)
            st = decide(eng, now, &has);
        if (st == HVD_OK &&
            (has || hvd_eng_has_offers(eng) || hvd_eng_peer_started(eng))) {
            st = hvd_eng_step_start(eng);
            if (st == HVD_OK && !hvd_eng_step_complete(eng))
                return HVD_OK; /* the peers' parts may be here soon */
        } else if (eng->rank == 0) {
            hvd_coord_free_responses(&eng->dec_list);
        }
        if (st != HVD_OK)
            return st;
    }
    if (hvd_eng_step_complete(eng))
        return hvd_eng_step_finish(eng, now, last);
    return idle_wait(eng, block ? idle_timeout_ms(eng) : 0);
}

int hvd_eng_spin(hvd_engine *eng, unsigned n, hvd_eng_spinner *s) {
    /* Busy with other processes (with two busy loops on 2 cores, an 8 B
     * to 32 KiB allreduce at np 2 took up to 6 ms yielding, 0.6-25 us
     * pausing for 10 us and then sleeping; docs/benchmarks.md). */
    if (n == 1 && eng->load_on)
        s->busy = !hvd_hostload_room(&eng->load, hvd_coarse_ns());
    if (n % 16 == 0) {
        int64_t t = hvd_now_ns();
        if (s->start == 0) {
            s->start = t;
            s->calm_end =
                eng->spin_hurry && !s->busy ? t : t + eng->cfg.spin_calm_ns;
        }
        if (t - s->start >= eng->cfg.spin_ns || (s->busy && t >= s->calm_end))
            return 0;
        /* A peer that has not answered by the end of the calm is likely
         * waiting for a core: from then on this thread offers its own.
         * Before, a yield would only cost a system call per look, most of
         * a small step's time where each rank has a core (measured). */
        s->yield = t >= s->calm_end;
        s->late = t - s->start >= eng->cfg.spin_calm_ns;
    }
    if (!s->busy && (eng->cfg.spin_yield || eng->spin_hurry || s->yield))
        sched_yield();
    else
        hvd_cpu_relax();
    return 1;
}

void hvd_eng_spin_end(hvd_engine *eng, const hvd_eng_spinner *s) {
    if (s->late)
        eng->spin_hurry = SPIN_HURRY;
    else if (eng->spin_hurry > 0)
        eng->spin_hurry--;
}

/*
 * The step of a blocking call's request taken in by hvd_engine_express_run,
 * when it is all the engine has (cached, nothing else pending, nothing to
 * tell rank 0): this rank's part goes out at once and the caller waits for
 * the others' looking at nothing else (a pass looks at the submission
 * queue, rank 0's news and timers each time). The step is the one a pass
 * would send, so every rank may take either way. It returns once the step
 * ran, or failed, or after spin_ns of polling, leaving the rest to the
 * passes (hvd_eng_pass), as it does whenever req is not such a request.
 */
hvd_status hvd_eng_express_step(hvd_engine *eng, hvd_request *req, int *last) {
    double now = eng->rank == 0 ? coarse_s() : 0;
    hvd_eng_spinner spin = {0};
    int has = 0;
    hvd_status st;

    *last = 0;
    if (req->state != REQ_CACHED || eng->in_step || eng->npending != 1 ||
        eng->ninval > 0 || eng->paused || eng->tp == NULL ||
        (eng->rank == 0 && eng->cfg.cycle_time_ms > 0)) /* it batches */
        return HVD_OK;
    /* What came first (on rank 0 an update may give it something to
     * decide, which then goes in the step). */
    st = hvd_eng_pump(eng, now);
    if (st == HVD_OK && eng->rank == 0)
        st = decide(eng, now, &has);
    if (st == HVD_OK)
        st = hvd_eng_step_start(eng);
    for (unsigned n = 1; st == HVD_OK && !hvd_eng_step_complete(eng); n++) {
        if (!hvd_eng_spin(eng, n, &spin)) {
            hvd_eng_spin_end(eng, &spin);
            return HVD_OK; /* the passes wait from here */
        }
        st = eng->tp->ops->progress(eng->tp, 0);
        if (st == HVD_OK)
            st = hvd_eng_pump(eng, now);
    }
    hvd_eng_spin_end(eng, &spin);
    if (st == HVD_OK)
        st = hvd_eng_step_finish(eng, now, last);
    return st;
}

/* How long the engine thread stands aside after a waiting thread ran the
 * engine: the next blocking call is usually that soon, and finds the
 * engine free. */
#define DRIVER_GRACE_NS (500 * 1000LL)
#define DRIVER_LOOK_NS (10 * 1000 * 1000LL)

/*
 * The engine thread's turn: waits while a waiting thread runs the engine
 * (or wants to), and for a short grace after one did while nothing else
 * needs the engine. Returns with the engine thread's turn taken
 * (eng->engine_busy), or with the status a driver left.
 */
static hvd_status take_turn(hvd_engine *eng, int *last) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&hvd_eng_lock);
    for (;;) {
        int64_t now = hvd_now_ns(), until = 0;
        if (eng->drive_status != HVD_OK || eng->drive_last)
            break;
        /* A driver let go since the last look: the grace runs from now
         * (drivers do not read the clock for it). */
        if (eng->drives != eng->drives_seen) {
            eng->drives_seen = eng->drives;
            eng->grace_end = now + DRIVER_GRACE_NS;
        }
        /* While a thread drives, whatever needs the engine thread wakes it
         * (an asynchronous request, a stop, a timeline, a driver letting
         * go with work left): it need not look often, and each look takes
         * a core from a rank that polls. */
        if (eng->driving || eng->wanted > 0)
            until = now + DRIVER_LOOK_NS;
        else if (now < eng->grace_end && !eng->async_queued &&
                 !eng->stop_requested && !eng->tl_swap)
            until = eng->grace_end;
        if (until == 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = until - now;
        ts.tv_sec += ns / NS_PER_S;
        ts.tv_nsec += ns % NS_PER_S;
        if (ts.tv_nsec >= NS_PER_S) {
            ts.tv_sec++;
            ts.tv_nsec -= NS_PER_S;
        }
        pthread_cond_timedwait(&eng->turn_cond, &hvd_eng_lock, &ts);
    }
    if (eng->drive_status != HVD_OK)
        st = hvd_error_set(eng->drive_status, "%s", eng->drive_text);
    *last = eng->drive_last;
    eng->engine_busy = 1;
    eng->async_queued = 0;
    pthread_mutex_unlock(&hvd_eng_lock);
    return st;
}

static hvd_status engine_loop(hvd_engine *eng) {
    hvd_status st;
    int last = 0;

    /* Nobody else drives before the receives are posted (engine_busy was
     * set when the thread was started). */
    st = hvd_eng_open_ports(eng);
    if (st != HVD_OK)
        return st;
    pthread_mutex_lock(&hvd_eng_lock);
    eng->engine_busy = 0;
    pthread_cond_broadcast(&hvd_eng_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
    for (;;) {
        st = take_turn(eng, &last);
        if (st == HVD_OK && !last)
            st = hvd_eng_pass(eng, 1, &last);
        /* On the way out (the job failed, or the last step ran) the engine
         * thread keeps its turn: a waiting thread that took the engine now
         * would run a pass beside hvd_eng_main failing every request, and
         * could take in a request after that, which then never finished
         * (may_drive says no only once hvd_eng_fail or finished says so).
         * Waiters wait for their requests, which hvd_eng_main ends. */
        if (st != HVD_OK)
            return st;
        if (last)
            return hvd_eng_close_ports(eng);
        pthread_mutex_lock(&hvd_eng_lock);
        eng->engine_busy = 0;
        if (eng->wanted > 0)
            pthread_cond_broadcast(&hvd_eng_cond);
        pthread_mutex_unlock(&hvd_eng_lock);
    }
}

void *hvd_eng_main(void *arg) {
    hvd_engine *eng = arg;
    hvd_status st;

    hvd_log_set_rank(eng->rank);
    st = engine_loop(eng);
    if (st == HVD_OK)
        st = hvd_eng_dev_drain(eng);
    if (st != HVD_OK && eng->cfg.elastic && hvd_eng_peers_changed(st))
        st = hvd_error_set(HVD_ERR_PEERS_CHANGED,
                           "the job's ranks changed (elastic): restore the "
                           "last committed state and call hvd_elastic_reset "
                           "(rank %d: %s)",
                           eng->rank, hvd_error_get());
    if (st != HVD_OK) {
        hvd_eng_fail(eng, st);
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        hvd_devexec_abort(eng->dev);
        hvd_eng_dev_fail_all(eng, st, text);
        hvd_eng_fail_all(eng, st, text);
    } else {
        char text[160];
        int reset = __atomic_load_n(&eng->resetting, __ATOMIC_ACQUIRE);
        snprintf(text, sizeof(text),
                 reset ? "the job is being re-formed (hvd_elastic_reset on "
                         "rank %d) before this operation ran"
                       : "hvd shut down on rank %d before this operation ran",
                 eng->rank);
        hvd_eng_fail_all(eng, reset ? HVD_ERR_PEERS_CHANGED : HVD_ERR_SHUTDOWN,
                         text);
    }
    /* The GPU is released by the thread that used it. */
    hvd_devexec_destroy(eng->dev, eng->cfg.timeout_ns);
    eng->dev = NULL;
    pthread_mutex_lock(&hvd_eng_lock);
    eng->finished = 1;
    eng->stop_status = st;
    pthread_cond_broadcast(&hvd_eng_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
    return NULL;
}
