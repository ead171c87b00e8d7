/*
 * The connection handshake: every TCP connection of a job (rendezvous and
 * data) starts with it. It carries the job id, the connecting rank and the
 * socket index, and proves on both sides that the peer holds the job secret
 * without sending it:
 *
 *   client -> server  HELLO      magic, version, kind, job id, rank, index,
 *                                client nonce, frame protection
 *   server -> client  CHALLENGE  code (0 = go on), server rank, server
 *                                nonce, mac_s = HMAC(secret, "hvd-srv" |
 *                                HELLO | server rank | server nonce)
 *                                (and the server's frame protection)
 *   client -> server  RESPONSE   mac_c = HMAC(secret, "hvd-cli" | HELLO |
 *                                server nonce | mac_s)
 *   server -> client  RESULT     code (0 = accepted)
 *
 * HMAC is HMAC-SHA256 from OpenSSL's libcrypto; nonces come from RAND_bytes.
 * Each side's proof covers a nonce the other side just chose, so a recorded
 * handshake cannot be replayed.
 *
 * Frame protection (HVD_TCP_PROTECT, transport/bootstrap/protect.h): the
 * HELLO carries the client's, the CHALLENGE the server's. Peers that
 * differ finish the proofs (so a stranger cannot fail a rank by claiming
 * another value) and then both fail with HVD_ERR_MISMATCH naming both
 * values. hvd_hs_keys derives the connection's keys from the secret, both
 * nonces and the transcript (which includes the protection).
 *
 * The state machine is pure: it consumes whole messages and produces bytes
 * to send, so it is unit-tested and fuzzed without sockets. hvd_hs_io()
 * drives it over a non-blocking socket.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_HANDSHAKE_H
#define HVD_TRANSPORT_BOOTSTRAP_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"
#include "transport/bootstrap/bootstrap.h"

#define HVD_HS_MAGIC 0x48564448u /* "HVDH" */
#define HVD_HS_VERSION 2
#define HVD_HS_NONCE 32
#define HVD_HS_MAC 32

#define HVD_HS_HELLO_LEN 68
#define HVD_HS_CHALLENGE_LEN 80
#define HVD_HS_RESPONSE_LEN 40
#define HVD_HS_RESULT_LEN 8
#define HVD_HS_MAX_MSG 80

/*
 * A credential request: a HELLO with magic "HVDM". A hosted rendezvous
 * under srun answers it with a munge credential that holds the job
 * secret (transport/bootstrap/munge.h), then closes the connection:
 *
 *   client -> server  REQUEST  as HELLO, magic HVD_HS_MAGIC_CRED
 *   server -> client  CRED     magic HVD_HS_MAGIC_CRED, code, length,
 *                              the credential (length bytes of text)
 *
 * code is HVD_HS_OK, HVD_HS_BAD_VERSION, HVD_HS_WRONG_JOB (another
 * job's rendezvous: its credential would be of no use), or
 * HVD_HS_NO_CRED (this rendezvous gives none).
 */
#define HVD_HS_MAGIC_CRED 0x4d445648u /* "HVDM" */
#define HVD_HS_CRED_HEAD 12
#define HVD_HS_CRED_MAX 1024
#define HVD_HS_MAX_OUT (HVD_HS_CRED_HEAD + HVD_HS_CRED_MAX)

/* hvd_hs.refusal: the peer is not an hvd process (bad magic). */
#define HVD_HS_NOT_HVD (-1)

/* What a connection is for. */
enum { HVD_HS_KIND_RENDEZVOUS = 1, HVD_HS_KIND_DATA = 2 };

/* Why a server refused (the code field of CHALLENGE and RESULT). */
typedef enum {
    HVD_HS_OK = 0,
    HVD_HS_BAD_VERSION = 1,     /* not an hvd peer, or another hvd version */
    HVD_HS_WRONG_JOB = 2,       /* the client belongs to another job */
    HVD_HS_UNEXPECTED = 3,      /* rank/index not expected (duplicate, range) */
    HVD_HS_BAD_PROOF = 4,       /* the client does not hold the job secret */
    HVD_HS_PROTECT_DIFFERS = 5, /* HVD_TCP_PROTECT differs */
    HVD_HS_NO_CRED = 6          /* no credential given here */
} hvd_hs_code;

/* Server: makes a fresh credential for a credential request into cred
 * (cap bytes); returns its length, or -1 when it cannot. */
typedef int (*hvd_hs_cred_fn)(void *ctx, char *cred, size_t cap);

enum { HVD_HS_CLIENT = 1, HVD_HS_SERVER = 2 };

/*
 * Server-side admission of a HELLO: returns HVD_HS_OK or a refusal code and
 * writes a reason into why.
 */
typedef hvd_hs_code (*hvd_hs_check_fn)(void *ctx, int kind, int rank, int index,
                                       char *why, size_t whylen);

