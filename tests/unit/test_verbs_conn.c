/* The verbs transport's connection data: what one rank encodes, every
 * other decodes the same; a truncated, foreign, corrupted or out-of-range
 * blob is refused with a sentence naming the rank, never read past its
 * end (the ASan build checks that). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/base/error.h"
#include "transport/verbs/conn.h"

static hvd_vconn sample(int rank, int size) {
    hvd_vconn c;

    memset(&c, 0, sizeof(c));
    c.flags = HVD_VCONN_USABLE;
    c.rank = (uint32_t)rank;
    c.size = (uint32_t)size;
    c.lid = 7;
    c.port = 1;
    c.link_layer = 1; /* InfiniBand */
    c.mtu = 5;
    c.gid_index = -1;
    for (int i = 0; i < 16; i++)
        c.gid[i] = (uint8_t)(0xf0 + i);
    c.ring_addr = 0x7f0012340000ull;
    c.rkey = 0xabcdef01u;
    c.eager_bytes = 4096;
    c.eager_credits[0] = 16;
    c.eager_credits[1] = 12;
    c.slots[0] = 8;
    c.slots[1] = 4;
    c.slot_bytes[0] = 128 * 1024;
    c.slot_bytes[1] = 64 * 1024;
    return c;
}

/* The queue pair rank `from` made for rank `to` on channel ch. */
static hvd_vqpinfo qp_for(int from, int to, int ch) {
    return (hvd_vqpinfo){
        .qpn = (uint32_t)(0x100 + from * 64 + to * 2 + ch),
        .psn = (uint32_t)((from * 7919 + to * 31 + ch) & 0xffffff)};
}

static uint8_t *encode(int rank, int size, const hvd_vconn *c) {
    hvd_vqpinfo *q = calloc((size_t)size * 2, sizeof(*q));
    uint8_t *buf = malloc(HVD_VCONN_LEN(size));

    for (int p = 0; p < size; p++)
        for (int ch = 0; ch < 2; ch++)
            q[p * 2 + ch] = qp_for(rank, p, ch);
    hvd_vconn_encode(c, q, buf);
    free(q);
    return buf;
}

static void round_trip(void **state) {
    (void)state;
    for (int size = 1; size <= 6; size++) {
        for (int from = 0; from < size; from++) {
            hvd_vconn c = sample(from, size), d;
            uint8_t *buf = encode(from, size, &c);
            for (int me = 0; me < size; me++) {
                hvd_vqpinfo q[2];
                assert_int_equal(hvd_vconn_decode(buf, HVD_VCONN_LEN(size),
                                                  from, size, me, &d, q),
                                 HVD_OK);
                assert_int_equal(d.version, HVD_VCONN_VERSION);
                assert_int_equal(d.rank, from);
                assert_int_equal(d.size, size);
                assert_int_equal(d.lid, 7);
                assert_int_equal(d.mtu, 5);
                assert_int_equal(d.gid_index, -1);
                assert_memory_equal(d.gid, c.gid, 16);
                assert_true(d.ring_addr == c.ring_addr);
                assert_int_equal(d.rkey, c.rkey);
                assert_int_equal(d.eager_credits[1], 12);
                assert_int_equal(d.slots[0], 8);
                assert_int_equal(d.slot_bytes[1], 64 * 1024);
                if (me == from) {
                    assert_int_equal(q[0].qpn, 0);
                } else {
                    for (int ch = 0; ch < 2; ch++) {
                        assert_int_equal(q[ch].qpn, qp_for(from, me, ch).qpn);
                        assert_int_equal(q[ch].psn, qp_for(from, me, ch).psn);
                    }
                }
            }
            free(buf);
        }
    }
}

static void gid_index_round_trip(void **state) {
    hvd_vconn c = sample(0, 2), d;
    hvd_vqpinfo q[2];
    uint8_t *buf;

    (void)state;
    c.link_layer = 2; /* RoCE */
    c.lid = 0;
    c.gid_index = 3;
    buf = encode(0, 2, &c);
    assert_int_equal(hvd_vconn_decode(buf, HVD_VCONN_LEN(2), 0, 2, 1, &d, q),
                     HVD_OK);
    assert_int_equal(d.gid_index, 3);
    assert_int_equal(d.link_layer, 2);
    free(buf);
}

