/* The engine (engine.h): applying a cycle on every rank, alike: the
 * erasures, the slots every rank offered, rank 0's responses, then what the
 * cache learns and where the pending requests go next. */

#include "api/runtime/engine_state.h"

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

/* Slots some rank invalidated are dropped everywhere. */
static hvd_status erase_slots(hvd_engine *eng, const Hvd__Engine__Cycle *c) {
    hvd_cache *cache = &eng->cache;

    for (size_t i = 0; i < c->n_erase; i++) {
        int s = (int)c->erase[i];
        if (s >= cache->nslots)
            return hvd_error_set(
                HVD_ERR_PROTOCOL, "cycle %llu erases slot %d of %d",
                (unsigned long long)c->number, s, cache->nslots);
        for (int k = 0; k < eng->npending; k++)
            if (eng->pending[k]->slot == s &&
                eng->pending[k]->state == REQ_CACHED)
                unbind(eng->pending[k]);
        hvd_cache_erase(cache, s);
        if (eng->rank == 0) {
            hvd_eng_vote_reset(&eng->vt, eng->size, s, c->number);
            eng->vt.nerase -= eng->vt.erase[s];
            eng->vt.erase[s] = 0;
        }
    }
    return HVD_OK;
}

/* The cache learns the negotiated operations of the cycle's nresp
 * responses, in order, on every rank alike. */
static hvd_status learn(hvd_engine *eng, const Hvd__Engine__Cycle *c,
                        size_t nresp) {
    hvd_cache *cache = &eng->cache;

    for (size_t i = 0; i < nresp; i++) {
        resp *r = &eng->resps[i];
        if (r->cached || r->status != HVD_OK || r->desc.kind == HVD_KIND_JOIN ||
            r->desc.kind == HVD_KIND_CALL || r->desc.kind == HVD_KIND_PSET ||
            r->contributors != hvd_eng_pset_size(eng, r->desc.pset) ||
            cache->capacity == 0)
            continue;
        int s = hvd_cache_put(cache, r->name, &r->desc, c->number);
        if (s < 0)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory in the response cache");
        if (eng->rank == 0)
            hvd_eng_vote_reset(&eng->vt, eng->size, s, c->number);
    }
    return HVD_OK;
}

/* Runs cycle c; every rank runs every cycle, in number order. */
hvd_status hvd_eng_run_cycle(hvd_engine *eng, const Hvd__Engine__Cycle *c) {
    hvd_cache *cache = &eng->cache;
    size_t nresp = 0;
    hvd_status st;

    eng->cycle = c->number;
    eng->n_cached = eng->n_negotiated = eng->n_collectives = 0;
    if (eng->mark_cycles)
        hvd_timeline_mark(eng->timeline, "CYCLE_START", hvd_now_ns());

    st = erase_slots(eng, c);
    if (st != HVD_OK)
        return st;
    st = resps_room(eng, c->n_run + c->n_responses);
    if (st != HVD_OK)
        return st;
    for (size_t i = 0; i < c->n_run; i++) {
        int s = (int)c->run[i];
        if (s >= cache->nslots || cache->slots[s].name == NULL)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "cycle %llu runs empty cache slot %d",
                                 (unsigned long long)c->number, s);
        resp *r = &eng->resps[nresp++];
        memset(r, 0, sizeof(*r));
        r->name = cache->slots[s].name;
        r->hash = cache->slots[s].hash;
        r->desc = cache->slots[s].desc;
        r->status = HVD_OK;
        r->contributors = hvd_eng_pset_size(eng, r->desc.pset);
        r->cached = 1;
        if (eng->carried_all[i])
            r->parts = &eng->parts[i * (size_t)eng->size];
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
        r->hash = hvd_namemap_hash(g->name);
        r->status = (hvd_status)g->status;
        r->error = g->error;
        r->contributors = (int)g->contributors;
        r->last_joined = g->last_joined;
        r->created_set = (int)g->created_set;
        r->self_joined = in_list(g->joined, g->n_joined, eng->rank);
        /* The collective runs over this rank's buffers, sized by its own
         * request: rank 0 must have decided the same operation. */
        const hvd_request *req =
            hvd_namemap_get_h(&eng->by_name, r->name, r->hash);
        if (req != NULL && r->status == HVD_OK &&
            !hvd_opdesc_agree(&req->desc, &r->desc)) {
            char mine[160], theirs[160];
            hvd_opdesc_format(&req->desc, mine, sizeof(mine));
            hvd_opdesc_format(&r->desc, theirs, sizeof(theirs));
            return hvd_error_set(HVD_ERR_PROTOCOL,
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

    st = learn(eng, c, nresp);
    if (st != HVD_OK)
        return st;

    /* Requests whose slot changed hands go back to rank 0's table; new
     * ones the cache now knows take the cache path. */
    eng->paused = c->paused;
    for (int k = 0; k < eng->npending; k++) {
        hvd_request *req = eng->pending[k];
        if (req->state == REQ_CACHED &&
            (eng->paused || cache->slots[req->slot].name == NULL ||
             strcmp(cache->slots[req->slot].name, req->name) != 0 ||
             !hvd_opdesc_agree(&cache->slots[req->slot].desc, &req->desc)))
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
