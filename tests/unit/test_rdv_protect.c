/*
 * The rendezvous messages after the handshake are authenticated: a relay
 * between one client and the server passes the handshake through and then
 * flips a byte of, replays, drops or reorders one message of one
 * direction. A message the client gets that fails its tag fails the
 * client's round with HVD_ERR_PROTOCOL and the sentence "a message from the
 * rendezvous at H:P failed authentication"; one the server gets makes it drop
 * that connection, count it in its rate-limited log and tell the client
 * why (HVD_ERR_PROTOCOL). Through a clean relay
 * the rounds pass, and a round's answer (one buffer the server shares
 * between connections) reaches a direct and a relayed client, each under
 * its own key. The fixed rendezvous and the elastic one (whose waiting
 * worker gets keepalives) are both covered. Everything runs on 127.0.0.1:
 * the server is driven by the test's thread, the relay is a thread and
 * each client a child process, every wait bounded.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/wire.h"
#include "transport/bootstrap/net.h"
#include "transport/bootstrap/rdv_internal.h"

#define SECRET "rendezvous-protect-secret"
#define SEC (1000000000LL)
#define BUF (256 * 1024)

static const uint8_t job[HVD_JOB_ID_LEN] = {9, 8, 7, 6, 5, 4, 3, 2,
                                            1, 2, 3, 4, 5, 6, 7, 8};

/* ---- The relay ---- */

/* FLIP a byte of message at, REPLAY it (sent twice), DROP it, or REORDER
 * it with the next (held back until that one is sent). */
enum { A_NONE = 0, A_FLIP, A_REPLAY, A_DROP, A_REORDER };

/* One direction: the handshake's bytes pass as they are, then each whole
 * message (length, body, tag) is passed, or changed at index at. */
typedef struct dir {
    size_t hs_left;
    int action;
    int at;
    int seen; /* messages after the handshake */
    uint8_t buf[BUF];
    size_t len;
    uint8_t held[BUF]; /* REORDER: message at, sent after the next */
    size_t held_len;
} dir;

typedef struct relay {
    int lfd;
    int port;
    int server_port;
    dir c2s, s2c;
    atomic_int stop;
    atomic_int acted; /* the action was applied */
    pthread_t th;
} relay;

static int send_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Forwards what d holds that is whole; -1 when the peer is gone. */
static int forward(relay *r, dir *d, int to) {
    size_t off = 0;

    if (d->hs_left > 0) {
        size_t k = d->len < d->hs_left ? d->len : d->hs_left;
        if (send_all(to, d->buf, k) != 0)
            return -1;
        d->hs_left -= k;
        off = k;
    }
    while (d->hs_left == 0 && d->len - off >= LEN_PREFIX) {
        size_t unit = LEN_PREFIX + hvd_get32(d->buf + off) + RDV_TAG;
        uint8_t *m = d->buf + off;
        int rc = 0;
        if (d->len - off < unit)
            break;
        if (d->seen == d->at && d->action != A_NONE) {
            atomic_store(&r->acted, 1);
            if (d->action == A_FLIP) {
                m[unit > LEN_PREFIX + RDV_TAG ? LEN_PREFIX : unit - 1] ^= 0x20;
                rc = send_all(to, m, unit);
            } else if (d->action == A_REPLAY) {
                rc = send_all(to, m, unit);
                if (rc == 0)
                    rc = send_all(to, m, unit);
            } else if (d->action == A_REORDER) {
                memcpy(d->held, m, unit);
                d->held_len = unit;
            }
        } else if (d->held_len > 0) {
            rc = send_all(to, m, unit);
            if (rc == 0)
                rc = send_all(to, d->held, d->held_len);
            d->held_len = 0;
        } else {
            rc = send_all(to, m, unit);
        }
        if (rc != 0)
            return -1;
        d->seen++;
        off += unit;
    }
    memmove(d->buf, d->buf + off, d->len - off);
    d->len -= off;
    return 0;
}

/* Moves what came from from on to to: 0, 1 at from's end (passed on as
 * the end of to's writing, as the server's close is), -1 on an error. */
static int pump_dir(relay *r, dir *d, int from, int to) {
    ssize_t n = recv(from, d->buf + d->len, sizeof(d->buf) - d->len, 0);

    if (n == 0) {
        shutdown(to, SHUT_WR);
        return 1;
    }
    if (n < 0)
        return -1;
    d->len += (size_t)n;
    return forward(r, d, to);
}

