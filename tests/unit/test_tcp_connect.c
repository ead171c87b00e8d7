/*
 * The TCP transport's connection setup, through its ops table
 * (transport/transport.h: hvd_transport_lookup("tcp")), with the ranks of
 * a job as threads of this process on 127.0.0.1 and a bootstrap whose
 * allgather is a barrier in shared memory:
 *
 *   - the mesh of 2 and of 3 ranks forms (one socket per pair, and three)
 *     and carries a message each way between every pair, on both channels;
 *   - a rank with a wrong job secret, or a wrong job id, is refused: its
 *     connections fail with HVD_ERR_AUTH, and the rank that refused it,
 *     still waiting for a legitimate one, gives HVD_ERR_TIMEOUT at its
 *     start timeout (set small);
 *   - a peer that took part in the address exchange but never connects or
 *     answers (its thread holds back until the other rank has given up)
 *     makes the other rank's open return HVD_ERR_TIMEOUT, whether the
 *     silent peer is the one that listens or the one that connects;
 *   - ranks that disagree on the sockets per pair get HVD_ERR_MISMATCH;
 *   - the mesh forms while a flooder keeps hundreds of idle connections
 *     (no HELLO) coming at the listening rank, from the same address as
 *     the real peer: strangers are dropped, the peer's connection is not.
 *
 * Every variable the transport reads comes from a table here, never from
 * the environment.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>

#include <cmocka.h>

#include "thread_bootstrap.h"
#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/bootstrap/net.h"
#include "transport/transport.h"

#define MAXR 3
#define OK_TIMEOUT_NS (30LL * 1000000000LL)
#define FAIL_TIMEOUT_NS (1LL * 1000000000LL)

typedef struct rank_ctx {
    thread_bootstrap *tb;
    hvd_bootstrap bs;
    hvd_transport_params params;
    char hosts[MAXR][HVD_HOST_MAX];
    int pids[MAXR];
    hvd_env_var env[3];
    char nsocks[16];
    const hvd_transport_ops *ops;
    hvd_transport *tp;
    hvd_status open_status;
    char open_error[HVD_ERROR_MAX];
    int exchanged; /* messages exchanged with every peer */
} rank_ctx;

/* ---- a job ---- */

typedef struct job_spec {
    int size;
    int nsocks[MAXR]; /* HVD_TCP_NSOCKS of each rank */
    const char *secret[MAXR];
    uint8_t job_id_xor[MAXR]; /* flips the first byte of a rank's job id */
    int64_t timeout_ns;
    int silent; /* -1: none */
    int flood;  /* flood rank 0's listener; rank `silent` waits for it */
} job_spec;

/* ---- a flooder ---- */

/* What transport/tcp/setup.c publishes through the allgather (its
 * listen_blob): where each rank listens. */
typedef struct published {
    char addr[HVD_ADDR_MAX];
    uint32_t port;
    uint32_t nsocks;
} published;

#define FLOOD_HELD 256 /* connections held open at once */
#define FLOOD_FIRST 64 /* opened before the silent rank may connect */
#define FLOOD_MAX_S 20 /* the flooder stops by itself after this */

typedef struct flooder {
    thread_bootstrap *tb;
    atomic_int stop;
    int opened;
    int fds[FLOOD_HELD];
} flooder;

