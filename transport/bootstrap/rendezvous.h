/*
 * The rendezvous: how the ranks of a job find each other at hvd_init.
 *
 * hvdrun runs the server on an ephemeral port of the chosen interface
 * (loopback by default). Each rank connects, proves it holds the job secret
 * (transport/bootstrap/handshake.h), and then takes part in rounds of
 * "allgather": every rank sends one blob per round, and once all ranks have
 * sent theirs the server sends each the concatenation in rank order. The rounds
 * carry host names and transport addresses (TCP listen ports, later RDMA queue
 * pair numbers). Messages are protobuf-c
 * (transport/bootstrap/rendezvous.proto).
 *
 * The server is non-blocking: hvdrun polls hvd_rdv_server_fd() with its
 * other descriptors and calls hvd_rdv_server_progress() when it is readable.
 * A connection without the secret, or one that stalls, is dropped and
 * logged without disturbing the job.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_RENDEZVOUS_H
#define HVD_TRANSPORT_BOOTSTRAP_RENDEZVOUS_H

#include <stdint.h>

#include "hvd/types.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/job_id.h"

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

/* Number of ranks that have authenticated so far. Elastic: the number
 * of connections authenticated and open now (a closed one, or one
 * refused after its handshake, no longer counts). */
int hvd_rdv_server_joined(const hvd_rdv_server *srv);

/* A fixed job's rendezvous has served its purpose: every rank took part
 * in a round, no round is open, and every rank has closed its
 * connection. 0 before that, and always in elastic mode. */
int hvd_rdv_server_finished(const hvd_rdv_server *srv);

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

/* ---- A rendezvous hosted by rank 0 (rdv_host.c) ----
 *
 * Under a launcher that starts the ranks but gives them no channel to
 * meet through (torchrun, Slurm's srun without MPI), rank 0 runs the
 * server in a thread of its own, on the first free port of a range; the
 * other ranks do not know which, and try the range in order.
 */
typedef struct hvd_rdv_host hvd_rdv_host;

/*
 * Under srun, where munge works (transport/bootstrap/munge.h): rank 0
 * makes a random secret of HVD_RDV_CRED_SECRET hex digits, and a rank
 * learns it only from a munge credential the server makes for each
 * connection (the job id, then the secret), which only this uid can
 * decode, and which the rank checks was encoded by this uid for this
 * job. socket: munged's (NULL: munge's default).
 */
typedef struct hvd_rdv_munge {
    int on;
    const char *socket;
} hvd_rdv_munge;
#define HVD_RDV_CRED_SECRET 64
#define HVD_RDV_CRED_PAYLOAD (HVD_JOB_ID_LEN + HVD_RDV_CRED_SECRET)

/*
 * Resolves name (a host name or numeric address) to a numeric address
 * for addr_out (64 bytes): the first of its IPv4 addresses, else IPv6.
 * HVD_ERR_INVALID_ARG with a sentence when it does not resolve.
 */
hvd_status hvd_rdv_resolve(const char *name, char addr_out[64]);

/*
 * Starts the server for a job of size ranks on the first free port of
 * [port, port + span), bound to addr (numeric) when that is one of this
 * host's addresses, else to the wildcard address, and its thread. The
 * thread ends by itself once the server has served its purpose
 * (hvd_rdv_server_finished), or at hvd_rdv_host_stop. Fails with a
 * sentence naming the range when no port of it is free. munge (NULL: off)
 * on: the server hands secret (HVD_RDV_CRED_SECRET characters) to the
 * ranks in munge credentials.
 */
hvd_status hvd_rdv_host_start(const char *addr, int port, int span, int size,
                              const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret, const hvd_rdv_munge *munge,
                              hvd_rdv_host **out);

/* The port the hosted server listens on. */
int hvd_rdv_host_port(const hvd_rdv_host *host);

/* HVD_OK while the server thread has not failed, else its failure, with
 * its sentence set as this thread's last error. */
hvd_status hvd_rdv_host_status(const hvd_rdv_host *host);

/* Stops the thread (at once if it still runs), joins it and frees the
 * host; accepts NULL. */
void hvd_rdv_host_stop(hvd_rdv_host *host);

/*
 * Client side: joins the rendezvous of this job hosted on one of
 * [port, port + span) at addr, trying the ports in order and again until
 * timeout_ns, skipping ports where nothing listens, where another job's
 * rendezvous refuses this one, or where another program listens. A
 * refusal by this job's rendezvous (a wrong secret) is final. On
 * success as hvd_rdv_client_connect. With munge on (NULL: off), secret
 * (secret_cap bytes) is not read but set: to the job secret the server's
 * credential holds.
 */
hvd_status hvd_rdv_client_connect_range(const char *addr, int port, int span,
                                        int rank, int size,
                                        const uint8_t job_id[HVD_JOB_ID_LEN],
                                        char *secret, size_t secret_cap,
                                        const hvd_rdv_munge *munge,
                                        int64_t timeout_ns, hvd_bootstrap **out,
                                        char local_addr_out[64]);

