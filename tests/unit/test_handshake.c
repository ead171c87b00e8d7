/* The handshake state machine: success, wrong secret on either side, wrong
 * job, replay, malformed and truncated messages, refusal by the admission
 * check, and the socket driver. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/clock.h"
#include "transport/bootstrap/handshake.h"

static const uint8_t job_a[HVD_JOB_ID_LEN] = {1, 2,  3,  4,  5,  6,  7,  8,
                                              9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t job_b[HVD_JOB_ID_LEN] = {16, 15, 14, 13, 12, 11, 10, 9,
                                              8,  7,  6,  5,  4,  3,  2,  1};

/* Moves hs_from's queued output into hs_to's input, message by message. */
static hvd_status deliver(hvd_hs *from, hvd_hs *to) {
    size_t len = from->out_len - from->out_off;
    hvd_status st;

    assert_int_equal(len, hvd_hs_need(to));
    st = hvd_hs_input(to, from->out + from->out_off, len);
    from->out_off = from->out_len;
    return st;
}

static void run_ok(hvd_hs *c, hvd_hs *s) {
    assert_int_equal(deliver(c, s), HVD_OK); /* HELLO */
    assert_int_equal(deliver(s, c), HVD_OK); /* CHALLENGE */
    assert_int_equal(deliver(c, s), HVD_OK); /* RESPONSE */
    assert_int_equal(deliver(s, c), HVD_OK); /* RESULT */
    assert_true(hvd_hs_done(c));
    assert_true(hvd_hs_done(s));
}

static void success(void **state) {
    (void)state;
    hvd_hs c, s;

    assert_int_equal(
        hvd_hs_client_init(&c, job_a, "s3cret", HVD_HS_KIND_DATA, 5, 1, 2),
        HVD_OK);
    hvd_hs_server_init(&s, job_a, "s3cret", HVD_HS_KIND_DATA, 2, NULL, NULL);
    assert_int_equal(c.out_len, HVD_HS_HELLO_LEN);
    run_ok(&c, &s);
    assert_int_equal(s.peer_rank, 5);
    assert_int_equal(s.peer_index, 1);
    assert_int_equal(s.peer_kind, HVD_HS_KIND_DATA);
    assert_int_equal(c.peer_rank, 2);
}

