/* The transport suite's cases (suite.h says what each checks). */
#include "suite.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/env.h"
#include "transport/base/error.h"

#include "../integration/testutil.h"

/* The case each rank (process or thread) runs, for suite_fail. */
static _Thread_local const suite_rank *cur_rank;
static _Thread_local const char *cur_case;

void suite_fail(const char *fmt, ...) {
    va_list ap;

    printf(
        "FAIL transport %s %s rank %d: ", cur_rank ? cur_rank->transport : "?",
        cur_case ? cur_case : "?", cur_rank ? cur_rank->rank : -1);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    _exit(1);
}

/* Waits for req, bounded; the status it ended with. */
static hvd_status wait_req(suite_rank *c, hvd_req *req, double limit_s) {
    double end = now_s() + limit_s;

    while (!req->done) {
        hvd_status st = c->ops->progress(c->tp, 10);
        if (st != HVD_OK && !req->done)
            suite_fail("progress failed before the request ended: %s",
                       hvd_last_error());
        if (now_s() > end)
            suite_fail("a request did not finish in %.0f s", limit_s);
    }
    return req->status;
}

static void wait_all(suite_rank *c, hvd_req *reqs, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (wait_req(c, &reqs[i], 60) != HVD_OK)
            suite_fail("request %zu failed: %s", i, hvd_last_error());
}

static uint8_t pattern(int src, int dst, int channel, int k, size_t i) {
    return (uint8_t)(src * 31 + dst * 17 + channel * 7 + k * 5 + (int)i * 3);
}

/* A received message's guard byte (0xEE after its len bytes) is intact:
 * nothing was written past its end. Frees both buffers. */
static void guard_free(uint8_t *sbuf, uint8_t *rbuf, size_t len) {
    if (rbuf[len] != 0xEE)
        suite_fail("a receive of %zu bytes wrote past its end", len);
    free(sbuf);
    free(rbuf);
}

static void batch_free(hvd_req *sreq, hvd_req *rreq, uint8_t **sbuf,
                       uint8_t **rbuf) {
    free(sreq);
    free(rreq);
    free(sbuf);
    free(rbuf);
}

static const size_t sizes[] = {
    0, 1, 2, 3, 7, 8, 63, 4093, 65536, 65537, (1u << 20) + 3};
enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };

/* order: every size, both channels, every peer; receives first or last. */
static void case_order(suite_rank *c) {
    size_t n = (size_t)(c->size > 1 ? c->size - 1 : 0) * 2 * NSIZES;

    for (int recv_first = 1; recv_first >= 0; recv_first--) {
        hvd_req *sreq = calloc(n, sizeof(*sreq));
        hvd_req *rreq = calloc(n, sizeof(*rreq));
        uint8_t **sbuf = calloc(n, sizeof(*sbuf));
        uint8_t **rbuf = calloc(n, sizeof(*rbuf));
        int i = 0;

        for (int p = 0; p < c->size; p++) {
            if (p == c->rank)
                continue;
            for (int ch = 0; ch < 2; ch++)
                for (int k = 0; k < NSIZES; k++, i++) {
                    sbuf[i] = malloc(sizes[k] + 1);
                    rbuf[i] = malloc(sizes[k] + 1);
                    for (size_t b = 0; b < sizes[k]; b++)
                        sbuf[i][b] = pattern(c->rank, p, ch, k, b);
                    memset(rbuf[i], 0xEE, sizes[k] + 1);
                }
        }
        for (int phase = 0; phase < 2; phase++) {
            int recv_now = (phase == 0) == recv_first;
            i = 0;
            for (int p = 0; p < c->size; p++) {
                if (p == c->rank)
                    continue;
                for (int ch = 0; ch < 2; ch++)
                    for (int k = 0; k < NSIZES; k++, i++) {
                        hvd_status st =
                            recv_now ? c->ops->irecv(c->tp, p, ch, rbuf[i],
                                                     sizes[k], &rreq[i])
                                     : c->ops->isend(c->tp, p, ch, sbuf[i],
                                                     sizes[k], &sreq[i]);
                        if (st != HVD_OK)
                            suite_fail("%s of %zu bytes to/from rank %d: %s",
                                       recv_now ? "irecv" : "isend", sizes[k],
                                       p, hvd_last_error());
                    }
            }
        }
        wait_all(c, sreq, n);
        wait_all(c, rreq, n);
        i = 0;
        for (int p = 0; p < c->size; p++) {
            if (p == c->rank)
                continue;
            for (int ch = 0; ch < 2; ch++)
                for (int k = 0; k < NSIZES; k++, i++) {
                    for (size_t b = 0; b < sizes[k]; b++)
                        if (rbuf[i][b] != pattern(p, c->rank, ch, k, b))
                            suite_fail("message %d of %zu bytes from rank %d, "
                                       "channel %d: byte %zu is %u, not %u",
                                       k, sizes[k], p, ch, b, rbuf[i][b],
                                       pattern(p, c->rank, ch, k, b));
                    guard_free(sbuf[i], rbuf[i], sizes[k]);
                }
        }
        batch_free(sreq, rreq, sbuf, rbuf);
    }
}

