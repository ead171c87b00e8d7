#include "transport/rendezvous.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/base/wire.h"
#include "transport/handshake.h"
#include "transport/net.h"
#include "transport/rendezvous.pb-c.h"

/* A connection that has not authenticated in this time is dropped. */
#define HANDSHAKE_NS (10 * 1000000000LL)
#define LEN_PREFIX 4
/* Largest Contribute message: the blob plus protobuf's few bytes. */
#define MAX_CONTRIBUTE (HVD_RDV_MAX_BLOB + 64)

int hvd_job_id_parse(const char *hex, uint8_t job_id_out[HVD_JOB_ID_LEN]) {
    uint8_t id[HVD_JOB_ID_LEN];

    if (hex == NULL || strlen(hex) != 2 * HVD_JOB_ID_LEN)
        return -1;
    for (int i = 0; i < 2 * HVD_JOB_ID_LEN; i++) {
        char c = hex[i];
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0)
            return -1;
        if (i % 2 == 0)
            id[i / 2] = (uint8_t)(v << 4);
        else
            id[i / 2] |= (uint8_t)v;
    }
    memcpy(job_id_out, id, HVD_JOB_ID_LEN);
    return 0;
}

void hvd_job_id_format(const uint8_t job_id[HVD_JOB_ID_LEN], char hex[33]) {
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", job_id[i]);
}

/* ------------------------------------------------------------------ */
/* Server                                                              */

enum { RC_FREE = 0, RC_HANDSHAKE, RC_READY };

typedef struct rconn {
    int state;
    int fd;
    int rank;
    int64_t deadline;
    char name[HVD_ADDR_MAX];
    hvd_hs hs;
    /* Incoming message: 4-byte length, then the body. */
    uint8_t lenbuf[LEN_PREFIX];
    size_t len_got;
    uint8_t *body;
    size_t body_len;
    size_t body_got;
    /* Outgoing: a round's result, shared (a reference held while it is
     * sent: the next round, of the next generation, may start before). */
    struct rresult *out;
    size_t out_off;
    int sending;
} rconn;

/* A round's answer, as sent: length prefix and Result. */
typedef struct rresult {
    int refs;
    size_t len;
    uint8_t data[];
} rresult;

static void result_put(rresult *r) {
    if (r != NULL && --r->refs == 0)
        free(r);
}

struct hvd_rdv_server {
    int lfd;
    int epfd;
    int tfd;
    int timer_armed;
    int port;
    int size;
    uint8_t job_id[HVD_JOB_ID_LEN];
    char *secret;
    rconn *conns;
    int nconns;
    int *rank_conn; /* rank -> index into conns, -1 */
    int joined;
    uint32_t generation; /* rendezvous started again after a shutdown */
    uint32_t round;
    uint8_t **blobs; /* this round's blob per rank, NULL if not yet */
    size_t *blob_len;
    int have;
    rresult *result; /* the last round's answer */
};

