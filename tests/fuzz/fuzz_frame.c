/*
 * Fuzz target: the TCP wire format after the handshake.
 *
 * First the frame codec alone (transport/tcp/frame.c): the input is read
 * as a stream of frames as a receiver reads it (headers with increasing
 * sequence numbers, payloads skipped, ABORT payloads decoded), and every
 * header that decodes must encode back to the same bytes, every ABORT
 * payload must decode the same after a round trip.
 *
 * Then the real receive path of the transport (transport/tcp/tcp.c) over
 * socketpairs: a 2-rank transport whose peer is this program. Input
 * layout after the codec pass:
 *
 *   byte 0   bits 0-1: data sockets - 1 (1 to 3, striping from 64 bytes)
 *            bit 2: close the peer's ends afterwards (EOF), else leave
 *                   them open
 *            bit 3: also post a send to the peer
 *            bits 4-5: data receives posted - 1 (1 to 4)
 *            bit 6: post a control-channel receive of 16 bytes
 *            bit 7: HVD_TCP_PROTECT=integrity (else none)
 *   then     2 bytes (little-endian) per data receive: its length
 *   then     chunks: 1 byte socket index (mod sockets; with integrity,
 *            bit 7 set: "seal", see below), 2 bytes length, that many
 *            bytes written to that socket by the peer
 *
 * With integrity, a chunk whose socket byte has bit 7 set is one frame in
 * the clear (a header and what follows of its payload) that the harness
 * seals as the peer's transport would, with the keys the transport
 * derives for connected sockets (setup.c, connected_keys): the header's
 * record, the payload in it when the header claims at most 4096 bytes
 * (one tag after both), else the header's tag and the payload as a record
 * of its own. Other chunks go as they are (forged records).
 *
 * progress() then runs until every request is done or 32 rounds pass.
 * Whatever the bytes, the transport must fail cleanly or complete the
 * requests, never read or write out of bounds (ASan) or hang.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/log.h"
#include "transport/base/wire.h"
#include "transport/bootstrap/protect.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp.h"

#define MAX_RECVS 4
#define MAX_SOCKS 3
/* transport/tcp/tcp_internal.h's INLINE_MAX: a payload of at most this
 * many bytes shares its header's record. */
#define SEAL_INLINE_MAX 4096

/* The peer's sealing state for each of its sockets. */
typedef struct sealer {
    hvd_aead a[MAX_SOCKS + 1];
    uint64_t ctr[MAX_SOCKS + 1];
    int ready[MAX_SOCKS + 1];
} sealer;

/* The peer's (rank 1's) sending key for socket index, as
 * hvd_tcp_open_connected derives it with no secret: rank 1 is the higher
 * rank and sends with the first key. 0 on success. */
static int sealer_init(sealer *sl, int index) {
    uint8_t info[32] = "hvd tcp connected v1";
    uint8_t keys[2 * HVD_PROTECT_KEY];

    if (sl->ready[index])
        return 0;
    hvd_put32(info + 20, 0);
    hvd_put32(info + 24, 1);
    hvd_put32(info + 28, (uint32_t)index);
    if (hvd_protect_hkdf("", (const uint8_t *)"", 0, info, sizeof(info), keys,
                         sizeof(keys)) != HVD_OK ||
        hvd_aead_init(&sl->a[index], HVD_PROTECT_INTEGRITY, 1, keys) != HVD_OK)
        return -1;
    sl->ready[index] = 1;
    return 0;
}

/* Seals frame b (n bytes: a header and what follows of its payload) as the
 * peer's next one on socket index into out (n + 2 tags of room). Returns
 * the bytes to write; n unchanged when it cannot be sealed. */
static size_t seal_chunk(sealer *sl, int index, const uint8_t *b, size_t n,
                         uint8_t *out) {
    hvd_aead *a = &sl->a[index];
    size_t pay, k;

    memcpy(out, b, n);
    if (n < HVD_FRAME_HDR_LEN || sealer_init(sl, index) != 0)
        return n;
    pay = n - HVD_FRAME_HDR_LEN;
    if (hvd_get64(b + 16) <= SEAL_INLINE_MAX) {
        if (hvd_aead_seal(a, sl->ctr[index]++, out, n, out + n) != 0)
            return n;
        return n + HVD_PROTECT_TAG;
    }
    k = HVD_FRAME_HDR_LEN;
    if (hvd_aead_seal(a, sl->ctr[index], out, k, out + k) != 0)
        return n;
    k += HVD_PROTECT_TAG;
    memcpy(out + k, b + HVD_FRAME_HDR_LEN, pay);
    if (pay > 0 &&
        hvd_aead_seal(a, sl->ctr[index] + 1, out + k, pay, out + k + pay) != 0)
        return n;
    sl->ctr[index] += 2;
    return k + pay + (pay > 0 ? HVD_PROTECT_TAG : 0);
}

static void codec(const uint8_t *data, size_t size) {
    size_t off = 0;
    uint32_t seq = 0;

    while (size - off >= HVD_FRAME_HDR_LEN) {
        hvd_frame f;
        uint8_t again[HVD_FRAME_HDR_LEN];

        if (hvd_frame_decode(data + off, size - off, seq, &f) != HVD_OK) {
            /* A receiver would stop here; try the next sequence number
             * and offset to cover more headers. */
            off++;
            continue;
        }
        hvd_frame_encode(&f, again);
        if (memcmp(again, data + off, HVD_FRAME_HDR_LEN) != 0)
            __builtin_trap(); /* decode and encode disagree */
        off += HVD_FRAME_HDR_LEN;
        seq++;
        size_t avail = size - off;
        if (f.type == HVD_FRAME_ABORT && f.len <= avail) {
            hvd_frame_abort a, b;
            uint8_t buf[HVD_FRAME_ABORT_MAX];
            if (hvd_frame_abort_decode(data + off, (size_t)f.len, &a) ==
                HVD_OK) {
                size_t n = hvd_frame_abort_encode(&a, buf);
                if (hvd_frame_abort_decode(buf, n, &b) != HVD_OK ||
                    b.status != a.status || b.culprit != a.culprit ||
                    b.origin != a.origin || strcmp(a.text, b.text) != 0)
                    __builtin_trap();
            }
        }
        off += f.len < avail ? (size_t)f.len : avail;
    }
}

