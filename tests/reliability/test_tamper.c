/*
 * The job whose data run_tamper.sh tampers with on the path.
 *
 *     test_tamper [--ops N] [--max-seconds S]
 *
 * Every rank runs N allreduces (default 60), INFLIGHT at a time, cycling
 * through sizes from 8 B to 4 MiB in float32 and int32, and checks every
 * element of every result that returned HVD_OK. Inputs are small integers
 * that differ per operation and per element (so that a chunk of one
 * operation's data replayed, moved or left out changes a result), and
 * every sum is exact. Once initialized it prints
 *
 *     READY tamper rank R pid P size N
 *
 * (and creates HVD_TEST_SYNC_DIR/ready.R: the attacker on the path strikes
 * only once every rank's file is there, past the start's own traffic)
 * and at the end exactly one verdict:
 *
 *     OK tamper rank R: N allreduces, every result exact
 *     FAILED tamper rank R op K status S wall T: <hvd_last_error()>
 *
 * (op -1: hvd_init failed; T is the wall-clock time of the failing return)
 *     WRONG tamper rank R op K (NAME): element E is X, expected Y ...
 *
 * WRONG (a call returned HVD_OK with a wrong result) wins over FAILED: it
 * is what must never happen with frame protection on. After a failure or
 * a wrong result a rank posts nothing more and waits for what it has
 * posted (a WRONG line for each wrong result). Each rank ignores SIGTERM,
 * so that it gets to print its verdict while the launcher tears the job
 * down, and before hvd_shutdown it waits (at most VERDICT_WAIT_S) until
 * every other rank has printed its own (a file per rank in
 * HVD_TEST_SYNC_DIR): after a failure hvd_shutdown closes its connections,
 * which must not be what the others see first.
 *
 * Exit status: 0 OK, 3 FAILED, 4 WRONG, 5 hvd_init failed, 1 the test
 * itself failed (out of memory, --max-seconds passed), 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXIT_OK 0
#define EXIT_HARNESS 1
#define EXIT_USAGE 2
#define EXIT_FAILED 3
#define EXIT_WRONG 4
#define EXIT_INIT 5
#define INFLIGHT 3
#define VERDICT_WAIT_S 10.0

/* Bytes per allreduce, cycled; mostly large, so that the attacker on the
 * path finds large payloads to strike, with small ones among them. */
static const size_t sizes[] = {8,
                               1024,
                               (size_t)4 << 20,
                               64 * 1024,
                               (size_t)1 << 20,
                               (size_t)2 << 20,
                               300 * 1024};
#define NUM_SIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAX_BYTES ((size_t)4 << 20)

typedef struct slot {
    int op;
    hvd_dtype dtype;
    size_t count;
    void *send;
    void *recv;
    hvd_handle handle;
} slot;

/* Rank r's input at element i of operation op: a small integer, exact in
 * float32 and int32, whose sum over the ranks is exact too. */
static long input(int r, int op, size_t i) {
    return (long)((i * 7 + (size_t)op * 13) % 1009) - 500 + r;
}

static long expected(int size, int op, size_t i) {
    long sum = 0;

    for (int r = 0; r < size; r++)
        sum += input(r, op, i);
    return sum;
}

static double wall_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long value_at(hvd_dtype dtype, const void *buf, size_t i) {
    if (dtype == HVD_FLOAT32) {
        float f;
        memcpy(&f, (const char *)buf + i * 4, 4);
        return (long)f;
    }
    int32_t v;
    memcpy(&v, (const char *)buf + i * 4, 4);
    return v;
}

/* Checks a result; prints WRONG and returns 1 at the first wrong element
 * (with how many are wrong in all). */
static int check(const slot *s, int rank, int size) {
    size_t bad = 0, first = 0;

    for (size_t i = 0; i < s->count; i++) {
        if (!holds(s->dtype, s->recv, i, expected(size, s->op, i))) {
            if (bad++ == 0)
                first = i;
        }
    }
    if (bad == 0)
        return 0;
    printf("WRONG tamper rank %d op %d (%s, %zu B): element %zu is %ld, "
           "expected %ld; %zu of %zu elements wrong\n",
           rank, s->op, s->dtype == HVD_FLOAT32 ? "float32" : "int32",
           s->count * 4, first, value_at(s->dtype, s->recv, first),
           expected(size, s->op, first), bad, s->count);
    return 1;
}

static hvd_status post(slot *s, int op, int rank) {
    char name[64];

    s->op = op;
    s->dtype = (op / (int)NUM_SIZES) % 2 == 0 ? HVD_FLOAT32 : HVD_INT32;
    s->count = sizes[(size_t)op % NUM_SIZES] / 4;
    for (size_t i = 0; i < s->count; i++)
        put_value(s->dtype, s->send, i, input(rank, op, i));
    snprintf(name, sizeof(name), "tamper.%d", op);
    return hvd_allreduce_async(name, s->send, s->recv, s->count, s->dtype,
                               HVD_SUM, &s->handle);
}

/* Creates the file DIR/WHAT.RANK (a signal to the script, the relay or the
 * other ranks). */
