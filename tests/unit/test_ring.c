/*
 * The ring algorithms (collectives/ring.c), called directly over the
 * in-memory transport of coll_fake.c. test_algorithms.c drives the ring
 * allreduce through hvd_coll_allreduce; this file tests what it does not:
 * the phases alone (reduce-scatter and its owned segment, the
 * reduce-scatter by blocks of whole rows, the allgather of segments), the
 * byte allgather, and the allreduce at its chunk boundaries (segments of
 * exactly one chunk, one element either side, chunks that are not a whole
 * number of elements or smaller than one), for every dtype and op, with
 * exact results.
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
#define END SIZE_MAX

static const hvd_dtype all_dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                       HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_FLOAT32, HVD_FLOAT64};

/* What a body runs: its counts (a list ending at END) and, for the
 * reduce-scatter by blocks, the row length. */
typedef struct plan {
    size_t counts[16];
    size_t unit;
} plan;

static void fill(void *buf, size_t n, hvd_dtype dt, int r, hvd_op op, int p) {
    for (size_t i = 0; i < n; i++)
        coll_fake_store(buf, i, dt, coll_fake_value(r, i, op, p));
}

/* Checks elements [off, off + cnt) of buf against the reduction; returns
 * whether they all match (the first mismatch is reported). */
static int check_range(coll_fake_job *job, const hvd_comm *comm,
                       const char *what, const void *buf, size_t off,
                       size_t cnt, hvd_dtype dt, hvd_op op, size_t count) {
    for (size_t i = off; i < off + cnt; i++) {
        double want = coll_fake_expected(i, op, comm->size);
        double got = coll_fake_load(buf, i, dt);
        if (got != want) {
            coll_fake_fail(
                job, comm->rank, "%s %s %s count %zu: [%zu] got %g want %g",
                what, hvd_dtype_name(dt), hvd_op_name(op), count, i, got, want);
            return 0;
        }
    }
    return 1;
}

/* ---- reduce-scatter: rank r owns segment r + 1 ---- */

static void reduce_scatter_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    const plan *pl = arg;
    int r = comm->rank, p = comm->size;
    int seg = hvd_ring_owned_segment(comm);

    if (seg != (r + 1) % p)
        coll_fake_fail(job, r, "owned segment %d, want %d", seg, (r + 1) % p);
    for (size_t ci = 0; pl->counts[ci] != END; ci++) {
        size_t n = pl->counts[ci], off, cnt;
        hvd_part_range(n, (size_t)p, (size_t)seg, &off, &cnt);
        for (size_t di = 0; di < N(all_dtypes); di++) {
            hvd_dtype dt = all_dtypes[di];
            size_t bytes = n * hvd_dtype_size(dt);
            uint8_t *in = malloc(bytes + 1), *out = malloc(bytes + 1);
            for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    fill(in, n, dt, r, (hvd_op)op, p);
                    memset(out, 0x5a, bytes);
                    void *dst = inplace ? in : out;
                    hvd_status st = hvd_ring_reduce_scatter(comm, in, dst, n,
                                                            dt, (hvd_op)op);
                    if (st != HVD_OK)
                        coll_fake_fail(job, r, "reduce_scatter: %d", st);
                    else
                        check_range(job, comm, "reduce_scatter", dst, off, cnt,
                                    dt, (hvd_op)op, n);
                }
            }
            free(in);
            free(out);
        }
    }
}

/* ---- reduce-scatter of whole rows: rank r ends with segment r ---- */

static void blocks_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    const plan *pl = arg;
    int r = comm->rank, p = comm->size;

    for (size_t ci = 0; pl->counts[ci] != END; ci++) {
        size_t rows = pl->counts[ci], n = rows * pl->unit, off, cnt;
        hvd_part_range(rows, (size_t)p, (size_t)r, &off, &cnt);
        for (size_t di = 0; di < N(all_dtypes); di++) {
            hvd_dtype dt = all_dtypes[di];
            size_t bytes = n * hvd_dtype_size(dt);
            uint8_t *in = malloc(bytes + 1), *scratch = malloc(bytes + 1);
            for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
                fill(in, n, dt, r, (hvd_op)op, p);
                memset(scratch, 0x5a, bytes);
                hvd_status st = hvd_ring_reduce_scatter_blocks(
                    comm, in, scratch, n, pl->unit, dt, (hvd_op)op);
                if (st != HVD_OK)
                    coll_fake_fail(job, r, "reduce_scatter_blocks: %d", st);
                else
                    check_range(job, comm, "reduce_scatter_blocks", scratch,
                                off * pl->unit, cnt * pl->unit, dt, (hvd_op)op,
                                n);
            }
            free(in);
            free(scratch);
        }
    }
}

