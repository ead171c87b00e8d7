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
#define KEEPALIVE_NS (1000000000LL)
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

/* RC_CLOSING: an elastic connection that was sent its last Result (an
 * error): the rest of the queue is sent, the write side is shut, and what
 * the peer still sends is read and dropped until it closes or the
 * deadline passes, so that closing does not reset the connection before
 * the peer has read that Result. */
enum { RC_FREE = 0, RC_HANDSHAKE, RC_READY, RC_CLOSING };

/* Results queued on one connection besides notices: at most a round's
 * answer, an assignment and an error are ever pending at once. */
#define OUT_QUEUE 4
/* An elastic connection that was sent an error has this long to close. */
#define CLOSING_NS (5 * 1000000000LL)

typedef struct rconn {
    int state;
    int fd;
    int rank;      /* fixed: the rank; elastic: rank in the generation, -1 */
    int worker;    /* elastic: the worker id it authenticated as, -1 */
    int counted;   /* elastic: counted in srv->joined */
    int join_seen; /* elastic: its join arrived */
    int64_t deadline;
    char name[HVD_ADDR_MAX];
    hvd_hs hs;
    /* Incoming message: 4-byte length, then the body. */
    uint8_t lenbuf[LEN_PREFIX];
    size_t len_got;
    uint8_t *body;
    size_t body_len;
    size_t body_got;
    /* Outgoing: Results, shared (a reference held while queued: the next
     * round, of the next generation, may start before one is sent), sent
     * in order; q[qhead] from out_off. Notices are only counted, and one
     * is queued whenever the queue is empty (srv->notice). */
    struct rresult *q[OUT_QUEUE];
    int qhead, qlen;
    size_t out_off;
    int notices;
    int shut;
} rconn;

/* A Result as sent: length prefix and message. */
typedef struct rresult {
    int refs;
    size_t len;
    uint8_t data[];
} rresult;

static rresult *result_pack(const Hvd__Rdv__Result *res);

static void result_put(rresult *r) {
    if (r != NULL && --r->refs == 0)
        free(r);
}

/* An elastic worker, as hvdrun declared it. */
enum { W_NONE = 0, W_ADDED, W_REMOVED };

typedef struct rworker {
    int state;
    int conn;    /* index of its authenticated connection, -1 */
    int waiting; /* asked to join the next generation, not yet placed */
    int rank;    /* rank in the current generation, -1 */
    int64_t keepalive_at; /* waiting: when it was last sent anything */
    int placed;           /* was a member of some generation */
    char *host;
    char why[160]; /* why it was removed */
} rworker;

struct hvd_rdv_server {
    int lfd;
    int epfd;
    int tfd;
    int timer_armed;
    int port;
    int size; /* fixed: the job's; elastic: the current generation's */
    uint8_t job_id[HVD_JOB_ID_LEN];
    char *secret;
    rconn *conns;
    int nconns;
    int *rank_conn; /* rank -> index into conns, -1 */
    int joined;
    uint32_t generation; /* rendezvous started again after a shutdown;
                            elastic: the last generation formed */
    uint32_t round;
    uint8_t **blobs; /* this round's blob per rank, NULL if not yet */
    size_t *blob_len;
    int have;
    rresult *result; /* the last round's answer */

    /* Elastic mode. */
    int elastic;
    int max_workers;
    int min_np;
    rworker *workers;
    int *gen_worker;    /* rank -> worker id in the current generation */
    rresult *notice;    /* the notice of the current generation */
    rresult *keepalive; /* what a waiting worker gets every second */
    int gen_dead;       /* a member left: no round of it can complete */
    int any_placed;     /* some generation got past its first round */
    char dead_why[200];
    int ended;
    char end_why[256];
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

static void conn_close(hvd_rdv_server *srv, rconn *c) {
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
        result_put(c->q[(c->qhead + i) % OUT_QUEUE]);
    free(c->body);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->rank = -1;
    c->worker = -1;
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
    srv->keepalive = result_pack(&ka);
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
             * rank out. An elastic connection being closed goes first. */
            rconn *old = NULL;
            for (int i = 0; i < srv->nconns; i++)
                if ((srv->conns[i].state == RC_HANDSHAKE ||
                     srv->conns[i].state == RC_CLOSING) &&
                    (old == NULL ||
                     (srv->conns[i].state == RC_CLOSING &&
                      old->state != RC_CLOSING) ||
                     (srv->conns[i].state == old->state &&
                      srv->conns[i].deadline < old->deadline)))
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
            if (old->state == RC_HANDSHAKE)
                HVD_WARN("rdv",
                         "dropped connection from %s: too many connections "
                         "that have not authenticated, and it waited "
                         "longest",
                         old->name);
            conn_close(srv, old);
            c = old;
        }
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->rank = -1;
        c->worker = -1;
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

/* Sends what is queued on c: Results in order, then the notices it is
 * owed, one at a time. */
static void conn_flush(hvd_rdv_server *srv, rconn *c) {
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
        while (c->out_off < r->len) {
            ssize_t n = send(c->fd, r->data + c->out_off, r->len - c->out_off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                c->out_off += (size_t)n;
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                conn_watch(srv, c, EPOLLIN | EPOLLOUT);
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
                conn_close(srv, c);
                return;
            }
        }
        result_put(r);
        c->q[c->qhead] = NULL;
        c->qhead = (c->qhead + 1) % OUT_QUEUE;
        c->qlen--;
        c->out_off = 0;
    }
    if (c->state == RC_CLOSING && !c->shut) {
        shutdown(c->fd, SHUT_WR);
        c->shut = 1;
    }
    conn_watch(srv, c, EPOLLIN);
}

