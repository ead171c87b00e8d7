/*
 * A step (api/runtime/engine_step.c) on rank 1 of 2, rank 0 played by the
 * test through the fake transport of engine_fake.c: this rank's part (the
 * slots it offers, the data it carries, what it sends), when the step is
 * complete, and finishing it: the slots every rank offered run (their
 * carried data reduced here, no collective), the lone-slot way of a step
 * of one slot, a slot only one rank offered waits for the next step, and
 * data carried for a slot that does not run is skipped.
 *
 * The internal functions called (api/runtime/engine_state.h):
 * hvd_eng_step_start, hvd_eng_step_complete, hvd_eng_step_finish, and
 * through engine_fake.c hvd_eng_take and hvd_eng_pump.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/engine_fake.h"

#define N 4 /* floats per tensor: 16 bytes, carried */

static int setup(void **state) {
    ef_engine *ef = calloc(1, sizeof(*ef));

    if (ef == NULL || ef_setup(ef, 1, 2, 8) != 0)
        return -1;
    /* Slots 0, 1: "a", "b" (carried); slot 2: "big" (too big to carry). */
    if (ef_cache(ef, "a", N) != 0 || ef_cache(ef, "b", N) != 1 ||
        ef_cache(ef, "big", 32) != 2)
        return -1;
    *state = ef;
    return 0;
}

static int teardown(void **state) {
    ef_engine *ef = *state;

    ef_teardown(ef);
    free(ef);
    return 0;
}

/* Rank 0's decision for step k: nothing but its number. */
static Hvd__Engine__Cycle decision(uint64_t k) {
    Hvd__Engine__Cycle c = HVD__ENGINE__CYCLE__INIT;

    c.number = k;
    return c;
}

static void finish_ok(ef_engine *ef) {
    int last = -1;

    assert_int_equal(hvd_eng_step_complete(ef->eng), 1);
    assert_int_equal(hvd_eng_step_finish(ef->eng, 0, &last), HVD_OK);
    assert_int_equal(last, 0);
    assert_int_equal(ef->eng->in_step, 0);
}

/* This rank's part offers every cached request, carries the small ones'
 * data (in offer order, 8-aligned) and goes to every peer at once. */
static void start_carries_data(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, ra[N], big[32] = {0}, rbig[32];
    hvd_request *qa = ef_request(ef, "a", N, a, ra);
    hvd_request *qbig = ef_request(ef, "big", 32, big, rbig);

    assert_int_equal(qa->state, REQ_CACHED);
    assert_int_equal(qbig->state, REQ_CACHED);
    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    assert_int_equal(eng->in_step, 1);
    const Hvd__Engine__Step *m = eng->mine.msg;
    assert_non_null(m);
    assert_int_equal(m->number, 1);
    assert_int_equal(m->n_ready, 2);
    assert_int_equal(m->ready[0], 0);
    assert_int_equal(m->ready[1], 2);
    assert_int_equal(m->n_carried, 1);
    assert_int_equal(m->carried[0], 0);
    assert_int_equal(eng->mine.data_len, sizeof(a));
    assert_memory_equal(eng->mine.data, a, sizeof(a));
    assert_int_equal(qa->voted, 1);
    assert_int_equal(qbig->voted, 1);
    /* What went to rank 0: one message, the data at the end of its body
     * (which follows the 16-byte header, the frame's padding included). */
    assert_int_equal(ef->tp.sent[0].nsends, 1);
    msg_header h = ef_sent_header(ef, 0);
    assert_true(h.type == MSG_BRIEF || h.type == MSG_STEP);
    assert_int_equal(h.len % 8, 0);
    assert_memory_equal(ef->tp.sent[0].bytes + sizeof(h) + h.len - sizeof(a), a,
                        sizeof(a));
    /* Rank 0's part has not come: the step is not complete. */
    assert_int_equal(hvd_eng_step_complete(eng), 0);
}

/* Both ranks offer and carry "a" and "b": the step runs both, each sum
 * computed here from the two parts, and the requests are done. */