static void arm_timer(hvd_rdv_server *srv, int on) {
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

static void conn_close(hvd_rdv_server *srv, rconn *c) {
    if (c->state == RC_READY && c->rank >= 0 &&
        srv->rank_conn[c->rank] == (int)(c - srv->conns))
        srv->rank_conn[c->rank] = -1;
    if (c->fd >= 0) {
        epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    result_put(c->out);
    free(c->body);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->state = RC_FREE;
}

static void conn_watch(hvd_rdv_server *srv, rconn *c, uint32_t events) {
    struct epoll_event ev = {.events = events,
                             .data.u64 = (uint64_t)(c - srv->conns) + 2};
    epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static hvd_hs_code admit(void *ctx, int kind, int rank, int index, char *why,
                         size_t whylen) {
    hvd_rdv_server *srv = ctx;

    if (kind != HVD_HS_KIND_RENDEZVOUS || index != 0) {
        snprintf(why, whylen, "not a rendezvous connection");
        return HVD_HS_UNEXPECTED;
    }
    if (rank >= srv->size) {
        snprintf(why, whylen, "rank %d is outside the job of %d", rank,
                 srv->size);
        return HVD_HS_UNEXPECTED;
    }
    if (srv->rank_conn[rank] >= 0) {
        snprintf(why, whylen, "rank %d has already joined", rank);
        return HVD_HS_UNEXPECTED;
    }
    return HVD_HS_OK;
}

hvd_status hvd_rdv_server_create(const char *bind_addr, int port, int size,
                                 const uint8_t job_id[HVD_JOB_ID_LEN],
                                 const char *secret, hvd_rdv_server **out) {
    hvd_rdv_server *srv = calloc(1, sizeof(*srv));
    struct epoll_event ev = {.events = EPOLLIN};
    hvd_status st;

    if (srv == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    srv->lfd = srv->epfd = srv->tfd = -1;
    srv->size = size;
    memcpy(srv->job_id, job_id, HVD_JOB_ID_LEN);
    srv->secret = strdup(secret);
    srv->nconns = 2 * size + 16;
    srv->conns = calloc((size_t)srv->nconns, sizeof(*srv->conns));
    srv->rank_conn = malloc((size_t)size * sizeof(int));
    srv->blobs = calloc((size_t)size, sizeof(*srv->blobs));
    srv->blob_len = calloc((size_t)size, sizeof(*srv->blob_len));
    if (srv->secret == NULL || srv->conns == NULL || srv->rank_conn == NULL ||
        srv->blobs == NULL || srv->blob_len == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int i = 0; i < size; i++)
        srv->rank_conn[i] = -1;
    for (int i = 0; i < srv->nconns; i++)
        srv->conns[i].fd = -1;

    st = hvd_net_listen(bind_addr, port, &srv->lfd, &srv->port);
    if (st != HVD_OK)
        goto fail;
    srv->epfd = epoll_create1(EPOLL_CLOEXEC);
    srv->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (srv->epfd < 0 || srv->tfd < 0) {
        st = hvd_error_set(HVD_ERR_TRANSPORT,
                           "epoll_create1/timerfd_create failed: %s",
                           strerror(errno));
        goto fail;
    }
    ev.data.u64 = 0;
    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &ev);
    ev.data.u64 = 1;
    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->tfd, &ev);
    HVD_INFO("rdv", "rendezvous for %d ranks listening on %s:%d", size,
             bind_addr, srv->port);
    *out = srv;
    return HVD_OK;
fail:
    hvd_rdv_server_destroy(srv);
    return st;
}

int hvd_rdv_server_port(const hvd_rdv_server *srv) { return srv->port; }

int hvd_rdv_server_fd(const hvd_rdv_server *srv) { return srv->epfd; }

int hvd_rdv_server_joined(const hvd_rdv_server *srv) { return srv->joined; }

static void accept_all(hvd_rdv_server *srv) {
    for (;;) {
        int fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        rconn *c = NULL;

        if (fd < 0)
            return;
        for (int i = 0; i < srv->nconns && c == NULL; i++)
            if (srv->conns[i].state == RC_FREE)
                c = &srv->conns[i];
        if (c == NULL) {
            /* The table is full of connections that have not
             * authenticated (ranks that have take size slots of 2 size +
             * 16): strangers. Drop the one that has waited longest, so
             * that strangers that connect and stay silent cannot keep a
             * rank out. */
            rconn *old = NULL;
            for (int i = 0; i < srv->nconns; i++)
                if (srv->conns[i].state == RC_HANDSHAKE &&
                    (old == NULL || srv->conns[i].deadline < old->deadline))
                    old = &srv->conns[i];
            if (old == NULL) {
                char name[HVD_ADDR_MAX];
                hvd_net_peer_name(fd, name, sizeof(name));
                HVD_WARN("rdv",
                         "refused connection from %s: too many connections",
                         name);
                close(fd);
                continue;
            }
            HVD_WARN("rdv",
                     "dropped connection from %s: too many connections that "
                     "have not authenticated, and it waited longest",
                     old->name);
            conn_close(srv, old);
            c = old;
        }
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->rank = -1;
        c->state = RC_HANDSHAKE;
        c->deadline = hvd_now_ns() + HANDSHAKE_NS;
        hvd_net_peer_name(fd, c->name, sizeof(c->name));
        hvd_hs_server_init(&c->hs, srv->job_id, srv->secret,
                           HVD_HS_KIND_RENDEZVOUS, -1, admit, srv);
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = (uint64_t)(c - srv->conns) + 2};
        epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev);
        arm_timer(srv, 1);
    }
}

