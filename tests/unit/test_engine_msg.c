/*
 * The engine's control messages as they arrive (api/runtime/engine_msg.c):
 * the first message's header and its checks, the bodies that follow it, and the
 * step messages' bookkeeping: two slots per peer by step number parity, a
 * peer at most one step ahead, the step number each message must carry,
 * malformed steps refused with a sentence naming the peer, STOP closing a
 * port.
 *
 * The engine is the smallest state the receive path reads: rank 1 of 2, a
 * control communicator over a fake transport that only records the
 * receives posted, its ports and step buffers. The test plays rank 0: it
 * completes the receive the engine posted with the bytes rank 0 would have
 * sent, then calls hvd_eng_pump.
 *
 * The internal functions called (api/runtime/engine_state.h):
 * hvd_eng_step_init, hvd_eng_step_free, hvd_eng_open_ports, hvd_eng_frame,
 * hvd_eng_pump, hvd_eng_port_ready, hvd_eng_peer_started; and
 * hvd_comm_create/destroy (collectives/comm.h), hvd_arena_reset.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/engine_state.h"

/* ---- a transport that records the receives posted ---- */

#define MAXPOSTED 4

typedef struct posted {
    void *buf;
    size_t len; /* upto: the most it takes */
    hvd_req *req;
    int upto; /* irecv_upto */
} posted;

typedef struct recorder {
    hvd_transport base;
    posted q[MAXPOSTED];
    int n;
} recorder;

static hvd_status rec_post(hvd_transport *t, int peer, int channel, void *buf,
                           size_t len, hvd_req *req, int upto) {
    recorder *rc = (recorder *)t;

    if (peer != 0 || channel != HVD_CHANNEL_CONTROL || rc->n == MAXPOSTED)
        return HVD_ERR_INTERNAL;
    req->done = 0;
    req->status = HVD_OK;
    rc->q[rc->n++] = (posted){buf, len, req, upto};
    return HVD_OK;
}

static hvd_status rec_irecv(hvd_transport *t, int peer, int channel, void *buf,
                            size_t len, hvd_req *req) {
    return rec_post(t, peer, channel, buf, len, req, 0);
}

static hvd_status rec_irecv_upto(hvd_transport *t, int peer, int channel,
                                 void *buf, size_t cap, hvd_req *req) {
    return rec_post(t, peer, channel, buf, cap, req, 1);
}

static const hvd_transport_ops rec_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "recorder",
    .irecv = rec_irecv,
    .irecv_upto = rec_irecv_upto,
};

typedef struct fixture {
    recorder rec;
    hvd_engine *eng;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof(*f));
    hvd_comm_config cfg;

    if (f == NULL || (f->eng = calloc(1, sizeof(*f->eng))) == NULL)
        return -1;
    f->rec.base.ops = &rec_ops;
    f->eng->rank = 1;
    f->eng->size = 2;
    f->eng->cfg.cache_capacity = 4;
    f->eng->ports = calloc(2, sizeof(*f->eng->ports));
    hvd_comm_config_default(&cfg);
    if (f->eng->ports == NULL || hvd_eng_step_init(f->eng) != 0 ||
        hvd_comm_create(1, 2, &f->rec.base, HVD_CHANNEL_CONTROL, &cfg,
                        &f->eng->ctrl) != HVD_OK ||
        hvd_eng_open_ports(f->eng) != HVD_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;

    hvd_eng_step_free(f->eng);
    hvd_comm_destroy(f->eng->ctrl);
    free(f->eng->ports);
    free(f->eng);
    free(f);
    return 0;
}

/* Completes the oldest receive the engine posted with bytes (one is
 * posted at a time: the next once hvd_eng_pump has taken this one). */
static void deliver(fixture *f, const void *bytes, size_t len) {
    assert_true(f->rec.n > 0);
    posted p = f->rec.q[0];
    memmove(f->rec.q, f->rec.q + 1, (size_t)(--f->rec.n) * sizeof(posted));
    if (p.upto)
        assert_true(len <= p.len);
    else
        assert_int_equal(p.len, len);
    memcpy(p.buf, bytes, len);
    p.req->got = len;
    p.req->status = HVD_OK;
    p.req->done = 1;
}

/* Sends a message of type with body (proto_len of it the protobuf) as
 * rank 0 would: a first message at its own length, and the rest of the
 * body if it is longer. */
static void send_msg(fixture *f, uint32_t type, uint32_t proto_len,
                     const uint8_t *body, size_t len) {
    uint8_t frame[CTRL_FIRST];
    size_t first = hvd_eng_frame(frame, type, proto_len, body, len);
    size_t rest = ctrl_rest(len);

    assert_int_equal(first, sizeof(msg_header) + len - rest);
    deliver(f, frame, first);
    if (rest > 0) {
        /* The engine has posted the rest's receive once it took the frame
         * in (hvd_eng_pump). */
        assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
        deliver(f, body + ctrl_head(len), rest);
    }
}

/* A Step numbered number offering ready, followed by data at the next
 * multiple of 8: its body, length and protobuf length. */