static void client_wrong_secret(void **state) {
    (void)state;
    hvd_hs c, s;

    hvd_hs_client_init(&c, job_a, "wrong", HVD_HS_KIND_DATA, 1, 0, -1);
    hvd_hs_server_init(&s, job_a, "right", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(deliver(&c, &s), HVD_OK);
    /* The client cannot verify the server's proof and gives up. */
    assert_int_equal(deliver(&s, &c), HVD_ERR_AUTH);
    assert_non_null(strstr(c.err, "HVD_SECRET"));
    assert_false(hvd_hs_done(&c));
}

static void forged_response(void **state) {
    (void)state;
    hvd_hs c, s;

    /* A client that ignores the server's proof and answers anything is
     * refused, and the refusal is queued for it. */
    hvd_hs_client_init(&c, job_a, "wrong", HVD_HS_KIND_DATA, 1, 0, -1);
    hvd_hs_server_init(&s, job_a, "right", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(deliver(&c, &s), HVD_OK);
    s.out_off = s.out_len;
    uint8_t resp[HVD_HS_RESPONSE_LEN];
    memset(resp, 0xab, sizeof(resp));
    resp[0] = 0x48, resp[1] = 0x44, resp[2] = 0x56, resp[3] = 0x48;
    assert_int_equal(hvd_hs_input(&s, resp, sizeof(resp)), HVD_ERR_AUTH);
    assert_int_equal(s.out_len - s.out_off, HVD_HS_RESULT_LEN);
    assert_int_equal(s.out[4], HVD_HS_BAD_PROOF);
    assert_non_null(strstr(s.err, "HVD_SECRET"));
    assert_false(hvd_hs_done(&s));
}

static void wrong_job(void **state) {
    (void)state;
    hvd_hs c, s;

    hvd_hs_client_init(&c, job_b, "x", HVD_HS_KIND_DATA, 1, 0, -1);
    hvd_hs_server_init(&s, job_a, "x", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(deliver(&c, &s), HVD_ERR_AUTH);
    assert_non_null(strstr(s.err, "another job"));
    /* The refusal travels back and the client reports it. */
    assert_int_equal(deliver(&s, &c), HVD_ERR_AUTH);
    assert_non_null(strstr(c.err, "another job"));
}

static void replay(void **state) {
    (void)state;
    hvd_hs c, s1, s2;
    uint8_t hello[HVD_HS_HELLO_LEN], resp[HVD_HS_RESPONSE_LEN];

    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 1, 0, -1);
    hvd_hs_server_init(&s1, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    memcpy(hello, c.out, sizeof(hello));
    assert_int_equal(deliver(&c, &s1), HVD_OK);
    assert_int_equal(deliver(&s1, &c), HVD_OK);
    memcpy(resp, c.out, sizeof(resp));
    assert_int_equal(deliver(&c, &s1), HVD_OK);

    /* An eavesdropper replays the recorded HELLO and RESPONSE to a new
     * server session: the server's fresh nonce makes the proof stale. */
    hvd_hs_server_init(&s2, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(hvd_hs_input(&s2, hello, sizeof(hello)), HVD_OK);
    s2.out_off = s2.out_len;
    assert_int_equal(hvd_hs_input(&s2, resp, sizeof(resp)), HVD_ERR_AUTH);
    assert_int_equal(s2.out[4], HVD_HS_BAD_PROOF);
}

static hvd_hs_code refuse_rank3(void *ctx, int kind, int rank, int index,
                                char *why, size_t whylen) {
    (void)ctx, (void)kind, (void)index;
    if (rank == 3) {
        strncpy(why, "rank 3 is already connected", whylen - 1);
        why[whylen - 1] = '\0';
        return HVD_HS_UNEXPECTED;
    }
    return HVD_HS_OK;
}

static void admission_refused(void **state) {
    (void)state;
    hvd_hs c, s;

    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 3, 0, -1);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, refuse_rank3, NULL);
    assert_int_equal(deliver(&c, &s), HVD_ERR_AUTH);
    assert_string_equal(s.err, "rank 3 is already connected");
    assert_int_equal(deliver(&s, &c), HVD_ERR_AUTH);

    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 4, 0, -1);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, refuse_rank3, NULL);
    run_ok(&c, &s);
}

static void kind_and_peer_checked(void **state) {
    (void)state;
    hvd_hs c, s;

    /* A rendezvous client at a data port. */
    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_RENDEZVOUS, 1, 0, -1);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(deliver(&c, &s), HVD_ERR_AUTH);
    /* The process at the address is not the rank we meant to reach. */
    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 1, 0, 7);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(deliver(&c, &s), HVD_OK);
    assert_int_equal(deliver(&s, &c), HVD_ERR_AUTH);
    assert_non_null(strstr(c.err, "not rank 7"));
}