static int connect_to(int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *relay_main(void *arg) {
    relay *r = arg;
    int cfd = -1, sfd = -1;

    while (!atomic_load(&r->stop) && cfd < 0) {
        struct pollfd p = {.fd = r->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) == 1)
            cfd = accept(r->lfd, NULL, NULL);
    }
    if (cfd >= 0)
        sfd = connect_to(r->server_port);
    /* An end of one direction is passed on as such (a closing server
     * shuts its writing and still reads), so that closing a socket with
     * unread bytes never resets the other side's. */
    int c_end = 0, s_end = 0;
    while (cfd >= 0 && sfd >= 0 && !atomic_load(&r->stop) &&
           !(c_end && s_end)) {
        struct pollfd p[2] = {{.fd = c_end ? -1 : cfd, .events = POLLIN},
                              {.fd = s_end ? -1 : sfd, .events = POLLIN}};
        if (poll(p, 2, 50) <= 0)
            continue;
        int rc = 0;
        if (p[0].revents && (rc = pump_dir(r, &r->c2s, cfd, sfd)) == 1)
            c_end = 1;
        if (rc >= 0 && p[1].revents &&
            (rc = pump_dir(r, &r->s2c, sfd, cfd)) == 1)
            s_end = 1;
        if (rc < 0)
            break;
    }
    if (cfd >= 0)
        close(cfd);
    if (sfd >= 0)
        close(sfd);
    return NULL;
}

/* The relay's listening socket; its thread starts with relay_go, once
 * the clients are forked: a fork while another thread runs may copy a
 * lock that thread holds (the sanitizers' allocator's, libc's) into a
 * child that then waits for it forever (once, under ASan: a client that
 * had written its outcome never exited). */
static relay *relay_open(int server_port, int c2s_action, int s2c_action,
                         int at) {
    relay *r = calloc(1, sizeof(*r));

    assert_non_null(r);
    r->server_port = server_port;
    r->c2s.hs_left = HVD_HS_HELLO_LEN + HVD_HS_RESPONSE_LEN;
    r->s2c.hs_left = HVD_HS_CHALLENGE_LEN + HVD_HS_RESULT_LEN;
    r->c2s.action = c2s_action;
    r->s2c.action = s2c_action;
    r->c2s.at = r->s2c.at = at;
    assert_int_equal(hvd_net_listen("127.0.0.1", 0, &r->lfd, &r->port), HVD_OK);
    return r;
}

static void relay_go(relay *r) {
    assert_int_equal(pthread_create(&r->th, NULL, relay_main, r), 0);
}

static void relay_stop(relay *r) {
    atomic_store(&r->stop, 1);
    pthread_join(r->th, NULL);
    close(r->lfd);
    free(r);
}

/* ---- Clients ---- */

/* Each client is a child process: a fixed client numbers its rendezvous
 * per process (hvd_init after hvd_shutdown starts the next), so two of
 * one process would not be one rendezvous. It sends what it got back
 * through a pipe. */
typedef struct outcome {
    hvd_status st;
    char err[HVD_ERROR_MAX];
    int32_t got[4][2];
} outcome;

typedef struct client {
    int port;
    int rank;   /* fixed */
    int size;   /* fixed */
    int worker; /* elastic: join as this worker (-1: fixed) */
    int rounds;
    pid_t pid;
    int rfd; /* the pipe's read end, -1 once read */
    hvd_status st;
    char err[HVD_ERROR_MAX];
    int32_t got[4][2];
} client;

static void client_main(const client *c, outcome *o) {
    hvd_bootstrap *bs = NULL;
    hvd_rdv_assignment asg;
    char local[64];

    memset(o, 0, sizeof(*o));
    if (c->worker >= 0)
        o->st = hvd_rdv_client_join("127.0.0.1", c->port, c->worker, job,
                                    SECRET, 10 * SEC, &bs, local, &asg);
    else
        o->st = hvd_rdv_client_connect("127.0.0.1", c->port, c->rank, c->size,
                                       job, SECRET, 10 * SEC, &bs, local);
    for (int r = 0; r < c->rounds && o->st == HVD_OK; r++) {
        int32_t mine = c->rank * 100 + r;
        o->st = bs->allgather(bs, &mine, sizeof(mine), o->got[r]);
    }
    if (o->st != HVD_OK)
        snprintf(o->err, sizeof(o->err), "%s", hvd_error_get());
    hvd_rdv_client_close(bs);
}

static void client_start(client *c, int port) {
    int p[2];

    c->port = port;
    c->err[0] = 0;
    assert_int_equal(pipe(p), 0);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        outcome o;
        close(p[0]);
        client_main(c, &o);
        _exit(write(p[1], &o, sizeof(o)) == (ssize_t)sizeof(o) ? 0 : 1);
    }
    close(p[1]);
    c->rfd = p[0];
}

