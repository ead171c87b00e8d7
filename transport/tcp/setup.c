/*
 * The TCP transport's setup and teardown (see tcp_internal.h): probe, open
 * (where to listen, the address exchange, then the mesh of connect.c),
 * open over sockets already connected (tests), goodbye and close.
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
#include "transport/base/wire.h"

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
    tp->load.fd = -1;
    /* Set but empty: the default, as when unset. */
    st = hvd_protect_parse("HVD_TCP_PROTECT",
                           set->protect[0] != '\0' ? set->protect
                                                   : HVD_TCP_PROTECT_DEFAULT,
                           HVD_PROTECT_INTEGRITY, &tp->protect);
    if (st != HVD_OK) {
        free(tp);
        return st;
    }
    tp->tag_len = tp->protect == HVD_PROTECT_NONE ? 0 : HVD_PROTECT_TAG;
    tp->stripe_min = set->stripe_min;
    tp->timeout_ns = params->timeout_ns;
    tp->spin_ns = (int64_t)set->spin_us * 1000;
    /* As the engine decides its own spin (api/runtime/setup.c): ranks on
     * this host against its cores. */
    int local = 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 0; params->hosts != NULL && i < params->size; i++)
        local += strcmp(params->hosts[i], params->hosts[params->rank]) == 0;
    tp->spin_yield = ncpu > 0 && local > ncpu;
    hvd_hostload_open(&tp->load, NULL, 0);
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

/*
 * Keys for sockets connected without a handshake (hvd_tcp_open_connected,
 * for tests): from the secret and the pair's ranks and socket index only.
 * The higher rank plays the client, as in the mesh. Never used by a job.
 */
static hvd_status connected_keys(const hvd_transport_params *params, int peer,
                                 int index, uint8_t *tx, uint8_t *rx) {
    uint8_t info[32] = "hvd tcp connected v1";
    uint8_t keys[2 * HVD_PROTECT_KEY];
    int lo = peer < params->rank ? peer : params->rank;
    int hi = peer < params->rank ? params->rank : peer;
    hvd_status st;

    hvd_put32(info + 20, (uint32_t)lo);
    hvd_put32(info + 24, (uint32_t)hi);
    hvd_put32(info + 28, (uint32_t)index);
    st = hvd_protect_hkdf(params->secret != NULL ? params->secret : "",
                          (const uint8_t *)"", 0, info, sizeof(info), keys,
                          sizeof(keys));
    if (st != HVD_OK)
        return st;
    memcpy(params->rank == hi ? tx : rx, keys, HVD_PROTECT_KEY);
    memcpy(params->rank == hi ? rx : tx, keys + HVD_PROTECT_KEY,
           HVD_PROTECT_KEY);
    return HVD_OK;
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
            uint8_t tx[HVD_PROTECT_KEY], rx[HVD_PROTECT_KEY];
            st = connected_keys(params, p, k, tx, rx);
            if (st == HVD_OK)
                st = hvd_tcp_install(tp, p, k, fd, tx, rx);
            else
                close(fd);
            if (st != HVD_OK) {
                hvd_tcp_close(&tp->base);
                return st;
            }
        }
    }
    *out = &tp->base;
    return HVD_OK;
}

typedef struct listen_blob {
    char addr[HVD_ADDR_MAX];
    uint32_t port;
    uint32_t nsocks;
} listen_blob;

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

/* Opens the mesh: listens, tells every rank where through the
 * bootstrap, and connects (connect.c). */
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
    st = hvd_tcp_connect_mesh(tp, params, lfd);
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

void hvd_tcp_close(hvd_transport *t) {
    tcp *tp = (tcp *)t;

    if (tp == NULL)
        return;
    for (int i = 0; tp->socks != NULL && i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        if (s->fd >= 0)
            close(s->fd);
        hvd_aead_free(&s->tx_h);
        hvd_aead_free(&s->tx_b);
        hvd_aead_free(&s->rx_a);
        free(s->stage);
        free(s->sendq.v);
        free(s->recvq.v);
        free(s->rx);
    }
    if (tp->epfd >= 0)
        close(tp->epfd);
    if (tp->wakefd >= 0)
        close(tp->wakefd);
    hvd_hostload_close(&tp->load);
    free(tp->socks);
    free(tp->peers);
    free(tp->hosts);
    free(tp->pids);
    free(tp);
}

hvd_status hvd_tcp_shutdown(hvd_transport *t) {
    tcp *tp = (tcp *)t;
    int64_t deadline =
        hvd_now_ns() +
        (tp->timeout_ns < SHUTDOWN_NS ? tp->timeout_ns : SHUTDOWN_NS);
    int open_socks = 0;

    if (tp->failure.status != HVD_OK)
        return HVD_OK;
    tp->shutting_down = 1;
    for (int i = 0; i < tp->size * tp->nconn; i++) {
        tsock *s = &tp->socks[i];
        uint8_t hdr[HDR_MAX];
        hvd_frame f = {.type = HVD_FRAME_BYE};
        size_t off = 0, len;

        if (s->fd < 0)
            continue;
        /* Unsealed (0 bytes): no goodbye, the peer sees a lost rank. */
        len = hvd_tcp_seal_frame(s, &f, hdr);
        while (off < len && hvd_now_ns() < deadline) {
            ssize_t n =
                send(s->fd, hdr + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                off += (size_t)n;
            } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                struct pollfd pfd = {.fd = s->fd, .events = POLLOUT};
                poll(&pfd, 1, 100);
            } else {
                break; /* the peer is already gone */
            }
        }
        shutdown(s->fd, SHUT_WR);
        if (!s->eof)
            open_socks++;
    }
    /* Read until every peer has said goodbye too, so no unread byte makes
     * the kernel reset a connection whose last data is still in flight. */
    while (open_socks > 0 && hvd_now_ns() < deadline) {
        struct epoll_event evs[MAX_EVENTS];
        int n = epoll_wait(tp->epfd, evs, MAX_EVENTS, 100);
        for (int i = 0; i < n; i++) {
            tsock *s = evs[i].data.ptr;
            if (s == NULL || s->eof)
                continue;
            if (s->rx_blocked && !(evs[i].events & (EPOLLHUP | EPOLLERR))) {
                /* Readable, but only its end tells (as progress does). */
                s->rx_muted = 1;
                hvd_tcp_set_events(s);
                continue;
            }
            /* Data nobody asked for (its header already read): nothing
             * more of this socket is wanted. */
            if (s->rx_blocked)
                s->eof = 1;
            else
                hvd_tcp_sock_recv(s);
            if (s->eof || tp->failure.status != HVD_OK) {
                s->eof = 1;
                hvd_tcp_set_events(s);
                open_socks--;
            }
        }
        if (tp->failure.status != HVD_OK)
            break;
    }
    if (open_socks > 0)
        HVD_DEBUG("tcp", "%d sockets did not say goodbye in time", open_socks);
    return HVD_OK;
}
