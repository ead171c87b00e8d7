/* A small engine over a fake transport, for the engine's unit tests
 * (engine_fake.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/engine_fake.h"

static hvd_status post_recv(hvd_transport *t, int peer, int channel, void *buf,
                            size_t len, hvd_req *req, int upto) {
    ef_transport *ft = (ef_transport *)t;

    if (peer < 0 || peer >= EF_MAXRANKS || channel != HVD_CHANNEL_CONTROL ||
        ft->nposted[peer] == EF_MAXPOSTED)
        return HVD_ERR_INTERNAL;
    req->done = 0;
    req->status = HVD_OK;
    ft->posted[peer][ft->nposted[peer]++] = (ef_posted){buf, len, req, upto};
    return HVD_OK;
}

static hvd_status ef_irecv(hvd_transport *t, int peer, int channel, void *buf,
                           size_t len, hvd_req *req) {
    return post_recv(t, peer, channel, buf, len, req, 0);
}

static hvd_status ef_irecv_upto(hvd_transport *t, int peer, int channel,
                                void *buf, size_t cap, hvd_req *req) {
    return post_recv(t, peer, channel, buf, cap, req, 1);
}

/* Every send is out at once: the peer's receive is the test's business. */
static hvd_status ef_isendv(hvd_transport *t, int peer, int channel,
                            const hvd_sendv *msgs, int n, hvd_req *reqs) {
    ef_transport *ft = (ef_transport *)t;
    ef_sent *s;

    if (peer < 0 || peer >= EF_MAXRANKS || channel != HVD_CHANNEL_CONTROL)
        return HVD_ERR_INTERNAL;
    s = &ft->sent[peer];
    s->nsends++;
    s->len = 0;
    for (int i = 0; i < n; i++) {
        if (s->len + msgs[i].len > sizeof(s->bytes))
            return HVD_ERR_INTERNAL;
        memcpy(s->bytes + s->len, msgs[i].buf, msgs[i].len);
        s->len += msgs[i].len;
        reqs[i].done = 1;
        reqs[i].status = HVD_OK;
    }
    return HVD_OK;
}

static hvd_status ef_isend(hvd_transport *t, int peer, int channel,
                           const void *buf, size_t len, hvd_req *req) {
    hvd_sendv one = {buf, len};

    return ef_isendv(t, peer, channel, &one, 1, req);
}

/* Nothing arrives by itself: a wait only looks. */
static hvd_status ef_progress(hvd_transport *t, int timeout_ms) {
    (void)t;
    (void)timeout_ms;
    return HVD_OK;
}

static void ef_wake(hvd_transport *t) { (void)t; }

static const hvd_transport_ops ef_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "engine_fake",
    .isend = ef_isend,
    .isendv = ef_isendv,
    .irecv = ef_irecv,
    .irecv_upto = ef_irecv_upto,
    .progress = ef_progress,
    .wake = ef_wake,
};

int ef_setup(ef_engine *ef, int rank, int size, int capacity) {
    hvd_engine *eng = calloc(1, sizeof(*eng));
    hvd_comm_config cc;

    memset(ef, 0, sizeof(*ef));
    if (eng == NULL || size > EF_MAXRANKS)
        return -1;
    ef->eng = eng;
    ef->tp.base.ops = &ef_ops;
    eng->rank = rank;
    eng->size = size;
    eng->tp = &ef->tp.base;
    eng->cfg.cache_capacity = capacity;
    eng->cfg.fusion_tensor_max = 1 << 20;
    eng->cfg.fusion_threshold = 1 << 20;
    eng->cfg.step_carry_bytes = 64;
    eng->cfg.carry_part_max = 8;
    hvd_namemap_init_borrowed(&eng->inflight);
    hvd_namemap_init_borrowed(&eng->by_name);
    hvd_comm_config_default(&cc);
    eng->ports = calloc((size_t)size, sizeof(*eng->ports));
    eng->inval = calloc((size_t)capacity, sizeof(*eng->inval));
    if (eng->ports == NULL || eng->inval == NULL ||
        hvd_eng_step_init(eng) != 0 || hvd_eng_pset_init(eng) != 0 ||
        hvd_cache_init(&eng->cache, capacity) != 0 ||
        hvd_comm_create(rank, size, eng->tp, HVD_CHANNEL_CONTROL, &cc,
                        &eng->ctrl) != HVD_OK ||
        hvd_comm_create(rank, size, eng->tp, HVD_CHANNEL_DATA, &cc,
                        &eng->data) != HVD_OK)
        return -1;
    if (rank == 0 && (hvd_eng_vote_init(&eng->vt, size, capacity) != 0 ||
                      hvd_coord_create(size, 0, 0, &eng->coord) != HVD_OK))
        return -1;
    return hvd_eng_open_ports(eng) == HVD_OK ? 0 : -1;
}

