/*
 * The tags of rendezvous messages (client and server), and the rendezvous
 * server's connections (rdv_internal.h): the shared,
 * reference-counted Results, each connection's queue of them and its
 * sending, the last Result of an elastic connection that is refused, and
 * closing; and a round's answer, sent to every rank. It calls nothing of
 * the other server files.
 */
#include "transport/bootstrap/rdv_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/base/wire.h"

hvd_status hvd_rdv_keys_init(rdv_keys *k, const hvd_hs *hs, int client) {
    uint8_t c2s[HVD_PROTECT_KEY], s2c[HVD_PROTECT_KEY];
    /* Its own label: the rendezvous and a data connection never share a
     * key, even if a handshake's bytes were alike. */
    hvd_status st = hvd_hs_keys(hs, "hvd rendezvous v1", c2s, s2c);

    memset(k, 0, sizeof(*k));
    if (st == HVD_OK)
        st =
            hvd_aead_init(&k->tx, HVD_PROTECT_INTEGRITY, 1, client ? c2s : s2c);
    if (st == HVD_OK) {
        st =
            hvd_aead_init(&k->rx, HVD_PROTECT_INTEGRITY, 0, client ? s2c : c2s);
        if (st != HVD_OK)
            hvd_aead_free(&k->tx);
    }
    OPENSSL_cleanse(c2s, sizeof(c2s));
    OPENSSL_cleanse(s2c, sizeof(s2c));
    k->ready = st == HVD_OK;
    return st;
}

void hvd_rdv_keys_free(rdv_keys *k) {
    if (!k->ready)
        return;
    hvd_aead_free(&k->tx);
    hvd_aead_free(&k->rx);
    k->ready = 0;
}

int hvd_rdv_seal(rdv_keys *k, const uint8_t *msg, size_t len,
                 uint8_t tag[RDV_TAG]) {
    if (!k->ready || hvd_aead_begin(&k->tx, k->tx_n++) != 0 ||
        hvd_aead_update(&k->tx, msg, NULL, len) != 0)
        return -1;
    return hvd_aead_seal_end(&k->tx, tag);
}

int hvd_rdv_open(rdv_keys *k, const uint8_t prefix[LEN_PREFIX],
                 const uint8_t *body, size_t len, const uint8_t tag[RDV_TAG]) {
    /* The counter moves on even for a message that fails: the connection
     * is dropped then anyway. */
    if (!k->ready || hvd_aead_begin(&k->rx, k->rx_n++) != 0 ||
        hvd_aead_update(&k->rx, prefix, NULL, LEN_PREFIX) != 0 ||
        hvd_aead_update(&k->rx, body, NULL, len) != 0)
        return -1;
    return hvd_aead_open_end(&k->rx, tag);
}

/* Packs res with its length prefix; one reference. NULL when out of
 * memory. */
rresult *hvd_rdv_result_pack(const Hvd__Rdv__Result *res) {
    size_t len = hvd__rdv__result__get_packed_size(res);
    rresult *r = malloc(sizeof(*r) + len + LEN_PREFIX);

    if (r == NULL)
        return NULL;
    r->refs = 1;
    r->len = len + LEN_PREFIX;
    hvd_put32(r->data, (uint32_t)len);
    hvd__rdv__result__pack(res, r->data + LEN_PREFIX);
    return r;
}

void hvd_rdv_result_put(rresult *r) {
    if (r != NULL && --r->refs == 0)
        free(r);
}

void hvd_rdv_arm_timer(hvd_rdv_server *srv, int on) {
    struct itimerspec its;

    if (on == srv->timer_armed)
        return;
    memset(&its, 0, sizeof(its));
    if (on) {
        its.it_value.tv_sec = 1;
        its.it_interval.tv_sec = 1;
    }
    timerfd_settime(srv->tfd, 0, &its, NULL);
    srv->timer_armed = on;
}

/* Elastic: c no longer stands for its worker (it is closed or closing). */
static void conn_detach(hvd_rdv_server *srv, rconn *c) {
    int idx = (int)(c - srv->conns);

    if (c->rank >= 0 && c->rank < srv->size && srv->rank_conn[c->rank] == idx)
        srv->rank_conn[c->rank] = -1;
    c->rank = -1;
    if (c->worker >= 0 && srv->workers[c->worker].conn == idx) {
        srv->workers[c->worker].conn = -1;
        srv->workers[c->worker].waiting = 0;
    }
    if (c->counted) {
        srv->joined--;
        c->counted = 0;
    }
}

