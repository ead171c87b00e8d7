/* Frame protection (HVD_TCP_PROTECT): the AEAD records of protect.c on
 * their own (round trips of every mode and size, whole and in pieces; a
 * flipped bit or a wrong record number fails), and two TCP transports of
 * one process joined through a relay that alters the bytes of one
 * direction: a flipped bit in a header, payload or tag, a replayed,
 * dropped, reordered or cut frame each fail the receive with
 * HVD_ERR_PROTOCOL and the sentence, and never complete it with data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/bootstrap/protect.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp.h"

static const uint8_t key_a[HVD_PROTECT_KEY] = {1, 2, 3};
static const uint8_t key_b[HVD_PROTECT_KEY] = {3, 2, 1};

/* ---------------------------------------------------------------- */
/* Records                                                           */

static void round_trip(int mode, size_t n, size_t piece) {
    hvd_aead seal, open;
    uint8_t *msg = malloc(n + 1), *buf = malloc(n + 1);
    uint8_t tag[HVD_PROTECT_TAG];

    assert_non_null(msg);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++)
        msg[i] = (uint8_t)(i * 7 + 1);
    memcpy(buf, msg, n);
    assert_int_equal(hvd_aead_init(&seal, mode, 1, key_a), HVD_OK);
    assert_int_equal(hvd_aead_init(&open, mode, 0, key_a), HVD_OK);
    /* Sealed in pieces, opened whole. */
    assert_int_equal(hvd_aead_begin(&seal, 5), 0);
    for (size_t off = 0; off < n; off += piece) {
        size_t k = n - off < piece ? n - off : piece;
        assert_int_equal(hvd_aead_update(&seal, buf + off, buf + off, k), 0);
    }
    assert_int_equal(hvd_aead_seal_end(&seal, tag), 0);
    if (mode == HVD_PROTECT_INTEGRITY || n == 0)
        assert_memory_equal(buf, msg, n);
    else if (n >= 16)
        assert_memory_not_equal(buf, msg, n);
    assert_int_equal(hvd_aead_open(&open, 5, buf, n, tag), 0);
    assert_memory_equal(buf, msg, n);

    /* Another record number, or any flipped bit, fails. */
    assert_int_equal(hvd_aead_seal(&seal, 6, buf, n, tag), 0);
    assert_int_not_equal(hvd_aead_open(&open, 7, buf, n, tag), 0);
    assert_int_equal(hvd_aead_seal(&seal, 8, msg, n, tag), 0);
    for (size_t bit = 0; bit < 8 * (n + HVD_PROTECT_TAG);
         bit += 1 + bit / 3 + n / 64) {
        uint8_t copy_tag[HVD_PROTECT_TAG];
        memcpy(buf, msg, n);
        memcpy(copy_tag, tag, sizeof(tag));
        if (bit < 8 * n)
            buf[bit / 8] ^= (uint8_t)(1u << bit % 8);
        else
            copy_tag[bit / 8 - n] ^= (uint8_t)(1u << bit % 8);
        assert_int_not_equal(hvd_aead_open(&open, 8, buf, n, copy_tag), 0);
    }
    hvd_aead_free(&seal);
    hvd_aead_free(&open);
    free(msg);
    free(buf);
}

static void test_records(void **state) {
    (void)state;
    size_t sizes[] = {0, 1, 17, 4096, 1 << 20};
    for (int mode = HVD_PROTECT_INTEGRITY; mode <= HVD_PROTECT_ENCRYPT;
         mode++) {
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            round_trip(mode, sizes[i], sizes[i] > 0 ? sizes[i] : 1);
            round_trip(mode, sizes[i], 13);
        }
    }
}

static void test_keys_differ(void **state) {
    (void)state;
    hvd_aead seal, open;
    uint8_t buf[32] = {0}, tag[HVD_PROTECT_TAG];

    assert_int_equal(hvd_aead_init(&seal, HVD_PROTECT_INTEGRITY, 1, key_a),
                     HVD_OK);
    assert_int_equal(hvd_aead_init(&open, HVD_PROTECT_INTEGRITY, 0, key_b),
                     HVD_OK);
    assert_int_equal(hvd_aead_seal(&seal, 0, buf, sizeof(buf), tag), 0);
    assert_int_not_equal(hvd_aead_open(&open, 0, buf, sizeof(buf), tag), 0);
    hvd_aead_free(&seal);
    hvd_aead_free(&open);
}

