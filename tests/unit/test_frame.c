/* Frame header and ABORT payload: round trips, and every malformed or
 * truncated input is refused with HVD_ERR_PROTOCOL, never a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "transport/tcp/frame.h"

static void roundtrip(void **state) {
    (void)state;
    uint8_t buf[HVD_FRAME_HDR_LEN];
    hvd_frame in = {.type = HVD_FRAME_DATA,
                    .seq = 0x01020304,
                    .msg_len = 0x1122334455667788ull,
                    .len = 0x1122334455667700ull};
    hvd_frame out;

    hvd_frame_encode(&in, buf);
    assert_int_equal(buf[0], 0x56); /* little-endian "HV" */
    assert_int_equal(buf[1], 0x48);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 0x01020304, &out),
                     HVD_OK);
    assert_int_equal(out.type, HVD_FRAME_DATA);
    assert_int_equal(out.seq, in.seq);
    assert_true(out.msg_len == in.msg_len);
    assert_true(out.len == in.len);
}

static void zero_length_data_and_bye(void **state) {
    (void)state;
    uint8_t buf[HVD_FRAME_HDR_LEN];
    hvd_frame f = {.type = HVD_FRAME_DATA, .seq = 7};
    hvd_frame out;

    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 7, &out), HVD_OK);
    assert_true(out.len == 0);
    f.type = HVD_FRAME_BYE;
    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 7, &out), HVD_OK);
    assert_int_equal(out.type, HVD_FRAME_BYE);
}

static void truncated(void **state) {
    (void)state;
    uint8_t buf[HVD_FRAME_HDR_LEN];
    hvd_frame f = {.type = HVD_FRAME_DATA, .seq = 0, .msg_len = 8, .len = 8};
    hvd_frame out;

    hvd_frame_encode(&f, buf);
    for (size_t n = 0; n < HVD_FRAME_HDR_LEN; n++)
        assert_int_equal(hvd_frame_decode(buf, n, 0, &out), HVD_ERR_PROTOCOL);
}

static void malformed(void **state) {
    (void)state;
    uint8_t good[HVD_FRAME_HDR_LEN], buf[HVD_FRAME_HDR_LEN];
    hvd_frame f = {.type = HVD_FRAME_DATA, .seq = 3, .msg_len = 100, .len = 50};
    hvd_frame out;

    hvd_frame_encode(&f, good);
    assert_int_equal(hvd_frame_decode(good, sizeof(good), 3, &out), HVD_OK);

    memcpy(buf, good, sizeof(buf));
    buf[0] ^= 0xff; /* magic */
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    memcpy(buf, good, sizeof(buf));
    buf[2] = 0; /* type */
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    buf[2] = 99;
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    memcpy(buf, good, sizeof(buf));
    buf[3] = 1; /* flags */
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    /* Out-of-sequence frame. */
    assert_int_equal(hvd_frame_decode(good, sizeof(good), 4, &out),
                     HVD_ERR_PROTOCOL);
    /* A part longer than its message. */
    f.len = 101;
    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    /* A goodbye with a payload; an abort too short or too long. */
    f.type = HVD_FRAME_BYE;
    f.len = 1;
    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    f.type = HVD_FRAME_ABORT;
    f.len = 11;
    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    f.len = HVD_FRAME_ABORT_MAX + 1;
    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
    /* A huge length prefix is refused before anything is allocated. */
    f.len = UINT64_MAX;
    hvd_frame_encode(&f, buf);
    assert_int_equal(hvd_frame_decode(buf, sizeof(buf), 3, &out),
                     HVD_ERR_PROTOCOL);
}

static void abort_payload(void **state) {
    (void)state;
    uint8_t buf[HVD_FRAME_ABORT_MAX];
    hvd_frame_abort in = {
        .status = HVD_ERR_PEER_LOST, .culprit = 3, .origin = 1};
    hvd_frame_abort out;
    size_t n;

    strcpy(in.text, "lost rank 3: its connection closed");
    n = hvd_frame_abort_encode(&in, buf);
    assert_int_equal(n, 12 + strlen(in.text));
    assert_int_equal(hvd_frame_abort_decode(buf, n, &out), HVD_OK);
    assert_int_equal(out.status, HVD_ERR_PEER_LOST);
    assert_int_equal(out.culprit, 3);
    assert_int_equal(out.origin, 1);
    assert_string_equal(out.text, in.text);

    /* Control characters are neutralised; a bogus status becomes
     * internal; short payloads are refused. */
    buf[12] = '\n';
    buf[0] = 0xee;
    assert_int_equal(hvd_frame_abort_decode(buf, n, &out), HVD_OK);
    assert_int_equal(out.text[0], '?');
    assert_int_equal(out.status, HVD_ERR_INTERNAL);
    assert_int_equal(hvd_frame_abort_decode(buf, 11, &out), HVD_ERR_PROTOCOL);
    assert_int_equal(hvd_frame_abort_decode(buf, HVD_FRAME_ABORT_MAX + 1, &out),
                     HVD_ERR_PROTOCOL);

    /* Over-long text is cut at the maximum. */
    memset(in.text, 'x', sizeof(in.text) - 1);
    in.text[sizeof(in.text) - 1] = '\0';
    n = hvd_frame_abort_encode(&in, buf);
    assert_int_equal(n, HVD_FRAME_ABORT_MAX);
}

/* Every single-byte corruption of a valid header either decodes to a
 * consistent frame or is refused. */
static void single_byte_corruptions(void **state) {
    (void)state;
    uint8_t good[HVD_FRAME_HDR_LEN], buf[HVD_FRAME_HDR_LEN];
    hvd_frame f = {
        .type = HVD_FRAME_DATA, .seq = 9, .msg_len = 4096, .len = 1024};
    hvd_frame out;

    hvd_frame_encode(&f, good);
    for (size_t i = 0; i < sizeof(buf); i++) {
        for (int v = 0; v < 256; v++) {
            memcpy(buf, good, sizeof(buf));
            buf[i] = (uint8_t)v;
            hvd_status st = hvd_frame_decode(buf, sizeof(buf), 9, &out);
            if (st == HVD_OK && out.type == HVD_FRAME_DATA)
                assert_true(out.len <= out.msg_len);
            else if (st == HVD_OK && out.type == HVD_FRAME_ABORT)
                assert_true(out.len <= HVD_FRAME_ABORT_MAX);
            else if (st != HVD_OK)
                assert_int_equal(st, HVD_ERR_PROTOCOL);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(roundtrip),
        cmocka_unit_test(zero_length_data_and_bye),
        cmocka_unit_test(truncated),
        cmocka_unit_test(malformed),
        cmocka_unit_test(abort_payload),
        cmocka_unit_test(single_byte_corruptions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
