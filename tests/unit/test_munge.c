/* The checks of the munge credential exchange of a hosted rendezvous
 * (transport/bootstrap/munge.h, handshake.h), without munged: what a
 * decoded credential must be, the server's answer to a credential
 * request, the client's reading of a refusal, and munge without munged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "transport/base/error.h"
#include "transport/base/wire.h"
#include "transport/bootstrap/handshake.h"
#include "transport/bootstrap/munge.h"

static const uint8_t job_a[HVD_JOB_ID_LEN] = {1, 2,  3,  4,  5,  6,  7,  8,
                                              9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t job_b[HVD_JOB_ID_LEN] = {16, 15, 14, 13, 12, 11, 10, 9,
                                              8,  7,  6,  5,  4,  3,  2,  1};

static void decoded_checks(void **state) {
    (void)state;
    assert_int_equal(hvd_munge_check(1000, 1000, 80, 80), HVD_OK);
    /* A listener of another uid handed this rank its own credential. */
    assert_int_equal(hvd_munge_check(1001, 1000, 80, 80), HVD_ERR_AUTH);
    assert_non_null(strstr(hvd_error_get(), "encoded by uid 1001"));
    assert_int_equal(hvd_munge_check(1000, 1000, 79, 80), HVD_ERR_AUTH);
    assert_non_null(strstr(hvd_error_get(), "79 bytes"));
}

static int fake_cred(void *ctx, char *cred, size_t cap) {
    (*(int *)ctx)++;
    assert_true(cap >= 5);
    memcpy(cred, "MUNGE", 5);
    return 5;
}

/* A credential request for job, as the client sends it. */
static void request(uint8_t req[HVD_HS_HELLO_LEN], const uint8_t *job) {
    memset(req, 0, HVD_HS_HELLO_LEN);
    hvd_put32(req, HVD_HS_MAGIC_CRED);
    hvd_put16(req + 4, HVD_HS_VERSION);
    hvd_put16(req + 6, HVD_HS_KIND_RENDEZVOUS);
    memcpy(req + 8, job, HVD_JOB_ID_LEN);
}

/* The server's answer to a request for job: its code, and its
 * credential's length. */
static uint32_t answer(hvd_hs_cred_fn fn, void *ctx, const uint8_t *job,
                       uint32_t *len, hvd_hs *s) {
    uint8_t req[HVD_HS_HELLO_LEN];

    hvd_hs_server_init(s, job_a, "secret", HVD_HS_KIND_RENDEZVOUS, -1, NULL,
                       NULL);
    s->cred = fn;
    s->cred_ctx = ctx;
    request(req, job);
    /* The answer is no refusal: the handshake ends, the answer queued. */
    assert_int_equal(hvd_hs_input(s, req, sizeof(req)), HVD_ERR_AUTH);
    assert_true(s->cred_served > 0);
    assert_int_equal(hvd_get32(s->out), HVD_HS_MAGIC_CRED);
    *len = hvd_get32(s->out + 8);
    assert_int_equal(s->out_len, HVD_HS_CRED_HEAD + *len);
    return hvd_get32(s->out + 4);
}

static void server_answers(void **state) {
    hvd_hs s;
    uint32_t len;
    int calls = 0;

    (void)state;
    assert_int_equal(answer(fake_cred, &calls, job_a, &len, &s), HVD_HS_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(s.out + HVD_HS_CRED_HEAD, "MUNGE", 5);
    assert_int_equal(s.cred_served, 2);
    /* Another job's request gets no credential of this one. */
    assert_int_equal(answer(fake_cred, &calls, job_b, &len, &s),
                     HVD_HS_WRONG_JOB);
    assert_int_equal(len, 0);
    assert_int_equal(calls, 1);
    /* A server without munge says so. */
    assert_int_equal(answer(NULL, NULL, job_a, &len, &s), HVD_HS_NO_CRED);
    assert_int_equal(s.cred_served, 1);
}

/* A client reads a server's refusal: another job, a wrong secret, a
 * program that is not hvd. */
static void client_refusals(void **state) {
    uint8_t m[HVD_HS_CHALLENGE_LEN];
    hvd_hs c;
    struct {
        uint32_t magic, code;
        int refusal;
    } cases[] = {
        {HVD_HS_MAGIC, HVD_HS_WRONG_JOB, HVD_HS_WRONG_JOB},
        {HVD_HS_MAGIC, HVD_HS_BAD_PROOF, HVD_HS_BAD_PROOF},
        {HVD_HS_MAGIC, 99, HVD_HS_BAD_VERSION},
        {0x2f2f2f2f, 0, HVD_HS_NOT_HVD},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(hvd_hs_client_init(&c, job_a, "secret",
                                            HVD_HS_KIND_RENDEZVOUS, 1, 0, -1),
                         HVD_OK);
        memset(m, 0, sizeof(m));
        hvd_put32(m, cases[i].magic);
        hvd_put32(m + 4, cases[i].code);
        assert_int_equal(hvd_hs_input(&c, m, sizeof(m)), HVD_ERR_AUTH);
        assert_int_equal(c.refusal, cases[i].refusal);
    }
}

static void without_munged(void **state) {
    char why[200] = "";
    char cred[HVD_MUNGE_CRED_MAX];
    uint8_t payload[8];

    (void)state;
    assert_int_equal(
        hvd_munge_usable("/nonexistent/munge.socket", why, sizeof(why)), 0);
    assert_true(why[0] != '\0');
    assert_int_not_equal(
        hvd_munge_encode("/nonexistent/munge.socket", "x", 1, cred), HVD_OK);
    assert_int_not_equal(hvd_munge_decode("/nonexistent/munge.socket",
                                          "MUNGE:forged:", payload,
                                          sizeof(payload)),
                         HVD_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decoded_checks),
        cmocka_unit_test(server_answers),
        cmocka_unit_test(client_refusals),
        cmocka_unit_test(without_munged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
