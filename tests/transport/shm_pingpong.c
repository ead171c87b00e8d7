/*
 * The shared-memory transport alone, without the engine: two processes
 * (this one and a forked child) with their segments in shared memory
 * exchange a control message back and forth, each polling with
 * hvd_shm_progress(0) as the engine's spin does. The message is a frame of
 * FRAME bytes whose first NONZERO are not zero and the rest are, as the
 * engine's step of a small allreduce (48 non-zero bytes of 256 at 8 B of
 * data, 168 at 128 B). Prints the round trip in nanoseconds: the minimum,
 * the 10th percentile and the median over batches of 1000, which a loaded
 * machine disturbs less than a mean.
 *
 *   shm_pingpong [NONZERO [ROUNDS [FRAME]]]   (48 200000 256)
 *
 * A benchmark, not a test: docs/benchmarks.md (issue 35) has its figures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/shm/shm_internal.h"

enum { BATCH = 1000, FRAME_MAX = 4096 };

static shm side[2];
static speer peers[2][2];

static int cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Both ranks' transports, their segments at mem (shared after fork). */
static void setup(uint8_t *mem, size_t len) {
    for (int r = 0; r < 2; r++) {
        shm *tp = &side[r];
        tp->rank = r;
        tp->size = 2;
        tp->nlocal = 2;
        tp->my_local = r;
        tp->seg_len = len;
        tp->seg = mem + (size_t)r * len;
        tp->peers = peers[r];
        tp->eager_max = cell_bytes_of[HVD_CHANNEL_DATA];
        tp->timeout_ns = 60 * 1000000000LL;
        tp->spin_ns = 200 * 1000LL;
        for (int p = 0; p < 2; p++) {
            speer *pe = &peers[r][p];
            pe->local = p;
            pe->pid = getpid();
            pe->pidfd = -1;
            pe->seg = p == r ? NULL : mem + (size_t)p * len;
            pe->seg_len = len;
        }
    }
}

/* One round trip from rank me's side; 0, or -1 if the transport failed. */
static int round_trip(int me, const uint8_t *out, uint8_t *in, size_t frame) {
    hvd_transport *t = &side[me].base;
    hvd_req s, r;

    if (me == 0) {
        if (hvd_shm_isend(t, 1, HVD_CHANNEL_CONTROL, out, frame, &s) !=
                HVD_OK ||
            hvd_shm_irecv(t, 1, HVD_CHANNEL_CONTROL, in, frame, &r) != HVD_OK)
            return -1;
    } else {
        if (hvd_shm_irecv(t, 0, HVD_CHANNEL_CONTROL, in, frame, &r) != HVD_OK)
            return -1;
        while (!r.done)
            if (hvd_shm_progress(t, 0) != HVD_OK)
                return -1;
        if (hvd_shm_isend(t, 0, HVD_CHANNEL_CONTROL, out, frame, &s) != HVD_OK)
            return -1;
    }
    while (!r.done || !s.done)
        if (hvd_shm_progress(t, 0) != HVD_OK)
            return -1;
    return r.status == HVD_OK && s.status == HVD_OK ? 0 : -1;
}

int main(int argc, char **argv) {
    size_t nonzero = argc > 1 ? (size_t)atol(argv[1]) : 48;
    long rounds = argc > 2 ? atol(argv[2]) : 200000;
    size_t frame = argc > 3 ? (size_t)atol(argv[3]) : 256;
    size_t len = (segment_bytes(2) + LINE - 1) / LINE * LINE;
    static uint8_t out[FRAME_MAX], in[FRAME_MAX];
    long nb = rounds / BATCH;

    if (frame > FRAME_MAX || nonzero > frame || nb < 1) {
        fprintf(stderr, "usage: shm_pingpong [NONZERO [ROUNDS [FRAME]]] "
                        "(NONZERO <= FRAME <= 4096, ROUNDS >= 1000)\n");
        return 2;
    }
    uint8_t *mem = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int64_t *t = calloc((size_t)nb, sizeof(*t));
    if (mem == MAP_FAILED || t == NULL) {
        perror("shm_pingpong");
        return 1;
    }
    setup(mem, len);
    for (size_t i = 0; i < nonzero; i++)
        out[i] = (uint8_t)(i % 255 + 1);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    int me = pid == 0;
    for (long b = 0; b < nb; b++) {
        int64_t t0 = hvd_now_ns();
        for (int i = 0; i < BATCH; i++)
            if (round_trip(me, out, in, frame) != 0) {
                fprintf(stderr, "rank %d: %s\n", me, hvd_error_get());
                _exit(1);
            }
        t[b] = hvd_now_ns() - t0;
    }
    if (me == 1)
        _exit(memcmp(in, out, frame) != 0);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0 || memcmp(in, out, frame) != 0) {
        fprintf(stderr, "shm_pingpong: the messages did not arrive intact\n");
        return 1;
    }
    qsort(t, (size_t)nb, sizeof(*t), cmp);
    printf("nonzero %zu frame %zu: round trip ns min %.1f p10 %.1f median "
           "%.1f\n",
           nonzero, frame, (double)t[0] / BATCH, (double)t[nb / 10] / BATCH,
           (double)t[nb / 2] / BATCH);
    return 0;
}
