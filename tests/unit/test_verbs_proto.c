/* The verbs transport's protocol as pure functions: message headers and
 * ABORT notices (well-formed and malformed), chunk immediates, chunking,
 * ring layout, reassembly at the receiver, and credits, including a
 * simulated sender and receiver that must never overrun the receiver's
 * buffers nor deadlock, whatever order they run in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/base/error.h"
#include "transport/verbs/proto.h"

static void header_round_trip(void **state) {
    uint8_t buf[HVD_VHDR_LEN + 100];
    hvd_vhdr h = {.type = HVD_VMSG_DATA,
                  .eager_ret = 513,
                  .slot_ret = 7,
                  .len = 100},
             d;

    (void)state;
    hvd_vhdr_encode(&h, buf);
    assert_int_equal(hvd_vhdr_decode(buf, sizeof(buf), &d), HVD_OK);
    assert_int_equal(d.type, HVD_VMSG_DATA);
    assert_int_equal(d.eager_ret, 513);
    assert_int_equal(d.slot_ret, 7);
    assert_int_equal(d.len, 100);
    for (uint8_t t = HVD_VMSG_CREDIT; t <= HVD_VMSG_HELLO; t++) {
        hvd_vhdr c = {.type = t, .eager_ret = 1};
        hvd_vhdr_encode(&c, buf);
        assert_int_equal(hvd_vhdr_decode(buf, HVD_VHDR_LEN, &d), HVD_OK);
        assert_int_equal(d.type, t);
    }
}

static void header_malformed(void **state) {
    uint8_t buf[HVD_VHDR_LEN + 8];
    hvd_vhdr h = {.type = HVD_VMSG_DATA, .len = 8}, d;

    (void)state;
    hvd_vhdr_encode(&h, buf);
    for (size_t n = 0; n < HVD_VHDR_LEN; n++)
        assert_int_equal(hvd_vhdr_decode(buf, n, &d), HVD_ERR_PROTOCOL);
    /* The length must agree with what arrived. */
    assert_int_equal(hvd_vhdr_decode(buf, sizeof(buf) - 1, &d),
                     HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "8 payload bytes"));
    buf[1] = 9; /* version */
    assert_int_equal(hvd_vhdr_decode(buf, sizeof(buf), &d), HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "same hvd"));
    hvd_vhdr_encode(&h, buf);
    buf[0] = 0; /* type */
    assert_int_equal(hvd_vhdr_decode(buf, sizeof(buf), &d), HVD_ERR_PROTOCOL);
    buf[0] = 77;
    assert_int_equal(hvd_vhdr_decode(buf, sizeof(buf), &d), HVD_ERR_PROTOCOL);
    /* A control message has no payload. */
    hvd_vhdr c = {.type = HVD_VMSG_CREDIT, .len = 8};
    hvd_vhdr_encode(&c, buf);
    assert_int_equal(hvd_vhdr_decode(buf, sizeof(buf), &d), HVD_ERR_PROTOCOL);
}

static void abort_notice(void **state) {
    hvd_vabort a = {.status = HVD_ERR_TIMEOUT, .culprit = 3, .origin = 1}, d;
    uint8_t buf[2048];
    size_t n;

    (void)state;
    strcpy(a.text, "nothing arrived from rank 3\nfor 5 s");
    n = hvd_vabort_encode(&a, buf, sizeof(buf));
    assert_int_equal(hvd_vabort_decode(buf, n, &d), HVD_OK);
    assert_int_equal(d.status, HVD_ERR_TIMEOUT);
    assert_int_equal(d.culprit, 3);
    assert_int_equal(d.origin, 1);
    /* Control characters are not passed on to logs. */
    assert_string_equal(d.text, "nothing arrived from rank 3 for 5 s");
    /* Truncated text is still a sentence; a short notice is refused. */
    assert_int_equal(hvd_vabort_decode(buf, 20, &d), HVD_OK);
    assert_string_equal(d.text, "nothing ");
    assert_int_equal(hvd_vabort_decode(buf, 11, &d), HVD_ERR_PROTOCOL);
    /* A status that is not a failure becomes a transport failure. */
    buf[0] = 0;
    assert_int_equal(hvd_vabort_decode(buf, n, &d), HVD_OK);
    assert_int_equal(d.status, HVD_ERR_TRANSPORT);
    /* Encoding into a small buffer cuts the text. */
    assert_int_equal(hvd_vabort_encode(&a, buf, 16), 16);
    assert_int_equal(hvd_vabort_encode(&a, buf, 8), 0);
}

