/*
 * The path selector: size buckets, the cost model's choices (asserted from
 * the table, never from timings), forced algorithms, tuning files written
 * and read back, malformed tuning files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "collectives/coll.h"
#include "collectives/select.h"

/* A job on hosts x ranks, with links like loopback TCP and shared memory
 * on a small machine. */
static hvd_model model(int hosts, int ranks_per_host, int with_shm) {
    hvd_model m;

    memset(&m, 0, sizeof(m));
    m.size = hosts * ranks_per_host;
    m.local_size = ranks_per_host;
    m.cross_size = hosts;
    m.direct = with_shm;
    m.hier = with_shm && hosts > 1;
    for (int t = 0; t < HVD_NTPS; t++)
        for (int c = 0; c < HVD_NCLASSES; c++)
            m.link[t][c].alpha = -1;
    if (hosts == 1)
        m.link[HVD_TP_NET][HVD_CLASS_SAME_HOST] = (hvd_link){10e-6, 0.5e-9};
    else
        m.link[HVD_TP_NET][HVD_CLASS_OTHER_HOST] = (hvd_link){50e-6, 1e-9};
    if (with_shm)
        m.link[HVD_TP_SHM][HVD_CLASS_SAME_HOST] = (hvd_link){2e-6, 0.2e-9};
    m.get_beta = 0.1e-9;
    m.gamma = 0.1e-9;
    m.chunk[HVD_TP_NET] = 512 * 1024;
    m.chunk[HVD_TP_SHM] = 256 * 1024;
    return m;
}

static const hvd_choice *entry(const hvd_selector *s, hvd_coll_kind k,
                               hvd_peer_class c, size_t bytes) {
    return &s->t[k][c][hvd_sel_bucket(bytes)];
}

static void buckets(void **state) {
    (void)state;
    assert_int_equal(hvd_sel_bucket(0), 0);
    assert_int_equal(hvd_sel_bucket(1), 0);
    assert_int_equal(hvd_sel_bucket(2), 1);
    assert_int_equal(hvd_sel_bucket(3), 2);
    assert_int_equal(hvd_sel_bucket(4), 2);
    assert_int_equal(hvd_sel_bucket(5), 3);
    assert_int_equal(hvd_sel_bucket((size_t)1 << 20), 20);
    assert_int_equal(hvd_sel_bucket(((size_t)1 << 20) + 1), 21);
    assert_int_equal(hvd_sel_bucket((size_t)-1), HVD_SEL_BUCKETS - 1);
}

static void one_host_small_and_large_differ(void **state) {
    (void)state;
    hvd_model m = model(1, 4, 1);
    hvd_selector s;

    hvd_select_from_model(&m, &s);
    const hvd_choice *small =
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 8);
    const hvd_choice *large =
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 64 << 20);
    /* Latency-bound: shared memory, recursive doubling. Bandwidth-bound:
     * the direct one-sided reads. */
    assert_int_equal(small->tp, HVD_TP_SHM);
    assert_int_equal(small->algo, HVD_ALGO_RD);
    assert_int_equal(large->tp, HVD_TP_SHM);
    assert_int_equal(large->algo, HVD_ALGO_DIRECT);
    assert_int_equal(large->chunk, 256 * 1024);
    assert_int_equal(
        entry(&s, HVD_COLL_BROADCAST, HVD_CLASS_SAME_HOST, 64 << 20)->algo,
        HVD_ALGO_DIRECT);
    assert_int_equal(
        entry(&s, HVD_COLL_ALLGATHER, HVD_CLASS_SAME_HOST, 64 << 20)->algo,
        HVD_ALGO_DIRECT);
}

static void one_host_without_shm(void **state) {
    (void)state;
    hvd_model m = model(1, 4, 0);
    hvd_selector s;

    hvd_select_from_model(&m, &s);
    const hvd_choice *small =
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 8);
    const hvd_choice *large =
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 64 << 20);
    assert_int_equal(small->tp, HVD_TP_NET);
    assert_int_equal(small->algo, HVD_ALGO_RD);
    assert_int_equal(large->tp, HVD_TP_NET);
    assert_true(large->algo == HVD_ALGO_RING ||
                large->algo == HVD_ALGO_RABENSEIFNER);
    assert_int_equal(
        entry(&s, HVD_COLL_BROADCAST, HVD_CLASS_SAME_HOST, 8)->algo,
        HVD_ALGO_TREE);
    /* Nothing picks what cannot run. */
    for (int k = 0; k < HVD_COLL_NKINDS; k++)
        for (int b = 0; b < HVD_SEL_BUCKETS; b++)
            assert_int_not_equal(s.t[k][HVD_CLASS_SAME_HOST][b].algo,
                                 HVD_ALGO_DIRECT);
}

