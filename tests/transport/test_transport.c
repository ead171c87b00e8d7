/*
 * The transport suite (suite.h) for the transports whose ranks are
 * processes of one host that find each other through a bootstrap: tcp
 * and shm.
 *
 *   test_transport TRANSPORT NP [CASE...]
 *
 * The program is its own job: it forks NP ranks, and the parent is their
 * bootstrap (each rank's allgather goes through a socketpair to it), so a
 * transport is tested without hvd_init, the engine or a launcher. Each
 * case runs in a fresh job of NP ranks.
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

#include "suite.h"
#include "transport/base/error.h"

#include "../integration/testutil.h"

enum { MAX_RANKS = SUITE_MAX_RANKS };

static const char *g_name;

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

/* A process leaves as a killed one does: at once, without a word. */
static void leave(suite_rank *r) {
    (void)r;
    _exit(0);
}

static int run_rank(const suite_case *tc, int fd, int rank, int size,
                    const int *pids) {
    static char hosts[MAX_RANKS][HVD_HOST_MAX];
    hvd_bootstrap bs = {.rank = rank,
                        .size = size,
                        .allgather = child_allgather,
                        .ctx = (void *)(intptr_t)fd};
    suite_rank r = {
        .transport = g_name, .rank = rank, .size = size, .leave = leave};
    hvd_transport_params params;
    hvd_caps caps;

    alarm(120);
    if (hvd_transport_lookup(g_name, &r.ops) != HVD_OK)
        suite_fail("lookup: %s", hvd_last_error());
    for (int k = 0; k < size; k++)
        snprintf(hosts[k], HVD_HOST_MAX, "localhost");
    suite_params(&params, rank, size, &bs, (const char(*)[HVD_HOST_MAX])hosts,
                 pids, (unsigned)pids[0]);
    if (r.ops->probe(&params, &caps) != HVD_OK || !caps.usable) {
        printf("SKIP transport %s: not usable here: %s\n", g_name, caps.reason);
        fflush(stdout);
        _exit(77);
    }
    if (r.ops->open(&params, &r.tp) != HVD_OK)
        suite_fail("open: %s", hvd_last_error());
    suite_run(&r, tc);
    _exit(0);
}

/* One case in a job of size ranks: 0 pass, 77 skip, 1 fail. */
static int run_case(const suite_case *tc, int size) {
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
    for (int i = 0; i < suite_ncases; i++) {
        if (!suite_wanted(i, size, argv + 3, argc - 3))
            continue;
        int rc = run_case(&suite_cases[i], size);
        if (rc == 77)
            return 77;
        ran++;
        if (rc != 0) {
            printf("FAIL transport %s: case %s at np %d\n", g_name,
                   suite_cases[i].name, size);
            failed++;
        }
    }
    if (failed == 0)
        printf("PASS transport %s np %d: %d cases\n", g_name, size, ran);
    return failed ? 1 : 0;
}
