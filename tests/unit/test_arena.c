/* The bump allocator control messages unpack into (api/runtime/arena.c). */
#include <setjmp.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/arena.h"
#include "api/runtime/engine.pb-c.h"

static int aligned(const void *p) {
    return (uintptr_t)p % alignof(max_align_t) == 0;
}

/* Allocations are aligned and disjoint; what overflows the buffer still
 * comes back, and after a reset the buffer holds it all. */
static void bump_and_grow(void **state) {
    (void)state;
    hvd_arena a;
    unsigned char *p[64];

    hvd_arena_init(&a);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 64; i++) {
            p[i] = hvd_arena_alloc(&a, (size_t)(i * 7 + 1));
            assert_non_null(p[i]);
            assert_true(aligned(p[i]));
            memset(p[i], i, (size_t)(i * 7 + 1));
        }
        for (int i = 0; i < 64; i++)
            for (int k = 0; k < i * 7 + 1; k++)
                assert_int_equal(p[i][k], i);
        if (round == 0)
            assert_non_null(a.overflow); /* 1 KiB was not enough */
        else
            assert_null(a.overflow); /* the reset made room */
        hvd_arena_reset(&a);
        assert_int_equal(a.used, 0);
    }
    assert_null(hvd_arena_alloc(&a, SIZE_MAX - 4));
    hvd_arena_destroy(&a);
    hvd_arena_destroy(NULL);
}

/* protobuf-c unpacks a Step with its cycle and responses into the arena:
 * nothing to free one by one, nothing leaked (ASan checks), and a
 * message that fails half way leaves nothing behind after the reset. */
static void protobuf_unpack(void **state) {
    (void)state;
    uint32_t ready[3] = {1, 2, 3};
    uint64_t counts[1] = {42};
    Hvd__Engine__Response r = HVD__ENGINE__RESPONSE__INIT, *rs[1] = {&r};
    Hvd__Engine__Cycle c = HVD__ENGINE__CYCLE__INIT;
    Hvd__Engine__Step m = HVD__ENGINE__STEP__INIT, *back;
    uint8_t buf[512];
    hvd_arena a;

    r.name = "grad.layer1.weight";
    r.error = "";
    r.n_counts = 1;
    r.counts = counts;
    c.number = 9;
    c.n_responses = 1;
    c.responses = rs;
    m.number = 9;
    m.n_ready = 3;
    m.ready = ready;
    m.cycle = &c;
    size_t len = hvd__engine__step__pack(&m, buf);
    assert_true(len < sizeof(buf));

    hvd_arena_init(&a);
    for (int round = 0; round < 3; round++) {
        back = hvd__engine__step__unpack(&a.pb, len, buf);
        assert_non_null(back);
        assert_int_equal(back->number, 9);
        assert_int_equal(back->n_ready, 3);
        assert_memory_equal(back->ready, ready, sizeof(ready));
        assert_non_null(back->cycle);
        assert_int_equal(back->cycle->n_responses, 1);
        assert_string_equal(back->cycle->responses[0]->name,
                            "grad.layer1.weight");
        assert_int_equal(back->cycle->responses[0]->counts[0], 42);
        hvd_arena_reset(&a);
    }
    /* Cut short: unpack fails, the reset takes back what it took. */
    assert_null(hvd__engine__step__unpack(&a.pb, len - 3, buf));
    hvd_arena_reset(&a);
    hvd_arena_destroy(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bump_and_grow),
        cmocka_unit_test(protobuf_unpack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