/* Opens one idle connection to port on loopback (it never sends). */
static int flood_one(int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Learns rank 0's port from the address exchange, opens FLOOD_FIRST idle
 * connections to it, lets the silent rank go on, and keeps replacing its
 * oldest connection by a new one until told to stop. */
static void *flood_main(void *arg) {
    flooder *f = arg;
    thread_bootstrap *tb = f->tb;
    time_t until = time(NULL) + FLOOD_MAX_S;
    int port, k = 0;

    pthread_mutex_lock(&tb->mu);
    while (tb->round == 0)
        pthread_cond_wait(&tb->cv, &tb->mu);
    port = (int)((const published *)tb->slots[0][0])->port;
    pthread_mutex_unlock(&tb->mu);
    for (int i = 0; i < FLOOD_HELD; i++)
        f->fds[i] = -1;
    while (!atomic_load(&f->stop) && time(NULL) < until) {
        if (f->fds[k] >= 0)
            close(f->fds[k]);
        f->fds[k] = flood_one(port);
        f->opened += f->fds[k] >= 0;
        k = (k + 1) % FLOOD_HELD;
        if (f->opened == FLOOD_FIRST)
            thread_bootstrap_release(tb);
        if (k % 16 == 0)
            poll(NULL, 0, 1); /* leave the ranks some of the CPU */
    }
    thread_bootstrap_release(tb);
    for (int i = 0; i < FLOOD_HELD; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    return NULL;
}

static void exchange(rank_ctx *rc) {
    hvd_transport *tp = rc->tp;
    const hvd_transport_ops *ops = rc->ops;
    int r = rc->bs.rank, n = rc->bs.size, nreq = 0;
    uint8_t out[MAXR][2][64], in[MAXR][2][64];
    hvd_req reqs[MAXR * 4];

    for (int p = 0; p < n; p++) {
        if (p == r)
            continue;
        for (int ch = 0; ch < 2; ch++) {
            for (size_t i = 0; i < sizeof(out[p][ch]); i++)
                out[p][ch][i] = (uint8_t)(r * 100 + p * 10 + ch + i);
            memset(in[p][ch], 0, sizeof(in[p][ch]));
            if (ops->irecv(tp, p, ch, in[p][ch], sizeof(in[p][ch]),
                           &reqs[nreq++]) != HVD_OK ||
                ops->isend(tp, p, ch, out[p][ch], sizeof(out[p][ch]),
                           &reqs[nreq++]) != HVD_OK)
                return;
        }
    }
    for (int i = 0; i < nreq; i++) {
        while (!reqs[i].done)
            if (ops->progress(tp, 100) != HVD_OK)
                return;
        if (reqs[i].status != HVD_OK)
            return;
    }
    for (int p = 0; p < n; p++) {
        if (p == r)
            continue;
        for (int ch = 0; ch < 2; ch++)
            for (size_t i = 0; i < sizeof(in[p][ch]); i++)
                if (in[p][ch][i] != (uint8_t)(p * 100 + r * 10 + ch + i))
                    return;
    }
    rc->exchanged = 1;
}

static void *rank_main(void *arg) {
    rank_ctx *rc = arg;

    rc->open_status = rc->ops->open(&rc->params, &rc->tp);
    snprintf(rc->open_error, sizeof(rc->open_error), "%s",
             rc->open_status == HVD_OK ? "" : hvd_error_get());
    /* The silent rank's peer has given up: let the silent one go on. */
    if (rc->tb->silent >= 0 && rc->bs.rank != rc->tb->silent)
        thread_bootstrap_release(rc->tb);
    if (rc->open_status != HVD_OK)
        return NULL;
    exchange(rc);
    if (rc->ops->shutdown(rc->tp) != HVD_OK)
        rc->exchanged = 0;
    rc->ops->close(rc->tp);
    rc->tp = NULL;
    return NULL;
}

/* Runs the job; ranks[] holds what each rank saw. */
static void run_job(const job_spec *spec, rank_ctx *ranks) {
    thread_bootstrap tb;
    pthread_t th[MAXR];
    const hvd_transport_ops *ops = NULL;

    assert_int_equal(hvd_transport_lookup("tcp", &ops), HVD_OK);
    assert_non_null(ops);
    thread_bootstrap_init(&tb, spec->size, spec->silent);
    for (int r = 0; r < spec->size; r++) {
        rank_ctx *rc = &ranks[r];
        memset(rc, 0, sizeof(*rc));
        rc->tb = &tb;
        rc->ops = ops;
        rc->bs = thread_bootstrap_of(&tb, r);
        for (int q = 0; q < spec->size; q++) {
            snprintf(rc->hosts[q], HVD_HOST_MAX, "localhost");
            rc->pids[q] = (int)getpid();
        }
        snprintf(rc->nsocks, sizeof(rc->nsocks), "%d",
                 spec->nsocks[r] > 0 ? spec->nsocks[r] : 1);
        rc->env[0] = (hvd_env_var){"HVD_TCP_NSOCKS", rc->nsocks};
        rc->env[1] = (hvd_env_var){"HVD_IFACE", ""};
        rc->env[2] = (hvd_env_var){NULL, NULL};
        hvd_transport_params *p = &rc->params;
        p->rank = r;
        p->size = spec->size;
        p->bootstrap = &rc->bs;
        for (int i = 0; i < HVD_JOB_ID_LEN; i++)
            p->job_id[i] = (uint8_t)(0x40 + i);
        p->job_id[0] ^= spec->job_id_xor[r];
        p->secret = spec->secret[r] != NULL ? spec->secret[r] : "the-secret";
        p->hosts = (const char(*)[HVD_HOST_MAX])rc->hosts;
        p->pids = rc->pids;
        p->gpu_device = -1;
        p->timeout_ns = spec->timeout_ns;
        p->connect_timeout_ns = spec->timeout_ns;
        p->env = hvd_env_vars_get;
        p->env_ctx = rc->env;
        p->launcher_addr = "127.0.0.1";
    }
    flooder f = {.tb = &tb};
    pthread_t fth;
    for (int r = 0; r < spec->size; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ranks[r]), 0);
    if (spec->flood)
        assert_int_equal(pthread_create(&fth, NULL, flood_main, &f), 0);
    for (int r = 0; r < spec->size; r++)
        pthread_join(th[r], NULL);
    if (spec->flood) {
        atomic_store(&f.stop, 1);
        pthread_join(fth, NULL);
        printf("flooder: %d idle connections opened\n", f.opened);
        assert_true(f.opened >= FLOOD_FIRST);
    }
    for (int r = 0; r < spec->size; r++)
        if (ranks[r].open_status != HVD_OK)
            printf("rank %d: %s: %s\n", r,
                   hvd_status_name(ranks[r].open_status), ranks[r].open_error);
    thread_bootstrap_destroy(&tb);
}

static job_spec spec_of(int size) {
    job_spec s;

    memset(&s, 0, sizeof(s));
    s.size = size;
    s.timeout_ns = OK_TIMEOUT_NS;
    s.silent = -1;
    return s;
}

/* ---- the cases ---- */

static void mesh_forms(int size, int nsocks) {
    job_spec s = spec_of(size);
    rank_ctx ranks[MAXR];

    for (int r = 0; r < size; r++)
        s.nsocks[r] = nsocks;
    run_job(&s, ranks);
    for (int r = 0; r < size; r++) {
        assert_int_equal(ranks[r].open_status, HVD_OK);
        assert_int_equal(ranks[r].exchanged, 1);
    }
}

static void mesh_of_two(void **state) {
    (void)state;
    mesh_forms(2, 1);
}

static void mesh_of_three(void **state) {
    (void)state;
    mesh_forms(3, 1);
}

static void mesh_of_three_three_sockets(void **state) {
    (void)state;
    mesh_forms(3, 3);
}

/* Rank bad is refused: its open fails with HVD_ERR_AUTH and a sentence
 * that says why (naming what_differs), and every other rank's open, still
 * waiting for bad's connections after refusing them, with HVD_ERR_TIMEOUT
 * at its start timeout. */
static void refused(job_spec *s, int bad, const char *what_differs) {
    rank_ctx ranks[MAXR];

    s->timeout_ns = FAIL_TIMEOUT_NS;
    run_job(s, ranks);
    assert_int_equal(ranks[bad].open_status, HVD_ERR_AUTH);
    assert_non_null(strstr(ranks[bad].open_error, what_differs));
    for (int r = 0; r < s->size; r++) {
        if (r == bad)
            continue;
        assert_int_equal(ranks[r].open_status, HVD_ERR_TIMEOUT);
        assert_non_null(strstr(ranks[r].open_error, "start timeout"));
    }
}

/* The rank that connects holds the wrong secret. */
static void wrong_secret_connecting(void **state) {
    job_spec s = spec_of(2);

    (void)state;
    s.secret[1] = "not-the-secret";
    refused(&s, 1, "HVD_SECRET");
}

/* The rank that listens holds it: the one that connects is told. */
static void wrong_secret_listening(void **state) {
    job_spec s = spec_of(2);

    (void)state;
    s.secret[0] = "not-the-secret";
    refused(&s, 1, "HVD_SECRET");
}

static void wrong_secret_of_three(void **state) {
    job_spec s = spec_of(3);

    (void)state;
    s.secret[2] = "not-the-secret";
    refused(&s, 2, "HVD_SECRET");
}

static void wrong_job_id(void **state) {
    job_spec s = spec_of(2);

    (void)state;
    s.job_id_xor[1] = 0x01;
    refused(&s, 1, "another job");
}

/* The silent rank exchanged its address but neither connects nor
 * answers until the other has given up. */
static void silent_peer(int silent) {
    job_spec s = spec_of(2);
    rank_ctx ranks[MAXR];
    int other = 1 - silent;

    s.silent = silent;
    s.timeout_ns = FAIL_TIMEOUT_NS;
    run_job(&s, ranks);
    assert_int_equal(ranks[other].open_status, HVD_ERR_TIMEOUT);
    assert_non_null(strstr(ranks[other].open_error, "start timeout"));
    /* Released late, the silent one cannot form the mesh either. */
    assert_int_not_equal(ranks[silent].open_status, HVD_OK);
}

static void silent_listener(void **state) {
    (void)state;
    silent_peer(0);
}

static void silent_connector(void **state) {
    (void)state;
    silent_peer(1);
}

static void sockets_per_pair_differ(void **state) {
    job_spec s = spec_of(2);
    rank_ctx ranks[MAXR];

    (void)state;
    s.nsocks[0] = 1;
    s.nsocks[1] = 2;
    s.timeout_ns = FAIL_TIMEOUT_NS;
    run_job(&s, ranks);
    assert_int_equal(ranks[0].open_status, HVD_ERR_MISMATCH);
    assert_int_equal(ranks[1].open_status, HVD_ERR_MISMATCH);
    assert_non_null(strstr(ranks[0].open_error, "HVD_TCP_NSOCKS"));
}

/* Rank 1 connects only once rank 0's listener holds FLOOD_FIRST idle
 * strangers, and more keep coming (from 127.0.0.1, as rank 1 does) while
 * the mesh forms; rank 1's connections must get through and the mesh
 * carry messages. */
static void flooded_listener(void **state) {
    job_spec s = spec_of(2);
    rank_ctx ranks[MAXR];

    (void)state;
    s.silent = 1;
    s.flood = 1;
    s.nsocks[0] = s.nsocks[1] = 2;
    run_job(&s, ranks);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ranks[r].open_status, HVD_OK);
        assert_true(ranks[r].exchanged);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mesh_of_two),
        cmocka_unit_test(mesh_of_three),
        cmocka_unit_test(mesh_of_three_three_sockets),
        cmocka_unit_test(wrong_secret_connecting),
        cmocka_unit_test(wrong_secret_listening),
        cmocka_unit_test(wrong_secret_of_three),
        cmocka_unit_test(wrong_job_id),
        cmocka_unit_test(silent_listener),
        cmocka_unit_test(silent_connector),
        cmocka_unit_test(sockets_per_pair_differ),
        cmocka_unit_test(flooded_listener),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
