/* The rendezvous server's elastic mode over loopback: formation and
 * placement (ranks by worker id, local and cross ranks by host), the
 * rounds of a generation, a new generation after a worker is removed,
 * notices, refusals of removed and unknown workers, a generation abandoned
 * while it is set up, the job's end, min-np and the join timeout. The
 * server is driven from the test's thread; each client runs in a thread
 * of its own, bounded by its timeout. */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/bootstrap/rendezvous.h"

#define SECRET "elastic-secret"
#define CLIENT_TIMEOUT_NS (10 * 1000000000LL)
#define MAX_ROUNDS 4
#define MAX_RANKS 8

static const uint8_t job[HVD_JOB_ID_LEN] = {1, 2,  3,  4,  5,  6,  7,  8,
                                            9, 10, 11, 12, 13, 14, 15, 16};

typedef struct client {
    int port;
    int worker;
    int join; /* join first (else run rounds on bs) */
    int rounds;
    int64_t timeout_ns;
    const char *secret; /* NULL: SECRET */
    pthread_t th;
    atomic_int done;
    hvd_status st;
    char err[HVD_ERROR_MAX];
    hvd_bootstrap *bs;
    hvd_rdv_assignment asg;
    int32_t got[MAX_ROUNDS][MAX_RANKS];
} client;

static void *client_main(void *arg) {
    client *c = arg;
    char local[64];

    c->st = HVD_OK;
    if (c->join)
        c->st = hvd_rdv_client_join("127.0.0.1", c->port, c->worker, job,
                                    c->secret != NULL ? c->secret : SECRET,
                                    c->timeout_ns, &c->bs, local, &c->asg);
    for (int r = 0; r < c->rounds && c->st == HVD_OK; r++) {
        int32_t mine = c->worker * 100 + r;
        c->st = c->bs->allgather(c->bs, &mine, sizeof(mine), c->got[r]);
    }
    if (c->st != HVD_OK)
        snprintf(c->err, sizeof(c->err), "%s", hvd_error_get());
    atomic_store(&c->done, 1);
    return NULL;
}

static void start(client *c, int port, int worker, int join, int rounds) {
    c->port = port;
    c->worker = worker;
    c->join = join;
    c->rounds = rounds;
    if (c->timeout_ns == 0)
        c->timeout_ns = CLIENT_TIMEOUT_NS;
    c->err[0] = 0;
    atomic_store(&c->done, 0);
    assert_int_equal(pthread_create(&c->th, NULL, client_main, c), 0);
}

/* Drives the server until the n clients are done (bounded). */
static void finish(hvd_rdv_server *srv, client **cs, int n) {
    int64_t deadline = hvd_now_ns() + 20 * 1000000000LL;

    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= atomic_load(&cs[i]->done);
        if (all)
            break;
        assert_true(hvd_now_ns() < deadline);
        assert_int_equal(hvd_rdv_server_progress(srv, 10), HVD_OK);
    }
    for (int i = 0; i < n; i++)
        pthread_join(cs[i]->th, NULL);
}

/* Drives the server for ms milliseconds. */
static void pump(hvd_rdv_server *srv, int ms) {
    int64_t end = hvd_now_ns() + (int64_t)ms * 1000000;

    while (hvd_now_ns() < end)
        hvd_rdv_server_progress(srv, 10);
}

/* Drives the server until c's notices reach want (or it fails). */
static int updates_reach(hvd_rdv_server *srv, client *c, int want) {
    int64_t deadline = hvd_now_ns() + 5 * 1000000000LL;
    int n;

    while ((n = hvd_rdv_client_updates(c->bs)) >= 0 && n < want &&
           hvd_now_ns() < deadline)
        hvd_rdv_server_progress(srv, 10);
    return n;
}

static hvd_rdv_server *server(int max_workers, int min_np) {
    hvd_rdv_server *srv = NULL;

    assert_int_equal(hvd_rdv_server_create_elastic("127.0.0.1", 0, max_workers,
                                                   min_np, job, SECRET, &srv),
                     HVD_OK);
    return srv;
}

static void close_all(client *cs, int n) {
    for (int i = 0; i < n; i++) {
        hvd_rdv_client_close(cs[i].bs);
        cs[i].bs = NULL;
    }
}

