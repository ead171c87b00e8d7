/* Buffer growth (transport/base/grow.h): hvd_grow_cap's rounding and
 * limit, and hvd_ring_grow, which the tcp, shm and verbs transports' send
 * and receive queues grow with: every entry kept, in order, from any head
 * and wrap, and at least the capacity asked for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "transport/base/grow.h"

static void grow_cap_rounds_up(void **state) {
    (void)state;
    assert_int_equal(hvd_grow_cap(1, 0), 1);
    assert_int_equal(hvd_grow_cap(3, 0), 4);
    assert_int_equal(hvd_grow_cap(4096, 0), 4096);
    assert_int_equal(hvd_grow_cap(4097, 0), 8192);
    assert_int_equal(hvd_grow_cap(4097, 5000), 5000); /* the limit */
    assert_int_equal(hvd_grow_cap(6000, 5000), 8192); /* limit < need */
}

typedef struct ring {
    int64_t *v;
    size_t cap, head, count;
} ring;

static void push(ring *r, int64_t x) {
    if (r->count == r->cap) {
        int64_t *v = hvd_ring_grow(r->v, sizeof(*v), &r->cap, &r->head,
                                   r->count, r->count + 1);
        assert_non_null(v);
        r->v = v;
    }
    r->v[(r->head + r->count) % r->cap] = x;
    r->count++;
}

static int64_t pop(ring *r) {
    int64_t x = r->v[r->head];
    r->head = (r->head + 1) % r->cap;
    r->count--;
    return x;
}

/* Pushes and pops so that the ring wraps at every head before it grows:
 * what comes out is what went in, in order. */
static void ring_keeps_order_across_wraps(void **state) {
    (void)state;
    for (int popped_first = 0; popped_first < 40; popped_first++) {
        ring r = {0};
        int64_t in = 0, out = 0;
        for (int i = 0; i < popped_first; i++)
            push(&r, in++);
        for (int i = 0; i < popped_first / 2; i++)
            assert_int_equal(pop(&r), out++);
        for (int i = 0; i < 100; i++)
            push(&r, in++);
        assert_true(r.cap >= r.count);
        assert_true((r.cap & (r.cap - 1)) == 0); /* indexed by a mask */
        while (r.count > 0)
            assert_int_equal(pop(&r), out++);
        assert_int_equal(in, out);
        free(r.v);
    }
}

static void ring_grows_to_need(void **state) {
    (void)state;
    ring r = {0};
    int64_t *v;

    v = hvd_ring_grow(r.v, sizeof(*v), &r.cap, &r.head, 0, 1);
    assert_non_null(v);
    assert_int_equal(r.cap, 16); /* the first capacity */
    r.v = v;
    v = hvd_ring_grow(r.v, sizeof(*v), &r.cap, &r.head, 0, 1000);
    assert_non_null(v);
    assert_int_equal(r.cap, 1024); /* doubled until it holds 1000 */
    assert_int_equal(r.head, 0);
    free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grow_cap_rounds_up),
        cmocka_unit_test(ring_keeps_order_across_wraps),
        cmocka_unit_test(ring_grows_to_need),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
