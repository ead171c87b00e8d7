/*
 * Fuzz target: the connection handshake (transport/bootstrap/handshake.c),
 * both roles, as a pure state machine and over a socket.
 *
 *   byte 0  bit 0: 0 = server, 1 = client
 *           bit 1: "assist": the target puts the right MAC into the
 *                  message where the fuzzer's bytes would need the secret
 *                  (the server's proof in a CHALLENGE, the client's in a
 *                  RESPONSE), so that the paths after a good proof are
 *                  reached too
 *           bit 2: client: expect the server to be rank 0 (else any)
 *           bit 3: drive hvd_hs_io over a socketpair whose other end
 *                  writes the rest of the input and closes, instead of
 *                  feeding whole messages
 *           bit 4: this side protects frames with integrity (else none:
 *                  hvd_hs_set_protect)
 *   then    the peer's messages, back to back (version 2: HELLO 68 and
 *           RESPONSE 40 bytes to a server; CHALLENGE 80 and RESULT 8 to a
 *           client; the HELLO's frame protection at offset 64, the
 *           CHALLENGE's at 12)
 *
 * Checks: no memory error, and a handshake that succeeds is one the rules
 * allow: a server admitted a peer of the right job and kind whose rank and
 * index the admission check accepted, that proved the secret and protects
 * frames as this side does; a client accepted only a server of the
 * expected rank that proved the secret and protects frames as it does.
 * A handshake that succeeds derives its keys (hvd_hs_keys).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "transport/base/clock.h"
#include "transport/bootstrap/handshake.h"
#include "transport/bootstrap/protect.h"

static const uint8_t job[HVD_JOB_ID_LEN] = {0x6a, 0x6f, 0x62, 0x2d, 0x69, 0x64,
                                            0x2d, 0x66, 0x6f, 0x72, 0x2d, 0x66,
                                            0x75, 0x7a, 0x7a, 0x21};
static const char secret[] = "fuzz-secret";
static int proved; /* the assist put a correct MAC in the last message */

static hvd_hs_code admit(void *ctx, int kind, int rank, int index, char *why,
                         size_t whylen) {
    (void)ctx;
    (void)kind;
    if (rank < 1 || rank > 7 || index > 3) {
        snprintf(why, whylen, "rank %d index %d not expected", rank, index);
        return HVD_HS_UNEXPECTED;
    }
    return HVD_HS_OK;
}

static void hmac3(const char *label, const uint8_t *a, size_t na,
                  const uint8_t *b, size_t nb, const uint8_t *c, size_t nc,
                  uint8_t out[32]) {
    uint8_t msg[256];
    size_t len = strlen(label);
    unsigned int outlen = 0;

    memcpy(msg, label, len);
    memcpy(msg + len, a, na);
    len += na;
    memcpy(msg + len, b, nb);
    len += nb;
    memcpy(msg + len, c, nc);
    len += nc;
    HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, len, out, &outlen);
}

/* A handshake that succeeded derives the connection's keys. */
static void keys_of(const hvd_hs *hs) {
    uint8_t c2s[HVD_PROTECT_KEY], s2c[HVD_PROTECT_KEY];

    if (hvd_hs_keys(hs, "fuzz", c2s, s2c) != HVD_OK)
        __builtin_trap();
}

/* Copies the next message of n bytes (zero-padded) from the input. */
static void take(uint8_t *msg, size_t n, const uint8_t **p, size_t *left) {
    size_t k = *left < n ? *left : n;

    memset(msg, 0, n);
    memcpy(msg, *p, k);
    *p += k;
    *left -= k;
}