static void formation_and_rounds(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(8, 1);
    int port = hvd_rdv_server_port(srv);
    client c[3];
    client *all[3] = {&c[0], &c[1], &c[2]};
    const int ids[3] = {7, 2, 5}; /* joined in this order */

    memset(c, 0, sizeof(c));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 5, "hostA"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 2, "hostB"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 7, "hostA"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 7, "hostA"),
                     HVD_ERR_INVALID_ARG);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 8, "hostA"),
                     HVD_ERR_INVALID_ARG);
    assert_int_equal(hvd_rdv_server_workers(srv), 3);
    assert_int_equal(hvd_rdv_server_generation(srv), 0);
    for (int i = 0; i < 3; i++)
        start(&c[i], port, ids[i], 1, 3);
    finish(srv, all, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(c[i].st, HVD_OK);
        assert_int_equal(c[i].asg.generation, 1);
        assert_int_equal(c[i].asg.size, 3);
        assert_int_equal(c[i].bs->size, 3);
        assert_int_equal(c[i].bs->rank, c[i].asg.rank);
        for (int r = 0; r < 3; r++) {
            assert_int_equal(c[i].got[r][0], 200 + r);
            assert_int_equal(c[i].got[r][1], 500 + r);
            assert_int_equal(c[i].got[r][2], 700 + r);
        }
    }
    /* Worker 2 (hostB) is rank 0: hostB is cross rank 0, hostA 1. */
    assert_int_equal(c[1].asg.rank, 0);
    assert_int_equal(c[1].asg.local_rank, 0);
    assert_int_equal(c[1].asg.local_size, 1);
    assert_int_equal(c[1].asg.cross_rank, 0);
    assert_int_equal(c[1].asg.cross_size, 2);
    assert_int_equal(c[2].asg.rank, 1);
    assert_int_equal(c[2].asg.local_rank, 0);
    assert_int_equal(c[2].asg.local_size, 2);
    assert_int_equal(c[2].asg.cross_rank, 1);
    assert_int_equal(c[2].asg.cross_size, 2);
    assert_int_equal(c[0].asg.rank, 2);
    assert_int_equal(c[0].asg.local_rank, 1);
    assert_int_equal(c[0].asg.local_size, 2);
    assert_int_equal(c[0].asg.cross_rank, 1);
    assert_int_equal(hvd_rdv_server_generation(srv), 1);
    assert_int_equal(hvd_rdv_server_waiting(srv), 0);
    assert_int_equal(hvd_rdv_server_joined(srv), 3);
    assert_int_equal(hvd_rdv_client_updates(c[0].bs), 0);
    close_all(c, 3);
    pump(srv, 50);
    assert_int_equal(hvd_rdv_server_joined(srv), 0);
    /* Closing connections removes no worker. */
    assert_int_equal(hvd_rdv_server_workers(srv), 3);
    hvd_rdv_server_destroy(srv);
}

static void rejoin_after_remove(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 1);
    int port = hvd_rdv_server_port(srv);
    client c[3], old2;
    client *all[3] = {&c[0], &c[1], &c[2]};

    memset(c, 0, sizeof(c));
    for (int w = 0; w < 3; w++)
        assert_int_equal(hvd_rdv_server_add_worker(srv, w, "h"), HVD_OK);
    for (int w = 0; w < 3; w++)
        start(&c[w], port, w, 1, 2);
    finish(srv, all, 3);
    for (int w = 0; w < 3; w++)
        assert_int_equal(c[w].st, HVD_OK);

    /* After its rounds, a member's removal only sends notices. */
    hvd_rdv_server_remove_worker(srv, 1, "it exited with status 1");
    hvd_rdv_server_remove_worker(srv, 1, "again"); /* ignored */
    assert_int_equal(hvd_rdv_server_workers(srv), 2);
    assert_int_equal(updates_reach(srv, &c[0], 1), 1);
    assert_int_equal(updates_reach(srv, &c[2], 1), 1);
    assert_int_equal(hvd_rdv_server_generation(srv), 1);

    /* Worker 0 closes and joins again; worker 2 joins again while its old
     * connection is open: the server drops that one. */
    hvd_rdv_client_close(c[0].bs);
    hvd_rdv_client_close(c[1].bs);
    c[0].bs = c[1].bs = NULL;
    old2 = c[2];
    c[2].bs = NULL;
    start(&c[0], port, 0, 1, 1);
    start(&c[2], port, 2, 1, 1);
    client *two[2] = {&c[0], &c[2]};
    finish(srv, two, 2);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(c[2].st, HVD_OK);
    assert_int_equal(c[0].asg.generation, 2);
    assert_int_equal(c[0].asg.size, 2);
    assert_int_equal(c[0].asg.rank, 0);
    assert_int_equal(c[2].asg.rank, 1);
    assert_int_equal(c[2].asg.local_rank, 1);
    assert_int_equal(c[2].asg.local_size, 2);
    assert_int_equal(c[2].asg.cross_size, 1);
    assert_int_equal(c[0].got[0][0], 0);
    assert_int_equal(c[0].got[0][1], 200);
    assert_int_equal(hvd_rdv_server_generation(srv), 2);
    assert_int_equal(updates_reach(srv, &old2, 1000), -1);
    hvd_rdv_client_close(old2.bs);
    close_all(c, 3);
    hvd_rdv_server_destroy(srv);
}

