/* The engine (engine.h): rank 0's vote table: which ranks have each cached
 * operation ready, and stalls. */

#include "api/runtime/engine_state.h"

/* ------------------------------------------------------------------ */
/* Rank 0: votes and decisions                                         */

int hvd_eng_vote_init(vote_table *vt, int size, int capacity) {
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

void hvd_eng_vote_free(vote_table *vt) {
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
    vt->total++;
    if (vt->count[slot]++ == 0) {
        vt->first[slot] = now;
        vt->warned[slot] = -1;
    }
}

/* Forgets every vote for slot: it ran, was erased or now names another
 * operation (from cycle on). A request to erase it stays until it is
 * erased: one that came while the slot ran still holds. */
void hvd_eng_vote_reset(vote_table *vt, int size, int slot, uint64_t cycle) {
    for (int r = 0; r < size; r++)
        vt->votes[(size_t)r * (size_t)vt->capacity + (size_t)slot] = 0;
    vt->total -= vt->count[slot];
    vt->count[slot] = 0;
    vt->changed[slot] = cycle;
}

void hvd_eng_vote_erase(vote_table *vt, int slot) {
    vt->nerase += !vt->erase[slot];
    vt->erase[slot] = 1;
}

/* Forgets the votes for slot, nothing else. */
void hvd_eng_vote_clear(vote_table *vt, int size, int slot) {
    for (int r = 0; r < size; r++)
        vt->votes[(size_t)r * (size_t)vt->capacity + (size_t)slot] = 0;
    vt->total -= vt->count[slot];
    vt->count[slot] = 0;
}

/* Rank 0 records its own news as if it had sent itself an Update. */
hvd_status hvd_eng_local_update(hvd_engine *eng, int stop, double now) {
    vote_table *vt = &eng->vt;

    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        if (req->state == REQ_NEW) {
            hvd_status st =
                hvd_coord_add(eng->coord, 0, req->name, &req->desc, 0, now);
            if (st != HVD_OK)
                return st;
            req->state = REQ_SENT;
        }
    }
    for (int i = 0; i < eng->ninval; i++)
        hvd_eng_vote_erase(vt, (int)eng->inval[i]);
    eng->ninval = 0;
    if (stop) {
        vt->stop[0] = 1;
        eng->stop_told = 1;
        hvd_coord_stopped(eng->coord, 0);
    }
    return HVD_OK;
}

/* Rank 0 takes what rank offered in the last step: its votes are now
 * the slots it lists, except those the step ran, erased or reused. */
void hvd_eng_vote_offers(hvd_engine *eng, int rank, const uint32_t *ready,
                         size_t n, double now) {
    vote_table *vt = &eng->vt;
    uint8_t *row = &vt->votes[(size_t)rank * (size_t)vt->capacity];

    for (size_t i = 0; i < n; i++)
        if (ready[i] < (uint32_t)vt->capacity)
            row[ready[i]] |= 2; /* offered now */
    for (int s = 0; s < eng->cache.nslots; s++) {
        int offered = (row[s] & 2) && vt->changed[s] != eng->cycle;
        row[s] &= 1;
        if (offered && !row[s]) {
            vote_set(vt, rank, s, now);
        } else if (!offered && row[s]) {
            row[s] = 0;
            vt->count[s]--;
            vt->total--;
        }
    }
}

/* Rank 0 takes another rank's Update. */
hvd_status hvd_eng_apply_update(hvd_engine *eng, int rank, const uint8_t *buf,
                                size_t len, double now) {
    vote_table *vt = &eng->vt;
    Hvd__Engine__Update *u = hvd__engine__update__unpack(NULL, len, buf);
    hvd_status st = HVD_OK;

    if (u == NULL)
        return hvd_error_set(HVD_ERR_PROTOCOL, "malformed update from rank %d",
                             rank);
    /* Its votes come with its steps (hvd_eng_vote_offers). */
    for (size_t i = 0; i < u->n_invalidate; i++)
        if (u->invalidate[i] < (uint32_t)vt->capacity)
            hvd_eng_vote_erase(vt, (int)u->invalidate[i]);
    for (size_t i = 0; i < u->n_requests && st == HVD_OK; i++) {
        const Hvd__Engine__Request *it = u->requests[i];
        hvd_opdesc d;
        st = hvd_ctrl_check_request(it, eng->size, &d);
        if (st != HVD_OK)
            hvd_error_prefix("malformed update from rank %d: ", rank);
        else
            st = hvd_coord_add(eng->coord, rank, it->name, &d, it->age_s, now);
    }
    if (u->stop) {
        vt->stop[rank] = 1;
        hvd_coord_stopped(eng->coord, rank);
    }
    hvd__engine__update__free_unpacked(u, NULL);
    return st;
}

