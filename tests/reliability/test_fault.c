/*
 * The job that run_fault.sh (and the network scripts) hurt from outside.
 *
 *     test_fault --victim R --expect peer_lost|timeout|any
 *                [--max-seconds S] [--linger-ms M] [--threads 1|2]
 *
 * Every rank runs allreduces of mixed sizes (4 B to 4 MiB), three in flight
 * at a time so that small ones fuse and large ones run alone, and checks
 * every result exactly. With --threads 2 a second thread runs blocking
 * allreduces of its own meanwhile, so that a waiting thread that runs the
 * engine itself meets the engine thread when the job fails; it must get
 * the same verdict, in time. Once initialized it prints
 *
 *     READY rank R pid P size N job J
 *
 * so that the script can pick its moment and its victim's pid. The script
 * then kills (SIGKILL) or stops (SIGSTOP) rank R, or cuts the network
 * (--victim -1: no single rank is at fault). A rank that sees its call
 * fail prints
 *
 *     DETECT rank R status S wall T.N
 *
 * with the wall-clock time of that return (with --threads 2, once the
 * second thread's call has failed too), which the script compares with
 * the moment it struck, then checks that the status is the expected one,
 * that the sentence names rank R (unless --victim -1), that a later call
 * fails too and that hvd_shutdown() returns within 5 s, and prints
 * "PASS fault rank ..." or "FAIL fault rank ...". Every rank except the
 * victim ignores SIGTERM, so that it gets to report while the launcher
 * tears the job down. A rank whose loop runs --max-seconds (default 60)
 * without a failure fails. Before it exits, a survivor waits (bounded) for
 * the other survivors' verdicts, so that its exit, which closes its
 * connections, is not what they see first: each creates a file in
 * HVD_TEST_SYNC_DIR once its call has failed. Without that directory it
 * waits --linger-ms (default 1000) instead.
 *
 * Exit status: 3 pass (non-zero, so that hvdrun ends the job: a stopped
 * victim would otherwise hold it), 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXIT_PASS 3
#define INFLIGHT 3
#define MAX_ELEMS ((size_t)1 << 20)
#define SHUTDOWN_LIMIT_S 5.0
/* The longest a survivor waits for the others' verdicts. */
#define VERDICT_WAIT_S 30.0

/* Elements per allreduce, cycled with a stride that is prime to the table
 * size so that neighbours in flight differ. */
static const size_t sizes[] = {1, 100, 4096, 65536, 300000, MAX_ELEMS, 7};
#define NUM_SIZES (sizeof(sizes) / sizeof(sizes[0]))

enum { EXPECT_PEER_LOST, EXPECT_TIMEOUT, EXPECT_ANY };

/* Elements of the second thread's blocking allreduces. */
#define BLOCKING_ELEMS 1000

/* The second thread (--threads 2): blocking allreduces until one fails. */
typedef struct blocking {
    pthread_t thread;
    int rank, size, max_s;
    float send[BLOCKING_ELEMS], recv[BLOCKING_ELEMS];
    hvd_status status;
    char text[1024];
    int calls;
} blocking;

static double wall_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_expect(const char *s, int *out) {
    if (strcmp(s, "peer_lost") == 0)
        *out = EXPECT_PEER_LOST;
    else if (strcmp(s, "timeout") == 0)
        *out = EXPECT_TIMEOUT;
    else if (strcmp(s, "any") == 0)
        *out = EXPECT_ANY;
    else
        return -1;
    return 0;
}

static int status_ok(hvd_status s, int expect) {
    switch (expect) {
    case EXPECT_PEER_LOST:
        return s == HVD_ERR_PEER_LOST;
    case EXPECT_TIMEOUT:
        return s == HVD_ERR_TIMEOUT;
    default:
        return s == HVD_ERR_PEER_LOST || s == HVD_ERR_TIMEOUT;
    }
}

/* Rank r's input at element i; the sum over n ranks is exact in float32. */
static float input(int r, size_t i) { return (float)(i % 251) + (float)r; }

static float expected(int n, size_t i) {
    return (float)n * (float)(i % 251) + (float)(n * (n - 1) / 2);
}

/* The file survivor rank creates in dir once its call has failed. */
static void verdict_path(char *out, size_t outlen, const char *dir, int rank) {
    snprintf(out, outlen, "%s/verdict.%d", dir, rank);
}

static void say_verdict(const char *dir, int rank) {
    char path[512];
    FILE *f;

    if (dir == NULL)
        return;
    verdict_path(path, sizeof(path), dir, rank);
    f = fopen(path, "w");
    if (f != NULL)
        fclose(f);
}

