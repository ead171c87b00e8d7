/*
 * The engine's passes (api/runtime/engine_cycle.c) on one rank of two, the
 * other played by the test through the fake transport of engine_fake.c:
 * when a step starts (a cached request to offer, a decision of rank 0, the
 * other rank's part), when its cycle runs (once every part is here), rank
 * 0's decisions (an erasure, every rank stopping), the express step, and
 * the spin of a polling thread. No thread: each pass only looks
 * (block = 0), and the fake transport has nothing to wait for.
 *
 * The internal functions called (api/runtime/engine_state.h):
 * hvd_eng_pass, hvd_eng_express_step, hvd_eng_spin, hvd_eng_invalidate,
 * hvd_eng_retire, and through engine_fake.c hvd_eng_take and hvd_eng_pump.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/engine_fake.h"

#define N 4 /* floats per tensor: 16 bytes, carried */

static int setup_rank(void **state, int rank) {
    ef_engine *ef = calloc(1, sizeof(*ef));

    if (ef == NULL || ef_setup(ef, rank, 2, 8) != 0 ||
        ef_cache(ef, "a", N) != 0)
        return -1;
    /* A rank that stops waits this long for the others: never, here. */
    ef->eng->cfg.timeout_ns = 3600 * NS_PER_S;
    *state = ef;
    return 0;
}

static int setup0(void **state) { return setup_rank(state, 0); }
static int setup1(void **state) { return setup_rank(state, 1); }

static int teardown(void **state) {
    ef_engine *ef = *state;

    ef_teardown(ef);
    free(ef);
    return 0;
}

static void pass_ok(ef_engine *ef, int want_last) {
    int last = -1;

    assert_int_equal(hvd_eng_pass(ef->eng, 0, &last), HVD_OK);
    assert_int_equal(last, want_last);
}

/* Rank 0 with nothing to offer or decide starts no step. */
static void idle_rank0_starts_nothing(void **state) {
    ef_engine *ef = *state;

    pass_ok(ef, 0);
    pass_ok(ef, 0);
    assert_int_equal(ef->eng->in_step, 0);
    assert_int_equal(ef->eng->cycle, 0);
    assert_int_equal(ef->tp.sent[1].nsends, 0);
}

/* A cached request starts a step: rank 0's part (with its decision,
 * numbered as the step) goes out once; the cycle runs when rank 1's part
 * comes, and not before. */
static void cached_request_starts_step(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, ra[N], peer[N] = {1, 1, 1, 1};
    const float want[N] = {2, 3, 4, 5};
    const uint32_t slot[] = {0};
    hvd_request *qa = ef_request(ef, "a", N, a, ra);

    assert_int_equal(qa->state, REQ_CACHED);
    pass_ok(ef, 0);
    assert_int_equal(eng->in_step, 1);
    assert_int_equal(ef->tp.sent[1].nsends, 1);
    assert_int_equal(eng->mine.msg->number, 1);
    assert_int_equal(eng->mine.msg->n_ready, 1);
    assert_ptr_equal(eng->mine.msg->cycle, &eng->decision);
    assert_int_equal(eng->decision.number, 1);
    /* Waiting for rank 1: nothing more goes out, nothing runs. */
    pass_ok(ef, 0);
    assert_int_equal(ef->tp.sent[1].nsends, 1);
    assert_int_equal(eng->cycle, 0);
    assert_int_equal(qa->done, 0);
    ef_peer_step(ef, 1, 1, slot, 1, slot, 1, peer, sizeof(peer), NULL);
    pass_ok(ef, 0);
    assert_int_equal(eng->cycle, 1);
    assert_int_equal(eng->in_step, 0);
    assert_int_equal(qa->done, 1);
    assert_memory_equal(ra, want, sizeof(ra));
    /* Done: the next pass starts no step. */
    pass_ok(ef, 0);
    assert_int_equal(ef->tp.sent[1].nsends, 1);
}

/* Rank 1 with nothing of its own answers rank 0's part with its own
 * (empty) at once, and the cycle runs in the same pass. */
static void peer_part_starts_step(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    Hvd__Engine__Cycle dec = HVD__ENGINE__CYCLE__INIT;

    pass_ok(ef, 0);
    assert_int_equal(ef->tp.sent[0].nsends, 0);
    dec.number = 1;
    ef_peer_step(ef, 0, 1, NULL, 0, NULL, 0, NULL, 0, &dec);
    pass_ok(ef, 0);
    assert_int_equal(ef->tp.sent[0].nsends, 1);
    assert_int_equal(ef_sent_header(ef, 0).type, MSG_BRIEF);
    assert_int_equal(eng->cycle, 1);
    assert_int_equal(eng->in_step, 0);
}