/* zeros: messages whose ends are zero bytes, from none to all of them
 * (shared memory does not copy the zeros at the end of a small control
 * message; its receiver writes them). */
static const size_t zlens[] = {1,  7,   8,   9,   16,   63,   64,
                               65, 255, 256, 257, 4095, 4096, 4097};
enum { NZLENS = sizeof(zlens) / sizeof(zlens[0]), NZ = 7 };

static size_t zeros_at_end(size_t len, int v) {
    const size_t z[NZ] = {0, 1, 7, 8, 9, len / 2, len};
    return z[v] < len ? z[v] : len;
}

static void case_zeros(suite_rank *c) {
    size_t n = (size_t)(c->size - 1) * 2 * NZLENS * NZ, i = 0;
    hvd_req *sreq = calloc(n, sizeof(*sreq));
    hvd_req *rreq = calloc(n, sizeof(*rreq));
    uint8_t **sbuf = calloc(n, sizeof(*sbuf));
    uint8_t **rbuf = calloc(n, sizeof(*rbuf));

    for (int phase = 0; phase < 2; phase++) {
        i = 0;
        for (int p = 0; p < c->size; p++)
            for (int ch = 0; ch < 2 && p != c->rank; ch++)
                for (int k = 0; k < NZLENS; k++)
                    for (int v = 0; v < NZ; v++, i++) {
                        size_t len = zlens[k];
                        hvd_status st;
                        if (phase == 0) {
                            rbuf[i] = malloc(len + 1);
                            memset(rbuf[i], 0xEE, len + 1);
                            st = c->ops->irecv(c->tp, p, ch, rbuf[i], len,
                                               &rreq[i]);
                        } else {
                            size_t z = zeros_at_end(len, v);
                            sbuf[i] = malloc(len);
                            for (size_t b = 0; b < len; b++)
                                sbuf[i][b] = b < len - z
                                                 ? (uint8_t)(pattern(c->rank, p,
                                                                     ch, k, b) |
                                                             1)
                                                 : 0;
                            st = c->ops->isend(c->tp, p, ch, sbuf[i], len,
                                               &sreq[i]);
                        }
                        if (st != HVD_OK)
                            suite_fail("%s of %zu bytes: %s",
                                       phase == 0 ? "irecv" : "isend", len,
                                       hvd_last_error());
                    }
    }
    wait_all(c, sreq, n);
    wait_all(c, rreq, n);
    i = 0;
    for (int p = 0; p < c->size; p++)
        for (int ch = 0; ch < 2 && p != c->rank; ch++)
            for (int k = 0; k < NZLENS; k++)
                for (int v = 0; v < NZ; v++, i++) {
                    size_t len = zlens[k], z = zeros_at_end(len, v);
                    for (size_t b = 0; b < len; b++) {
                        uint8_t want =
                            b < len - z
                                ? (uint8_t)(pattern(p, c->rank, ch, k, b) | 1)
                                : 0;
                        if (rbuf[i][b] != want)
                            suite_fail("a message of %zu bytes ending in %zu "
                                       "zeros from rank %d, channel %d: byte "
                                       "%zu is %u, not %u",
                                       len, z, p, ch, b, rbuf[i][b], want);
                    }
                    guard_free(sbuf[i], rbuf[i], len);
                }
    batch_free(sreq, rreq, sbuf, rbuf);
}

/* Sends msgs to peer with isendv where the transport has it, else as
 * isends (the semantics isendv promises). */