static void immediates(void **state) {
    (void)state;
    assert_int_equal(hvd_vimm_len(hvd_vimm(4096, 0)), 4096);
    assert_false(hvd_vimm_last(hvd_vimm(4096, 0)));
    assert_true(hvd_vimm_last(hvd_vimm(1, 1)));
    assert_int_equal(hvd_vimm_len(hvd_vimm(HVD_VCHUNK_MAX, 1)), HVD_VCHUNK_MAX);
    /* A rendezvous FIN is never taken for a ring chunk, even one of the
     * largest slot (1 GiB), and its tag is never 0. */
    assert_false(hvd_vimm_is_fin(hvd_vimm(1u << 30, 1)));
    assert_false(hvd_vimm_is_fin(hvd_vimm(4096, 1)));
    assert_true(hvd_vimm_is_fin(hvd_vimm_fin(0)));
    assert_true(hvd_vimm_is_fin(hvd_vimm_fin(HVD_VIMM_TAG - 1)));
    assert_true(hvd_vimm_is_fin(hvd_vimm_fin(HVD_VIMM_TAG)));
    assert_true(hvd_vimm_last(hvd_vimm_fin(7)));
    assert_int_not_equal(hvd_vimm_fin(1), hvd_vimm_fin(2));
}

/* RTR, RTS and RING: fixed payload, round trip, other lengths refused. */
static void rendezvous_messages(void **state) {
    hvd_vrdv r = {.seq = 0x123456789ull,
                  .addr = 0x7f0012345678ull,
                  .len = 5ull << 32,
                  .rkey = 0xdeadbeef},
             d;
    hvd_vhdr h = {.type = HVD_VMSG_RTR, .len = HVD_VRDV_LEN}, hd;
    uint8_t buf[HVD_VHDR_LEN + HVD_VRDV_LEN + 1];

    (void)state;
    hvd_vhdr_encode(&h, buf);
    hvd_vrdv_encode(&r, buf + HVD_VHDR_LEN);
    assert_int_equal(hvd_vhdr_decode(buf, HVD_VHDR_LEN + HVD_VRDV_LEN, &hd),
                     HVD_OK);
    assert_int_equal(hd.type, HVD_VMSG_RTR);
    hvd_vrdv_decode(buf + HVD_VHDR_LEN, &d);
    assert_true(d.seq == r.seq && d.addr == r.addr && d.len == r.len &&
                d.rkey == r.rkey);
    for (uint8_t t = HVD_VMSG_RTR; t <= HVD_VMSG_RING; t++) {
        h = (hvd_vhdr){.type = t, .len = HVD_VRDV_LEN - 1};
        hvd_vhdr_encode(&h, buf);
        assert_int_equal(
            hvd_vhdr_decode(buf, HVD_VHDR_LEN + HVD_VRDV_LEN - 1, &hd),
            HVD_ERR_PROTOCOL);
        assert_non_null(strstr(hvd_error_get(), "instead of 32"));
    }
    h = (hvd_vhdr){.type = HVD_VMSG_RING + 1};
    hvd_vhdr_encode(&h, buf);
    assert_int_equal(hvd_vhdr_decode(buf, HVD_VHDR_LEN, &hd), HVD_ERR_PROTOCOL);
}

static void eager_boundary(void **state) {
    (void)state;
    assert_true(hvd_veager(0, 4096));
    assert_true(hvd_veager(4096 - HVD_VHDR_LEN, 4096));
    assert_false(hvd_veager(4096 - HVD_VHDR_LEN + 1, 4096));
}

/* Chunks tile every message exactly, none longer than the chunk size,
 * and only the final one is marked last. */
static void chunking(void **state) {
    (void)state;
    assert_int_equal(hvd_vnchunks(0, 10), 1);
    assert_int_equal(hvd_vnchunks(10, 10), 1);
    assert_int_equal(hvd_vnchunks(11, 10), 2);
    assert_int_equal(hvd_vnchunks(5, 0), 0);
    for (size_t len = 1; len <= 700; len += 7) {
        for (size_t chunk = 1; chunk <= 130; chunk += 3) {
            size_t off = 0, n, count = 0;
            int last = 0;
            while (!last) {
                hvd_vchunk_next(len, off, chunk, &n, &last);
                assert_true(n >= 1 && n <= chunk);
                off += n;
                count++;
                assert_true(count <= len);
            }
            assert_int_equal(off, len);
            assert_int_equal(count, hvd_vnchunks(len, chunk));
        }
    }
}

/* Every (from, channel, slot) of a rank's ring is its own range inside
 * the ring, for every receiver. */
