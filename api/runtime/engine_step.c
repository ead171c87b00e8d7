/*
 * The engine (engine.h): a step. Every rank sends its part of step k (a
 * Step message: the cache slots it has requests for, the data of the small
 * ones, and on rank 0 what it decided) to every other rank; once a rank
 * has every part, it runs cycle k: the slots every rank offers, after rank
 * 0's erasures and before its negotiated responses. Every rank computes
 * that from the same messages, so they all run the same cycle without
 * asking rank 0, and a slot whose data every rank carried is finished
 * where it arrived (engine_carry.c), with no collective at all
 * (docs/design.md, "Steps").
 */

#include "api/runtime/engine_state.h"

int hvd_eng_step_init(hvd_engine *eng) {
    size_t cap =
        eng->cfg.cache_capacity > 0 ? (size_t)eng->cfg.cache_capacity : 1;
    size_t n = (size_t)eng->size;

    for (size_t r = 0; r < n; r++)
        for (int k = 0; k < 2; k++)
            hvd_arena_init(&eng->ports[r].step[k].arena);
    eng->mine_ready = calloc(cap, sizeof(*eng->mine_ready));
    eng->mine_carried = calloc(cap, sizeof(*eng->mine_carried));
    eng->mine_creq = calloc(cap, sizeof(*eng->mine_creq));
    eng->out_req = calloc(2 * n, sizeof(*eng->out_req));
    eng->run = calloc(cap, sizeof(*eng->run));
    eng->offers = calloc(cap, sizeof(*eng->offers));
    eng->offered_by = calloc(cap, sizeof(*eng->offered_by));
    eng->run_index = calloc(cap, sizeof(*eng->run_index));
    eng->carried_all = calloc(cap, sizeof(*eng->carried_all));
    eng->parts = calloc(cap * n, sizeof(*eng->parts));
    eng->dec_erase = calloc(cap, sizeof(*eng->dec_erase));
    eng->outs = calloc(n, sizeof(*eng->outs));
    eng->outs_cap = calloc(n, sizeof(*eng->outs_cap));
    return eng->mine_ready && eng->mine_carried && eng->mine_creq &&
                   eng->out_req && eng->run && eng->offers && eng->offered_by &&
                   eng->run_index && eng->carried_all && eng->parts &&
                   eng->dec_erase && eng->outs && eng->outs_cap
               ? 0
               : -1;
}

void hvd_eng_step_free(hvd_engine *eng) {
    for (int r = 0; eng->ports != NULL && r < eng->size; r++) {
        ctrl_port *p = &eng->ports[r];
        for (int k = 0; k < 2; k++) {
            hvd_arena_destroy(&p->step[k].arena);
            free(p->step[k].buf);
        }
        free(p->body);
    }
    hvd_coord_free_responses(&eng->dec_list);
    for (int r = 0; eng->outs != NULL && r < eng->size; r++)
        free(eng->outs[r]);
    free(eng->outs);
    free(eng->outs_cap);
    free(eng->out);
    free(eng->mine_ready);
    free(eng->mine_carried);
    free(eng->mine_creq);
    free(eng->out_req);
    free(eng->run);
    free(eng->offers);
    free(eng->offered_by);
    free(eng->run_index);
    free(eng->carried_all);
    free(eng->parts);
    free(eng->dec_erase);
}

/* The part of step k that rank r sent (or this rank's own). */
static step_msg *part_of(hvd_engine *eng, int r, uint64_t k) {
    return r == eng->rank ? &eng->mine : &eng->ports[r].step[k & 1];
}

/* 1 if a peer has sent its part of the next step. */
int hvd_eng_peer_started(const hvd_engine *eng) {
    for (int r = 0; r < eng->size; r++)
        if (r != eng->rank && eng->ports[r].step[(eng->cycle + 1) & 1].msg)
            return 1;
    return 0;
}

/* The data of a step message starts at a multiple of 8 bytes (the body
 * starts so aligned: its buffers come from malloc), and so does each part
 * in it (engine_carry.c), so that each is read where it lies. */