/* Sends what is left of the round's result to c. */
static void conn_flush(hvd_rdv_server *srv, rconn *c) {
    while (c->sending && c->out_off < c->out->len) {
        ssize_t n = send(c->fd, c->out->data + c->out_off,
                         c->out->len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            conn_watch(srv, c, EPOLLIN | EPOLLOUT);
            return;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            HVD_WARN("rdv", "rank %d at %s: send() failed: %s", c->rank,
                     c->name, strerror(errno));
            conn_close(srv, c);
            return;
        }
    }
    c->sending = 0;
    result_put(c->out);
    c->out = NULL;
    conn_watch(srv, c, EPOLLIN);
}

static void finish_round(hvd_rdv_server *srv) {
    Hvd__Rdv__Result res = HVD__RDV__RESULT__INIT;
    ProtobufCBinaryData *blobs = calloc((size_t)srv->size, sizeof(*blobs));
    size_t len;

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
    len = hvd__rdv__result__get_packed_size(&res);
    result_put(srv->result);
    srv->result = malloc(sizeof(*srv->result) + len + LEN_PREFIX);
    if (srv->result == NULL) {
        free(blobs);
        HVD_ERROR("rdv", "out of memory building round %u", srv->round);
        return;
    }
    srv->result->refs = 1;
    srv->result->len = len + LEN_PREFIX;
    hvd_put32(srv->result->data, (uint32_t)len);
    hvd__rdv__result__pack(&res, srv->result->data + LEN_PREFIX);
    free(blobs);

    HVD_DEBUG("rdv", "round %u complete (%d ranks)", srv->round, srv->size);
    for (int r = 0; r < srv->size; r++) {
        free(srv->blobs[r]);
        srv->blobs[r] = NULL;
    }
    srv->have = 0;
    srv->round++;
    for (int r = 0; r < srv->size; r++) {
        if (srv->rank_conn[r] < 0)
            continue;
        rconn *c = &srv->conns[srv->rank_conn[r]];
        result_put(c->out);
        c->out = srv->result;
        c->out->refs++;
        c->sending = 1;
        c->out_off = 0;
        conn_flush(srv, c);
    }
}

static void on_message(hvd_rdv_server *srv, rconn *c) {
    Hvd__Rdv__Contribute *msg =
        hvd__rdv__contribute__unpack(NULL, c->body_len, c->body);

    if (msg == NULL) {
        HVD_WARN("rdv", "dropped rank %d at %s: malformed message", c->rank,
                 c->name);
        conn_close(srv, c);
        return;
    }
    /* The job was shut down and starts again (hvd_init after
     * hvd_shutdown): every rank finished the last generation's rounds
     * before any could shut down, so a new one starts when the first rank
     * comes back. */
    if (msg->generation == srv->generation + 1 && msg->round == 0 &&
        srv->have == 0) {
        HVD_INFO("rdv", "rendezvous %u starts (rank %d came back)",
                 msg->generation, c->rank);
        srv->generation++;
        srv->round = 0;
    }
    if (msg->generation != srv->generation || msg->round != srv->round ||
        srv->blobs[c->rank] != NULL || msg->blob.len > HVD_RDV_MAX_BLOB) {
        HVD_WARN("rdv",
                 "dropped rank %d at %s: contribution to round %u of "
                 "rendezvous %u (%zu bytes) while round %u of rendezvous %u "
                 "is open",
                 c->rank, c->name, msg->round, msg->generation, msg->blob.len,
                 srv->round, srv->generation);
        hvd__rdv__contribute__free_unpacked(msg, NULL);
        conn_close(srv, c);
        return;
    }
    srv->blobs[c->rank] = malloc(msg->blob.len ? msg->blob.len : 1);
    if (srv->blobs[c->rank] == NULL) {
        hvd__rdv__contribute__free_unpacked(msg, NULL);
        HVD_ERROR("rdv", "out of memory");
        conn_close(srv, c);
        return;
    }
    if (msg->blob.len)
        memcpy(srv->blobs[c->rank], msg->blob.data, msg->blob.len);
    srv->blob_len[c->rank] = msg->blob.len;
    hvd__rdv__contribute__free_unpacked(msg, NULL);
    if (++srv->have == srv->size)
        finish_round(srv);
}