void ef_teardown(ef_engine *ef) {
    hvd_engine *eng = ef->eng;

    for (int i = 0; i < ef->nreqs; i++)
        hvd_request_free(ef->reqs[i]);
    if (eng == NULL)
        return;
    hvd_eng_step_free(eng);
    hvd_eng_pset_free(eng);
    hvd_eng_vote_free(&eng->vt);
    hvd_coord_destroy(eng->coord);
    hvd_cache_destroy(&eng->cache);
    hvd_comm_destroy(eng->ctrl);
    hvd_comm_destroy(eng->data);
    hvd_namemap_destroy(&eng->inflight);
    hvd_namemap_destroy(&eng->by_name);
    free(eng->pending);
    free(eng->resps);
    free(eng->inval);
    free(eng->body);
    free(eng->ports);
    free(eng);
}

int ef_cache(ef_engine *ef, const char *name, uint64_t n) {
    hvd_opdesc d;

    memset(&d, 0, sizeof(d));
    d.kind = HVD_KIND_ALLREDUCE;
    d.dtype = HVD_FLOAT32;
    d.op = HVD_SUM;
    d.mem = HVD_MEM_HOST;
    d.ncounts = 1;
    d.counts = &n;
    return hvd_cache_put(&ef->eng->cache, name, &d, 1);
}

hvd_request *ef_request(ef_engine *ef, const char *name, uint64_t n,
                        const float *send, float *recv) {
    hvd_request *req = hvd_request_new(1);

    assert_non_null(req);
    assert_true(ef->nreqs < EF_MAXREQS);
    ef->reqs[ef->nreqs++] = req;
    assert_int_equal(hvd_request_name(req, name, 0), 0);
    req->desc.kind = HVD_KIND_ALLREDUCE;
    req->desc.dtype = HVD_FLOAT32;
    req->desc.op = HVD_SUM;
    req->desc.mem = HVD_MEM_HOST;
    req->counts[0] = n;
    req->send[0] = send;
    req->recv[0] = recv;
    req->state = REQ_NEW;
    req->eng = ef->eng;
    hvd_eng_take(ef->eng, req);
    return req;
}

/* Completes the oldest receive the engine posted from peer with bytes. */
static void deliver(ef_engine *ef, int peer, const void *bytes, size_t len) {
    ef_transport *ft = &ef->tp;

    assert_true(ft->nposted[peer] > 0);
    ef_posted p = ft->posted[peer][0];
    ft->nposted[peer]--;
    memmove(ft->posted[peer], ft->posted[peer] + 1,
            (size_t)ft->nposted[peer] * sizeof(ef_posted));
    if (p.upto)
        assert_true(len <= p.len);
    else
        assert_int_equal(p.len, len);
    memcpy(p.buf, bytes, len);
    p.req->got = len;
    p.req->status = HVD_OK;
    p.req->done = 1;
}

void ef_peer_step(ef_engine *ef, int peer, uint64_t number,
                  const uint32_t *ready, size_t nready, const uint32_t *carried,
                  size_t ncarried, const void *data, size_t dlen,
                  Hvd__Engine__Cycle *dec) {
    Hvd__Engine__Step s = HVD__ENGINE__STEP__INIT;
    uint8_t body[EF_SENT_MAX], frame[CTRL_FIRST];
    size_t plen, dstart, first;

    s.number = number;
    s.n_ready = nready;
    s.ready = (uint32_t *)(uintptr_t)ready;
    s.n_carried = ncarried;
    s.carried = (uint32_t *)(uintptr_t)carried;
    s.cycle = dec;
    plen = hvd__engine__step__get_packed_size(&s);
    dstart = dlen > 0 ? (plen + 7) & ~(size_t)7 : plen;
    assert_true(dstart + dlen <= sizeof(body));
    memset(body, 0, sizeof(body));
    hvd__engine__step__pack(&s, body);
    if (dlen > 0)
        memcpy(body + dstart, data, dlen);
    /* One first message holds it (EF_SENT_MAX < CTRL_INLINE). */
    first = hvd_eng_frame(frame, MSG_STEP, (uint32_t)plen, body, dstart + dlen);
    assert_int_equal(first, sizeof(msg_header) + dstart + dlen);
    deliver(ef, peer, frame, first);
    assert_int_equal(hvd_eng_pump(ef->eng, 0), HVD_OK);
    assert_non_null(ef->eng->ports[peer].step[number & 1].msg);
}

msg_header ef_sent_header(const ef_engine *ef, int peer) {
    msg_header h;

    assert_true(ef->tp.sent[peer].len >= sizeof(h));
    memcpy(&h, ef->tp.sent[peer].bytes, sizeof(h));
    return h;
}