/* 1 once c's outcome is read (and the child reaped). */
static int client_done(client *c) {
    struct pollfd p = {.fd = c->rfd, .events = POLLIN};
    outcome o;
    size_t got = 0;
    int status = 0;

    if (c->rfd < 0)
        return 1;
    if (poll(&p, 1, 0) != 1)
        return 0;
    while (got < sizeof(o)) {
        ssize_t n = read(c->rfd, (char *)&o + got, sizeof(o) - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(c->rfd);
    c->rfd = -1;
    /* Bounded: a child that does not exit is killed and named. */
    int64_t deadline = hvd_now_ns() + 10 * SEC;
    pid_t w;
    while ((w = waitpid(c->pid, &status, WNOHANG)) == 0 &&
           hvd_now_ns() < deadline)
        poll(NULL, 0, 10);
    if (w == 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &status, 0);
        fail_msg("the client of rank %d (worker %d) wrote its outcome and "
                 "did not exit within 10 s",
                 c->rank, c->worker);
    }
    assert_int_equal(w, c->pid);
    assert_int_equal(got, sizeof(o));
    c->st = o.st;
    memcpy(c->err, o.err, sizeof(c->err));
    memcpy(c->got, o.got, sizeof(c->got));
    return 1;
}

/* Drives the server until the n clients are done (bounded). */
static void finish(hvd_rdv_server *srv, client *cs, int n) {
    int64_t deadline = hvd_now_ns() + 20 * SEC;

    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= client_done(&cs[i]);
        if (all)
            break;
        assert_true(hvd_now_ns() < deadline);
        assert_int_equal(hvd_rdv_server_progress(srv, 10), HVD_OK);
    }
}

static void assert_sentence(const client *c, int relay_port) {
    char want[128];

    snprintf(want, sizeof(want),
             "a message from the rendezvous at 127.0.0.1:%d failed "
             "authentication",
             relay_port);
    assert_int_equal(c->st, HVD_ERR_PROTOCOL);
    if (strstr(c->err, want) == NULL)
        fail_msg("the sentence was: %s", c->err);
}

/* The server dropped the client for a message that failed its tag there,
 * and said so in a last Result, which the client believes (its tag is
 * right). */
static void assert_server_sentence(const client *c, const char *who) {
    char want[128];

    snprintf(want, sizeof(want), "the rendezvous server dropped %s: message",
             who);
    assert_int_equal(c->st, HVD_ERR_PROTOCOL);
    if (strstr(c->err, want) == NULL ||
        strstr(c->err, "failed authentication") == NULL)
        fail_msg("the sentence was: %s", c->err);
}

/* ---- Fixed rendezvous ---- */

/* A fixed job of size ranks, rank size - 1 through a relay with the
 * given actions, rounds rounds each. */
static void fixed_run(int size, int rounds, int c2s, int s2c, int at,
                      client *cs, relay **r_out, hvd_rdv_server **srv_out) {
    hvd_rdv_server *srv = NULL;

    assert_int_equal(
        hvd_rdv_server_create("127.0.0.1", 0, size, job, SECRET, &srv), HVD_OK);
    relay *r = relay_open(hvd_rdv_server_port(srv), c2s, s2c, at);
    for (int i = 0; i < size; i++) {
        cs[i].rank = i;
        cs[i].size = size;
        cs[i].worker = -1;
        cs[i].rounds = rounds;
        client_start(&cs[i],
                     i == size - 1 ? r->port : hvd_rdv_server_port(srv));
    }
    relay_go(r);
    finish(srv, cs, size);
    *r_out = r;
    *srv_out = srv;
}

static void fixed_clean(void **state) {
    client cs[2];
    relay *r;
    hvd_rdv_server *srv;

    (void)state;
    memset(cs, 0, sizeof(cs));
    fixed_run(2, 3, A_NONE, A_NONE, 0, cs, &r, &srv);
    for (int i = 0; i < 2; i++) {
        if (cs[i].st != HVD_OK)
            fail_msg("rank %d: %s", i, cs[i].err);
        for (int round = 0; round < 3; round++)
            for (int k = 0; k < 2; k++)
                assert_int_equal(cs[i].got[round][k], k * 100 + round);
    }
    assert_int_equal(hvd_log_limit_total(&srv->forged), 0);
    relay_stop(r);
    hvd_rdv_server_destroy(srv);
}

/* A message to the client changed, or sent again: the client's round
 * fails with the sentence; the direct rank is not affected. */
