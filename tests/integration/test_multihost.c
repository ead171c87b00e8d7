/*
 * A job of four ranks on two hosts, two each, started by hvdrun -H (see
 * run_multihost.sh, which makes the two hosts out of network namespaces).
 *
 *     hvdrun -H hostA:2,hostB:2 test_multihost
 *
 * Checks the placement hvdrun gave (size, local and cross rank and size),
 * that the two hosts have different host names, then exact results of
 * allreduce (sum and average; float32 and int64; 1, 7 and 1M elements),
 * broadcast from rank 3 and allgather. Every input is a small integer, so
 * every result is exact. Rank 0 prints the path of the 4 MiB allreduce
 * ("PATH allreduce 4194304: ..."). Prints "PASS multihost rank R: ..." and
 * exits 0,
 * or "FAIL multihost rank R: ..." and exits 1.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NRANKS 4
#define NHOSTS 2
#define HOST_LEN 64
#define BCAST_ROOT 3
#define ALLGATHER_COUNT 100003
#define NAME_LEN 64

static int g_rank = -1;

static _Noreturn void fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static _Noreturn void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("FAIL multihost rank %d: %s\n", g_rank, msg);
    fflush(stdout);
    exit(1);
}

static void check(hvd_status st, const char *what) {
    if (st != HVD_OK)
        fail("%s: %s: %s", what, status_name(st), hvd_last_error());
}

static void *xmalloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);

    if (p == NULL)
        fail("out of memory (%zu bytes)", n);
    return p;
}

/* Rank r's input at element i: the sum over ranks is size * (i % 1013)
 * and so is divisible by the size: the average is exact even for
 * integers, which truncate. */
static long input(int rank, int size, size_t i) {
    return (long)(i % 1013) + 2L * rank - (size - 1);
}

static void check_placement(int rank, int size) {
    int local_size = hvd_local_size(), cross_size = hvd_cross_size();

    if (size != NRANKS)
        fail("hvd_size() = %d, expected %d", size, NRANKS);
    if (cross_size != NHOSTS)
        fail("hvd_cross_size() = %d, expected %d", cross_size, NHOSTS);
    if (local_size != NRANKS / NHOSTS)
        fail("hvd_local_size() = %d, expected %d", local_size, NRANKS / NHOSTS);
    /* hvdrun fills the hosts in order: ranks 0, 1 on the first. */
    if (hvd_cross_rank() != rank / local_size ||
        hvd_local_rank() != rank % local_size)
        fail("cross_rank %d local_rank %d, expected %d and %d",
             hvd_cross_rank(), hvd_local_rank(), rank / local_size,
             rank % local_size);
}

/* Every rank's host name; the two hosts must differ, and the ranks of a
 * host agree. Returns this rank's. */
static void check_hosts(int rank, char mine[HOST_LEN]) {
    char all[NRANKS][HOST_LEN];

    memset(mine, 0, HOST_LEN);
    if (gethostname(mine, HOST_LEN - 1) != 0)
        fail("gethostname() failed");
    check(hvd_allgather("multihost.hosts", mine, all, HOST_LEN, HVD_UINT8),
          "allgather of host names");
    for (int r = 0; r < NRANKS; r++) {
        all[r][HOST_LEN - 1] = '\0';
        int same = strcmp(all[r], all[rank]) == 0;
        int same_host = r / (NRANKS / NHOSTS) == rank / (NRANKS / NHOSTS);
        if (same != same_host)
            fail("rank %d runs on %s and rank %d on %s: expected %s host "
                 "names",
                 rank, all[rank], r, all[r], same_host ? "equal" : "different");
    }
}

static void check_allreduce_f32(int rank, int size, size_t count, hvd_op op) {
    float *buf = xmalloc(count * sizeof(*buf));
    char name[NAME_LEN];

    for (size_t i = 0; i < count; i++)
        buf[i] = (float)input(rank, size, i);
    snprintf(name, sizeof(name), "multihost.allreduce.f32.%s.%zu",
             op == HVD_SUM ? "sum" : "avg", count);
    check(hvd_allreduce(name, buf, buf, count, HVD_FLOAT32, op), name);
    for (size_t i = 0; i < count; i++) {
        float want = (float)(i % 1013) * (op == HVD_SUM ? (float)size : 1.0f);
        if (buf[i] != want)
            fail("%s: element %zu is %g, expected %g", name, i, (double)buf[i],
                 (double)want);
    }
    free(buf);
}

