/*
 * The rendezvous server (rendezvous.h), run by hvdrun: creating it,
 * accepting connections and running their handshakes, reading messages
 * and dispatching them (a fixed job's rounds here, an elastic job's to
 * rdv_elastic.c), the sweep of connections that stall, progress and
 * destruction. It calls rdv_elastic.c and rdv_conn.c.
 */
#include "transport/bootstrap/rdv_internal.h"

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

static hvd_hs_code admit(void *ctx, int kind, int rank, int index, char *why,
                         size_t whylen) {
    hvd_rdv_server *srv = ctx;

    if (kind != HVD_HS_KIND_RENDEZVOUS || index != 0) {
        snprintf(why, whylen, "not a rendezvous connection");
        return HVD_HS_UNEXPECTED;
    }
    /* Elastic: the handshake carries a worker id. Whether that worker may
     * join is decided once it has proven it holds the secret, and a
     * refusal is sent as a Result, which carries the sentence the
     * handshake's refusal codes cannot. A second connection as a worker
     * replaces the first (a process that joins again). */
    if (srv->elastic)
        return HVD_HS_OK;
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

/* Allocates a server with room for cap ranks (fixed) or workers
 * (elastic) and starts listening. */
static hvd_status server_new(const char *bind_addr, int port, int cap,
                             const uint8_t job_id[HVD_JOB_ID_LEN],
                             const char *secret, hvd_rdv_server **out) {
    hvd_rdv_server *srv = calloc(1, sizeof(*srv));
    struct epoll_event ev = {.events = EPOLLIN};
    hvd_status st;

    if (srv == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    srv->lfd = srv->epfd = srv->tfd = -1;
    hvd_log_limiter_init(&srv->refused, "rdv", "refused", "not authenticated");
    hvd_log_limiter_init(&srv->dropped, "rdv", "dropped",
                         "no handshake in time, or too many waiting");
    hvd_log_limiter_init(&srv->forged, "rdv", "dropped",
                         "a message failed authentication");
    srv->size = cap;
    memcpy(srv->job_id, job_id, HVD_JOB_ID_LEN);
    srv->secret = strdup(secret);
    srv->nconns = 2 * cap + 16;
    srv->conns = calloc((size_t)srv->nconns, sizeof(*srv->conns));
    srv->rank_conn = malloc((size_t)cap * sizeof(int));
    srv->blobs = calloc((size_t)cap, sizeof(*srv->blobs));
    srv->blob_len = calloc((size_t)cap, sizeof(*srv->blob_len));
    if (srv->secret == NULL || srv->conns == NULL || srv->rank_conn == NULL ||
        srv->blobs == NULL || srv->blob_len == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cap; i++)
        srv->rank_conn[i] = -1;
    for (int i = 0; i < srv->nconns; i++) {
        srv->conns[i].fd = -1;
        srv->conns[i].rank = -1;
        srv->conns[i].worker = -1;
    }

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
    *out = srv;
    return HVD_OK;
fail:
    hvd_rdv_server_destroy(srv);
    return st;
}

hvd_status hvd_rdv_server_create(const char *bind_addr, int port, int size,
                                 const uint8_t job_id[HVD_JOB_ID_LEN],
                                 const char *secret, hvd_rdv_server **out) {
    hvd_rdv_server *srv;
    hvd_status st = server_new(bind_addr, port, size, job_id, secret, &srv);

    if (st != HVD_OK)
        return st;
    HVD_INFO("rdv", "rendezvous for %d ranks listening on %s:%d", size,
             bind_addr, srv->port);
    *out = srv;
    return HVD_OK;
}

hvd_status hvd_rdv_server_create_elastic(const char *bind_addr, int port,
                                         int max_workers, int min_np,
                                         const uint8_t job_id[HVD_JOB_ID_LEN],
                                         const char *secret,
                                         hvd_rdv_server **out) {
    hvd_rdv_server *srv;
    hvd_status st;

    if (max_workers < 1 || max_workers > (1 << 20) || min_np > max_workers)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "elastic rendezvous for at most %d workers, at "
                             "least %d: need 1 <= min-np <= max workers <= "
                             "%d",
                             max_workers, min_np, 1 << 20);
    st = server_new(bind_addr, port, max_workers, job_id, secret, &srv);
    if (st != HVD_OK)
        return st;
    srv->elastic = 1;
    srv->size = 0;
    srv->max_workers = max_workers;
    srv->min_np = min_np < 1 ? 1 : min_np;
    srv->workers = calloc((size_t)max_workers, sizeof(*srv->workers));
    srv->gen_worker = calloc((size_t)max_workers, sizeof(*srv->gen_worker));
    Hvd__Rdv__Result ka = HVD__RDV__RESULT__INIT;
    ka.notice = 1;
    srv->keepalive = hvd_rdv_result_pack(&ka);
    if (srv->workers == NULL || srv->gen_worker == NULL ||
        srv->keepalive == NULL) {
        hvd_rdv_server_destroy(srv);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    for (int i = 0; i < max_workers; i++) {
        srv->workers[i].conn = -1;
        srv->workers[i].rank = -1;
    }
    HVD_INFO("rdv",
             "elastic rendezvous for up to %d workers (at least %d) "
             "listening on %s:%d",
             max_workers, srv->min_np, bind_addr, srv->port);
    *out = srv;
    return HVD_OK;
}

int hvd_rdv_server_port(const hvd_rdv_server *srv) { return srv->port; }

int hvd_rdv_server_fd(const hvd_rdv_server *srv) { return srv->epfd; }

int hvd_rdv_server_joined(const hvd_rdv_server *srv) { return srv->joined; }

void hvd_rdv_server_set_cred(hvd_rdv_server *srv, hvd_hs_cred_fn fn,
                             void *ctx) {
    srv->cred = fn;
    srv->cred_ctx = ctx;
}

int hvd_rdv_server_finished(const hvd_rdv_server *srv) {
    if (srv->elastic || srv->round == 0 || srv->have != 0)
        return 0;
    for (int r = 0; r < srv->size; r++)
        if (srv->rank_conn[r] >= 0)
            return 0;
    return 1;
}

static void handshake_event(hvd_rdv_server *srv, rconn *c);

/*
 * The connection to drop for a newcomer from name when the table is full:
 * an elastic connection being closed, else the oldest that has not sent a
 * HELLO -- of name's address when that address holds PER_SOURCE or more
 * of them, so that one flooding address does not push out another's.
 * NULL when every slot holds a rank or a connection that was sent its
 * CHALLENGE (it proved it knows this job's id: a rank, normally).
 */
static rconn *victim(hvd_rdv_server *srv, const char *name) {
    rconn *closing = NULL, *oldest = NULL, *own = NULL;
    int own_n = 0;

    for (int i = 0; i < srv->nconns; i++) {
        rconn *c = &srv->conns[i];
        if (c->state == RC_CLOSING) {
            if (closing == NULL || c->deadline < closing->deadline)
                closing = c;
            continue;
        }
        if (c->state != RC_HANDSHAKE || c->challenged)
            continue;
        if (oldest == NULL || c->since < oldest->since)
            oldest = c;
        if (hvd_net_same_address(c->name, name)) {
            own_n++;
            if (own == NULL || c->since < own->since)
                own = c;
        }
    }
    if (closing != NULL)
        return closing;
    return own_n >= PER_SOURCE ? own : oldest;
}

/* A free slot for a newcomer from name, made by dropping a stranger if
 * the table is full; NULL if none can be dropped. */
static rconn *free_slot(hvd_rdv_server *srv, const char *name) {
    for (int i = 0; i < srv->nconns; i++)
        if (srv->conns[i].state == RC_FREE)
            return &srv->conns[i];
    for (int tries = 0; tries < srv->nconns; tries++) {
        rconn *v = victim(srv, name);
        if (v == NULL)
            return NULL;
        if (v->state == RC_HANDSHAKE) {
            /* Its HELLO may be waiting unread (a rank sends it as soon as
             * it is connected): read it before judging it silent. */
            handshake_event(srv, v);
            if (v->state == RC_FREE)
                return v;
            if (v->state != RC_HANDSHAKE || v->challenged)
                continue;
            HVD_WARN_LIMITED(&srv->dropped, v->name, "rdv",
                             "dropped connection from %s: too many "
                             "connections that have not sent a hello, and "
                             "it waited longest",
                             v->name);
        }
        hvd_rdv_conn_close(srv, v);
        return v;
    }
    return NULL;
}

/* Accepts what is queued, ACCEPT_BATCH at most per call, so that a flood
 * of connections cannot keep the server from reading the ones it holds
 * (the listener is level-triggered: the rest come at the next call). */
static void accept_all(hvd_rdv_server *srv) {
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        int fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        char name[HVD_ADDR_MAX];
        rconn *c;

        if (fd < 0)
            return;
        hvd_net_peer_name(fd, name, sizeof(name));
        c = free_slot(srv, name);
        if (c == NULL) {
            HVD_WARN_LIMITED(&srv->refused, name, "rdv",
                             "refused connection from %s: too many "
                             "connections",
                             name);
            close(fd);
            continue;
        }
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->rank = -1;
        c->worker = -1;
        c->state = RC_HANDSHAKE;
        c->since = hvd_now_ns();
        c->deadline = c->since + HANDSHAKE_NS;
        snprintf(c->name, sizeof(c->name), "%s", name);
        hvd_hs_server_init(&c->hs, srv->job_id, srv->secret,
                           HVD_HS_KIND_RENDEZVOUS, -1, admit, srv);
        c->hs.cred = srv->cred;
        c->hs.cred_ctx = srv->cred_ctx;
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = (uint64_t)(c - srv->conns) + 2};
        epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev);
        hvd_rdv_arm_timer(srv, 1);
        /* A rank's HELLO is usually here already: answering it now
         * protects the connection from being dropped for newcomers. */
        handshake_event(srv, c);
    }
}

