/*
 * One suite for every transport: what transport/transport.h promises,
 * checked the same way against each (as UCX runs one test suite over all
 * its transports). A transport that passes it can serve the engine.
 *
 *   test_transport TRANSPORT NP [CASE...]
 *
 * The program is its own job: it forks NP ranks, and the parent is their
 * bootstrap (each rank's allgather goes through a socketpair to it), so a
 * transport is tested without hvd_init, the engine or a launcher. Each
 * case runs in a fresh job of NP ranks:
 *
 *   order     every size from 0 bytes to 1 MiB + 3 (odd ones included), on
 *             both channels, to every peer and from every peer, receives
 *             posted before and after the sends; contents and order exact
 *   control   a control-channel ping-pong of 200 rounds completes while a
 *             64 MiB data message waits for its receive (the channels are
 *             independent)
 *   wake      a progress call waiting with nothing to do (-1) returns soon
 *             after wake() from another thread
 *   mismatch  a receive of 16 bytes meets a send of 8: a fatal error on
 *             the receiver, every request in flight completes with it, and
 *             the other ranks hear of it (no hang)
 *   kill      the last rank exits (no goodbye) while every other rank has
 *             receives in flight from every peer: each of them gets an
 *             error naming it within the transport's timeout, and every
 *             request completes
 *   pending   messages sent but never received, then shutdown on every
 *             rank: it returns, bounded, and close frees what is queued
 *
 * Exit 0 when every case passes on every rank, 77 when the transport is not
 * built in or not usable here (its probe's reason), 1 on a failure.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/error.h"
#include "transport/transport.h"

#include "../integration/testutil.h"

enum { MAX_RANKS = 8, TIMEOUT_S = 5 };

static int g_rank, g_size;
static const char *g_name;
static const char *g_case;

#define FAIL(...)                                                              \
    do {                                                                       \
        printf("FAIL transport %s %s rank %d: ", g_name, g_case, g_rank);      \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        fflush(stdout);                                                        \
        _exit(1);                                                              \
    } while (0)

/* ------------------------------------------------------------------ */
/* The bootstrap: a socketpair to the parent, which gathers and answers */

