/* The engine (engine.h): control messages between rank 0 and the others, and
 * taking submitted requests in. */

#include "api/runtime/engine_internal.h"

/* ------------------------------------------------------------------ */
/* Control messages                                                    */

hvd_status hvd_eng_post_header(hvd_engine *eng, int peer) {
    ctrl_port *p = &eng->ports[eng->rank == 0 ? peer : 0];

    return hvd_comm_irecv(eng->ctrl, peer, &p->hdr, sizeof(p->hdr), &p->req);
}

/* Sends a header and its body, and waits until both are out. */
hvd_status hvd_eng_send_msg(hvd_engine *eng, int peer, uint32_t type,
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

hvd_status hvd_eng_body_room(hvd_engine *eng, size_t len) {
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
hvd_status hvd_eng_take_msg(hvd_engine *eng, int peer, uint32_t *type_out,
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
        st = hvd_eng_body_room(eng, hdr.len);
        if (st == HVD_OK)
            st = hvd_comm_irecv(eng->ctrl, peer, eng->body, hdr.len, &body);
        if (st == HVD_OK)
            st = hvd_comm_wait(eng->ctrl, &body);
        if (st != HVD_OK)
            return st;
    }
    *type_out = hdr.type;
    *len_out = hdr.len;
    return hdr.type == MSG_STOP ? HVD_OK : hvd_eng_post_header(eng, peer);
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
    slot = hvd_cache_lookup(&eng->cache, req->name);
    if (slot < 0)
        return;
    if (hvd_opdesc_equal(&eng->cache.slots[slot].desc, &req->desc)) {
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

/* Takes what the submitters queued; *stop says whether to stop. */
void hvd_eng_intake(hvd_engine *eng, int *stop) {
    hvd_request *q;

    pthread_mutex_lock(&hvd_eng_lock);
    q = eng->queue_head;
    eng->queue_head = eng->queue_tail = NULL;
    *stop = eng->stop_requested;
    eng->stop_seen = eng->stop_requested;
    pthread_mutex_unlock(&hvd_eng_lock);
    while (q != NULL) {
        hvd_request *next = q->next;
        q->next = NULL;
        if (pending_push(eng, q) != 0) {
            hvd_eng_complete(eng, q, HVD_ERR_NO_MEMORY, "out of memory");
        } else {
            hvd_eng_classify(eng, q);
            hvd_timeline_begin(eng->timeline, q->name,
                               negotiate_event(q->desc.kind), q->t_submit,
                               q->state == REQ_CACHED ? "\"cached\": true"
                                                      : "\"cached\": false");
        }
        q = next;
    }
}

/* 1 if rank 0 does not know all of this rank's state yet. */
int hvd_eng_has_news(const hvd_engine *eng, int stop) {
    if ((stop && !eng->stop_told) || eng->ninval > 0)
        return 1;
    for (int i = 0; i < eng->npending; i++) {
        const hvd_request *req = eng->pending[i];
        if (req->state == REQ_NEW || (req->state == REQ_CACHED && !req->voted))
            return 1;
    }
    return 0;
}
