#include "transport/bootstrap/handshake.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/wire.h"
#include "transport/bootstrap/protect.h"

enum {
    ST_CLIENT_SEND_HELLO = 1, /* HELLO queued; waiting for CHALLENGE */
    ST_CLIENT_WAIT_RESULT,    /* RESPONSE queued; waiting for RESULT */
    ST_SERVER_WAIT_HELLO,
    ST_SERVER_WAIT_RESPONSE, /* CHALLENGE queued */
    ST_DONE,                 /* succeeded (output may still be queued) */
    ST_FAILED                /* failed (a refusal may still be queued) */
};

const char *hvd_hs_code_text(hvd_hs_code code) {
    switch (code) {
    case HVD_HS_OK:
        return "accepted";
    case HVD_HS_BAD_VERSION:
        return "not an hvd peer of this version";
    case HVD_HS_WRONG_JOB:
        return "belongs to another job";
    case HVD_HS_UNEXPECTED:
        return "rank or socket index not expected here";
    case HVD_HS_BAD_PROOF:
        return "proof of the job secret does not match (HVD_SECRET differs)";
    case HVD_HS_PROTECT_DIFFERS:
        return "HVD_TCP_PROTECT differs";
    case HVD_HS_NO_CRED:
        return "this rendezvous gives no munge credential";
    }
    return "unknown refusal code";
}

static hvd_status hs_fail(hvd_hs *hs, hvd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static hvd_status hs_fail(hvd_hs *hs, hvd_status status, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(hs->err, sizeof(hs->err), fmt, ap);
    va_end(ap);
    hs->state = ST_FAILED;
    hs->status = status;
    return status;
}

/* HMAC-SHA256 over the concatenation of up to four parts. */
static int mac(const char *secret, const char *label, const uint8_t *p1,
               size_t n1, const uint8_t *p2, size_t n2, const uint8_t *p3,
               size_t n3, uint8_t out[HVD_HS_MAC]) {
    uint8_t msg[16 + HVD_HS_HELLO_LEN + 2 * HVD_HS_NONCE + HVD_HS_MAC];
    size_t len = strlen(label);
    unsigned int outlen = 0;

    if (len + n1 + n2 + n3 > sizeof(msg))
        return -1;
    memcpy(msg, label, len);
    memcpy(msg + len, p1, n1);
    len += n1;
    if (n2)
        memcpy(msg + len, p2, n2);
    len += n2;
    if (n3)
        memcpy(msg + len, p3, n3);
    len += n3;
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, len, out,
             &outlen) == NULL ||
        outlen != HVD_HS_MAC)
        return -1;
    return 0;
}

static void server_mac(const hvd_hs *hs, uint32_t server_rank,
                       uint8_t out[HVD_HS_MAC], int *ok) {
    uint8_t rank_le[4];

    hvd_put32(rank_le, server_rank);
    *ok = mac(hs->secret, "hvd-srv", hs->hello, HVD_HS_HELLO_LEN, rank_le, 4,
              hs->nonce_s, HVD_HS_NONCE, out) == 0;
}

static void client_mac(const hvd_hs *hs, uint8_t out[HVD_HS_MAC], int *ok) {
    *ok = mac(hs->secret, "hvd-cli", hs->hello, HVD_HS_HELLO_LEN, hs->nonce_s,
              HVD_HS_NONCE, hs->mac_s, HVD_HS_MAC, out) == 0;
}

static void queue(hvd_hs *hs, const uint8_t *msg, size_t len) {
    memcpy(hs->out, msg, len);
    hs->out_len = len;
    hs->out_off = 0;
}