static void finish_complete_step(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, b[N] = {10, 20, 30, 40}, ra[N], rb[N];
    float peer[2 * N] = {100, 200, 300, 400, 1000, 2000, 3000, 4000};
    const float want_a[N] = {101, 202, 303, 404};
    const float want_b[N] = {1010, 2020, 3030, 4040};
    const uint32_t slots[] = {0, 1};
    hvd_request *qa = ef_request(ef, "a", N, a, ra);
    hvd_request *qb = ef_request(ef, "b", N, b, rb);
    Hvd__Engine__Cycle dec = decision(1);

    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    assert_int_equal(hvd_eng_step_complete(eng), 0);
    ef_peer_step(ef, 0, 1, slots, 2, slots, 2, peer, sizeof(peer), &dec);
    finish_ok(ef);
    assert_int_equal(eng->cycle, 1);
    assert_int_equal(eng->n_cached, 2);
    assert_int_equal(qa->done, 1);
    assert_int_equal(qa->status, HVD_OK);
    assert_int_equal(qb->done, 1);
    assert_int_equal(qb->status, HVD_OK);
    assert_memory_equal(ra, want_a, sizeof(ra));
    assert_memory_equal(rb, want_b, sizeof(rb));
    assert_int_equal(eng->npending, 0);
    /* The parts are given back: the next step's may come. */
    assert_null(eng->mine.msg);
    assert_null(eng->ports[0].step[1].msg);
}

/* A step in which every rank offers and carries the one same slot, and
 * rank 0 decides nothing, takes the lone way: the slot runs without the
 * table of offers over every slot (left as it was). */
static void lone_slot(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, ra[N], peer[N] = {4, 3, 2, 1};
    const float want[N] = {5, 5, 5, 5};
    const uint32_t slot[] = {1};
    hvd_request *qb = ef_request(ef, "b", N, a, ra);
    Hvd__Engine__Cycle dec = decision(1);

    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 1, slot, 1, slot, 1, peer, sizeof(peer), &dec);
    eng->offers[1] = 7;
    eng->run_index[1] = 7;
    finish_ok(ef);
    assert_int_equal(eng->offers[1], 7);
    assert_int_equal(eng->run_index[1], 7);
    assert_int_equal(eng->cycle, 1);
    assert_int_equal(eng->n_cached, 1);
    assert_int_equal(qb->done, 1);
    assert_memory_equal(ra, want, sizeof(ra));
    assert_int_equal(eng->cache.slots[1].last_used, 1);
}

/* The same step with a decision in it (an erasure) is not lone: the
 * general way runs it, and the erased slot does not run. */
static void decision_not_lone(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, ra[N], peer[N] = {4, 3, 2, 1};
    const uint32_t slot[] = {1};
    uint32_t erase[] = {1};
    hvd_request *qb = ef_request(ef, "b", N, a, ra);
    Hvd__Engine__Cycle dec = decision(1);

    dec.n_erase = 1;
    dec.erase = erase;
    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 1, slot, 1, slot, 1, peer, sizeof(peer), &dec);
    eng->offers[1] = 7;
    finish_ok(ef);
    assert_int_equal(eng->offers[1], 0);
    assert_int_equal(eng->n_cached, 0);
    /* Its request goes back to rank 0's table, not run. */
    assert_int_equal(qb->done, 0);
    assert_int_equal(qb->state, REQ_NEW);
    assert_null(eng->cache.slots[1].name);
}

/* "b" is offered by this rank only: "a" runs, "b" waits, still cached,
 * and is offered again in the next step. */
static void slot_not_offered_by_all(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, b[N] = {5, 6, 7, 8}, ra[N], rb[N];
    float peer[N] = {1, 1, 1, 1};
    const float want[N] = {2, 3, 4, 5};
    const uint32_t slot_a[] = {0};
    hvd_request *qa = ef_request(ef, "a", N, a, ra);
    hvd_request *qb = ef_request(ef, "b", N, b, rb);
    Hvd__Engine__Cycle dec = decision(1);

    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    assert_int_equal(eng->mine.msg->n_carried, 2);
    ef_peer_step(ef, 0, 1, slot_a, 1, slot_a, 1, peer, sizeof(peer), &dec);
    finish_ok(ef);
    assert_int_equal(eng->n_cached, 1);
    assert_int_equal(eng->offers[0], 2);
    assert_int_equal(eng->offers[1], 1);
    assert_int_equal(eng->run_index[0], 1);
    assert_int_equal(eng->run_index[1], 0);
    assert_int_equal(qa->done, 1);
    assert_memory_equal(ra, want, sizeof(ra));
    assert_int_equal(qb->done, 0);
    assert_int_equal(qb->state, REQ_CACHED);
    assert_int_equal(eng->npending, 1);
    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    assert_int_equal(eng->mine.msg->number, 2);
    assert_int_equal(eng->mine.msg->n_ready, 1);
    assert_int_equal(eng->mine.msg->ready[0], 1);
}

