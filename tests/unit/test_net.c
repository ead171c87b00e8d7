/*
 * The socket helpers (transport/bootstrap/net.c) on loopback: listening on an
 * ephemeral port and connecting to it (non-blocking, then the connect's
 * result), the addresses of both ends, TCP_NODELAY on both ends, a
 * refused connect, a malformed address refused with a sentence, address
 * formatting (IPv4, IPv6, other families), the address of an interface
 * (lo) or a sentence naming a missing one, and this host's address.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/error.h"
#include "transport/bootstrap/net.h"

/* Waits (bounded: 10 s) until fd is writable: the connect has an answer. */
static void writable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};

    assert_int_equal(poll(&p, 1, 10000), 1);
}

static void listen_and_connect(void **state) {
    int lfd = -1, port = 0, cfd = -1, afd;
    char addr[HVD_ADDR_MAX], name[HVD_ADDR_MAX + 8], want[HVD_ADDR_MAX + 8];

    (void)state;
    assert_int_equal(hvd_net_listen("127.0.0.1", 0, &lfd, &port), HVD_OK);
    assert_true(lfd >= 0);
    assert_true(port > 0 && port < 65536);
    assert_int_equal(hvd_net_local_addr(lfd, addr, sizeof(addr)), HVD_OK);
    assert_string_equal(addr, "127.0.0.1");
    assert_int_equal(hvd_net_connect_start("127.0.0.1", port, &cfd), HVD_OK);
    writable(cfd);
    assert_int_equal(hvd_net_connect_result(cfd), 0);
    /* The listener is non-blocking: poll for the connection. */
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 10000), 1);
    afd = accept(lfd, NULL, NULL);
    assert_true(afd >= 0);
    /* The accepted end's peer is the connecting end, and the other way. */
    hvd_net_peer_name(cfd, name, sizeof(name));
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    assert_string_equal(name, want);
    hvd_net_peer_name(afd, name, sizeof(name));
    assert_memory_equal(name, "127.0.0.1:", 10);
    /* Both ends send without waiting for ACKs (Nagle off): the connecting
     * socket sets it, the accepted one inherits it from the listener. */
    int on = 0;
    socklen_t len = sizeof(on);
    assert_int_equal(getsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &on, &len), 0);
    assert_int_equal(on, 1);
    assert_int_equal(getsockopt(afd, IPPROTO_TCP, TCP_NODELAY, &on, &len), 0);
    assert_int_equal(on, 1);
    hvd_net_nodelay(cfd);
    /* Bytes cross. */
    assert_int_equal(write(cfd, "ping", 4), 4);
    char buf[4];
    assert_int_equal(read(afd, buf, 4), 4);
    assert_memory_equal(buf, "ping", 4);
    close(afd);
    close(cfd);
    close(lfd);
}

/* A port nobody listens on any more: the connect's result says so. */
static void refused(void **state) {
    int lfd = -1, port = 0, cfd = -1;

    (void)state;
    assert_int_equal(hvd_net_listen("127.0.0.1", 0, &lfd, &port), HVD_OK);
    close(lfd);
    assert_int_equal(hvd_net_connect_start("127.0.0.1", port, &cfd), HVD_OK);
    writable(cfd);
    assert_int_equal(hvd_net_connect_result(cfd), ECONNREFUSED);
    close(cfd);
}

static void bad_addresses(void **state) {
    int fd = -1, port = 0;
    char name[HVD_ADDR_MAX + 8];

    (void)state;
    assert_int_not_equal(hvd_net_listen("not-an-address", 0, &fd, &port),
                         HVD_OK);
    assert_non_null(strstr(hvd_error_get(), "not-an-address"));
    assert_int_equal(fd, -1);
    assert_int_not_equal(hvd_net_connect_start("300.1.1.1", 80, &fd), HVD_OK);
    assert_int_equal(fd, -1);
    /* A socket that is not connected has no peer. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    hvd_net_peer_name(s, name, sizeof(name));
    assert_string_equal(name, "(unknown address)");
    close(s);
}

static void formats(void **state) {
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr other;
    char out[HVD_ADDR_MAX + 8];

    (void)state;
    memset(&in4, 0, sizeof(in4));
    in4.sin_family = AF_INET;
    in4.sin_port = htons(8080);
    inet_pton(AF_INET, "10.1.2.3", &in4.sin_addr);
    hvd_net_format((struct sockaddr *)&in4, out, sizeof(out));
    assert_string_equal(out, "10.1.2.3:8080");
    memset(&in6, 0, sizeof(in6));
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(443);
    inet_pton(AF_INET6, "fe80::1", &in6.sin6_addr);
    hvd_net_format((struct sockaddr *)&in6, out, sizeof(out));
    assert_string_equal(out, "[fe80::1]:443");
    memset(&other, 0, sizeof(other));
    other.sa_family = AF_UNIX;
    hvd_net_format(&other, out, sizeof(out));
    assert_string_equal(out, "(family 1)");
}

static void interfaces(void **state) {
    char out[HVD_ADDR_MAX];

    (void)state;
    assert_int_equal(hvd_net_iface_addr("lo", out, sizeof(out)), HVD_OK);
    assert_string_equal(out, "127.0.0.1");
    assert_int_equal(hvd_net_iface_addr("no-such-if0", out, sizeof(out)),
                     HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_IFACE=no-such-if0"));
    /* This host's address: a numeric one, 127.0.0.1 at worst. */
    assert_int_equal(hvd_net_host_addr(out, sizeof(out)), HVD_OK);
    struct in_addr a;
    assert_int_equal(inet_pton(AF_INET, out, &a), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(listen_and_connect), cmocka_unit_test(refused),
        cmocka_unit_test(bad_addresses),      cmocka_unit_test(formats),
        cmocka_unit_test(interfaces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