hvd_status hvd_hs_client_init(hvd_hs *hs, const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret, int kind, int rank, int index,
                              int expect_peer_rank) {
    uint8_t *h = hs->hello;

    memset(hs, 0, sizeof(*hs));
    hs->role = HVD_HS_CLIENT;
    hs->state = ST_CLIENT_SEND_HELLO;
    memcpy(hs->job_id, job_id, HVD_JOB_ID_LEN);
    hs->secret = secret;
    hs->kind = kind;
    hs->rank = rank;
    hs->index = index;
    hs->peer_rank = expect_peer_rank;

    hvd_put32(h, HVD_HS_MAGIC);
    hvd_put16(h + 4, HVD_HS_VERSION);
    hvd_put16(h + 6, (uint16_t)kind);
    memcpy(h + 8, job_id, HVD_JOB_ID_LEN);
    hvd_put32(h + 24, (uint32_t)rank);
    hvd_put32(h + 28, (uint32_t)index);
    if (RAND_bytes(h + 32, HVD_HS_NONCE) != 1)
        return hs_fail(hs, HVD_ERR_INTERNAL,
                       "RAND_bytes failed to make a handshake nonce");
    hvd_put16(h + 64, 0);
    hvd_put16(h + 66, 0);
    queue(hs, h, HVD_HS_HELLO_LEN);
    return HVD_OK;
}

void hvd_hs_set_protect(hvd_hs *hs, int mode) {
    hs->protect = mode;
    if (hs->role == HVD_HS_CLIENT && hs->state == ST_CLIENT_SEND_HELLO &&
        hs->out_off == 0) {
        hvd_put16(hs->hello + 64, (uint16_t)mode);
        queue(hs, hs->hello, HVD_HS_HELLO_LEN);
    }
}

hvd_status hvd_hs_keys(const hvd_hs *hs, const char *label, uint8_t *c2s,
                       uint8_t *s2c) {
    uint8_t salt[2 * HVD_HS_NONCE];
    uint8_t info[64 + HVD_HS_HELLO_LEN + 4 + HVD_HS_NONCE + HVD_HS_MAC];
    uint8_t keys[2 * HVD_PROTECT_KEY];
    size_t n = strlen(label);
    int server_rank = hs->role == HVD_HS_SERVER ? hs->rank : hs->peer_rank;
    hvd_status st;

    if (hs->state != ST_DONE || n > 64)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "connection keys asked for before the handshake "
                             "succeeded");
    memcpy(salt, hs->hello + 32, HVD_HS_NONCE);
    memcpy(salt + HVD_HS_NONCE, hs->nonce_s, HVD_HS_NONCE);
    memcpy(info, label, n);
    memcpy(info + n, hs->hello, HVD_HS_HELLO_LEN);
    n += HVD_HS_HELLO_LEN;
    hvd_put32(info + n, (uint32_t)server_rank);
    n += 4;
    memcpy(info + n, hs->nonce_s, HVD_HS_NONCE);
    n += HVD_HS_NONCE;
    memcpy(info + n, hs->mac_s, HVD_HS_MAC);
    n += HVD_HS_MAC;
    st = hvd_protect_hkdf(hs->secret, salt, sizeof(salt), info, n, keys,
                          sizeof(keys));
    if (st == HVD_OK) {
        memcpy(c2s, keys, HVD_PROTECT_KEY);
        memcpy(s2c, keys + HVD_PROTECT_KEY, HVD_PROTECT_KEY);
    }
    OPENSSL_cleanse(keys, sizeof(keys));
    return st;
}

void hvd_hs_server_init(hvd_hs *hs, const uint8_t job_id[HVD_JOB_ID_LEN],
                        const char *secret, int kind, int my_rank,
                        hvd_hs_check_fn check, void *check_ctx) {
    memset(hs, 0, sizeof(*hs));
    hs->role = HVD_HS_SERVER;
    hs->state = ST_SERVER_WAIT_HELLO;
    memcpy(hs->job_id, job_id, HVD_JOB_ID_LEN);
    hs->secret = secret;
    hs->kind = kind;
    hs->rank = my_rank;
    hs->check = check;
    hs->check_ctx = check_ctx;
    hs->peer_rank = -1;
    hs->peer_index = -1;
}