/* Queues r (a reference is taken) on c and sends what it can. */
static void conn_send(hvd_rdv_server *srv, rconn *c, rresult *r) {
    if (c->qlen == OUT_QUEUE) {
        HVD_WARN("rdv",
                 "dropped worker %d at %s: %d answers queued that it does "
                 "not read",
                 c->worker, c->name, OUT_QUEUE);
        conn_close(srv, c);
        return;
    }
    c->q[(c->qhead + c->qlen) % OUT_QUEUE] = r;
    c->qlen++;
    r->refs++;
    conn_flush(srv, c);
}

/* Packs res with its length prefix; one reference. NULL when out of
 * memory. */
static rresult *result_pack(const Hvd__Rdv__Result *res) {
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

/* Elastic: sends c a last Result carrying status and sentence, then
 * closes it (RC_CLOSING). c no longer stands for its worker. */
static void conn_fail(hvd_rdv_server *srv, rconn *c, hvd_status status,
                      const char *sentence) {
    Hvd__Rdv__Result res = HVD__RDV__RESULT__INIT;
    rresult *r;

    conn_detach(srv, c);
    c->state = RC_CLOSING;
    c->deadline = hvd_now_ns() + CLOSING_NS;
    arm_timer(srv, 1);
    res.generation = srv->generation;
    res.error_status = (int32_t)status;
    res.error = (char *)(uintptr_t)sentence;
    r = result_pack(&res);
    if (r == NULL) {
        HVD_ERROR("rdv", "out of memory telling worker %d: %s", c->worker,
                  sentence);
        conn_close(srv, c);
        return;
    }
    conn_send(srv, c, r);
    result_put(r);
}

static void finish_round(hvd_rdv_server *srv) {
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
    result_put(srv->result);
    srv->result = result_pack(&res);
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
            conn_send(srv, &srv->conns[srv->rank_conn[r]], srv->result);
}

static void drop_blobs(hvd_rdv_server *srv) {
    for (int r = 0; r < srv->max_workers; r++) {
        free(srv->blobs[r]);
        srv->blobs[r] = NULL;
    }
    srv->have = 0;
}

/*
 * Elastic: worker, rank rank of the current generation, leaves it (hvdrun
 * removed it, or it joins again on a new connection). No round of the
 * generation can complete without it, so the generation is dead: its
 * members must join again.
 *
 * The server does not know how many bootstrap rounds the library runs, so
 * it cannot tell "between two rounds" from "all rounds done". The rule:
 * - a round is open (some members contributed and wait), or round 0 has
 *   not completed (members were placed and are setting up): the
 *   generation is abandoned now: every other member with an open
 *   connection gets HVD_ERR_PEERS_CHANGED with the sentence, and the
 *   round's blobs are dropped;
 * - otherwise the members may be done with their rounds and running (they
 *   get only the notice, and their transport sees the loss itself), or
 *   about to start the next round: any later contribution to the dead
 *   generation is answered with HVD_ERR_PEERS_CHANGED at once.
 */
static void member_leave(hvd_rdv_server *srv, int worker, int rank) {
    srv->workers[worker].rank = -1;
    if (srv->gen_dead)
        return;
    srv->gen_dead = 1;
    snprintf(srv->dead_why, sizeof(srv->dead_why),
             "worker %d (rank %d) left while generation %u was being set up",
             worker, rank, srv->generation);
    if (srv->round > 0 && srv->have == 0) {
        HVD_INFO("rdv",
                 "worker %d (rank %d) left generation %u after %u rounds",
                 worker, rank, srv->generation, srv->round);
        return;
    }
    HVD_INFO("rdv", "generation %u abandoned: %s", srv->generation,
             srv->dead_why);
    drop_blobs(srv);
    for (int r = 0; r < srv->size; r++)
        if (r != rank && srv->rank_conn[r] >= 0)
            conn_fail(srv, &srv->conns[srv->rank_conn[r]],
                      HVD_ERR_PEERS_CHANGED, srv->dead_why);
}

/* Elastic: every member of the current generation with an open
 * connection is owed one more notice. */
static void notify_members(hvd_rdv_server *srv) {
    if (srv->generation == 0 || srv->notice == NULL)
        return;
    for (int r = 0; r < srv->size; r++) {
        if (srv->rank_conn[r] < 0)
            continue;
        rconn *c = &srv->conns[srv->rank_conn[r]];
        c->notices++;
        if (c->qlen == 0)
            conn_flush(srv, c);
    }
}

/* Elastic: places the waiting workers in generation + 1. */
static void form_generation(hvd_rdv_server *srv, int n) {
    Hvd__Rdv__Result res = HVD__RDV__RESULT__INIT;
    Hvd__Rdv__Assignment asg = HVD__RDV__ASSIGNMENT__INIT;
    int *w = srv->gen_worker;
    int hosts = 0, k = 0;

    drop_blobs(srv);
    for (int r = 0; r < srv->size; r++)
        srv->rank_conn[r] = -1;
    for (int i = 0; i < srv->nconns; i++)
        if (srv->conns[i].state == RC_READY)
            srv->conns[i].rank = -1;
    for (int id = 0; id < srv->max_workers; id++) {
        srv->workers[id].rank = -1;
        if (srv->workers[id].state == W_ADDED && srv->workers[id].waiting)
            w[k++] = id;
    }
    srv->generation++;
    srv->round = 0;
    srv->size = n;
    srv->gen_dead = 0;
    result_put(srv->notice);
    res.notice = 1;
    res.generation = srv->generation;
    srv->notice = result_pack(&res);
    res.notice = 0;
    for (int r = 0; r < n; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++)
            if (strcmp(srv->workers[w[q]].host, srv->workers[w[r]].host) == 0)
                first = 0;
        hosts += first;
    }
    HVD_INFO("rdv", "generation %u formed: %d workers on %d hosts",
             srv->generation, n, hosts);
    for (int r = 0; r < n; r++) {
        rworker *wr = &srv->workers[w[r]];
        int local_rank = 0, local_size = 0, cross = -1, seen = 0;
        for (int q = 0; q < n; q++) {
            const char *h = srv->workers[w[q]].host;
            int first = 1;
            for (int p = 0; p < q && first; p++)
                if (strcmp(srv->workers[w[p]].host, h) == 0)
                    first = 0;
            if (first && strcmp(h, wr->host) == 0)
                cross = seen;
            seen += first;
            if (strcmp(h, wr->host) == 0) {
                local_size++;
                local_rank += q < r;
            }
        }
        wr->rank = r;
        wr->waiting = 0;
        asg.rank = r;
        asg.size = n;
        asg.local_rank = local_rank;
        asg.local_size = local_size;
        asg.cross_rank = cross;
        asg.cross_size = hosts;
        res.generation = srv->generation;
        res.assignment = &asg;
        rconn *c = &srv->conns[wr->conn];
        c->rank = r;
        srv->rank_conn[r] = wr->conn;
        HVD_DEBUG("rdv",
                  "generation %u: worker %d on %s is rank %d (local %d of "
                  "%d, cross %d of %d)",
                  srv->generation, w[r], wr->host, r, local_rank, local_size,
                  cross, hosts);
        rresult *out = result_pack(&res);
        if (out == NULL) {
            HVD_ERROR("rdv", "out of memory placing worker %d", w[r]);
            conn_close(srv, c);
            continue;
        }
        conn_send(srv, c, out);
        result_put(out);
    }
}

