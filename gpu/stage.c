#include "gpu/stage.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

/* The channels a transport has (transport.h). */
#define NCHANNELS 2

/* Piece states. A piece of a request is in flight from the moment it is
 * started until it is retired (in order), holding a slot unless empty. */
enum {
    P_COPY = 1, /* a copy is queued (send: device->slot, recv: slot->device) */
    P_READY,    /* send: the slot holds the data, the inner isend waits */
    P_NET,      /* the inner isend or irecv is posted */
    P_DONE,     /* recv: the data is in device memory */
};

typedef struct slot {
    struct slot *next; /* free list */
    void *buf;
    void *mark;
} slot;

typedef struct piece {
    int state;
    slot *slot; /* NULL for an empty piece */
    hvd_req net;
} piece;

typedef struct sop {
    struct sop *next; /* issue order, or the free list */
    hvd_req *user;
    int send;
    int peer;
    int channel;
    uint8_t *buf;
    size_t len;
    size_t npieces;
    size_t started;  /* send: copies queued; recv: irecvs posted */
    size_t posted;   /* send: isends posted */
    size_t finished; /* retired, in order */
    piece *pieces;   /* depth entries: piece k is pieces[k % depth] */
} sop;

typedef struct stage {
    hvd_transport base;
    hvd_transport *inner;
    int size;
    size_t piece_bytes;
    size_t depth;
    hvd_stage_seam seam;
    sop *head, *tail; /* requests in flight, in issue order */
    sop *free_ops;
    slot *free_slots;
    slot **slots; /* every slot allocated */
    size_t nslots, cap_slots;
    size_t slots_used;
    size_t copying; /* pieces in P_COPY */
    /* Per (peer, channel): the pass number in which an earlier request
     * still had inner sends (receives) to post; later requests to that
     * peer and channel then wait, keeping the inner order. */
    uint64_t pass;
    uint64_t *send_block;
    uint64_t *recv_block;
    hvd_status failed;
    char failmsg[HVD_ERROR_MAX];
    hvd_stage_stats stats;
} stage;

static uint8_t empty_byte;

/* ------------------------------------------------------------------ */
/* Slots and requests                                                  */

