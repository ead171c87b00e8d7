/*
 * Rank 0's vote table and the stall inspector of cached operations
 * (api/runtime/engine_vote.c), on the smallest engine state they read: a
 * zeroed hvd_engine with its rank and size, a cache holding a few names,
 * the job's process set (and one of two ranks), the vote table and, for
 * the updates, a coordinator. No thread, no transport.
 *
 * The internal functions called (api/runtime/engine_state.h):
 * hvd_eng_vote_init, hvd_eng_vote_free, hvd_eng_vote_offers,
 * hvd_eng_vote_reset, hvd_eng_vote_clear, hvd_eng_vote_erase,
 * hvd_eng_vote_deadline, hvd_eng_vote_stalls, hvd_eng_apply_update; and
 * from their own headers hvd_cache_init/put/destroy and
 * hvd_coord_create/destroy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/engine_state.h"

#define SIZE 4
#define CAP 8

typedef struct fixture {
    hvd_engine *eng;
    pset sets[2];
    int set1_ranks[2];
    uint64_t counts[1];
} fixture;

/* Rank 0 of SIZE ranks; slots 0 to 2 hold "a", "b", "c" in the job, and
 * slot 3 "d" in process set 1 (ranks 0 and 2). */
static int setup(void **state) {
    fixture *f = calloc(1, sizeof(*f));
    hvd_engine *eng = calloc(1, sizeof(*eng));
    static const char *const names[] = {"a", "b", "c", "d"};

    if (f == NULL || eng == NULL)
        return -1;
    f->eng = eng;
    eng->rank = 0;
    eng->size = SIZE;
    eng->cycle = 5;
    f->counts[0] = 16;
    f->set1_ranks[0] = 0;
    f->set1_ranks[1] = 2;
    f->sets[0] = (pset){.size = SIZE, .index = 0};
    f->sets[1] = (pset){.size = 2, .index = 0, .ranks = f->set1_ranks};
    eng->psets = f->sets;
    eng->npsets = 2;
    if (hvd_cache_init(&eng->cache, CAP) != 0 ||
        hvd_eng_vote_init(&eng->vt, SIZE, CAP) != 0 ||
        hvd_coord_create(SIZE, 0, 0, &eng->coord) != HVD_OK)
        return -1;
    for (int s = 0; s < 4; s++) {
        hvd_opdesc d;
        memset(&d, 0, sizeof(d));
        d.kind = HVD_KIND_ALLREDUCE;
        d.dtype = HVD_FLOAT32;
        d.op = HVD_SUM;
        d.pset = s == 3 ? 1 : 0;
        d.ncounts = 1;
        d.counts = f->counts;
        if (hvd_cache_put(&eng->cache, names[s], &d, 1) != s)
            return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;

    hvd_coord_destroy(f->eng->coord);
    hvd_eng_vote_free(&f->eng->vt);
    hvd_cache_destroy(&f->eng->cache);
    free(f->eng);
    free(f);
    return 0;
}

static int vote(const hvd_engine *eng, int rank, int slot) {
    return eng->vt
        .votes[(size_t)rank * (size_t)eng->vt.capacity + (size_t)slot];
}

static void offer(hvd_engine *eng, int rank, const uint32_t *slots, size_t n,
                  double now) {
    hvd_eng_vote_offers(eng, rank, slots, n, now);
}

/* A rank's votes are the slots of its last step: new ones count from
 * when they first came, withdrawn ones stop counting, repeated ones count
 * once, slots past the table are ignored. */
static void offers_count_once(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    vote_table *vt = &eng->vt;
    const uint32_t first[] = {0, 2, 2, CAP + 3};
    const uint32_t second[] = {0};

    offer(eng, 1, first, 4, 10.0);
    assert_int_equal(vote(eng, 1, 0), 1);
    assert_int_equal(vote(eng, 1, 2), 1);
    assert_int_equal(vt->count[0], 1);
    assert_int_equal(vt->count[2], 1);
    assert_int_equal(vt->total, 2);
    assert_true(vt->first[0] == 10.0);
    assert_true(vt->warned[0] < 0);
    /* The next step offers slot 0 only: its vote for 2 is gone, and slot
     * 0 keeps the time of its first vote. */
    offer(eng, 1, second, 1, 11.0);
    assert_int_equal(vote(eng, 1, 2), 0);
    assert_int_equal(vt->count[2], 0);
    assert_int_equal(vt->count[0], 1);
    assert_int_equal(vt->total, 1);
    assert_true(vt->first[0] == 10.0);
    /* Another rank's vote for the same slot. */
    offer(eng, 3, second, 1, 12.0);
    assert_int_equal(vt->count[0], 2);
    assert_int_equal(vt->total, 2);
    assert_true(vt->first[0] == 10.0);
    /* A step that offers nothing withdraws everything it had offered. */
    offer(eng, 1, NULL, 0, 13.0);
    offer(eng, 3, NULL, 0, 13.0);
    assert_int_equal(vt->count[0], 0);
    assert_int_equal(vt->total, 0);
}

/* A slot that the current cycle ran (or erased, or reused) does not take
 * the offers of a step that was sent before the rank knew. */
static void offers_of_a_slot_just_run(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    vote_table *vt = &eng->vt;
    const uint32_t slots[] = {1};

    hvd_eng_vote_reset(vt, SIZE, 1, eng->cycle);
    assert_int_equal(vt->changed[1], eng->cycle);
    offer(eng, 2, slots, 1, 20.0);
    assert_int_equal(vote(eng, 2, 1), 0);
    assert_int_equal(vt->count[1], 0);
    /* From the next cycle on it counts again. */
    eng->cycle++;
    offer(eng, 2, slots, 1, 21.0);
    assert_int_equal(vote(eng, 2, 1), 1);
    assert_int_equal(vt->count[1], 1);
}

static void reset_clear_and_erase(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    vote_table *vt = &eng->vt;
    const uint32_t slots[] = {0, 1};

    for (int r = 0; r < 3; r++)
        offer(eng, r, slots, 2, 1.0);
    assert_int_equal(vt->total, 6);
    /* Reset: the votes go, and the cycle that changed the slot is kept. */
    hvd_eng_vote_reset(vt, SIZE, 0, 7);
    assert_int_equal(vt->count[0], 0);
    assert_int_equal(vt->total, 3);
    assert_int_equal(vt->changed[0], 7);
    for (int r = 0; r < SIZE; r++)
        assert_int_equal(vote(eng, r, 0), 0);
    /* Clear: the votes go, nothing else. */
    hvd_eng_vote_clear(vt, SIZE, 1);
    assert_int_equal(vt->count[1], 0);
    assert_int_equal(vt->total, 0);
    assert_int_equal(vt->changed[1], 0);
    /* Erase marks a slot once, however often it is asked. */
    hvd_eng_vote_erase(vt, 2);
    hvd_eng_vote_erase(vt, 2);
    hvd_eng_vote_erase(vt, 3);
    assert_int_equal(vt->nerase, 2);
    assert_int_equal(vt->erase[2], 1);
    assert_int_equal(vt->erase[3], 1);
    assert_int_equal(vt->erase[0], 0);
}

/* When the stall inspector must look next: the warning of the oldest
 * partly voted slot, then every stall_check_s after its last warning, or
 * its shutdown if that comes first; none while every slot has all its
 * ranks' votes or none. */
static void deadline(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    const uint32_t a[] = {0}, ab[] = {0, 1};

    eng->cfg.stall_check_s = 2;
    assert_true(hvd_eng_vote_deadline(eng) == -1);
    offer(eng, 0, ab, 2, 100.0);
    offer(eng, 1, a, 1, 101.0);
    assert_true(hvd_eng_vote_deadline(eng) == 102.0);
    eng->vt.warned[0] = 103.0;
    eng->vt.warned[1] = 103.0;
    assert_true(hvd_eng_vote_deadline(eng) == 105.0);
    eng->cfg.stall_shutdown_s = 4;
    assert_true(hvd_eng_vote_deadline(eng) == 104.0);
    /* Every rank voted for slot 0 and slot 1 is withdrawn: none waits. */
    offer(eng, 2, a, 1, 106.0);
    offer(eng, 3, a, 1, 106.0);
    offer(eng, 0, a, 1, 106.0);
    assert_int_equal(eng->vt.count[0], SIZE);
    assert_int_equal(eng->vt.count[1], 0);
    assert_true(hvd_eng_vote_deadline(eng) == -1);
}

/* Warnings only, while stall_shutdown_s is 0: no response, the votes
 * stay, and the warning time moves on. */
static void stall_warns(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    const uint32_t c[] = {2};
    Hvd__Engine__ResponseList list = HVD__ENGINE__RESPONSE_LIST__INIT;

    eng->cfg.stall_check_s = 1;
    offer(eng, 0, c, 1, 50.0);
    offer(eng, 1, c, 1, 50.0);
    assert_int_equal(hvd_eng_vote_stalls(eng, 50.5, &list), HVD_OK);
    assert_true(eng->vt.warned[2] < 0);
    assert_int_equal(hvd_eng_vote_stalls(eng, 51.0, &list), HVD_OK);
    assert_true(eng->vt.warned[2] == 51.0);
    assert_int_equal(list.n_responses, 0);
    assert_int_equal(eng->vt.count[2], 2);
    /* Not again before another stall_check_s. */
    assert_int_equal(hvd_eng_vote_stalls(eng, 51.5, &list), HVD_OK);
    assert_true(eng->vt.warned[2] == 51.0);
    assert_int_equal(hvd_eng_vote_stalls(eng, 52.0, &list), HVD_OK);
    assert_true(eng->vt.warned[2] == 52.0);
}

/* Past stall_shutdown_s a TIMEOUT response names the ranks that never
 * offered it, and its votes are cleared. */
static void stall_shuts_down(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    const uint32_t b[] = {1};
    Hvd__Engine__ResponseList list = HVD__ENGINE__RESPONSE_LIST__INIT;

    eng->cfg.stall_shutdown_s = 3;
    offer(eng, 0, b, 1, 10.0);
    offer(eng, 2, b, 1, 10.0);
    assert_int_equal(hvd_eng_vote_stalls(eng, 12.9, &list), HVD_OK);
    assert_int_equal(list.n_responses, 0);
    assert_int_equal(hvd_eng_vote_stalls(eng, 13.0, &list), HVD_OK);
    assert_int_equal(list.n_responses, 1);
    Hvd__Engine__Response *r = list.responses[0];
    assert_string_equal(r->name, "b");
    assert_int_equal(r->status, HVD_ERR_TIMEOUT);
    assert_non_null(strstr(r->error, "rank(s) 1,3 "));
    assert_int_equal(r->n_counts, 1);
    assert_int_equal(r->counts[0], 16);
    assert_int_equal(eng->vt.count[1], 0);
    assert_int_equal(eng->vt.total, 0);
    hvd_coord_free_responses(&list);
}

/* A rank that has stopped without offering the slot never will: a
 * SHUTDOWN response at once, whatever the time. */
static void stall_of_a_stopped_rank(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    const uint32_t a[] = {0};
    Hvd__Engine__ResponseList list = HVD__ENGINE__RESPONSE_LIST__INIT;

    offer(eng, 0, a, 1, 10.0);
    offer(eng, 1, a, 1, 10.0);
    offer(eng, 2, a, 1, 10.0);
    eng->vt.stop[3] = 1;
    assert_int_equal(hvd_eng_vote_stalls(eng, 10.0, &list), HVD_OK);
    assert_int_equal(list.n_responses, 1);
    assert_int_equal(list.responses[0]->status, HVD_ERR_SHUTDOWN);
    assert_non_null(strstr(list.responses[0]->error, "rank(s) 3 called"));
    hvd_coord_free_responses(&list);
}

/* A slot of a process set waits only for its members. */
static void stall_in_a_process_set(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    const uint32_t d[] = {3};
    Hvd__Engine__ResponseList list = HVD__ENGINE__RESPONSE_LIST__INIT;

    eng->cfg.stall_check_s = 1;
    eng->cfg.stall_shutdown_s = 2;
    offer(eng, 0, d, 1, 1.0);
    offer(eng, 2, d, 1, 1.0);
    /* Both members voted: nothing waits, though ranks 1 and 3 did not. */
    assert_true(hvd_eng_vote_deadline(eng) == -1);
    assert_int_equal(hvd_eng_vote_stalls(eng, 100.0, &list), HVD_OK);
    assert_int_equal(list.n_responses, 0);
    /* Rank 2 withdraws: the slot waits for rank 2 only. */
    offer(eng, 2, NULL, 0, 1.0);
    assert_true(hvd_eng_vote_deadline(eng) == 2.0);
    assert_int_equal(hvd_eng_vote_stalls(eng, 100.0, &list), HVD_OK);
    assert_int_equal(list.n_responses, 1);
    assert_non_null(strstr(list.responses[0]->error, "rank(s) 2 "));
    hvd_coord_free_responses(&list);
}

/* An update: its invalidations mark slots to erase, stop marks the rank;
 * bytes that are no update are refused, naming the rank. */
static void updates(void **state) {
    fixture *f = *state;
    hvd_engine *eng = f->eng;
    Hvd__Engine__Update u = HVD__ENGINE__UPDATE__INIT;
    uint32_t inval[] = {1, 2, CAP + 1};
    uint8_t buf[256];
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff};

    u.n_invalidate = 3;
    u.invalidate = inval;
    u.stop = 1;
    size_t len = hvd__engine__update__get_packed_size(&u);
    assert_true(len <= sizeof(buf));
    hvd__engine__update__pack(&u, buf);
    assert_int_equal(hvd_eng_apply_update(eng, 2, buf, len, 1.0), HVD_OK);
    assert_int_equal(eng->vt.nerase, 2);
    assert_int_equal(eng->vt.erase[1], 1);
    assert_int_equal(eng->vt.erase[2], 1);
    assert_int_equal(eng->vt.stop[2], 1);
    assert_int_equal(eng->vt.stop[1], 0);
    assert_int_equal(hvd_eng_apply_update(eng, 3, junk, sizeof(junk), 1.0),
                     HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "malformed update from rank 3"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(offers_count_once, setup, teardown),
        cmocka_unit_test_setup_teardown(offers_of_a_slot_just_run, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(reset_clear_and_erase, setup, teardown),
        cmocka_unit_test_setup_teardown(deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(stall_warns, setup, teardown),
        cmocka_unit_test_setup_teardown(stall_shuts_down, setup, teardown),
        cmocka_unit_test_setup_teardown(stall_of_a_stopped_rank, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(stall_in_a_process_set, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(updates, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