static void two_hosts_take_hier_for_large(void **state) {
    (void)state;
    hvd_model m = model(2, 2, 1);
    hvd_selector s;

    hvd_select_from_model(&m, &s);
    assert_int_equal(
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_OTHER_HOST, 64 << 20)->algo,
        HVD_ALGO_HIER);
    /* Small ones too while shared memory is much faster than the network;
     * not once the same-host phases cost more than a flat exchange. */
    assert_int_equal(
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_OTHER_HOST, 8)->algo,
        HVD_ALGO_HIER);
    m.link[HVD_TP_SHM][HVD_CLASS_SAME_HOST].alpha = 100e-6;
    hvd_select_from_model(&m, &s);
    assert_int_equal(
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_OTHER_HOST, 8)->algo,
        HVD_ALGO_RD);
    /* The middle of hier: two ranks, one a host. */
    const hvd_choice *x =
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_CROSS, 32 << 20);
    assert_int_equal(x->tp, HVD_TP_NET);
    assert_true(x->algo == HVD_ALGO_RING || x->algo == HVD_ALGO_RD ||
                x->algo == HVD_ALGO_RABENSEIFNER);
    /* Without shared memory there is no hier. */
    m = model(2, 2, 0);
    hvd_select_from_model(&m, &s);
    for (int b = 0; b < HVD_SEL_BUCKETS; b++)
        assert_int_not_equal(
            s.t[HVD_COLL_ALLREDUCE][HVD_CLASS_OTHER_HOST][b].algo,
            HVD_ALGO_HIER);
}

static void native_preferred_when_mpi(void **state) {
    (void)state;
    hvd_model m = model(2, 1, 0);
    hvd_selector s;

    m.native = 1;
    hvd_select_from_model(&m, &s);
    for (int b = 0; b < HVD_SEL_BUCKETS; b++)
        assert_int_equal(s.t[HVD_COLL_ALLREDUCE][HVD_CLASS_OTHER_HOST][b].algo,
                         HVD_ALGO_NATIVE);
}

static void forcing(void **state) {
    (void)state;
    hvd_model m = model(1, 3, 1);
    hvd_selector s;

    hvd_select_from_model(&m, &s);
    assert_true(hvd_select_force(&m, &s, HVD_COLL_ALLREDUCE, HVD_ALGO_RING) >
                0);
    for (int b = 0; b < HVD_SEL_BUCKETS; b++)
        assert_int_equal(s.t[HVD_COLL_ALLREDUCE][HVD_CLASS_SAME_HOST][b].algo,
                         HVD_ALGO_RING);
    /* hier cannot run on one host; direct cannot run without shm. */
    assert_int_equal(
        hvd_select_force(&m, &s, HVD_COLL_ALLREDUCE, HVD_ALGO_HIER), 0);
    m = model(1, 3, 0);
    hvd_select_from_model(&m, &s);
    assert_int_equal(
        hvd_select_force(&m, &s, HVD_COLL_ALLREDUCE, HVD_ALGO_DIRECT), 0);
    assert_int_equal(
        hvd_select_force(&m, &s, HVD_COLL_ALLREDUCE, HVD_ALGO_NATIVE), 0);
}

static int same_table(const hvd_selector *a, const hvd_selector *b) {
    for (int k = 0; k < HVD_COLL_NKINDS; k++)
        for (int c = 0; c < HVD_NCLASSES; c++)
            for (int i = 0; i < HVD_SEL_BUCKETS; i++) {
                const hvd_choice *x = &a->t[k][c][i], *y = &b->t[k][c][i];
                if (x->tp != y->tp || x->algo != y->algo ||
                    x->chunk != y->chunk)
                    return 0;
            }
    return 1;
}

