/* The engine (engine.h): control messages between the ranks, and taking
 * submitted requests in. */

#include "api/runtime/engine_state.h"

/* ------------------------------------------------------------------ */
/* Control messages                                                    */

/* Grows *buf to at least len bytes; 0 on success. */
int hvd_eng_room(void **buf, size_t *cap, size_t len) {
    if (len > *cap) {
        size_t c = hvd_grow_cap(len, 0);
        void *p = realloc(*buf, c);
        if (p == NULL)
            return -1;
        *buf = p;
        *cap = c;
    }
    return 0;
}

static hvd_status post_header(hvd_engine *eng, int peer) {
    ctrl_port *p = &eng->ports[peer];

    p->in_body = 0;
    return hvd_comm_irecv_upto(eng->ctrl, peer, p->in.frame, CTRL_FIRST,
                               &p->req);
}

/* Posts a header receive from every peer (before the first step). */
hvd_status hvd_eng_open_ports(hvd_engine *eng) {
    for (int r = 0; r < eng->size; r++) {
        if (r == eng->rank)
            continue;
        eng->ports[r].next_step = 1;
        hvd_status st = post_header(eng, r);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

/* Fills frame (CTRL_FIRST bytes) with the header and the start of the
 * body (unless the body is there already); returns the length of the
 * first message. The rest of the body, from body + ctrl_head(len),
 * follows in a second message (ctrl_rest). */
size_t hvd_eng_frame(uint8_t *frame, uint32_t type, uint32_t proto_len,
                     const void *body, size_t len) {
    msg_header hdr = {.type = type, .proto_len = proto_len, .len = len};
    size_t head = ctrl_head(len);

    memcpy(frame, &hdr, sizeof(hdr));
    if (head > 0 && frame + sizeof(hdr) != (const uint8_t *)body)
        memcpy(frame + sizeof(hdr), body, head);
    return sizeof(hdr) + head;
}

/* Sends a message (its first message, then the rest of its body) and
 * waits until it is out. */
hvd_status hvd_eng_send_msg(hvd_engine *eng, int peer, uint32_t type,
                            const void *body, size_t len) {
    uint8_t frame[CTRL_FIRST];
    size_t first = hvd_eng_frame(frame, type, 0, body, len);
    size_t rest = ctrl_rest(len);
    hvd_req req[2];
    hvd_sendv msgs[2] = {{frame, first},
                         {(const uint8_t *)body + ctrl_head(len), rest}};
    hvd_status st =
        hvd_comm_isendv(eng->ctrl, peer, msgs, rest > 0 ? 2 : 1, req);

    if (st == HVD_OK)
        st = hvd_comm_waitall(eng->ctrl, req, rest > 0 ? 2 : 1);
    return st;
}

hvd_status hvd_eng_body_room(hvd_engine *eng, size_t len) {
    if (hvd_eng_room((void **)&eng->body, &eng->body_cap, len) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    return HVD_OK;
}

static hvd_status take_body(hvd_engine *eng, int peer, double now);

/* A frame has come from peer: checks its header, copies the start of
 * the body into the buffer it belongs to and posts the receive of the
 * rest, or handles the message if it is all there. */
static hvd_status take_header(hvd_engine *eng, int peer, double now,
                              int *again) {
    ctrl_port *p = &eng->ports[peer];
    msg_header *h = &p->in.hdr;
    int step = h->type == MSG_STEP || h->type == MSG_BRIEF;
    hvd_status st;
    void *dst;

    *again = 0;
    if (p->req.got < sizeof(*h))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "malformed control message (%zu bytes, shorter "
                             "than its header) from rank %d",
                             p->req.got, peer);
    if (h->type < MSG_UPDATE || h->type > MSG_BRIEF ||
        p->req.got != sizeof(*h) + ctrl_head(h->len) ||
        h->len > ((uint64_t)1 << 32) || h->proto_len > h->len ||
        (h->type == MSG_UPDATE && eng->rank != 0) || (step && h->len == 0) ||
        (h->type == MSG_STOP && h->len != 0))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "malformed control message (type %u, %llu "
                             "bytes) from rank %d",
                             h->type, (unsigned long long)h->len, peer);
    if (h->type == MSG_STOP) {
        p->closed = 1;
        return HVD_OK;
    }

    if (step) {
        step_msg *m = &p->step[p->next_step & 1];
        /* A peer starts a step only once it has this rank's part of the
         * one before: it is never two ahead. */
        if (m->msg != NULL)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "rank %d sent step %llu before step %llu "
                                 "had run here",
                                 peer, (unsigned long long)p->next_step,
                                 (unsigned long long)p->next_step - 2);
        if (hvd_eng_room((void **)&m->buf, &m->cap, h->len) != 0)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        dst = m->buf;
    } else {
        if (hvd_eng_room((void **)&p->body, &p->body_cap, h->len) != 0)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        dst = p->body;
    }
    if (h->len <= CTRL_INLINE) {
        if (h->len > 0)
            memcpy(dst, p->in.frame + sizeof(*h), h->len);
        *again = 1;
        return take_body(eng, peer, now);
    }
    memcpy(dst, p->in.frame + sizeof(*h), CTRL_LONG_HEAD);
    p->in_body = 1;
    st = hvd_comm_irecv(eng->ctrl, peer, (uint8_t *)dst + CTRL_LONG_HEAD,
                        h->len - CTRL_LONG_HEAD, &p->req);
    *again = st == HVD_OK; /* the rest may be there already */
    return st;
}

