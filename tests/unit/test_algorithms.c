/*
 * The collective algorithms through hvd_coll_* over the in-memory
 * transport of coll_fake.c (one thread per rank, messages copied through
 * queues, one-sided reads as copies). This checks the algorithms' index
 * arithmetic for every count and rank count (1 to 7), chunk sizes down to
 * the minimum, pipeline depths 1 to 4, forced algorithms (ring, recursive
 * doubling, Rabenseifner, direct one-sided reads, tree, chain), every root,
 * in place and out of place, independently of any real transport.
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

#define MAXP 7

static const size_t counts[] = {0,  1,  2,  3,   5,   7,   8,
                                13, 31, 64, 100, 257, 1000};
static const hvd_dtype dtypes[] = {HVD_INT32, HVD_FLOAT16, HVD_FLOAT64,
                                   HVD_UINT8};
#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Every op, in place and out of place, on a count of one dtype. */
static void allreduce_ops(coll_fake_job *job, hvd_comm *comm, size_t n,
                          hvd_dtype dt) {
    int r = comm->rank, p = comm->size;
    size_t es = hvd_dtype_size(dt);
    uint8_t *in = malloc(n * es + 1), *out = malloc(n * es + 1);

    for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            for (size_t i = 0; i < n; i++)
                coll_fake_store(in, i, dt,
                                coll_fake_value(r, i, (hvd_op)op, p));
            void *dst = inplace ? in : out;
            hvd_status st =
                hvd_coll_allreduce(comm, in, dst, n, dt, (hvd_op)op);
            const char *how = inplace ? "in place" : "out of place";
            if (st != HVD_OK) {
                coll_fake_fail(job, r, "allreduce %s %s count %zu %s: %d",
                               hvd_dtype_name(dt), hvd_op_name((hvd_op)op), n,
                               how, st);
                continue;
            }
            for (size_t i = 0; i < n; i++) {
                double want = coll_fake_expected(i, (hvd_op)op, p);
                double got = coll_fake_load(dst, i, dt);
                if (got != want) {
                    coll_fake_fail(job, r,
                                   "allreduce %s %s count %zu %s: [%zu] got "
                                   "%g want %g",
                                   hvd_dtype_name(dt), hvd_op_name((hvd_op)op),
                                   n, how, i, got, want);
                    break;
                }
            }
        }
    }
    free(in);
    free(out);
}

/* Broadcast of n int32s from every root. */
static void broadcast_roots(coll_fake_job *job, hvd_comm *comm, size_t n) {
    int r = comm->rank, p = comm->size;

    for (int root = 0; root < p; root++) {
        uint8_t *buf = malloc(n * 4 + 1);
        for (size_t i = 0; i < n * 4; i++)
            buf[i] = r == root ? (uint8_t)(i * 31 + (size_t)root) : 0xee;
        hvd_status st = hvd_coll_broadcast(comm, buf, n, HVD_INT32, root);
        if (st != HVD_OK)
            coll_fake_fail(job, r, "broadcast count %zu root %d: %d", n, root,
                           st);
        for (size_t i = 0; st == HVD_OK && i < n * 4; i++) {
            uint8_t want = (uint8_t)(i * 31 + (size_t)root);
            if (buf[i] != want) {
                coll_fake_fail(job, r,
                               "broadcast count %zu root %d: [%zu] got %d "
                               "want %d",
                               n, root, i, buf[i], want);
                break;
            }
        }
        free(buf);
    }
}

/* Allgather of n float64s, out of place and both in-place forms (the
 * rank's block already in place, or at the start of the output). */