static void test_parse(void **state) {
    (void)state;
    int mode = -1;

    assert_int_equal(hvd_protect_parse("HVD_TCP_PROTECT", "", 1, &mode),
                     HVD_OK);
    assert_int_equal(mode, 1);
    assert_int_equal(hvd_protect_parse("HVD_TCP_PROTECT", "Encrypt", 1, &mode),
                     HVD_OK);
    assert_int_equal(mode, HVD_PROTECT_ENCRYPT);
    assert_int_equal(hvd_protect_parse("HVD_TCP_PROTECT", "none", 1, &mode),
                     HVD_OK);
    assert_int_equal(mode, HVD_PROTECT_NONE);
    assert_int_equal(hvd_protect_parse("HVD_TCP_PROTECT", "tls", 1, &mode),
                     HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_TCP_PROTECT=tls is not one "
                                            "of none, integrity, encrypt"));
}

static void test_hkdf(void **state) {
    (void)state;
    uint8_t a[64], b[64], c[64];
    const uint8_t salt[4] = {1, 2, 3, 4}, salt2[4] = {1, 2, 3, 5};

    assert_int_equal(hvd_protect_hkdf("s", salt, 4, salt, 4, a, 64), HVD_OK);
    assert_int_equal(hvd_protect_hkdf("s", salt, 4, salt, 4, b, 64), HVD_OK);
    assert_int_equal(hvd_protect_hkdf("s", salt2, 4, salt, 4, c, 64), HVD_OK);
    assert_memory_equal(a, b, 64);
    assert_memory_not_equal(a, c, 64);
    assert_int_equal(hvd_protect_hkdf("t", salt, 4, salt, 4, c, 64), HVD_OK);
    assert_memory_not_equal(a, c, 64);
}

/* ---------------------------------------------------------------- */
/* Two transports and a relay                                        */

#define NCONN 2 /* one data socket, one control */

typedef enum {
    T_NONE,
    T_FLIP,     /* flips bit `at` of the A-to-B data stream */
    T_REPLAY,   /* sends frame 0 again in place of frame 1 */
    T_DROP,     /* drops frame 0 */
    T_REORDER,  /* sends frame 1 before frame 0 */
    T_TRUNCATE, /* cuts the last `at` bytes of frame 0 */
} tamper_kind;

/* Bytes the relay holds for one direction of one socket: it never blocks
 * (both ranks progress in this thread), so it queues what the receiving
 * socket cannot take yet. */
typedef struct outq {
    uint8_t *p;
    size_t len;
    size_t cap;
} outq;

typedef struct world {
    hvd_transport *t[2];
    int a[NCONN][2]; /* rank 0's socket, the relay's end */
    int b[NCONN][2]; /* rank 1's socket, the relay's end */
    tamper_kind kind;
    size_t at;
    size_t frame; /* bytes of one frame on the wire */
    uint8_t *held;
    size_t nheld;
    size_t seen; /* bytes of the data stream relayed so far */
    outq to_b[NCONN];
    outq to_a[NCONN];
} world;

static hvd_status open_rank(world *w, int rank, const char *mode) {
    hvd_transport_params params;
    int fds[2 * NCONN];
    hvd_env_var settings[] = {
        {"HVD_TCP_NSOCKS", "1"}, {"HVD_TCP_PROTECT", mode}, {NULL, NULL}};

    memset(&params, 0, sizeof(params));
    params.rank = rank;
    params.size = 2;
    params.secret = "test secret";
    params.env = hvd_env_vars_get;
    params.env_ctx = settings;
    params.timeout_ns = 60 * 1000000000LL;
    params.connect_timeout_ns = 1000000000LL;
    for (int k = 0; k < NCONN; k++) {
        fds[rank * NCONN + k] = -1;
        fds[(1 - rank) * NCONN + k] = rank == 0 ? w->a[k][0] : w->b[k][0];
    }
    return hvd_tcp_open_connected(&params, fds, &w->t[rank]);
}

static void world_open(world *w, const char *mode, tamper_kind kind, size_t at,
                       size_t frame) {
    memset(w, 0, sizeof(*w));
    w->kind = kind;
    w->at = at;
    w->frame = frame;
    w->held = malloc(2 * frame + 64);
    assert_non_null(w->held);
    for (int k = 0; k < NCONN; k++) {
        assert_int_equal(
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, w->a[k]), 0);
        assert_int_equal(
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, w->b[k]), 0);
    }
    assert_int_equal(open_rank(w, 0, mode), HVD_OK);
    assert_int_equal(open_rank(w, 1, mode), HVD_OK);
}

static void world_close(world *w) {
    for (int r = 0; r < 2; r++)
        w->t[r]->ops->close(w->t[r]);
    for (int k = 0; k < NCONN; k++) {
        close(w->a[k][1]);
        close(w->b[k][1]);
        free(w->to_a[k].p);
        free(w->to_b[k].p);
    }
    free(w->held);
}

static void put_all(outq *q, const uint8_t *p, size_t n) {
    if (q->len + n > q->cap) {
        size_t cap = 2 * (q->len + n);
        q->p = realloc(q->p, cap);
        assert_non_null(q->p);
        q->cap = cap;
    }
    memcpy(q->p + q->len, p, n);
    q->len += n;
}

