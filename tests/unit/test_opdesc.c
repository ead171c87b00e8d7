/*
 * Operation descriptions (api/runtime/opdesc.c): when two ranks' requests
 * are the same operation (equal) or may run together (agree: an
 * alltoall's counts differ between ranks), which fields matter for which
 * kind, shapes folded past HVD_DESC_MAX_DIMS, the reduce-scatter's row
 * unit, totals, and the sentences that name an operation in errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/opdesc.h"

static hvd_opdesc desc(hvd_kind kind, const uint64_t *counts, size_t n) {
    hvd_opdesc d;

    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.dtype = HVD_FLOAT32;
    d.op = HVD_SUM;
    d.counts = counts;
    d.ncounts = n;
    return d;
}

static void kind_names(void **state) {
    (void)state;
    assert_string_equal(hvd_kind_name(HVD_KIND_ALLREDUCE), "allreduce");
    assert_string_equal(hvd_kind_name(HVD_KIND_REDUCESCATTER), "reducescatter");
    assert_string_equal(hvd_kind_name(HVD_KIND_PSET), "process set");
    assert_string_equal(hvd_kind_name(HVD_KIND_COUNT), "unknown");
    assert_string_equal(hvd_kind_name((hvd_kind)-1), "unknown");
    assert_true(hvd_kind_reduces(HVD_KIND_ALLREDUCE));
    assert_true(hvd_kind_reduces(HVD_KIND_REDUCESCATTER));
    assert_false(hvd_kind_reduces(HVD_KIND_BROADCAST));
    assert_false(hvd_kind_reduces(HVD_KIND_ALLTOALL));
}

/* Each field matters where the kind uses it, and only there. */
static void equal_by_kind(void **state) {
    uint64_t c5[] = {5}, c6[] = {6};
    hvd_opdesc a = desc(HVD_KIND_ALLREDUCE, c5, 1), b = a;

    (void)state;
    assert_true(hvd_opdesc_equal(&a, &b));
    b.counts = c6;
    assert_false(hvd_opdesc_equal(&a, &b));
    b = a;
    b.op = HVD_MAX;
    assert_false(hvd_opdesc_equal(&a, &b));
    b = a;
    b.dtype = HVD_INT32;
    assert_false(hvd_opdesc_equal(&a, &b));
    b = a;
    b.mem = HVD_MEM_DEVICE;
    assert_false(hvd_opdesc_equal(&a, &b));
    b = a;
    b.pset = 1;
    assert_false(hvd_opdesc_equal(&a, &b));
    b = a;
    b.root = 3; /* an allreduce has no root */
    assert_true(hvd_opdesc_equal(&a, &b));
    /* A broadcast has no op, but a root. */
    a = desc(HVD_KIND_BROADCAST, c5, 1);
    b = a;
    b.op = HVD_MAX;
    assert_true(hvd_opdesc_equal(&a, &b));
    b.root = 1;
    assert_false(hvd_opdesc_equal(&a, &b));
    /* A barrier moves no data: neither dtype nor op. */
    a = desc(HVD_KIND_BARRIER, NULL, 0);
    b = a;
    b.dtype = HVD_INT8;
    b.op = HVD_MIN;
    assert_true(hvd_opdesc_equal(&a, &b));
    /* Process sets: create and remove differ, and so do the ids. */
    a = desc(HVD_KIND_PSET, NULL, 0);
    b = a;
    b.op = (hvd_op)HVD_PSET_REMOVE;
    assert_false(hvd_opdesc_equal(&a, &b));
    b = a;
    b.root = 2;
    assert_false(hvd_opdesc_equal(&a, &b));
}

/* The shape is part of the operation. */
static void equal_shapes(void **state) {
    uint64_t c[] = {24};
    int64_t s1[] = {2, 3, 4}, s2[] = {4, 3, 2};
    hvd_opdesc a = desc(HVD_KIND_ALLREDUCE, c, 1), b = a;

    (void)state;
    hvd_opdesc_set_shape(&a, 3, s1);
    assert_false(hvd_opdesc_equal(&a, &b));
    hvd_opdesc_set_shape(&b, 3, s2);
    assert_false(hvd_opdesc_equal(&a, &b));
    hvd_opdesc_set_shape(&b, 3, s1);
    assert_true(hvd_opdesc_equal(&a, &b));
}

/* An alltoall's ranks each send their own counts: they agree while the
 * rest is the same; other kinds agree only when equal. */