static void notices(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(8, 2);
    int port = hvd_rdv_server_port(srv);
    client c[2];
    client *all[2] = {&c[0], &c[1]};

    memset(c, 0, sizeof(c));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 0, "h"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 1, "h"), HVD_OK);
    start(&c[0], port, 0, 1, 0);
    start(&c[1], port, 1, 1, 0);
    finish(srv, all, 2);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(c[1].st, HVD_OK);

    /* A notice pushed before a round is skipped (and counted) by the
     * round's wait. */
    assert_int_equal(hvd_rdv_server_worker_member(srv, 0), 1);
    assert_int_equal(hvd_rdv_server_worker_member(srv, 1), 1);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 2, "h2"), HVD_OK);
    assert_int_equal(hvd_rdv_server_workers(srv), 3);
    assert_int_equal(hvd_rdv_server_waiting(srv), 0);
    /* A new worker leaves the generation whole: its members train on. */
    assert_int_equal(hvd_rdv_server_worker_member(srv, 0), 1);
    assert_int_equal(hvd_rdv_server_worker_member(srv, 2), 0);
    pump(srv, 50);
    start(&c[0], port, 0, 0, 2);
    start(&c[1], port, 1, 0, 2);
    finish(srv, all, 2);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(c[1].st, HVD_OK);
    assert_int_equal(c[0].got[1][1], 101);
    assert_int_equal(hvd_rdv_client_updates(c[0].bs), 1);
    assert_int_equal(hvd_rdv_client_updates(c[1].bs), 1);

    assert_int_equal(hvd_rdv_server_add_worker(srv, 3, "h2"), HVD_OK);
    hvd_rdv_server_remove_worker(srv, 3, "its host was blacklisted");
    assert_int_equal(updates_reach(srv, &c[0], 3), 3);
    assert_int_equal(updates_reach(srv, &c[1], 3), 3);
    pump(srv, 50);
    assert_int_equal(hvd_rdv_client_updates(c[0].bs), 3);
    assert_int_equal(hvd_rdv_server_worker_member(srv, 0), 1);
    /* A member removed: the others are members of a broken generation. */
    hvd_rdv_server_remove_worker(srv, 1, "it was killed");
    assert_int_equal(hvd_rdv_server_worker_member(srv, 0), 0);
    assert_int_equal(hvd_rdv_server_worker_member(srv, 1), 0);
    close_all(c, 2);
    hvd_rdv_server_destroy(srv);
}