static void tuning_file_round_trip(void **state) {
    (void)state;
    hvd_model m = model(2, 2, 1);
    hvd_selector a, b;
    char text[16384], err[256];

    hvd_select_from_model(&m, &a);
    /* Something the model would not choose, so the file matters. */
    a.t[HVD_COLL_ALLREDUCE][HVD_CLASS_OTHER_HOST][10].algo =
        HVD_ALGO_RABENSEIFNER;
    a.t[HVD_COLL_ALLREDUCE][HVD_CLASS_OTHER_HOST][10].chunk = 4096;
    size_t len = hvd_select_format(&a, text, sizeof(text));
    assert_true(len > 0 && len < sizeof(text));

    /* Read over a table that differs everywhere. */
    hvd_model other = model(2, 2, 1);
    other.link[HVD_TP_NET][HVD_CLASS_OTHER_HOST].alpha = 1e-9;
    hvd_select_from_model(&other, &b);
    assert_int_equal(hvd_select_parse(text, &m, &b, err, sizeof(err)), 0);
    assert_true(same_table(&a, &b));
    assert_int_equal(b.t[HVD_COLL_ALLREDUCE][HVD_CLASS_OTHER_HOST][10].tuned,
                     1);
}

static void tuning_file_partial_and_comments(void **state) {
    (void)state;
    hvd_model m = model(1, 2, 1);
    hvd_selector s, model_only;
    char err[256];
    const char *text = "# written by hand\n"
                       "\n"
                       "allreduce same-host 4096 net rd 65536   # small\n"
                       "allreduce same-host 1048576 shm ring 131072\n"
                       "broadcast other-host 100 tcp tree 4096\n";

    hvd_select_from_model(&m, &s);
    model_only = s;
    assert_int_equal(hvd_select_parse(text, &m, &s, err, sizeof(err)), 0);
    const hvd_choice *e =
        entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 4096);
    assert_int_equal(e->tp, HVD_TP_NET);
    assert_int_equal(e->algo, HVD_ALGO_RD);
    assert_int_equal(e->chunk, 65536);
    e = entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 4097);
    assert_int_equal(e->tp, HVD_TP_SHM);
    assert_int_equal(e->algo, HVD_ALGO_RING);
    e = entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 1 << 20);
    assert_int_equal(e->algo, HVD_ALGO_RING);
    /* Beyond the last line: the model's. */
    e = entry(&s, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 64 << 20);
    assert_memory_equal(
        e,
        entry(&model_only, HVD_COLL_ALLREDUCE, HVD_CLASS_SAME_HOST, 64 << 20),
        sizeof(*e));
    /* A class the job does not have (one host): skipped, not an error. */
    e = entry(&s, HVD_COLL_BROADCAST, HVD_CLASS_OTHER_HOST, 8);
    assert_int_equal(e->tuned, 0);
}

static void tuning_file_malformed(void **state) {
    (void)state;
    static const char *const bad[] = {
        "allreduce same-host 4096 net rd\n",
        "allreduce same-host 4096 net rd 65536 extra\n",
        "reduce same-host 4096 net rd 65536\n",
        "allreduce near 4096 net rd 65536\n",
        "allreduce same-host 4096 ib rd 65536\n",
        "allreduce same-host 4096 net fastest 65536\n",
        "allreduce same-host 4096 net auto 65536\n",
        "allreduce same-host 4096 net rd 8\n",
        "allreduce same-host lots net rd 65536\n",
    };
    hvd_model m = model(1, 2, 1);
    hvd_selector s;
    char err[256];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hvd_select_from_model(&m, &s);
        err[0] = '\0';
        assert_int_equal(hvd_select_parse(bad[i], &m, &s, err, sizeof(err)),
                         -1);
        assert_true(strstr(err, "line 1") != NULL);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buckets),
        cmocka_unit_test(one_host_small_and_large_differ),
        cmocka_unit_test(one_host_without_shm),
        cmocka_unit_test(two_hosts_take_hier_for_large),
        cmocka_unit_test(native_preferred_when_mpi),
        cmocka_unit_test(forcing),
        cmocka_unit_test(tuning_file_round_trip),
        cmocka_unit_test(tuning_file_partial_and_comments),
        cmocka_unit_test(tuning_file_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
