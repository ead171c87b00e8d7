/*
 * Recursive doubling (collectives/rd.c), called directly over the
 * in-memory transport of coll_fake.c: every rank count from 1 to 13 (the
 * powers of two and the folds of every remainder), every dtype and op,
 * counts of none, fewer than the ranks and odd, in place and out of place,
 * exact results; that every rank ends with bitwise the same result where
 * the sum is not exact (float32 fractions); and the fold and unfold of a
 * size that is not a power of two on their own (who sits out, who holds
 * the pair's reduction, who gets the result back).
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

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const hvd_dtype all_dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                       HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_FLOAT32, HVD_FLOAT64};
static const size_t counts[] = {0, 1, 2, 3, 17, 64};

static void exact_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    int r = comm->rank, p = comm->size;

    (void)arg;
    for (size_t ci = 0; ci < N(counts); ci++) {
        size_t n = counts[ci];
        for (size_t di = 0; di < N(all_dtypes); di++) {
            hvd_dtype dt = all_dtypes[di];
            size_t bytes = n * hvd_dtype_size(dt);
            uint8_t *in = malloc(bytes + 1), *out = malloc(bytes + 1);
            for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (size_t i = 0; i < n; i++)
                        coll_fake_store(in, i, dt,
                                        coll_fake_value(r, i, (hvd_op)op, p));
                    memset(out, 0x5a, bytes);
                    void *dst = inplace ? in : out;
                    hvd_status st =
                        hvd_rd_allreduce(comm, in, dst, n, dt, (hvd_op)op);
                    if (st != HVD_OK) {
                        coll_fake_fail(job, r, "rd_allreduce: %d", st);
                        continue;
                    }
                    for (size_t i = 0; i < n; i++) {
                        double want = coll_fake_expected(i, (hvd_op)op, p);
                        double got = coll_fake_load(dst, i, dt);
                        if (got != want) {
                            coll_fake_fail(
                                job, r,
                                "rd %s %s count %zu %s: [%zu] got "
                                "%g want %g",
                                hvd_dtype_name(dt), hvd_op_name((hvd_op)op), n,
                                inplace ? "in place" : "out of place", i, got,
                                want);
                            break;
                        }
                    }
                }
            }
            free(in);
            free(out);
        }
    }
}

static void every_size_dtype_and_op(void **state) {
    int errors = 0;

    (void)state;
    for (int p = 1; p <= 13; p++) {
        hvd_comm_config cfg;
        hvd_comm_config_default(&cfg);
        errors += coll_fake_run(p, &cfg, exact_body, NULL);
    }
    assert_int_equal(errors, 0);
}

/* ---- the same bits on every rank ---- */

#define BITWISE_COUNT 33

typedef struct results {
    float out[COLL_FAKE_MAXP][BITWISE_COUNT];
} results;

static void bitwise_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    results *res = arg;
    int r = comm->rank;
    float in[BITWISE_COUNT];

    /* Fractions whose float32 sum depends on the order of the additions. */
    for (size_t i = 0; i < BITWISE_COUNT; i++)
        in[i] =
            0.1f * (float)(r + 1) + 1e-3f * (float)i + 1e7f * (float)(r % 2);
    if (hvd_rd_allreduce(comm, in, res->out[r], BITWISE_COUNT, HVD_FLOAT32,
                         HVD_SUM) != HVD_OK)
        coll_fake_fail(job, r, "rd_allreduce failed");
}

static void same_bits_on_every_rank(void **state) {
    (void)state;
    for (int p = 2; p <= 12; p++) {
        hvd_comm_config cfg;
        results *res = calloc(1, sizeof(*res));
        hvd_comm_config_default(&cfg);
        assert_int_equal(coll_fake_run(p, &cfg, bitwise_body, res), 0);
        for (int r = 1; r < p; r++)
            assert_memory_equal(res->out[0], res->out[r], sizeof(res->out[0]));
        free(res);
    }
}

/* ---- fold and unfold ---- */

#define FOLD_COUNT 5

typedef struct fold_seen {
    int newrank[COLL_FAKE_MAXP];
    int32_t folded[COLL_FAKE_MAXP][FOLD_COUNT];
    int32_t unfolded[COLL_FAKE_MAXP][FOLD_COUNT];
} fold_seen;

static void fold_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    fold_seen *seen = arg;
    int r = comm->rank, p = comm->size, p2 = 1, newrank = -2;
    int32_t buf[FOLD_COUNT], tmp[FOLD_COUNT];

    while (p2 * 2 <= p)
        p2 *= 2;
    for (int i = 0; i < FOLD_COUNT; i++)
        buf[i] = 100 * r + i;
    if (hvd_fold(comm, buf, tmp, FOLD_COUNT, HVD_INT32, HVD_SUM, p - p2,
                 &newrank) != HVD_OK)
        coll_fake_fail(job, r, "hvd_fold failed");
    seen->newrank[r] = newrank;
    memcpy(seen->folded[r], buf, sizeof(buf));
    /* The ranks left in mark their buffers with their new rank; the ones
     * that sat out must get their partner's back. */
    if (newrank >= 0)
        for (int i = 0; i < FOLD_COUNT; i++)
            buf[i] = 1000 * (newrank + 1) + i;
    else
        memset(buf, 0, sizeof(buf));
    if (hvd_unfold(comm, buf, sizeof(buf), p - p2) != HVD_OK)
        coll_fake_fail(job, r, "hvd_unfold failed");
    memcpy(seen->unfolded[r], buf, sizeof(buf));
}

static void fold_and_unfold(void **state) {
    static const int sizes[] = {3, 5, 6, 7, 9, 12, 13};

    (void)state;
    for (size_t s = 0; s < N(sizes); s++) {
        int p = sizes[s], p2 = 1;
        hvd_comm_config cfg;
        fold_seen *seen = calloc(1, sizeof(*seen));
        while (p2 * 2 <= p)
            p2 *= 2;
        int rem = p - p2;
        hvd_comm_config_default(&cfg);
        assert_int_equal(coll_fake_run(p, &cfg, fold_body, seen), 0);
        for (int r = 0; r < p; r++) {
            int want_new = r >= 2 * rem ? r - rem : (r % 2 ? r / 2 : -1);
            /* The rank whose result an even folded rank gets back. */
            int giver_new = r >= 2 * rem ? want_new : (r | 1) / 2;
            assert_int_equal(seen->newrank[r], want_new);
            for (int i = 0; i < FOLD_COUNT; i++) {
                int32_t folded = 100 * r + i;
                if (r < 2 * rem && r % 2 == 1)
                    folded += 100 * (r - 1) + i;
                assert_int_equal(seen->folded[r][i], folded);
                assert_int_equal(seen->unfolded[r][i],
                                 1000 * (giver_new + 1) + i);
            }
        }
        free(seen);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_size_dtype_and_op),
        cmocka_unit_test(same_bits_on_every_rank),
        cmocka_unit_test(fold_and_unfold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