static void refusals(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 1);
    int port = hvd_rdv_server_port(srv);
    client c[3];
    client *all[3] = {&c[0], &c[1], &c[2]};

    memset(c, 0, sizeof(c));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 0, "h"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 1, "h"), HVD_OK);
    hvd_rdv_server_remove_worker(srv, 1, "stopped by the test");
    start(&c[0], port, 1, 1, 0);  /* removed */
    start(&c[1], port, 3, 1, 0);  /* never added */
    start(&c[2], port, 99, 1, 0); /* outside the ids */
    finish(srv, all, 3);
    assert_int_equal(c[0].st, HVD_ERR_AUTH);
    assert_non_null(strstr(c[0].err, "worker 1 was removed from the job "
                                     "(stopped by the test); it is not "
                                     "re-admitted"));
    assert_int_equal(c[1].st, HVD_ERR_AUTH);
    assert_non_null(strstr(c[1].err, "worker 3 was never added"));
    assert_int_equal(c[2].st, HVD_ERR_AUTH);
    assert_non_null(strstr(c[2].err, "worker 99 was never added"));
    assert_int_equal(hvd_rdv_server_generation(srv), 0);
    assert_int_equal(hvd_rdv_server_waiting(srv), 0);

    /* A wrong secret still fails the handshake. */
    c[0].secret = "wrong";
    start(&c[0], port, 0, 1, 0);
    finish(srv, all, 1);
    assert_int_equal(c[0].st, HVD_ERR_AUTH);
    assert_null(c[0].bs);
    assert_int_equal(hvd_rdv_server_joined(srv), 0);
    hvd_rdv_server_destroy(srv);
}

static void abandon(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 1);
    int port = hvd_rdv_server_port(srv);
    client c[3];
    client *all[3] = {&c[0], &c[1], &c[2]};
    client *two[2] = {&c[0], &c[1]};

    memset(c, 0, sizeof(c));
    for (int w = 0; w < 3; w++)
        assert_int_equal(hvd_rdv_server_add_worker(srv, w, "h"), HVD_OK);
    for (int w = 0; w < 3; w++)
        start(&c[w], port, w, 1, 0);
    finish(srv, all, 3);
    /* Workers 0 and 1 wait in round 0; worker 2 is removed. */
    start(&c[0], port, 0, 0, 1);
    start(&c[1], port, 1, 0, 1);
    pump(srv, 200);
    assert_false(atomic_load(&c[0].done));
    hvd_rdv_server_remove_worker(srv, 2, "it was killed");
    finish(srv, two, 2);
    for (int w = 0; w < 2; w++) {
        assert_int_equal(c[w].st, HVD_ERR_PEERS_CHANGED);
        assert_non_null(strstr(c[w].err, "worker 2 (rank 2) left while "
                                         "generation 1 was being set up"));
        assert_int_equal(hvd_rdv_client_updates(c[w].bs), -1);
    }
    close_all(c, 3);

    /* Generation 2 of workers 0 and 1 completes a round; then worker 1 is
     * removed, and worker 0's next round fails at once. */
    start(&c[0], port, 0, 1, 1);
    start(&c[1], port, 1, 1, 1);
    finish(srv, two, 2);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(c[1].st, HVD_OK);
    assert_int_equal(c[1].asg.generation, 2);
    hvd_rdv_server_remove_worker(srv, 1, "it was killed");
    start(&c[0], port, 0, 0, 1);
    finish(srv, two, 1);
    assert_int_equal(c[0].st, HVD_ERR_PEERS_CHANGED);
    assert_non_null(strstr(c[0].err, "worker 1 (rank 1) left while "
                                     "generation 2 was being set up"));
    close_all(c, 3);

    /* Worker 0 alone forms generation 3. */
    start(&c[0], port, 0, 1, 1);
    finish(srv, two, 1);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(c[0].asg.generation, 3);
    assert_int_equal(c[0].asg.size, 1);
    close_all(c, 3);
    hvd_rdv_server_destroy(srv);
}

/* A member removed after the placement, before any round: the others'
 * first round fails (the error waits for them on the connection). */
static void abandon_before_rounds(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 1);
    int port = hvd_rdv_server_port(srv);
    client c[3];
    client *all[3] = {&c[0], &c[1], &c[2]};

    memset(c, 0, sizeof(c));
    for (int w = 0; w < 3; w++)
        assert_int_equal(hvd_rdv_server_add_worker(srv, w, "h"), HVD_OK);
    for (int w = 0; w < 3; w++)
        start(&c[w], port, w, 1, 0);
    finish(srv, all, 3);
    hvd_rdv_server_remove_worker(srv, 0, "it was killed");
    pump(srv, 50);
    start(&c[1], port, 1, 0, 1);
    start(&c[2], port, 2, 0, 1);
    finish(srv, &all[1], 2);
    for (int w = 1; w < 3; w++) {
        assert_int_equal(c[w].st, HVD_ERR_PEERS_CHANGED);
        assert_non_null(strstr(c[w].err, "worker 0 (rank 0) left while "
                                         "generation 1 was being set up"));
    }
    close_all(c, 3);
    hvd_rdv_server_destroy(srv);
}