/* Rank 0 offers and carries "b" then "a"; this rank only "a". "b" does
 * not run and its data is skipped: "a" is summed with rank 0's second
 * tensor, not its first. */
static void data_for_a_slot_not_run_dropped(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    float a[N] = {1, 2, 3, 4}, ra[N];
    float peer[2 * N] = {-1, -1, -1, -1, 10, 10, 10, 10};
    const float want[N] = {11, 12, 13, 14};
    const uint32_t slots[] = {1, 0};
    hvd_request *qa = ef_request(ef, "a", N, a, ra);
    Hvd__Engine__Cycle dec = decision(1);

    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 1, slots, 2, slots, 2, peer, sizeof(peer), &dec);
    finish_ok(ef);
    assert_int_equal(eng->run[0], 0);
    assert_int_equal(eng->run_index[1], 0);
    assert_int_equal(eng->carried_all[0], 1);
    assert_int_equal(eng->n_cached, 1);
    assert_int_equal(qa->done, 1);
    assert_memory_equal(ra, want, sizeof(ra));
}

/* A part that offers a slot empty here, and a step without rank 0's
 * decision, are refused with a sentence; the step ends either way. */
static void malformed_steps_refused(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    const uint32_t empty[] = {5};
    Hvd__Engine__Cycle dec = decision(1);
    int last = 0;

    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 1, empty, 1, NULL, 0, NULL, 0, &dec);
    assert_int_equal(hvd_eng_step_finish(eng, 0, &last), HVD_ERR_PROTOCOL);
    assert_string_equal(hvd_error_get(),
                        "step 1 from rank 0 offers cache slot 5, which is "
                        "empty here");
    assert_int_equal(eng->in_step, 0);
    assert_null(eng->ports[0].step[1].msg);

    eng->cycle = 1;
    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 2, NULL, 0, NULL, 0, NULL, 0, NULL);
    assert_int_equal(hvd_eng_step_finish(eng, 0, &last), HVD_ERR_PROTOCOL);
    assert_string_equal(hvd_error_get(),
                        "step 2 from rank 0 has no cycle 2 in it");
}

/* An alltoall's part is as long as the counts it starts with say: a part
 * that says its data follows and whose counts ask for more than came is
 * refused, naming the sender, and so is one whose first word is none of
 * "counts alone" (0), "whole sendbuf" (1) and "the receiver's block" (2). */
static void alltoall_part_checked(void **state) {
    ef_engine *ef = *state;
    hvd_engine *eng = ef->eng;
    const uint32_t slot[] = {0};
    const uint64_t part[3] = {1, 1000, 1000}; /* counts, and no data */
    const uint64_t odd[3] = {3, 0, 0};
    Hvd__Engine__Cycle dec = decision(1);
    int last = 0;

    eng->cache.slots[0].desc.kind = HVD_KIND_ALLTOALL;
    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 1, slot, 1, slot, 1, part, sizeof(part), &dec);
    assert_int_equal(hvd_eng_step_finish(eng, 0, &last), HVD_ERR_PROTOCOL);
    assert_string_equal(hvd_error_get(),
                        "step 1 from rank 0 carries 24 bytes of data whose "
                        "parts do not add up");

    eng->cycle = 1;
    dec = decision(2);
    assert_int_equal(hvd_eng_step_start(eng), HVD_OK);
    ef_peer_step(ef, 0, 2, slot, 1, slot, 1, odd, sizeof(odd), &dec);
    assert_int_equal(hvd_eng_step_finish(eng, 0, &last), HVD_ERR_PROTOCOL);
    assert_string_equal(hvd_error_get(),
                        "step 2 from rank 0 carries 24 bytes of data whose "
                        "parts do not add up");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(start_carries_data, setup, teardown),
        cmocka_unit_test_setup_teardown(finish_complete_step, setup, teardown),
        cmocka_unit_test_setup_teardown(lone_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(decision_not_lone, setup, teardown),
        cmocka_unit_test_setup_teardown(slot_not_offered_by_all, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(data_for_a_slot_not_run_dropped, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(malformed_steps_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(alltoall_part_checked, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
