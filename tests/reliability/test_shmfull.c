/*
 * The job run_shmfull.sh starts on a small or filled /dev/shm.
 *
 *     test_shmfull [GO_FILE]
 *
 * hvd_init; then, where GO_FILE is given, prints "READY shmfull rank R"
 * and waits (at most 30 s) until GO_FILE exists: the script fills
 * /dev/shm in between, so that every later page the job touches would
 * have to come from a full filesystem. Then allreduce (sum), allgather
 * and broadcast of 4 bytes to 4 MiB (a factor of 4 apart) of int32, every
 * element checked exactly, and hvd_shutdown.
 *
 * Prints "PATH shmfull rank R <path of a 4 MiB allreduce>" (hvd_path:
 * "shm/...", or "tcp/..." after auto's fallback), then
 * "PASS shmfull rank R", or "FAIL shmfull rank R: ..." with hvd's
 * sentence (hvd_init's included). Exit status: 0 pass, 1 fail.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)4 << 20)
#define GO_WAIT_S 30.0

static int g_rank = -1;

static int fail(const char *what, hvd_status s) {
    printf("FAIL shmfull rank %d: %s: %s: %s\n", g_rank, what, status_name(s),
           hvd_last_error());
    fflush(stdout);
    return 1;
}

/* Waits, bounded, for the script to say that /dev/shm is full. */
static int wait_for(const char *path) {
    struct timespec tick = {0, 10 * 1000 * 1000};
    double end = now_s() + GO_WAIT_S;

    printf("READY shmfull rank %d\n", g_rank);
    fflush(stdout);
    while (access(path, F_OK) != 0) {
        if (now_s() > end) {
            printf("FAIL shmfull rank %d: %s did not appear within %.0f s\n",
                   g_rank, path, GO_WAIT_S);
            return 1;
        }
        nanosleep(&tick, NULL);
    }
    return 0;
}

/* The three collectives at count int32 elements, checked. */
static int one_size(size_t count, int size, int32_t *a, int32_t *b) {
    char name[64];
    hvd_status s;

    for (size_t i = 0; i < count; i++)
        a[i] = (int32_t)((size_t)g_rank + 1 + i % 1021);
    snprintf(name, sizeof(name), "allreduce.%zu", count);
    s = hvd_allreduce(name, a, b, count, HVD_INT32, HVD_SUM);
    if (s != HVD_OK)
        return fail(name, s);
    for (size_t i = 0; i < count; i++) {
        int64_t want = (int64_t)size * (size + 1) / 2 +
                       (int64_t)size * (int64_t)(i % 1021);
        if (b[i] != want) {
            printf("FAIL shmfull rank %d: %s: element %zu is %d, not %lld\n",
                   g_rank, name, i, b[i], (long long)want);
            return 1;
        }
    }
    snprintf(name, sizeof(name), "allgather.%zu", count);
    s = hvd_allgather(name, a, b, count, HVD_INT32);
    if (s != HVD_OK)
        return fail(name, s);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < count; i++)
            if (b[(size_t)r * count + i] !=
                (int32_t)(r + 1 + (int)(i % 1021))) {
                printf("FAIL shmfull rank %d: %s: element %zu of rank %d is "
                       "wrong\n",
                       g_rank, name, i, r);
                return 1;
            }
    snprintf(name, sizeof(name), "broadcast.%zu", count);
    s = hvd_broadcast(name, a, count, HVD_INT32, size - 1);
    if (s != HVD_OK)
        return fail(name, s);
    for (size_t i = 0; i < count; i++)
        if (a[i] != (int32_t)(size + (int)(i % 1021))) {
            printf("FAIL shmfull rank %d: %s: element %zu is wrong\n", g_rank,
                   name, i);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv) {
    int32_t *a, *b;
    int size, bad = 0;
    char path[128] = "";
    const char *env_rank = getenv("HVD_RANK");
    hvd_status s;

    /* hvd_init's failure names the rank hvdrun gave. */
    g_rank = env_rank != NULL ? atoi(env_rank) : -1;
    s = hvd_init();
    if (s != HVD_OK)
        return fail("hvd_init", s);
    g_rank = hvd_rank();
    size = hvd_size();
    if (argc > 1 && wait_for(argv[1]) != 0)
        return 1;
    a = malloc(MAX_BYTES);
    b = malloc(MAX_BYTES * (size_t)size);
    if (a == NULL || b == NULL) {
        printf("FAIL shmfull rank %d: out of memory\n", g_rank);
        return 1;
    }
    if (hvd_path("allreduce", MAX_BYTES, HVD_INT32, path, sizeof(path)) ==
        HVD_OK)
        printf("PATH shmfull rank %d %s\n", g_rank, path);
    for (size_t n = 4; n <= MAX_BYTES && !bad; n *= 4)
        bad = one_size(n / sizeof(int32_t), size, a, b);
    free(a);
    free(b);
    s = hvd_shutdown();
    if (!bad && s != HVD_OK)
        return fail("hvd_shutdown", s);
    if (!bad)
        printf("PASS shmfull rank %d\n", g_rank);
    fflush(stdout);
    return bad;
}