static void fixed_to_client(int action, int at, int rounds) {
    client cs[2];
    relay *r;
    hvd_rdv_server *srv;

    memset(cs, 0, sizeof(cs));
    fixed_run(2, rounds, A_NONE, action, at, cs, &r, &srv);
    assert_true(atomic_load(&r->acted));
    assert_int_equal(cs[0].st, HVD_OK);
    assert_sentence(&cs[1], r->port);
    relay_stop(r);
    hvd_rdv_server_destroy(srv);
}

static void fixed_flip_to_client(void **state) {
    (void)state;
    fixed_to_client(A_FLIP, 0, 1);
}

/* The first round's answer arrives twice: the second round reads the
 * copy. */
static void fixed_replay_to_client(void **state) {
    (void)state;
    fixed_to_client(A_REPLAY, 0, 2);
}

/* A message from the client changed, or sent again: the server drops the
 * connection (so the client fails) and logs it. One rank, so no other
 * waits for it. */
static void fixed_to_server(int action, int rounds) {
    client cs[1];
    relay *r;
    hvd_rdv_server *srv;

    memset(cs, 0, sizeof(cs));
    fixed_run(1, rounds, action, A_NONE, 0, cs, &r, &srv);
    assert_true(atomic_load(&r->acted));
    assert_server_sentence(&cs[0], "rank 0");
    assert_int_equal(hvd_log_limit_total(&srv->forged), 1);
    assert_int_equal(srv->rank_conn[0], -1);
    relay_stop(r);
    hvd_rdv_server_destroy(srv);
}

static void fixed_flip_to_server(void **state) {
    (void)state;
    fixed_to_server(A_FLIP, 1);
}

/* The first contribution arrives twice: its round completes, the copy
 * fails its tag, and the second round cannot complete. */
static void fixed_replay_to_server(void **state) {
    (void)state;
    fixed_to_server(A_REPLAY, 2);
}

/* ---- Elastic rendezvous ---- */

/* Worker 0 joins through the relay and waits (min-np 2, worker 1 never
 * comes), so the server sends it a keepalive every second. */
static void elastic_run(int c2s, int s2c, int at, client *c, relay **r_out,
                        hvd_rdv_server **srv_out) {
    hvd_rdv_server *srv = NULL;

    assert_int_equal(
        hvd_rdv_server_create_elastic("127.0.0.1", 0, 2, 2, job, SECRET, &srv),
        HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 0, "hostA"), HVD_OK);
    assert_int_equal(hvd_rdv_server_add_worker(srv, 1, "hostA"), HVD_OK);
    relay *r = relay_open(hvd_rdv_server_port(srv), c2s, s2c, at);
    memset(c, 0, sizeof(*c));
    c->worker = 0;
    client_start(c, r->port);
    relay_go(r);
    finish(srv, c, 1);
    *r_out = r;
    *srv_out = srv;
}

/* The first keepalive is lost on the way: the second fails its tag. */
static void elastic_drop_keepalive(void **state) {
    client c;
    relay *r;
    hvd_rdv_server *srv;

    (void)state;
    elastic_run(A_NONE, A_DROP, 0, &c, &r, &srv);
    assert_true(atomic_load(&r->acted));
    assert_sentence(&c, r->port);
    relay_stop(r);
    hvd_rdv_server_destroy(srv);
}

/* The first two keepalives arrive swapped: the first to arrive fails. */
static void elastic_reorder_keepalives(void **state) {
    client c;
    relay *r;
    hvd_rdv_server *srv;

    (void)state;
    elastic_run(A_NONE, A_REORDER, 0, &c, &r, &srv);
    assert_true(atomic_load(&r->acted));
    assert_sentence(&c, r->port);
    relay_stop(r);
    hvd_rdv_server_destroy(srv);
}

/* The join itself is changed: the server drops the worker and logs it. */
static void elastic_flip_join(void **state) {
    client c;
    relay *r;
    hvd_rdv_server *srv;

    (void)state;
    elastic_run(A_FLIP, A_NONE, 0, &c, &r, &srv);
    assert_true(atomic_load(&r->acted));
    assert_server_sentence(&c, "worker 0");
    assert_int_equal(hvd_log_limit_total(&srv->forged), 1);
    assert_int_equal(hvd_rdv_server_waiting(srv), 0);
    relay_stop(r);
    hvd_rdv_server_destroy(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixed_clean),
        cmocka_unit_test(fixed_flip_to_client),
        cmocka_unit_test(fixed_replay_to_client),
        cmocka_unit_test(fixed_flip_to_server),
        cmocka_unit_test(fixed_replay_to_server),
        cmocka_unit_test(elastic_drop_keepalive),
        cmocka_unit_test(elastic_reorder_keepalives),
        cmocka_unit_test(elastic_flip_join),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
