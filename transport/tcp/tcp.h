/*
 * The TCP transport: a full mesh of HVD_TCP_NSOCKS non-blocking sockets per
 * pair of ranks, one epoll progress engine, TCP_NODELAY, an authenticated
 * handshake on every connection (transport/bootstrap/handshake.h) and framed
 * messages (transport/tcp/frame.h) streamed straight from and into the caller's
 * buffers. A message of at least HVD_TCP_STRIPE_MIN bytes is striped across all
 * sockets of the pair; a smaller one goes whole onto one socket, chosen
 * round-robin by message number.
 */
#ifndef HVD_TRANSPORT_TCP_TCP_H
#define HVD_TRANSPORT_TCP_TCP_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define HVD_TCP_MAX_SOCKS 16

/* The ops table: what the registry needs. */
extern const hvd_transport_ops hvd_tcp_ops;

/* The rest is for the unit tests and the fuzzer (tests/unit, tests/fuzz),
 * which drive the transport's parts directly; nothing in the library
 * outside transport/tcp/ uses it. */

/* The transport's settings (transport/tcp/settings.c, docs/environment.md),
 * read from params->env at open. */
typedef struct hvd_tcp_settings {
    int nsocks;        /* HVD_TCP_NSOCKS: sockets per pair */
    size_t stripe_min; /* HVD_TCP_STRIPE_MIN: striped from this size */
    int64_t setup_ns;  /* HVD_TCP_SETUP_SECONDS: the bound on setting up
                          the mesh while another transport can take over */
    char iface[64];    /* HVD_IFACE: the interface to listen on, "": auto */
    char protect[16];  /* HVD_TCP_PROTECT: none, integrity or encrypt */
    int spin_us;       /* HVD_TCP_SPIN_US: polling before epoll sleeps */
} hvd_tcp_settings;

#define HVD_TCP_NSETTINGS 6

/* HVD_TCP_PROTECT's value when unset (see docs/reliability.md for why). */
#define HVD_TCP_PROTECT_DEFAULT "integrity"
extern const hvd_setting hvd_tcp_settings_table[HVD_TCP_NSETTINGS];

/*
 * Builds a TCP transport over sockets that are already connected to the
 * peers (no listening, no handshake): fds[p * (nsocks + 1) + k] is the
 * k-th socket to rank p, the data sockets first, then the control one
 * (nsocks is HVD_TCP_NSOCKS as params->env says); the
 * entries of this rank's own row are ignored. The transport takes the
 * descriptors over (and makes them non-blocking). For tests and fuzzing,
 * which drive one end of a socketpair themselves; params->bootstrap,
 * launcher_addr, job_id and secret are not used.
 */
hvd_status hvd_tcp_open_connected(const hvd_transport_params *params,
                                  const int *fds, hvd_transport **out);

/*
 * How the msgno-th message of len bytes between a pair is laid out: it is
 * cut into *nparts_out parts (1 or nsocks) that go onto sockets
 * first_out, first_out + 1, ... (mod nsocks). Sender and receiver compute
 * the same layout from the same arguments.
 */
void hvd_tcp_layout(size_t len, int nsocks, size_t stripe_min, uint64_t msgno,
                    int *first_out, int *nparts_out);

/* Byte range of part i of nparts of a len-byte message: part boundaries
 * are multiples of 64 bytes, the last part takes the remainder. */
void hvd_tcp_part_range(size_t len, int nparts, int i, size_t *off_out,
                        size_t *len_out);

#endif
