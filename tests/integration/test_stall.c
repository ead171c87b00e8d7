/*
 * A rank stops (SIGSTOP) in the middle of a collective; the others must
 * time out, not hang.
 *
 *     HVD_TIMEOUT_SECONDS=3 hvdrun -np N test_stall --victim R
 *
 * Every rank runs allreduces of 4M float32 in a loop. Once rank R has
 * finished STOP_AFTER_ITERS of them, a thread of rank R stops its own
 * process (while its main thread is in the next one). Each other rank passes
 * when its failing call returns HVD_ERR_TIMEOUT naming "rank R" (a rank not
 * next to R may learn it from a propagated abort; the message still names
 * R) between HVD_TIMEOUT_SECONDS / 2 and HVD_TIMEOUT_SECONDS + 8 s after its
 * last success. It then exits 3, a distinctive status that makes hvdrun tear
 * the job down (SIGCONT and SIGTERM un-stop and end the victim), but only
 * once every survivor has had its failing call return (each creates a file
 * in HVD_TEST_SYNC_DIR, else TMPDIR, named after the job, and waits for the
 * others', a bounded poll). Exit status: 3 pass, 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ITERS 10000
#define ELEMS ((size_t)4 << 20)
#define STOP_AFTER_ITERS 3
/* How long a survivor waits for the others' verdicts. */
#define VERDICT_WAIT_S 30
#define DEFAULT_TIMEOUT_S 300.0
#define EXTRA_S 8.0
#define EXIT_PASS 3

/* The victim's progress: its main thread counts finished allreduces, its
 * stopping thread waits for STOP_AFTER_ITERS of them. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_done_iters;

static void *stop_self(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    while (g_done_iters < STOP_AFTER_ITERS)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    printf("VICTIM stopping itself (SIGSTOP)\n");
    fflush(stdout);
    kill(getpid(), SIGSTOP);
    return NULL;
}

static void count_iteration(void) {
    pthread_mutex_lock(&g_mu);
    g_done_iters++;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* The file survivor rank writes once its failing call has returned. */
static void verdict_path(char *out, size_t outlen, int rank) {
    const char *dir = getenv("HVD_TEST_SYNC_DIR"), *job = getenv("HVD_JOB_ID");

    if (dir == NULL || dir[0] == '\0')
        dir = getenv("TMPDIR");
    snprintf(out, outlen, "%s/hvd-stall-%s-%d", dir != NULL ? dir : "/tmp",
             job != NULL ? job : "nojob", rank);
}

/*
 * Says this survivor has its verdict, and waits (bounded) until every
 * other survivor has too: this rank's exit makes hvdrun end the job and
 * closes its connections, which a survivor still waiting would see as a
 * lost peer instead of the stall.
 */
static void verdict_barrier(int rank, int size, int victim) {
    char path[512];
    FILE *f;
    struct timespec tick = {0, 10 * 1000 * 1000};
    double deadline = now_s() + VERDICT_WAIT_S;

    verdict_path(path, sizeof(path), rank);
    f = fopen(path, "w");
    if (f != NULL)
        fclose(f);
    for (int r = 0; r < size; r++) {
        if (r == victim || r == rank)
            continue;
        verdict_path(path, sizeof(path), r);
        while (access(path, F_OK) != 0 && now_s() < deadline)
            nanosleep(&tick, NULL);
    }
}

static double timeout_seconds(void) {
    const char *s = getenv("HVD_TIMEOUT_SECONDS");
    char *end;
    double v;

    if (s == NULL || s[0] == '\0')
        return DEFAULT_TIMEOUT_S;
    v = strtod(s, &end);
    return end != s && *end == '\0' && v > 0 ? v : DEFAULT_TIMEOUT_S;
}