/* ---- allgather of segments: each rank brings its owned segment ---- */

static void allgather_segments_body(coll_fake_job *job, hvd_comm *comm,
                                    void *arg) {
    const plan *pl = arg;
    int r = comm->rank, p = comm->size;
    size_t seg = (size_t)hvd_ring_owned_segment(comm);

    for (size_t ci = 0; pl->counts[ci] != END; ci++) {
        size_t n = pl->counts[ci], off, cnt;
        hvd_part_range(n, (size_t)p, seg, &off, &cnt);
        for (size_t di = 0; di < N(all_dtypes); di++) {
            hvd_dtype dt = all_dtypes[di];
            size_t es = hvd_dtype_size(dt);
            uint8_t *buf = malloc(n * es + 1);
            /* Only the owned segment holds the result before. */
            memset(buf, 0x5a, n * es);
            for (size_t i = off; i < off + cnt; i++)
                coll_fake_store(buf, i, dt, coll_fake_expected(i, HVD_SUM, p));
            hvd_status st = hvd_ring_allgather_segments(comm, buf, n, dt);
            if (st != HVD_OK)
                coll_fake_fail(job, r, "allgather_segments: %d", st);
            else
                check_range(job, comm, "allgather_segments", buf, 0, n, dt,
                            HVD_SUM, n);
            free(buf);
        }
    }
}

/* ---- allreduce at its chunk boundaries ---- */

static void allreduce_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    const plan *pl = arg;
    int r = comm->rank, p = comm->size;

    for (size_t ci = 0; pl->counts[ci] != END; ci++) {
        size_t n = pl->counts[ci];
        for (size_t di = 0; di < N(all_dtypes); di++) {
            hvd_dtype dt = all_dtypes[di];
            size_t bytes = n * hvd_dtype_size(dt);
            uint8_t *in = malloc(bytes + 1), *out = malloc(bytes + 1);
            for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    fill(in, n, dt, r, (hvd_op)op, p);
                    memset(out, 0x5a, bytes);
                    void *dst = inplace ? in : out;
                    hvd_status st =
                        hvd_ring_allreduce(comm, in, dst, n, dt, (hvd_op)op);
                    if (st != HVD_OK)
                        coll_fake_fail(job, r, "ring_allreduce: %d", st);
                    else
                        check_range(job, comm, "ring_allreduce", dst, 0, n, dt,
                                    (hvd_op)op, n);
                }
            }
            free(in);
            free(out);
        }
    }
}

/* ---- the byte allgather ---- */

static void allgather_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    const plan *pl = arg;
    int r = comm->rank, p = comm->size;

    for (size_t ci = 0; pl->counts[ci] != END; ci++) {
        size_t bytes = pl->counts[ci];
        uint8_t *all = malloc(bytes * (size_t)p + 1), *mine = malloc(bytes + 1);
        for (size_t i = 0; i < bytes; i++)
            mine[i] = (uint8_t)(i * 5 + (size_t)r * 31);
        memset(all, 0x5a, bytes * (size_t)p);
        hvd_status st = hvd_ring_allgather(comm, mine, all, bytes);
        if (st != HVD_OK)
            coll_fake_fail(job, r, "ring_allgather: %d", st);
        for (int q = 0; st == HVD_OK && q < p; q++) {
            for (size_t i = 0; i < bytes; i++) {
                uint8_t want = (uint8_t)(i * 5 + (size_t)q * 31);
                if (all[(size_t)q * bytes + i] != want) {
                    coll_fake_fail(job, r,
                                   "ring_allgather %zu bytes: block %d [%zu] "
                                   "got %u want %u",
                                   bytes, q, i, all[(size_t)q * bytes + i],
                                   want);
                    q = p;
                    break;
                }
            }
        }
        free(all);
        free(mine);
    }
}