/* An invalidated slot: rank 0 decides to erase it, which starts a step
 * with nothing offered; the cycle erases it here. */
static void rank0_decides_erase(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;

    assert_int_equal(hvd_eng_invalidate(eng, 0), 1);
    pass_ok(ef, 0);
    assert_int_equal(eng->in_step, 1);
    assert_int_equal(eng->vt.nerase, 1);
    assert_int_equal(eng->decision.n_erase, 1);
    assert_int_equal(eng->decision.erase[0], 0);
    assert_int_equal(eng->decision.stop, 0);
    assert_int_equal(ef_sent_header(ef, 1).type, MSG_STEP);
    ef_peer_step(ef, 1, 1, NULL, 0, NULL, 0, NULL, 0, NULL);
    pass_ok(ef, 0);
    assert_int_equal(eng->cycle, 1);
    assert_null(eng->cache.slots[0].name);
    assert_int_equal(eng->vt.nerase, 0);
    assert_int_equal(eng->vt.erase[0], 0);
}

/* Once every rank stops (rank 1 told rank 0 so; this rank is asked to),
 * rank 0 decides it: the step says so and is the last. */
static void rank0_decides_stop(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;

    eng->vt.stop[1] = 1; /* rank 1's update said it stops */
    pass_ok(ef, 0);
    assert_int_equal(eng->in_step, 0);
    eng->stop_requested = 1;
    pass_ok(ef, 0);
    assert_int_equal(eng->stop_told, 1);
    assert_int_equal(eng->vt.stop[0], 1);
    assert_int_equal(eng->in_step, 1);
    assert_int_equal(eng->decision.stop, 1);
    ef_peer_step(ef, 1, 1, NULL, 0, NULL, 0, NULL, 0, NULL);
    pass_ok(ef, 1);
    assert_int_equal(eng->cycle, 1);
}

/* The express step of rank 1's only request: its part goes out at once;
 * rank 0's has not come when the polling ends, so the step is left to
 * the passes, which run it once it comes. A request the cache does not
 * know takes no express step. */
static void express_step_leaves_rest_to_passes(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, ra[N], peer[N] = {2, 2, 2, 2};
    float x[N] = {0}, rx[N];
    const float want[N] = {3, 4, 5, 6};
    const uint32_t slot[] = {0};
    Hvd__Engine__Cycle dec = HVD__ENGINE__CYCLE__INIT;
    int last = -1;

    eng->cfg.spin_ns = 0;
    hvd_request *qx = ef_request(ef, "x", N, x, rx);
    assert_int_equal(qx->state, REQ_NEW);
    assert_int_equal(hvd_eng_express_step(eng, qx, &last), HVD_OK);
    assert_int_equal(last, 0);
    assert_int_equal(eng->in_step, 0);
    assert_int_equal(ef->tp.sent[0].nsends, 0);
    hvd_eng_retire(eng, qx); /* "x" is gone: "a" alone is pending */

    hvd_request *qa = ef_request(ef, "a", N, a, ra);
    assert_int_equal(hvd_eng_express_step(eng, qa, &last), HVD_OK);
    assert_int_equal(last, 0);
    assert_int_equal(eng->in_step, 1);
    assert_int_equal(ef->tp.sent[0].nsends, 1);
    assert_int_equal(qa->done, 0);
    dec.number = 1;
    ef_peer_step(ef, 0, 1, slot, 1, slot, 1, peer, sizeof(peer), &dec);
    pass_ok(ef, 0);
    assert_int_equal(eng->cycle, 1);
    assert_int_equal(qa->done, 1);
    assert_memory_equal(ra, want, sizeof(ra));
}

/* A polling thread reads the clock every 16 looks only: with no time to
 * spin, the 16th look ends it; with an hour, it goes on. */
static void spin_reads_clock_every_16(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    hvd_eng_spinner s = {0};

    eng->cfg.spin_ns = 0;
    for (unsigned n = 1; n < 16; n++)
        assert_int_equal(hvd_eng_spin(eng, n, &s), 1);
    assert_int_equal(s.start, 0);
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 0);
    assert_true(s.start > 0);

    memset(&s, 0, sizeof(s));
    eng->cfg.spin_ns = 3600 * NS_PER_S;
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 1);
    assert_true(s.start > 0);
    assert_int_equal(hvd_eng_spin(eng, 32, &s), 1);
    assert_int_equal(hvd_eng_spin(eng, 64, &s), 1);
}

/* A polling thread pauses between looks for its calm and yields after it;
 * one that outlasted its calm makes the next SPIN_HURRY yield from their
 * first look, after which one is calm again. */
