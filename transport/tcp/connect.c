/*
 * The TCP transport's connection setup (see tcp_internal.h).
 */
#include "transport/tcp/tcp_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/bootstrap/handshake.h"
#include "transport/bootstrap/net.h"

/* ------------------------------------------------------------------ */
/* Connection setup                                                    */

/* Partial-write bookkeeping for the listen/handshake phase. */
typedef struct pending_conn {
    int fd;
    int peer; /* client side: the rank we connect to; server: -1 */
    int index;
    int client;
    int64_t deadline;
    int64_t retry_at; /* client: reconnect after a refusal at this time */
    int connected;    /* client: TCP connect finished */
    char name[HVD_ADDR_MAX + 8];
    hvd_hs hs;
} pending_conn;

typedef struct listen_blob {
    char addr[HVD_ADDR_MAX];
    uint32_t port;
    uint32_t nsocks;
} listen_blob;

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
    return hvd_hs_client_init(&c->hs, params->job_id, params->secret,
                              HVD_HS_KIND_DATA, tp->rank, c->index, c->peer);
}

static void install(tcp *tp, int peer, int index, int fd) {
    tsock *s = &tp->peers[peer].socks[index];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = s};

    s->fd = fd;
    hvd_net_nodelay(fd);
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
        s->events = ev.events;
        s->registered = 1;
    }
}

/*
 * Builds the mesh: connects to every lower rank and accepts every higher
 * one, all at once in one poll loop, so no rank waits on another's setup.
 */