/* Elastic: forms the next generation once every worker added and not
 * removed waits and there are min_np of them. */
int hvd_rdv_server_state_lost(const hvd_rdv_server *srv) {
    if (!srv->elastic || !srv->any_placed)
        return 0;
    for (int id = 0; id < srv->max_workers; id++)
        if (srv->workers[id].state == W_ADDED && srv->workers[id].placed)
            return 0;
    return 1;
}

static void check_formation(hvd_rdv_server *srv) {
    int live = 0, waiting = 0;

    /* Once no worker that was ever placed is left, nobody holds the
     * training state: a generation of new workers only would start from
     * scratch without anyone noticing (horovodrun's driver refuses too). */
    if (!srv->elastic || srv->ended || hvd_rdv_server_state_lost(srv))
        return;
    for (int id = 0; id < srv->max_workers; id++) {
        if (srv->workers[id].state != W_ADDED)
            continue;
        live++;
        waiting += srv->workers[id].waiting;
    }
    if (live > 0 && waiting == live && live >= srv->min_np)
        form_generation(srv, live);
}

hvd_status hvd_rdv_server_add_worker(hvd_rdv_server *srv, int worker,
                                     const char *host) {
    rworker *w;

    if (!srv->elastic || worker < 0 || worker >= srv->max_workers)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "worker id %d is outside 0..%d of this elastic "
                             "rendezvous",
                             worker, srv->max_workers - 1);
    w = &srv->workers[worker];
    if (w->state != W_NONE)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "worker id %d was added before (ids are never "
                             "reused)",
                             worker);
    w->host = strdup(host != NULL ? host : "");
    if (w->host == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    w->state = W_ADDED;
    HVD_DEBUG("rdv", "worker %d on %s added", worker, w->host);
    notify_members(srv);
    check_formation(srv);
    return HVD_OK;
}

void hvd_rdv_server_remove_worker(hvd_rdv_server *srv, int worker,
                                  const char *why) {
    rworker *w;
    char sentence[256];

    if (!srv->elastic || worker < 0 || worker >= srv->max_workers ||
        srv->workers[worker].state != W_ADDED)
        return;
    w = &srv->workers[worker];
    w->state = W_REMOVED;
    w->waiting = 0;
    snprintf(w->why, sizeof(w->why), "%s",
             why != NULL && why[0] ? why : "no reason given");
    HVD_INFO("rdv", "worker %d on %s removed: %s", worker, w->host, w->why);
    if (w->rank >= 0)
        member_leave(srv, worker, w->rank);
    if (w->conn >= 0) {
        snprintf(sentence, sizeof(sentence),
                 "worker %d was removed from the job (%s); it is not "
                 "re-admitted",
                 worker, w->why);
        conn_fail(srv, &srv->conns[w->conn], HVD_ERR_AUTH, sentence);
    }
    notify_members(srv);
    check_formation(srv);
}