static void send_batch(suite_rank *c, int peer, int ch, const hvd_sendv *msgs,
                       int n, hvd_req *reqs) {
    hvd_status st = HVD_OK;

    if (c->ops->isendv != NULL)
        st = c->ops->isendv(c->tp, peer, ch, msgs, n, reqs);
    else
        for (int i = 0; i < n && st == HVD_OK; i++)
            st = c->ops->isend(c->tp, peer, ch, msgs[i].buf, msgs[i].len,
                               &reqs[i]);
    if (st != HVD_OK)
        suite_fail("isendv of %d messages to rank %d: %s", n, peer,
                   hvd_last_error());
}

/* sendv: to every peer on both channels, a plain send (still queued when
 * the batch comes: 1 MiB + 3), then two batches of every size; each
 * message is matched by its own receive, half of them posted before the
 * sends and half after. Contents and order exact. */
static void case_sendv(suite_rank *c) {
    enum { PER = 1 + 2 * NSIZES };
    size_t n = (size_t)(c->size - 1) * 2 * PER;
    hvd_req *sreq = calloc(n, sizeof(*sreq)), *rreq = calloc(n, sizeof(*rreq));
    uint8_t **sbuf = calloc(n, sizeof(*sbuf)),
            **rbuf = calloc(n, sizeof(*rbuf));
    size_t *len = calloc(n, sizeof(*len));
    hvd_sendv msgs[NSIZES];

    for (size_t i = 0; i < n; i++) {
        size_t m = i % PER; /* 0: the plain send; then two batches */
        len[i] = m == 0 ? sizes[NSIZES - 1] : sizes[(m - 1) % NSIZES];
        sbuf[i] = malloc(len[i] + 1);
        rbuf[i] = malloc(len[i] + 1);
        memset(rbuf[i], 0xEE, len[i] + 1);
    }
    for (int phase = 0; phase < 3; phase++) {
        size_t i = 0;
        for (int p = 0; p < c->size; p++) {
            if (p == c->rank)
                continue;
            for (int ch = 0; ch < 2; ch++, i += PER) {
                int early = (p + ch) % 2 == 0; /* receives before sends */
                if ((phase == 0 && early) || (phase == 2 && !early)) {
                    for (size_t m = 0; m < PER; m++)
                        if (c->ops->irecv(c->tp, p, ch, rbuf[i + m], len[i + m],
                                          &rreq[i + m]) != HVD_OK)
                            suite_fail("irecv from rank %d: %s", p,
                                       hvd_last_error());
                    continue;
                }
                if (phase != 1)
                    continue;
                for (size_t m = 0; m < PER; m++)
                    for (size_t b = 0; b < len[i + m]; b++)
                        sbuf[i + m][b] = pattern(c->rank, p, ch, (int)m, b);
                if (c->ops->isend(c->tp, p, ch, sbuf[i], len[i], &sreq[i]) !=
                    HVD_OK)
                    suite_fail("isend to rank %d: %s", p, hvd_last_error());
                for (int batch = 0; batch < 2; batch++) {
                    size_t at = i + 1 + (size_t)batch * NSIZES;
                    for (int k = 0; k < NSIZES; k++)
                        msgs[k] = (hvd_sendv){sbuf[at + k], len[at + k]};
                    send_batch(c, p, ch, msgs, NSIZES, &sreq[at]);
                }
            }
        }
    }
    wait_all(c, sreq, n);
    wait_all(c, rreq, n);
    for (size_t i = 0; i < n; i++) {
        int p = (int)(i / (2 * PER)), ch = (int)(i / PER % 2);
        size_t m = i % PER;
        p += p >= c->rank;
        for (size_t b = 0; b < len[i]; b++)
            if (rbuf[i][b] != pattern(p, c->rank, ch, (int)m, b))
                suite_fail("message %zu of %zu bytes from rank %d, channel "
                           "%d: byte %zu is %u, not %u",
                           m, len[i], p, ch, b, rbuf[i][b],
                           pattern(p, c->rank, ch, (int)m, b));
        if (rbuf[i][len[i]] != 0xEE)
            suite_fail("a receive of %zu bytes wrote past its end", len[i]);
        free(sbuf[i]);
        free(rbuf[i]);
    }
    free(sreq);
    free(rreq);
    free(sbuf);
    free(rbuf);
    free(len);
}

/* control: the control channel is not held up by waiting data. Rank 0 and
 * rank 1 only; the others idle. */