static hvd_status connect_mesh(tcp *tp, const hvd_transport_params *params,
                               int lfd) {
    int nclients = tp->rank * tp->nconn;
    int nexpect = (tp->size - 1 - tp->rank) * tp->nconn;
    int maxconn = nclients + nexpect + 16;
    pending_conn *conns = calloc((size_t)maxconn, sizeof(*conns));
    struct pollfd *pfds = calloc((size_t)maxconn + 1, sizeof(*pfds));
    int nconn = 0, connected = 0;
    int64_t deadline = hvd_now_ns() + params->connect_timeout_ns;
    hvd_status st = HVD_OK;

    if (conns == NULL || pfds == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory connecting");
        goto out;
    }
    for (int p = 0; p < tp->rank; p++) {
        for (int k = 0; k < tp->nconn; k++) {
            pending_conn *c = &conns[nconn++];
            c->peer = p;
            c->index = k;
            c->client = 1;
            c->deadline = deadline;
            snprintf(c->name, sizeof(c->name), "%s:%d", tp->peers[p].addr,
                     tp->peers[p].port);
            st = client_start(tp, c, params);
            if (st != HVD_OK)
                goto out;
        }
    }

    while (connected < nclients + nexpect) {
        int64_t now = hvd_now_ns();
        int npfd = 0;

        if (now > deadline) {
            for (int i = 0; i < nconn; i++) {
                if (conns[i].client && conns[i].fd != -2) {
                    char who[160];
                    hvd_tcp_describe(tp, conns[i].peer, who, sizeof(who));
                    st = hvd_error_set(HVD_ERR_TIMEOUT,
                                       "could not connect to %s at %s "
                                       "within the start timeout",
                                       who, conns[i].name);
                    goto out;
                }
            }
            st = hvd_error_set(HVD_ERR_TIMEOUT,
                               "rank %d: %d of %d higher ranks' connections "
                               "did not arrive within the start timeout",
                               tp->rank, nclients + nexpect - connected,
                               nexpect);
            goto out;
        }
        pfds[npfd++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < nconn; i++) {
            pending_conn *c = &conns[i];
            short ev = POLLIN;
            if (c->fd < 0)
                continue;
            if (c->client && !c->connected)
                ev = POLLOUT;
            else if (c->hs.out_off < c->hs.out_len)
                ev = POLLOUT;
            pfds[npfd++] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        int r = poll(pfds, (nfds_t)npfd, 100);
        if (r < 0 && errno != EINTR) {
            st = hvd_error_set(HVD_ERR_TRANSPORT, "poll() failed: %s",
                               strerror(errno));
            goto out;
        }
        now = hvd_now_ns();

        /* New connections from higher ranks (or from strangers). */
        for (;;) {
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0)
                break;
            pending_conn *c = NULL;
            for (int i = 0; i < nconn; i++)
                if (conns[i].fd == -1 && !conns[i].client)
                    c = &conns[i];
            if (c == NULL && nconn < maxconn)
                c = &conns[nconn++];
            if (c == NULL) {
                /* Full of strangers (the table has room for every
                 * expected connection and 16 more): drop the one that has
                 * waited longest, so that strangers that connect and stay
                 * silent cannot keep a rank out. */
                for (int i = 0; i < nconn; i++)
                    if (!conns[i].client && conns[i].fd >= 0 &&
                        (c == NULL || conns[i].deadline < c->deadline))
                        c = &conns[i];
                if (c == NULL) {
                    char name[HVD_ADDR_MAX];
                    hvd_net_peer_name(fd, name, sizeof(name));
                    HVD_WARN("tcp",
                             "dropped connection from %s: too many "
                             "unauthenticated connections",
                             name);
                    close(fd);
                    continue;
                }
                HVD_WARN("tcp",
                         "dropped connection from %s: too many connections "
                         "that have not authenticated, and it waited "
                         "longest",
                         c->name);
                close(c->fd);
            }
            memset(c, 0, sizeof(*c));
            c->fd = fd;
            c->peer = -1;
            c->deadline = now + HANDSHAKE_NS;
            hvd_net_peer_name(fd, c->name, sizeof(c->name));
            hvd_hs_server_init(&c->hs, params->job_id, params->secret,
                               HVD_HS_KIND_DATA, tp->rank, admit, tp);
        }

        for (int i = 0; i < nconn; i++) {
            pending_conn *c = &conns[i];
            short want = 0;

            if (c->client && c->fd == -1 && now >= c->retry_at) {
                st = client_start(tp, c, params);
                if (st != HVD_OK)
                    goto out;
            }
            if (c->fd < 0)
                continue;
            if (c->client && !c->connected) {
                struct pollfd q = {.fd = c->fd, .events = POLLOUT};
                if (poll(&q, 1, 0) <= 0)
                    continue;
                int err = hvd_net_connect_result(c->fd);
                if (err == ECONNREFUSED || err == ECONNRESET ||
                    err == ETIMEDOUT) {
                    /* The peer's listener is up before the address
                     * exchange, so this is rare (backlog overflow); retry
                     * a little later. */
                    close(c->fd);
                    c->fd = -1;
                    c->retry_at = now + 50 * 1000000LL;
                    continue;
                }
                if (err != 0) {
                    char who[160];
                    hvd_tcp_describe(tp, c->peer, who, sizeof(who));
                    st = hvd_error_set(HVD_ERR_TRANSPORT,
                                       "connect(%s) to %s failed: %s", c->name,
                                       who, strerror(err));
                    goto out;
                }
                c->connected = 1;
            }
            st = hvd_hs_io(&c->hs, c->fd, &want);
            if (st == HVD_OK && want == 0) {
                int peer = c->client ? c->peer : c->hs.peer_rank;
                int index = c->client ? c->index : c->hs.peer_index;
                if (tp->peers[peer].socks[index].fd >= 0) {
                    HVD_WARN("tcp",
                             "dropped a second connection from %s claiming "
                             "rank %d socket %d",
                             c->name, peer, index);
                    close(c->fd);
                } else {
                    install(tp, peer, index, c->fd);
                    connected++;
                }
                c->fd = c->client ? -2 : -1;
                continue;
            }
            if (st == HVD_OK && now > c->deadline && !c->client)
                st = hvd_error_set(HVD_ERR_TIMEOUT, "handshake timed out");
            if (st == HVD_OK)
                continue;
            if (c->client && st == HVD_ERR_PEER_LOST && now < c->deadline) {
                /* Dropped unanswered: the peer had too many strangers at
                 * once. Try again a little later. */
                HVD_DEBUG("tcp", "connecting to %s: %s; trying again", c->name,
                          c->hs.err);
                close(c->fd);
                c->fd = -1;
                c->retry_at = now + 50 * 1000000LL;
                st = HVD_OK;
                continue;
            }
            if (c->client) {
                char who[160];
                hvd_tcp_describe(tp, c->peer, who, sizeof(who));
                st = hvd_error_set(st, "connecting to %s at %s: %s", who,
                                   c->name,
                                   c->hs.err[0] ? c->hs.err : hvd_error_get());
                goto out;
            }
            /* A stranger, a neighbour job or a wrong secret: refuse, log,
             * and carry on. */
            HVD_WARN("tcp", "refused connection from %s claiming rank %d: %s",
                     c->name, c->hs.peer_rank,
                     c->hs.err[0] ? c->hs.err : hvd_error_get());
            close(c->fd);
            c->fd = -1;
            st = HVD_OK;
        }
    }
out:
    for (int i = 0; conns != NULL && i < nconn; i++) {
        if (conns[i].fd < 0)
            continue;
        if (!conns[i].client && st == HVD_OK)
            HVD_WARN("tcp",
                     "dropped connection from %s: the mesh is complete and "
                     "it had not authenticated",
                     conns[i].name);
        close(conns[i].fd);
    }
    free(conns);
    free(pfds);
    return st;
}