static void malformed_messages(void **state) {
    (void)state;
    hvd_hs c, s;
    uint8_t junk[HVD_HS_MAX_MSG];

    /* Wrong lengths are refused. */
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    memset(junk, 0, sizeof(junk));
    assert_int_not_equal(hvd_hs_input(&s, junk, HVD_HS_HELLO_LEN - 1), HVD_OK);
    /* Bad magic or version. */
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(hvd_hs_input(&s, junk, HVD_HS_HELLO_LEN), HVD_ERR_AUTH);
    assert_int_equal(s.out[4], HVD_HS_BAD_VERSION);
    /* A garbage challenge to a client. */
    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 1, 0, -1);
    assert_int_equal(hvd_hs_input(&c, junk, HVD_HS_CHALLENGE_LEN),
                     HVD_ERR_AUTH);
    /* Input after failure is refused, not processed. */
    assert_int_not_equal(hvd_hs_input(&c, junk, HVD_HS_CHALLENGE_LEN), HVD_OK);
    /* Random HELLOs never get through. */
    srand(1);
    for (int i = 0; i < 2000; i++) {
        for (size_t k = 0; k < HVD_HS_HELLO_LEN; k++)
            junk[k] = (uint8_t)rand();
        if (i % 2)
            memcpy(junk, "HDVH\x01\x00\x02\x00", 8);
        hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
        hvd_status st = hvd_hs_input(&s, junk, HVD_HS_HELLO_LEN);
        assert_int_equal(st, HVD_ERR_AUTH);
    }
}

/* Drives both ends over a non-blocking socketpair with hvd_hs_io. */
static void over_socketpair(void **state) {
    (void)state;
    int sv[2];
    hvd_hs c, s;
    int64_t deadline = hvd_now_ns() + 5000000000LL;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 1, 0, 0);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    while (!(hvd_hs_done(&c) && hvd_hs_done(&s))) {
        short ev;
        assert_int_equal(hvd_hs_io(&c, sv[0], &ev), HVD_OK);
        assert_int_equal(hvd_hs_io(&s, sv[1], &ev), HVD_OK);
        assert_true(hvd_now_ns() < deadline);
    }
    close(sv[0]);
    close(sv[1]);

    /* The peer closes mid-handshake: a failure, not a hang. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(write(sv[0], "HVDH", 4), 4); /* half a HELLO */
    close(sv[0]);
    assert_int_not_equal(hvd_hs_run(&s, sv[1], hvd_now_ns() + 1000000000LL),
                         HVD_OK);
    close(sv[1]);

    /* A peer that stalls: bounded by the deadline. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(hvd_hs_run(&s, sv[1], hvd_now_ns() + 200000000LL),
                     HVD_ERR_TIMEOUT);
    close(sv[0]);
    close(sv[1]);
}

/* A server that closes without a word (it dropped us unread) is
 * HVD_ERR_PEER_LOST, which callers retry; a refusal stays HVD_ERR_AUTH. */
static void dropped_unanswered(void **state) {
    (void)state;
    int sv[2];
    hvd_hs c, s;
    short ev;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    hvd_hs_client_init(&c, job_a, "k", HVD_HS_KIND_DATA, 1, 0, 0);
    assert_int_equal(hvd_hs_io(&c, sv[0], &ev), HVD_OK); /* HELLO out */
    close(sv[1]);
    assert_int_equal(hvd_hs_run(&c, sv[0], hvd_now_ns() + 1000000000LL),
                     HVD_ERR_PEER_LOST);
    close(sv[0]);

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv),
                     0);
    hvd_hs_client_init(&c, job_b, "k", HVD_HS_KIND_DATA, 1, 0, 0);
    hvd_hs_server_init(&s, job_a, "k", HVD_HS_KIND_DATA, 0, NULL, NULL);
    assert_int_equal(hvd_hs_io(&c, sv[0], &ev), HVD_OK);
    assert_int_equal(hvd_hs_io(&s, sv[1], &ev), HVD_ERR_AUTH); /* refused */
    close(sv[1]);
    assert_int_equal(hvd_hs_run(&c, sv[0], hvd_now_ns() + 1000000000LL),
                     HVD_ERR_AUTH);
    close(sv[0]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(success),
        cmocka_unit_test(client_wrong_secret),
        cmocka_unit_test(forged_response),
        cmocka_unit_test(wrong_job),
        cmocka_unit_test(replay),
        cmocka_unit_test(admission_refused),
        cmocka_unit_test(kind_and_peer_checked),
        cmocka_unit_test(malformed_messages),
        cmocka_unit_test(over_socketpair),
        cmocka_unit_test(dropped_unanswered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