void hvd_rdv_conn_close(hvd_rdv_server *srv, rconn *c) {
    if (srv->elastic)
        conn_detach(srv, c);
    else if (c->state == RC_READY && c->rank >= 0 &&
             srv->rank_conn[c->rank] == (int)(c - srv->conns))
        srv->rank_conn[c->rank] = -1;
    if (c->fd >= 0) {
        epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    for (int i = 0; i < c->qlen; i++)
        hvd_rdv_result_put(c->q[(c->qhead + i) % OUT_QUEUE]);
    free(c->body);
    hvd_rdv_keys_free(&c->keys);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->rank = -1;
    c->worker = -1;
    c->state = RC_FREE;
}

void hvd_rdv_conn_watch(hvd_rdv_server *srv, rconn *c, uint32_t events) {
    struct epoll_event ev = {.events = events,
                             .data.u64 = (uint64_t)(c - srv->conns) + 2};
    epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Sends what is queued on c: Results in order, then the notices it is
 * owed, one at a time. */
void hvd_rdv_conn_flush(hvd_rdv_server *srv, rconn *c) {
    for (;;) {
        if (c->qlen == 0 && c->notices > 0 && srv->notice != NULL) {
            c->q[c->qhead] = srv->notice;
            srv->notice->refs++;
            c->qlen = 1;
            c->out_off = 0;
            c->notices--;
        }
        if (c->qlen == 0)
            break;
        rresult *r = c->q[c->qhead];
        /* Each connection tags a shared Result with its own key and
         * counter, when it starts to send it. */
        if (!c->out_sealed &&
            hvd_rdv_seal(&c->keys, r->data, r->len, c->out_tag) != 0) {
            HVD_ERROR("rdv", "could not tag a message to %s", c->name);
            hvd_rdv_conn_close(srv, c);
            return;
        }
        c->out_sealed = 1;
        while (c->out_off < r->len + RDV_TAG) {
            const uint8_t *src = c->out_off < r->len
                                     ? r->data + c->out_off
                                     : c->out_tag + (c->out_off - r->len);
            size_t left = c->out_off < r->len ? r->len - c->out_off
                                              : r->len + RDV_TAG - c->out_off;
            ssize_t n = send(c->fd, src, left, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                c->out_off += (size_t)n;
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                hvd_rdv_conn_watch(srv, c, EPOLLIN | EPOLLOUT);
                return;
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                if (srv->elastic)
                    HVD_WARN("rdv", "worker %d at %s: send() failed: %s",
                             c->worker, c->name, strerror(errno));
                else
                    HVD_WARN("rdv", "rank %d at %s: send() failed: %s", c->rank,
                             c->name, strerror(errno));
                hvd_rdv_conn_close(srv, c);
                return;
            }
        }
        hvd_rdv_result_put(r);
        c->q[c->qhead] = NULL;
        c->qhead = (c->qhead + 1) % OUT_QUEUE;
        c->qlen--;
        c->out_off = 0;
        c->out_sealed = 0;
    }
    if (c->state == RC_CLOSING && !c->shut) {
        shutdown(c->fd, SHUT_WR);
        c->shut = 1;
    }
    hvd_rdv_conn_watch(srv, c, EPOLLIN);
}

/* Queues r (a reference is taken) on c and sends what it can. */
void hvd_rdv_conn_send(hvd_rdv_server *srv, rconn *c, rresult *r) {
    if (c->qlen == OUT_QUEUE) {
        HVD_WARN("rdv",
                 "dropped worker %d at %s: %d answers queued that it does "
                 "not read",
                 c->worker, c->name, OUT_QUEUE);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    c->q[(c->qhead + c->qlen) % OUT_QUEUE] = r;
    c->qlen++;
    r->refs++;
    hvd_rdv_conn_flush(srv, c);
}

/* Sends c a last Result carrying status and sentence, then closes it
 * (RC_CLOSING). c no longer stands for its worker or rank. */
void hvd_rdv_conn_fail(hvd_rdv_server *srv, rconn *c, hvd_status status,
                       const char *sentence) {
    Hvd__Rdv__Result res = HVD__RDV__RESULT__INIT;
    rresult *r;

    conn_detach(srv, c);
    c->state = RC_CLOSING;
    c->deadline = hvd_now_ns() + CLOSING_NS;
    hvd_rdv_arm_timer(srv, 1);
    res.generation = srv->generation;
    res.error_status = (int32_t)status;
    res.error = (char *)(uintptr_t)sentence;
    r = hvd_rdv_result_pack(&res);
    if (r == NULL) {
        HVD_ERROR("rdv", "out of memory telling worker %d: %s", c->worker,
                  sentence);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    hvd_rdv_conn_send(srv, c, r);
    hvd_rdv_result_put(r);
}

void hvd_rdv_finish_round(hvd_rdv_server *srv) {
    Hvd__Rdv__Result res = HVD__RDV__RESULT__INIT;
    ProtobufCBinaryData *blobs = calloc((size_t)srv->size, sizeof(*blobs));

    if (blobs == NULL) {
        HVD_ERROR("rdv", "out of memory building round %u", srv->round);
        return;
    }
    for (int r = 0; r < srv->size; r++) {
        blobs[r].data = srv->blobs[r];
        blobs[r].len = srv->blob_len[r];
    }
    res.round = srv->round;
    res.generation = srv->generation;
    res.n_blobs = (size_t)srv->size;
    res.blobs = blobs;
    hvd_rdv_result_put(srv->result);
    srv->result = hvd_rdv_result_pack(&res);
    free(blobs);
    if (srv->result == NULL) {
        HVD_ERROR("rdv", "out of memory building round %u", srv->round);
        return;
    }

    HVD_DEBUG("rdv", "round %u complete (%d ranks)", srv->round, srv->size);
    /* Elastic: once a generation's first round is done, its members are
     * past the join and will hold its state (see state_lost). */
    if (srv->elastic && srv->round == 0) {
        for (int r = 0; r < srv->size; r++)
            srv->workers[srv->gen_worker[r]].placed = 1;
        srv->any_placed = 1;
    }
    for (int r = 0; r < srv->size; r++) {
        free(srv->blobs[r]);
        srv->blobs[r] = NULL;
    }
    srv->have = 0;
    srv->round++;
    for (int r = 0; r < srv->size; r++)
        if (srv->rank_conn[r] >= 0)
            hvd_rdv_conn_send(srv, &srv->conns[srv->rank_conn[r]], srv->result);
}

/* Elastic: reads and drops what a closing connection still sends, and
 * closes it at its end. */
void hvd_rdv_conn_drain(hvd_rdv_server *srv, rconn *c) {
    uint8_t buf[4096];

    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        hvd_rdv_conn_close(srv, c);
        return;
    }
}