static void agree(void **state) {
    uint64_t c1[] = {1, 2}, c2[] = {3, 0}, c3[] = {1, 2, 3};
    hvd_opdesc a = desc(HVD_KIND_ALLTOALL, c1, 2), b = a;

    (void)state;
    b.counts = c2;
    assert_true(hvd_opdesc_agree(&a, &b));
    assert_false(hvd_opdesc_equal(&a, &b));
    b.counts = c3;
    b.ncounts = 3;
    assert_false(hvd_opdesc_agree(&a, &b));
    b = a;
    b.dtype = HVD_INT64;
    assert_false(hvd_opdesc_agree(&a, &b));
    a = desc(HVD_KIND_ALLREDUCE, c1, 2);
    b = a;
    b.counts = c2;
    assert_false(hvd_opdesc_agree(&a, &b));
}

/* One or no dimension: no shape. Past HVD_DESC_MAX_DIMS the rest fold
 * into the last one kept. */
static void shapes(void **state) {
    uint64_t c[] = {1};
    hvd_opdesc d = desc(HVD_KIND_REDUCESCATTER, c, 1);
    int64_t one[] = {7}, three[] = {5, 3, 2};
    int64_t ten[] = {2, 1, 1, 1, 1, 1, 1, 3, 5, 7};

    (void)state;
    hvd_opdesc_set_shape(&d, 1, one);
    assert_int_equal(d.ndims, 0);
    assert_int_equal(hvd_opdesc_unit(&d), 1);
    hvd_opdesc_set_shape(&d, 3, three);
    assert_int_equal(d.ndims, 3);
    assert_int_equal(hvd_opdesc_unit(&d), 6);
    hvd_opdesc_set_shape(&d, 10, ten);
    assert_int_equal(d.ndims, HVD_DESC_MAX_DIMS);
    assert_int_equal(d.dims[HVD_DESC_MAX_DIMS - 1], 3 * 5 * 7);
    assert_int_equal(hvd_opdesc_unit(&d), 3 * 5 * 7);
    hvd_opdesc_set_shape(&d, 0, NULL);
    assert_int_equal(d.ndims, 0);
}

static void totals(void **state) {
    uint64_t c[] = {3, 0, 1ULL << 40};
    hvd_opdesc d = desc(HVD_KIND_ALLREDUCE, c, 3);

    (void)state;
    assert_int_equal(hvd_opdesc_total(&d), 3 + (1ULL << 40));
    d.ncounts = 0;
    assert_int_equal(hvd_opdesc_total(&d), 0);
}

static void sentence(const hvd_opdesc *d, const char *want) {
    char out[256];

    memset(out, 'x', sizeof(out));
    hvd_opdesc_format(d, out, sizeof(out));
    assert_string_equal(out, want);
}

static void formats(void **state) {
    uint64_t c10[] = {10}, c3[] = {1, 0, 2}, ranks[] = {0, 2, 5};
    int64_t shape[] = {2, 5};
    hvd_opdesc d = desc(HVD_KIND_ALLREDUCE, c10, 1);
    char small[12];

    (void)state;
    sentence(&d, "allreduce float32 sum count 10");
    d.mem = HVD_MEM_DEVICE;
    d.pset = 2;
    sentence(&d, "allreduce float32 sum on the GPU in process set 2 count 10");
    d = desc(HVD_KIND_BROADCAST, c10, 1);
    d.dtype = HVD_INT32;
    d.root = 1;
    hvd_opdesc_set_shape(&d, 2, shape);
    sentence(&d, "broadcast int32 root 1 shape [2, 5]");
    d = desc(HVD_KIND_ALLTOALL, c3, 3);
    sentence(&d, "alltoall float32 splits 1,0,2");
    d = desc(HVD_KIND_ALLREDUCE, c3, 3);
    sentence(&d, "allreduce float32 sum counts 1,0,2");
    d = desc(HVD_KIND_PSET, ranks, 3);
    sentence(&d, "create process set of ranks 0,2,5");
    d.op = (hvd_op)HVD_PSET_REMOVE;
    d.root = 4;
    sentence(&d, "remove process set 4");
    d = desc(HVD_KIND_BARRIER, NULL, 0);
    sentence(&d, "barrier");
    /* A short buffer holds a terminated prefix. */
    d = desc(HVD_KIND_ALLREDUCE, c3, 3);
    hvd_opdesc_format(&d, small, sizeof(small));
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_memory_equal(small, "allreduce f", sizeof(small) - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kind_names),   cmocka_unit_test(equal_by_kind),
        cmocka_unit_test(equal_shapes), cmocka_unit_test(agree),
        cmocka_unit_test(shapes),       cmocka_unit_test(totals),
        cmocka_unit_test(formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