static hvd_status slot_get(stage *s, slot **out) {
    slot *sl = s->free_slots;

    if (sl == NULL) {
        if (s->nslots == s->cap_slots) {
            size_t cap = s->cap_slots ? 2 * s->cap_slots : 16;
            slot **v = realloc(s->slots, cap * sizeof(*v));
            if (v == NULL)
                return hvd_error_set(HVD_ERR_NO_MEMORY,
                                     "out of memory for staging slots");
            s->slots = v;
            s->cap_slots = cap;
        }
        sl = calloc(1, sizeof(*sl));
        if (sl == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory for a staging slot");
        hvd_status st = s->seam.slot_alloc(s->seam.ctx, s->piece_bytes,
                                           &sl->buf, &sl->mark);
        if (st != HVD_OK) {
            free(sl);
            return st;
        }
        s->slots[s->nslots++] = sl;
        s->stats.slots = s->nslots;
    } else {
        s->free_slots = sl->next;
    }
    sl->next = NULL;
    s->slots_used++;
    if (s->slots_used > s->stats.max_slots_used)
        s->stats.max_slots_used = s->slots_used;
    *out = sl;
    return HVD_OK;
}

static void slot_put(stage *s, slot *sl) {
    if (sl == NULL)
        return;
    sl->next = s->free_slots;
    s->free_slots = sl;
    s->slots_used--;
}

static sop *op_get(stage *s) {
    sop *o = s->free_ops;

    if (o != NULL) {
        s->free_ops = o->next;
        piece *p = o->pieces;
        memset(o, 0, sizeof(*o));
        memset(p, 0, s->depth * sizeof(*p));
        o->pieces = p;
        return o;
    }
    o = calloc(1, sizeof(*o));
    if (o == NULL)
        return NULL;
    o->pieces = calloc(s->depth, sizeof(*o->pieces));
    if (o->pieces == NULL) {
        free(o);
        return NULL;
    }
    return o;
}

static void op_unlink(stage *s, sop *prev, sop *o) {
    if (prev != NULL)
        prev->next = o->next;
    else
        s->head = o->next;
    if (s->tail == o)
        s->tail = prev;
    o->next = s->free_ops;
    s->free_ops = o;
}

static size_t piece_len(const stage *s, const sop *o, size_t k) {
    size_t off = k * s->piece_bytes;

    return o->len - off < s->piece_bytes ? o->len - off : s->piece_bytes;
}

/*
 * The pipeline cannot go on: every request in flight fails with status
 * (the sentence is this thread's). The requests stay listed, so that
 * nothing the inner transport may still write into is freed before close.
 */
static hvd_status stage_fail(stage *s, hvd_status status) {
    if (s->failed == HVD_OK) {
        s->failed = status;
        snprintf(s->failmsg, sizeof(s->failmsg), "%s", hvd_error_get());
        for (sop *o = s->head; o != NULL; o = o->next) {
            if (!o->user->done) {
                o->user->status = status;
                o->user->done = 1;
            }
        }
    }
    return hvd_error_copy(s->failed, s->failmsg);
}

/* ------------------------------------------------------------------ */
/* The scheduler                                                       */

static size_t key(const sop *o) {
    return (size_t)o->peer * NCHANNELS + (size_t)o->channel;
}

/* Queues a copy for piece p and counts it. */
static hvd_status queue_copy(stage *s, piece *p, void *dst, const void *src,
                             size_t len) {
    hvd_status st = s->seam.copy(s->seam.ctx, dst, src, len, p->slot->mark);

    if (st != HVD_OK)
        return st;
    p->state = P_COPY;
    s->copying++;
    s->stats.copies++;
    return HVD_OK;
}

/* Looks whether piece p's copy has finished. */
static hvd_status check_copy(stage *s, piece *p, int next_state, int *moved) {
    int done = 0;
    hvd_status st = s->seam.query(s->seam.ctx, p->slot->mark, &done);

    if (st == HVD_OK && done) {
        p->state = next_state;
        s->copying--;
        *moved = 1;
    }
    return st;
}

/* An inner request failed: the inner transport's progress returns the
 * failure with its sentence (as hvd_comm_wait does). */
static hvd_status net_failed(stage *s, const sop *o, hvd_status status) {
    hvd_status st = s->inner->ops->progress(s->inner, 0);

    if (st != HVD_OK)
        return st;
    return hvd_error_set(status, "staging: %s peer %d failed",
                         o->send ? "a send to" : "a receive from", o->peer);
}

static void note_inflight(stage *s, const sop *o) {
    size_t n = o->started - o->finished;

    if (n > s->stats.max_inflight)
        s->stats.max_inflight = n;
}

static hvd_status advance_send(stage *s, sop *o, int *moved) {
    size_t d = s->depth;
    hvd_status st;

    /* Retire the pieces whose inner send is done, in order. */
    while (o->finished < o->posted) {
        piece *p = &o->pieces[o->finished % d];
        if (!p->net.done)
            break;
        if (p->net.status != HVD_OK)
            return net_failed(s, o, p->net.status);
        slot_put(s, p->slot);
        p->slot = NULL;
        p->state = 0;
        o->finished++;
        s->stats.pieces++;
        *moved = 1;
    }
    /* Queue the copies of the next pieces, depth in flight. */
    while (o->started < o->npieces && o->started - o->finished < d) {
        piece *p = &o->pieces[o->started % d];
        size_t len = piece_len(s, o, o->started);
        if (len == 0) {
            p->slot = NULL;
            p->state = P_READY;
        } else {
            st = slot_get(s, &p->slot);
            if (st == HVD_OK)
                st = queue_copy(s, p, p->slot->buf,
                                o->buf + o->started * s->piece_bytes, len);
            if (st != HVD_OK)
                return st;
        }
        o->started++;
        note_inflight(s, o);
        *moved = 1;
    }
    /* Copies finish in stream order: look at them in order. */
    for (size_t k = o->posted; k < o->started; k++) {
        piece *p = &o->pieces[k % d];
        if (p->state != P_COPY)
            continue;
        st = check_copy(s, p, P_READY, moved);
        if (st != HVD_OK)
            return st;
        if (p->state == P_COPY)
            break;
    }
    /* Post the inner sends of the pieces that are ready, in order, unless
     * an earlier request to this peer still has sends to post. */
    if (s->send_block[key(o)] != s->pass) {
        while (o->posted < o->started) {
            piece *p = &o->pieces[o->posted % d];
            if (p->state != P_READY)
                break;
            size_t len = piece_len(s, o, o->posted);
            st = s->inner->ops->isend(s->inner, o->peer, o->channel,
                                      p->slot ? p->slot->buf : &empty_byte, len,
                                      &p->net);
            if (st != HVD_OK)
                return st;
            p->state = P_NET;
            o->posted++;
            *moved = 1;
        }
    }
    if (o->posted < o->npieces)
        s->send_block[key(o)] = s->pass;
    return HVD_OK;
}

static hvd_status advance_recv(stage *s, sop *o, int *moved) {
    size_t d = s->depth;
    hvd_status st;

    /* Queue the copy of every piece that has landed; look at the copies
     * in stream order, up to the first that is still running. */
    int waiting = 0;
    for (size_t k = o->finished; k < o->started; k++) {
        piece *p = &o->pieces[k % d];
        if (p->state == P_NET && p->net.done) {
            /* The data is in the slot: queue its copy to the device. */
            if (p->net.status != HVD_OK)
                return net_failed(s, o, p->net.status);
            size_t len = piece_len(s, o, k);
            if (len == 0) {
                p->state = P_DONE;
            } else {
                st = queue_copy(s, p, o->buf + k * s->piece_bytes, p->slot->buf,
                                len);
                if (st != HVD_OK)
                    return st;
            }
            *moved = 1;
        }
        if (p->state == P_COPY && !waiting) {
            st = check_copy(s, p, P_DONE, moved);
            if (st != HVD_OK)
                return st;
            waiting = p->state == P_COPY;
        }
    }
    while (o->finished < o->started) {
        piece *p = &o->pieces[o->finished % d];
        if (p->state != P_DONE)
            break;
        slot_put(s, p->slot);
        p->slot = NULL;
        p->state = 0;
        o->finished++;
        s->stats.pieces++;
        *moved = 1;
    }
    /* Post the next receives, in order, depth in flight. */
    if (s->recv_block[key(o)] != s->pass) {
        while (o->started < o->npieces && o->started - o->finished < d) {
            piece *p = &o->pieces[o->started % d];
            size_t len = piece_len(s, o, o->started);
            p->slot = NULL;
            if (len > 0) {
                st = slot_get(s, &p->slot);
                if (st != HVD_OK)
                    return st;
            }
            st = s->inner->ops->irecv(s->inner, o->peer, o->channel,
                                      p->slot ? p->slot->buf : &empty_byte, len,
                                      &p->net);
            if (st != HVD_OK) {
                slot_put(s, p->slot);
                p->slot = NULL;
                return st;
            }
            p->state = P_NET;
            o->started++;
            note_inflight(s, o);
            *moved = 1;
        }
    }
    if (o->started < o->npieces)
        s->recv_block[key(o)] = s->pass;
    return HVD_OK;
}

/* Moves every request as far as it can go now; *moved says whether
 * anything changed. */
static hvd_status run_pass(stage *s, int *moved) {
    sop *prev = NULL, *next;

    if (s->failed != HVD_OK)
        return hvd_error_copy(s->failed, s->failmsg);
    s->pass++;
    for (sop *o = s->head; o != NULL; o = next) {
        hvd_status st;
        next = o->next;
        st = o->send ? advance_send(s, o, moved) : advance_recv(s, o, moved);
        if (st != HVD_OK)
            return stage_fail(s, st);
        if (o->finished == o->npieces) {
            o->user->status = HVD_OK;
            o->user->done = 1;
            op_unlink(s, prev, o);
            *moved = 1;
        } else {
            prev = o;
        }
    }
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* The transport                                                       */

static hvd_status post(hvd_transport *t, int send, int peer, int channel,
                       void *buf, size_t len, hvd_req *req) {
    stage *s = (stage *)t;
    sop *o;
    int moved = 0;

    if (s->failed != HVD_OK)
        return hvd_error_copy(s->failed, s->failmsg);
    if (peer < 0 || peer >= s->size || channel < 0 || channel >= NCHANNELS)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "staging: %s to peer %d on channel %d (job of "
                             "%d)",
                             send ? "send" : "receive", peer, channel, s->size);
    o = op_get(s);
    if (o == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY,
                             "out of memory for a staged request");
    o->user = req;
    o->send = send;
    o->peer = peer;
    o->channel = channel;
    o->buf = buf;
    o->len = len;
    o->npieces = len == 0 ? 1 : (len + s->piece_bytes - 1) / s->piece_bytes;
    req->done = 0;
    req->status = HVD_OK;
    if (s->tail != NULL)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    /* Start at once: the copies of a send begin before anything waits. */
    return run_pass(s, &moved);
}

static hvd_status stage_isend(hvd_transport *t, int peer, int channel,
                              const void *buf, size_t len, hvd_req *req) {
    return post(t, 1, peer, channel, (void *)buf, len, req);
}

static hvd_status stage_irecv(hvd_transport *t, int peer, int channel,
                              void *buf, size_t len, hvd_req *req) {
    return post(t, 0, peer, channel, buf, len, req);
}

static hvd_status stage_progress(hvd_transport *t, int timeout_ms) {
    stage *s = (stage *)t;
    int moved = 0;
    hvd_status st = run_pass(s, &moved);

    if (st != HVD_OK)
        return st;
    /* Wait in the network only when nothing here can move without it.
     * While copies run, poll; a yield lets whatever else needs this core
     * run (the copies finish within microseconds on their own). */
    st = s->inner->ops->progress(s->inner,
                                 moved || s->copying > 0 ? 0 : timeout_ms);
    if (st != HVD_OK)
        return stage_fail(s, st);
    if (!moved && s->copying > 0)
        sched_yield();
    return run_pass(s, &moved);
}

static void stage_wake(hvd_transport *t) {
    stage *s = (stage *)t;

    s->inner->ops->wake(s->inner);
}

static void stage_close(hvd_transport *t) {
    stage *s = (stage *)t;

    if (s == NULL)
        return;
    while (s->head != NULL) {
        sop *o = s->head;
        s->head = o->next;
        free(o->pieces);
        free(o);
    }
    while (s->free_ops != NULL) {
        sop *o = s->free_ops;
        s->free_ops = o->next;
        free(o->pieces);
        free(o);
    }
    for (size_t i = 0; i < s->nslots; i++) {
        s->seam.slot_free(s->seam.ctx, s->slots[i]->buf, s->slots[i]->mark);
        free(s->slots[i]);
    }
    free(s->slots);
    free(s->send_block);
    free(s->recv_block);
    free(s);
}

static hvd_status stage_probe(const hvd_transport_params *params,
                              hvd_caps *caps) {
    (void)params;
    memset(caps, 0, sizeof(*caps));
    return HVD_OK;
}

static hvd_status stage_open(const hvd_transport_params *params,
                             hvd_transport **out) {
    (void)params;
    (void)out;
    return hvd_error_set(HVD_ERR_INTERNAL,
                         "the staging pipeline is opened with "
                         "hvd_stage_open");
}

static hvd_status stage_shutdown(hvd_transport *t) {
    (void)t;
    return HVD_OK;
}

static hvd_status stage_allreduce(hvd_transport *t, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    (void)t, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "the staging pipeline has no native collectives");
}

