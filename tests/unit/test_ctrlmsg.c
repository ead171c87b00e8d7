/* Checks of control messages off the wire (api/runtime/ctrlmsg.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/ctrlmsg.h"
#include "transport/base/error.h"

static uint64_t counts[2] = {10, 20};

static Hvd__Engine__Request request(void) {
    Hvd__Engine__Request r = HVD__ENGINE__REQUEST__INIT;

    r.name = "grad";
    r.kind = HVD_KIND_ALLREDUCE;
    r.dtype = HVD_FLOAT32;
    r.op = HVD_SUM;
    r.n_counts = 1;
    r.counts = counts;
    return r;
}

static Hvd__Engine__Response response(void) {
    Hvd__Engine__Response r = HVD__ENGINE__RESPONSE__INIT;

    r.name = "grad";
    r.kind = HVD_KIND_ALLREDUCE;
    r.dtype = HVD_FLOAT32;
    r.op = HVD_AVERAGE;
    r.n_counts = 2;
    r.counts = counts;
    r.error = "";
    r.contributors = 4;
    r.last_joined = -1;
    return r;
}

static void good_messages(void **state) {
    (void)state;
    Hvd__Engine__Request q = request();
    Hvd__Engine__Response p = response();
    hvd_opdesc d;

    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    assert_int_equal(d.kind, HVD_KIND_ALLREDUCE);
    assert_int_equal(d.ncounts, 1);
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_OK);
    assert_int_equal(d.op, HVD_AVERAGE);
    assert_int_equal(d.ncounts, 2);
    /* An error response runs nothing: no contributors needed. */
    p.status = HVD_ERR_MISMATCH;
    p.contributors = 0;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_OK);
}

static void bad_requests(void **state) {
    (void)state;
    Hvd__Engine__Request q;
    uint64_t huge[2] = {UINT64_MAX / 2, UINT64_MAX / 2};
    hvd_opdesc d;

    q = request();
    q.kind = HVD_KIND_COUNT;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q = request();
    q.dtype = 99;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "dtype 99"));
    q = request();
    q.op = 6;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    /* Adasum: an allreduce's op only. */
    q = request();
    q.op = HVD_ADASUM;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    q.kind = HVD_KIND_REDUCESCATTER;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q = request();
    q.n_counts = 0;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q = request();
    q.kind = HVD_KIND_BROADCAST;
    q.root = 4;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.root = -1;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q = request();
    q.counts = huge;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.n_counts = 2;
    huge[0] = huge[1] = (SIZE_MAX / 2) / 4 / 2 + 1; /* fine alone, not both */
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q = request();
    q.name = NULL;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
}

/* Shapes: two to eight dimensions whose product is the one count. */
static void shapes(void **state) {
    (void)state;
    Hvd__Engine__Request q = request();
    int64_t shape[9] = {2, 5, 1, 1, 1, 1, 1, 1, 1};
    int64_t other[2] = {5, 2};
    hvd_opdesc d, e;
    char text[128];

    q.n_shape = 2;
    q.shape = shape;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    assert_int_equal(d.ndims, 2);
    assert_int_equal(d.dims[1], 5);
    hvd_opdesc_format(&d, text, sizeof(text));
    assert_string_equal(text, "allreduce float32 sum shape [2, 5]");
    q.shape = other;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &e), HVD_OK);
    assert_false(hvd_opdesc_equal(&d, &e)); /* same count, other shape */
    q.n_shape = 0;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &e), HVD_OK);
    assert_false(hvd_opdesc_equal(&d, &e)); /* a count alone differs too */
    /* Malformed: a product other than the count, one dimension, more than
     * eight, a negative one, a shape on a grouped or gather request. */
    q.shape = shape;
    q.n_shape = 2;
    shape[1] = 4;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    shape[1] = 5;
    q.n_shape = 1;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.n_shape = 9;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.n_shape = 2;
    shape[0] = -2;
    shape[1] = -5;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    shape[0] = 2;
    shape[1] = 5;
    q.kind = HVD_KIND_ALLGATHER;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.kind = HVD_KIND_ALLREDUCE;
    q.n_counts = 2;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
}

static void bad_responses(void **state) {
    (void)state;
    Hvd__Engine__Response p;
    uint32_t joined[2] = {1, 4};
    hvd_opdesc d;

    /* 0 contributors would make an average divide by zero. */
    p = response();
    p.contributors = 0;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    p.contributors = 5;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    p = response();
    p.status = 1000;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    p = response();
    p.last_joined = 4;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    p = response();
    p.n_joined = 2;
    p.joined = joined;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    p = response();
    p.error = NULL;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    p = response();
    p.dtype = 8;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
}

/* A malformed message is the peer's protocol error (HVD_ERR_PROTOCOL),
 * not a transport failure: the status was appended to the table, so the
 * earlier values stay, and a response may carry it (it is the last one). */
static void protocol_status(void **state) {
    (void)state;
    Hvd__Engine__Response p;
    hvd_opdesc d;

    assert_int_equal(HVD_ERR_PEERS_CHANGED, 12);
    assert_int_equal(HVD_ERR_PROTOCOL, 13);
    assert_string_equal(hvd_status_name(HVD_ERR_PROTOCOL), "HVD_ERR_PROTOCOL");
    assert_string_equal(hvd_strerror(HVD_ERR_PROTOCOL),
                        "a peer sent a malformed or unexpected message");
    p = response();
    p.status = HVD_ERR_PROTOCOL;
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_OK);
    p.status = HVD_ERR_PROTOCOL + 1;
    hvd_error_clear();
    assert_int_equal(hvd_ctrl_check_response(&p, 4, &d), HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "unknown status 14"));
}