static void conn_read(hvd_rdv_server *srv, rconn *c) {
    for (;;) {
        uint8_t *dst;
        size_t want;

        if (c->len_got < LEN_PREFIX) {
            dst = c->lenbuf + c->len_got;
            want = LEN_PREFIX - c->len_got;
        } else {
            dst = c->body + c->body_got;
            want = c->body_len - c->body_got;
        }
        ssize_t n = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
        if (want && n == 0) {
            if (c->rank >= 0 && srv->round > 0 && !srv->have)
                HVD_DEBUG("rdv", "rank %d closed its connection", c->rank);
            else
                HVD_WARN("rdv",
                         "rank %d at %s left the rendezvous before the job "
                         "started (did it die?)",
                         c->rank, c->name);
            conn_close(srv, c);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                HVD_WARN("rdv", "rank %d at %s: recv() failed: %s", c->rank,
                         c->name, strerror(errno));
                conn_close(srv, c);
            }
            return;
        }
        if (c->len_got < LEN_PREFIX) {
            c->len_got += (size_t)n;
            if (c->len_got == LEN_PREFIX) {
                c->body_len = hvd_get32(c->lenbuf);
                if (c->body_len > MAX_CONTRIBUTE) {
                    HVD_WARN("rdv",
                             "dropped rank %d at %s: message of %zu bytes "
                             "(at most %d)",
                             c->rank, c->name, c->body_len, MAX_CONTRIBUTE);
                    conn_close(srv, c);
                    return;
                }
                c->body = malloc(c->body_len ? c->body_len : 1);
                c->body_got = 0;
                if (c->body == NULL) {
                    conn_close(srv, c);
                    return;
                }
            }
        } else {
            c->body_got += (size_t)n;
        }
        if (c->len_got == LEN_PREFIX && c->body_got == c->body_len) {
            on_message(srv, c);
            if (c->state != RC_READY)
                return;
            free(c->body);
            c->body = NULL;
            c->len_got = 0;
            c->body_got = 0;
        }
    }
}

