#include "transport/bootstrap/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* Parses a numeric address into ss; returns its length or 0. */
static socklen_t parse_addr(const char *addr, int port,
                            struct sockaddr_storage *ss) {
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

    memset(ss, 0, sizeof(*ss));
    if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        return sizeof(*in4);
    }
    if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        return sizeof(*in6);
    }
    return 0;
}

void hvd_net_format(const struct sockaddr *sa, char *out, size_t outlen) {
    char ip[INET6_ADDRSTRLEN] = "?";

    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in4->sin_addr, ip, sizeof(ip));
        snprintf(out, outlen, "%s:%d", ip, ntohs(in4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
        snprintf(out, outlen, "[%s]:%d", ip, ntohs(in6->sin6_port));
    } else {
        snprintf(out, outlen, "(family %d)", sa->sa_family);
    }
}

void hvd_net_port_range(long *low, long *high) {
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    *low = 32768;
    *high = 60999;
    if (f == NULL)
        return;
    if (fscanf(f, "%ld %ld", low, high) != 2 || *low < 1 || *high > 65535 ||
        *low > *high) {
        *low = 32768;
        *high = 60999;
    }
    fclose(f);
}

static uint16_t *port_of(struct sockaddr_storage *ss) {
    return ss->ss_family == AF_INET ? &((struct sockaddr_in *)ss)->sin_port
                                    : &((struct sockaddr_in6 *)ss)->sin6_port;
}

static void reuse_addr(int fd);

/*
 * bind() to port 0 skips every port that still has connections in
 * TIME_WAIT (Linux takes them only with net.ipv4.ip_autobind_reuse), so
 * on a host that ran many short jobs a minute ago it can fail with
 * EADDRINUSE although no port is really busy. Then this takes such a port
 * itself: an explicit bind with SO_REUSEADDR may share a port with
 * connections in TIME_WAIT that were made with SO_REUSEADDR too (hvd sets
 * it on all its sockets), never with a listener or a live connection
 * (listen() refuses those that bind() let through). Tries the ports of
 * the ephemeral range from a random one on; a listening socket, or -1
 * with errno.
 */