static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Bytes a cached request's data takes in the step message (padded), if
 * it may travel there after `used` bytes of others, or else an
 * alltoall's counts alone (req->counts_only); else 0 with *ok = 0. */
static size_t carry_bytes(const hvd_engine *eng, hvd_request *req, size_t used,
                          int *ok) {
    size_t bytes = 0;

    req->counts_only = 0;
    *ok = hvd_eng_carries(eng, req);
    if (*ok) {
        bytes = hvd_eng_part_bytes(eng, req);
        *ok = used + bytes <= eng->cfg.step_carry_bytes;
    }
    if (!*ok && hvd_eng_carries_counts(eng, req)) {
        req->counts_only = 1;
        bytes = hvd_eng_part_bytes(eng, req);
        *ok = used + bytes <= eng->cfg.step_carry_bytes;
        req->counts_only = *ok;
    }
    return *ok ? bytes : 0;
}

/*
 * Writes the message of this rank's part of the step for rank dest into
 * *buf (grown as needed): the header, the Step m (brief bytes of it in
 * the brief form, else proto bytes of protobuf), then every carried
 * request's part for dest. Returns its length, 0 when out of memory;
 * *first: the bytes of its first message, *data_at and *data_len: where
 * the parts lie and how long they are.
 */
static size_t write_msg(hvd_engine *eng, const Hvd__Engine__Step *m,
                        size_t brief, size_t proto, int dest, uint8_t **buf,
                        size_t *cap, size_t *first, uint8_t **data_at,
                        size_t *data_len) {
    size_t data = 0;

    for (size_t i = 0; i < m->n_carried; i++)
        data += hvd_eng_part_bytes_to(eng, eng->mine_creq[i], dest);
    size_t dstart = data > 0 ? pad8(proto) : proto;
    size_t total = sizeof(msg_header) + dstart + data;
    if (hvd_eng_room((void **)buf, cap, total) != 0)
        return 0;
    uint8_t *body = *buf + sizeof(msg_header);
    if (brief > 0)
        hvd_ctrl_brief_pack(m, body);
    else
        hvd__engine__step__pack(m, body);
    for (size_t i = 0, off = 0; i < m->n_carried; i++) {
        const hvd_request *req = eng->mine_creq[i];
        hvd_eng_part_write(eng, req, dest, body + dstart + off);
        off += hvd_eng_part_bytes_to(eng, req, dest);
    }
    memset(body + proto, 0, dstart - proto);
    *first = hvd_eng_frame(*buf, brief > 0 ? MSG_BRIEF : MSG_STEP,
                           (uint32_t)proto, body, dstart + data);
    *data_at = body + dstart;
    *data_len = data;
    return total;
}

/*
 * Sends this rank's part of step cycle + 1 to every peer: every cached
 * request it holds (each is offered again in every step until it runs),
 * the data of the small ones among them, and on rank 0 its
 * decision (eng->decision). The sends complete in the background. One
 * message goes to every peer, unless a part differs from one destination
 * to the next (hvd_eng_part_per_peer): then each peer gets its own.
 */
