/*
 * The choice of a job's transports (transport/choose.c), with the ranks as
 * threads of this process over the barrier bootstrap of
 * thread_bootstrap.c, every variable from a table (never the
 * environment):
 *
 *   - HVD_TRANSPORT values: auto and the built-in names in any case are
 *     accepted; an unknown one is refused with a sentence listing what is
 *     (and what the caller accepts besides);
 *   - HVD_TRANSPORT=tcp takes TCP for everything, on one host too: the
 *     job's ranks can talk over it, and no local transport is opened;
 *   - HVD_TRANSPORT=shm for ranks on two hosts is refused on every rank,
 *     naming why, before anything is opened;
 *   - auto for one rank on each of two hosts takes a transport that
 *     reaches other hosts, and no local one (no host runs two ranks).
 *
 * Hosts are names in the parameters; every rank listens on 127.0.0.1 (the
 * launcher's address), so "two hosts" costs nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <pthread.h>

#include <cmocka.h>

#include "thread_bootstrap.h"
#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/choose.h"

#define NRANKS 2

typedef struct rank_ctx {
    const char *want;
    hvd_bootstrap bs;
    hvd_transport_params params;
    char hosts[NRANKS][HVD_HOST_MAX];
    int pids[NRANKS];
    hvd_env_var env[1];
    hvd_status status;
    char error[HVD_ERROR_MAX];
    char chosen[32];
    int has_local;
    int reach;
    int exchanged;
} rank_ctx;

/* One message each way on the data channel of the chosen transport. */
static void exchange(rank_ctx *rc, hvd_transport_choice *c) {
    int r = rc->bs.rank, peer = 1 - r;
    uint32_t out = 0x1000u + (uint32_t)r, in = 0;
    hvd_req reqs[2];

    if (c->ops->irecv(c->tp, peer, HVD_CHANNEL_DATA, &in, sizeof(in),
                      &reqs[0]) != HVD_OK ||
        c->ops->isend(c->tp, peer, HVD_CHANNEL_DATA, &out, sizeof(out),
                      &reqs[1]) != HVD_OK)
        return;
    for (int i = 0; i < 2; i++)
        while (!reqs[i].done)
            if (c->ops->progress(c->tp, 100) != HVD_OK)
                return;
    rc->exchanged = reqs[0].status == HVD_OK && reqs[1].status == HVD_OK &&
                    in == 0x1000u + (uint32_t)peer;
}

static void *rank_main(void *arg) {
    rank_ctx *rc = arg;
    hvd_transport_choice c;

    memset(&c, 0, sizeof(c));
    rc->status = hvd_transport_choose(rc->want, &rc->params, &c);
    if (rc->status != HVD_OK) {
        snprintf(rc->error, sizeof(rc->error), "%s", hvd_error_get());
        /* Nothing is left open on failure. */
        rc->has_local = c.tp != NULL || c.local_tp != NULL;
        return NULL;
    }
    snprintf(rc->chosen, sizeof(rc->chosen), "%s", c.ops->name);
    rc->has_local = c.local_ops != NULL;
    rc->reach = (int)c.caps.reach;
    exchange(rc, &c);
    if (hvd_transport_choice_shutdown(&c) != HVD_OK)
        rc->exchanged = 0;
    hvd_transport_choice_close(&c);
    return NULL;
}

