/*
 * The TCP transport alone, without the engine: two processes (this one
 * and a forked child) joined by loopback TCP connections on 127.0.0.1
 * exchange a message of LEN bytes back and forth on CHANNEL (data or
 * control), each side waiting either as the engine's spin does
 * (hvd_tcp_progress(0) in a loop, "poll") or as a collective does
 * (hvd_tcp_progress(1000), "wait", which polls for HVD_TCP_SPIN_US and
 * then sleeps in epoll_wait). Prints the round trip in nanoseconds: the
 * minimum, the 10th percentile and the median over batches of 1000,
 * which a loaded machine disturbs less than a mean.
 *
 *   tcp_pingpong [LEN [ROUNDS [data|control [poll|wait]]]]
 *                (2048 20000 data wait)
 *
 * HVD_TCP_SPIN_US and HVD_TCP_PROTECT are read from the environment. A
 * benchmark, not a test: docs/benchmarks.md ("Issue 35: TCP latency") has
 * its figures.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/tcp/tcp.h"

enum { BATCH = 1000, NCONN = 2, LEN_MAX = 1 << 20 };

static int cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* NCONN connected pairs of loopback TCP sockets: a[k] and b[k]. */
static int connect_pairs(int a[NCONN], int b[NCONN]) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    int l = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(l, NCONN) != 0 ||
        getsockname(l, (struct sockaddr *)&sa, &sl) != 0)
        return -1;
    for (int k = 0; k < NCONN; k++) {
        a[k] = socket(AF_INET, SOCK_STREAM, 0);
        if (a[k] < 0 || connect(a[k], (struct sockaddr *)&sa, sizeof(sa)) != 0)
            return -1;
        b[k] = accept(l, NULL, NULL);
        if (b[k] < 0)
            return -1;
    }
    close(l);
    return 0;
}

static hvd_status open_rank(int rank, const int mine[NCONN],
                            hvd_transport **out) {
    hvd_transport_params params;
    int fds[2 * NCONN];

    memset(&params, 0, sizeof(params));
    params.rank = rank;
    params.size = 2;
    params.secret = "pingpong secret";
    params.timeout_ns = 60 * 1000000000LL;
    params.connect_timeout_ns = 1000000000LL;
    for (int k = 0; k < NCONN; k++) {
        fds[rank * NCONN + k] = -1;
        fds[(1 - rank) * NCONN + k] = mine[k];
    }
    return hvd_tcp_open_connected(&params, fds, out);
}

static int wait_done(hvd_transport *t, hvd_req *r, int timeout_ms) {
    while (!r->done)
        if (hvd_tcp_ops.progress(t, timeout_ms) != HVD_OK)
            return -1;
    return r->status == HVD_OK ? 0 : -1;
}

/* One round trip from rank me's side; 0, or -1 if the transport failed. */
static int round_trip(hvd_transport *t, int me, int ch, int tmo,
                      const uint8_t *out, uint8_t *in, size_t len) {
    hvd_req s, r;

    if (me == 0) {
        if (hvd_tcp_ops.isend(t, 1, ch, out, len, &s) != HVD_OK ||
            hvd_tcp_ops.irecv(t, 1, ch, in, len, &r) != HVD_OK)
            return -1;
    } else {
        if (hvd_tcp_ops.irecv(t, 0, ch, in, len, &r) != HVD_OK ||
            wait_done(t, &r, tmo) != 0 ||
            hvd_tcp_ops.isend(t, 0, ch, out, len, &s) != HVD_OK)
            return -1;
    }
    return wait_done(t, &r, tmo) == 0 && wait_done(t, &s, tmo) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    size_t len = argc > 1 ? (size_t)atol(argv[1]) : 2048;
    long rounds = argc > 2 ? atol(argv[2]) : 20000;
    int ch = argc > 3 && strcmp(argv[3], "control") == 0 ? HVD_CHANNEL_CONTROL
                                                         : HVD_CHANNEL_DATA;
    int tmo = argc > 4 && strcmp(argv[4], "poll") == 0 ? 0 : 1000;
    static uint8_t out[LEN_MAX], in[LEN_MAX];
    int a[NCONN], b[NCONN], done[2];
    long nb = rounds / BATCH;
    hvd_transport *t = NULL;

    if (len > LEN_MAX || nb < 1) {
        fprintf(stderr, "usage: tcp_pingpong [LEN [ROUNDS [data|control "
                        "[poll|wait]]]] (LEN <= 1 MiB, ROUNDS >= 1000)\n");
        return 2;
    }
    int64_t *times = calloc((size_t)nb, sizeof(*times));
    if (times == NULL || connect_pairs(a, b) != 0 || pipe(done) != 0) {
        perror("tcp_pingpong");
        return 1;
    }
    for (size_t i = 0; i < len; i++)
        out[i] = (uint8_t)(i % 251 + 1);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    int me = pid == 0;
    for (int k = 0; k < NCONN; k++)
        close(me ? a[k] : b[k]);
    if (open_rank(me, me ? b : a, &t) != HVD_OK) {
        fprintf(stderr, "rank %d: %s\n", me, hvd_error_get());
        return 1;
    }
    for (long k = 0; k < nb; k++) {
        int64_t t0 = hvd_now_ns();
        for (int i = 0; i < BATCH; i++)
            if (round_trip(t, me, ch, tmo, out, in, len) != 0) {
                fprintf(stderr, "rank %d: %s\n", me, hvd_error_get());
                _exit(1);
            }
        times[k] = hvd_now_ns() - t0;
    }
    if (me == 1) {
        /* Stays until rank 0 has all of its last reply: its end of the
         * connections closing first would fail rank 0. */
        char c;
        ssize_t got = read(done[0], &c, 1);
        _exit(got != 1 || memcmp(in, out, len) != 0);
    }
    int status = 0;
    if (write(done[1], "x", 1) != 1)
        perror("tcp_pingpong");
    int ok = waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
             WEXITSTATUS(status) == 0 && memcmp(in, out, len) == 0;
    /* Closed after rank 1 is gone: nothing is in flight, so the close
     * frees the transport without waiting on the peer. */
    hvd_tcp_ops.close(t);
    if (!ok) {
        fprintf(stderr, "tcp_pingpong: the messages did not arrive intact\n");
        free(times);
        return 1;
    }
    qsort(times, (size_t)nb, sizeof(*times), cmp);
    printf("len %zu %s %s: round trip ns min %.1f p10 %.1f median %.1f\n", len,
           ch == HVD_CHANNEL_DATA ? "data" : "control",
           tmo == 0 ? "poll" : "wait", (double)times[0] / BATCH,
           (double)times[nb / 10] / BATCH, (double)times[nb / 2] / BATCH);
    free(times);
    return 0;
}
