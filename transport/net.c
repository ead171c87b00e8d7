#include "transport/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

hvd_status hvd_net_listen(const char *addr, int port, int *fd_out,
                          int *port_out) {
    struct sockaddr_storage ss;
    socklen_t len = parse_addr(addr, port, &ss);
    int fd;

    if (len == 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "'%s' is not a numeric IPv4 or IPv6 address",
                             addr);
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "socket() failed: %s",
                             strerror(errno));
    if (port != 0) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (bind(fd, (struct sockaddr *)&ss, len) != 0) {
        int err = errno;
        close(fd);
        return hvd_error_set(HVD_ERR_TRANSPORT, "bind(%s:%d) failed: %s", addr,
                             port, strerror(err));
    }
    if (listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        close(fd);
        return hvd_error_set(HVD_ERR_TRANSPORT, "listen(%s:%d) failed: %s",
                             addr, port, strerror(err));
    }
    len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        int err = errno;
        close(fd);
        return hvd_error_set(HVD_ERR_TRANSPORT, "getsockname() failed: %s",
                             strerror(err));
    }
    *port_out = ntohs(ss.ss_family == AF_INET
                          ? ((struct sockaddr_in *)&ss)->sin_port
                          : ((struct sockaddr_in6 *)&ss)->sin6_port);
    *fd_out = fd;
    return HVD_OK;
}

hvd_status hvd_net_connect_start(const char *addr, int port, int *fd_out) {
    struct sockaddr_storage ss;
    socklen_t len = parse_addr(addr, port, &ss);
    int fd;

    if (len == 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "'%s' is not a numeric IPv4 or IPv6 address",
                             addr);
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "socket() failed: %s",
                             strerror(errno));
    hvd_net_nodelay(fd);
    if (connect(fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return hvd_error_set(
            err == ECONNREFUSED ? HVD_ERR_PEER_LOST : HVD_ERR_TRANSPORT,
            "connect(%s:%d) failed: %s", addr, port, strerror(err));
    }
    *fd_out = fd;
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