size_t hvd_hs_need(const hvd_hs *hs) {
    switch (hs->state) {
    case ST_CLIENT_SEND_HELLO:
        return HVD_HS_CHALLENGE_LEN;
    case ST_CLIENT_WAIT_RESULT:
        return HVD_HS_RESULT_LEN;
    case ST_SERVER_WAIT_HELLO:
        return HVD_HS_HELLO_LEN;
    case ST_SERVER_WAIT_RESPONSE:
        return HVD_HS_RESPONSE_LEN;
    default:
        return 0;
    }
}

static void queue_refusal(hvd_hs *hs, hvd_hs_code code, size_t len) {
    uint8_t msg[HVD_HS_MAX_MSG];

    memset(msg, 0, sizeof(msg));
    hvd_put32(msg, HVD_HS_MAGIC);
    hvd_put32(msg + 4, (uint32_t)code);
    queue(hs, msg, len);
}

/* A credential request (handshake.h): answered, and the handshake ends
 * without a refusal (cred_served). */
static hvd_status server_cred(hvd_hs *hs, const uint8_t *m) {
    uint8_t reply[HVD_HS_MAX_OUT];
    uint32_t code = HVD_HS_OK;
    int len = 0;

    if (hvd_get16(m + 4) != HVD_HS_VERSION)
        code = HVD_HS_BAD_VERSION;
    else if (CRYPTO_memcmp(m + 8, hs->job_id, HVD_JOB_ID_LEN) != 0)
        code = HVD_HS_WRONG_JOB;
    else if (hs->cred == NULL)
        code = HVD_HS_NO_CRED;
    else
        len = hs->cred(hs->cred_ctx, (char *)reply + HVD_HS_CRED_HEAD,
                       HVD_HS_CRED_MAX);
    if (len < 0 || len > HVD_HS_CRED_MAX) {
        code = HVD_HS_NO_CRED;
        len = 0;
    }
    hvd_put32(reply, HVD_HS_MAGIC_CRED);
    hvd_put32(reply + 4, code);
    hvd_put32(reply + 8, (uint32_t)len);
    queue(hs, reply, HVD_HS_CRED_HEAD + (size_t)len);
    hs->cred_served = code == HVD_HS_OK ? 2 : 1;
    return hs_fail(hs, HVD_ERR_AUTH, "answered a credential request: %s",
                   hvd_hs_code_text((hvd_hs_code)code));
}

static hvd_status server_hello(hvd_hs *hs, const uint8_t *m) {
    uint8_t reply[HVD_HS_CHALLENGE_LEN];
    char why[160] = "";
    int ok;

    if (hvd_get32(m) == HVD_HS_MAGIC_CRED)
        return server_cred(hs, m);
    if (hvd_get32(m) != HVD_HS_MAGIC || hvd_get16(m + 4) != HVD_HS_VERSION) {
        queue_refusal(hs, HVD_HS_BAD_VERSION, HVD_HS_CHALLENGE_LEN);
        return hs_fail(hs, HVD_ERR_AUTH,
                       "not an hvd handshake of version %d (magic 0x%08x, "
                       "version %u)",
                       HVD_HS_VERSION, hvd_get32(m), hvd_get16(m + 4));
    }
    memcpy(hs->hello, m, HVD_HS_HELLO_LEN);
    hs->peer_kind = hvd_get16(m + 6);
    hs->peer_protect = hvd_get16(m + 64);
    uint32_t rank = hvd_get32(m + 24);
    uint32_t index = hvd_get32(m + 28);
    hs->peer_rank = rank > INT32_MAX ? -1 : (int)rank;
    hs->peer_index = index > INT32_MAX ? -1 : (int)index;

    if (CRYPTO_memcmp(m + 8, hs->job_id, HVD_JOB_ID_LEN) != 0) {
        queue_refusal(hs, HVD_HS_WRONG_JOB, HVD_HS_CHALLENGE_LEN);
        return hs_fail(hs, HVD_ERR_AUTH,
                       "the peer belongs to another job "
                       "(job id differs)");
    }
    if (hs->peer_kind != hs->kind || hs->peer_rank < 0 || hs->peer_index < 0) {
        queue_refusal(hs, HVD_HS_UNEXPECTED, HVD_HS_CHALLENGE_LEN);
        return hs_fail(hs, HVD_ERR_AUTH,
                       "unexpected connection kind %d rank %u index %u",
                       hs->peer_kind, rank, index);
    }
    if (hs->check != NULL) {
        hvd_hs_code code =
            hs->check(hs->check_ctx, hs->peer_kind, hs->peer_rank,
                      hs->peer_index, why, sizeof(why));
        if (code != HVD_HS_OK) {
            queue_refusal(hs, code, HVD_HS_CHALLENGE_LEN);
            return hs_fail(hs, HVD_ERR_AUTH, "%s",
                           why[0] ? why : hvd_hs_code_text(code));
        }
    }

    if (RAND_bytes(hs->nonce_s, HVD_HS_NONCE) != 1)
        return hs_fail(hs, HVD_ERR_INTERNAL,
                       "RAND_bytes failed to make a handshake nonce");
    server_mac(hs, (uint32_t)hs->rank, hs->mac_s, &ok);
    if (!ok)
        return hs_fail(hs, HVD_ERR_INTERNAL, "HMAC-SHA256 failed");
    memset(reply, 0, sizeof(reply));
    hvd_put32(reply, HVD_HS_MAGIC);
    hvd_put32(reply + 4, HVD_HS_OK);
    hvd_put32(reply + 8, (uint32_t)hs->rank);
    hvd_put16(reply + 12, (uint16_t)hs->protect);
    memcpy(reply + 16, hs->nonce_s, HVD_HS_NONCE);
    memcpy(reply + 48, hs->mac_s, HVD_HS_MAC);
    queue(hs, reply, sizeof(reply));
    hs->state = ST_SERVER_WAIT_RESPONSE;
    return HVD_OK;
}