/* A whole message has come from peer: acts on it and posts the next
 * frame receive. */
static hvd_status take_body(hvd_engine *eng, int peer, double now) {
    ctrl_port *p = &eng->ports[peer];
    msg_header *h = &p->in.hdr;
    hvd_status st = HVD_OK;

    if (h->type == MSG_UPDATE) {
        st = hvd_eng_apply_update(eng, peer, p->body, h->len, now);
    } else {
        step_msg *m = &p->step[p->next_step & 1];
        if (h->type == MSG_BRIEF) {
            st = hvd_ctrl_brief_unpack(m->buf, h->proto_len, &m->brief,
                                       peer == 0 ? &m->brief_cycle : NULL);
            if (st != HVD_OK) {
                hvd_error_prefix("malformed step message from rank %d: ", peer);
                return st;
            }
            m->msg = &m->brief;
        } else {
            m->msg =
                hvd__engine__step__unpack(&m->arena.pb, h->proto_len, m->buf);
        }
        if (m->msg == NULL) {
            hvd_arena_reset(&m->arena);
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "malformed step message from rank %d", peer);
        }
        if (m->msg->number != p->next_step) {
            st = hvd_error_set(HVD_ERR_PROTOCOL,
                               "step %llu from rank %d where step %llu was "
                               "expected",
                               (unsigned long long)m->msg->number, peer,
                               (unsigned long long)p->next_step);
            hvd_arena_reset(&m->arena);
            m->msg = NULL;
            return st;
        }
        /* Carried data starts at the next multiple of 8 (engine_step.c). */
        size_t dstart = ((size_t)h->proto_len + 7) & ~(size_t)7;
        m->data = m->buf + dstart;
        m->data_len = h->len > dstart ? h->len - dstart : 0;
        p->next_step++;
    }
    if (st != HVD_OK)
        return st;
    return post_header(eng, peer);
}

/*
 * Takes every control message that has come: rank 0 applies updates at
 * once, step messages wait in their port for the step to finish, STOP
 * closes the port. Never blocks.
 */
hvd_status hvd_eng_pump(hvd_engine *eng, double now) {
    for (int r = 0; r < eng->size; r++) {
        ctrl_port *p = &eng->ports[r];
        int again = 1;

        if (r == eng->rank)
            continue;
        while (again && !p->closed && p->req.done) {
            hvd_status st = p->req.status;
            if (st != HVD_OK)
                return st;
            if (p->in_body) {
                st = take_body(eng, r, now);
                again = st == HVD_OK;
            } else {
                st = take_header(eng, r, now, &again);
            }
            if (st != HVD_OK)
                return st;
        }
    }
    return HVD_OK;
}

/* 1 if a control message (or part of one) waits to be taken. */
int hvd_eng_port_ready(const hvd_engine *eng) {
    for (int r = 0; r < eng->size; r++)
        if (r != eng->rank && !eng->ports[r].closed && eng->ports[r].req.done)
            return 1;
    return 0;
}

/*
 * Every rank has stopped: the header receives still posted are completed
 * by a last STOP message from every rank to every rank (updates sent
 * before it are taken and dropped), so nothing is in flight when the
 * transport says goodbye.
 */
