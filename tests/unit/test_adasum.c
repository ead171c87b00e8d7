/*
 * Adasum (collectives/adasum.c) over the in-memory transport of
 * coll_fake.c, on inputs whose results are exact: equal tensors on every
 * rank average to themselves (each combination's coefficients are exactly
 * one half), tensors with disjoint supports add (their dot products are
 * zero: coefficients one), for 1, 2, 4 and 8 ranks, float16, float32 and
 * float64, counts of none, fewer than the ranks and odd, in place and
 * not; every rank ends with the same bits where the result is not exact;
 * and what it does not run (ranks not a power of two, other dtypes) is
 * refused with a sentence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coll_fake.h"
#include "collectives/coll.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const hvd_dtype float_dtypes[] = {HVD_FLOAT16, HVD_FLOAT32, HVD_FLOAT64};
static const size_t counts[] = {0, 1, 3, 8, 17, 100};

/* Which input: every rank the same, or each element on one rank only. */
enum { EQUAL, DISJOINT };

static double input(int kind, int r, size_t i, int p) {
    double v = (double)((i * 7) % 11) - 5.0; /* small, exact in float16 */

    if (kind == EQUAL)
        return v;
    return (int)(i % (size_t)p) == r ? v + 0.5 * r : 0.0;
}

static double result(int kind, size_t i, int p) {
    return kind == EQUAL ? input(EQUAL, 0, i, p)
                         : input(DISJOINT, (int)(i % (size_t)p), i, p);
}

static void exact_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    int kind = *(int *)arg, r = comm->rank, p = comm->size;

    for (size_t ci = 0; ci < N(counts); ci++) {
        size_t n = counts[ci];
        for (size_t di = 0; di < N(float_dtypes); di++) {
            hvd_dtype dt = float_dtypes[di];
            size_t bytes = n * hvd_dtype_size(dt);
            uint8_t *in = malloc(bytes + 1), *out = malloc(bytes + 1);
            for (int inplace = 0; inplace < 2; inplace++) {
                for (size_t i = 0; i < n; i++)
                    coll_fake_store(in, i, dt, input(kind, r, i, p));
                memset(out, 0x5a, bytes);
                void *dst = inplace ? in : out;
                hvd_status st = hvd_adasum_allreduce(comm, in, dst, n, dt);
                if (st != HVD_OK) {
                    coll_fake_fail(job, r, "adasum: %d", st);
                    continue;
                }
                for (size_t i = 0; i < n; i++) {
                    double got = coll_fake_load(dst, i, dt);
                    if (got != result(kind, i, p)) {
                        coll_fake_fail(job, r,
                                       "adasum %s %s count %zu: [%zu] got %g "
                                       "want %g",
                                       kind == EQUAL ? "equal" : "disjoint",
                                       hvd_dtype_name(dt), n, i, got,
                                       result(kind, i, p));
                        break;
                    }
                }
            }
            free(in);
            free(out);
        }
    }
}

static void run_exact(int kind) {
    int errors = 0;

    for (int p = 1; p <= 8; p *= 2) {
        hvd_comm_config cfg;
        hvd_comm_config_default(&cfg);
        errors += coll_fake_run(p, &cfg, exact_body, &kind);
    }
    assert_int_equal(errors, 0);
}

static void equal_tensors_average(void **state) {
    (void)state;
    run_exact(EQUAL);
}

static void disjoint_tensors_add(void **state) {
    (void)state;
    run_exact(DISJOINT);
}

/* ---- the same bits everywhere ---- */

#define BITS_COUNT 37

typedef struct results {
    double out[COLL_FAKE_MAXP][BITS_COUNT];
} results;

static void bits_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    results *res = arg;
    int r = comm->rank;
    double in[BITS_COUNT];

    for (size_t i = 0; i < BITS_COUNT; i++)
        in[i] = 0.1 * (r + 1) + 0.37 * (double)i - 1e-3 * (double)(r * i);
    if (hvd_adasum_allreduce(comm, in, res->out[r], BITS_COUNT, HVD_FLOAT64) !=
        HVD_OK)
        coll_fake_fail(job, r, "adasum failed");
}

static void same_bits_on_every_rank(void **state) {
    (void)state;
    for (int p = 2; p <= 8; p *= 2) {
        hvd_comm_config cfg;
        results *res = calloc(1, sizeof(*res));
        hvd_comm_config_default(&cfg);
        assert_int_equal(coll_fake_run(p, &cfg, bits_body, res), 0);
        for (int r = 1; r < p; r++)
            assert_memory_equal(res->out[0], res->out[r], sizeof(res->out[0]));
        free(res);
    }
}

/* ---- what it does not run ---- */

static void supports(void **state) {
    (void)state;
    for (int p = 1; p <= 16; p *= 2)
        for (size_t di = 0; di < N(float_dtypes); di++)
            assert_true(hvd_adasum_supports(p, float_dtypes[di]));
    assert_false(hvd_adasum_supports(3, HVD_FLOAT32));
    assert_false(hvd_adasum_supports(6, HVD_FLOAT64));
    assert_false(hvd_adasum_supports(2, HVD_INT32));
    assert_false(hvd_adasum_supports(2, HVD_BFLOAT16));
}

static void refused_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    float x[4] = {1, 2, 3, 4};
    int32_t k[4] = {1, 2, 3, 4};

    (void)arg;
    /* Refused before any message: every rank says so alone. */
    if (comm->size % 2 == 1 && comm->size > 1 &&
        hvd_adasum_allreduce(comm, x, x, 4, HVD_FLOAT32) != HVD_ERR_UNSUPPORTED)
        coll_fake_fail(job, comm->rank, "%d ranks accepted", comm->size);
    if (hvd_adasum_allreduce(comm, k, k, 4, HVD_INT32) != HVD_ERR_UNSUPPORTED ||
        strstr(hvd_error_get(), "int32") == NULL)
        coll_fake_fail(job, comm->rank, "int32 accepted: %s", hvd_error_get());
}

static void refused(void **state) {
    hvd_comm_config cfg;

    (void)state;
    hvd_comm_config_default(&cfg);
    assert_int_equal(coll_fake_run(3, &cfg, refused_body, NULL), 0);
    assert_int_equal(coll_fake_run(2, &cfg, refused_body, NULL), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(equal_tensors_average),
        cmocka_unit_test(disjoint_tensors_add),
        cmocka_unit_test(same_bits_on_every_rank),
        cmocka_unit_test(supports),
        cmocka_unit_test(refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