hvd_status hvd_eng_step_start(hvd_engine *eng) {
    Hvd__Engine__Step *m = &eng->mine_msg;
    step_msg *mine = &eng->mine;
    size_t data = 0, proto;
    int per_peer = 0;
    hvd_status st = HVD_OK;

    hvd__engine__step__init(m);
    m->number = eng->cycle + 1;
    m->ready = eng->mine_ready;
    m->carried = eng->mine_carried;
    for (int i = 0; i < eng->npending; i++) {
        hvd_request *req = eng->pending[i];
        int ok;
        if (req->state != REQ_CACHED)
            continue;
        req->voted = 1;
        m->ready[m->n_ready++] = (uint32_t)req->slot;
        size_t bytes = carry_bytes(eng, req, data, &ok);
        if (ok) {
            eng->mine_creq[m->n_carried] = req;
            m->carried[m->n_carried++] = (uint32_t)req->slot;
            data += bytes;
            per_peer |= hvd_eng_part_per_peer(req);
        }
    }
    if (eng->rank == 0) {
        eng->decision.number = m->number;
        m->cycle = &eng->decision;
    }
    /* What goes out: the header, the Step, the data, in one buffer (up
     * to CTRL_FIRST bytes of it the first message, at its own length). A
     * step that only offers and carries slots, as in steady state, goes
     * in the brief form; one that says more, as protobuf. */
    size_t brief = hvd_ctrl_brief_size(m);
    proto = brief > 0 ? brief : hvd__engine__step__get_packed_size(m);
    size_t first, data_len;
    uint8_t *data_at;
    size_t total = write_msg(eng, m, brief, proto, eng->rank, &eng->out,
                             &eng->out_cap, &first, &data_at, &data_len);
    if (total == 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    mine->data = data_at;
    mine->data_len = data_len;
    mine->msg = m;
    for (int r = 0; r < eng->size && st == HVD_OK; r++) {
        hvd_req *q = &eng->out_req[2 * r];
        uint8_t *out = eng->out;
        q[0].done = q[1].done = 1;
        if (r == eng->rank)
            continue;
        if (per_peer) {
            total = write_msg(eng, m, brief, proto, r, &eng->outs[r],
                              &eng->outs_cap[r], &first, &data_at, &data_len);
            if (total == 0)
                return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
            out = eng->outs[r];
        }
        /* The first message and the rest go out together (one system
         * call on TCP). */
        size_t rest = total - first;
        hvd_sendv msgs[2] = {{out, first}, {out + first, rest}};
        st = hvd_comm_isendv(eng->ctrl, r, msgs, rest > 0 ? 2 : 1, q);
    }
    eng->in_step = 1;
    return st;
}

/* 1 once every rank's part of the step is here and this rank's is out. */
int hvd_eng_step_complete(hvd_engine *eng) {
    if (!eng->in_step)
        return 0;
    for (int r = 0; r < eng->size; r++)
        if (part_of(eng, r, eng->cycle + 1)->msg == NULL ||
            !eng->out_req[2 * r].done || !eng->out_req[2 * r + 1].done)
            return 0;
    return 1;
}

/* Bytes rank r's part of the operation in cache slot s takes in its step
 * message at data (avail bytes left); SIZE_MAX if they do not add up. */
static size_t slot_bytes(const hvd_engine *eng, uint32_t s, int r,
                         const uint8_t *data, size_t avail) {
    size_t n = hvd_eng_part_len(eng, &eng->cache.slots[s].desc, r, data, avail);
    return n <= avail ? n : SIZE_MAX;
}

/* Checks that the slots rank r lists (what it does with them: "offers",
 * "carries") hold an operation here. */
static hvd_status check_slots(const hvd_engine *eng, int r, uint64_t step,
                              const uint32_t *slots, size_t n,
                              const char *what) {
    for (size_t i = 0; i < n; i++)
        if (slots[i] >= (uint32_t)eng->cache.nslots ||
            eng->cache.slots[slots[i]].name == NULL)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "step %llu from rank %d %s cache slot %u, "
                                 "which is empty here",
                                 (unsigned long long)step, r, what, slots[i]);
    return HVD_OK;
}

