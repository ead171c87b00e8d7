/* The engine (engine.h): one cycle on every rank (rank 0 decides, all run), and
 * the engine thread's loop. */

#include "api/runtime/engine_internal.h"

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
            hvd_eng_vote_reset(&eng->vt, eng->size, s, c->number);
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
            hvd_eng_vote_reset(&eng->vt, eng->size, s, c->number);
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

    st = hvd_eng_run_responses(eng, eng->resps, nresp);
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
            hvd_eng_vote_reset(&eng->vt, eng->size, s, c->number);
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
            hvd_eng_classify(eng, req);
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
        st = hvd_eng_vote_stalls(eng, now, &list);
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
            hvd_eng_vote_clear(vt, eng->size, s);

    c.number = eng->cycle + 1;
    c.run = run;
    c.erase = erase;
    c.n_responses = list.n_responses;
    c.responses = list.responses;
    c.paused = paused;
    c.stop = all_stop;
    if (eng->size > 1) {
        size_t len = hvd__engine__cycle__get_packed_size(&c);
        st = hvd_eng_body_room(eng, len ? len : 1);
        if (st != HVD_OK)
            goto out;
        hvd__engine__cycle__pack(&c, eng->body);
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            st = hvd_eng_send_msg(eng, r, MSG_CYCLE, eng->body, len);
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
        double b = eng->vt.capacity > 0 ? hvd_eng_vote_deadline(eng) : -1;
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

    pthread_mutex_lock(&hvd_eng_lock);
    waiting =
        eng->queue_head != NULL || (eng->stop_requested && !eng->stop_seen);
    pthread_mutex_unlock(&hvd_eng_lock);
    waiting = waiting || hvd_eng_dev_ready(eng);
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
    pthread_mutex_lock(&hvd_eng_lock);
    if (eng->queue_head == NULL && !eng->stop_requested && !eng->gpu_woken)
        pthread_cond_timedwait(&hvd_eng_cond, &hvd_eng_lock, &ts);
    eng->gpu_woken = 0;
    pthread_mutex_unlock(&hvd_eng_lock);
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
            st = hvd_eng_send_msg(eng, r, MSG_STOP, NULL, 0);
        for (int r = 1; r < eng->size && st == HVD_OK; r++)
            for (type = 0; st == HVD_OK && type != MSG_STOP;)
                st = hvd_eng_take_msg(eng, r, &type, &len);
    } else {
        st = hvd_eng_send_msg(eng, 0, MSG_STOP, NULL, 0);
        while (st == HVD_OK && type != MSG_STOP)
            st = hvd_eng_take_msg(eng, 0, &type, &len);
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
            st = hvd_eng_post_header(eng, r);
            if (st != HVD_OK)
                return st;
        }
    }
    for (;;) {
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

        if (eng->rank == 0) {
            int ran = 0, last = 0;
            int news;
            hvd_eng_swap_timeline(eng);
            news = hvd_eng_has_news(eng, stop);
            if (news && eng->cfg.cycle_time_ms > 0) {
                /* Batching window: let more work arrive first. */
                int64_t end =
                    hvd_now_ns() + (int64_t)eng->cfg.cycle_time_ms * 1000000;
                while (hvd_now_ns() < end) {
                    st = idle_wait(eng,
                                   (int)((end - hvd_now_ns()) / 1000000) + 1);
                    if (st != HVD_OK)
                        return st;
                    hvd_eng_intake(eng, &stop);
                }
            }
            st = hvd_eng_local_update(eng, stop, now_s());
            if (st == HVD_OK && eng->size > 1)
                st = hvd_eng_read_updates(eng, now_s());
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
            if (hvd_eng_has_news(eng, stop)) {
                st = send_update(eng, stop);
                if (st != HVD_OK)
                    return st;
            }
            if (p->req.done) {
                uint32_t type;
                size_t len;
                st = hvd_eng_take_msg(eng, 0, &type, &len);
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

void *hvd_eng_main(void *arg) {
    hvd_engine *eng = arg;
    hvd_status st;

    hvd_log_set_rank(eng->rank);
    st = engine_loop(eng);
    if (st == HVD_OK)
        st = hvd_eng_dev_drain(eng);
    if (st != HVD_OK) {
        hvd_eng_fail(eng, st);
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        hvd_devexec_abort(eng->dev);
        hvd_eng_dev_fail_all(eng, st, text);
        hvd_eng_fail_all(eng, st, text);
    } else {
        char text[160];
        snprintf(text, sizeof(text),
                 "hvd shut down on rank %d before this operation ran",
                 eng->rank);
        hvd_eng_fail_all(eng, HVD_ERR_SHUTDOWN, text);
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