static void on_message(hvd_rdv_server *srv, rconn *c) {
    Hvd__Rdv__Contribute *msg =
        hvd__rdv__contribute__unpack(NULL, c->body_len, c->body);

    if (msg == NULL) {
        if (srv->elastic)
            HVD_WARN("rdv", "dropped worker %d at %s: malformed message",
                     c->worker, c->name);
        else
            HVD_WARN("rdv", "dropped rank %d at %s: malformed message", c->rank,
                     c->name);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (srv->elastic) {
        hvd_rdv_elastic_message(srv, c, msg);
        hvd__rdv__contribute__free_unpacked(msg, NULL);
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
        hvd_rdv_conn_close(srv, c);
        return;
    }
    srv->blobs[c->rank] = malloc(msg->blob.len ? msg->blob.len : 1);
    if (srv->blobs[c->rank] == NULL) {
        hvd__rdv__contribute__free_unpacked(msg, NULL);
        HVD_ERROR("rdv", "out of memory");
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (msg->blob.len)
        memcpy(srv->blobs[c->rank], msg->blob.data, msg->blob.len);
    srv->blob_len[c->rank] = msg->blob.len;
    hvd__rdv__contribute__free_unpacked(msg, NULL);
    if (++srv->have == srv->size)
        hvd_rdv_finish_round(srv);
}

/* Checks the tag of the message c just read; a message that fails it
 * was changed, replayed, reordered or follows a dropped one: nothing of it
 * is used, c is sent a last (authenticated) Result saying so and closed,
 * and 0 returned. */
static int authentic(hvd_rdv_server *srv, rconn *c) {
    char why[256];

    if (hvd_rdv_open(&c->keys, c->lenbuf, c->body, c->body_len,
                     c->body + c->body_len) == 0)
        return 1;
    snprintf(why, sizeof(why),
             "the rendezvous server dropped %s %d: message %llu it got "
             "from %s failed authentication (changed, replayed, reordered "
             "or one before it lost on the way)",
             srv->elastic ? "worker" : "rank",
             srv->elastic ? c->worker : c->rank,
             (unsigned long long)(c->keys.rx_n - 1), c->name);
    /* Anyone on the path can cause this at any rate: a bounded log. */
    HVD_WARN_LIMITED(&srv->forged, c->name, "rdv", "%s", why);
    free(c->body);
    c->body = NULL;
    c->len_got = c->body_got = c->body_len = 0;
    hvd_rdv_conn_fail(srv, c, HVD_ERR_PROTOCOL, why);
    return 0;
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
            want = c->body_len + RDV_TAG - c->body_got;
        }
        ssize_t n = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
        if (want && n == 0) {
            if (srv->elastic)
                HVD_DEBUG("rdv", "worker %d at %s closed its connection",
                          c->worker, c->name);
            else if (c->rank >= 0 && srv->round > 0 && !srv->have)
                HVD_DEBUG("rdv", "rank %d closed its connection", c->rank);
            else
                HVD_WARN("rdv",
                         "rank %d at %s left the rendezvous before the job "
                         "started (did it die?)",
                         c->rank, c->name);
            hvd_rdv_conn_close(srv, c);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (srv->elastic && errno == ECONNRESET) {
                /* A worker that resets closes its connection with
                 * notices unread: the kernel resets it. */
                HVD_DEBUG("rdv", "worker %d at %s closed its connection",
                          c->worker, c->name);
                hvd_rdv_conn_close(srv, c);
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                HVD_WARN("rdv", "%s %d at %s: recv() failed: %s",
                         srv->elastic ? "worker" : "rank",
                         srv->elastic ? c->worker : c->rank, c->name,
                         strerror(errno));
                hvd_rdv_conn_close(srv, c);
            }
            return;
        }
        if (c->len_got < LEN_PREFIX) {
            c->len_got += (size_t)n;
            if (c->len_got == LEN_PREFIX) {
                c->body_len = hvd_get32(c->lenbuf);
                if (c->body_len > MAX_CONTRIBUTE) {
                    HVD_WARN("rdv",
                             "dropped %s %d at %s: message of %zu bytes "
                             "(at most %d)",
                             srv->elastic ? "worker" : "rank",
                             srv->elastic ? c->worker : c->rank, c->name,
                             c->body_len, MAX_CONTRIBUTE);
                    hvd_rdv_conn_close(srv, c);
                    return;
                }
                c->body = malloc(c->body_len + RDV_TAG);
                c->body_got = 0;
                if (c->body == NULL) {
                    hvd_rdv_conn_close(srv, c);
                    return;
                }
            }
        } else {
            c->body_got += (size_t)n;
        }
        if (c->len_got == LEN_PREFIX && c->body_got == c->body_len + RDV_TAG) {
            if (!authentic(srv, c))
                return;
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

/* Moves c's handshake on as far as it goes now; c may end up closed
 * (refused), authenticated, or still in its handshake. */
static void handshake_event(hvd_rdv_server *srv, rconn *c) {
    short want = 0;
    hvd_status st = hvd_hs_io(&c->hs, c->fd, &want);

    if (st != HVD_OK && c->hs.cred_served) {
        if (c->hs.cred_served == 2)
            HVD_INFO("rdv", "gave %s a munge credential", c->name);
        else
            HVD_DEBUG("rdv", "%s: %s", c->name, c->hs.err);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (st != HVD_OK) {
        HVD_WARN_LIMITED(&srv->refused, c->name, "rdv",
                         "refused connection from %s claiming %s %d: %s",
                         c->name, srv->elastic ? "worker" : "rank",
                         c->hs.peer_rank, c->hs.err);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (want != 0) {
        /* Past its HELLO: it named this job and a rank we expect. */
        if (hvd_hs_need(&c->hs) == HVD_HS_RESPONSE_LEN)
            c->challenged = 1;
        hvd_rdv_conn_watch(srv, c, want == POLLOUT ? EPOLLOUT : EPOLLIN);
        return;
    }
    if (hvd_rdv_keys_init(&c->keys, &c->hs, 0) != HVD_OK) {
        HVD_ERROR("rdv", "dropped the connection from %s: %s", c->name,
                  hvd_error_get());
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (srv->elastic) {
        c->worker = c->hs.peer_rank;
        hvd_rdv_elastic_admitted(srv, c);
        return;
    }
    c->rank = c->hs.peer_rank;
    if (srv->rank_conn[c->rank] >= 0) {
        HVD_WARN("rdv", "refused a second connection for rank %d from %s",
                 c->rank, c->name);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    c->state = RC_READY;
    srv->rank_conn[c->rank] = (int)(c - srv->conns);
    srv->joined++;
    HVD_DEBUG("rdv", "rank %d joined from %s (%d of %d)", c->rank, c->name,
              srv->joined, srv->size);
    hvd_rdv_conn_watch(srv, c, EPOLLIN);
}

static void conn_event(hvd_rdv_server *srv, rconn *c, uint32_t events) {
    if (c->state == RC_HANDSHAKE) {
        handshake_event(srv, c);
        return;
    }
    if (c->state != RC_READY && c->state != RC_CLOSING)
        return;
    if (events & EPOLLOUT) {
        hvd_rdv_conn_flush(srv, c);
        if (c->state == RC_FREE)
            return;
    }
    if (c->state == RC_CLOSING) {
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            hvd_rdv_conn_drain(srv, c);
        return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        conn_read(srv, c);
}

static void sweep(hvd_rdv_server *srv) {
    uint64_t ticks;
    int pending = 0, nfree = 0;
    int64_t now = hvd_now_ns();

    while (read(srv->tfd, &ticks, sizeof(ticks)) > 0)
        ;
    pending += hvd_rdv_keep_alive(srv, now);
    for (int i = 0; i < srv->nconns; i++)
        nfree += srv->conns[i].state == RC_FREE;
    for (int i = 0; i < srv->nconns; i++) {
        rconn *c = &srv->conns[i];
        if (c->state != RC_HANDSHAKE && c->state != RC_CLOSING)
            continue;
        /* Short of free slots: one that has not sent a HELLO in HELLO_NS
         * is a stranger holding a slot (its HELLO is read first, in case
         * it came). */
        if (c->state == RC_HANDSHAKE && !c->challenged &&
            nfree < srv->nconns / 4 && now - c->since > HELLO_NS) {
            handshake_event(srv, c);
            if (c->state == RC_HANDSHAKE && !c->challenged) {
                HVD_WARN_LIMITED(&srv->dropped, c->name, "rdv",
                                 "dropped connection from %s: no hello "
                                 "within %lld ms while connections are "
                                 "short",
                                 c->name, HELLO_NS / 1000000LL);
                hvd_rdv_conn_close(srv, c);
                nfree++;
                continue;
            }
        }
        if (c->state == RC_FREE || c->state == RC_READY)
            continue;
        if (now > c->deadline) {
            if (c->state == RC_HANDSHAKE)
                HVD_WARN_LIMITED(&srv->dropped, c->name, "rdv",
                                 "dropped connection from %s: no handshake "
                                 "within %lld s",
                                 c->name, HANDSHAKE_NS / 1000000000LL);
            hvd_rdv_conn_close(srv, c);
        } else {
            pending++;
        }
    }
    hvd_log_limit_flush(&srv->refused, 0);
    hvd_log_limit_flush(&srv->dropped, 0);
    hvd_log_limit_flush(&srv->forged, 0);
    hvd_rdv_arm_timer(srv, pending > 0);
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
    hvd_log_limit_flush(&srv->refused, 1);
    hvd_log_limit_flush(&srv->dropped, 1);
    hvd_log_limit_flush(&srv->forged, 1);
    uint64_t strangers =
        hvd_log_limit_total(&srv->refused) + hvd_log_limit_total(&srv->dropped);
    if (strangers > HVD_LOG_LIMIT_BURST)
        HVD_WARN("rdv",
                 "the rendezvous was flooded by %llu unauthenticated "
                 "connections (refused or dropped before they proved they "
                 "hold the job secret)",
                 (unsigned long long)strangers);
    hvd_log_limiter_destroy(&srv->refused);
    hvd_log_limiter_destroy(&srv->dropped);
    hvd_log_limiter_destroy(&srv->forged);
    for (int i = 0; srv->conns != NULL && i < srv->nconns; i++)
        if (srv->conns[i].state != RC_FREE)
            hvd_rdv_conn_close(srv, &srv->conns[i]);
    /* Fixed: size ranks; elastic: room for max_workers. */
    int cap = srv->elastic ? srv->max_workers : srv->size;
    for (int r = 0; srv->blobs != NULL && r < cap; r++)
        free(srv->blobs[r]);
    if (srv->lfd >= 0)
        close(srv->lfd);
    if (srv->epfd >= 0)
        close(srv->epfd);
    if (srv->tfd >= 0)
        close(srv->tfd);
    for (int id = 0; srv->workers != NULL && id < srv->max_workers; id++)
        free(srv->workers[id].host);
    free(srv->workers);
    free(srv->gen_worker);
    hvd_rdv_result_put(srv->notice);
    hvd_rdv_result_put(srv->keepalive);
    free(srv->blobs);
    free(srv->blob_len);
    hvd_rdv_result_put(srv->result);
    free(srv->rank_conn);
    free(srv->conns);
    free(srv->secret);
    free(srv);
}