/* Removing the one worker that has not asked forms the generation. */
static void remove_forms(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 1);
    int port = hvd_rdv_server_port(srv);
    client c[2];
    client *all[2] = {&c[0], &c[1]};

    memset(c, 0, sizeof(c));
    for (int w = 0; w < 3; w++)
        assert_int_equal(hvd_rdv_server_add_worker(srv, w, "h"), HVD_OK);
    start(&c[0], port, 2, 1, 1);
    start(&c[1], port, 0, 1, 1);
    pump(srv, 200);
    assert_int_equal(hvd_rdv_server_waiting(srv), 2);
    assert_int_equal(hvd_rdv_server_generation(srv), 0);
    hvd_rdv_server_remove_worker(srv, 1, "it never started");
    finish(srv, all, 2);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(c[0].asg.rank, 1);
    assert_int_equal(c[1].asg.rank, 0);
    assert_int_equal(c[1].got[0][1], 200);
    close_all(c, 2);
    hvd_rdv_server_destroy(srv);
}

static void min_np_holds(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 3);
    int port = hvd_rdv_server_port(srv);
    client c[3];
    client *all[3] = {&c[0], &c[1], &c[2]};

    memset(c, 0, sizeof(c));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 0, "h"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 1, "h"), HVD_OK);
    start(&c[0], port, 0, 1, 0);
    start(&c[1], port, 1, 1, 0);
    pump(srv, 300);
    assert_int_equal(hvd_rdv_server_waiting(srv), 2);
    assert_int_equal(hvd_rdv_server_generation(srv), 0);
    assert_false(atomic_load(&c[0].done));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 2, "h"), HVD_OK);
    start(&c[2], port, 2, 1, 0);
    finish(srv, all, 3);
    for (int w = 0; w < 3; w++) {
        assert_int_equal(c[w].st, HVD_OK);
        assert_int_equal(c[w].asg.size, 3);
    }
    close_all(c, 3);
    hvd_rdv_server_destroy(srv);
}

/* Once every worker that took part in a generation (past its first
 * round) is gone, nobody holds the state: no generation of new workers
 * only forms (they would start over), and the server says so. */
static void state_lost(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(8, 1);
    int port = hvd_rdv_server_port(srv);
    client c[4];
    client *two[2] = {&c[0], &c[1]};
    client *newer[2] = {&c[2], &c[3]};

    memset(c, 0, sizeof(c));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 0, "h"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 1, "h"), HVD_OK);
    /* Joined but no round run yet: not lost (nothing was placed). */
    assert_int_equal(hvd_rdv_server_state_lost(srv), 0);
    start(&c[0], port, 0, 1, 1);
    start(&c[1], port, 1, 1, 1);
    finish(srv, two, 2);
    assert_int_equal(c[0].st, HVD_OK);
    assert_int_equal(hvd_rdv_server_state_lost(srv), 0);
    hvd_rdv_server_remove_worker(srv, 0, "killed by SIGKILL");
    assert_int_equal(hvd_rdv_server_state_lost(srv), 0);
    hvd_rdv_server_remove_worker(srv, 1, "killed by SIGKILL");
    assert_int_equal(hvd_rdv_server_state_lost(srv), 1);
    close_all(c, 2);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 2, "h"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 3, "h"), HVD_OK);
    c[2].timeout_ns = c[3].timeout_ns = 0;
    start(&c[2], port, 2, 1, 0);
    start(&c[3], port, 3, 1, 0);
    pump(srv, 300);
    assert_int_equal(hvd_rdv_server_waiting(srv), 2);
    assert_int_equal(hvd_rdv_server_generation(srv), 1);
    hvd_rdv_server_end(srv, "nobody holds the training state");
    finish(srv, newer, 2);
    assert_int_equal(c[2].st, HVD_ERR_SHUTDOWN);
    assert_int_equal(c[3].st, HVD_ERR_SHUTDOWN);
    hvd_rdv_server_destroy(srv);
}

