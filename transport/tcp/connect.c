/*
 * The TCP transport's mesh (see tcp_internal.h): every rank connects to
 * each lower rank and accepts each higher one, all at once in one poll
 * loop, every connection authenticated by the handshake.
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/bootstrap/handshake.h"
#include "transport/bootstrap/net.h"

#include <openssl/crypto.h>

/* Connections a loop turn accepts at most, so that a flood cannot keep
 * the mesh from moving the handshakes it holds (the rest wait in the
 * listener's backlog for the next turn). */
#define ACCEPT_BATCH 64
/* Connections without a HELLO one address may hold before its own oldest
 * is the one dropped for a newcomer from it. */
#define PER_SOURCE 8

/* Partial-write bookkeeping for the listen/handshake phase. */
typedef struct pending_conn {
    int fd;
    int peer; /* client side: the rank we connect to; server: -1 */
    int index;
    int client;
    int64_t deadline;
    int64_t retry_at; /* client: reconnect after a refusal at this time */
    int connected;    /* client: TCP connect finished */
    int challenged;   /* server: its HELLO was valid and got a CHALLENGE */
    int drops;        /* client: closed by the server mid-handshake */
    int64_t since;    /* server: accepted at this time */
    char name[HVD_ADDR_MAX + 8];
    hvd_hs hs;
} pending_conn;

static hvd_hs_code admit(void *ctx, int kind, int rank, int index, char *why,
                         size_t whylen) {
    tcp *tp = ctx;

    if (kind != HVD_HS_KIND_DATA) {
        snprintf(why, whylen, "not a data connection (kind %d)", kind);
        return HVD_HS_UNEXPECTED;
    }
    if (rank <= tp->rank || rank >= tp->size || index >= tp->nconn) {
        snprintf(why, whylen,
                 "rank %d socket %d is not expected to connect to rank %d "
                 "(job of %d, %d sockets per peer)",
                 rank, index, tp->rank, tp->size, tp->nconn);
        return HVD_HS_UNEXPECTED;
    }
    if (tp->peers[rank].socks[index].fd >= 0) {
        snprintf(why, whylen, "rank %d socket %d is already connected", rank,
                 index);
        return HVD_HS_UNEXPECTED;
    }
    return HVD_HS_OK;
}

static hvd_status client_start(tcp *tp, pending_conn *c,
                               const hvd_transport_params *params) {
    hvd_status st = hvd_net_connect_start(tp->peers[c->peer].addr,
                                          tp->peers[c->peer].port, &c->fd);
    if (st != HVD_OK)
        return st;
    c->connected = 0;
    st = hvd_hs_client_init(&c->hs, params->job_id, params->secret,
                            HVD_HS_KIND_DATA, tp->rank, c->index, c->peer);
    hvd_hs_set_protect(&c->hs, tp->protect);
    return st;
}

hvd_status hvd_tcp_install(tcp *tp, int peer, int index, int fd,
                           const uint8_t *tx_key, const uint8_t *rx_key) {
    tsock *s = &tp->peers[peer].socks[index];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = s};
    hvd_status st = hvd_aead_init(&s->tx_h, tp->protect, 1, tx_key);

    if (st == HVD_OK)
        st = hvd_aead_init(&s->tx_b, tp->protect, 1, tx_key);
    if (st == HVD_OK)
        st = hvd_aead_init(&s->rx_a, tp->protect, 0, rx_key);
    if (st == HVD_OK && tp->protect == HVD_PROTECT_ENCRYPT &&
        (s->stage = malloc(TX_STAGE)) == NULL)
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (st != HVD_OK) {
        close(fd);
        return st;
    }
    s->fd = fd;
    hvd_net_nodelay(fd);
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
        s->events = ev.events;
        s->registered = 1;
    }
    return HVD_OK;
}

/* The mesh being built: the connections in progress and their count. */
typedef struct mesh {
    tcp *tp;
    const hvd_transport_params *params;
    int lfd;
    pending_conn *conns; /* maxconn entries, nconn in use */
    struct pollfd *pfds; /* maxconn + 1: the listener, then conns */
    int nconn;
    int maxconn;
    int nclients; /* connections this rank makes (to lower ranks) */
    int nexpect;  /* connections it accepts (from higher ranks) */
    int connected;
    int64_t deadline;
} mesh;

/* Starts a connection to every socket of every lower rank. */
static hvd_status start_clients(mesh *m) {
    tcp *tp = m->tp;

    for (int p = 0; p < tp->rank; p++) {
        for (int k = 0; k < tp->nconn; k++) {
            pending_conn *c = &m->conns[m->nconn++];
            c->peer = p;
            c->index = k;
            c->client = 1;
            c->deadline = m->deadline;
            snprintf(c->name, sizeof(c->name), "%s:%d", tp->peers[p].addr,
                     tp->peers[p].port);
            hvd_status st = client_start(tp, c, m->params);
            if (st != HVD_OK)
                return st;
        }
    }
    return HVD_OK;
}