static hvd_status stage_allgather(hvd_transport *t, const void *sendbuf,
                                  void *recvbuf, size_t count,
                                  hvd_dtype dtype) {
    (void)t, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "the staging pipeline has no native collectives");
}

static hvd_status stage_broadcast(hvd_transport *t, void *buf, size_t count,
                                  hvd_dtype dtype, int root) {
    (void)t, (void)buf, (void)count, (void)dtype, (void)root;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "the staging pipeline has no native collectives");
}

static const hvd_transport_ops stage_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "staged",
    .probe = stage_probe,
    .open = stage_open,
    .isend = stage_isend,
    .irecv = stage_irecv,
    .progress = stage_progress,
    .wake = stage_wake,
    .shutdown = stage_shutdown,
    .close = stage_close,
    .allreduce = stage_allreduce,
    .allgather = stage_allgather,
    .broadcast = stage_broadcast,
};

hvd_status hvd_stage_open(hvd_transport *inner, int size,
                          const hvd_stage_config *cfg,
                          const hvd_stage_seam *seam, hvd_transport **out) {
    stage *s;

    if (cfg->piece_bytes < 1 || cfg->depth < 1 || size < 1)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "staging: piece size %zu, depth %d, size %d",
                             cfg->piece_bytes, cfg->depth, size);
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    s->base.ops = &stage_ops;
    s->inner = inner;
    s->size = size;
    s->piece_bytes = cfg->piece_bytes;
    s->depth = (size_t)cfg->depth;
    s->seam = *seam;
    s->send_block = calloc((size_t)size * NCHANNELS, sizeof(*s->send_block));
    s->recv_block = calloc((size_t)size * NCHANNELS, sizeof(*s->recv_block));
    if (s->send_block == NULL || s->recv_block == NULL) {
        stage_close(&s->base);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    *out = &s->base;
    return HVD_OK;
}

void hvd_stage_stats_get(hvd_transport *t, hvd_stage_stats *out) {
    *out = ((stage *)t)->stats;
}