static void case_control(suite_rank *c) {
    size_t big = (size_t)64 << 20;
    uint8_t *data = NULL;
    hvd_req dreq = {0};
    int peer = c->rank == 0 ? 1 : 0;

    if (c->rank > 1)
        return;
    data = calloc(big, 1);
    if (c->rank == 0 &&
        c->ops->isend(c->tp, 1, HVD_CHANNEL_DATA, data, big, &dreq) != HVD_OK)
        suite_fail("isend of 64 MiB: %s", hvd_last_error());
    for (int round = 0; round < 200; round++) {
        uint32_t out = (uint32_t)(round * 2 + c->rank), in = 0;
        hvd_req s = {0}, r = {0};
        if (c->ops->irecv(c->tp, peer, HVD_CHANNEL_CONTROL, &in, sizeof(in),
                          &r) != HVD_OK ||
            c->ops->isend(c->tp, peer, HVD_CHANNEL_CONTROL, &out, sizeof(out),
                          &s) != HVD_OK)
            suite_fail("control round %d: %s", round, hvd_last_error());
        if (wait_req(c, &s, 30) != HVD_OK || wait_req(c, &r, 30) != HVD_OK)
            suite_fail("control round %d failed: %s", round, hvd_last_error());
        if (in != (uint32_t)(round * 2 + peer))
            suite_fail("control round %d: got %u", round, in);
    }
    /* Only now is the data received. */
    if (c->rank == 1 &&
        c->ops->irecv(c->tp, 0, HVD_CHANNEL_DATA, data, big, &dreq) != HVD_OK)
        suite_fail("irecv of 64 MiB: %s", hvd_last_error());
    if (wait_req(c, &dreq, 60) != HVD_OK)
        suite_fail("the 64 MiB message failed: %s", hvd_last_error());
    free(data);
}

/* The case's waiter: set just before it calls progress(-1). */
static _Atomic int wake_armed;

static void *waker(void *arg) {
    suite_rank *c = arg;
    struct timespec look = {0, 1000 * 1000};

    /* Bounded poll for the waiter's announcement (it comes at once); a
     * wake() before the blocking call must end it as well as one during
     * it, so the order within that window does not matter. */
    for (int i = 0; i < 10000 && !atomic_load(&wake_armed); i++)
        nanosleep(&look, NULL);
    c->ops->wake(c->tp);
    return NULL;
}

/* wake: a progress call waiting for nothing returns after wake(). */
static void case_wake(suite_rank *c) {
    pthread_t t;

    /* Drain what open left to do first. */
    for (int i = 0; i < 10; i++)
        c->ops->progress(c->tp, 0);
    atomic_store(&wake_armed, 0);
    pthread_create(&t, NULL, waker, c);
    double t0 = now_s();
    atomic_store(&wake_armed, 1);
    hvd_status st = c->ops->progress(c->tp, -1);
    double dt = now_s() - t0;
    pthread_join(t, NULL);
    if (st != HVD_OK)
        suite_fail("progress(-1) failed: %s", hvd_last_error());
    if (dt > 3.0)
        suite_fail("progress(-1) returned %.1f s after wake()", dt);
}

/* Every rank ends up failed, each within the timeout, after what (rank 0
 * sent rank 1 a message that does not fit its receive): rank 1 sees the
 * mismatch and names rank 0, the others hear of it (or see it go).
 * Returns the failure. */
static hvd_status await_mismatch(suite_rank *c, const char *what) {
    double end = now_s() + 4 * SUITE_TIMEOUT_S;
    hvd_status st = HVD_OK;

    while (st == HVD_OK && now_s() < end)
        st = c->ops->progress(c->tp, 10);
    if (st == HVD_OK)
        suite_fail("no error in %d s after %s", 4 * SUITE_TIMEOUT_S, what);
    if (c->rank == 1 && strstr(hvd_last_error(), "rank 0") == NULL)
        suite_fail("the sentence does not name rank 0: %s", hvd_last_error());
    return st;
}