static int full_io(int fd, void *buf, size_t len, int writing) {
    char *p = buf;

    while (len > 0) {
        ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static hvd_status child_allgather(hvd_bootstrap *bs, const void *mine,
                                  size_t len, void *all_out) {
    int fd = (int)(intptr_t)bs->ctx;
    uint64_t n = len;

    if (full_io(fd, &n, sizeof(n), 1) != 0 ||
        full_io(fd, (void *)mine, len, 1) != 0 ||
        full_io(fd, all_out, len * (size_t)bs->size, 0) != 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "the test's bootstrap broke");
    return HVD_OK;
}

/* The parent: serves allgather rounds until every rank has gone. */
static void serve_bootstrap(const int *fds, int size) {
    for (;;) {
        uint64_t len[MAX_RANKS];
        int live = 0;
        char *all = NULL;

        for (int r = 0; r < size; r++) {
            len[r] = 0;
            if (fds[r] >= 0 && full_io(fds[r], &len[r], 8, 0) == 0)
                live++;
            else
                len[r] = UINT64_MAX;
        }
        if (live < size)
            return; /* a rank left: no round can complete any more */
        all = malloc((size_t)len[0] * (size_t)size + 1);
        for (int r = 0; r < size; r++)
            if (len[r] != len[0] ||
                full_io(fds[r], all + (size_t)r * len[0], len[0], 0) != 0) {
                free(all);
                return;
            }
        for (int r = 0; r < size; r++)
            if (full_io(fds[r], all, (size_t)len[0] * (size_t)size, 1) != 0)
                break;
        free(all);
    }
}

/* ------------------------------------------------------------------ */
/* A rank                                                              */

typedef struct rankctx {
    const hvd_transport_ops *ops;
    hvd_transport *tp;
    hvd_bootstrap bs;
    char hosts[MAX_RANKS][HVD_HOST_MAX];
    int pids[MAX_RANKS];
} rankctx;

/* Waits for req, bounded; the status it ended with. */
static hvd_status wait_req(rankctx *c, hvd_req *req, double limit_s) {
    double end = now_s() + limit_s;

    while (!req->done) {
        hvd_status st = c->ops->progress(c->tp, 10);
        if (st != HVD_OK && !req->done)
            FAIL("progress failed before the request ended: %s",
                 hvd_last_error());
        if (now_s() > end)
            FAIL("a request did not finish in %.0f s", limit_s);
    }
    return req->status;
}

static void wait_all(rankctx *c, hvd_req *reqs, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (wait_req(c, &reqs[i], 60) != HVD_OK)
            FAIL("request %zu failed: %s", i, hvd_last_error());
}

static uint8_t pattern(int src, int dst, int channel, int k, size_t i) {
    return (uint8_t)(src * 31 + dst * 17 + channel * 7 + k * 5 + (int)i * 3);
}

static const size_t sizes[] = {
    0, 1, 2, 3, 7, 8, 63, 4093, 65536, 65537, (1u << 20) + 3};
enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };

/* order: every size, both channels, every peer; receives first or last. */
static void case_order(rankctx *c) {
    size_t n = (size_t)(g_size > 1 ? g_size - 1 : 0) * 2 * NSIZES;

    for (int recv_first = 1; recv_first >= 0; recv_first--) {
        hvd_req *sreq = calloc(n, sizeof(*sreq));
        hvd_req *rreq = calloc(n, sizeof(*rreq));
        uint8_t **sbuf = calloc(n, sizeof(*sbuf));
        uint8_t **rbuf = calloc(n, sizeof(*rbuf));
        int i = 0;

        for (int p = 0; p < g_size; p++) {
            if (p == g_rank)
                continue;
            for (int ch = 0; ch < 2; ch++)
                for (int k = 0; k < NSIZES; k++, i++) {
                    sbuf[i] = malloc(sizes[k] + 1);
                    rbuf[i] = malloc(sizes[k] + 1);
                    for (size_t b = 0; b < sizes[k]; b++)
                        sbuf[i][b] = pattern(g_rank, p, ch, k, b);
                    memset(rbuf[i], 0xEE, sizes[k] + 1);
                }
        }
        for (int phase = 0; phase < 2; phase++) {
            int recv_now = (phase == 0) == recv_first;
            i = 0;
            for (int p = 0; p < g_size; p++) {
                if (p == g_rank)
                    continue;
                for (int ch = 0; ch < 2; ch++)
                    for (int k = 0; k < NSIZES; k++, i++) {
                        hvd_status st =
                            recv_now ? c->ops->irecv(c->tp, p, ch, rbuf[i],
                                                     sizes[k], &rreq[i])
                                     : c->ops->isend(c->tp, p, ch, sbuf[i],
                                                     sizes[k], &sreq[i]);
                        if (st != HVD_OK)
                            FAIL("%s of %zu bytes to/from rank %d: %s",
                                 recv_now ? "irecv" : "isend", sizes[k], p,
                                 hvd_last_error());
                    }
            }
        }
        wait_all(c, sreq, n);
        wait_all(c, rreq, n);
        i = 0;
        for (int p = 0; p < g_size; p++) {
            if (p == g_rank)
                continue;
            for (int ch = 0; ch < 2; ch++)
                for (int k = 0; k < NSIZES; k++, i++) {
                    for (size_t b = 0; b < sizes[k]; b++)
                        if (rbuf[i][b] != pattern(p, g_rank, ch, k, b))
                            FAIL("message %d of %zu bytes from rank %d, "
                                 "channel %d: byte %zu is %u, not %u",
                                 k, sizes[k], p, ch, b, rbuf[i][b],
                                 pattern(p, g_rank, ch, k, b));
                    if (rbuf[i][sizes[k]] != 0xEE)
                        FAIL("a receive of %zu bytes wrote past its end",
                             sizes[k]);
                    free(sbuf[i]);
                    free(rbuf[i]);
                }
        }
        free(sreq);
        free(rreq);
        free(sbuf);
        free(rbuf);
    }
}

/* control: the control channel is not held up by waiting data. Rank 0 and
 * rank 1 only; the others idle. */
static void case_control(rankctx *c) {
    size_t big = (size_t)64 << 20;
    uint8_t *data = NULL;
    hvd_req dreq = {0};
    int peer = g_rank == 0 ? 1 : 0;

    if (g_rank > 1)
        return;
    data = calloc(big, 1);
    if (g_rank == 0 &&
        c->ops->isend(c->tp, 1, HVD_CHANNEL_DATA, data, big, &dreq) != HVD_OK)
        FAIL("isend of 64 MiB: %s", hvd_last_error());
    for (int round = 0; round < 200; round++) {
        uint32_t out = (uint32_t)(round * 2 + g_rank), in = 0;
        hvd_req s = {0}, r = {0};
        if (c->ops->irecv(c->tp, peer, HVD_CHANNEL_CONTROL, &in, sizeof(in),
                          &r) != HVD_OK ||
            c->ops->isend(c->tp, peer, HVD_CHANNEL_CONTROL, &out, sizeof(out),
                          &s) != HVD_OK)
            FAIL("control round %d: %s", round, hvd_last_error());
        if (wait_req(c, &s, 30) != HVD_OK || wait_req(c, &r, 30) != HVD_OK)
            FAIL("control round %d failed: %s", round, hvd_last_error());
        if (in != (uint32_t)(round * 2 + peer))
            FAIL("control round %d: got %u", round, in);
    }
    /* Only now is the data received. */
    if (g_rank == 1 &&
        c->ops->irecv(c->tp, 0, HVD_CHANNEL_DATA, data, big, &dreq) != HVD_OK)
        FAIL("irecv of 64 MiB: %s", hvd_last_error());
    if (wait_req(c, &dreq, 60) != HVD_OK)
        FAIL("the 64 MiB message failed: %s", hvd_last_error());
    free(data);
}

static void *waker(void *arg) {
    rankctx *c = arg;
    struct timespec ts = {0, 100 * 1000 * 1000};

    nanosleep(&ts, NULL);
    c->ops->wake(c->tp);
    return NULL;
}

/* wake: a progress call waiting for nothing returns after wake(). */
static void case_wake(rankctx *c) {
    pthread_t t;
    double t0 = now_s();

    /* Drain what open left to do first. */
    for (int i = 0; i < 10; i++)
        c->ops->progress(c->tp, 0);
    pthread_create(&t, NULL, waker, c);
    t0 = now_s();
    while (now_s() - t0 < 0.09)
        c->ops->progress(c->tp, 0);
    hvd_status st = c->ops->progress(c->tp, -1);
    double dt = now_s() - t0;
    pthread_join(t, NULL);
    if (st != HVD_OK)
        FAIL("progress(-1) failed: %s", hvd_last_error());
    if (dt > 3.0)
        FAIL("progress(-1) returned %.1f s after wake()", dt);
}

/* mismatch: rank 1 expects 16 bytes from rank 0, which sends 8. */
static void case_mismatch(rankctx *c) {
    uint8_t buf[16] = {0}, other[4];
    hvd_req s = {0}, r = {0}, r2 = {0};

    if (g_rank == 0) {
        if (c->ops->isend(c->tp, 1, HVD_CHANNEL_DATA, buf, 8, &s) != HVD_OK)
            FAIL("isend: %s", hvd_last_error());
    } else if (g_rank == 1) {
        /* A second receive, from rank 0 on the control channel, is in
         * flight too: the failure must complete it. */
        if (c->ops->irecv(c->tp, 0, HVD_CHANNEL_CONTROL, other, sizeof(other),
                          &r2) != HVD_OK ||
            c->ops->irecv(c->tp, 0, HVD_CHANNEL_DATA, buf, 16, &r) != HVD_OK)
            FAIL("irecv: %s", hvd_last_error());
    }
    /* Every rank ends up failed, each within the timeout: the receiver
     * sees the mismatch, the others hear of it (or see it go). */
    double end = now_s() + 4 * TIMEOUT_S;
    hvd_status st = HVD_OK;
    while (st == HVD_OK && now_s() < end)
        st = c->ops->progress(c->tp, 10);
    if (st == HVD_OK)
        FAIL("no error in %d s after a length mismatch", 4 * TIMEOUT_S);
    if (g_rank == 1 &&
        (!r.done || !r2.done || r.status == HVD_OK || r2.status == HVD_OK))
        FAIL("the receives in flight did not fail with the transport");
    if (g_rank == 1 && strstr(hvd_last_error(), "rank 0") == NULL)
        FAIL("the sentence does not name rank 0: %s", hvd_last_error());
    if (c->ops->progress(c->tp, 0) != st)
        FAIL("a later call did not return the failure again");
}

/* kill: the last rank goes without a word; the others' receives fail. */
static void case_kill(rankctx *c) {
    int victim = g_size - 1;
    uint8_t bufs[MAX_RANKS][8];
    hvd_req reqs[MAX_RANKS] = {{0}};

    if (g_rank == victim) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        _exit(0);
    }
    for (int p = 0; p < g_size; p++)
        if (p != g_rank && c->ops->irecv(c->tp, p, HVD_CHANNEL_DATA, bufs[p], 8,
                                         &reqs[p]) != HVD_OK)
            FAIL("irecv from rank %d: %s", p, hvd_last_error());
    double t0 = now_s();
    hvd_status st = HVD_OK;
    while (st == HVD_OK && now_s() - t0 < 4 * TIMEOUT_S)
        st = c->ops->progress(c->tp, 10);
    if (st == HVD_OK)
        FAIL("no error in %d s after rank %d died", 4 * TIMEOUT_S, victim);
    for (int p = 0; p < g_size; p++)
        if (p != g_rank && (!reqs[p].done || reqs[p].status == HVD_OK))
            FAIL("the receive from rank %d did not fail", p);
    if (!names_rank(hvd_last_error(), victim))
        FAIL("the sentence does not name rank %d: %s", victim,
             hvd_last_error());
}