void hvd_tcp_close(hvd_transport *t) {
    tcp *tp = (tcp *)t;

    if (tp == NULL)
        return;
    for (int i = 0; tp->socks != NULL && i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        if (s->fd >= 0)
            close(s->fd);
        free(s->sendq.v);
        free(s->recvq.v);
        free(s->rx);
    }
    if (tp->epfd >= 0)
        close(tp->epfd);
    if (tp->wakefd >= 0)
        close(tp->wakefd);
    free(tp->socks);
    free(tp->peers);
    free(tp->hosts);
    free(tp->pids);
    free(tp);
}

hvd_status hvd_tcp_probe(const hvd_transport_params *params, hvd_caps *caps) {
    (void)params;
    memset(caps, 0, sizeof(*caps));
    caps->usable = 1;
    /* Between any ranks; after RDMA and shared memory where they serve. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 10;
    return HVD_OK;
}

/* A transport with its peers, sockets and epoll set, not connected yet. */
static hvd_status tcp_new(const hvd_transport_params *params,
                          const hvd_tcp_settings *set, tcp **out) {
    tcp *tp = calloc(1, sizeof(*tp));
    hvd_status st;

    if (tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->base.ops = &hvd_tcp_ops;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->nsocks = set->nsocks;
    tp->nconn = tp->nsocks + 1;
    tp->wakefd = -1;
    tp->stripe_min = set->stripe_min;
    tp->timeout_ns = params->timeout_ns;
    /* Four heartbeats per timeout, at most one a second. */
    tp->heartbeat_ns =
        tp->timeout_ns / 4 < HEARTBEAT_NS ? tp->timeout_ns / 4 : HEARTBEAT_NS;
    tp->epfd = -1;
    tp->peers = calloc((size_t)tp->size, sizeof(*tp->peers));
    tp->socks =
        calloc((size_t)tp->size * (size_t)tp->nconn, sizeof(*tp->socks));
    hvd_tp_copy_names(params->hosts, params->pids, tp->size, &tp->hosts,
                      &tp->pids);
    if (tp->peers == NULL || tp->socks == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int p = 0; p < tp->size; p++) {
        tp->peers[p].socks = &tp->socks[(size_t)p * (size_t)tp->nconn];
        for (int k = 0; k < tp->nconn; k++) {
            tsock *s = &tp->peers[p].socks[k];
            s->tp = tp;
            s->fd = -1;
            s->peer = p;
            s->index = k;
            if (p != tp->rank && (s->rx = malloc(RX_CAP)) == NULL) {
                st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
                goto fail;
            }
        }
    }
    tp->epfd = epoll_create1(EPOLL_CLOEXEC);
    tp->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->epfd < 0 || tp->wakefd < 0) {
        st = hvd_error_set(HVD_ERR_TRANSPORT,
                           "epoll_create1/eventfd failed: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event wev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wakefd, &wev) != 0) {
        st = hvd_error_set(HVD_ERR_TRANSPORT, "epoll_ctl(eventfd) failed: %s",
                           strerror(errno));
        goto fail;
    }
    *out = tp;
    return HVD_OK;
fail:
    hvd_tcp_close(&tp->base);
    return st;
}

hvd_status hvd_tcp_open_connected(const hvd_transport_params *params,
                                  const int *fds, hvd_transport **out) {
    hvd_tcp_settings set;
    tcp *tp = NULL;
    hvd_status st = hvd_transport_read_settings(&hvd_tcp_ops, params, &set);

    if (st == HVD_OK)
        st = tcp_new(params, &set, &tp);
    if (st != HVD_OK)
        return st;
    for (int p = 0; p < tp->size; p++) {
        for (int k = 0; k < tp->nconn && p != tp->rank; k++) {
            int fd = fds[p * tp->nconn + k];
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
                st = hvd_error_set(HVD_ERR_TRANSPORT,
                                   "fcntl(O_NONBLOCK) of socket %d of rank "
                                   "%d failed: %s",
                                   k, p, strerror(errno));
                hvd_tcp_close(&tp->base);
                return st;
            }
            install(tp, p, k, fd);
        }
    }
    *out = &tp->base;
    return HVD_OK;
}

/*
 * Where this rank listens: HVD_IFACE's address when set; else where the
 * launcher reached it; else loopback when every rank is on this host; else
 * this host's first routable address.
 */
static hvd_status bind_addr(const hvd_transport_params *params,
                            const hvd_tcp_settings *set, char *out,
                            size_t outlen) {
    int one_host = 1;

    if (set->iface[0] != '\0')
        return hvd_net_iface_addr(set->iface, out, outlen);
    if (params->launcher_addr != NULL && params->launcher_addr[0] != '\0') {
        snprintf(out, outlen, "%s", params->launcher_addr);
        return HVD_OK;
    }
    for (int i = 0; params->hosts != NULL && i < params->size; i++)
        one_host &= strcmp(params->hosts[i], params->hosts[0]) == 0;
    if (one_host) {
        snprintf(out, outlen, "127.0.0.1");
        return HVD_OK;
    }
    return hvd_net_host_addr(out, outlen);
}

/* Reads the settings, and opens the mesh under the bound they set. */
static hvd_status tcp_open_mesh(const hvd_transport_params *params,
                                const hvd_tcp_settings *set,
                                hvd_transport **out);

hvd_status hvd_tcp_open(const hvd_transport_params *params,
                        hvd_transport **out) {
    hvd_tcp_settings set;
    hvd_transport_params p = *params;
    hvd_status st = hvd_transport_read_settings(&hvd_tcp_ops, params, &set);
    int bounded = params->may_fall_back && set.setup_ns < p.connect_timeout_ns;

    if (st != HVD_OK)
        return st;
    /* Another transport can take over: do not keep every rank waiting the
     * whole start timeout for a mesh that cannot form. */
    if (bounded)
        p.connect_timeout_ns = set.setup_ns;
    st = tcp_open_mesh(&p, &set, out);
    if (st != HVD_OK && bounded) {
        char why[HVD_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", hvd_error_get());
        st = hvd_error_set(st, "%s; the limit is HVD_TCP_SETUP_SECONDS=%lld",
                           why, (long long)(set.setup_ns / 1000000000LL));
    }
    return st;
}

static hvd_status tcp_open_mesh(const hvd_transport_params *params,
                                const hvd_tcp_settings *set,
                                hvd_transport **out) {
    listen_blob mine, *all = NULL;
    char addr[HVD_ADDR_MAX];
    int lfd = -1, port = 0;
    tcp *tp = NULL;
    hvd_status st = bind_addr(params, set, addr, sizeof(addr));

    if (st == HVD_OK)
        st = tcp_new(params, set, &tp);
    if (st != HVD_OK)
        return st;
    st = hvd_net_listen(addr, 0, &lfd, &port);
    if (st != HVD_OK)
        goto fail;
    HVD_DEBUG("tcp", "listening on %s port %d", addr, port);
    memset(&mine, 0, sizeof(mine));
    snprintf(mine.addr, sizeof(mine.addr), "%s", addr);
    mine.port = (uint32_t)port;
    mine.nsocks = (uint32_t)tp->nsocks;
    all = calloc((size_t)tp->size, sizeof(*all));
    if (all == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    st = params->bootstrap->allgather(params->bootstrap, &mine, sizeof(mine),
                                      all);
    if (st != HVD_OK)
        goto fail;
    for (int p = 0; p < tp->size; p++) {
        if (all[p].nsocks != (uint32_t)tp->nsocks) {
            st = hvd_error_set(HVD_ERR_MISMATCH,
                               "rank %d uses %u sockets per peer and rank %d "
                               "uses %d: set HVD_TCP_NSOCKS the same on every "
                               "rank",
                               p, all[p].nsocks, tp->rank, tp->nsocks);
            goto fail;
        }
        all[p].addr[HVD_ADDR_MAX - 1] = '\0';
        memcpy(tp->peers[p].addr, all[p].addr, HVD_ADDR_MAX);
        tp->peers[p].port = (int)all[p].port;
    }
    st = connect_mesh(tp, params, lfd);
    if (st != HVD_OK)
        goto fail;
    close(lfd);
    free(all);
    HVD_DEBUG("tcp", "connected to %d peers with %d sockets each", tp->size - 1,
              tp->nsocks);
    *out = &tp->base;
    return HVD_OK;
fail:
    if (lfd >= 0)
        close(lfd);
    free(all);
    hvd_tcp_close(&tp->base);
    return st;
}
