/*
 * What the rendezvous files share, private to transport/bootstrap/.
 *
 * Client and server frame every message the same way: its length as a
 * 4-byte little-endian integer, then the protobuf-c message
 * (rendezvous.proto), then a 16-byte AES-256-GCM tag (protect.h) over the
 * length and the message. The tag is always there, whatever
 * HVD_TCP_PROTECT says: the rendezvous is always authenticated
 * (integrity: the message travels in the clear), with a key per
 * connection and direction from hvd_hs_keys and the n-th message of a
 * direction using n as its nonce, so a message that is changed, replayed,
 * reordered or dropped fails the next tag. Encryption is not offered: a
 * round's answer is one buffer shared by every rank's connection, and the
 * blobs it carries are addresses and capabilities, not secrets.
 *
 * The server is three files whose calls go one way:
 *   rdv_server.c   creating and destroying the server, accepting,
 *                  reading and dispatching messages, the fixed job's
 *                  rounds, the sweep of stalled connections, progress
 *   rdv_elastic.c  workers and generations of an elastic job, and the
 *                  keepalive of waiting workers
 *   rdv_conn.c     one connection: its queue of answers (shared,
 *                  reference-counted Results), sending, failing with a
 *                  last Result, draining and closing it; a round's answer
 *                  to every rank
 * rdv_server.c calls the other two, rdv_elastic.c calls rdv_conn.c, and
 * rdv_conn.c calls neither. The client (rdv_client.c) uses only the
 * framing below.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_RDV_INTERNAL_H
#define HVD_TRANSPORT_BOOTSTRAP_RDV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "transport/base/log.h"
#include "transport/bootstrap/handshake.h"
#include "transport/bootstrap/net.h"
#include "transport/bootstrap/protect.h"
#include "transport/bootstrap/rendezvous.h"
#include "transport/bootstrap/rendezvous.pb-c.h"

/* The length before every message. */
#define LEN_PREFIX 4

/* The tag after every message. */
#define RDV_TAG HVD_PROTECT_TAG

/* One connection's two directions, once its handshake is done. */
typedef struct rdv_keys {
    hvd_aead tx;
    hvd_aead rx;
    uint64_t tx_n; /* messages sealed */
    uint64_t rx_n; /* messages opened */
    int ready;
} rdv_keys;

/* Derives k from a finished handshake hs; client: this side sent the
 * HELLO. */
hvd_status hvd_rdv_keys_init(rdv_keys *k, const hvd_hs *hs, int client);
void hvd_rdv_keys_free(rdv_keys *k);
/* Tags the next message sent: msg is its length prefix and body. */
int hvd_rdv_seal(rdv_keys *k, const uint8_t *msg, size_t len,
                 uint8_t tag[RDV_TAG]);
/* Checks the next message received: its prefix, body of len bytes and
 * the tag after it. 0 if it is authentic. */
int hvd_rdv_open(rdv_keys *k, const uint8_t prefix[LEN_PREFIX],
                 const uint8_t *body, size_t len, const uint8_t tag[RDV_TAG]);

/* ---- A rendezvous hosted by rank 0 (rdv_host.c) ---- */

/* Why a try did not join: nothing answered there (nothing listens, or it
 * dropped the connection unanswered), another job's rendezvous refused
 * the job id, or the program there does not speak hvd's handshake. */
enum { RDV_SKIP_NOBODY = 1, RDV_SKIP_OTHER_JOB, RDV_SKIP_NOT_HVD };

/*
 * One try to join a fixed job's rendezvous at addr:port, connecting and
 * authenticating by try_deadline. HVD_OK with *out set: joined, and the
 * rounds are bounded by deadline. HVD_OK with *out NULL: not there, and
 * *skip_out says why (RDV_SKIP_*). Any other status is final: this job's
 * rendezvous refused this rank (a wrong secret, a duplicate rank, another
 * HVD_TCP_PROTECT), with a sentence.
 */
hvd_status hvd_rdv_client_try(const char *addr, int port, int rank, int size,
                              const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret, int64_t try_deadline,
                              int64_t deadline, hvd_bootstrap **out,
                              char local_addr_out[64], int *skip_out);