/* Every shorter length is refused, with the rank in the sentence. */
static void truncated(void **state) {
    hvd_vconn c = sample(1, 3), d;
    hvd_vqpinfo q[2];
    uint8_t *buf = encode(1, 3, &c);

    (void)state;
    for (size_t len = 0; len < HVD_VCONN_LEN(3); len++) {
        /* A copy of exactly len bytes, so ASan sees any overread. */
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, buf, len);
        assert_int_equal(hvd_vconn_decode(cut, len, 1, 3, 0, &d, q),
                         HVD_ERR_PROTOCOL);
        assert_non_null(strstr(hvd_error_get(), "rank 1"));
        free(cut);
    }
    /* Longer is refused too. */
    uint8_t *longer = calloc(1, HVD_VCONN_LEN(3) + 8);
    memcpy(longer, buf, HVD_VCONN_LEN(3));
    assert_int_equal(
        hvd_vconn_decode(longer, HVD_VCONN_LEN(3) + 8, 1, 3, 0, &d, q),
        HVD_ERR_PROTOCOL);
    free(longer);
    free(buf);
}

static void foreign(void **state) {
    hvd_vconn c = sample(2, 3), d;
    hvd_vqpinfo q[2];
    uint8_t *buf = encode(2, 3, &c);
    size_t len = HVD_VCONN_LEN(3);

    (void)state;
    buf[0] ^= 0xff; /* magic */
    assert_int_equal(hvd_vconn_decode(buf, len, 2, 3, 0, &d, q),
                     HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "not hvd's"));
    buf[0] ^= 0xff;
    buf[4] = 2; /* version */
    assert_int_equal(hvd_vconn_decode(buf, len, 2, 3, 0, &d, q),
                     HVD_ERR_MISMATCH);
    assert_non_null(strstr(hvd_error_get(), "same hvd"));
    /* Another version is reported as such even at another length. */
    assert_int_equal(hvd_vconn_decode(buf, len - 16, 2, 3, 0, &d, q),
                     HVD_ERR_MISMATCH);
    free(buf);
}

static void wrong_place(void **state) {
    hvd_vconn c = sample(1, 3), d;
    hvd_vqpinfo q[2];
    uint8_t *buf = encode(1, 3, &c);

    (void)state;
    /* Rank 1's blob in rank 2's place, and a blob for another size. */
    assert_int_equal(hvd_vconn_decode(buf, HVD_VCONN_LEN(3), 2, 3, 0, &d, q),
                     HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "says rank 1 of 3"));
    free(buf);
    c = sample(1, 4);
    buf = encode(1, 4, &c);
    assert_int_equal(hvd_vconn_decode(buf, HVD_VCONN_LEN(3), 1, 3, 0, &d, q),
                     HVD_ERR_PROTOCOL);
    free(buf);
    /* Callers' own arguments out of range. */
    c = sample(0, 2);
    buf = encode(0, 2, &c);
    assert_int_equal(hvd_vconn_decode(buf, HVD_VCONN_LEN(2), 0, 2, 5, &d, q),
                     HVD_ERR_INTERNAL);
    free(buf);
}

typedef void (*spoil_fn)(hvd_vconn *c);

static void no_port(hvd_vconn *c) { c->port = 0; }
static void bad_link(hvd_vconn *c) { c->link_layer = 9; }
static void ib_without_lid(hvd_vconn *c) { c->lid = 0; }
static void roce_without_gid(hvd_vconn *c) {
    c->link_layer = 2;
    c->gid_index = -1;
}
static void mtu_zero(hvd_vconn *c) { c->mtu = 0; }
static void mtu_big(hvd_vconn *c) { c->mtu = 6; }
static void no_ring(hvd_vconn *c) { c->ring_addr = 0; }
static void no_rkey(hvd_vconn *c) { c->rkey = 0; }
static void eager_small(hvd_vconn *c) { c->eager_bytes = 16; }
static void eager_huge(hvd_vconn *c) { c->eager_bytes = 1u << 30; }
static void no_credits(hvd_vconn *c) { c->eager_credits[1] = 0; }
static void no_slots(hvd_vconn *c) { c->slots[0] = 0; }
static void many_slots(hvd_vconn *c) { c->slots[0] = 5000; }
static void slot_tiny(hvd_vconn *c) { c->slot_bytes[0] = 64; }
static void slot_huge(hvd_vconn *c) { c->slot_bytes[1] = 0x80000000u; }
static void ring_wraps(hvd_vconn *c) { c->ring_addr = UINT64_MAX - 4096; }
static void unknown_flag(hvd_vconn *c) { c->flags |= 0x80; }