uint32_t hvd_rdv_server_generation(const hvd_rdv_server *srv) {
    return srv->generation;
}

int hvd_rdv_server_workers(const hvd_rdv_server *srv) {
    int n = 0;

    for (int id = 0; id < srv->max_workers; id++)
        n += srv->workers[id].state == W_ADDED;
    return n;
}

int hvd_rdv_server_waiting(const hvd_rdv_server *srv) {
    int n = 0;

    for (int id = 0; id < srv->max_workers; id++)
        n += srv->workers[id].state == W_ADDED && srv->workers[id].waiting;
    return n;
}

int hvd_rdv_server_worker_waiting(const hvd_rdv_server *srv, int worker) {
    return srv->elastic && worker >= 0 && worker < srv->max_workers &&
           srv->workers[worker].state == W_ADDED &&
           srv->workers[worker].waiting;
}

int hvd_rdv_server_worker_member(const hvd_rdv_server *srv, int worker) {
    return srv->elastic && worker >= 0 && worker < srv->max_workers &&
           srv->workers[worker].state == W_ADDED &&
           srv->workers[worker].rank >= 0 && !srv->gen_dead;
}

void hvd_rdv_server_end(hvd_rdv_server *srv, const char *why) {
    if (!srv->elastic)
        return;
    srv->ended = 1;
    snprintf(srv->end_why, sizeof(srv->end_why), "%s",
             why != NULL && why[0] ? why : "the job is ending");
    HVD_INFO("rdv", "the job ends: %s", srv->end_why);
    for (int id = 0; id < srv->max_workers; id++) {
        rworker *w = &srv->workers[id];
        if (w->waiting && w->conn >= 0)
            conn_fail(srv, &srv->conns[w->conn], HVD_ERR_SHUTDOWN,
                      srv->end_why);
    }
}

/* Elastic: c authenticated as worker c->worker. */
static void elastic_admitted(hvd_rdv_server *srv, rconn *c) {
    int idx = (int)(c - srv->conns);
    char sentence[256];
    rworker *w;

    c->state = RC_READY;
    c->counted = 1;
    srv->joined++;
    conn_watch(srv, c, EPOLLIN);
    if (c->worker >= srv->max_workers ||
        srv->workers[c->worker].state == W_NONE) {
        snprintf(sentence, sizeof(sentence),
                 "worker %d was never added to the job by the launcher; it "
                 "is not admitted (hvdrun sets HVD_ELASTIC_WORKER)",
                 c->worker);
        HVD_WARN("rdv", "refused connection from %s: %s", c->name, sentence);
        c->worker = -1;
        conn_fail(srv, c, HVD_ERR_AUTH, sentence);
        return;
    }
    w = &srv->workers[c->worker];
    if (w->state == W_REMOVED) {
        snprintf(sentence, sizeof(sentence),
                 "worker %d was removed from the job (%s); it is not "
                 "re-admitted",
                 c->worker, w->why);
        HVD_WARN("rdv", "refused connection from %s: %s", c->name, sentence);
        c->worker = -1;
        conn_fail(srv, c, HVD_ERR_AUTH, sentence);
        return;
    }
    /* A process joins again (hvd_init after hvd_shutdown, or
     * hvd_elastic_reset): its old connection goes, and it leaves its
     * generation. */
    if (w->conn >= 0) {
        HVD_DEBUG("rdv", "worker %d connected again from %s", c->worker,
                  c->name);
        conn_close(srv, &srv->conns[w->conn]);
    }
    if (w->rank >= 0)
        member_leave(srv, c->worker, w->rank);
    w->conn = idx;
    HVD_DEBUG("rdv", "worker %d authenticated from %s", c->worker, c->name);
}