static void as_server(const uint8_t *p, size_t left, int assist, int protect) {
    hvd_hs hs;
    uint8_t msg[HVD_HS_MAX_MSG];

    hvd_hs_server_init(&hs, job, secret, HVD_HS_KIND_DATA, 0, admit, NULL);
    hvd_hs_set_protect(&hs, protect);
    proved = 0;
    while (hvd_hs_need(&hs) > 0 && left > 0) {
        size_t n = hvd_hs_need(&hs);
        take(msg, n, &p, &left);
        if (assist && n == HVD_HS_RESPONSE_LEN) {
            hmac3("hvd-cli", hs.hello, HVD_HS_HELLO_LEN, hs.nonce_s,
                  HVD_HS_NONCE, hs.mac_s, HVD_HS_MAC, msg + 8);
            proved = 1;
        }
        if (hvd_hs_input(&hs, msg, n) != HVD_OK)
            return;
        hs.out_off = hs.out_len; /* "sent" */
    }
    if (hvd_hs_done(&hs)) {
        if (!proved || hs.peer_kind != HVD_HS_KIND_DATA || hs.peer_rank < 1 ||
            hs.peer_rank > 7 || hs.peer_index > 3 ||
            hs.peer_protect != protect ||
            memcmp(hs.hello + 8, job, HVD_JOB_ID_LEN) != 0)
            __builtin_trap();
        keys_of(&hs);
    }
}

static void as_client(const uint8_t *p, size_t left, int assist,
                      int expect_rank, int protect) {
    hvd_hs hs;
    uint8_t msg[HVD_HS_MAX_MSG];

    if (hvd_hs_client_init(&hs, job, secret, HVD_HS_KIND_DATA, 3, 1,
                           expect_rank) != HVD_OK)
        return;
    hvd_hs_set_protect(&hs, protect);
    hs.out_off = hs.out_len; /* the HELLO is "sent" */
    proved = 0;
    while (hvd_hs_need(&hs) > 0 && left > 0) {
        size_t n = hvd_hs_need(&hs);
        take(msg, n, &p, &left);
        if (assist && n == HVD_HS_CHALLENGE_LEN) {
            /* The server's proof over our hello, its rank and nonce. */
            hmac3("hvd-srv", hs.hello, HVD_HS_HELLO_LEN, msg + 8, 4, msg + 16,
                  HVD_HS_NONCE, msg + 48);
            proved = 1;
        }
        if (hvd_hs_input(&hs, msg, n) != HVD_OK)
            return;
        hs.out_off = hs.out_len;
    }
    if (hvd_hs_done(&hs)) {
        if (!proved || (expect_rank >= 0 && hs.peer_rank != expect_rank) ||
            hs.peer_protect != protect)
            __builtin_trap();
        keys_of(&hs);
    }
}

/* The same over a socket: the peer's bytes arrive as they come. */
static void over_socket(const uint8_t *p, size_t left, int client,
                        int protect) {
    int sv[2];
    hvd_hs hs;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        return;
    if (left > 4096)
        left = 4096;
    if (left > 0 && write(sv[1], p, left) < 0) {
        close(sv[0]);
        close(sv[1]);
        return;
    }
    close(sv[1]); /* EOF after the input: the handshake cannot stall */
    if (client) {
        if (hvd_hs_client_init(&hs, job, secret, HVD_HS_KIND_DATA, 3, 1, -1) ==
            HVD_OK) {
            hvd_hs_set_protect(&hs, protect);
            hvd_hs_run(&hs, sv[0], hvd_now_ns() + 1000000000LL);
        }
    } else {
        hvd_hs_server_init(&hs, job, secret, HVD_HS_KIND_DATA, 0, admit, NULL);
        hvd_hs_set_protect(&hs, protect);
        hvd_hs_run(&hs, sv[0], hvd_now_ns() + 1000000000LL);
    }
    close(sv[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t mode;
    int protect;

    if (size < 1)
        return 0;
    mode = data[0];
    protect = (mode & 16) ? HVD_PROTECT_INTEGRITY : HVD_PROTECT_NONE;
    if (mode & 8)
        over_socket(data + 1, size - 1, mode & 1, protect);
    else if (mode & 1)
        as_client(data + 1, size - 1, mode & 2, (mode & 4) ? 0 : -1, protect);
    else
        as_server(data + 1, size - 1, mode & 2, protect);
    return 0;
}