int main(int argc, char **argv) {
    int victim = -1, rank, size, it;
    double timeout = timeout_seconds(), last_ok, elapsed;
    float *send, *recv;
    char name[64], error_text[1024];
    pthread_t thread;
    hvd_status s;
    size_t i;
    char *end;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "--victim") == 0) {
        victim = (int)strtol(argv[2], &end, 10);
        if (end == argv[2] || *end != '\0')
            victim = -1;
    }
    if (victim < 0) {
        fprintf(stderr, "usage: %s --victim RANK\n", argv[0]);
        return 2;
    }

    s = hvd_init();
    if (s != HVD_OK) {
        printf("FAIL stall: hvd_init: %s: %s\n", hvd_strerror(s),
               hvd_last_error());
        return 1;
    }
    rank = hvd_rank();
    size = hvd_size();
    if (victim >= size || size < 2) {
        printf("FAIL stall rank %d: needs --victim < size and size >= 2 "
               "(victim %d, size %d)\n",
               rank, victim, size);
        return 1;
    }
    /* Survivors ignore SIGTERM: when the first of them exits, hvdrun
     * SIGTERMs the rest, who must still get to report. The victim keeps
     * the default action, so that hvdrun's SIGTERM + SIGCONT end it. */
    if (rank != victim)
        signal(SIGTERM, SIG_IGN);

    send = malloc(ELEMS * sizeof(float));
    recv = malloc(ELEMS * sizeof(float));
    if (send == NULL || recv == NULL) {
        printf("FAIL stall rank %d: out of memory\n", rank);
        return 1;
    }
    for (i = 0; i < ELEMS; i++)
        send[i] = 1.0f;

    if (rank == victim && pthread_create(&thread, NULL, stop_self, NULL) != 0) {
        printf("FAIL stall rank %d: pthread_create failed\n", rank);
        return 1;
    }

    last_ok = now_s();
    for (it = 0; it < MAX_ITERS; it++) {
        snprintf(name, sizeof(name), "stall.%d", it);
        s = hvd_allreduce(name, send, recv, ELEMS, HVD_FLOAT32, HVD_SUM);
        if (s != HVD_OK)
            break;
        last_ok = now_s();
        if (rank == victim)
            count_iteration();
    }
    if (it == MAX_ITERS) {
        printf("FAIL stall rank %d: %d allreduces succeeded, but rank %d was "
               "to stop\n",
               rank, MAX_ITERS, victim);
        return 1;
    }
    elapsed = now_s() - last_ok;
    snprintf(error_text, sizeof(error_text), "%s", hvd_last_error());
    if (rank != victim)
        verdict_barrier(rank, size, victim);

    if (rank == victim) {
        printf("FAIL stall rank %d: the victim itself got %s after %.3f s: "
               "%s\n",
               rank, status_name(s), elapsed, error_text);
        return 1;
    }
    if (s != HVD_ERR_TIMEOUT) {
        printf("FAIL stall rank %d: iteration %d returned %s, expected "
               "HVD_ERR_TIMEOUT: %s\n",
               rank, it, status_name(s), error_text);
        return 1;
    }
    if (!names_rank(error_text, victim)) {
        printf("FAIL stall rank %d: the error does not name rank %d: %s\n",
               rank, victim, error_text);
        return 1;
    }
    if (elapsed < timeout / 2 || elapsed > timeout + EXTRA_S) {
        printf("FAIL stall rank %d: timed out after %.3f s, expected %.1f s "
               "to %.1f s (HVD_TIMEOUT_SECONDS %.1f): %s\n",
               rank, elapsed, timeout / 2, timeout + EXTRA_S, timeout,
               error_text);
        return 1;
    }
    printf("PASS stall rank %d: %s after %.3f s: %s\n", rank, status_name(s),
           elapsed, error_text);
    fflush(stdout);

    /* After a failure hvd_shutdown only releases what is left (the engine
     * thread has ended: ThreadSanitizer reports a thread never joined). */
    hvd_shutdown();
    free(recv);
    free(send);
    return EXIT_PASS;
}