/* pending: sent, never received; then shutdown and close, bounded. */
static void case_pending(rankctx *c) {
    uint8_t small[3][100];
    hvd_req s[3] = {{0}};

    memset(small, 1, sizeof(small));
    if (g_rank == 0)
        for (int k = 0; k < 3; k++)
            if (c->ops->isend(c->tp, 1, HVD_CHANNEL_DATA, small[k],
                              sizeof(small[k]), &s[k]) != HVD_OK)
                FAIL("isend: %s", hvd_last_error());
    /* Small messages are sent without their receive (eagerly). */
    for (int k = 0; g_rank == 0 && k < 3; k++)
        wait_req(c, &s[k], 30);
    double t0 = now_s();
    hvd_status st = c->ops->shutdown(c->tp);
    if (now_s() - t0 > 30)
        FAIL("shutdown took %.0f s", now_s() - t0);
    (void)st; /* OK, or an error naming the unread messages: either */
}

typedef struct testcase {
    const char *name;
    void (*run)(rankctx *c);
    int needs; /* ranks it needs */
    int fatal; /* leaves the transport failed: no shutdown after it */
} testcase;

static const testcase cases[] = {
    {"order", case_order, 2, 0}, {"control", case_control, 2, 0},
    {"wake", case_wake, 1, 0},   {"mismatch", case_mismatch, 2, 1},
    {"kill", case_kill, 2, 1},   {"pending", case_pending, 2, 1},
};

