/* Chunk and stripe arithmetic for every count and rank count: parts tile
 * the range exactly, sizes are balanced, stripes are 64-byte aligned, and
 * sender and receiver agree on the layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "collectives/comm.h"
#include "transport/tcp/tcp.h"

static void part_range_tiles(void **state) {
    (void)state;
    for (size_t count = 0; count <= 600; count++) {
        for (size_t n = 1; n <= 17; n++) {
            size_t next = 0, min = SIZE_MAX, max = 0;
            for (size_t i = 0; i < n; i++) {
                size_t off, cnt;
                hvd_part_range(count, n, i, &off, &cnt);
                assert_int_equal(off, next);
                next = off + cnt;
                if (cnt < min)
                    min = cnt;
                if (cnt > max)
                    max = cnt;
            }
            assert_int_equal(next, count);
            assert_true(max - min <= 1);
        }
    }
    /* Large counts do not overflow. */
    size_t off, cnt;
    hvd_part_range((size_t)1 << 40, 3, 2, &off, &cnt);
    assert_true(off + cnt == (size_t)1 << 40);
}

static void nchunks(void **state) {
    (void)state;
    assert_int_equal(hvd_nchunks(0, 10), 1);
    assert_int_equal(hvd_nchunks(1, 10), 1);
    assert_int_equal(hvd_nchunks(10, 10), 1);
    assert_int_equal(hvd_nchunks(11, 10), 2);
    assert_int_equal(hvd_nchunks(5, 0), 5);
    for (size_t count = 0; count < 500; count++) {
        for (size_t chunk = 1; chunk < 40; chunk++) {
            size_t n = hvd_nchunks(count, chunk);
            /* Every chunk of an even split fits in chunk elements. */
            for (size_t i = 0; i < n; i++) {
                size_t off, cnt;
                hvd_part_range(count, n, i, &off, &cnt);
                assert_true(cnt <= chunk);
            }
        }
    }
}

/* The ring allreduce cuts each segment into nchunks(maxseg) chunks: a
 * chunk of any segment fits the receive slot sized from the largest. */
static void ring_slots_fit(void **state) {
    (void)state;
    for (size_t count = 0; count <= 400; count++) {
        for (size_t p = 1; p <= 9; p++) {
            for (size_t chunk = 1; chunk <= 33; chunk += 4) {
                size_t maxseg = (count + p - 1) / p;
                size_t nc = hvd_nchunks(maxseg, chunk);
                size_t slot = (maxseg + nc - 1) / nc;
                for (size_t seg = 0; seg < p; seg++) {
                    size_t soff, scnt;
                    hvd_part_range(count, p, seg, &soff, &scnt);
                    assert_true(scnt <= maxseg);
                    for (size_t c = 0; c < nc; c++) {
                        size_t coff, ccnt;
                        hvd_part_range(scnt, nc, c, &coff, &ccnt);
                        assert_true(ccnt <= slot);
                        assert_true(ccnt <= chunk);
                    }
                }
            }
        }
    }
}

static void tcp_layout(void **state) {
    (void)state;
    for (int nsocks = 1; nsocks <= HVD_TCP_MAX_SOCKS; nsocks++) {
        for (size_t len = 0; len < 5000; len += 37) {
            for (uint64_t msgno = 0; msgno < 5; msgno++) {
                int first, nparts;
                hvd_tcp_layout(len, nsocks, 1024, msgno, &first, &nparts);
                assert_true(first >= 0 && first < nsocks);
                if (nparts == 1) {
                    assert_int_equal(first, (int)(msgno % nsocks));
                    continue;
                }
                assert_int_equal(nparts, nsocks);
                assert_true(len >= 1024);
                size_t next = 0;
                for (int i = 0; i < nparts; i++) {
                    size_t off, plen;
                    hvd_tcp_part_range(len, nparts, i, &off, &plen);
                    assert_int_equal(off, next);
                    assert_int_equal(off % 64, 0);
                    next = off + plen;
                }
                assert_int_equal(next, len);
            }
        }
    }
    /* Below the stripe threshold, or one socket: one part. */
    int first, nparts;
    hvd_tcp_layout(1 << 20, 1, 1024, 3, &first, &nparts);
    assert_int_equal(nparts, 1);
    assert_int_equal(first, 0);
    hvd_tcp_layout(1023, 4, 1024, 6, &first, &nparts);
    assert_int_equal(nparts, 1);
    assert_int_equal(first, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(part_range_tiles),
        cmocka_unit_test(nchunks),
        cmocka_unit_test(ring_slots_fit),
        cmocka_unit_test(tcp_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