/* ---- Server ---- */

/* Hosted under srun: the server answers credential requests with what
 * fn makes (before the first connection). */
void hvd_rdv_server_set_cred(hvd_rdv_server *srv, hvd_hs_cred_fn fn, void *ctx);

/* A waiting worker hears from the server this often (rdv_elastic.c). */
#define KEEPALIVE_NS (1000000000LL)
/* A connection that has not authenticated in this time is dropped. */
#define HANDSHAKE_NS (10 * 1000000000LL)
/* While the table is short of free slots (a flood), a connection that has
 * not sent a whole HELLO in this time is dropped: a rank sends its HELLO
 * as soon as it is connected. */
#define HELLO_NS (1000000000LL)
/* Connections accepted per call of accept_all: the rest wait in the
 * kernel's queue while the server reads what the ones it holds sent. */
#define ACCEPT_BATCH 64
/* Connections from one address that have not sent a HELLO, while the
 * table is full: a newcomer from an address over it replaces that
 * address's oldest, not another address's. */
#define PER_SOURCE 8
/* Largest Contribute message: the blob plus protobuf's few bytes. */
#define MAX_CONTRIBUTE (HVD_RDV_MAX_BLOB + 64)

/* RC_CLOSING: an elastic connection that was sent its last Result (an
 * error): the rest of the queue is sent, the write side is shut, and what
 * the peer still sends is read and dropped until it closes or the
 * deadline passes, so that closing does not reset the connection before
 * the peer has read that Result. */
enum { RC_FREE = 0, RC_HANDSHAKE, RC_READY, RC_CLOSING };

/* Results queued on one connection besides notices: at most a round's
 * answer, an assignment and an error are ever pending at once. */
#define OUT_QUEUE 4
/* An elastic connection that was sent an error has this long to close. */
#define CLOSING_NS (5 * 1000000000LL)

typedef struct rconn {
    int state;
    int fd;
    int rank;      /* fixed: the rank; elastic: rank in the generation, -1 */
    int worker;    /* elastic: the worker id it authenticated as, -1 */
    int counted;   /* elastic: counted in srv->joined */
    int join_seen; /* elastic: its join arrived */
    /* It sent a well-formed HELLO for this job and was sent its CHALLENGE:
     * it is not dropped to make room for newcomers. */
    int challenged;
    int64_t since; /* accepted at */
    int64_t deadline;
    char name[HVD_ADDR_MAX];
    hvd_hs hs;
    rdv_keys keys;
    /* Incoming message: 4-byte length, then the body and its tag (body_len
     * counts the body only). */
    uint8_t lenbuf[LEN_PREFIX];
    size_t len_got;
    uint8_t *body;
    size_t body_len;
    size_t body_got;
    /* Outgoing: Results, shared (a reference held while queued: the next
     * round, of the next generation, may start before one is sent), sent
     * in order; q[qhead] from out_off. Notices are only counted, and one
     * is queued whenever the queue is empty (srv->notice). */
    struct rresult *q[OUT_QUEUE];
    int qhead, qlen;
    size_t out_off; /* of q[qhead]'s bytes, then of out_tag */
    uint8_t out_tag[RDV_TAG];
    /* q[qhead] was tagged (with the next count): a send that would block
     * before its first byte must not tag it again. */
    int out_sealed;
    int notices;
    int shut;
} rconn;

/* A Result as sent: length prefix and message. */
typedef struct rresult {
    int refs;
    size_t len;
    uint8_t data[];
} rresult;

/* An elastic worker, as hvdrun declared it. */
enum { W_NONE = 0, W_ADDED, W_REMOVED };

typedef struct rworker {
    int state;
    int conn;    /* index of its authenticated connection, -1 */
    int waiting; /* asked to join the next generation, not yet placed */
    int rank;    /* rank in the current generation, -1 */
    int64_t keepalive_at; /* waiting: when it was last sent anything */
    int placed;           /* was a member of some generation */
    char *host;
    char why[160]; /* why it was removed */
} rworker;