static void flush(outq *q, int fd) {
    while (q->len > 0) {
        ssize_t k = write(fd, q->p, q->len);
        if (k <= 0)
            return;
        memmove(q->p, q->p + k, q->len - (size_t)k);
        q->len -= (size_t)k;
    }
}

/* The A-to-B data stream: tampers with the first two frames as asked. */
static void relay_data(world *w, const uint8_t *p, size_t n) {
    outq *out = &w->to_b[0];

    if (w->kind == T_FLIP) {
        uint8_t buf[65536];
        memcpy(buf, p, n);
        if (w->at >= w->seen && w->at < w->seen + n)
            buf[w->at - w->seen] ^= 0x10;
        w->seen += n;
        put_all(out, buf, n);
        return;
    }
    if (w->kind == T_NONE || w->seen >= 2 * w->frame) {
        w->seen += n;
        put_all(out, p, n);
        return;
    }
    /* Hold the first two frames, then send them altered. */
    size_t k = 2 * w->frame - w->seen < n ? 2 * w->frame - w->seen : n;
    memcpy(w->held + w->seen, p, k);
    w->seen += k;
    if (w->seen == 2 * w->frame) {
        const uint8_t *f0 = w->held, *f1 = w->held + w->frame;
        switch (w->kind) {
        case T_REPLAY:
            put_all(out, f0, w->frame);
            put_all(out, f0, w->frame);
            break;
        case T_DROP:
            put_all(out, f1, w->frame);
            break;
        case T_REORDER:
            put_all(out, f1, w->frame);
            put_all(out, f0, w->frame);
            break;
        default: /* T_TRUNCATE */
            put_all(out, f0, w->frame - w->at);
            put_all(out, f1, w->frame);
            break;
        }
    }
    if (k < n)
        put_all(out, p + k, n - k);
}

/* Moves what waits in the relay: every socket as it is, but A-to-B on
 * the data socket through relay_data. */
static void relay(world *w) {
    uint8_t buf[65536];

    for (int k = 0; k < NCONN; k++) {
        ssize_t n;
        while ((n = read(w->a[k][1], buf, sizeof(buf))) > 0) {
            if (k == 0)
                relay_data(w, buf, (size_t)n);
            else
                put_all(&w->to_b[k], buf, (size_t)n);
        }
        while ((n = read(w->b[k][1], buf, sizeof(buf))) > 0)
            put_all(&w->to_a[k], buf, (size_t)n);
        flush(&w->to_b[k], w->b[k][1]);
        flush(&w->to_a[k], w->a[k][1]);
    }
}

/* Rank 0 sends two messages of len bytes, rank 1 receives them; returns
 * rank 1's status (its error sentence in why). */
static hvd_status exchange(world *w, size_t len, uint8_t *got, char *why,
                           size_t whylen) {
    uint8_t *msg = malloc(2 * len + 1);
    hvd_req s[2], r[2];
    hvd_status st1 = HVD_OK;

    assert_non_null(msg);
    for (size_t i = 0; i < 2 * len; i++)
        msg[i] = (uint8_t)(i * 13 + 5);
    why[0] = '\0';
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w->t[1]->ops->irecv(w->t[1], 0, HVD_CHANNEL_DATA,
                                             got + i * len, len, &r[i]),
                         HVD_OK);
        assert_int_equal(w->t[0]->ops->isend(w->t[0], 1, HVD_CHANNEL_DATA,
                                             msg + i * len, len, &s[i]),
                         HVD_OK);
    }
    /* Bounded: a few seconds of rounds at most. */
    for (int round = 0; round < 20000 && !(r[0].done && r[1].done); round++) {
        w->t[0]->ops->progress(w->t[0], 0);
        relay(w);
        hvd_status st = w->t[1]->ops->progress(w->t[1], 0);
        if (st != HVD_OK && st1 == HVD_OK) {
            st1 = st;
            snprintf(why, whylen, "%s", hvd_error_get());
        }
        if (st1 != HVD_OK)
            break;
        if (!(r[0].done && r[1].done))
            usleep(100);
    }
    if (st1 == HVD_OK) {
        assert_true(r[0].done && r[1].done);
        assert_int_equal(r[0].status, HVD_OK);
        assert_int_equal(r[1].status, HVD_OK);
    } else {
        /* Nothing altered is handed over as a success. */
        for (int i = 0; i < 2; i++)
            assert_true(!r[i].done || r[i].status != HVD_OK ||
                        memcmp(got + i * len, msg + i * len, len) == 0);
    }
    for (int round = 0; round < 1000 && st1 == HVD_OK; round++) {
        w->t[0]->ops->progress(w->t[0], 0);
        relay(w);
        if (s[0].done && s[1].done)
            break;
    }
    if (st1 == HVD_OK)
        assert_memory_equal(got, msg, 2 * len);
    free(msg);
    return st1;
}