/* mismatch: rank 1 expects 16 bytes from rank 0, which sends 8. */
static void case_mismatch(suite_rank *c) {
    uint8_t buf[16] = {0}, other[4];
    hvd_req s = {0}, r = {0}, r2 = {0};

    if (c->rank == 0) {
        if (c->ops->isend(c->tp, 1, HVD_CHANNEL_DATA, buf, 8, &s) != HVD_OK)
            suite_fail("isend: %s", hvd_last_error());
    } else if (c->rank == 1) {
        /* A second receive, from rank 0 on the control channel, is in
         * flight too: the failure must complete it. */
        if (c->ops->irecv(c->tp, 0, HVD_CHANNEL_CONTROL, other, sizeof(other),
                          &r2) != HVD_OK ||
            c->ops->irecv(c->tp, 0, HVD_CHANNEL_DATA, buf, 16, &r) != HVD_OK)
            suite_fail("irecv: %s", hvd_last_error());
    }
    hvd_status st = await_mismatch(c, "a length mismatch");
    if (c->rank == 1 &&
        (!r.done || !r2.done || r.status == HVD_OK || r2.status == HVD_OK))
        suite_fail("the receives in flight did not fail with the transport");
    if (c->ops->progress(c->tp, 0) != st)
        suite_fail("a later call did not return the failure again");
}

/* kill: the last rank leaves without a word; the others' receives fail. */
static void case_kill(suite_rank *c) {
    int victim = c->size - 1;
    uint8_t bufs[SUITE_MAX_RANKS][8];
    hvd_req reqs[SUITE_MAX_RANKS] = {{0}};

    if (c->rank == victim) {
        /* Leaves once every other rank said its receives are posted (a
         * control message each), not after a guessed delay. */
        double end = now_s() + 4 * SUITE_TIMEOUT_S;
        for (int p = 0; p < c->size; p++) {
            if (p == victim)
                continue;
            if (c->ops->irecv(c->tp, p, HVD_CHANNEL_CONTROL, bufs[p], 1,
                              &reqs[p]) != HVD_OK)
                suite_fail("irecv of rank %d's ready: %s", p, hvd_last_error());
            while (!reqs[p].done && now_s() < end)
                c->ops->progress(c->tp, 10);
            if (!reqs[p].done || reqs[p].status != HVD_OK)
                suite_fail("no ready from rank %d", p);
        }
        c->leave(c);
        return;
    }
    for (int p = 0; p < c->size; p++)
        if (p != c->rank && c->ops->irecv(c->tp, p, HVD_CHANNEL_DATA, bufs[p],
                                          8, &reqs[p]) != HVD_OK)
            suite_fail("irecv from rank %d: %s", p, hvd_last_error());
    hvd_req ready = {0};
    uint8_t one = 1;
    if (c->ops->isend(c->tp, victim, HVD_CHANNEL_CONTROL, &one, 1, &ready) !=
        HVD_OK)
        suite_fail("isend of ready to rank %d: %s", victim, hvd_last_error());
    double t0 = now_s();
    hvd_status st = HVD_OK;
    while (st == HVD_OK && now_s() - t0 < 4 * SUITE_TIMEOUT_S)
        st = c->ops->progress(c->tp, 10);
    if (st == HVD_OK)
        suite_fail("no error in %d s after rank %d died", 4 * SUITE_TIMEOUT_S,
                   victim);
    for (int p = 0; p < c->size; p++)
        if (p != c->rank && (!reqs[p].done || reqs[p].status == HVD_OK))
            suite_fail("the receive from rank %d did not fail", p);
    if (!names_rank(hvd_last_error(), victim))
        suite_fail("the sentence does not name rank %d: %s", victim,
                   hvd_last_error());
}

/* pending: sent, never received; then shutdown and close, bounded. */
static void case_pending(suite_rank *c) {
    uint8_t small[3][100];
    hvd_req s[3] = {{0}};

    memset(small, 1, sizeof(small));
    if (c->rank == 0)
        for (int k = 0; k < 3; k++)
            if (c->ops->isend(c->tp, 1, HVD_CHANNEL_DATA, small[k],
                              sizeof(small[k]), &s[k]) != HVD_OK)
                suite_fail("isend: %s", hvd_last_error());
    /* Small messages are sent without their receive (eagerly). */
    for (int k = 0; c->rank == 0 && k < 3; k++)
        wait_req(c, &s[k], 30);
    double t0 = now_s();
    hvd_status st = c->ops->shutdown(c->tp);
    if (now_s() - t0 > 30)
        suite_fail("shutdown took %.0f s", now_s() - t0);
    (void)st; /* OK, or an error naming the unread messages: either */
}