struct hvd_rdv_server {
    int lfd;
    int epfd;
    int tfd;
    int timer_armed;
    int port;
    int size; /* fixed: the job's; elastic: the current generation's */
    uint8_t job_id[HVD_JOB_ID_LEN];
    char *secret;
    rconn *conns;
    int nconns;
    int *rank_conn; /* rank -> index into conns, -1 */
    int joined;
    uint32_t generation; /* rendezvous started again after a shutdown;
                            elastic: the last generation formed */
    uint32_t round;
    uint8_t **blobs; /* this round's blob per rank, NULL if not yet */
    size_t *blob_len;
    int have;
    rresult *result; /* the last round's answer */

    /* Elastic mode. */
    int elastic;
    int max_workers;
    int min_np;
    rworker *workers;
    int *gen_worker;    /* rank -> worker id in the current generation */
    rresult *notice;    /* the notice of the current generation */
    rresult *keepalive; /* what a waiting worker gets every second */
    int gen_dead;       /* a member left: no round of it can complete */
    int any_placed;     /* some generation got past its first round */
    char dead_why[200];
    int ended;
    char end_why[256];

    /* Hosted under srun: what answers credential requests (handshake.h);
     * NULL: none. */
    hvd_hs_cred_fn cred;
    void *cred_ctx;

    /* Connections refused (their handshake failed, or no room) and
     * dropped (silent too long, or pushed out by newcomers) before they
     * authenticated: counted, and logged at a bounded rate. */
    hvd_log_limiter refused;
    hvd_log_limiter dropped;
    /* Connections dropped because a message after their handshake failed
     * its tag: logged at a bounded rate too. */
    hvd_log_limiter forged;
};

/* rdv_conn.c: results and connections. */

/* Packs res with its length prefix; one reference. NULL when out of
 * memory. */
rresult *hvd_rdv_result_pack(const Hvd__Rdv__Result *res);
/* Drops a reference to r (NULL: none). */
void hvd_rdv_result_put(rresult *r);
/* Arms (on) or disarms the server's one-second timer (the sweep). */
void hvd_rdv_arm_timer(hvd_rdv_server *srv, int on);
/* Closes c and frees what it holds; the slot is free again. */
void hvd_rdv_conn_close(hvd_rdv_server *srv, rconn *c);
/* Sets the epoll events c is watched for. */
void hvd_rdv_conn_watch(hvd_rdv_server *srv, rconn *c, uint32_t events);
/* Sends what is queued on c: Results in order, then the notices it is
 * owed, one at a time. */
void hvd_rdv_conn_flush(hvd_rdv_server *srv, rconn *c);
/* Queues r (a reference is taken) on c and sends what it can. */
void hvd_rdv_conn_send(hvd_rdv_server *srv, rconn *c, rresult *r);
/* Sends c a last Result carrying status and sentence, then closes it
 * (RC_CLOSING). c no longer stands for its worker or rank. Elastic, and
 * a fixed rank whose message failed authentication. */
void hvd_rdv_conn_fail(hvd_rdv_server *srv, rconn *c, hvd_status status,
                       const char *sentence);
/* Elastic: reads and drops what a closing connection still sends, and
 * closes it at its end. */
void hvd_rdv_conn_drain(hvd_rdv_server *srv, rconn *c);
/* Every rank has contributed to the open round: sends each the round's
 * answer and opens the next round. */
void hvd_rdv_finish_round(hvd_rdv_server *srv);

/* rdv_elastic.c: workers and generations. */

/* Elastic: c authenticated as worker c->worker. */
void hvd_rdv_elastic_admitted(hvd_rdv_server *srv, rconn *c);
/* Elastic: a Contribute from c. Returns with c possibly closed. */
void hvd_rdv_elastic_message(hvd_rdv_server *srv, rconn *c,
                             const Hvd__Rdv__Contribute *msg);
/* Elastic: sends a keepalive to each waiting worker due one; returns the
 * number of waiting workers (0 for a fixed job). */
int hvd_rdv_keep_alive(hvd_rdv_server *srv, int64_t now);

#endif