/* Runs a job of NRANKS threads on the hosts given, wanting want. */
static void run_job(const char *want, const char *host0, const char *host1,
                    rank_ctx *ranks) {
    thread_bootstrap tb;
    pthread_t th[NRANKS];
    const char *hosts[NRANKS] = {host0, host1};

    thread_bootstrap_init(&tb, NRANKS, -1);
    for (int r = 0; r < NRANKS; r++) {
        rank_ctx *rc = &ranks[r];
        hvd_transport_params *p = &rc->params;
        memset(rc, 0, sizeof(*rc));
        rc->want = want;
        rc->bs = thread_bootstrap_of(&tb, r);
        for (int q = 0; q < NRANKS; q++) {
            snprintf(rc->hosts[q], HVD_HOST_MAX, "%s", hosts[q]);
            rc->pids[q] = (int)getpid();
        }
        rc->env[0] = (hvd_env_var){NULL, NULL};
        p->rank = r;
        p->size = NRANKS;
        p->bootstrap = &rc->bs;
        for (int i = 0; i < HVD_JOB_ID_LEN; i++)
            p->job_id[i] = (uint8_t)(0x70 + i);
        p->secret = "choose-secret";
        p->hosts = (const char(*)[HVD_HOST_MAX])rc->hosts;
        p->pids = rc->pids;
        p->gpu_device = -1;
        p->timeout_ns = 30LL * 1000000000LL;
        p->connect_timeout_ns = 30LL * 1000000000LL;
        p->env = hvd_env_vars_get;
        p->env_ctx = rc->env;
        p->launcher_addr = "127.0.0.1";
    }
    for (int r = 0; r < NRANKS; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ranks[r]), 0);
    for (int r = 0; r < NRANKS; r++)
        pthread_join(th[r], NULL);
    thread_bootstrap_destroy(&tb);
}

static void wanted_values(void **state) {
    (void)state;
    assert_int_equal(hvd_transport_check_want("auto", NULL), HVD_OK);
    assert_int_equal(hvd_transport_check_want("AUTO", NULL), HVD_OK);
    assert_int_equal(hvd_transport_check_want("tcp", NULL), HVD_OK);
    assert_int_equal(hvd_transport_check_want("TCP", NULL), HVD_OK);
    assert_int_equal(hvd_transport_check_want("shm", NULL), HVD_OK);
    assert_int_equal(hvd_transport_check_want("carrier-pigeon", "nccl"),
                     HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_TRANSPORT=carrier-pigeon"));
    assert_non_null(strstr(hvd_error_get(), "auto, tcp"));
    assert_non_null(strstr(hvd_error_get(), ", nccl"));
    /* A transport hvd knows but this build lacks says what it needs. */
    if (hvd_transport_find("verbs") == NULL) {
        assert_non_null(hvd_transport_needs("verbs"));
        assert_int_equal(hvd_transport_check_want("verbs", NULL),
                         HVD_ERR_UNSUPPORTED);
        assert_non_null(strstr(hvd_error_get(), "not built"));
    } else {
        assert_int_equal(hvd_transport_check_want("verbs", NULL), HVD_OK);
    }
}

static void named_tcp_on_one_host(void **state) {
    rank_ctx ranks[NRANKS];

    (void)state;
    run_job("tcp", "host-a", "host-a", ranks);
    for (int r = 0; r < NRANKS; r++) {
        assert_int_equal(ranks[r].status, HVD_OK);
        assert_string_equal(ranks[r].chosen, "tcp");
        assert_int_equal(ranks[r].has_local, 0);
        assert_int_equal(ranks[r].exchanged, 1);
    }
}

static void named_shm_across_hosts(void **state) {
    rank_ctx ranks[NRANKS];

    (void)state;
    run_job("shm", "host-a", "host-b", ranks);
    for (int r = 0; r < NRANKS; r++) {
        assert_int_equal(ranks[r].status, HVD_ERR_UNSUPPORTED);
        assert_non_null(strstr(ranks[r].error, "HVD_TRANSPORT=shm"));
        assert_non_null(strstr(ranks[r].error, "2 hosts"));
        assert_int_equal(ranks[r].has_local, 0);
    }
}

static void auto_across_hosts(void **state) {
    rank_ctx ranks[NRANKS];

    (void)state;
    run_job("auto", "host-a", "host-b", ranks);
    for (int r = 0; r < NRANKS; r++) {
        assert_int_equal(ranks[r].status, HVD_OK);
        assert_true(ranks[r].reach & HVD_REACH_OTHER_HOSTS);
        assert_string_equal(ranks[r].chosen, ranks[0].chosen);
        assert_int_equal(ranks[r].has_local, 0);
        assert_int_equal(ranks[r].exchanged, 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wanted_values),
        cmocka_unit_test(named_tcp_on_one_host),
        cmocka_unit_test(named_shm_across_hosts),
        cmocka_unit_test(auto_across_hosts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