/* upto: messages of every length up to HVD_UPTO_MAX on the control
 * channel, each taken by an irecv_upto of a cap at least its length (the
 * most, or between its length and the most), every third one by an exact
 * irecv among them; to and from every peer, receives posted before the
 * sends and after, some sent two in a batch. */
/* clang-format off */
static const size_t upto_lens[] = {
    0, 1, 7, 8, 47, 48, 49, 63, 64, 200, 1023, 1024, 1025, 2047, 4000,
    HVD_UPTO_MAX - 1, HVD_UPTO_MAX};
/* clang-format on */
enum { NUPTO = sizeof(upto_lens) / sizeof(upto_lens[0]) };

/* The cap message k's receive gives; 0: an exact irecv. */
static size_t upto_cap(size_t len, int k) {
    if (k % 3 == 1)
        return 0;
    return k % 3 == 0 ? HVD_UPTO_MAX : len + (HVD_UPTO_MAX - len) / 2;
}

/* Posts the receive of message k from p into buf. */
static void upto_recv(suite_rank *c, int p, int k, uint8_t *buf, hvd_req *req) {
    size_t len = upto_lens[k], cap = upto_cap(len, k);
    hvd_status st;

    memset(buf, 0xEE, HVD_UPTO_MAX + 1);
    req->got = (size_t)-1;
    st = cap == 0
             ? c->ops->irecv(c->tp, p, HVD_CHANNEL_CONTROL, buf, len, req)
             : c->ops->irecv_upto(c->tp, p, HVD_CHANNEL_CONTROL, buf, cap, req);
    if (st != HVD_OK)
        suite_fail("receive of %zu bytes (cap %zu): %s", len, cap,
                   hvd_last_error());
}

/* Sends messages k (and k + 1 in one batch when batch) to p. */
static void upto_send(suite_rank *c, int p, int k, int round, int batch,
                      uint8_t **bufs, hvd_req *reqs) {
    hvd_sendv msgs[2];
    int n = batch ? 2 : 1;

    for (int j = 0; j < n; j++) {
        size_t len = upto_lens[k + j];
        bufs[j] = malloc(len + 1);
        for (size_t b = 0; b < len; b++)
            bufs[j][b] = pattern(c->rank, p, round, k + j, b);
        msgs[j] = (hvd_sendv){bufs[j], len};
    }
    send_batch(c, p, HVD_CHANNEL_CONTROL, msgs, n, reqs);
}

static void case_upto(suite_rank *c) {
    size_t n = (size_t)c->size * NUPTO;
    hvd_req *sreq = calloc(n, sizeof(*sreq));
    hvd_req *rreq = calloc(n, sizeof(*rreq));
    uint8_t **sbuf = calloc(n, sizeof(*sbuf));
    uint8_t **rbuf = calloc(n, sizeof(*rbuf));

    for (size_t i = 0; i < n; i++)
        rbuf[i] = malloc(HVD_UPTO_MAX + 1);
    /* Round 0 posts the receives first, round 1 the sends. */
    for (int round = 0; round < 2; round++) {
        for (int phase = 0; phase < 2; phase++)
            for (int p = 0; p < c->size; p++)
                for (int k = 0; k < NUPTO && p != c->rank; k++) {
                    size_t i = (size_t)p * NUPTO + (size_t)k;
                    int batch = k % 4 == 3 && k + 1 < NUPTO;
                    if (phase == round)
                        upto_recv(c, p, k, rbuf[i], &rreq[i]);
                    else {
                        upto_send(c, p, k, round, batch, &sbuf[i], &sreq[i]);
                        k += batch;
                    }
                }
        for (int p = 0; p < c->size; p++)
            if (p != c->rank) {
                wait_all(c, sreq + p * NUPTO, NUPTO);
                wait_all(c, rreq + p * NUPTO, NUPTO);
            }
        for (int p = 0; p < c->size; p++)
            for (int k = 0; k < NUPTO && p != c->rank; k++) {
                size_t i = (size_t)p * NUPTO + (size_t)k;
                size_t len = upto_lens[k], cap = upto_cap(len, k);
                if (cap != 0 && rreq[i].got != len)
                    suite_fail("irecv_upto (cap %zu) of a message of %zu "
                               "bytes from rank %d says %zu",
                               cap, len, p, rreq[i].got);
                for (size_t b = 0; b < len; b++)
                    if (rbuf[i][b] != pattern(p, c->rank, round, k, b))
                        suite_fail("a message of %zu bytes from rank %d: "
                                   "byte %zu is wrong",
                                   len, p, b);
                for (size_t b = len; b <= HVD_UPTO_MAX; b++)
                    if (rbuf[i][b] != 0xEE)
                        suite_fail("the receive of a message of %zu bytes "
                                   "wrote byte %zu",
                                   len, b);
                free(sbuf[i]);
                sbuf[i] = NULL;
            }
    }
    for (size_t i = 0; i < n; i++)
        free(rbuf[i]);
    batch_free(sreq, rreq, sbuf, rbuf);
}