static void allgather_modes(coll_fake_job *job, hvd_comm *comm, size_t n) {
    int r = comm->rank, p = comm->size;

    for (int mode = 0; mode < 3; mode++) {
        size_t bytes = n * 8;
        uint8_t *all = malloc(bytes * (size_t)p + 1);
        uint8_t *mine = malloc(bytes + 1);
        const void *src = mine;
        memset(all, 0xee, bytes * (size_t)p);
        uint8_t *fill = mode == 0   ? mine
                        : mode == 1 ? all + (size_t)r * bytes
                                    : all;
        for (size_t i = 0; i < bytes; i++)
            fill[i] = (uint8_t)(i + (size_t)r * 17);
        if (mode != 0)
            src = fill;
        hvd_status st = hvd_coll_allgather(comm, src, all, n, HVD_FLOAT64);
        if (st != HVD_OK)
            coll_fake_fail(job, r, "allgather count %zu mode %d: %d", n, mode,
                           st);
        for (int q = 0; st == HVD_OK && q < p; q++) {
            for (size_t i = 0; i < bytes; i++) {
                uint8_t want = (uint8_t)(i + (size_t)q * 17);
                uint8_t got = all[(size_t)q * bytes + i];
                if (got != want) {
                    coll_fake_fail(job, r,
                                   "allgather count %zu mode %d: [%zu] got %d "
                                   "want %d",
                                   n, mode, (size_t)q * bytes + i, got, want);
                    q = p;
                    break;
                }
            }
        }
        free(all);
        free(mine);
    }
}

/* The per-rank program: every count through allreduce (every dtype),
 * broadcast and allgather, then barriers. */
static void body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    (void)arg;
    for (size_t ci = 0; ci < N(counts); ci++) {
        for (size_t di = 0; di < N(dtypes); di++)
            allreduce_ops(job, comm, counts[ci], dtypes[di]);
        broadcast_roots(job, comm, counts[ci]);
        allgather_modes(job, comm, counts[ci]);
    }
    for (int k = 0; k < 3; k++)
        if (hvd_coll_barrier(comm) != HVD_OK)
            coll_fake_fail(job, comm->rank, "barrier %d failed", k);
}

static void sweep_some(hvd_algo ar, hvd_algo bc, const size_t *chunks,
                       size_t nchunks, const int *depths, size_t ndepths) {
    int errors = 0;

    for (int p = 1; p <= MAXP; p++) {
        for (size_t c = 0; c < nchunks; c++) {
            for (size_t d = 0; d < ndepths; d++) {
                hvd_comm_config cfg;
                hvd_comm_config_default(&cfg);
                cfg.chunk_bytes = chunks[c];
                cfg.depth = depths[d];
                cfg.allreduce_algo = ar;
                cfg.bcast_algo = bc;
                errors += coll_fake_run(p, &cfg, body, NULL);
            }
        }
    }
    assert_int_equal(errors, 0);
}

static void sweep(hvd_algo ar, hvd_algo bc) {
    static const size_t chunks[] = {64, 200, 4096};
    static const int depths[] = {1, 2, 4};
    sweep_some(ar, bc, chunks, N(chunks), depths, N(depths));
}

/* Algorithms without a pipeline depth: fewer combinations. */
static void sweep_short(hvd_algo ar, hvd_algo bc) {
    static const size_t chunks[] = {64, 4096};
    static const int depths[] = {2};
    sweep_some(ar, bc, chunks, N(chunks), depths, N(depths));
}

/*
 * The direct reductions with their results written by non-temporal stores
 * (cfg.stream_min 0), and the pipelined allreduce of two ranks
 * (cfg.pipe_min 0): every dtype and op, in place and out of place,
 * counts that are not a multiple of a chunk or of the streamed sub-block,
 * allreduce and reduce-scatter.
 */
static const hvd_dtype all_dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                       HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_FLOAT32, HVD_FLOAT64};
static const size_t stream_counts[] = {0, 1, 3, 7, 31, 257, 1000, 5003};

static void reducescatter_ops(coll_fake_job *job, hvd_comm *comm, size_t n,
                              hvd_dtype dt) {
    int r = comm->rank, p = comm->size;
    size_t es = hvd_dtype_size(dt), off, cnt;
    uint8_t *in = malloc(n * es + 1), *out = malloc(n * es + 1);
    uint8_t *scratch = malloc(n * es + 1);

    hvd_part_range(n, (size_t)p, (size_t)r, &off, &cnt);
    for (int op = HVD_SUM; op <= HVD_PRODUCT; op++) {
        for (size_t i = 0; i < n; i++)
            coll_fake_store(in, i, dt, coll_fake_value(r, i, (hvd_op)op, p));
        hvd_status st = hvd_coll_reducescatter(comm, in, out, scratch, n, 1, dt,
                                               (hvd_op)op);
        if (st != HVD_OK || (p > 1 && strcmp(comm->last_path, "direct"))) {
            coll_fake_fail(job, r, "reducescatter %s %s count %zu: %d %s",
                           hvd_dtype_name(dt), hvd_op_name((hvd_op)op), n, st,
                           comm->last_path);
            continue;
        }
        for (size_t i = 0; i < cnt; i++) {
            double want = coll_fake_expected(off + i, (hvd_op)op, p);
            double got = coll_fake_load(out, i, dt);
            if (got != want) {
                coll_fake_fail(job, r,
                               "reducescatter %s %s count %zu: [%zu] got %g "
                               "want %g",
                               hvd_dtype_name(dt), hvd_op_name((hvd_op)op), n,
                               off + i, got, want);
                break;
            }
        }
    }
    free(in);
    free(out);
    free(scratch);
}