/* Elastic: a Contribute from c. Returns with c possibly closed. */
static void elastic_message(hvd_rdv_server *srv, rconn *c,
                            const Hvd__Rdv__Contribute *msg) {
    if (msg->join) {
        rworker *w = &srv->workers[c->worker];
        if (c->join_seen || c->rank >= 0) {
            HVD_WARN("rdv", "dropped worker %d at %s: it asked to join twice",
                     c->worker, c->name);
            conn_close(srv, c);
            return;
        }
        c->join_seen = 1;
        if (srv->ended) {
            conn_fail(srv, c, HVD_ERR_SHUTDOWN, srv->end_why);
            return;
        }
        w->waiting = 1;
        w->keepalive_at = hvd_now_ns();
        arm_timer(srv, 1);
        HVD_DEBUG("rdv", "worker %d waits for generation %u (%d of %d)",
                  c->worker, srv->generation + 1, hvd_rdv_server_waiting(srv),
                  hvd_rdv_server_workers(srv));
        check_formation(srv);
        return;
    }
    if (c->rank < 0 || msg->generation != srv->generation) {
        HVD_WARN("rdv",
                 "dropped worker %d at %s: contribution to round %u of "
                 "generation %u while it is not a member of generation %u",
                 c->worker, c->name, msg->round, msg->generation,
                 srv->generation);
        conn_close(srv, c);
        return;
    }
    if (srv->gen_dead) {
        conn_fail(srv, c, HVD_ERR_PEERS_CHANGED, srv->dead_why);
        return;
    }
    if (msg->round != srv->round || srv->blobs[c->rank] != NULL ||
        msg->blob.len > HVD_RDV_MAX_BLOB) {
        HVD_WARN("rdv",
                 "dropped worker %d (rank %d) at %s: contribution to round "
                 "%u (%zu bytes) while round %u of generation %u is open",
                 c->worker, c->rank, c->name, msg->round, msg->blob.len,
                 srv->round, srv->generation);
        conn_close(srv, c);
        return;
    }
    srv->blobs[c->rank] = malloc(msg->blob.len ? msg->blob.len : 1);
    if (srv->blobs[c->rank] == NULL) {
        HVD_ERROR("rdv", "out of memory");
        conn_close(srv, c);
        return;
    }
    if (msg->blob.len)
        memcpy(srv->blobs[c->rank], msg->blob.data, msg->blob.len);
    srv->blob_len[c->rank] = msg->blob.len;
    if (++srv->have == srv->size)
        finish_round(srv);
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
        conn_close(srv, c);
        return;
    }
    if (srv->elastic) {
        elastic_message(srv, c, msg);
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

/* Elastic: reads and drops what a closing connection still sends, and
 * closes it at its end. */
static void conn_drain(hvd_rdv_server *srv, rconn *c) {
    uint8_t buf[4096];

    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        conn_close(srv, c);
        return;
    }
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
            conn_close(srv, c);
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
                conn_close(srv, c);
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                HVD_WARN("rdv", "%s %d at %s: recv() failed: %s",
                         srv->elastic ? "worker" : "rank",
                         srv->elastic ? c->worker : c->rank, c->name,
                         strerror(errno));
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
                             "dropped %s %d at %s: message of %zu bytes "
                             "(at most %d)",
                             srv->elastic ? "worker" : "rank",
                             srv->elastic ? c->worker : c->rank, c->name,
                             c->body_len, MAX_CONTRIBUTE);
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
            HVD_WARN("rdv", "refused connection from %s claiming %s %d: %s",
                     c->name, srv->elastic ? "worker" : "rank", c->hs.peer_rank,
                     c->hs.err);
            conn_close(srv, c);
            return;
        }
        if (want != 0) {
            conn_watch(srv, c, want == POLLOUT ? EPOLLOUT : EPOLLIN);
            return;
        }
        if (srv->elastic) {
            c->worker = c->hs.peer_rank;
            elastic_admitted(srv, c);
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
    if (c->state != RC_READY && c->state != RC_CLOSING)
        return;
    if (events & EPOLLOUT) {
        conn_flush(srv, c);
        if (c->state == RC_FREE)
            return;
    }
    if (c->state == RC_CLOSING) {
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            conn_drain(srv, c);
        return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        conn_read(srv, c);
}

/*
 * Elastic: a worker waiting to be placed hears from the server every
 * KEEPALIVE_NS (a notice, which a joining client skips), so that its
 * timeout (HVD_ELASTIC_TIMEOUT_SECONDS) measures the server's silence, not
 * the wait: it may wait as long as the members take to reach their next
 * commit, while hvdrun lives. Returns the number of waiting workers.
 */
static int keep_alive(hvd_rdv_server *srv, int64_t now) {
    int waiting = 0;

    if (!srv->elastic || srv->keepalive == NULL)
        return 0;
    for (int id = 0; id < srv->max_workers; id++) {
        rworker *w = &srv->workers[id];
        if (w->state != W_ADDED || !w->waiting || w->conn < 0)
            continue;
        waiting++;
        rconn *c = &srv->conns[w->conn];
        /* Half the period: the sweep's ticks (every KEEPALIVE_NS) need
         * not line up with when the worker began to wait, and a tick just
         * short of a whole period would double the silence. */
        if (now - w->keepalive_at < KEEPALIVE_NS / 2 || c->qlen > 0 ||
            c->state != RC_READY)
            continue;
        c->q[c->qhead] = srv->keepalive;
        srv->keepalive->refs++;
        c->qlen = 1;
        c->out_off = 0;
        w->keepalive_at = now;
        conn_flush(srv, c);
    }
    return waiting;
}

static void sweep(hvd_rdv_server *srv) {
    uint64_t ticks;
    int pending = 0;
    int64_t now = hvd_now_ns();

    while (read(srv->tfd, &ticks, sizeof(ticks)) > 0)
        ;
    pending += keep_alive(srv, now);
    for (int i = 0; i < srv->nconns; i++) {
        rconn *c = &srv->conns[i];
        if (c->state != RC_HANDSHAKE && c->state != RC_CLOSING)
            continue;
        if (now > c->deadline) {
            if (c->state == RC_HANDSHAKE)
                HVD_WARN("rdv",
                         "dropped connection from %s: no handshake within "
                         "%lld s",
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
    result_put(srv->notice);
    result_put(srv->keepalive);
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

/* Largest Result that is not a round's answer (an assignment, a notice, an
 * error and its sentence). */
#define MAX_OTHER_RESULT (64 * 1024)

typedef struct rdv_client {
    hvd_bootstrap bs;
    int fd;
    uint32_t generation;
    uint32_t round;
    int64_t deadline;
    /* Elastic. */
    int elastic;
    int worker;
    int64_t timeout_ns;
    int notices; /* since the join */
    int broken;  /* the connection broke or the server ended it */
    /* The Result being received: 4-byte length, then the body. */
    uint8_t lenbuf[LEN_PREFIX];
    size_t len_got;
    uint8_t *body;
    size_t body_len;
    size_t body_got;
} rdv_client;

/* Rendezvous this process started in fixed mode (hvd_init holds its lock
 * around it). */
static uint32_t client_generations;

/* Blocking send on a non-blocking socket, bounded by deadline. */
static hvd_status send_all(rdv_client *cl, const void *buf, size_t len) {
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(cl->fd, (const uint8_t *)buf + off, len - off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return hvd_error_set(HVD_ERR_PEER_LOST,
                                 "send() to the rendezvous server failed: %s",
                                 n == 0 ? "nothing sent" : strerror(errno));
        int64_t left_ms = (cl->deadline - hvd_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hvd_error_set(HVD_ERR_TIMEOUT, "send() timed out");
        struct pollfd pfd = {.fd = cl->fd, .events = POLLOUT};
        poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    }
    return HVD_OK;
}

/*
 * Receives the next Result into *res_out, waiting until cl->deadline if
 * block, else returning HVD_OK with *res_out = NULL when no whole Result
 * has arrived. A partial Result stays buffered for the next call.
 * HVD_ERR_TIMEOUT (the caller writes the sentence), HVD_ERR_PEER_LOST,
 * HVD_ERR_PROTOCOL for an oversized or malformed Result.
 */
static hvd_status recv_result(rdv_client *cl, int block,
                              Hvd__Rdv__Result **res_out) {
    size_t max = (size_t)cl->bs.size * (HVD_RDV_MAX_BLOB + 8) + 64;

    if (max < MAX_OTHER_RESULT)
        max = MAX_OTHER_RESULT;
    *res_out = NULL;
    for (;;) {
        uint8_t *dst;
        size_t want;

        if (cl->len_got < LEN_PREFIX) {
            dst = cl->lenbuf + cl->len_got;
            want = LEN_PREFIX - cl->len_got;
        } else {
            dst = cl->body + cl->body_got;
            want = cl->body_len - cl->body_got;
        }
        if (want == 0) {
            Hvd__Rdv__Result *res =
                hvd__rdv__result__unpack(NULL, cl->body_len, cl->body);
            free(cl->body);
            cl->body = NULL;
            cl->len_got = cl->body_len = cl->body_got = 0;
            if (res == NULL)
                return hvd_error_set(HVD_ERR_PROTOCOL,
                                     "malformed answer from the rendezvous "
                                     "server for round %u",
                                     cl->round);
            *res_out = res;
            return HVD_OK;
        }
        ssize_t n = recv(cl->fd, dst, want, MSG_DONTWAIT);
        if (n > 0) {
            if (cl->len_got < LEN_PREFIX) {
                cl->len_got += (size_t)n;
                if (cl->len_got < LEN_PREFIX)
                    continue;
                cl->body_len = hvd_get32(cl->lenbuf);
                if (cl->body_len > max)
                    return hvd_error_set(HVD_ERR_PROTOCOL,
                                         "the rendezvous server sent a "
                                         "%zu-byte answer (at most %zu)",
                                         cl->body_len, max);
                cl->body = malloc(cl->body_len ? cl->body_len : 1);
                if (cl->body == NULL)
                    return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
                cl->body_got = 0;
            } else {
                cl->body_got += (size_t)n;
            }
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
                                 "recv() from the rendezvous server failed: "
                                 "%s",
                                 strerror(errno));
        if (!block)
            return HVD_OK;
        int64_t left_ms = (cl->deadline - hvd_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hvd_error_set(HVD_ERR_TIMEOUT, "timed out");
        struct pollfd pfd = {.fd = cl->fd, .events = POLLIN};
        poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    }
}

/* Elastic: a Result with error set ends the connection; returns its
 * status with its sentence. */
static hvd_status server_error(rdv_client *cl, const Hvd__Rdv__Result *res) {
    cl->broken = 1;
    if (res->error_status <= HVD_OK || res->error_status > HVD_ERR_PROTOCOL)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "the rendezvous server ended the connection "
                             "with status %d: %s",
                             res->error_status,
                             res->error != NULL ? res->error : "");
    return hvd_error_set((hvd_status)res->error_status, "%s",
                         res->error != NULL && res->error[0]
                             ? res->error
                             : "the rendezvous server ended the connection");
}

/*
 * Elastic: the server may have ended the connection with an error Result
 * (a generation abandoned while this rank was between rounds) and closed
 * it before this rank sent again. Returns that Result's status and
 * sentence if it is still unread, else st with its sentence.
 */
static hvd_status unread_error(rdv_client *cl, hvd_status st) {
    char saved[HVD_ERROR_MAX];
    Hvd__Rdv__Result *res = NULL;

    snprintf(saved, sizeof(saved), "%s", hvd_error_get());
    for (int i = 0; i < 1024; i++) {
        if (recv_result(cl, 0, &res) != HVD_OK || res == NULL)
            break;
        if (res->error_status != 0) {
            st = server_error(cl, res);
            hvd__rdv__result__free_unpacked(res, NULL);
            return st;
        }
        cl->notices += res->notice != 0;
        hvd__rdv__result__free_unpacked(res, NULL);
        res = NULL;
    }
    return hvd_error_copy(st, saved);
}

static hvd_status client_allgather(hvd_bootstrap *bs, const void *mine,
                                   size_t len, void *all_out) {
    rdv_client *cl = bs->ctx;
    Hvd__Rdv__Contribute msg = HVD__RDV__CONTRIBUTE__INIT;
    Hvd__Rdv__Result *res = NULL;
    uint8_t *buf = NULL;
    size_t plen;
    hvd_status st;

    if (len > HVD_RDV_MAX_BLOB)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "bootstrap blob of %zu bytes (at most %d)", len,
                             HVD_RDV_MAX_BLOB);
    if (cl->broken)
        return hvd_error_set(HVD_ERR_PEER_LOST,
                             "worker %d: the connection to the rendezvous "
                             "server ended before bootstrap round %u",
                             cl->worker, cl->round);
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
    st = send_all(cl, buf, plen + LEN_PREFIX);
    free(buf);
    if (st == HVD_ERR_PEER_LOST && cl->elastic)
        st = unread_error(cl, st);
    if (st != HVD_OK)
        goto timeout;

    /* Elastic: notices pushed meanwhile are counted and skipped. */
    for (;;) {
        st = recv_result(cl, 1, &res);
        if (st != HVD_OK)
            goto timeout;
        if (!cl->elastic || !res->notice)
            break;
        cl->notices++;
        hvd__rdv__result__free_unpacked(res, NULL);
        res = NULL;
    }
    if (cl->elastic && res->error_status != 0) {
        st = server_error(cl, res);
        goto out;
    }
    if (res->round != cl->round || res->generation != cl->generation ||
        res->n_blobs != (size_t)bs->size) {
        st = hvd_error_set(HVD_ERR_PROTOCOL,
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
    return st;
timeout:
    if (st == HVD_ERR_TIMEOUT && cl->elastic)
        st = hvd_error_set(HVD_ERR_TIMEOUT,
                           "worker %d (rank %d): not every worker of "
                           "generation %u reached bootstrap round %u within "
                           "HVD_ELASTIC_TIMEOUT_SECONDS (%lld s)",
                           cl->worker, bs->rank, cl->generation, cl->round,
                           (long long)(cl->timeout_ns / 1000000000LL));
    else if (st == HVD_ERR_TIMEOUT)
        st = hvd_error_set(HVD_ERR_TIMEOUT,
                           "rank %d: not every rank reached hvd_init "
                           "within the start timeout "
                           "(HVD_START_TIMEOUT_SECONDS)",
                           bs->rank);
    if (st == HVD_ERR_PEER_LOST || st == HVD_ERR_TRANSPORT ||
        st == HVD_ERR_PROTOCOL)
        cl->broken = 1;
    return st;
}

/*
 * Connects to the server and runs the handshake as id (a rank, or a
 * worker id in elastic mode), retrying while the server refuses, up to
 * cl->deadline. what names id in messages ("rank", "worker").
 */
static hvd_status connect_auth(rdv_client *cl, const char *addr, int port,
                               const char *what, int id,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const char *secret) {
    hvd_hs hs;
    hvd_status st;

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
                                        HVD_HS_KIND_RENDEZVOUS, id, 0, -1);
                if (st == HVD_OK)
                    st = hvd_hs_run(&hs, cl->fd, cl->deadline);
                if (st == HVD_OK)
                    return HVD_OK;
                if (st != HVD_ERR_PEER_LOST || hvd_now_ns() > cl->deadline)
                    return hvd_error_set(st,
                                         "%s %d: the rendezvous server at "
                                         "%s:%d did not accept this %s: %s",
                                         what, id, addr, port, what, hs.err);
                HVD_DEBUG("rdv", "%s %d: %s; trying again", what, id, hs.err);
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
            return st;
        }
        poll(NULL, 0, 100);
    }
}

static rdv_client *client_new(int64_t timeout_ns) {
    rdv_client *cl = calloc(1, sizeof(*cl));

    if (cl == NULL)
        return NULL;
    cl->fd = -1;
    cl->worker = -1;
    cl->timeout_ns = timeout_ns;
    cl->deadline = hvd_now_ns() + timeout_ns;
    cl->bs.allgather = client_allgather;
    cl->bs.ctx = cl;
    return cl;
}

hvd_status hvd_rdv_client_connect(const char *addr, int port, int rank,
                                  int size,
                                  const uint8_t job_id[HVD_JOB_ID_LEN],
                                  const char *secret, int64_t timeout_ns,
                                  hvd_bootstrap **out,
                                  char local_addr_out[64]) {
    rdv_client *cl = client_new(timeout_ns);
    hvd_status st;

    if (cl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    cl->bs.rank = rank;
    cl->bs.size = size;
    st = connect_auth(cl, addr, port, "rank", rank, job_id, secret);
    if (st != HVD_OK)
        goto fail;
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

/* Elastic: checks an assignment the server sent. */
static int assignment_ok(const Hvd__Rdv__Assignment *a) {
    return a != NULL && a->size > 0 && a->rank >= 0 && a->rank < a->size &&
           a->local_size > 0 && a->local_rank >= 0 &&
           a->local_rank < a->local_size && a->local_size <= a->size &&
           a->cross_size > 0 && a->cross_rank >= 0 &&
           a->cross_rank < a->cross_size && a->cross_size <= a->size;
}

hvd_status hvd_rdv_client_join(const char *addr, int port, int worker,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const char *secret, int64_t timeout_ns,
                               hvd_bootstrap **out, char local_addr_out[64],
                               hvd_rdv_assignment *asg_out) {
    rdv_client *cl = client_new(timeout_ns);
    Hvd__Rdv__Contribute msg = HVD__RDV__CONTRIBUTE__INIT;
    Hvd__Rdv__Result *res = NULL;
    uint8_t buf[LEN_PREFIX + 16];
    size_t plen;
    hvd_status st;

    if (cl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (worker < 0) {
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "worker id %d (HVD_ELASTIC_WORKER) is negative",
                           worker);
        goto fail;
    }
    cl->elastic = 1;
    cl->worker = worker;
    cl->bs.rank = -1;
    st = connect_auth(cl, addr, port, "worker", worker, job_id, secret);
    if (st != HVD_OK)
        goto fail;
    st = hvd_net_local_addr(cl->fd, local_addr_out, 64);
    if (st != HVD_OK)
        goto fail;

    msg.join = 1;
    plen = hvd__rdv__contribute__get_packed_size(&msg);
    hvd_put32(buf, (uint32_t)plen);
    hvd__rdv__contribute__pack(&msg, buf + LEN_PREFIX);
    st = send_all(cl, buf, plen + LEN_PREFIX);
    /* While this worker waits, the server sends a keepalive (a notice)
     * every second: the timeout is of the server's silence. */
    while (st == HVD_OK) {
        st = recv_result(cl, 1, &res);
        if (st != HVD_OK || !res->notice)
            break;
        cl->deadline = hvd_now_ns() + timeout_ns;
        hvd__rdv__result__free_unpacked(res, NULL);
        res = NULL;
    }
    if (st == HVD_ERR_TIMEOUT) {
        st = hvd_error_set(HVD_ERR_TIMEOUT,
                           "worker %d: the rendezvous server (hvdrun) said "
                           "nothing for HVD_ELASTIC_TIMEOUT_SECONDS (%lld s) "
                           "while this worker waited to be placed in a "
                           "generation: is hvdrun stopped or its host cut "
                           "off?",
                           worker, (long long)(timeout_ns / 1000000000LL));
        goto fail;
    }
    if (st != HVD_OK)
        goto fail;
    if (res->error_status != 0) {
        st = server_error(cl, res);
        goto fail;
    }
    if (res->generation == 0 || !assignment_ok(res->assignment)) {
        st = hvd_error_set(HVD_ERR_PROTOCOL,
                           "worker %d: malformed assignment from the "
                           "rendezvous server",
                           worker);
        goto fail;
    }
    asg_out->generation = res->generation;
    asg_out->rank = res->assignment->rank;
    asg_out->size = res->assignment->size;
    asg_out->local_rank = res->assignment->local_rank;
    asg_out->local_size = res->assignment->local_size;
    asg_out->cross_rank = res->assignment->cross_rank;
    asg_out->cross_size = res->assignment->cross_size;
    cl->bs.rank = asg_out->rank;
    cl->bs.size = asg_out->size;
    cl->generation = res->generation;
    cl->round = 0;
    cl->notices = 0;
    /* The generation's rounds get a timeout of their own. */
    cl->deadline = hvd_now_ns() + timeout_ns;
    hvd__rdv__result__free_unpacked(res, NULL);
    *out = &cl->bs;
    return HVD_OK;
fail:
    if (res != NULL)
        hvd__rdv__result__free_unpacked(res, NULL);
    hvd_rdv_client_close(&cl->bs);
    return st;
}

int hvd_rdv_client_updates(hvd_bootstrap *bs) {
    rdv_client *cl;

    if (bs == NULL)
        return 0;
    cl = bs->ctx;
    if (!cl->elastic)
        return 0;
    /* Bounded: a server pushing without end cannot hold the caller. */
    for (int i = 0; i < 1024 && !cl->broken; i++) {
        Hvd__Rdv__Result *res;
        hvd_status st = recv_result(cl, 0, &res);
        if (st != HVD_OK) {
            cl->broken = 1;
            break;
        }
        if (res == NULL)
            return cl->notices;
        if (res->notice && res->error_status == 0) {
            cl->notices++;
        } else if (res->error_status != 0) {
            server_error(cl, res);
        } else {
            hvd_error_set(HVD_ERR_PROTOCOL,
                          "worker %d: unexpected answer from the "
                          "rendezvous server outside a bootstrap round",
                          cl->worker);
            cl->broken = 1;
        }
        hvd__rdv__result__free_unpacked(res, NULL);
    }
    return cl->broken ? -1 : cl->notices;
}

void hvd_rdv_client_close(hvd_bootstrap *bs) {
    rdv_client *cl;

    if (bs == NULL)
        return;
    cl = bs->ctx;
    if (cl->fd >= 0)
        close(cl->fd);
    free(cl->body);
    free(cl);
}