/* ---- Elastic mode (docs/elastic.md) ----
 *
 * In an elastic job the server does not know ranks in advance. hvdrun
 * gives each process it starts a worker id (HVD_ELASTIC_WORKER, never
 * reused in a job) and tells the server about it (add_worker) before the
 * process starts, and again when it is reaped or stopped (remove_worker).
 * A process connects with its worker id where the handshake carries a
 * rank, and asks to join the next *generation*. The server forms
 * generation g + 1 as soon as every worker added and not removed has asked
 * and there are at least min_np of them: it places them (rank order =
 * worker id order, so the oldest surviving worker is rank 0; local rank
 * among workers of the same host, by id; cross rank = host order of first
 * appearance), answers each with its assignment, and the generation's
 * rounds of allgather then run as in a fixed job among its members.
 *
 * The connection stays open while the generation lives: the server pushes
 * a notice to every member of the current generation each time a worker
 * is added or removed (hvd_rdv_client_updates counts them). If a member is
 * removed while its generation is still in its bootstrap rounds, the
 * others' allgather fails with HVD_ERR_PEERS_CHANGED and they join again.
 * A connection as a worker that was removed, or never added, is refused
 * with a sentence saying so; the client then fails with HVD_ERR_AUTH.
 */

/* Creates a server in elastic mode: max_workers bounds the worker ids
 * (0 .. max_workers - 1) hvdrun may add over the job's life; no generation
 * forms with fewer than min_np workers. */
hvd_status hvd_rdv_server_create_elastic(const char *bind_addr, int port,
                                         int max_workers, int min_np,
                                         const uint8_t job_id[HVD_JOB_ID_LEN],
                                         const char *secret,
                                         hvd_rdv_server **out);

/* hvdrun started (or is about to start) worker on host (the name its
 * ranks count as; it orders local and cross ranks). Members of the current
 * generation get a notice. HVD_ERR_INVALID_ARG for an id out of range or
 * added before. */
hvd_status hvd_rdv_server_add_worker(hvd_rdv_server *srv, int worker,
                                     const char *host);

/* hvdrun reaped worker, or stopped it (why: for the log and for the
 * sentence a later connection as this worker is refused with). Members of
 * the current generation get a notice; a generation still in its bootstrap
 * rounds that counts worker is abandoned (its members' allgather fails
 * with HVD_ERR_PEERS_CHANGED). Unknown or removed ids are ignored. */
void hvd_rdv_server_remove_worker(hvd_rdv_server *srv, int worker,
                                  const char *why);

/* The last generation formed (0 before the first); the number of workers
 * added and not removed; of those, the number waiting to join the next
 * generation (asked and not yet placed). hvdrun's policy (elastic timeout,
 * min-np, reset limit) reads these after each progress call. */
uint32_t hvd_rdv_server_generation(const hvd_rdv_server *srv);
int hvd_rdv_server_workers(const hvd_rdv_server *srv);
int hvd_rdv_server_waiting(const hvd_rdv_server *srv);
/* 1 once some generation got past its first bootstrap round and no live
 * worker was a member of one that did: nobody holds the training state any
 * more, and the server forms no further generation (hvdrun ends the job).
 * 0 before that. */
int hvd_rdv_server_state_lost(const hvd_rdv_server *srv);
/* 1 if worker is added, not removed, and waiting to join. */
int hvd_rdv_server_worker_waiting(const hvd_rdv_server *srv, int worker);
/* 1 if worker is a member of the current generation and no member has
 * left it: it is setting up or training, and rejoins when it resets (at a
 * commit after a notice), not because it lags. */
int hvd_rdv_server_worker_member(const hvd_rdv_server *srv, int worker);

/* Where a worker was placed in a generation. */
typedef struct hvd_rdv_assignment {
    uint32_t generation; /* 1 for the first generation formed */
    int rank, size;
    int local_rank, local_size;
    int cross_rank, cross_size;
} hvd_rdv_assignment;

/*
 * Client side of elastic mode, used by hvd_init: connects as worker,
 * asks to join the next generation and waits up to timeout_ns to be
 * placed. The returned bootstrap (rank and size of the assignment) runs
 * the generation's allgather rounds; keep it open while the generation
 * lives (hvd_rdv_client_updates) and close it with hvd_rdv_client_close.
 * Errors: HVD_ERR_AUTH (this worker was removed or is unknown: the
 * sentence says which), HVD_ERR_TIMEOUT, HVD_ERR_PEER_LOST (the server
 * went away), HVD_ERR_SHUTDOWN (the server says the job is ending).
 */
hvd_status hvd_rdv_client_join(const char *addr, int port, int worker,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const char *secret, int64_t timeout_ns,
                               hvd_bootstrap **out, char local_addr_out[64],
                               hvd_rdv_assignment *asg_out);

/* Elastic: reads, without blocking, the notices the server pushed and
 * returns how many arrived since the join (0 or more), or -1 when the
 * connection to the server broke. 0 for a bootstrap of a fixed job. */
int hvd_rdv_client_updates(hvd_bootstrap *bs);

/* Tells the elastic server that the job is ending: every waiting or
 * later join gets HVD_ERR_SHUTDOWN with the sentence why. */
void hvd_rdv_server_end(hvd_rdv_server *srv, const char *why);

#endif