static int run_rank(const testcase *tc, int fd, int rank, int size,
                    const int *pids) {
    rankctx c;
    hvd_transport_params params;
    hvd_caps caps;

    memset(&c, 0, sizeof(c));
    g_rank = rank;
    g_size = size;
    g_case = tc->name;
    alarm(120);
    if (hvd_transport_lookup(g_name, &c.ops) != HVD_OK)
        FAIL("lookup: %s", hvd_last_error());
    c.bs.rank = rank;
    c.bs.size = size;
    c.bs.allgather = child_allgather;
    c.bs.ctx = (void *)(intptr_t)fd;
    for (int r = 0; r < size; r++) {
        snprintf(c.hosts[r], HVD_HOST_MAX, "localhost");
        c.pids[r] = pids[r];
    }
    memset(&params, 0, sizeof(params));
    params.rank = rank;
    params.size = size;
    params.bootstrap = &c.bs;
    params.launcher_addr = "127.0.0.1";
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        params.job_id[i] = (uint8_t)(pids[0] >> (i % 4 * 8) ^ i * 13);
    params.secret = "test-transport-secret";
    params.hosts = (const char(*)[HVD_HOST_MAX])c.hosts;
    params.pids = c.pids;
    params.gpu_device = -1;
    params.timeout_ns = (int64_t)TIMEOUT_S * 1000000000;
    params.connect_timeout_ns = (int64_t)30 * 1000000000;
    /* Two sockets per pair (stripes from 1 MiB), host memory only. */
    static const hvd_env_var settings[] = {{"HVD_TCP_NSOCKS", "2"},
                                           {"HVD_TCP_STRIPE_MIN", "1M"},
                                           {"HVD_IB_GPUDIRECT", "off"},
                                           {NULL, NULL}};
    params.env = hvd_env_vars_get;
    params.env_ctx = (void *)settings;
    if (c.ops->probe(&params, &caps) != HVD_OK || !caps.usable) {
        printf("SKIP transport %s: not usable here: %s\n", g_name, caps.reason);
        fflush(stdout);
        _exit(77);
    }
    if (c.ops->open(&params, &c.tp) != HVD_OK)
        FAIL("open: %s", hvd_last_error());
    tc->run(&c);
    if (!tc->fatal && c.ops->shutdown(c.tp) != HVD_OK)
        FAIL("shutdown: %s", hvd_last_error());
    c.ops->close(c.tp);
    printf("PASS transport %s %s rank %d\n", g_name, tc->name, rank);
    fflush(stdout);
    _exit(0);
}