/* Checks rank r's offers and carried data; counts the offers. */
static hvd_status count_offers(hvd_engine *eng, int r, const step_msg *sm) {
    const Hvd__Engine__Step *m = sm->msg;
    size_t data = 0;
    hvd_status st =
        check_slots(eng, r, m->number, m->ready, m->n_ready, "offers");

    if (st == HVD_OK)
        st =
            check_slots(eng, r, m->number, m->carried, m->n_carried, "carries");
    if (st != HVD_OK)
        return st;
    for (size_t i = 0; i < m->n_ready; i++) {
        uint32_t s = m->ready[i];
        if (eng->offered_by[s] != r + 1) { /* once per rank */
            eng->offered_by[s] = r + 1;
            eng->offers[s]++;
        }
    }
    for (size_t i = 0; i < m->n_carried && data != SIZE_MAX; i++) {
        size_t n = slot_bytes(eng, m->carried[i], r, sm->data + data,
                              sm->data_len - data);
        data = n == SIZE_MAX ? n : data + n;
    }
    if (data == SIZE_MAX)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "step %llu from rank %d carries %zu bytes of "
                             "data whose parts do not add up",
                             (unsigned long long)m->number, r, sm->data_len);
    if (data != sm->data_len)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "step %llu from rank %d carries %zu bytes of "
                             "data for %zu tensors of %zu bytes",
                             (unsigned long long)m->number, r, sm->data_len,
                             m->n_carried, data);
    return HVD_OK;
}

/* Points parts[] at every rank's data of each slot to run that every rank
 * carried. */
static void find_parts(hvd_engine *eng, uint64_t step, size_t nrun) {
    size_t n = (size_t)eng->size;

    memset(eng->carried_all, 0, nrun * sizeof(*eng->carried_all));
    for (int r = 0; r < eng->size; r++) {
        const step_msg *sm = part_of(eng, r, step);
        size_t off = 0;
        for (size_t i = 0; i < sm->msg->n_carried; i++) {
            uint32_t s = sm->msg->carried[i];
            int k = eng->run_index[s] - 1;
            if (k >= 0 && eng->carried_all[k] == r) {
                eng->parts[(size_t)k * n + (size_t)r] = sm->data + off;
                eng->carried_all[k]++;
            }
            off += slot_bytes(eng, s, r, sm->data + off, sm->data_len - off);
        }
    }
    /* carried_all[k] counted the ranks in order: size means all did. */
    for (size_t k = 0; k < nrun; k++)
        eng->carried_all[k] = eng->carried_all[k] == eng->size;
}

/*
 * The slot of a *lone* step k, else -1: rank 0 decides nothing in it and
 * every rank offers and carries the one same slot, as in a loop of
 * blocking calls. Such a step needs none of a cycle's general work (no
 * table of offers over every slot, no list of responses): finish_lone
 * runs it. A step that is anything else, malformed ones included, takes
 * the general way, which checks it.
 */
static int lone_slot(hvd_engine *eng, const Hvd__Engine__Cycle *dec,
                     uint64_t k) {
    const Hvd__Engine__Step *m = eng->mine.msg;

    if (dec->n_erase > 0 || dec->n_responses > 0 || dec->paused || dec->stop ||
        eng->paused || eng->timeline != NULL || m->n_ready != 1 ||
        m->n_carried != 1 || m->carried[0] != m->ready[0])
        return -1;
    uint32_t s = m->ready[0]; /* this rank's own: a slot it holds */
    for (int r = 0; r < eng->size; r++) {
        const step_msg *sm = part_of(eng, r, k);
        if (sm->msg->n_ready != 1 || sm->msg->n_carried != 1 ||
            sm->msg->ready[0] != s || sm->msg->carried[0] != s ||
            slot_bytes(eng, s, r, sm->data, sm->data_len) != sm->data_len)
            return -1;
    }
    return (int)s;
}

/* Runs lone step k (slot s): what hvd_eng_run_cycle and the end of
 * hvd_eng_step_finish do for it, in the same order. */