static void out_of_range(void **state) {
    static const spoil_fn spoil[] = {
        no_port,    bad_link,    ib_without_lid, roce_without_gid, mtu_zero,
        mtu_big,    no_ring,     no_rkey,        eager_small,      eager_huge,
        no_credits, no_slots,    many_slots,     slot_tiny,        slot_huge,
        ring_wraps, unknown_flag};

    (void)state;
    for (size_t i = 0; i < sizeof(spoil) / sizeof(spoil[0]); i++) {
        hvd_vconn c = sample(1, 2), d;
        hvd_vqpinfo q[2];
        uint8_t *buf;

        spoil[i](&c);
        buf = encode(1, 2, &c);
        assert_int_equal(
            hvd_vconn_decode(buf, HVD_VCONN_LEN(2), 1, 2, 0, &d, q),
            HVD_ERR_PROTOCOL);
        assert_non_null(strstr(hvd_error_get(), "rank 1"));
        free(buf);
    }
}

/* Queue pair numbers and PSNs have 24 bits; rank 0 must have made one. */
static void bad_qp(void **state) {
    size_t len = HVD_VCONN_LEN(2);
    hvd_vconn c = sample(1, 2), d;
    hvd_vqpinfo q[2];
    /* Rank 1's entry for rank 0 starts at HVD_VCONN_HDR. */
    size_t e = HVD_VCONN_HDR;
    uint8_t *buf;

    (void)state;
    buf = encode(1, 2, &c);
    memset(buf + e, 0, 4); /* QPN 0 */
    assert_int_equal(hvd_vconn_decode(buf, len, 1, 2, 0, &d, q),
                     HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "queue pair"));
    free(buf);
    buf = encode(1, 2, &c);
    buf[e + 3] = 1; /* QPN above 24 bits */
    assert_int_equal(hvd_vconn_decode(buf, len, 1, 2, 0, &d, q),
                     HVD_ERR_PROTOCOL);
    free(buf);
    buf = encode(1, 2, &c);
    buf[e + 8 + 7] = 0x10; /* channel 1's PSN above 24 bits */
    assert_int_equal(hvd_vconn_decode(buf, len, 1, 2, 0, &d, q),
                     HVD_ERR_PROTOCOL);
    free(buf);
}

/* A rank without a usable device sends zeros, which decode (the flag says
 * what matters). */
static void unusable(void **state) {
    hvd_vconn c, d;
    hvd_vqpinfo q[2];
    uint8_t *buf = malloc(HVD_VCONN_LEN(3));

    (void)state;
    memset(&c, 0, sizeof(c));
    c.rank = 2;
    c.size = 3;
    hvd_vconn_encode(&c, NULL, buf);
    assert_int_equal(hvd_vconn_decode(buf, HVD_VCONN_LEN(3), 2, 3, 0, &d, q),
                     HVD_OK);
    assert_int_equal(d.flags & HVD_VCONN_USABLE, 0);
    free(buf);
}

/* Random corruption: decode accepts or refuses, never crashes or reads
 * out of bounds. */
static void fuzz(void **state) {
    hvd_vconn c = sample(0, 4), d;
    hvd_vqpinfo q[2];
    size_t len = HVD_VCONN_LEN(4);
    uint8_t *good = encode(0, 4, &c);
    uint8_t *buf = malloc(len);
    uint64_t x = 88172645463325252ull;
    int refused = 0;

    (void)state;
    for (int round = 0; round < 20000; round++) {
        memcpy(buf, good, len);
        for (int k = 0; k < 1 + round % 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[(x >> 8) % len] ^= (uint8_t)(1u << (x % 8));
        }
        if (hvd_vconn_decode(buf, len, 0, 4, 1 + (int)(x % 3), &d, q) != HVD_OK)
            refused++;
    }
    assert_true(refused > 0);
    free(buf);
    free(good);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip),  cmocka_unit_test(gid_index_round_trip),
        cmocka_unit_test(truncated),   cmocka_unit_test(foreign),
        cmocka_unit_test(wrong_place), cmocka_unit_test(out_of_range),
        cmocka_unit_test(bad_qp),      cmocka_unit_test(unusable),
        cmocka_unit_test(fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
