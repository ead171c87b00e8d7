/*
 * A rank dies in the middle of a job; every survivor must learn it quickly.
 *
 *     hvdrun -np N test_peer_lost --victim R --after K [--names M]
 *
 * Every rank runs up to 100000 allreduces of mixed sizes, each under a new
 * name, or with --names M under M names in turn (cached after their first
 * run: they then travel through the steps' fast path). Rank R kills
 * itself with SIGKILL before iteration K. A survivor passes when its failing
 * call returns HVD_ERR_PEER_LOST within 5 s of its last success, names
 * "rank R" in hvd_last_error(), a later call fails too and hvd_shutdown()
 * returns within 5 s. Every rank ignores SIGTERM, so a survivor can report
 * even while hvdrun tears the job down (hvdrun SIGKILLs it after its grace
 * period). Exit status: 0 pass, 1 fail, 2 bad usage; the victim dies of
 * SIGKILL.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ITERS 100000
#define MAX_ELEMS ((size_t)1 << 20)
#define DETECT_LIMIT_S 5.0
#define SHUTDOWN_LIMIT_S 5.0

static const size_t sizes[] = {1, 100, 4096, 65536, MAX_ELEMS};
#define NUM_SIZES (sizeof(sizes) / sizeof(sizes[0]))

int main(int argc, char **argv) {
    int victim = -1, after = -1, names = 0, rank, size, it, i;
    float *send, *recv;
    char name[64], error_text[1024];
    double last_ok, elapsed, t0, shutdown_s;
    hvd_status s, again;

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGTERM, SIG_IGN);
    for (i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--victim") == 0 &&
            parse_int(argv[i + 1], &victim) == 0)
            continue;
        if (strcmp(argv[i], "--after") == 0 &&
            parse_int(argv[i + 1], &after) == 0)
            continue;
        if (strcmp(argv[i], "--names") == 0 &&
            parse_int(argv[i + 1], &names) == 0 && names >= 0)
            continue;
        break;
    }
    if (i != argc || victim < 0 || after < 0) {
        fprintf(stderr,
                "usage: %s --victim RANK --after ITERATIONS [--names M]\n",
                argv[0]);
        return 2;
    }

    s = hvd_init();
    if (s != HVD_OK) {
        printf("FAIL peer_lost: hvd_init: %s: %s\n", hvd_strerror(s),
               hvd_last_error());
        return 1;
    }
    rank = hvd_rank();
    size = hvd_size();
    if (victim >= size || size < 2) {
        printf("FAIL peer_lost rank %d: needs --victim < size and size >= 2 "
               "(victim %d, size %d)\n",
               rank, victim, size);
        return 1;
    }
    send = calloc(MAX_ELEMS, sizeof(float));
    recv = calloc(MAX_ELEMS, sizeof(float));
    if (send == NULL || recv == NULL) {
        printf("FAIL peer_lost rank %d: out of memory\n", rank);
        return 1;
    }
    for (i = 0; i < (int)MAX_ELEMS; i++)
        send[i] = 1.0f;

    last_ok = now_s();
    for (it = 0; it < MAX_ITERS; it++) {
        if (rank == victim && it == after) {
            struct timespec wall;

            /* The wall clock lets run_peer_lost.sh time hvdrun's exit from
             * this moment. */
            clock_gettime(CLOCK_REALTIME, &wall);
            printf("VICTIM rank %d raises SIGKILL at iteration %d, time "
                   "%lld.%09ld\n",
                   rank, it, (long long)wall.tv_sec, wall.tv_nsec);
            fflush(stdout);
            raise(SIGKILL);
        }
        snprintf(name, sizeof(name), "peer_lost.%d",
                 names > 0 ? it % names : it);
        s = hvd_allreduce(name, send, recv, sizes[it % NUM_SIZES], HVD_FLOAT32,
                          HVD_SUM);
        if (s != HVD_OK)
            break;
        last_ok = now_s();
    }
    if (it == MAX_ITERS) {
        printf("FAIL peer_lost rank %d: %d allreduces succeeded, but rank %d "
               "was to die at iteration %d\n",
               rank, MAX_ITERS, victim, after);
        return 1;
    }
    elapsed = now_s() - last_ok;
    snprintf(error_text, sizeof(error_text), "%s", hvd_last_error());

    /* A lost peer fails every later operation too. */
    again =
        hvd_allreduce("peer_lost.after", send, recv, 1, HVD_FLOAT32, HVD_SUM);
    t0 = now_s();
    hvd_shutdown();
    shutdown_s = now_s() - t0;

    if (s != HVD_ERR_PEER_LOST) {
        printf("FAIL peer_lost rank %d: iteration %d returned %s, expected "
               "HVD_ERR_PEER_LOST: %s\n",
               rank, it, status_name(s), error_text);
        return 1;
    }
    if (!names_rank(error_text, victim)) {
        printf("FAIL peer_lost rank %d: the error does not name rank %d: "
               "%s\n",
               rank, victim, error_text);
        return 1;
    }
    if (elapsed >= DETECT_LIMIT_S) {
        printf("FAIL peer_lost rank %d: the failure took %.3f s (limit "
               "%.1f s): %s\n",
               rank, elapsed, DETECT_LIMIT_S, error_text);
        return 1;
    }
    if (again == HVD_OK) {
        printf("FAIL peer_lost rank %d: an allreduce after the failure "
               "returned HVD_OK\n",
               rank);
        return 1;
    }
    if (shutdown_s > SHUTDOWN_LIMIT_S) {
        printf("FAIL peer_lost rank %d: hvd_shutdown took %.3f s (limit "
               "%.1f s)\n",
               rank, shutdown_s, SHUTDOWN_LIMIT_S);
        return 1;
    }
    printf("PASS peer_lost rank %d: %.3f s: %s\n", rank, elapsed, error_text);
    free(recv);
    free(send);
    return 0;
}