/* The brief form of a step: what fits it, a round trip, and lengths that
 * do not add up. */
/* Process sets: an operation carries its set; creating one lists
 * ascending ranks of the job; join, call and the set operations are the
 * job's. */
static void process_sets(void **state) {
    (void)state;
    Hvd__Engine__Request q = request();
    uint64_t ranks[3] = {0, 2, 3}, unsorted[2] = {2, 1}, big[1] = {4};
    hvd_opdesc d;

    q.process_set = 3;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    assert_int_equal(d.pset, 3);
    /* An alltoall in a set has a count per member (at most the job's). */
    q.kind = HVD_KIND_ALLTOALL;
    q.n_counts = 2;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    q.n_counts = 1;
    q.process_set = 0;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q = request();
    q.kind = HVD_KIND_PSET;
    q.op = HVD_PSET_CREATE;
    q.n_counts = 3;
    q.counts = ranks;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    q.process_set = 1; /* the job's own operation */
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.process_set = 0;
    q.n_counts = 2;
    q.counts = unsorted;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.n_counts = 1;
    q.counts = big;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.op = HVD_PSET_REMOVE; /* of no set */
    q.root = 0;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
    q.root = 2;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_OK);
    q.op = 7;
    assert_int_equal(hvd_ctrl_check_request(&q, 4, &d), HVD_ERR_PROTOCOL);
}

static void brief_steps(void **state) {
    (void)state;
    uint32_t ready[3] = {4, 0, 9}, carried[1] = {9};
    Hvd__Engine__Step m = HVD__ENGINE__STEP__INIT, back;
    Hvd__Engine__Cycle c = HVD__ENGINE__CYCLE__INIT, back_cycle;
    uint32_t buf[16]; /* 4-byte aligned */
    uint8_t *b = (uint8_t *)buf;

    m.number = 77;
    m.ready = ready;
    m.n_ready = 3;
    m.carried = carried;
    m.n_carried = 1;
    assert_int_equal(hvd_ctrl_brief_size(&m), 16 + 4 * 4);
    /* Rank 0's step: brief only while its cycle says nothing more. */
    c.number = 77;
    m.cycle = &c;
    assert_int_equal(hvd_ctrl_brief_size(&m), 16 + 4 * 4);
    c.paused = 1;
    assert_int_equal(hvd_ctrl_brief_size(&m), 0);
    c.paused = 0;
    c.stop = 1;
    assert_int_equal(hvd_ctrl_brief_size(&m), 0);
    c.stop = 0;
    c.n_erase = 1;
    c.erase = ready;
    assert_int_equal(hvd_ctrl_brief_size(&m), 0);
    c.n_erase = 0;
    c.number = 78;
    assert_int_equal(hvd_ctrl_brief_size(&m), 0);
    c.number = 77;

    hvd_ctrl_brief_pack(&m, b);
    assert_int_equal(hvd_ctrl_brief_unpack(b, 32, &back, &back_cycle), HVD_OK);
    assert_int_equal(back.number, 77);
    assert_int_equal(back.n_ready, 3);
    assert_int_equal(back.n_carried, 1);
    assert_memory_equal(back.ready, ready, sizeof(ready));
    assert_int_equal(back.carried[0], 9);
    assert_ptr_equal(back.cycle, &back_cycle);
    assert_int_equal(back_cycle.number, 77);
    assert_int_equal(back_cycle.n_responses, 0);
    assert_int_equal(hvd_ctrl_brief_unpack(b, 32, &back, NULL), HVD_OK);
    assert_null(back.cycle);

    /* An empty step is 16 bytes. */
    m.n_ready = m.n_carried = 0;
    m.cycle = NULL;
    assert_int_equal(hvd_ctrl_brief_size(&m), 16);
    hvd_ctrl_brief_pack(&m, b);
    assert_int_equal(hvd_ctrl_brief_unpack(b, 16, &back, NULL), HVD_OK);
    assert_int_equal(back.n_ready + back.n_carried, 0);

    /* Lengths that do not add up, counts that would overflow. */
    assert_int_equal(hvd_ctrl_brief_unpack(b, 15, &back, NULL),
                     HVD_ERR_PROTOCOL);
    assert_int_equal(hvd_ctrl_brief_unpack(b, 20, &back, NULL),
                     HVD_ERR_PROTOCOL);
    assert_non_null(strstr(hvd_error_get(), "brief step 77 of 20 bytes"));
    hvd_ctrl_brief head = {5, 0xffffffffu, 0xffffffffu};
    memcpy(b, &head, sizeof(head));
    assert_int_equal(hvd_ctrl_brief_unpack(b, 16, &back, NULL),
                     HVD_ERR_PROTOCOL);
    head.n_ready = 0x40000000u; /* 4 * n wraps in 32 bits */
    head.n_carried = 0;
    memcpy(b, &head, sizeof(head));
    assert_int_equal(hvd_ctrl_brief_unpack(b, 16, &back, NULL),
                     HVD_ERR_PROTOCOL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_messages), cmocka_unit_test(bad_requests),
        cmocka_unit_test(bad_responses), cmocka_unit_test(protocol_status),
        cmocka_unit_test(shapes),        cmocka_unit_test(brief_steps),
        cmocka_unit_test(process_sets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