static void ring_layout(void **state) {
    const uint32_t slots[2] = {3, 2};
    const uint32_t bytes[2] = {8192, 4096};

    (void)state;
    for (int size = 2; size <= 6; size++) {
        uint64_t total = hvd_vring_bytes(size, slots, bytes);
        assert_int_equal(total, (uint64_t)(size - 1) * (3 * 8192 + 2 * 4096));
        for (int to = 0; to < size; to++) {
            uint8_t *used = calloc(total / 4096, 1);
            for (int from = 0; from < size; from++) {
                if (from == to)
                    continue;
                for (int ch = 0; ch < 2; ch++) {
                    for (uint32_t s = 0; s < slots[ch]; s++) {
                        uint64_t off = hvd_vring_offset(size, to, from, ch, s,
                                                        slots, bytes);
                        assert_true(off + bytes[ch] <= total);
                        for (uint64_t b = off; b < off + bytes[ch]; b += 4096) {
                            assert_int_equal(used[b / 4096], 0);
                            used[b / 4096] = 1;
                        }
                    }
                }
            }
            for (uint64_t i = 0; i < total / 4096; i++)
                assert_int_equal(used[i], 1);
            free(used);
        }
    }
}

static void reassembly(void **state) {
    size_t got;

    (void)state;
    /* Exactly right, in three chunks. */
    assert_int_equal(hvd_vrx_chunk(300, 0, 128, 0, &got), HVD_VRX_MORE);
    assert_int_equal(got, 128);
    assert_int_equal(hvd_vrx_chunk(300, 128, 128, 0, &got), HVD_VRX_MORE);
    assert_int_equal(hvd_vrx_chunk(300, 256, 44, 1, &got), HVD_VRX_DONE);
    assert_int_equal(got, 300);
    /* The sender's message is longer: a chunk overflows, or fills the
     * receive without being the last. */
    assert_int_equal(hvd_vrx_chunk(300, 256, 128, 0, &got), HVD_VRX_TOO_LONG);
    assert_int_equal(got, 384);
    assert_int_equal(hvd_vrx_chunk(300, 256, 44, 0, &got), HVD_VRX_TOO_LONG);
    assert_int_equal(hvd_vrx_chunk(0, 0, 1, 1, &got), HVD_VRX_TOO_LONG);
    /* Shorter: the last chunk comes early. */
    assert_int_equal(hvd_vrx_chunk(300, 128, 100, 1, &got), HVD_VRX_TOO_SHORT);
    assert_int_equal(got, 228);
}

static void credits(void **state) {
    hvd_vcredit c;
    uint16_t e, s;

    (void)state;
    hvd_vcredit_init(&c, 4, 2, 16, 8);
    assert_int_equal(c.eager_thresh, 8);
    assert_int_equal(c.slot_thresh, 4);
    for (int i = 0; i < 4; i++)
        assert_true(hvd_vcredit_take_eager(&c));
    assert_false(hvd_vcredit_take_eager(&c));
    assert_true(hvd_vcredit_take_slot(&c));
    assert_true(hvd_vcredit_take_slot(&c));
    assert_false(hvd_vcredit_take_slot(&c));
    /* Returns up to what the peer has, never more. */
    assert_int_equal(hvd_vcredit_grant(&c, 3, 2), 0);
    assert_int_equal(c.eager, 3);
    assert_int_equal(hvd_vcredit_grant(&c, 2, 0), -1);
    assert_int_equal(c.eager, 3);
    assert_int_equal(hvd_vcredit_grant(&c, 0, 1), -1);
    assert_int_equal(hvd_vcredit_grant(&c, 1, 0), 0);
    /* Receiving side: a CREDIT is due at half of either kind. */
    assert_false(hvd_vcredit_due(&c));
    for (int i = 0; i < 3; i++)
        hvd_vcredit_freed_slot(&c);
    assert_false(hvd_vcredit_due(&c));
    hvd_vcredit_freed_slot(&c);
    assert_true(hvd_vcredit_due(&c));
    hvd_vcredit_freed_eager(&c);
    hvd_vcredit_collect(&c, &e, &s);
    assert_int_equal(e, 1);
    assert_int_equal(s, 4);
    assert_false(hvd_vcredit_due(&c));
    /* Collect clamps to the header's 16 bits and keeps the rest. */
    c.eager_ret = 70000;
    hvd_vcredit_collect(&c, &e, &s);
    assert_int_equal(e, 0xffff);
    assert_int_equal(c.eager_ret, 70000 - 0xffff);
    /* A peer with one buffer gets a CREDIT for every one freed. */
    hvd_vcredit_init(&c, 1, 1, 1, 1);
    hvd_vcredit_freed_eager(&c);
    assert_true(hvd_vcredit_due(&c));
}

/*
 * A sender and a receiver, one queue pair, in a random interleaving: the
 * sender posts eager messages and chunked ones while it has credits; the
 * receiver takes arrivals into its buffers (eager) or ring (chunks),
 * copies them out when its irecvs are posted, and returns credits
 * piggybacked on its own eager messages or in CREDIT messages when due.
 * Invariants: the receiver never holds more than it posted (no overrun),
 * messages arrive whole and in order, and everything gets through (no
 * deadlock).
 */