static void spin_yields_after_calm(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    hvd_eng_spinner s = {0};

    eng->cfg.spin_ns = 3600 * NS_PER_S;
    eng->cfg.spin_yield = 0;
    eng->cfg.spin_calm_ns = 3600 * NS_PER_S;
    eng->spin_hurry = 0;
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 1);
    assert_int_equal(s.yield, 0);
    assert_int_equal(s.late, 0);
    hvd_eng_spin_end(eng, &s);
    assert_int_equal(eng->spin_hurry, 0);

    memset(&s, 0, sizeof(s));
    eng->cfg.spin_calm_ns = 0;
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 1);
    assert_int_equal(s.yield, 1);
    assert_int_equal(s.late, 1);
    hvd_eng_spin_end(eng, &s);
    assert_int_equal(eng->spin_hurry, SPIN_HURRY);

    /* Hurried: each yields at once, even with an hour of calm, until
     * SPIN_HURRY of them ended within it. */
    eng->cfg.spin_calm_ns = 3600 * NS_PER_S;
    for (int k = SPIN_HURRY; k > 0; k--) {
        memset(&s, 0, sizeof(s));
        assert_int_equal(hvd_eng_spin(eng, 16, &s), 1);
        assert_int_equal(s.yield, 1);
        assert_int_equal(s.late, 0);
        hvd_eng_spin_end(eng, &s);
        assert_int_equal(eng->spin_hurry, k - 1);
    }
    memset(&s, 0, sizeof(s));
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 1);
    assert_int_equal(s.yield, 0);

    /* A polling that ended before its first look at the clock was calm. */
    memset(&s, 0, sizeof(s));
    eng->spin_hurry = 1;
    assert_int_equal(hvd_eng_spin(eng, 1, &s), 1);
    hvd_eng_spin_end(eng, &s);
    assert_int_equal(eng->spin_hurry, 0);
}

/* Where other processes hold the cores (a loadavg that says so), a
 * polling never yields, not even hurried, pauses between looks for its
 * calm only and then lets its caller block; it does not count as late. */
static void spin_busy_host_never_yields(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    hvd_eng_spinner s = {0};
    char path[] = "/tmp/hvd-loadavg-XXXXXX";
    int fd = mkstemp(path);
    const char busy[] = "4.00 4.00 4.00 9/300 1234\n";

    assert_true(fd >= 0);
    assert_int_equal(write(fd, busy, sizeof(busy) - 1), sizeof(busy) - 1);
    close(fd);
    hvd_hostload_open(&eng->load, path, 2);
    eng->load_on = 1;
    eng->cfg.spin_ns = 3600 * NS_PER_S;
    eng->cfg.spin_yield = 0;
    eng->cfg.spin_calm_ns = 3600 * NS_PER_S;
    eng->spin_hurry = SPIN_HURRY;
    assert_int_equal(hvd_eng_spin(eng, 1, &s), 1);
    assert_int_equal(s.busy, 1);
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 1);
    assert_int_equal(s.yield, 0);
    hvd_eng_spin_end(eng, &s);
    assert_int_equal(eng->spin_hurry, SPIN_HURRY - 1);

    /* The calm over, the caller blocks, though spin_ns is an hour. */
    memset(&s, 0, sizeof(s));
    eng->cfg.spin_calm_ns = 0;
    assert_int_equal(hvd_eng_spin(eng, 1, &s), 1);
    assert_int_equal(hvd_eng_spin(eng, 16, &s), 0);
    assert_int_equal(s.late, 0);
    hvd_eng_spin_end(eng, &s);
    assert_int_equal(eng->spin_hurry, SPIN_HURRY - 2);

    hvd_hostload_close(&eng->load);
    eng->load_on = 0;
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(idle_rank0_starts_nothing, setup0,
                                        teardown),
        cmocka_unit_test_setup_teardown(cached_request_starts_step, setup0,
                                        teardown),
        cmocka_unit_test_setup_teardown(peer_part_starts_step, setup1,
                                        teardown),
        cmocka_unit_test_setup_teardown(rank0_decides_erase, setup0, teardown),
        cmocka_unit_test_setup_teardown(rank0_decides_stop, setup0, teardown),
        cmocka_unit_test_setup_teardown(express_step_leaves_rest_to_passes,
                                        setup1, teardown),
        cmocka_unit_test_setup_teardown(spin_yields_after_calm, setup0,
                                        teardown),
        cmocka_unit_test_setup_teardown(spin_busy_host_never_yields, setup0,
                                        teardown),
        cmocka_unit_test_setup_teardown(spin_reads_clock_every_16, setup1,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