static size_t step_body(uint8_t *body, size_t cap, uint64_t number,
                        const uint32_t *ready, size_t nready,
                        const uint8_t *data, size_t dlen, uint32_t *proto_len) {
    Hvd__Engine__Step s = HVD__ENGINE__STEP__INIT;
    size_t plen, dstart;

    s.number = number;
    s.n_ready = nready;
    s.ready = (uint32_t *)(uintptr_t)ready;
    plen = hvd__engine__step__get_packed_size(&s);
    dstart = (plen + 7) & ~(size_t)7;
    assert_true(dstart + dlen <= cap);
    memset(body, 0, cap);
    hvd__engine__step__pack(&s, body);
    if (dlen > 0)
        memcpy(body + dstart, data, dlen);
    *proto_len = (uint32_t)plen;
    return dstart + dlen;
}

static void send_step(fixture *f, uint64_t number, const uint8_t *data,
                      size_t dlen) {
    uint8_t body[2048];
    uint32_t ready[] = {(uint32_t)number % 4, 3}, plen;
    size_t len =
        step_body(body, sizeof(body), number, ready, 2, data, dlen, &plen);

    send_msg(f, MSG_STEP, plen, body, len);
}

/* Pumps, expecting failure with a sentence containing text. */
static void pump_fails(fixture *f, const char *text) {
    hvd_status st = hvd_eng_pump(f->eng, 0);

    assert_int_equal(st, HVD_ERR_PROTOCOL);
    if (strstr(hvd_error_get(), text) == NULL)
        fail_msg("\"%s\" does not contain \"%s\"", hvd_error_get(), text);
}

/* ---- the cases ---- */

/* Steps land in the slot of their number's parity, with their data where
 * the body says; the port then expects the next number and a new frame. */
static void steps_by_parity(void **state) {
    fixture *f = *state;
    ctrl_port *p = &f->eng->ports[0];
    const uint8_t d1[] = {1, 2, 3, 4, 5}, d2[] = {9};

    assert_int_equal(p->next_step, 1);
    assert_int_equal(f->rec.n, 1); /* the first frame's receive */
    assert_int_equal(hvd_eng_peer_started(f->eng), 0);
    send_step(f, 1, d1, sizeof(d1));
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    assert_int_equal(p->next_step, 2);
    assert_non_null(p->step[1].msg);
    assert_null(p->step[0].msg);
    assert_int_equal(p->step[1].msg->number, 1);
    assert_int_equal(p->step[1].msg->n_ready, 2);
    assert_int_equal(p->step[1].msg->ready[0], 1);
    assert_int_equal(p->step[1].data_len, sizeof(d1));
    assert_memory_equal(p->step[1].data, d1, sizeof(d1));
    assert_int_equal(
        ((uintptr_t)p->step[1].data - (uintptr_t)p->step[1].buf) % 8, 0);
    /* Cycle 0 has run here: step 1 is the next, and rank 0 has started. */
    assert_int_equal(hvd_eng_peer_started(f->eng), 1);
    assert_int_equal(f->rec.n, 1); /* the next frame's receive */
    /* Rank 0 may be one step ahead: step 2 goes to the other slot. */
    send_step(f, 2, d2, sizeof(d2));
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    assert_int_equal(p->next_step, 3);
    assert_int_equal(p->step[0].msg->number, 2);
    assert_int_equal(p->step[1].msg->number, 1);
    assert_int_equal(p->step[0].data_len, 1);
    assert_int_equal(p->step[0].data[0], 9);
}

/* Two steps ahead is a protocol error: step 3 would land on step 1, which
 * has not run here. Once step 1 has run (its slot emptied), it may come. */
static void never_two_ahead(void **state) {
    fixture *f = *state;
    ctrl_port *p = &f->eng->ports[0];

    send_step(f, 1, NULL, 0);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    send_step(f, 2, NULL, 0);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    send_step(f, 3, NULL, 0);
    pump_fails(f, "rank 0 sent step 3 before step 1 had run here");
    assert_int_equal(p->step[1].msg->number, 1);
    assert_int_equal(p->next_step, 3);
}

static void step_after_its_slot_ran(void **state) {
    fixture *f = *state;
    ctrl_port *p = &f->eng->ports[0];

    send_step(f, 1, NULL, 0);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    send_step(f, 2, NULL, 0);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    /* Step 1 ran here: its slot is free (as hvd_eng_step_finish leaves
     * it). */
    hvd_arena_reset(&p->step[1].arena);
    p->step[1].msg = NULL;
    send_step(f, 3, NULL, 0);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    assert_int_equal(p->step[1].msg->number, 3);
    assert_int_equal(p->next_step, 4);
}

/* A step must carry the number the port expects. */
static void wrong_step_number(void **state) {
    fixture *f = *state;
    ctrl_port *p = &f->eng->ports[0];

    send_step(f, 5, NULL, 0);
    pump_fails(f, "step 5 from rank 0 where step 1 was expected");
    assert_null(p->step[1].msg);
    assert_int_equal(p->next_step, 1);
}