static void touch(const char *dir, const char *what, int rank) {
    char path[512];
    FILE *f;

    if (dir == NULL)
        return;
    snprintf(path, sizeof(path), "%s/%s.%d", dir, what, rank);
    f = fopen(path, "w");
    if (f != NULL)
        fclose(f);
}

/* Waits until every other rank has said its verdict, at most
 * VERDICT_WAIT_S. */
static void await_verdicts(const char *dir, int rank, int size) {
    struct timespec tick = {0, 10 * 1000 * 1000};
    double deadline = now_s() + VERDICT_WAIT_S;
    char path[512];

    for (int r = 0; r < size && dir != NULL; r++) {
        if (r == rank)
            continue;
        snprintf(path, sizeof(path), "%s/verdict.%d", dir, r);
        while (access(path, F_OK) != 0 && now_s() < deadline)
            nanosleep(&tick, NULL);
    }
}

static int parse_args(int argc, char **argv, int *ops, int *max_s) {
    int i;

    for (i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--ops") == 0) {
            if (parse_int(argv[i + 1], ops) != 0 || *ops < 1)
                break;
        } else if (strcmp(argv[i], "--max-seconds") == 0) {
            if (parse_int(argv[i + 1], max_s) != 0 || *max_s < 1)
                break;
        } else {
            break;
        }
    }
    if (i == argc)
        return 0;
    fprintf(stderr, "usage: %s [--ops N] [--max-seconds S]\n", argv[0]);
    return -1;
}

/* Runs the operations, INFLIGHT at a time; returns the exit status and
 * prints the verdict. */
static int run(slot *slots, int rank, int size, int ops, int max_s) {
    hvd_status failed = HVD_OK;
    int failed_op = -1, wrong = 0, next = 0, done = 0;
    double start = now_s(), t_fail = 0;
    char text[1024] = "";

    while (done < next || (next < ops && failed == HVD_OK && !wrong)) {
        /* Post until INFLIGHT are out (slot k serves ops k, k+INFLIGHT...). */
        while (next < ops && next - done < INFLIGHT && failed == HVD_OK &&
               !wrong) {
            hvd_status st = post(&slots[next % INFLIGHT], next, rank);
            if (st != HVD_OK) {
                failed = st;
                failed_op = next;
                t_fail = wall_s();
                snprintf(text, sizeof(text), "%s", hvd_last_error());
                break;
            }
            next++;
        }
        if (done == next)
            break;
        slot *s = &slots[done % INFLIGHT];
        hvd_status w = hvd_wait(s->handle);
        if (w == HVD_OK)
            wrong |= check(s, rank, size);
        else if (failed == HVD_OK) {
            failed = w;
            failed_op = done;
            t_fail = wall_s();
            snprintf(text, sizeof(text), "%s", hvd_last_error());
        }
        done++;
        if (now_s() - start > max_s && failed == HVD_OK) {
            printf("FAILED tamper rank %d: %d allreduces in %d s, no "
                   "verdict (the test's own limit)\n",
                   rank, done, max_s);
            return EXIT_HARNESS;
        }
    }
    if (wrong)
        return EXIT_WRONG;
    if (failed != HVD_OK) {
        printf("FAILED tamper rank %d op %d status %s wall %.6f: %s\n", rank,
               failed_op, status_name(failed), t_fail, text);
        return EXIT_FAILED;
    }
    printf("OK tamper rank %d: %d allreduces, every result exact\n", rank,
           done);
    return EXIT_OK;
}

int main(int argc, char **argv) {
    int ops = 60, max_s = 60, rank, size, rc;
    const char *sync_dir = getenv("HVD_TEST_SYNC_DIR");
    slot slots[INFLIGHT];
    hvd_status st;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_args(argc, argv, &ops, &max_s) != 0)
        return EXIT_USAGE;
    signal(SIGTERM, SIG_IGN);
    st = hvd_init();
    if (st != HVD_OK) {
        const char *r = getenv("HVD_RANK");
        printf("FAILED tamper rank %s op -1 status %s wall %.6f: %s\n",
               r != NULL ? r : "?", status_name(st), wall_s(),
               hvd_last_error());
        return EXIT_INIT;
    }
    rank = hvd_rank();
    size = hvd_size();
    memset(slots, 0, sizeof(slots));
    for (int k = 0; k < INFLIGHT; k++) {
        slots[k].send = malloc(MAX_BYTES);
        slots[k].recv = malloc(MAX_BYTES);
        if (slots[k].send == NULL || slots[k].recv == NULL) {
            printf("FAILED tamper rank %d: out of memory\n", rank);
            return EXIT_HARNESS;
        }
    }
    printf("READY tamper rank %d pid %d size %d\n", rank, (int)getpid(), size);
    touch(sync_dir, "ready", rank);

    rc = run(slots, rank, size, ops, max_s);
    touch(sync_dir, "verdict", rank);
    /* The others' verdicts first: after a failure hvd_shutdown closes the
     * connections at once, and a rank still waiting would see that close
     * before the ABORT this rank sent it, when the relay forwards the
     * close on one connection before the ABORT on another. */
    await_verdicts(sync_dir, rank, size);
    hvd_shutdown();
    for (int k = 0; k < INFLIGHT; k++) {
        free(slots[k].send);
        free(slots[k].recv);
    }
    return rc;
}