static hvd_status server_response(hvd_hs *hs, const uint8_t *m) {
    uint8_t want[HVD_HS_MAC];
    uint8_t result[HVD_HS_RESULT_LEN];
    int ok;

    if (hvd_get32(m) != HVD_HS_MAGIC) {
        queue_refusal(hs, HVD_HS_BAD_VERSION, HVD_HS_RESULT_LEN);
        return hs_fail(hs, HVD_ERR_AUTH, "malformed handshake response");
    }
    client_mac(hs, want, &ok);
    if (!ok)
        return hs_fail(hs, HVD_ERR_INTERNAL, "HMAC-SHA256 failed");
    if (CRYPTO_memcmp(want, m + 8, HVD_HS_MAC) != 0) {
        queue_refusal(hs, HVD_HS_BAD_PROOF, HVD_HS_RESULT_LEN);
        return hs_fail(hs, HVD_ERR_AUTH,
                       "its proof of the job secret is wrong (it was started "
                       "with a different HVD_SECRET, or is not part of this "
                       "job)");
    }
    /* A rank of this job (its proof is right, and covers its HELLO) that
     * protects frames otherwise: both sides fail, naming both values. */
    if (hs->peer_protect != hs->protect) {
        queue_refusal(hs, HVD_HS_PROTECT_DIFFERS, HVD_HS_RESULT_LEN);
        return hs_fail(hs, HVD_ERR_MISMATCH,
                       "it uses HVD_TCP_PROTECT=%s and this rank uses "
                       "HVD_TCP_PROTECT=%s: set the same value on every rank",
                       hvd_protect_name(hs->peer_protect),
                       hvd_protect_name(hs->protect));
    }
    hvd_put32(result, HVD_HS_MAGIC);
    hvd_put32(result + 4, HVD_HS_OK);
    queue(hs, result, sizeof(result));
    hs->state = ST_DONE;
    return HVD_OK;
}