/* Waits until every other survivor (every rank but the victim) has said
 * its verdict, at most VERDICT_WAIT_S; without a directory, linger_ms. */
static void await_verdicts(const char *dir, int rank, int size, int victim,
                           int linger_ms) {
    struct timespec tick = {0, 10 * 1000 * 1000};
    double deadline = now_s() + VERDICT_WAIT_S;
    char path[512];

    if (dir == NULL) {
        struct timespec linger = {linger_ms / 1000,
                                  (long)(linger_ms % 1000) * 1000000L};
        nanosleep(&linger, NULL);
        return;
    }
    for (int r = 0; r < size; r++) {
        if (r == victim || r == rank)
            continue;
        verdict_path(path, sizeof(path), dir, r);
        while (access(path, F_OK) != 0 && now_s() < deadline)
            nanosleep(&tick, NULL);
    }
}

static void *run_blocking(void *arg) {
    blocking *b = arg;
    double start = now_s();
    char name[64];

    for (size_t e = 0; e < BLOCKING_ELEMS; e++)
        b->send[e] = input(b->rank, e);
    for (b->calls = 0; b->status == HVD_OK; b->calls++) {
        if (now_s() - start > b->max_s) {
            snprintf(b->text, sizeof(b->text),
                     "%d blocking calls in %d s and no failure", b->calls,
                     b->max_s);
            b->status = HVD_ERR_INTERNAL;
            break;
        }
        snprintf(name, sizeof(name), "fault.blocking.%d", b->calls);
        b->status = hvd_allreduce(name, b->send, b->recv, BLOCKING_ELEMS,
                                  HVD_FLOAT32, HVD_SUM);
        if (b->status != HVD_OK) {
            snprintf(b->text, sizeof(b->text), "%s", hvd_last_error());
            break;
        }
        for (size_t e = 0; e < BLOCKING_ELEMS; e++) {
            if (b->recv[e] != expected(b->size, e)) {
                snprintf(b->text, sizeof(b->text),
                         "'%s' element %zu is %g, expected %g", name, e,
                         (double)b->recv[e], (double)expected(b->size, e));
                b->status = HVD_ERR_INTERNAL;
                break;
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int victim = -2, expect = -1, max_s = 60, linger_ms = 1000, threads = 1;
    int rank, size, it, i, k;
    float *send[INFLIGHT], *recv[INFLIGHT];
    hvd_handle h[INFLIGHT];
    size_t n[INFLIGHT];
    char name[64], text[1024];
    const char *job;
    const char *sync_dir = getenv("HVD_TEST_SYNC_DIR");
    hvd_status s = HVD_OK, again;
    double t_fail = 0, start, t0, shutdown_s;
    static blocking helper;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--victim") == 0) {
            victim = strcmp(argv[i + 1], "-1") == 0 ? -1 : -2;
            if (victim == -2 && parse_int(argv[i + 1], &victim) != 0)
                break;
        } else if (strcmp(argv[i], "--expect") == 0) {
            if (parse_expect(argv[i + 1], &expect) != 0)
                break;
        } else if (strcmp(argv[i], "--max-seconds") == 0) {
            if (parse_int(argv[i + 1], &max_s) != 0 || max_s < 1)
                break;
        } else if (strcmp(argv[i], "--linger-ms") == 0) {
            if (parse_int(argv[i + 1], &linger_ms) != 0)
                break;
        } else if (strcmp(argv[i], "--threads") == 0) {
            if (parse_int(argv[i + 1], &threads) != 0 || threads < 1 ||
                threads > 2)
                break;
        } else {
            break;
        }
    }
    if (i != argc || victim < -1 || expect < 0) {
        fprintf(stderr,
                "usage: %s --victim RANK|-1 --expect peer_lost|timeout|any "
                "[--max-seconds S] [--linger-ms M] [--threads 1|2]\n",
                argv[0]);
        return 2;
    }

    s = hvd_init();
    if (s != HVD_OK) {
        printf("FAIL fault: hvd_init: %s: %s\n", status_name(s),
               hvd_last_error());
        return 1;
    }
    rank = hvd_rank();
    size = hvd_size();
    if (victim >= size || size < 2) {
        printf("FAIL fault rank %d: needs --victim < size and size >= 2\n",
               rank);
        return 1;
    }
    if (rank != victim)
        signal(SIGTERM, SIG_IGN);
    for (k = 0; k < INFLIGHT; k++) {
        send[k] = malloc(MAX_ELEMS * sizeof(float));
        recv[k] = malloc(MAX_ELEMS * sizeof(float));
        if (send[k] == NULL || recv[k] == NULL) {
            printf("FAIL fault rank %d: out of memory\n", rank);
            return 1;
        }
        for (size_t e = 0; e < MAX_ELEMS; e++)
            send[k][e] = input(rank, e);
    }
    if (threads == 2) {
        helper.rank = rank;
        helper.size = size;
        helper.max_s = max_s;
        if (pthread_create(&helper.thread, NULL, run_blocking, &helper) != 0) {
            printf("FAIL fault rank %d: pthread_create failed\n", rank);
            return 1;
        }
    }
    job = getenv("HVD_JOB_ID");
    printf("READY rank %d pid %d size %d job %s\n", rank, (int)getpid(), size,
           job != NULL ? job : "-");

    start = now_s();
    for (it = 0; s == HVD_OK; it++) {
        if (now_s() - start > max_s) {
            printf("FAIL fault rank %d: %d iterations in %d s and no "
                   "failure\n",
                   rank, it, max_s);
            hvd_shutdown();
            return 1;
        }
        int posted = 0;
        for (k = 0; k < INFLIGHT && s == HVD_OK; k++) {
            n[k] = sizes[(size_t)(it * INFLIGHT + k) * 3 % NUM_SIZES];
            snprintf(name, sizeof(name), "fault.%d.%d", it, k);
            s = hvd_allreduce_async(name, send[k], recv[k], n[k], HVD_FLOAT32,
                                    HVD_SUM, &h[k]);
            if (s == HVD_OK)
                posted++;
        }
        for (k = 0; k < posted; k++) {
            hvd_status w = hvd_wait(h[k]);
            if (w != HVD_OK && s == HVD_OK)
                s = w;
            if (w != HVD_OK)
                continue;
            for (size_t e = 0; e < n[k]; e++) {
                if (recv[k][e] != expected(size, e)) {
                    printf("FAIL fault rank %d: 'fault.%d.%d' element %zu "
                           "is %g, expected %g\n",
                           rank, it, k, e, (double)recv[k][e],
                           (double)expected(size, e));
                    return 1;
                }
            }
        }
        if (s != HVD_OK) {
            t_fail = wall_s();
            snprintf(text, sizeof(text), "%s", hvd_last_error());
        }
    }
    /* The second thread's call fails too (a hang here is what the
     * script reports: no DETECT line). */
    if (threads == 2) {
        pthread_join(helper.thread, NULL);
        t0 = wall_s();
        if (t0 > t_fail)
            t_fail = t0;
    }
    printf("DETECT rank %d status %s wall %.6f after %d iterations\n", rank,
           status_name(s), t_fail, it);
    say_verdict(sync_dir, rank);

    /* A failed job fails every later operation too. */
    again =
        hvd_allreduce("fault.after", send[0], recv[0], 1, HVD_FLOAT32, HVD_SUM);
    t0 = now_s();
    hvd_shutdown();
    shutdown_s = now_s() - t0;

    if (!status_ok(s, expect)) {
        printf("FAIL fault rank %d: got %s, expected %s: %s\n", rank,
               status_name(s),
               expect == EXPECT_PEER_LOST ? "HVD_ERR_PEER_LOST"
               : expect == EXPECT_TIMEOUT ? "HVD_ERR_TIMEOUT"
                                          : "HVD_ERR_PEER_LOST or TIMEOUT",
               text);
        return 1;
    }
    if (victim >= 0 && !names_rank(text, victim)) {
        printf("FAIL fault rank %d: the error does not name rank %d: %s\n",
               rank, victim, text);
        return 1;
    }
    if (threads == 2 && !status_ok(helper.status, expect)) {
        printf("FAIL fault rank %d: the blocking thread got %s after %d "
               "calls: %s\n",
               rank, status_name(helper.status), helper.calls, helper.text);
        return 1;
    }
    if (threads == 2 && victim >= 0 && !names_rank(helper.text, victim)) {
        printf("FAIL fault rank %d: the blocking thread's error does not "
               "name rank %d: %s\n",
               rank, victim, helper.text);
        return 1;
    }
    if (again == HVD_OK) {
        printf("FAIL fault rank %d: an allreduce after the failure returned "
               "HVD_OK\n",
               rank);
        return 1;
    }
    if (shutdown_s > SHUTDOWN_LIMIT_S) {
        printf("FAIL fault rank %d: hvd_shutdown took %.3f s (limit %.0f s)\n",
               rank, shutdown_s, SHUTDOWN_LIMIT_S);
        return 1;
    }
    printf("PASS fault rank %d: %s: %s\n", rank, status_name(s), text);
    fflush(stdout);
    await_verdicts(sync_dir, rank, size, victim, linger_ms);
    for (k = 0; k < INFLIGHT; k++) {
        free(send[k]);
        free(recv[k]);
    }
    return EXIT_PASS;
}
