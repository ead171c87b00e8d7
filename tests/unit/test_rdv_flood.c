/*
 * The rendezvous client against a server that drops it (a rendezvous
 * whose table strangers filled): a connection closed after the server's
 * CHALLENGE proved it holds the job secret is tried again, not taken for
 * a refusal; and when the start timeout passes after such drops, the
 * sentence says the rendezvous may be flooded, not "wrong job or
 * HVD_SECRET?". The server is a thread on 127.0.0.1 that runs the
 * handshake's server side (transport/bootstrap/handshake.h) by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/bootstrap/handshake.h"
#include "transport/bootstrap/net.h"
#include "transport/bootstrap/rendezvous.h"

static const uint8_t job_id[HVD_JOB_ID_LEN] = {1, 2,  3,  4,  5,  6,  7, 8,
                                               9, 10, 11, 12, 13, 14, 15};
static const char *secret = "0123456789abcdef0123456789abcdef";

typedef struct fake {
    int lfd;
    int drops;    /* connections to drop after their CHALLENGE (-1: all) */
    int accepted; /* connections it took */
    int stop;     /* set by the test: end (the thread polls) */
} fake;

/* Reads exactly len bytes (bounded: 5 s); 0 on success. */
static int read_exact(int fd, uint8_t *buf, size_t len) {
    size_t got = 0;

    while (got < len) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1)
            return -1;
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* Runs the server side: with drop, reads the HELLO, sends the CHALLENGE
 * and stops there (message by message, so that a quick client's RESPONSE
 * is never read); else the whole handshake. 0 when it got that far. */
static int serve_one(int fd, int drop) {
    hvd_hs hs;
    uint8_t hello[HVD_HS_HELLO_LEN];

    hvd_hs_server_init(&hs, job_id, secret, HVD_HS_KIND_RENDEZVOUS, -1, NULL,
                       NULL);
    if (!drop)
        return hvd_hs_run(&hs, fd, hvd_now_ns() + 5 * 1000000000LL) == HVD_OK
                   ? 0
                   : -1;
    if (read_exact(fd, hello, sizeof(hello)) != 0 ||
        hvd_hs_input(&hs, hello, sizeof(hello)) != HVD_OK ||
        hs.out_len != HVD_HS_CHALLENGE_LEN)
        return -1;
    return send(fd, hs.out, hs.out_len, MSG_NOSIGNAL) == (ssize_t)hs.out_len
               ? 0
               : -1;
}

static void *server(void *arg) {
    fake *f = arg;
    int kept = -1;

    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = f->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) != 1)
            continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int drop = f->drops < 0 || f->accepted < f->drops;
        __atomic_add_fetch(&f->accepted, 1, __ATOMIC_ACQ_REL);
        if (serve_one(fd, drop) != 0 || drop) {
            close(fd); /* dropped after its CHALLENGE */
            continue;
        }
        if (kept >= 0)
            close(kept);
        kept = fd; /* joined: held until the end */
    }
    if (kept >= 0)
        close(kept);
    return NULL;
}

static void run(fake *f, int64_t timeout_ns, hvd_status want) {
    pthread_t th;
    int port = 0;
    hvd_bootstrap *bs = NULL;
    char local[64];

    assert_int_equal(hvd_net_listen("127.0.0.1", 0, &f->lfd, &port), HVD_OK);
    assert_int_equal(pthread_create(&th, NULL, server, f), 0);
    hvd_status st = hvd_rdv_client_connect("127.0.0.1", port, 0, 1, job_id,
                                           secret, timeout_ns, &bs, local);
    assert_int_equal(st, want);
    if (bs != NULL)
        hvd_rdv_client_close(bs);
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    close(f->lfd);
}

static void retried_after_challenge(void **state) {
    fake f = {.drops = 3};

    (void)state;
    run(&f, 10 * 1000000000LL, HVD_OK);
    assert_int_equal(f.accepted, 4);
}

static void flooded_sentence(void **state) {
    fake f = {.drops = -1};

    (void)state;
    run(&f, 1000000000LL, HVD_ERR_TIMEOUT);
    assert_true(f.accepted >= 2);
    const char *e = hvd_error_get();
    assert_non_null(strstr(e, "rank 0: could not reach the rendezvous at "
                              "127.0.0.1:"));
    assert_non_null(strstr(e, "before the handshake finished -- the "
                              "rendezvous may be flooded by unauthenticated "
                              "connections"));
    assert_null(strstr(e, "HVD_SECRET?"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(retried_after_challenge),
        cmocka_unit_test(flooded_sentence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