static void check_allreduce_i64(int rank, int size, size_t count, hvd_op op) {
    int64_t *in = xmalloc(count * sizeof(*in));
    int64_t *out = xmalloc(count * sizeof(*out));
    char name[NAME_LEN];

    for (size_t i = 0; i < count; i++)
        in[i] = input(rank, size, i);
    snprintf(name, sizeof(name), "multihost.allreduce.i64.%s.%zu",
             op == HVD_SUM ? "sum" : "avg", count);
    check(hvd_allreduce(name, in, out, count, HVD_INT64, op), name);
    for (size_t i = 0; i < count; i++) {
        int64_t want = (int64_t)(i % 1013) * (op == HVD_SUM ? size : 1);
        if (out[i] != want)
            fail("%s: element %zu is %" PRId64 ", expected %" PRId64, name, i,
                 out[i], want);
    }
    free(in);
    free(out);
}

static void check_broadcast(int rank, size_t count) {
    float *buf = xmalloc(count * sizeof(*buf));
    char name[NAME_LEN];

    for (size_t i = 0; i < count; i++)
        buf[i] = rank == BCAST_ROOT ? (float)(i % 4099) + 0.5f : -1.0f;
    snprintf(name, sizeof(name), "multihost.broadcast.%zu", count);
    check(hvd_broadcast(name, buf, count, HVD_FLOAT32, BCAST_ROOT), name);
    for (size_t i = 0; i < count; i++) {
        if (buf[i] != (float)(i % 4099) + 0.5f)
            fail("%s: element %zu is %g, expected %g", name, i, (double)buf[i],
                 (double)((float)(i % 4099) + 0.5f));
    }
    free(buf);
}

static void check_allgather(int rank, int size, size_t count) {
    int64_t *in = xmalloc(count * sizeof(*in));
    int64_t *out = xmalloc((size_t)size * count * sizeof(*out));
    char name[NAME_LEN];

    for (size_t i = 0; i < count; i++)
        in[i] = (int64_t)rank * 1000000 + (int64_t)i;
    snprintf(name, sizeof(name), "multihost.allgather.%zu", count);
    check(hvd_allgather(name, in, out, count, HVD_INT64), name);
    for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < count; i++) {
            int64_t want = (int64_t)r * 1000000 + (int64_t)i;
            if (out[(size_t)r * count + i] != want)
                fail("%s: rank %d's element %zu is %" PRId64
                     ", expected %" PRId64,
                     name, r, i, out[(size_t)r * count + i], want);
        }
    }
    free(in);
    free(out);
}

int main(void) {
    static const size_t counts[] = {1, 7, (size_t)1 << 20};
    char host[HOST_LEN];

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_int(getenv("HVD_RANK"), &g_rank) != 0)
        g_rank = -1;
    check(hvd_init(), "hvd_init");
    g_rank = hvd_rank();
    int rank = g_rank, size = hvd_size();

    check_placement(rank, size);
    check_hosts(rank, host);
    if (rank == 0) {
        /* The selector's path for the largest allreduce (run_multihost.sh
         * checks that auto takes hier over two hosts). */
        char path[96];
        size_t bytes = ((size_t)1 << 20) * sizeof(float);
        check(hvd_path("allreduce", bytes, HVD_FLOAT32, path, sizeof(path)),
              "hvd_path");
        printf("PATH allreduce %zu: %s\n", bytes, path);
    }
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        check_allreduce_f32(rank, size, counts[k], HVD_SUM);
        check_allreduce_f32(rank, size, counts[k], HVD_AVERAGE);
        check_allreduce_i64(rank, size, counts[k], HVD_SUM);
        check_allreduce_i64(rank, size, counts[k], HVD_AVERAGE);
        check_broadcast(rank, counts[k]);
    }
    check_allgather(rank, size, 1);
    check_allgather(rank, size, ALLGATHER_COUNT);
    check(hvd_barrier(), "barrier");
    int cross_rank = hvd_cross_rank(), local_rank = hvd_local_rank();
    check(hvd_shutdown(), "hvd_shutdown");
    printf("PASS multihost rank %d: cross_rank %d local_rank %d on %s\n", rank,
           cross_rank, local_rank, host);
    return 0;
}