/* The start timeout passed: names a lower rank not reached, or else says
 * how many higher ranks' connections are missing. */
static hvd_status timed_out(const mesh *m) {
    tcp *tp = m->tp;

    for (int i = 0; i < m->nconn; i++) {
        if (m->conns[i].client && m->conns[i].fd != -2) {
            char who[160];
            hvd_tcp_describe(tp, m->conns[i].peer, who, sizeof(who));
            if (m->conns[i].drops > 0)
                return hvd_error_set(
                    HVD_ERR_TIMEOUT,
                    "could not connect to %s at %s within the start "
                    "timeout: its connection was closed %d times before "
                    "the handshake finished -- it may be flooded by "
                    "unauthenticated connections",
                    who, m->conns[i].name, m->conns[i].drops);
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "could not connect to %s at %s "
                                 "within the start timeout",
                                 who, m->conns[i].name);
        }
    }
    return hvd_error_set(HVD_ERR_TIMEOUT,
                         "rank %d: %d of %d higher ranks' connections "
                         "did not arrive within the start timeout",
                         tp->rank, m->nclients + m->nexpect - m->connected,
                         m->nexpect);
}

/* Waits up to 100 ms for the listener or a connection in progress. */
static hvd_status wait_any(mesh *m) {
    int npfd = 0;

    m->pfds[npfd++] = (struct pollfd){.fd = m->lfd, .events = POLLIN};
    for (int i = 0; i < m->nconn; i++) {
        pending_conn *c = &m->conns[i];
        short ev = POLLIN;
        if (c->fd < 0)
            continue;
        if (c->client && !c->connected)
            ev = POLLOUT;
        else if (c->hs.out_off < c->hs.out_len)
            ev = POLLOUT;
        m->pfds[npfd++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int r = poll(m->pfds, (nfds_t)npfd, 100);
    if (r < 0 && errno != EINTR)
        return hvd_error_set(HVD_ERR_TRANSPORT, "poll() failed: %s",
                             strerror(errno));
    return HVD_OK;
}

/* Strangers at the data listener, logged at a bounded rate (anyone can
 * connect at any rate). */
static hvd_log_limiter refused_log =
    HVD_LOG_LIMITER_INIT("tcp", "refused", "not authenticated");
static hvd_log_limiter dropped_log = HVD_LOG_LIMITER_INIT(
    "tcp", "dropped", "too many unauthenticated connections");

static hvd_status step(mesh *m, pending_conn *c, int64_t now);

/* The server-side connection to drop for a newcomer from name: the oldest
 * that has not sent a valid HELLO -- of name's address when that address
 * holds PER_SOURCE or more, so that one flooding address does not push out
 * another's. NULL when every one got its CHALLENGE (it named this job and
 * a rank we expect: a rank, normally). */
static pending_conn *victim(mesh *m, const char *name) {
    pending_conn *oldest = NULL, *own = NULL;
    int own_n = 0;

    for (int i = 0; i < m->nconn; i++) {
        pending_conn *c = &m->conns[i];
        if (c->client || c->fd < 0 || c->challenged)
            continue;
        if (oldest == NULL || c->since < oldest->since)
            oldest = c;
        if (hvd_net_same_address(c->name, name)) {
            own_n++;
            if (own == NULL || c->since < own->since)
                own = c;
        }
    }
    return own_n >= PER_SOURCE ? own : oldest;
}

/* A free entry for a connection from name just accepted, made by dropping
 * a stranger when the table is full (it has room for every expected
 * connection and 16 more); NULL when none can be dropped. */
static pending_conn *server_slot(mesh *m, const char *name, int64_t now) {
    for (int i = 0; i < m->nconn; i++)
        if (m->conns[i].fd == -1 && !m->conns[i].client)
            return &m->conns[i];
    if (m->nconn < m->maxconn)
        return &m->conns[m->nconn++];
    for (int tries = 0; tries < m->nconn; tries++) {
        pending_conn *v = victim(m, name);
        if (v == NULL)
            return NULL;
        /* Its HELLO may be waiting unread (a rank sends it as soon as it
         * is connected): read it before judging it silent. */
        if (step(m, v, now) != HVD_OK)
            return NULL; /* cannot happen for a server side before RESPONSE */
        if (v->fd == -1)
            return v;
        if (v->challenged)
            continue;
        HVD_WARN_LIMITED(&dropped_log, v->name, "tcp",
                         "dropped connection from %s: too many connections "
                         "that have not sent a hello, and it waited longest",
                         v->name);
        close(v->fd);
        v->fd = -1;
        return v;
    }
    return NULL;
}

/* Takes the new connections from higher ranks (or from strangers), each
 * to authenticate as a server, ACCEPT_BATCH at most. A rank's HELLO is
 * usually there already: answering it at once protects its connection
 * from being dropped for newcomers. */
static hvd_status accept_new(mesh *m, int64_t now) {
    hvd_status st = HVD_OK;

    for (int k = 0; k < ACCEPT_BATCH && st == HVD_OK; k++) {
        int fd = accept4(m->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        char name[HVD_ADDR_MAX + 8];
        if (fd < 0)
            break;
        hvd_net_peer_name(fd, name, sizeof(name));
        pending_conn *c = server_slot(m, name, now);
        if (c == NULL) {
            HVD_WARN_LIMITED(&dropped_log, name, "tcp",
                             "dropped connection from %s: too many "
                             "connections that have not authenticated",
                             name);
            close(fd);
            continue;
        }
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->peer = -1;
        c->since = now;
        c->deadline = now + HANDSHAKE_NS;
        snprintf(c->name, sizeof(c->name), "%s", name);
        hvd_hs_server_init(&c->hs, m->params->job_id, m->params->secret,
                           HVD_HS_KIND_DATA, m->tp->rank, admit, m->tp);
        hvd_hs_set_protect(&c->hs, m->tp->protect);
        st = step(m, c, now);
    }
    return st;
}

/* Closes c to try it again a little later. */
static void retry_later(pending_conn *c, int64_t now) {
    close(c->fd);
    c->fd = -1;
    c->retry_at = now + 50 * 1000000LL;
}

/* Client side: 1 once c's TCP connect has finished (0: not yet, or it
 * will be retried); a failure that ends the mesh in *st. */
static int client_connected(mesh *m, pending_conn *c, int64_t now,
                            hvd_status *st) {
    struct pollfd q = {.fd = c->fd, .events = POLLOUT};

    *st = HVD_OK;
    if (c->connected)
        return 1;
    if (poll(&q, 1, 0) <= 0)
        return 0;
    int err = hvd_net_connect_result(c->fd);
    if (err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT) {
        /* The peer's listener is up before the address exchange, so this
         * is rare (backlog overflow); retry a little later. */
        retry_later(c, now);
        return 0;
    }
    if (err != 0) {
        char who[160];
        hvd_tcp_describe(m->tp, c->peer, who, sizeof(who));
        *st = hvd_error_set(HVD_ERR_TRANSPORT, "connect(%s) to %s failed: %s",
                            c->name, who, strerror(err));
        return 0;
    }
    c->connected = 1;
    return 1;
}

/* c's handshake is done: its socket joins the mesh with the keys of this
 * connection, unless one of that rank and index already did. */
static hvd_status handshake_done(mesh *m, pending_conn *c) {
    tcp *tp = m->tp;
    int peer = c->client ? c->peer : c->hs.peer_rank;
    int index = c->client ? c->index : c->hs.peer_index;
    uint8_t c2s[HVD_PROTECT_KEY], s2c[HVD_PROTECT_KEY];
    hvd_status st = HVD_OK;

    if (tp->peers[peer].socks[index].fd >= 0) {
        HVD_WARN("tcp",
                 "dropped a second connection from %s claiming "
                 "rank %d socket %d",
                 c->name, peer, index);
        close(c->fd);
    } else {
        st = hvd_hs_keys(&c->hs, "hvd tcp frames v1", c2s, s2c);
        if (st == HVD_OK)
            st = hvd_tcp_install(tp, peer, index, c->fd, c->client ? c2s : s2c,
                                 c->client ? s2c : c2s);
        else
            close(c->fd);
        m->connected += st == HVD_OK;
        OPENSSL_cleanse(c2s, sizeof(c2s));
        OPENSSL_cleanse(s2c, sizeof(s2c));
    }
    c->fd = c->client ? -2 : -1;
    return st;
}

/* c's handshake failed with st: a client retries or fails the mesh; a
 * server side is refused and the mesh carries on. */
static hvd_status handshake_failed(mesh *m, pending_conn *c, int64_t now,
                                   hvd_status st) {
    /* Dropped before its CHALLENGE (PEER_LOST), or after one that
     * checked out: a server that proved it holds this job's secret shares
     * ours, so it cannot refuse our proof; a close then is a server that
     * dropped this connection for others (strangers filled its table).
     * The client queues its RESPONSE only once the CHALLENGE checked out.
     * Try again a little later, until the start timeout. */
    int proved = c->client && c->hs.out_len == HVD_HS_RESPONSE_LEN;
    if (c->client && now < c->deadline &&
        (st == HVD_ERR_PEER_LOST ||
         (proved && st != HVD_ERR_TIMEOUT && st != HVD_ERR_INTERNAL &&
          st != HVD_ERR_MISMATCH))) {
        HVD_DEBUG("tcp", "connecting to %s: %s; trying again", c->name,
                  c->hs.err);
        c->drops++;
        retry_later(c, now);
        return HVD_OK;
    }
    if (c->client || st == HVD_ERR_MISMATCH) {
        /* A client fails the mesh; so does a server whose authenticated
         * peer protects frames otherwise (HVD_TCP_PROTECT differs). */
        char who[160];
        int peer = c->client ? c->peer : c->hs.peer_rank;
        hvd_tcp_describe(m->tp, peer, who, sizeof(who));
        if (!c->client)
            return hvd_error_set(st, "%s at %s: %s", who, c->name, c->hs.err);
        return hvd_error_set(st, "connecting to %s at %s: %s", who, c->name,
                             c->hs.err[0] ? c->hs.err : hvd_error_get());
    }
    /* A stranger, a neighbour job or a wrong secret: refuse, log, and
     * carry on. */
    HVD_WARN_LIMITED(&refused_log, c->name, "tcp",
                     "refused connection from %s claiming rank %d: %s", c->name,
                     c->hs.peer_rank,
                     c->hs.err[0] ? c->hs.err : hvd_error_get());
    close(c->fd);
    c->fd = -1;
    return HVD_OK;
}

/* Moves connection c on as far as it goes now: (re)connecting, the TCP
 * connect, the handshake. */
static hvd_status step(mesh *m, pending_conn *c, int64_t now) {
    short want = 0;
    hvd_status st;

    if (c->client && c->fd == -1 && now >= c->retry_at) {
        st = client_start(m->tp, c, m->params);
        if (st != HVD_OK)
            return st;
    }
    if (c->fd < 0)
        return HVD_OK;
    if (c->client && !client_connected(m, c, now, &st))
        return st;
    st = hvd_hs_io(&c->hs, c->fd, &want);
    if (st == HVD_OK && want == 0)
        return handshake_done(m, c);
    /* Past its HELLO: it named this job and a rank we expect. */
    if (st == HVD_OK && !c->client &&
        hvd_hs_need(&c->hs) == HVD_HS_RESPONSE_LEN)
        c->challenged = 1;
    if (st == HVD_OK && now > c->deadline && !c->client)
        st = hvd_error_set(HVD_ERR_TIMEOUT, "handshake timed out");
    if (st == HVD_OK)
        return HVD_OK;
    return handshake_failed(m, c, now, st);
}

/* Closes what is left of the connections in progress (st: how the mesh
 * ended). */
static void drop_pending(mesh *m, hvd_status st) {
    for (int i = 0; m->conns != NULL && i < m->nconn; i++) {
        if (m->conns[i].fd < 0)
            continue;
        if (!m->conns[i].client && st == HVD_OK)
            HVD_WARN("tcp",
                     "dropped connection from %s: the mesh is complete and "
                     "it had not authenticated",
                     m->conns[i].name);
        close(m->conns[i].fd);
    }
}

/*
 * Builds the mesh: connects to every lower rank and accepts every higher
 * one, all at once in one poll loop, so no rank waits on another's setup.
 */
hvd_status hvd_tcp_connect_mesh(tcp *tp, const hvd_transport_params *params,
                                int lfd) {
    mesh m = {.tp = tp, .params = params, .lfd = lfd};
    hvd_status st = HVD_OK;

    m.nclients = tp->rank * tp->nconn;
    m.nexpect = (tp->size - 1 - tp->rank) * tp->nconn;
    m.maxconn = m.nclients + m.nexpect + 16;
    m.conns = calloc((size_t)m.maxconn, sizeof(*m.conns));
    m.pfds = calloc((size_t)m.maxconn + 1, sizeof(*m.pfds));
    m.deadline = hvd_now_ns() + params->connect_timeout_ns;
    if (m.conns == NULL || m.pfds == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory connecting");
        goto free_conns;
    }
    st = start_clients(&m);
    while (st == HVD_OK && m.connected < m.nclients + m.nexpect) {
        if (hvd_now_ns() > m.deadline) {
            st = timed_out(&m);
            break;
        }
        st = wait_any(&m);
        if (st != HVD_OK)
            break;
        int64_t now = hvd_now_ns();
        st = accept_new(&m, now);
        for (int i = 0; i < m.nconn && st == HVD_OK; i++)
            st = step(&m, &m.conns[i], now);
    }
free_conns:
    drop_pending(&m, st);
    free(m.conns);
    free(m.pfds);
    return st;
}