#define SIM_EAGER 16
#define SIM_SLOTS 4
#define SIM_MSGS 2000

typedef struct sim_item {
    int chunk;
    int msg;
    int last;
} sim_item;

static void run_flow(int piggyback) {
    hvd_vcredit snd, rcv; /* the sender's and the receiver's view */
    sim_item wire[4096];
    int whead = 0, wcount = 0;
    /* Credit returns in flight from receiver to sender. */
    uint32_t ret_e[4096], ret_s[4096];
    int rhead = 0, rcount = 0;
    sim_item held[SIM_EAGER + SIM_SLOTS + 1];
    int nheld = 0, held_eager = 0, held_slots = 0;
    int next_send = 0, chunks_left = 0, next_recv = 0, posted = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    long steps = 0;

    hvd_vcredit_init(&snd, SIM_EAGER, SIM_SLOTS, SIM_EAGER, SIM_SLOTS);
    hvd_vcredit_init(&rcv, SIM_EAGER, SIM_SLOTS, SIM_EAGER, SIM_SLOTS);
    while (next_recv < SIM_MSGS) {
        assert_true(++steps < 10000000);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        switch (x % 4) {
        case 0: /* the sender posts what its credits allow */
            while (next_send < SIM_MSGS) {
                int big = next_send % 3 == 2;
                if (!big) {
                    if (!hvd_vcredit_take_eager(&snd))
                        break;
                    wire[(whead + wcount++) % 4096] =
                        (sim_item){.chunk = 0, .msg = next_send, .last = 1};
                    next_send++;
                    continue;
                }
                if (chunks_left == 0)
                    chunks_left = 1 + next_send % 5;
                if (!hvd_vcredit_take_slot(&snd))
                    break;
                chunks_left--;
                wire[(whead + wcount++) % 4096] = (sim_item){
                    .chunk = 1, .msg = next_send, .last = chunks_left == 0};
                if (chunks_left == 0)
                    next_send++;
            }
            break;
        case 1: /* the wire delivers some, in order */
            for (int k = (int)(x >> 8) % 5; k >= 0 && wcount > 0; k--) {
                sim_item it = wire[whead];
                whead = (whead + 1) % 4096;
                wcount--;
                held[nheld++] = it;
                if (it.chunk)
                    held_slots++;
                else
                    held_eager++;
                /* No overrun: never more than the receiver posted. */
                assert_true(held_eager <= SIM_EAGER);
                assert_true(held_slots <= SIM_SLOTS);
            }
            break;
        case 2: /* the application posts irecvs; they consume in order */
            posted += (int)((x >> 16) % 3);
            while (nheld > 0 && next_recv < posted) {
                sim_item it = held[0];
                assert_int_equal(it.msg, next_recv);
                memmove(held, held + 1, (size_t)(nheld - 1) * sizeof(*held));
                nheld--;
                if (it.chunk) {
                    held_slots--;
                    hvd_vcredit_freed_slot(&rcv);
                } else {
                    held_eager--;
                    hvd_vcredit_freed_eager(&rcv);
                }
                if (it.last)
                    next_recv++;
            }
            /* Returns go back in a CREDIT when due, or (piggyback)
             * on a reverse eager message now and then. */
            if (hvd_vcredit_due(&rcv) || (piggyback && (x >> 24) % 7 == 0)) {
                uint16_t e, s;
                hvd_vcredit_collect(&rcv, &e, &s);
                if (e || s) {
                    ret_e[(rhead + rcount) % 4096] = e;
                    ret_s[(rhead + rcount) % 4096] = s;
                    rcount++;
                }
            }
            break;
        case 3: /* returns arrive at the sender */
            if (rcount > 0) {
                assert_int_equal(
                    hvd_vcredit_grant(&snd, ret_e[rhead], ret_s[rhead]), 0);
                rhead = (rhead + 1) % 4096;
                rcount--;
            }
            break;
        }
    }
    assert_int_equal(next_send, SIM_MSGS);
}

/* CREDIT messages alone (a receiver that never sends) keep it going. */
static void credit_flow(void **state) {
    (void)state;
    run_flow(0);
}

static void credit_flow_piggyback(void **state) {
    (void)state;
    run_flow(1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(header_round_trip),
        cmocka_unit_test(header_malformed),
        cmocka_unit_test(abort_notice),
        cmocka_unit_test(immediates),
        cmocka_unit_test(rendezvous_messages),
        cmocka_unit_test(eager_boundary),
        cmocka_unit_test(chunking),
        cmocka_unit_test(ring_layout),
        cmocka_unit_test(reassembly),
        cmocka_unit_test(credits),
        cmocka_unit_test(credit_flow),
        cmocka_unit_test(credit_flow_piggyback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