static hvd_status finish_lone(hvd_engine *eng, int s, uint64_t k, double now) {
    hvd_cache_entry *e = &eng->cache.slots[s];
    resp r = {.name = e->name,
              .hash = e->hash,
              .desc = e->desc,
              .status = HVD_OK,
              .contributors = eng->size,
              .cached = 1,
              .parts = eng->parts};

    eng->cycle = k;
    eng->n_cached = 1;
    eng->n_negotiated = eng->n_collectives = 0;
    for (int i = 0; i < eng->size; i++)
        eng->parts[i] = part_of(eng, i, k)->data;
    hvd_cache_touch(&eng->cache, s, k);
    if (eng->rank == 0)
        hvd_eng_vote_reset(&eng->vt, eng->size, s, k);
    /* This rank carried s alone: its request is the one carried. */
    hvd_status st = hvd_eng_run_carried(eng, &r, eng->mine_creq[0]);
    /* Every rank offered only s, which ran: its votes are gone (reset
     * above) and so are those for any slot it did not offer again. With
     * none of those, the table holds nothing to change. */
    if (st == HVD_OK && eng->rank == 0 && eng->vt.total > 0)
        for (int i = 0; i < eng->size; i++)
            hvd_eng_vote_offers(eng, i, part_of(eng, i, k)->msg->ready, 1, now);
    return st;
}

/*
 * Every part is here: runs cycle cycle + 1 (rank 0's decision with the
 * slots every rank offers) and frees the parts. *last: it was the last.
 */
hvd_status hvd_eng_step_finish(hvd_engine *eng, double now, int *last) {
    uint64_t k = eng->cycle + 1;
    const Hvd__Engine__Cycle *dec =
        eng->rank == 0 ? &eng->decision : part_of(eng, 0, k)->msg->cycle;
    Hvd__Engine__Cycle c;
    int ns = eng->cache.nslots;
    size_t nrun = 0;
    hvd_status st = HVD_OK;

    *last = 0;
    if (dec == NULL || dec->number != k) {
        st = hvd_error_set(HVD_ERR_PROTOCOL,
                           "step %llu from rank 0 has no cycle %llu in it",
                           (unsigned long long)k, (unsigned long long)k);
        goto out;
    }
    int lone = lone_slot(eng, dec, k);
    if (lone >= 0) {
        st = finish_lone(eng, lone, k, now);
        goto out;
    }
    memset(eng->offers, 0, (size_t)ns * sizeof(*eng->offers));
    memset(eng->offered_by, 0, (size_t)ns * sizeof(*eng->offered_by));
    memset(eng->run_index, 0, (size_t)ns * sizeof(*eng->run_index));
    for (int r = 0; r < eng->size && st == HVD_OK; r++)
        st = count_offers(eng, r, part_of(eng, r, k));
    if (st != HVD_OK)
        goto out;
    /* Erased slots do not run (their requests go to rank 0 again). */
    for (size_t i = 0; i < dec->n_erase; i++)
        if (dec->erase[i] < (uint32_t)ns)
            eng->offers[dec->erase[i]] = 0;
    /* A slot runs once every member of its process set offers it (every
     * rank, for the job's operations). */
    for (int s = 0; s < ns && !dec->paused; s++) {
        if (eng->offers[s] > 0 &&
            eng->offers[s] ==
                hvd_eng_pset_size(eng, eng->cache.slots[s].desc.pset)) {
            eng->run[nrun++] = (uint32_t)s;
            eng->run_index[s] = (int)nrun;
        }
    }
    find_parts(eng, k, nrun);
    c = *dec;
    c.run = eng->run;
    c.n_run = nrun;
    st = hvd_eng_run_cycle(eng, &c);
    if (st != HVD_OK)
        goto out;
    if (eng->rank == 0 && eng->vt.capacity > 0)
        for (int r = 0; r < eng->size; r++) {
            const Hvd__Engine__Step *m = part_of(eng, r, k)->msg;
            hvd_eng_vote_offers(eng, r, m->ready, c.paused ? 0 : m->n_ready,
                                now);
        }
    *last = c.stop;
out:
    for (int r = 0; r < eng->size; r++) {
        step_msg *sm = part_of(eng, r, k);
        if (r != eng->rank)
            hvd_arena_reset(&sm->arena);
        sm->msg = NULL;
    }
    if (eng->rank == 0)
        hvd_coord_free_responses(&eng->dec_list);
    eng->in_step = 0;
    return st;
}