static void end_and_timeout(void **state) {
    (void)state;
    hvd_rdv_server *srv = server(4, 1);
    int port = hvd_rdv_server_port(srv);
    client c[2];
    client *one[1] = {&c[0]};
    client *two[1] = {&c[1]};

    memset(c, 0, sizeof(c));
    assert_int_equal(hvd_rdv_server_add_worker(srv, 0, "h"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 1, "h"), HVD_OK);
    /* A waiting worker's timeout is of the server's silence: while the
     * server runs, keepalives hold it (3 s of waiting on a 2 s timeout);
     * once the server goes quiet, it ends. */
    c[0].timeout_ns = 2000000000LL;
    start(&c[0], port, 0, 1, 0);
    pump(srv, 3000);
    assert_false(atomic_load(&c[0].done));
    assert_int_equal(hvd_rdv_server_waiting(srv), 1);
    int64_t quiet_end = hvd_now_ns() + 10 * 1000000000LL;
    while (!atomic_load(&c[0].done) && hvd_now_ns() < quiet_end)
        poll(NULL, 0, 10);
    finish(srv, one, 1);
    assert_int_equal(c[0].st, HVD_ERR_TIMEOUT);
    assert_non_null(strstr(c[0].err, "worker 0: the rendezvous server "
                                     "(hvdrun) said nothing for "
                                     "HVD_ELASTIC_TIMEOUT_SECONDS (2 s)"));
    pump(srv, 50);
    assert_int_equal(hvd_rdv_server_waiting(srv), 0);

    c[0].timeout_ns = 0;
    start(&c[0], port, 0, 1, 0);
    pump(srv, 200);
    assert_int_equal(hvd_rdv_server_waiting(srv), 1);
    hvd_rdv_server_end(srv, "too few workers for --elastic-timeout");
    finish(srv, one, 1);
    assert_int_equal(c[0].st, HVD_ERR_SHUTDOWN);
    assert_string_equal(c[0].err, "too few workers for --elastic-timeout");
    start(&c[1], port, 1, 1, 0);
    finish(srv, two, 1);
    assert_int_equal(c[1].st, HVD_ERR_SHUTDOWN);
    assert_int_equal(hvd_rdv_server_generation(srv), 0);
    hvd_rdv_server_destroy(srv);
}

/* A bootstrap of a fixed job has no notices. */
typedef struct fixed_client {
    int port;
    atomic_int done;
    hvd_status st;
    hvd_bootstrap *bs;
} fixed_client;

static void *fixed_main(void *arg) {
    fixed_client *f = arg;
    char local[64];

    f->st = hvd_rdv_client_connect("127.0.0.1", f->port, 0, 1, job, SECRET,
                                   CLIENT_TIMEOUT_NS, &f->bs, local);
    atomic_store(&f->done, 1);
    return NULL;
}

static void fixed_updates(void **state) {
    (void)state;
    hvd_rdv_server *srv = NULL;
    fixed_client f;
    pthread_t th;
    int64_t deadline = hvd_now_ns() + CLIENT_TIMEOUT_NS;

    memset(&f, 0, sizeof(f));
    assert_int_equal(
        hvd_rdv_server_create("127.0.0.1", 0, 1, job, SECRET, &srv), HVD_OK);
    f.port = hvd_rdv_server_port(srv);
    assert_int_equal(pthread_create(&th, NULL, fixed_main, &f), 0);
    while (!atomic_load(&f.done) && hvd_now_ns() < deadline)
        hvd_rdv_server_progress(srv, 10);
    pthread_join(th, NULL);
    assert_int_equal(f.st, HVD_OK);
    assert_int_equal(hvd_rdv_client_updates(f.bs), 0);
    assert_int_equal(hvd_rdv_client_updates(NULL), 0);
    hvd_rdv_client_close(f.bs);
    hvd_rdv_server_destroy(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(formation_and_rounds),
        cmocka_unit_test(rejoin_after_remove),
        cmocka_unit_test(notices),
        cmocka_unit_test(refusals),
        cmocka_unit_test(abandon),
        cmocka_unit_test(abandon_before_rounds),
        cmocka_unit_test(remove_forms),
        cmocka_unit_test(min_np_holds),
        cmocka_unit_test(state_lost),
        cmocka_unit_test(end_and_timeout),
        cmocka_unit_test(fixed_updates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
