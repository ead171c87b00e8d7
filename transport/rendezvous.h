/*
 * The rendezvous: how the ranks of a job find each other at hvd_init.
 *
 * hvdrun runs the server on an ephemeral port of the chosen interface
 * (loopback by default). Each rank connects, proves it holds the job secret
 * (transport/handshake.h), and then takes part in rounds of "allgather":
 * every rank sends one blob per round, and once all ranks have sent theirs
 * the server sends each the concatenation in rank order. The rounds carry
 * host names and transport addresses (TCP listen ports, later RDMA queue
 * pair numbers). Messages are protobuf-c (transport/rendezvous.proto).
 *
 * The server is non-blocking: hvdrun polls hvd_rdv_server_fd() with its
 * other descriptors and calls hvd_rdv_server_progress() when it is readable.
 * A connection without the secret, or one that stalls, is dropped and
 * logged without disturbing the job.
 */
#ifndef HVD_TRANSPORT_RENDEZVOUS_H
#define HVD_TRANSPORT_RENDEZVOUS_H

#include <stdint.h>

#include "hvd/hvd.h"
#include "transport/transport.h"

/* Largest blob one rank may send in one round. */
#define HVD_RDV_MAX_BLOB (64 * 1024)

typedef struct hvd_rdv_server hvd_rdv_server;

/*
 * Listens on bind_addr (numeric IPv4 or IPv6) and port (0: ephemeral) for
 * a job of size ranks. secret and job_id are copied.
 */
hvd_status hvd_rdv_server_create(const char *bind_addr, int port, int size,
                                 const uint8_t job_id[HVD_JOB_ID_LEN],
                                 const char *secret, hvd_rdv_server **out);

/* The port the server listens on. */
int hvd_rdv_server_port(const hvd_rdv_server *srv);

/* A descriptor that becomes readable when the server has work; hvdrun puts
 * it into its poll set. */
int hvd_rdv_server_fd(const hvd_rdv_server *srv);

/* Handles whatever is ready, waiting up to timeout_ms (0: not at all).
 * Errors of single connections are logged, not returned. */
hvd_status hvd_rdv_server_progress(hvd_rdv_server *srv, int timeout_ms);

/* Number of ranks that have authenticated so far. */
int hvd_rdv_server_joined(const hvd_rdv_server *srv);

/* Closes every connection; accepts NULL. */
void hvd_rdv_server_destroy(hvd_rdv_server *srv);

/*
 * Client side, used by hvd_init: connects to the server at addr:port
 * (retrying while it refuses, up to timeout_ns), authenticates as rank and
 * returns a bootstrap whose allgather goes through the server.
 * local_addr_out gets the numeric address of this end of the connection:
 * an address the server's host can reach this rank on.
 */
hvd_status hvd_rdv_client_connect(const char *addr, int port, int rank,
                                  int size,
                                  const uint8_t job_id[HVD_JOB_ID_LEN],
                                  const char *secret, int64_t timeout_ns,
                                  hvd_bootstrap **out, char local_addr_out[64]);

/* Closes the connection and frees the bootstrap; accepts NULL. */
void hvd_rdv_client_close(hvd_bootstrap *bs);

/* Hex text <-> job id (32 hex digits). Returns 0 on success. */
int hvd_job_id_parse(const char *hex, uint8_t job_id_out[HVD_JOB_ID_LEN]);
void hvd_job_id_format(const uint8_t job_id[HVD_JOB_ID_LEN], char hex[33]);

#endif