/* One case in a job of size ranks: 0 pass, 77 skip, 1 fail. */
static int run_case(const testcase *tc, int size) {
    int fds[MAX_RANKS], pids[MAX_RANKS], sv[MAX_RANKS][2];
    int rc = 0, skipped = 0;

    for (int r = 0; r < size; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r]) != 0)
            return 1;
    /* Each rank learns every pid before it opens the transport (shared
     * memory names its peers by pid). */
    for (int r = 0; r < size; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            int table[MAX_RANKS];
            for (int k = 0; k < size; k++) {
                close(sv[k][0]);
                if (k != r)
                    close(sv[k][1]);
            }
            if (full_io(sv[r][1], table, sizeof(int) * (size_t)size, 0) != 0)
                _exit(1);
            return run_rank(tc, sv[r][1], r, size, table);
        }
        pids[r] = (int)pid;
        close(sv[r][1]);
        fds[r] = sv[r][0];
    }
    for (int r = 0; r < size; r++)
        full_io(fds[r], pids, sizeof(int) * (size_t)size, 1);
    serve_bootstrap(fds, size);
    for (int r = 0; r < size; r++) {
        int status = 0;
        close(fds[r]);
        waitpid(pids[r], &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
            skipped++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            rc = 1;
    }
    if (skipped == size)
        return 77;
    return rc != 0 || skipped > 0 ? 1 : 0;
}

int main(int argc, char **argv) {
    int size, failed = 0, ran = 0;

    if (argc < 3 || parse_int(argv[2], &size) != 0 || size < 1 ||
        size > MAX_RANKS) {
        fprintf(stderr, "usage: %s TRANSPORT NP [CASE...] (NP 1-%d)\n", argv[0],
                MAX_RANKS);
        return 1;
    }
    g_name = argv[1];
    signal(SIGPIPE, SIG_IGN);
    const hvd_transport_ops *ops;
    if (hvd_transport_lookup(g_name, &ops) != HVD_OK) {
        printf("SKIP transport %s: %s\n", g_name, hvd_last_error());
        return 77;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int wanted = argc == 3;
        for (int a = 3; a < argc; a++)
            wanted |= strcmp(argv[a], cases[i].name) == 0;
        if (!wanted || size < cases[i].needs)
            continue;
        int rc = run_case(&cases[i], size);
        if (rc == 77)
            return 77;
        ran++;
        if (rc != 0) {
            printf("FAIL transport %s: case %s at np %d\n", g_name,
                   cases[i].name, size);
            failed++;
        }
    }
    if (failed == 0)
        printf("PASS transport %s np %d: %d cases\n", g_name, size, ran);
    return failed ? 1 : 0;
}