static hvd_status client_challenge(hvd_hs *hs, const uint8_t *m) {
    uint8_t want[HVD_HS_MAC];
    uint8_t reply[HVD_HS_RESPONSE_LEN];
    uint32_t code = hvd_get32(m + 4);
    uint32_t server_rank = hvd_get32(m + 8);
    int ok;

    if (hvd_get32(m) != HVD_HS_MAGIC) {
        hs->refusal = HVD_HS_NOT_HVD;
        return hs_fail(hs, HVD_ERR_AUTH,
                       "the peer is not an hvd process (bad handshake magic)");
    }
    if (code != HVD_HS_OK) {
        hs->refusal =
            code <= HVD_HS_PROTECT_DIFFERS ? (int)code : HVD_HS_BAD_VERSION;
        return hs_fail(hs, HVD_ERR_AUTH, "the peer refused the connection: %s",
                       hvd_hs_code_text((hvd_hs_code)code));
    }
    if (hs->peer_rank >= 0 && server_rank != (uint32_t)hs->peer_rank)
        return hs_fail(hs, HVD_ERR_AUTH,
                       "the process at this address is rank %u, not rank %d",
                       server_rank, hs->peer_rank);
    memcpy(hs->nonce_s, m + 16, HVD_HS_NONCE);
    server_mac(hs, server_rank, want, &ok);
    if (!ok)
        return hs_fail(hs, HVD_ERR_INTERNAL, "HMAC-SHA256 failed");
    if (CRYPTO_memcmp(want, m + 48, HVD_HS_MAC) != 0) {
        hs->refusal = HVD_HS_BAD_PROOF;
        return hs_fail(hs, HVD_ERR_AUTH,
                       "the peer's proof of the job secret is wrong (this rank "
                       "or the peer was started with a different HVD_SECRET)");
    }
    memcpy(hs->mac_s, m + 48, HVD_HS_MAC);
    hs->peer_rank = (int)server_rank;
    hs->peer_protect = hvd_get16(m + 12);
    client_mac(hs, reply + 8, &ok);
    if (!ok)
        return hs_fail(hs, HVD_ERR_INTERNAL, "HMAC-SHA256 failed");
    hvd_put32(reply, HVD_HS_MAGIC);
    hvd_put32(reply + 4, 0);
    queue(hs, reply, sizeof(reply));
    hs->state = ST_CLIENT_WAIT_RESULT;
    return HVD_OK;
}

static hvd_status client_result(hvd_hs *hs, const uint8_t *m) {
    uint32_t code = hvd_get32(m + 4);

    if (hvd_get32(m) != HVD_HS_MAGIC) {
        hs->refusal = HVD_HS_NOT_HVD;
        return hs_fail(hs, HVD_ERR_AUTH, "malformed handshake result");
    }
    if (code != HVD_HS_OK)
        hs->refusal =
            code <= HVD_HS_PROTECT_DIFFERS ? (int)code : HVD_HS_BAD_VERSION;
    if (code == HVD_HS_PROTECT_DIFFERS || hs->peer_protect != hs->protect)
        return hs_fail(hs, HVD_ERR_MISMATCH,
                       "it uses HVD_TCP_PROTECT=%s and this rank uses "
                       "HVD_TCP_PROTECT=%s: set the same value on every rank",
                       hvd_protect_name(hs->peer_protect),
                       hvd_protect_name(hs->protect));
    if (code != HVD_HS_OK)
        return hs_fail(hs, HVD_ERR_AUTH, "the peer refused the connection: %s",
                       hvd_hs_code_text((hvd_hs_code)code));
    hs->state = ST_DONE;
    return HVD_OK;
}

hvd_status hvd_hs_input(hvd_hs *hs, const uint8_t *msg, size_t len) {
    if (len != hvd_hs_need(hs) || len == 0)
        return hs_fail(hs, HVD_ERR_INTERNAL,
                       "handshake message of %zu bytes where %zu expected", len,
                       hvd_hs_need(hs));
    switch (hs->state) {
    case ST_SERVER_WAIT_HELLO:
        return server_hello(hs, msg);
    case ST_SERVER_WAIT_RESPONSE:
        return server_response(hs, msg);
    case ST_CLIENT_SEND_HELLO:
        return client_challenge(hs, msg);
    case ST_CLIENT_WAIT_RESULT:
        return client_result(hs, msg);
    default:
        return hs_fail(hs, HVD_ERR_INTERNAL, "handshake input in state %d",
                       hs->state);
    }
}