hvd_status hvd_eng_close_ports(hvd_engine *eng) {
    hvd_status st = HVD_OK;

    for (int r = 0; r < eng->size && st == HVD_OK; r++)
        if (r != eng->rank)
            st = hvd_eng_send_msg(eng, r, MSG_STOP, NULL, 0);
    for (int r = 0; r < eng->size && st == HVD_OK; r++) {
        ctrl_port *p = &eng->ports[r];
        while (st == HVD_OK && r != eng->rank && !p->closed) {
            st = hvd_comm_wait(eng->ctrl, &p->req);
            if (st == HVD_OK)
                st = hvd_eng_pump(eng, 0);
        }
    }
    return st;
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
    if (hvd_namemap_put_h(&eng->by_name, req->name, req->hash, req) != 0)
        return -1;
    eng->pending[eng->npending++] = req;
    return 0;
}

int hvd_eng_invalidate(hvd_engine *eng, int slot) {
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
void hvd_eng_classify(hvd_engine *eng, hvd_request *req) {
    int slot;

    if (req->state != REQ_NEW || req->desc.kind == HVD_KIND_JOIN ||
        req->desc.kind == HVD_KIND_CALL || eng->paused)
        return;
    slot = hvd_cache_lookup(&eng->cache, req->name, req->hash);
    if (slot < 0)
        return;
    /* An alltoall's counts are its own each time: they are exchanged
     * when it runs. */
    if (hvd_opdesc_agree(&eng->cache.slots[slot].desc, &req->desc)) {
        req->state = REQ_CACHED;
        req->slot = slot;
        req->voted = 0;
    } else {
        hvd_eng_invalidate(eng, slot);
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

/* Takes a submitted request in: pending, and bound to its cache slot if
 * the cache knows it. */
void hvd_eng_take(hvd_engine *eng, hvd_request *req) {
    if (pending_push(eng, req) != 0) {
        hvd_eng_complete(eng, req, HVD_ERR_NO_MEMORY, "out of memory");
        return;
    }
    hvd_eng_classify(eng, req);
    hvd_timeline_begin(eng->timeline, req->name,
                       negotiate_event(req->desc.kind), req->t_submit,
                       req->state == REQ_CACHED ? "\"cached\": true"
                                                : "\"cached\": false");
}

/* Takes what the submitters queued; *stop says whether to stop. */
void hvd_eng_intake(hvd_engine *eng, int *stop) {
    hvd_request *q;

    /* Most passes find nothing new: they need not take the lock. */
    if (!hvd_eng_queued(eng)) {
        *stop = eng->stop_seen;
        return;
    }
    pthread_mutex_lock(&hvd_eng_lock);
    q = eng->queue_head;
    __atomic_store_n(&eng->queue_head, NULL, __ATOMIC_RELAXED);
    eng->queue_tail = NULL;
    *stop = eng->stop_requested;
    eng->stop_seen = eng->stop_requested;
    pthread_mutex_unlock(&hvd_eng_lock);
    while (q != NULL) {
        hvd_request *next = q->next;
        q->next = NULL;
        hvd_eng_take(eng, q);
        q = next;
    }
}

/* 1 if a request was submitted or a stop asked for since the last
 * intake: a look without the lock (both are set under it, atomically). */
int hvd_eng_queued(const hvd_engine *eng) {
    return __atomic_load_n(&eng->queue_head, __ATOMIC_ACQUIRE) != NULL ||
           __atomic_load_n(&eng->stop_requested, __ATOMIC_ACQUIRE) !=
               eng->stop_seen;
}

/* 1 if rank 0 does not know all of this rank's state yet: requests the
 * cache does not know, invalidated slots, that it stops. */
int hvd_eng_has_news(const hvd_engine *eng, int stop) {
    if ((stop && !eng->stop_told) || eng->ninval > 0)
        return 1;
    for (int i = 0; i < eng->npending; i++)
        if (eng->pending[i]->state == REQ_NEW)
            return 1;
    return 0;
}

/* 1 if a cached request has not been offered in a step yet. */
int hvd_eng_has_offers(const hvd_engine *eng) {
    for (int i = 0; i < eng->npending; i++)
        if (eng->pending[i]->state == REQ_CACHED && !eng->pending[i]->voted)
            return 1;
    return 0;
}