static void stream_body(coll_fake_job *job, hvd_comm *comm, void *arg) {
    (void)arg;
    for (size_t ci = 0; ci < N(stream_counts); ci++) {
        for (size_t di = 0; di < N(all_dtypes); di++) {
            allreduce_ops(job, comm, stream_counts[ci], all_dtypes[di]);
            reducescatter_ops(job, comm, stream_counts[ci], all_dtypes[di]);
        }
    }
}

/* stream_min and pipe_min as given, ranks pmin to pmax. */
static void direct_sweep(size_t stream_min, size_t pipe_min, int pmin,
                         int pmax) {
    static const size_t chunks[] = {200, 64 * 1024};
    int errors = 0;

    for (int p = pmin; p <= pmax; p++) {
        for (size_t c = 0; c < N(chunks); c++) {
            hvd_comm_config cfg;
            hvd_comm_config_default(&cfg);
            cfg.chunk_bytes = chunks[c];
            cfg.allreduce_algo = HVD_ALGO_DIRECT;
            cfg.bcast_algo = HVD_ALGO_DIRECT;
            cfg.stream_min = stream_min;
            cfg.pipe_min = pipe_min;
            errors += coll_fake_run(p, &cfg, stream_body, NULL);
        }
    }
    assert_int_equal(errors, 0);
}

static void direct_streamed(void **state) {
    (void)state;
    direct_sweep(0, SIZE_MAX, 1, MAXP);
}

/* The pipelined allreduce: two ranks only. */
static void direct_pipelined(void **state) {
    (void)state;
    direct_sweep(SIZE_MAX, 0, 2, 2);
}

static void rabenseifner_and_tree(void **state) {
    (void)state;
    sweep_short(HVD_ALGO_RABENSEIFNER, HVD_ALGO_TREE);
}

static void direct(void **state) {
    (void)state;
    sweep_short(HVD_ALGO_DIRECT, HVD_ALGO_DIRECT);
}

static void ring_and_chain(void **state) {
    (void)state;
    sweep(HVD_ALGO_RING, HVD_ALGO_PIPELINE);
}

static void rd_and_tree(void **state) {
    (void)state;
    sweep(HVD_ALGO_RD, HVD_ALGO_TREE);
}

static void automatic(void **state) {
    (void)state;
    sweep(HVD_ALGO_UNFORCED, HVD_ALGO_UNFORCED);
}

static void selector(void **state) {
    (void)state;
    hvd_comm comm;

    memset(&comm, 0, sizeof(comm));
    hvd_comm_config_default(&comm.cfg);
    comm.size = 4;
    assert_int_equal(hvd_select_allreduce(&comm, 8), HVD_ALGO_RD);
    assert_int_equal(hvd_select_allreduce(&comm, comm.cfg.allreduce_rd_max),
                     HVD_ALGO_RD);
    assert_int_equal(hvd_select_allreduce(&comm, comm.cfg.allreduce_rd_max + 1),
                     HVD_ALGO_RING);
    assert_int_equal(hvd_select_broadcast(&comm, 8), HVD_ALGO_TREE);
    assert_int_equal(hvd_select_broadcast(&comm, 64 << 20), HVD_ALGO_PIPELINE);
    comm.cfg.allreduce_algo = HVD_ALGO_RING;
    assert_int_equal(hvd_select_allreduce(&comm, 8), HVD_ALGO_RING);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(selector),
        cmocka_unit_test(ring_and_chain),
        cmocka_unit_test(rd_and_tree),
        cmocka_unit_test(automatic),
        cmocka_unit_test(rabenseifner_and_tree),
        cmocka_unit_test(direct),
        cmocka_unit_test(direct_streamed),
        cmocka_unit_test(direct_pipelined),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