/* "1,3" for the ranks that do (want = 1) or do not vote for slot. */
static void voters(const hvd_engine *eng, int slot, int want, char *out,
                   size_t outlen) {
    size_t off = 0;
    int id = eng->cache.slots[slot].desc.pset;

    out[0] = '\0';
    for (int r = 0; r < eng->size && off + 16 < outlen; r++)
        if (hvd_eng_pset_has(eng, id, r) &&
            eng->vt.votes[(size_t)r * (size_t)eng->vt.capacity +
                          (size_t)slot] == want)
            off += (size_t)snprintf(out + off, outlen - off, "%s%d",
                                    off ? "," : "", r);
}

/* When a cached operation some ranks wait for needs the stall inspector
 * (a time in seconds), or -1. */
double hvd_eng_vote_deadline(const hvd_engine *eng) {
    const vote_table *vt = &eng->vt;
    double next = -1;

    for (int s = 0; s < eng->cache.nslots; s++) {
        double t = -1;
        if (vt->count[s] == 0 ||
            vt->count[s] ==
                hvd_eng_pset_size(eng, eng->cache.slots[s].desc.pset))
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

static Hvd__Engine__Response *
failed_response(const hvd_cache_entry *e, hvd_status status, const char *text) {
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
    r->process_set = (uint32_t)e->desc.pset;
    r->counts = malloc(e->desc.ncounts * sizeof(uint64_t));
    r->shape =
        malloc((e->desc.ndims ? (size_t)e->desc.ndims : 1) * sizeof(int64_t));
    r->status = status;
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
hvd_status hvd_eng_vote_stalls(hvd_engine *eng, double now,
                               Hvd__Engine__ResponseList *list) {
    vote_table *vt = &eng->vt;

    if (vt->total == 0)
        return HVD_OK; /* no slot waits for anyone */
    for (int s = 0; s < eng->cache.nslots; s++) {
        char missing[128], have[128], text[HVD_ERROR_MAX];
        const hvd_cache_entry *e = &eng->cache.slots[s];
        double age;

        if (vt->count[s] == 0 || e->name == NULL ||
            vt->count[s] == hvd_eng_pset_size(eng, e->desc.pset))
            continue;
        age = now - vt->first[s];
        voters(eng, s, 0, missing, sizeof(missing));
        voters(eng, s, 1, have, sizeof(have));
        int gone = 0;
        for (int r = 0; r < eng->size; r++)
            gone |= vt->stop[r] && hvd_eng_pset_has(eng, e->desc.pset, r) &&
                    !vt->votes[(size_t)r * (size_t)vt->capacity + (size_t)s];
        if (gone || (eng->cfg.stall_shutdown_s > 0 &&
                     age >= eng->cfg.stall_shutdown_s)) {
            hvd_status status = HVD_ERR_TIMEOUT;
            if (gone) {
                /* A stopped rank told rank 0 only after it had offered all
                 * it had (engine_cycle.c): it will never offer this. */
                status = HVD_ERR_SHUTDOWN;
                snprintf(text, sizeof(text),
                         "'%s': rank(s) %s called hvd_shutdown without "
                         "submitting it",
                         e->name, missing);
            } else {
                snprintf(text, sizeof(text),
                         "'%s' waited %.0f s for rank(s) %s to submit it; "
                         "failing it (HVD_STALL_SHUTDOWN_SECONDS=%g)",
                         e->name, age, missing, eng->cfg.stall_shutdown_s);
                HVD_ERROR("engine", "%s", text);
            }
            Hvd__Engine__Response *r = failed_response(e, status, text);
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
            hvd_eng_vote_clear(vt, eng->size, s);
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