/* A body longer than the first message holds comes in a second message:
 * the step is not there until the rest is. */
static void long_step(void **state) {
    fixture *f = *state;
    ctrl_port *p = &f->eng->ports[0];
    uint8_t data[CTRL_FIRST + 700], body[CTRL_FIRST + 1024], frame[CTRL_FIRST];
    uint32_t ready[] = {1}, plen;

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7 + 3);
    size_t len =
        step_body(body, sizeof(body), 1, ready, 1, data, sizeof(data), &plen);
    size_t first = hvd_eng_frame(frame, MSG_STEP, plen, body, len);
    size_t rest = ctrl_rest(len);
    assert_int_equal(first, sizeof(msg_header) + CTRL_LONG_HEAD);
    assert_int_equal(rest, len - CTRL_LONG_HEAD);
    deliver(f, frame, first);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    assert_int_equal(p->in_body, 1);
    assert_null(p->step[1].msg);
    assert_int_equal(f->rec.n, 1);
    assert_int_equal(f->rec.q[0].len, rest);
    deliver(f, body + CTRL_LONG_HEAD, rest);
    assert_int_equal(hvd_eng_port_ready(f->eng), 1);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    assert_int_equal(p->in_body, 0);
    assert_int_equal(p->step[1].msg->number, 1);
    assert_int_equal(p->step[1].data_len, sizeof(data));
    assert_memory_equal(p->step[1].data, data, sizeof(data));
    assert_int_equal(hvd_eng_port_ready(f->eng), 0);
}

/* Bytes that are no Step are refused, naming the peer. */
static void malformed_step_body(void **state) {
    fixture *f = *state;
    uint8_t body[64];

    memset(body, 0xff, sizeof(body));
    send_msg(f, MSG_STEP, sizeof(body), body, sizeof(body));
    pump_fails(f, "malformed step message from rank 0");
    assert_null(f->eng->ports[0].step[1].msg);
}

/* Headers no rank sends, and first messages whose length is not the one
 * their header gives (got: the bytes that came; 0, the right length). */
static void malformed_headers(void **state) {
    static const struct {
        uint32_t type, proto_len;
        uint64_t len;
        size_t got;
    } bad[] = {
        {0, 0, 8, 0},                          /* no such type */
        {MSG_BRIEF + 1, 0, 8, 0},              /* no such type */
        {MSG_UPDATE, 0, 8, 0},                 /* an update to a rank but 0 */
        {MSG_STEP, 0, 0, 0},                   /* a step without a body */
        {MSG_STOP, 0, 4, 0},                   /* a STOP with one */
        {MSG_STEP, 9, 8, 0},                   /* more protobuf than body */
        {MSG_STEP, 0, (1ULL << 32) + 1, 0},    /* larger than any message */
        {MSG_STEP, 0, 8, 16},                  /* its body missing */
        {MSG_STEP, 0, 8, 40},                  /* more than its body */
        {MSG_STEP, 0, CTRL_INLINE, 100},       /* a whole one cut short */
        {MSG_STEP, 0, CTRL_FIRST, CTRL_FIRST}, /* a long one not cut */
        {MSG_STOP, 0, 0, 8},                   /* shorter than a header */
    };

    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        void *st = NULL;
        assert_int_equal(setup(&st), 0);
        fixture *f = st;
        uint8_t frame[CTRL_FIRST];
        msg_header h = {bad[k].type, bad[k].proto_len, bad[k].len};
        memset(frame, 0, sizeof(frame));
        memcpy(frame, &h, sizeof(h));
        deliver(f, frame,
                bad[k].got ? bad[k].got : sizeof(h) + ctrl_head(bad[k].len));
        pump_fails(f, "malformed control message");
        teardown(&st);
    }
    (void)state;
}

/* STOP closes the port: nothing more is taken or posted from that peer. */
static void stop_closes(void **state) {
    fixture *f = *state;
    ctrl_port *p = &f->eng->ports[0];

    send_step(f, 1, NULL, 0);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    send_msg(f, MSG_STOP, 0, NULL, 0);
    assert_int_equal(hvd_eng_port_ready(f->eng), 1);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
    assert_int_equal(p->closed, 1);
    assert_int_equal(f->rec.n, 0); /* no frame receive posted after it */
    assert_int_equal(hvd_eng_port_ready(f->eng), 0);
    assert_int_equal(p->step[1].msg->number, 1);
    assert_int_equal(hvd_eng_pump(f->eng, 0), HVD_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(steps_by_parity, setup, teardown),
        cmocka_unit_test_setup_teardown(never_two_ahead, setup, teardown),
        cmocka_unit_test_setup_teardown(step_after_its_slot_ran, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(wrong_step_number, setup, teardown),
        cmocka_unit_test_setup_teardown(long_step, setup, teardown),
        cmocka_unit_test_setup_teardown(malformed_step_body, setup, teardown),
        cmocka_unit_test(malformed_headers),
        cmocka_unit_test_setup_teardown(stop_closes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