static int listen_reusing(struct sockaddr_storage *ss, socklen_t len) {
    long low, high;

    hvd_net_port_range(&low, &high);
    long n = high - low + 1, start = (long)(hvd_now_ns() / 1000) % n;
    for (long i = 0; i < n; i++) {
        int fd = socket(ss->ss_family,
                        SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        reuse_addr(fd);
        *port_of(ss) = htons((uint16_t)(low + (start + i) % n));
        if (bind(fd, (struct sockaddr *)ss, len) == 0 &&
            listen(fd, SOMAXCONN) == 0) {
            HVD_DEBUG("net",
                      "every free ephemeral port has connections in "
                      "TIME_WAIT; listening on port %d",
                      ntohs(*port_of(ss)));
            return fd;
        }
        int err = errno;
        close(fd);
        if (err != EADDRINUSE) {
            errno = err;
            return -1;
        }
    }
    *port_of(ss) = 0;
    errno = EADDRINUSE;
    return -1;
}

/*
 * connect() found no local port (EADDRNOTAVAIL): it never takes a port
 * that was bound explicitly, such as a listener's whose connections are
 * all in TIME_WAIT now, nor one in TIME_WAIT towards this address. Binds
 * one of those itself as bind_reusing does and connects from it; a port
 * whose earlier connection to the same address is still in TIME_WAIT
 * fails the connect, and the next is tried (at most 4096). 0 with *fd_out
 * (connecting, non-blocking), else -1 with errno.
 */
static int connect_reusing(struct sockaddr_storage *dst, socklen_t len,
                           int *fd_out) {
    struct sockaddr_storage local;
    long low, high;

    hvd_net_port_range(&low, &high);
    long n = high - low + 1, start = (long)(hvd_now_ns() / 1000) % n;
    memset(&local, 0, sizeof(local));
    local.ss_family = dst->ss_family;
    for (long i = 0; i < n && i < 4096; i++) {
        int fd = socket(dst->ss_family,
                        SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        reuse_addr(fd);
        *port_of(&local) = htons((uint16_t)(low + (start + i) % n));
        if (bind(fd, (struct sockaddr *)&local, len) == 0 &&
            (connect(fd, (struct sockaddr *)dst, len) == 0 ||
             errno == EINPROGRESS)) {
            hvd_net_nodelay(fd);
            *fd_out = fd;
            return 0;
        }
        int err = errno;
        close(fd);
        if (err != EADDRINUSE && err != EADDRNOTAVAIL) {
            errno = err;
            return -1;
        }
    }
    errno = EADDRNOTAVAIL;
    return -1;
}

static void reuse_addr(int fd) {
    int one = 1;

    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
        HVD_DEBUG("net", "setsockopt(SO_REUSEADDR) failed: %s",
                  strerror(errno));
}

/* A socket and the address it is for. */
typedef struct endpoint {
    struct sockaddr_storage ss;
    socklen_t len;
    int fd;
} endpoint;

/* A non-blocking TCP socket for addr:port (a numeric address), with
 * SO_REUSEADDR. */
static hvd_status open_socket(const char *addr, int port, endpoint *e) {
    e->fd = -1;
    e->len = parse_addr(addr, port, &e->ss);
    if (e->len == 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "'%s' is not a numeric IPv4 or IPv6 address",
                             addr);
    e->fd =
        socket(e->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (e->fd < 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "socket() failed: %s",
                             strerror(errno));
    reuse_addr(e->fd);
    return HVD_OK;
}

hvd_status hvd_net_listen(const char *addr, int port, int *fd_out,
                          int *port_out) {
    endpoint e;
    hvd_status st = open_socket(addr, port, &e);
    struct sockaddr_storage *ss = &e.ss;
    int fd = e.fd;

    if (st != HVD_OK)
        return st;
    if (bind(fd, (struct sockaddr *)ss, e.len) != 0) {
        int err = errno;
        close(fd);
        fd = err == EADDRINUSE && port == 0 ? listen_reusing(ss, e.len) : -1;
        if (fd < 0)
            return hvd_error_set(
                HVD_ERR_TRANSPORT, "bind(%s:%d) failed: %s", addr, port,
                strerror(err == EADDRINUSE && port == 0 ? errno : err));
    } else if (listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        close(fd);
        return hvd_error_set(HVD_ERR_TRANSPORT, "listen(%s:%d) failed: %s",
                             addr, port, strerror(err));
    }
    e.len = sizeof(*ss);
    if (getsockname(fd, (struct sockaddr *)ss, &e.len) != 0) {
        int err = errno;
        close(fd);
        return hvd_error_set(HVD_ERR_TRANSPORT, "getsockname() failed: %s",
                             strerror(err));
    }
    *port_out = ntohs(ss->ss_family == AF_INET
                          ? ((struct sockaddr_in *)ss)->sin_port
                          : ((struct sockaddr_in6 *)ss)->sin6_port);
    /* Accepted connections inherit it (Linux): the rendezvous server's
     * answers then leave without waiting for an ACK of the one before. */
    hvd_net_nodelay(fd);
    *fd_out = fd;
    return HVD_OK;
}

hvd_status hvd_net_connect_start(const char *addr, int port, int *fd_out) {
    endpoint e;
    /* SO_REUSEADDR: its local port, in TIME_WAIT after the job, then does
     * not keep a later listener (which sets it too) off that port. */
    hvd_status st = open_socket(addr, port, &e);

    if (st != HVD_OK)
        return st;
    hvd_net_nodelay(e.fd);
    if (connect(e.fd, (struct sockaddr *)&e.ss, e.len) != 0 &&
        errno != EINPROGRESS) {
        int err = errno;
        close(e.fd);
        if (err == EADDRNOTAVAIL && connect_reusing(&e.ss, e.len, fd_out) == 0)
            return HVD_OK;
        st = hvd_error_set(
            err == ECONNREFUSED ? HVD_ERR_PEER_LOST : HVD_ERR_TRANSPORT,
            "connect(%s:%d) failed: %s", addr, port, strerror(err));
        errno = err;
        return st;
    }
    *fd_out = e.fd;
    return HVD_OK;
}

int hvd_net_connect_result(int fd) {
    int err = 0;
    socklen_t len = sizeof(err);

    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

hvd_status hvd_net_local_addr(int fd, char *out, size_t outlen) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    const void *src;

    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "getsockname() failed: %s",
                             strerror(errno));
    src = ss.ss_family == AF_INET
              ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
              : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
    if (inet_ntop(ss.ss_family, src, out, (socklen_t)outlen) == NULL)
        return hvd_error_set(HVD_ERR_TRANSPORT, "inet_ntop() failed: %s",
                             strerror(errno));
    return HVD_OK;
}

int hvd_net_same_address(const char *a, const char *b) {
    const char *ca = strrchr(a, ':');
    const char *cb = strrchr(b, ':');
    size_t na = ca != NULL ? (size_t)(ca - a) : strlen(a);
    size_t nb = cb != NULL ? (size_t)(cb - b) : strlen(b);

    return na == nb && memcmp(a, b, na) == 0;
}

void hvd_net_peer_name(int fd, char *out, size_t outlen) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        snprintf(out, outlen, "(unknown address)");
    else
        hvd_net_format((struct sockaddr *)&ss, out, outlen);
}

hvd_status hvd_net_iface_addr(const char *ifname, char *out, size_t outlen) {
    struct ifaddrs *list = NULL;
    int found = 0;

    if (getifaddrs(&list) != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "getifaddrs() failed: %s",
                             strerror(errno));
    for (int family = AF_INET; !found; family = AF_INET6) {
        for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
            if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != family ||
                strcmp(ifa->ifa_name, ifname) != 0)
                continue;
            const void *src =
                family == AF_INET
                    ? (const void *)&((struct sockaddr_in *)ifa->ifa_addr)
                          ->sin_addr
                    : (const void *)&((struct sockaddr_in6 *)ifa->ifa_addr)
                          ->sin6_addr;
            if (inet_ntop(family, src, out, (socklen_t)outlen) != NULL) {
                found = 1;
                break;
            }
        }
        if (family == AF_INET6)
            break;
    }
    freeifaddrs(list);
    if (!found)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "HVD_IFACE=%s: no such network interface with "
                             "an IP address (see `ip addr`)",
                             ifname);
    return HVD_OK;
}

hvd_status hvd_net_host_addr(char *out, size_t outlen) {
    struct ifaddrs *list = NULL;

    snprintf(out, outlen, "127.0.0.1");
    if (getifaddrs(&list) != 0)
        return HVD_OK;
    for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET ||
            !(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK))
            continue;
        const struct sockaddr_in *in4 =
            (const struct sockaddr_in *)(const void *)ifa->ifa_addr;
        if (inet_ntop(AF_INET, &in4->sin_addr, out, (socklen_t)outlen))
            break;
    }
    freeifaddrs(list);
    return HVD_OK;
}

void hvd_net_nodelay(int fd) {
    int one = 1;

    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        HVD_DEBUG("net", "setsockopt(TCP_NODELAY) failed: %s", strerror(errno));
}