static void conn_event(hvd_rdv_server *srv, rconn *c, uint32_t events) {
    if (c->state == RC_HANDSHAKE) {
        short want = 0;
        hvd_status st = hvd_hs_io(&c->hs, c->fd, &want);
        if (st != HVD_OK) {
            HVD_WARN("rdv", "refused connection from %s claiming rank %d: %s",
                     c->name, c->hs.peer_rank, c->hs.err);
            conn_close(srv, c);
            return;
        }
        if (want != 0) {
            conn_watch(srv, c, want == POLLOUT ? EPOLLOUT : EPOLLIN);
            return;
        }
        c->rank = c->hs.peer_rank;
        if (srv->rank_conn[c->rank] >= 0) {
            HVD_WARN("rdv", "refused a second connection for rank %d from %s",
                     c->rank, c->name);
            conn_close(srv, c);
            return;
        }
        c->state = RC_READY;
        srv->rank_conn[c->rank] = (int)(c - srv->conns);
        srv->joined++;
        HVD_DEBUG("rdv", "rank %d joined from %s (%d of %d)", c->rank, c->name,
                  srv->joined, srv->size);
        conn_watch(srv, c, EPOLLIN);
        return;
    }
    if (c->state != RC_READY)
        return;
    if (events & EPOLLOUT) {
        conn_flush(srv, c);
        if (c->state != RC_READY)
            return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        conn_read(srv, c);
}

static void sweep(hvd_rdv_server *srv) {
    uint64_t ticks;
    int pending = 0;
    int64_t now = hvd_now_ns();

    while (read(srv->tfd, &ticks, sizeof(ticks)) > 0)
        ;
    for (int i = 0; i < srv->nconns; i++) {
        rconn *c = &srv->conns[i];
        if (c->state != RC_HANDSHAKE)
            continue;
        if (now > c->deadline) {
            HVD_WARN("rdv",
                     "dropped connection from %s: no handshake within %lld s",
                     c->name, HANDSHAKE_NS / 1000000000LL);
            conn_close(srv, c);
        } else {
            pending++;
        }
    }
    arm_timer(srv, pending > 0);
}

hvd_status hvd_rdv_server_progress(hvd_rdv_server *srv, int timeout_ms) {
    struct epoll_event evs[32];
    int n = epoll_wait(srv->epfd, evs, 32, timeout_ms);

    if (n < 0 && errno != EINTR)
        return hvd_error_set(HVD_ERR_TRANSPORT, "epoll_wait() failed: %s",
                             strerror(errno));
    for (int i = 0; i < n; i++) {
        uint64_t id = evs[i].data.u64;
        if (id == 0)
            accept_all(srv);
        else if (id == 1)
            sweep(srv);
        else if (id - 2 < (uint64_t)srv->nconns &&
                 srv->conns[id - 2].state != RC_FREE)
            conn_event(srv, &srv->conns[id - 2], evs[i].events);
    }
    return HVD_OK;
}

void hvd_rdv_server_destroy(hvd_rdv_server *srv) {
    if (srv == NULL)
        return;
    for (int i = 0; srv->conns != NULL && i < srv->nconns; i++)
        if (srv->conns[i].state != RC_FREE)
            conn_close(srv, &srv->conns[i]);
    for (int r = 0; srv->blobs != NULL && r < srv->size; r++)
        free(srv->blobs[r]);
    if (srv->lfd >= 0)
        close(srv->lfd);
    if (srv->epfd >= 0)
        close(srv->epfd);
    if (srv->tfd >= 0)
        close(srv->tfd);
    free(srv->blobs);
    free(srv->blob_len);
    result_put(srv->result);
    free(srv->rank_conn);
    free(srv->conns);
    free(srv->secret);
    free(srv);
}

/* ------------------------------------------------------------------ */
/* Client                                                              */

typedef struct rdv_client {
    hvd_bootstrap bs;
    int fd;
    uint32_t generation;
    uint32_t round;
    int64_t deadline;
} rdv_client;

/* Rendezvous this process started (hvd_init holds its lock around it). */
static uint32_t client_generations;

/* Blocking I/O on a non-blocking socket, bounded by deadline. */
static hvd_status io_all(rdv_client *cl, void *buf, size_t len, int out) {
    size_t off = 0;

    while (off < len) {
        ssize_t n =
            out ? send(cl->fd, (uint8_t *)buf + off, len - off,
                       MSG_NOSIGNAL | MSG_DONTWAIT)
                : recv(cl->fd, (uint8_t *)buf + off, len - off, MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n == 0)
            return hvd_error_set(HVD_ERR_PEER_LOST,
                                 "the rendezvous server (hvdrun) closed the "
                                 "connection: it may have refused this rank "
                                 "or exited");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return hvd_error_set(HVD_ERR_PEER_LOST,
                                 "%s() to the rendezvous server failed: %s",
                                 out ? "send" : "recv", strerror(errno));
        int64_t left_ms = (cl->deadline - hvd_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "rank %d: not every rank reached hvd_init "
                                 "within the start timeout "
                                 "(HVD_START_TIMEOUT_SECONDS)",
                                 cl->bs.rank);
        struct pollfd pfd = {.fd = cl->fd, .events = out ? POLLOUT : POLLIN};
        poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    }
    return HVD_OK;
}

static hvd_status client_allgather(hvd_bootstrap *bs, const void *mine,
                                   size_t len, void *all_out) {
    rdv_client *cl = bs->ctx;
    Hvd__Rdv__Contribute msg = HVD__RDV__CONTRIBUTE__INIT;
    Hvd__Rdv__Result *res = NULL;
    uint8_t *buf = NULL;
    size_t plen, max_result;
    uint8_t lenbuf[LEN_PREFIX];
    hvd_status st;

    if (len > HVD_RDV_MAX_BLOB)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "bootstrap blob of %zu bytes (at most %d)", len,
                             HVD_RDV_MAX_BLOB);
    msg.round = cl->round;
    msg.generation = cl->generation;
    msg.blob.data = (uint8_t *)(uintptr_t)mine;
    msg.blob.len = len;
    plen = hvd__rdv__contribute__get_packed_size(&msg);
    buf = malloc(plen + LEN_PREFIX);
    if (buf == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    hvd_put32(buf, (uint32_t)plen);
    hvd__rdv__contribute__pack(&msg, buf + LEN_PREFIX);
    st = io_all(cl, buf, plen + LEN_PREFIX, 1);
    free(buf);
    buf = NULL;
    if (st != HVD_OK)
        return st;

    st = io_all(cl, lenbuf, LEN_PREFIX, 0);
    if (st != HVD_OK)
        return st;
    plen = hvd_get32(lenbuf);
    max_result = (size_t)bs->size * (HVD_RDV_MAX_BLOB + 8) + 64;
    if (plen > max_result)
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "the rendezvous server sent a %zu-byte answer "
                             "(at most %zu)",
                             plen, max_result);
    buf = malloc(plen ? plen : 1);
    if (buf == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    st = io_all(cl, buf, plen, 0);
    if (st != HVD_OK)
        goto out;
    res = hvd__rdv__result__unpack(NULL, plen, buf);
    if (res == NULL || res->round != cl->round ||
        res->generation != cl->generation || res->n_blobs != (size_t)bs->size) {
        st = hvd_error_set(HVD_ERR_TRANSPORT,
                           "malformed answer from the rendezvous server for "
                           "round %u",
                           cl->round);
        goto out;
    }
    for (int r = 0; r < bs->size; r++) {
        if (res->blobs[r].len != len) {
            st = hvd_error_set(HVD_ERR_MISMATCH,
                               "rank %d sent %zu bytes in bootstrap round %u "
                               "where rank %d sent %zu: ranks run different "
                               "hvd versions or settings",
                               r, res->blobs[r].len, cl->round, bs->rank, len);
            goto out;
        }
        memcpy((uint8_t *)all_out + (size_t)r * len, res->blobs[r].data, len);
    }
    cl->round++;
out:
    if (res != NULL)
        hvd__rdv__result__free_unpacked(res, NULL);
    free(buf);
    return st;
}

hvd_status hvd_rdv_client_connect(const char *addr, int port, int rank,
                                  int size,
                                  const uint8_t job_id[HVD_JOB_ID_LEN],
                                  const char *secret, int64_t timeout_ns,
                                  hvd_bootstrap **out,
                                  char local_addr_out[64]) {
    rdv_client *cl = calloc(1, sizeof(*cl));
    hvd_hs hs;
    hvd_status st;

    if (cl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    cl->fd = -1;
    cl->deadline = hvd_now_ns() + timeout_ns;
    cl->bs.rank = rank;
    cl->bs.size = size;
    cl->bs.allgather = client_allgather;
    cl->bs.ctx = cl;

    /* The server is normally up before any rank starts; retry a refusal
     * anyway, for launchers that start it alongside the ranks, and a
     * connection it dropped unanswered (strangers filled its table). */
    for (;;) {
        st = hvd_net_connect_start(addr, port, &cl->fd);
        if (st == HVD_OK) {
            struct pollfd pfd = {.fd = cl->fd, .events = POLLOUT};
            int64_t left = (cl->deadline - hvd_now_ns()) / 1000000;
            int err = 0;
            if (poll(&pfd, 1, left > 0 ? (int)left : 0) <= 0)
                err = ETIMEDOUT;
            else
                err = hvd_net_connect_result(cl->fd);
            if (err == 0) {
                st = hvd_hs_client_init(&hs, job_id, secret,
                                        HVD_HS_KIND_RENDEZVOUS, rank, 0, -1);
                if (st == HVD_OK)
                    st = hvd_hs_run(&hs, cl->fd, cl->deadline);
                if (st == HVD_OK)
                    break;
                if (st != HVD_ERR_PEER_LOST || hvd_now_ns() > cl->deadline) {
                    st = hvd_error_set(st,
                                       "rank %d: the rendezvous server at "
                                       "%s:%d did not accept this rank: %s",
                                       rank, addr, port, hs.err);
                    goto fail;
                }
                HVD_DEBUG("rdv", "rank %d: %s; trying again", rank, hs.err);
                err = ECONNRESET;
            }
            close(cl->fd);
            cl->fd = -1;
            st = hvd_error_set(HVD_ERR_TRANSPORT,
                               "connect(%s:%d) to the rendezvous server "
                               "failed: %s",
                               addr, port, strerror(err));
        }
        if (st == HVD_ERR_INVALID_ARG || hvd_now_ns() > cl->deadline) {
            hvd_error_prefix("HVD_RENDEZVOUS_ADDR/PORT: ");
            goto fail;
        }
        poll(NULL, 0, 100);
    }
    st = hvd_net_local_addr(cl->fd, local_addr_out, 64);
    if (st != HVD_OK)
        goto fail;
    cl->generation = client_generations++;
    *out = &cl->bs;
    return HVD_OK;
fail:
    hvd_rdv_client_close(&cl->bs);
    return st;
}

void hvd_rdv_client_close(hvd_bootstrap *bs) {
    rdv_client *cl;

    if (bs == NULL)
        return;
    cl = bs->ctx;
    if (cl->fd >= 0)
        close(cl->fd);
    free(cl);
}