typedef struct hvd_hs {
    int role;
    int state;
    uint8_t job_id[HVD_JOB_ID_LEN];
    const char *secret; /* borrowed; must outlive the handshake */
    int kind;
    int rank;  /* client: own rank; server: own rank (sent in CHALLENGE) */
    int index; /* client: socket index */
    hvd_hs_check_fn check;
    void *check_ctx;
    /* Server: answers credential requests (NULL: with HVD_HS_NO_CRED). */
    hvd_hs_cred_fn cred;
    void *cred_ctx;
    /* Server: the peer asked for a credential and was answered (2: with
     * one, 1: with a refusal); the handshake then ends as a failure that
     * is no refusal. */
    int cred_served;

    /* Learned from the peer once done. */
    int peer_rank;
    int peer_index;
    int peer_kind;
    int peer_protect;
    /* Client: why the server refused, as it said (hvd_hs_code; a wrong
     * proof of the server counts as HVD_HS_BAD_PROOF), 0 when it did not;
     * HVD_HS_NOT_HVD when the peer does not speak the handshake. A client
     * trying several ports tells another job from a wrong secret from
     * another program by it. */
    int refusal;

    int protect; /* this side's frame protection (hvd_hs_set_protect) */

    uint8_t hello[HVD_HS_HELLO_LEN];
    uint8_t nonce_s[HVD_HS_NONCE];
    uint8_t mac_s[HVD_HS_MAC];

    /* Bytes to send: out[out_off, out_len). */
    uint8_t out[HVD_HS_MAX_OUT];
    size_t out_len;
    size_t out_off;
    /* Bytes received of the next message. */
    uint8_t in[HVD_HS_MAX_MSG];
    size_t in_len;

    hvd_status status; /* HVD_OK until it fails */
    char err[256];     /* why it failed */
} hvd_hs;

/*
 * Starts a client handshake: hs->out holds the HELLO. The server is
 * expected to be expect_peer_rank (-1: any); a server that says otherwise
 * is refused.
 */
hvd_status hvd_hs_client_init(hvd_hs *hs, const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret, int kind, int rank, int index,
                              int expect_peer_rank);

/* Starts a server handshake that answers with rank my_rank and admits
 * HELLOs through check (NULL: admit every rank and index). */
void hvd_hs_server_init(hvd_hs *hs, const uint8_t job_id[HVD_JOB_ID_LEN],
                        const char *secret, int kind, int my_rank,
                        hvd_hs_check_fn check, void *check_ctx);

/* Sets this side's frame protection (hvd_protect_mode; 0 after init):
 * call right after hvd_hs_client_init or hvd_hs_server_init. */
void hvd_hs_set_protect(hvd_hs *hs, int mode);

/*
 * Once done: the connection's two keys, HKDF-SHA256 of the secret with
 * both nonces as salt and label, the HELLO (which holds the protection),
 * the server's rank, nonce and proof as info. c2s protects what the client
 * sends, s2c what the server sends; HVD_PROTECT_KEY bytes each.
 */
hvd_status hvd_hs_keys(const hvd_hs *hs, const char *label, uint8_t *c2s,
                       uint8_t *s2c);

/* Bytes the next incoming message has (0 when none is expected now). */
size_t hvd_hs_need(const hvd_hs *hs);

/*
 * Consumes one whole message of hvd_hs_need() bytes. May queue output.
 * On failure returns HVD_ERR_AUTH (or HVD_ERR_TRANSPORT for a malformed
 * message) and fills hs->err; a refusal code may still be queued for the
 * peer, so drain hs->out before closing.
 */
hvd_status hvd_hs_input(hvd_hs *hs, const uint8_t *msg, size_t len);

/* 1 once the handshake has succeeded and all output is sent. */
int hvd_hs_done(const hvd_hs *hs);

/*
 * Drives the handshake over a non-blocking socket: writes what is queued,
 * reads what is needed. Returns HVD_OK with *events_out = 0 when done, or
 * with the poll events (POLLIN/POLLOUT) to wait for; a failure status (with
 * hs->err) otherwise, including a peer that closed the connection. A
 * client whose server closed the connection before answering its hello
 * gets HVD_ERR_PEER_LOST: a server that refuses always says why first, so
 * this one dropped the connection unread (it had too many at once) or
 * died, and trying again may succeed.
 */
hvd_status hvd_hs_io(hvd_hs *hs, int fd, short *events_out);

/* Runs a whole handshake on a socket, blocking until deadline_ns
 * (hvd_now_ns() clock). The socket may be blocking or not. */
hvd_status hvd_hs_run(hvd_hs *hs, int fd, int64_t deadline_ns);

const char *hvd_hs_code_text(hvd_hs_code code);

#endif