static int get16(const uint8_t **p, size_t *left) {
    int v;

    if (*left < 2)
        return -1;
    v = (*p)[0] | (*p)[1] << 8;
    *p += 2;
    *left -= 2;
    return v;
}

static void transport(const uint8_t *data, size_t size) {
    const uint8_t *p = data;
    size_t left = size;
    int sv[2 * (MAX_SOCKS + 1)][2];
    int fds[2 * (MAX_SOCKS + 1)];
    hvd_transport_params params;
    hvd_transport *tp = NULL;
    hvd_req reqs[MAX_RECVS + 2];
    uint8_t *bufs[MAX_RECVS + 1] = {NULL};
    uint8_t ctrl[16], out[100] = {0};
    int nsocks, nconn, nrecv, nreq = 0, npairs = 0;
    uint8_t flags;
    static sealer sl;
    static uint8_t sealed[65536 + 2 * HVD_PROTECT_TAG];

    memset(&sl, 0, sizeof(sl));
    if (left < 1)
        return;
    flags = *p++;
    left--;
    nsocks = 1 + (flags & 3) % MAX_SOCKS;
    nconn = nsocks + 1;
    nrecv = 1 + ((flags >> 4) & 3);

    memset(&params, 0, sizeof(params));
    params.rank = 0;
    params.size = 2;
    char nsocks_text[16];
    snprintf(nsocks_text, sizeof(nsocks_text), "%d", nsocks);
    hvd_env_var settings[] = {
        {"HVD_TCP_NSOCKS", nsocks_text},
        {"HVD_TCP_STRIPE_MIN", "64"},
        {"HVD_TCP_PROTECT", (flags & 0x80) ? "integrity" : "none"},
        {NULL, NULL}};
    params.env = hvd_env_vars_get;
    params.env_ctx = settings;
    params.timeout_ns = 3600 * 1000000000LL;
    params.connect_timeout_ns = 1000000000LL;

    for (int k = 0; k < nconn; k++) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                       sv[k]) != 0)
            goto out;
        npairs++;
        fds[k] = -1; /* rank 0's own row */
        fds[nconn + k] = sv[k][0];
    }
    if (hvd_tcp_open_connected(&params, fds, &tp) != HVD_OK) {
        for (int k = 0; k < npairs; k++)
            close(sv[k][0]);
        goto out;
    }

    for (int i = 0; i < nrecv; i++) {
        int len = get16(&p, &left);
        if (len < 0)
            break;
        bufs[i] = malloc((size_t)len + 1);
        if (bufs[i] == NULL ||
            tp->ops->irecv(tp, 1, HVD_CHANNEL_DATA, bufs[i], (size_t)len,
                           &reqs[nreq]) != HVD_OK)
            break;
        nreq++;
    }
    if ((flags & 0x40) && tp->ops->irecv(tp, 1, HVD_CHANNEL_CONTROL, ctrl,
                                         sizeof(ctrl), &reqs[nreq]) == HVD_OK)
        nreq++;
    if ((flags & 0x08) && tp->ops->isend(tp, 1, HVD_CHANNEL_DATA, out,
                                         sizeof(out), &reqs[nreq]) == HVD_OK)
        nreq++;

    /* The peer's bytes. */
    while (left >= 3) {
        int k = (p[0] & 0x7f) % nconn;
        int seal = (flags & 0x80) && (p[0] & 0x80);
        size_t len = (size_t)(p[1] | p[2] << 8);
        p += 3;
        left -= 3;
        if (len > left)
            len = left;
        const uint8_t *w = p;
        size_t wlen = len;
        if (seal) {
            wlen = seal_chunk(&sl, k, p, len, sealed);
            w = sealed;
        }
        if (wlen > 0 && write(sv[k][1], w, wlen) < 0)
            break; /* the socket buffer is full: enough */
        p += len;
        left -= len;
    }
    if (flags & 0x04) {
        for (int k = 0; k < nconn; k++) {
            close(sv[k][1]);
            sv[k][1] = -1;
        }
    }

    for (int round = 0; round < 32; round++) {
        int pending = 0;
        for (int i = 0; i < nreq; i++)
            pending += !reqs[i].done;
        if (pending == 0)
            break;
        if (tp->ops->progress(tp, 0) != HVD_OK)
            break; /* every request is done now, with the failure */
    }
    for (int i = 0; i < nreq; i++)
        if (tp->ops->progress(tp, 0) == HVD_OK && !reqs[i].done &&
            (flags & 0x04) && reqs[i].status != HVD_OK)
            __builtin_trap(); /* a failed request must be done */

out:
    if (tp != NULL)
        tp->ops->close(tp);
    for (int k = 0; k < npairs; k++)
        if (sv[k][1] >= 0)
            close(sv[k][1]);
    for (int i = 0; i < MAX_RECVS; i++)
        free(bufs[i]);
    for (int k = 0; k <= MAX_SOCKS; k++)
        if (sl.ready[k])
            hvd_aead_free(&sl.a[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Protocol errors are the point here: no warnings (run-fuzzers also
     * closes the target's stderr; sanitizer reports still get out). */
    hvd_log_current = HVD_LOG_ERROR;
    codec(data, size);
    transport(data, size);
    return 0;
}