/* ---- the sweeps ---- */

/* Counts around the ring's edges for p ranks: none, fewer than the
 * ranks, one segment each, one over. */
static plan small_counts(int p) {
    size_t q = (size_t)p;
    plan pl = {{0, 1, q - 1, q, q + 1, 2 * q + 1, 37, END}, 1};
    return pl;
}

static int run(int p, size_t chunk_bytes, int depth, coll_fake_body body,
               plan *pl) {
    hvd_comm_config cfg;

    hvd_comm_config_default(&cfg);
    cfg.chunk_bytes = chunk_bytes;
    cfg.depth = depth;
    return coll_fake_run(p, &cfg, body, pl);
}

static void reduce_scatter(void **state) {
    int errors = 0;

    (void)state;
    for (int p = 1; p <= 7; p++) {
        plan pl = small_counts(p);
        errors += run(p, 16, 1, reduce_scatter_body, &pl);
        errors += run(p, 24, 3, reduce_scatter_body, &pl);
        errors += run(p, 4096, 2, reduce_scatter_body, &pl);
    }
    assert_int_equal(errors, 0);
}

static void reduce_scatter_blocks(void **state) {
    int errors = 0;

    (void)state;
    for (int p = 1; p <= 6; p++) {
        plan pl = small_counts(p);
        for (size_t unit = 1; unit <= 4; unit += 3) {
            pl.unit = unit;
            errors += run(p, 16, 2, blocks_body, &pl);
            errors += run(p, 4096, 1, blocks_body, &pl);
        }
    }
    assert_int_equal(errors, 0);
}

static void allgather_segments(void **state) {
    int errors = 0;

    (void)state;
    for (int p = 1; p <= 7; p++) {
        plan pl = small_counts(p);
        errors += run(p, 16, 2, allgather_segments_body, &pl);
        errors += run(p, 4096, 1, allgather_segments_body, &pl);
    }
    assert_int_equal(errors, 0);
}

/*
 * A chunk of c elements of 8 bytes (chunk_bytes 8c): counts where every
 * segment is exactly one or two chunks, and one element either side of
 * that. The 1-byte dtypes then see chunks of 8c elements, the others
 * chunks that are not a whole number of their elements are cut down.
 */
static void allreduce_chunk_boundaries(void **state) {
    int errors = 0;

    (void)state;
    /* One rank too: a copy, out of place (it once left recvbuf as it
     * was). */
    for (int p = 1; p <= 5; p++) {
        size_t q = (size_t)p;
        for (size_t c = 1; c <= 3; c++) {
            plan pl = {{q * c - 1, q * c, q * c + 1, 2 * q * c - 1, 2 * q * c,
                        2 * q * c + 1, 8 * q * c, 8 * q * c + 1, END},
                       1};
            errors += run(p, 8 * c, 1, allreduce_body, &pl);
            errors += run(p, 8 * c, 4, allreduce_body, &pl);
            /* A chunk that is not a whole number of elements, and one
             * smaller than an element (one element per chunk then). */
            errors += run(p, 8 * c + 3, 2, allreduce_body, &pl);
            errors += run(p, 1, 2, allreduce_body, &pl);
        }
    }
    assert_int_equal(errors, 0);
}

static void allgather_bytes(void **state) {
    int errors = 0;

    (void)state;
    for (int p = 1; p <= 7; p++) {
        plan pl = {{0, 1, 7, 15, 16, 17, 3 * 16 + 2, 1000, END}, 1};
        errors += run(p, 16, 1, allgather_body, &pl);
        errors += run(p, 16, 3, allgather_body, &pl);
        errors += run(p, 4096, 2, allgather_body, &pl);
    }
    assert_int_equal(errors, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reduce_scatter),
        cmocka_unit_test(reduce_scatter_blocks),
        cmocka_unit_test(allgather_segments),
        cmocka_unit_test(allreduce_chunk_boundaries),
        cmocka_unit_test(allgather_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
