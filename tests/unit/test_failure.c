/*
 * How a transport fails for good (transport/bootstrap/failure.c), the part
 * every transport shares: the first failure wins and later ones change nothing,
 * a relayed cause names the rank that found it once, the recorded failure
 * comes back as the thread's error, hvd_tp_failf formats and hands over,
 * how peers are named, and the one stall sentence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transport/base/error.h"
#include "transport/bootstrap/failure.h"

static void first_failure_wins(void **state) {
    hvd_tp_failure f;

    (void)state;
    memset(&f, 0, sizeof(f));
    assert_int_equal(hvd_tp_failure_error(&f), HVD_OK);
    assert_int_equal(
        hvd_tp_failure_set(&f, "test", HVD_ERR_PEER_LOST, 2, 2, "lost rank 3"),
        1);
    assert_int_equal(f.status, HVD_ERR_PEER_LOST);
    assert_string_equal(f.text, "lost rank 3");
    assert_int_equal(
        hvd_tp_failure_set(&f, "test", HVD_ERR_TIMEOUT, 2, 2, "later"), 0);
    assert_int_equal(f.status, HVD_ERR_PEER_LOST);
    assert_string_equal(f.text, "lost rank 3");
    /* Every later call returns it, with its sentence. */
    hvd_error_set(HVD_ERR_INTERNAL, "something else");
    assert_int_equal(hvd_tp_failure_error(&f), HVD_ERR_PEER_LOST);
    assert_string_equal(hvd_error_get(), "lost rank 3");
}

/* A cause another rank found is said to come from it, once; no origin
 * (-1) is this rank's own. */
static void relayed_cause(void **state) {
    hvd_tp_failure f;

    (void)state;
    memset(&f, 0, sizeof(f));
    hvd_tp_failure_set(&f, "test", HVD_ERR_MISMATCH, 1, 4, "bad length");
    assert_string_equal(f.text, "rank 4 reported: bad length");
    memset(&f, 0, sizeof(f));
    hvd_tp_failure_set(&f, "test", HVD_ERR_MISMATCH, 1, -1, "bad length");
    assert_string_equal(f.text, "bad length");
}

typedef struct sink {
    int calls;
    hvd_status status;
    int culprit, origin;
    char text[HVD_ERROR_MAX];
} sink;

static hvd_status record(void *tp, hvd_status status, int culprit, int origin,
                         const char *text) {
    sink *s = tp;

    s->calls++;
    s->status = status;
    s->culprit = culprit;
    s->origin = origin;
    snprintf(s->text, sizeof(s->text), "%s", text);
    return status;
}

static void failf_formats_and_hands_over(void **state) {
    sink s;

    (void)state;
    memset(&s, 0, sizeof(s));
    assert_int_equal(
        hvd_tp_failf(record, &s, 3, HVD_ERR_TRANSPORT, 1, "%s %d", "code", 42),
        HVD_ERR_TRANSPORT);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.culprit, 1);
    assert_int_equal(s.origin, 3);
    assert_string_equal(s.text, "code 42");
}

static void stall_sentence(void **state) {
    sink s;

    (void)state;
    memset(&s, 0, sizeof(s));
    assert_int_equal(
        hvd_tp_fail_stalled(record, &s, 0, 2, "rank 2", 5000000000LL),
        HVD_ERR_TIMEOUT);
    assert_int_equal(s.culprit, 2);
    assert_int_equal(s.origin, 0);
    assert_non_null(strstr(s.text, "from rank 2 for 5 s while rank 0 waited"));
    assert_non_null(strstr(s.text, "HVD_TIMEOUT_SECONDS"));
}

static void describe(void **state) {
    char out[160];

    (void)state;
    hvd_tp_describe(out, sizeof(out), 3, 4, "host-a", 1234);
    assert_string_equal(out, "rank 3 (pid 1234 on host-a)");
    hvd_tp_describe(out, sizeof(out), 3, 4, NULL, 1234);
    assert_string_equal(out, "rank 3");
    hvd_tp_describe(out, sizeof(out), 3, 4, "host-a", -1);
    assert_string_equal(out, "rank 3");
    hvd_tp_describe(out, sizeof(out), 4, 4, "host-a", 1);
    assert_string_equal(out, "an unknown peer");
    hvd_tp_describe(out, sizeof(out), -1, 4, "host-a", 1);
    assert_string_equal(out, "an unknown peer");
}

static void copy_names(void **state) {
    char hosts[2][HVD_HOST_MAX] = {"a", "b"};
    int pids[2] = {10, 11};
    char(*h)[HVD_HOST_MAX];
    int *q;

    (void)state;
    hvd_tp_copy_names(NULL, NULL, 2, &h, &q);
    assert_null(h);
    assert_null(q);
    hvd_tp_copy_names((const char(*)[HVD_HOST_MAX])hosts, pids, 2, &h, &q);
    assert_non_null(h);
    assert_non_null(q);
    assert_string_equal(h[1], "b");
    assert_int_equal(q[1], 11);
    /* Copies: the caller's may go. */
    hosts[1][0] = 'z';
    assert_string_equal(h[1], "b");
    free(h);
    free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(first_failure_wins),
        cmocka_unit_test(relayed_cause),
        cmocka_unit_test(failf_formats_and_hands_over),
        cmocka_unit_test(stall_sentence),
        cmocka_unit_test(describe),
        cmocka_unit_test(copy_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
