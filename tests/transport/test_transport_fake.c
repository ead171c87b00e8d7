/*
 * The transport suite (suite.h) for the verbs transport on the fake
 * libibverbs (tests/unit/verbs_fake.h), on machines without an RDMA
 * device: the ranks are threads of this process, their queue pairs meet
 * on the fake's in-process fabric, and the fake's bootstrap joins them. A
 * rank that leaves closes its transport without a goodbye, which destroys
 * its queue pairs as a killed process's are: its peers' sends to it fail
 * with the transport retry error.
 *
 *   test_transport_fake NP [CASE...]
 *
 * Exit 0 when every case passes on every rank, 1 on a failure.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "suite.h"
#include "transport/base/error.h"
#include "transport/verbs/verbs.h"
#include "verbs_fake.h"

#include "../integration/testutil.h"

typedef struct job {
    const suite_case *tc;
    int size;
    fake_boot *boot;
} job;

typedef struct thread_rank {
    job *job;
    int rank;
} thread_rank;

static void leave(suite_rank *r) {
    r->ops->close(r->tp);
    r->tp = NULL;
}

static void *rank_main(void *arg) {
    thread_rank *t = arg;
    suite_rank r = {.transport = "verbs (fake)",
                    .rank = t->rank,
                    .size = t->job->size,
                    .leave = leave};
    hvd_transport_params params;

    suite_params(&params, t->rank, t->job->size,
                 fake_bootstrap(t->job->boot, t->rank), NULL, NULL,
                 (unsigned)getpid());
    if (hvd_verbs_open_with(&fake_seam, &params, &r.tp) != HVD_OK)
        suite_fail("open: %s", hvd_last_error());
    r.ops = r.tp->ops;
    suite_run(&r, t->job->tc);
    return NULL;
}

/* One case in a fresh job of size threads; a failure exits the process. */
static void run_case(const suite_case *tc, int size) {
    pthread_t th[SUITE_MAX_RANKS];
    thread_rank ranks[SUITE_MAX_RANKS];
    job j = {.tc = tc, .size = size};

    fake_reset();
    j.boot = fake_boot_create(size);
    for (int r = 0; r < size; r++) {
        ranks[r] = (thread_rank){.job = &j, .rank = r};
        pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    fake_boot_destroy(j.boot);
}

int main(int argc, char **argv) {
    int size, ran = 0;

    if (argc < 2 || parse_int(argv[1], &size) != 0 || size < 1 ||
        size > SUITE_MAX_RANKS) {
        fprintf(stderr, "usage: %s NP [CASE...] (NP 1-%d)\n", argv[0],
                SUITE_MAX_RANKS);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(600);
    for (int i = 0; i < suite_ncases; i++) {
        if (!suite_wanted(i, size, argv + 2, argc - 2))
            continue;
        run_case(&suite_cases[i], size);
        ran++;
    }
    printf("PASS transport verbs (fake) np %d: %d cases\n", size, ran);
    return 0;
}