/* upto_long: a control message longer than an irecv_upto's cap is a
 * mismatch on the receiver, which the others hear of (no hang). */
static void case_upto_long(suite_rank *c) {
    uint8_t buf[128] = {0};
    hvd_req s = {0}, r = {0};

    if (c->rank == 0 &&
        c->ops->isend(c->tp, 1, HVD_CHANNEL_CONTROL, buf, 100, &s) != HVD_OK)
        suite_fail("isend: %s", hvd_last_error());
    if (c->rank == 1 && c->ops->irecv_upto(c->tp, 0, HVD_CHANNEL_CONTROL, buf,
                                           64, &r) != HVD_OK)
        suite_fail("irecv_upto: %s", hvd_last_error());
    await_mismatch(c, "a message longer than the cap");
    if (c->rank == 1 && (!r.done || r.status == HVD_OK))
        suite_fail("the receive did not fail with the transport");
}

const suite_case suite_cases[] = {
    {"order", case_order, 2, 0},       {"sendv", case_sendv, 2, 0},
    {"control", case_control, 2, 0},   {"wake", case_wake, 1, 0},
    {"mismatch", case_mismatch, 2, 1}, {"kill", case_kill, 2, 1},
    {"pending", case_pending, 2, 1},   {"zeros", case_zeros, 2, 0},
    {"upto", case_upto, 2, 0},         {"upto_long", case_upto_long, 2, 1},
};
const int suite_ncases = sizeof(suite_cases) / sizeof(suite_cases[0]);

const suite_case *suite_find(const char *name) {
    for (int i = 0; i < suite_ncases; i++)
        if (strcmp(suite_cases[i].name, name) == 0)
            return &suite_cases[i];
    return NULL;
}

int suite_wanted(int i, int np, char **names, int n) {
    int wanted = n == 0;

    for (int a = 0; a < n; a++)
        wanted |= strcmp(names[a], suite_cases[i].name) == 0;
    return wanted && np >= suite_cases[i].needs;
}

void suite_params(hvd_transport_params *p, int rank, int size,
                  hvd_bootstrap *bs, const char (*hosts)[HVD_HOST_MAX],
                  const int *pids, unsigned job) {
    /* Two sockets per pair (stripes from 1 MiB), host memory only. */
    static const hvd_env_var settings[] = {{"HVD_TCP_NSOCKS", "2"},
                                           {"HVD_TCP_STRIPE_MIN", "1M"},
                                           {"HVD_IB_GPUDIRECT", "off"},
                                           {NULL, NULL}};

    memset(p, 0, sizeof(*p));
    p->rank = rank;
    p->size = size;
    p->bootstrap = bs;
    p->launcher_addr = "127.0.0.1";
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        p->job_id[i] = (uint8_t)(job >> (i % 4 * 8) ^ (unsigned)i * 13);
    p->secret = "test-transport-secret";
    p->hosts = hosts;
    p->pids = pids;
    p->gpu_device = -1;
    p->timeout_ns = (int64_t)SUITE_TIMEOUT_S * 1000000000;
    p->connect_timeout_ns = (int64_t)30 * 1000000000;
    p->env = hvd_env_vars_get;
    p->env_ctx = (void *)settings;
}

int suite_run(suite_rank *r, const suite_case *tc) {
    cur_rank = r;
    cur_case = tc->name;
    tc->run(r);
    if (r->tp != NULL) {
        if (!tc->fatal && r->ops->shutdown(r->tp) != HVD_OK)
            suite_fail("shutdown: %s", hvd_last_error());
        r->ops->close(r->tp);
        r->tp = NULL;
    }
    printf("PASS transport %s %s rank %d\n", r->transport, tc->name, r->rank);
    fflush(stdout);
    return 0;
}