int hvd_hs_done(const hvd_hs *hs) {
    return hs->state == ST_DONE && hs->out_off == hs->out_len;
}

/*
 * A client whose server goes away before answering its hello: a server
 * that refuses says why first, so this one dropped the connection unread
 * (too many strangers at once; the kernel then resets it, as it does for
 * a server that died) or died. The caller may try again.
 */
static int unanswered(const hvd_hs *hs, ssize_t n, int err) {
    return hs->role == HVD_HS_CLIENT && hs->state == ST_CLIENT_SEND_HELLO &&
           hs->in_len == 0 && (n == 0 || err == ECONNRESET || err == EPIPE);
}

static hvd_status dropped(hvd_hs *hs) {
    return hs_fail(hs, HVD_ERR_PEER_LOST,
                   "the peer closed the connection without answering our hello "
                   "(it is overloaded or gone)");
}

hvd_status hvd_hs_io(hvd_hs *hs, int fd, short *events_out) {
    for (;;) {
        if (hs->out_off < hs->out_len) {
            ssize_t n =
                send(fd, hs->out + hs->out_off, hs->out_len - hs->out_off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                *events_out = POLLOUT;
                return HVD_OK;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && unanswered(hs, n, errno))
                return dropped(hs);
            if (n < 0)
                return hs->state == ST_FAILED
                           ? hs->status
                           : hs_fail(hs, HVD_ERR_TRANSPORT,
                                     "send() during the handshake failed: %s",
                                     strerror(errno));
            hs->out_off += (size_t)n;
            continue;
        }
        if (hs->state == ST_FAILED)
            return hs->status;
        if (hs->state == ST_DONE) {
            *events_out = 0;
            return HVD_OK;
        }
        size_t need = hvd_hs_need(hs);
        ssize_t n =
            recv(fd, hs->in + hs->in_len, need - hs->in_len, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *events_out = POLLIN;
            return HVD_OK;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 && unanswered(hs, n, n < 0 ? errno : 0))
            return dropped(hs);
        if (n < 0)
            return hs_fail(hs, HVD_ERR_TRANSPORT,
                           "recv() during the handshake failed: %s",
                           strerror(errno));
        if (n == 0)
            return hs_fail(hs,
                           hs->role == HVD_HS_CLIENT ? HVD_ERR_AUTH
                                                     : HVD_ERR_TRANSPORT,
                           "the peer closed the connection during the "
                           "handshake%s",
                           hs->role == HVD_HS_CLIENT
                               ? " (it refused us: wrong job or HVD_SECRET?)"
                           : hs->state == ST_SERVER_WAIT_RESPONSE
                               ? " after our challenge: it could not verify "
                                 "our proof, so it holds a different "
                                 "HVD_SECRET or is not part of this job"
                               : " before sending its hello");
        hs->in_len += (size_t)n;
        if (hs->in_len == need) {
            hs->in_len = 0;
            hvd_status st = hvd_hs_input(hs, hs->in, need);
            if (st != HVD_OK && hs->out_off == hs->out_len)
                return st;
            /* A refusal is queued: send it, then report the failure. */
        }
    }
}

hvd_status hvd_hs_run(hvd_hs *hs, int fd, int64_t deadline_ns) {
    for (;;) {
        short events = 0;
        hvd_status st = hvd_hs_io(hs, fd, &events);
        if (st != HVD_OK)
            return st;
        if (events == 0)
            return HVD_OK;
        int64_t left_ms = (deadline_ns - hvd_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hs_fail(hs, HVD_ERR_TIMEOUT,
                           "the peer did not complete the handshake in time");
        struct pollfd pfd = {.fd = fd, .events = events};
        int r = poll(&pfd, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
        if (r < 0 && errno != EINTR)
            return hs_fail(hs, HVD_ERR_TRANSPORT, "poll() failed: %s",
                           strerror(errno));
    }
}