/* The bytes one frame of len payload bytes takes on the wire. */
static size_t frame_bytes(const char *mode, size_t len) {
    if (strcmp(mode, "none") == 0)
        return HVD_FRAME_HDR_LEN + len;
    if (len <= 4096)
        return HVD_FRAME_HDR_LEN + len + HVD_PROTECT_TAG;
    return HVD_FRAME_HDR_LEN + 2 * HVD_PROTECT_TAG + len;
}

static void expect_auth_failure(const char *mode, tamper_kind kind, size_t at,
                                size_t len) {
    world w;
    uint8_t *got = malloc(2 * len);
    char why[HVD_ERROR_MAX];
    char want[128];

    assert_non_null(got);
    world_open(&w, mode, kind, at, frame_bytes(mode, len));
    hvd_status st = exchange(&w, len, got, why, sizeof(why));
    if (st != HVD_ERR_PROTOCOL)
        fail_msg("%s, tamper %d at %zu, %zu bytes: status %d (%s)", mode,
                 (int)kind, at, len, (int)st, why);
    snprintf(want, sizeof(want),
             "frame from rank 0 failed authentication (HVD_TCP_PROTECT=%s): "
             "it was altered, replayed, reordered or cut on the way",
             mode);
    if (strstr(why, want) == NULL)
        fail_msg("sentence: %s", why);
    world_close(&w);
    free(got);
}

static void test_clean_exchange(void **state) {
    (void)state;
    const char *modes[] = {"none", "integrity", "encrypt"};
    size_t sizes[] = {0, 1, 4095, 4097, 300001, 3 << 20};

    for (int m = 0; m < 3; m++) {
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            world w;
            uint8_t *got = malloc(2 * sizes[i] + 1);
            char why[HVD_ERROR_MAX];
            world_open(&w, modes[m], T_NONE, 0, 1);
            assert_int_equal(exchange(&w, sizes[i], got, why, sizeof(why)),
                             HVD_OK);
            world_close(&w);
            free(got);
        }
    }
}

static void test_flipped_bits(void **state) {
    (void)state;
    const char *modes[] = {"integrity", "encrypt"};
    size_t sizes[] = {100, 70000};

    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < 2; i++) {
            size_t f = frame_bytes(modes[m], sizes[i]);
            /* Header, its tag (large), payload, last tag byte; and the
             * second frame. */
            size_t at[] = {0, 2, 17, 30, 50, f / 2, f - 1, f + 3, 2 * f - 1};
            for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++)
                expect_auth_failure(modes[m], T_FLIP, at[k], sizes[i]);
        }
    }
}

static void test_replay_drop_reorder_cut(void **state) {
    (void)state;
    const char *modes[] = {"integrity", "encrypt"};
    size_t sizes[] = {8, 5000};

    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < 2; i++) {
            expect_auth_failure(modes[m], T_REPLAY, 0, sizes[i]);
            expect_auth_failure(modes[m], T_DROP, 0, sizes[i]);
            expect_auth_failure(modes[m], T_REORDER, 0, sizes[i]);
            expect_auth_failure(modes[m], T_TRUNCATE, 4, sizes[i]);
        }
    }
}

/* What none does not see: a flipped payload bit arrives as data. */
static void test_none_sees_nothing(void **state) {
    (void)state;
    world w;
    uint8_t got[200];
    char why[HVD_ERROR_MAX];
    hvd_req s, r;
    uint8_t msg[100] = {0};

    world_open(&w, "none", T_FLIP, HVD_FRAME_HDR_LEN + 10, 1);
    assert_int_equal(
        w.t[1]->ops->irecv(w.t[1], 0, HVD_CHANNEL_DATA, got, 100, &r), HVD_OK);
    assert_int_equal(
        w.t[0]->ops->isend(w.t[0], 1, HVD_CHANNEL_DATA, msg, 100, &s), HVD_OK);
    for (int round = 0; round < 20000 && !r.done; round++) {
        w.t[0]->ops->progress(w.t[0], 0);
        relay(&w);
        assert_int_equal(w.t[1]->ops->progress(w.t[1], 0), HVD_OK);
    }
    assert_true(r.done);
    assert_int_equal(r.status, HVD_OK);
    assert_int_equal(got[10], 0x10);
    (void)why;
    world_close(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records),
        cmocka_unit_test(test_keys_differ),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_hkdf),
        cmocka_unit_test(test_clean_exchange),
        cmocka_unit_test(test_flipped_bits),
        cmocka_unit_test(test_replay_drop_reorder_cut),
        cmocka_unit_test(test_none_sees_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
