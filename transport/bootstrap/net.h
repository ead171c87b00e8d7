/*
 * Socket helpers shared by the rendezvous and the TCP transport. Addresses
 * are numeric IPv4 or IPv6 strings; nothing here resolves names.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_NET_H
#define HVD_TRANSPORT_BOOTSTRAP_NET_H

#include <stddef.h>
#include <sys/socket.h>

#include "hvd/types.h"

#define HVD_ADDR_MAX 64 /* fits an IPv6 address and a port */

/*
 * Opens a non-blocking, close-on-exec listening socket on addr:port
 * (port 0: ephemeral). *port_out gets the port bound.
 */
hvd_status hvd_net_listen(const char *addr, int port, int *fd_out,
                          int *port_out);

/* Starts a non-blocking connect to addr:port. *fd_out is set on success,
 * even if the connection is still in progress (EINPROGRESS); on a failure
 * of connect() errno tells why (EADDRNOTAVAIL: no free local port). */
hvd_status hvd_net_connect_start(const char *addr, int port, int *fd_out);

/* Checks a non-blocking connect that became writable: 0 if connected, else
 * the errno value it failed with. */
int hvd_net_connect_result(int fd);

/* The ephemeral port range of this host, [*low, *high]. */
void hvd_net_port_range(long *low, long *high);

/* Formats a socket address as "ip:port" (IPv6 as "[ip]:port"). */
void hvd_net_format(const struct sockaddr *sa, char *out, size_t outlen);

/* The numeric address (no port) of the local or remote end of fd. */
hvd_status hvd_net_local_addr(int fd, char *out, size_t outlen);
void hvd_net_peer_name(int fd, char *out, size_t outlen);

/* Whether two peer names of hvd_net_peer_name ("ip:port") are of the same
 * address. */
int hvd_net_same_address(const char *a, const char *b);

/* The first IPv4 address of network interface ifname (else IPv6). */
hvd_status hvd_net_iface_addr(const char *ifname, char *out, size_t outlen);

/* A numeric address of this host that other hosts can reach: the first
 * IPv4 address of an interface that is up and not loopback, else
 * 127.0.0.1. */
hvd_status hvd_net_host_addr(char *out, size_t outlen);

/* Sets TCP_NODELAY. */
void hvd_net_nodelay(int fd);

#endif
