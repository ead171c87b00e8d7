/*
 * The rendezvous client (rendezvous.h), used by hvd_init: connecting and
 * authenticating, joining an elastic generation, the allgather rounds of
 * the bootstrap it returns, and the notices of an elastic server.
 */
#include "transport/bootstrap/rdv_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/base/wire.h"

/* Largest Result that is not a round's answer (an assignment, a notice, an
 * error and its sentence). */
#define MAX_OTHER_RESULT (64 * 1024)

typedef struct rdv_client {
    hvd_bootstrap bs;
    int fd;
    uint32_t generation;
    uint32_t round;
    int64_t deadline;
    /* Elastic. */
    int elastic;
    int worker;
    int64_t timeout_ns;
    int notices; /* since the join */
    int broken;  /* the connection broke or the server ended it */
    int forged;  /* a message from the server failed its tag */
    /* The server, for sentences. */
    char addr[HVD_ADDR_MAX];
    int port;
    rdv_keys keys;
    /* The Result being received: 4-byte length, then the body and its tag
     * (body_len counts the body only). */
    uint8_t lenbuf[LEN_PREFIX];
    size_t len_got;
    uint8_t *body;
    size_t body_len;
    size_t body_got;
} rdv_client;

/* Rendezvous this process started in fixed mode (hvd_init holds its lock
 * around it). */
static uint32_t client_generations;

/* Blocking send on a non-blocking socket, bounded by deadline. */
static hvd_status send_all(rdv_client *cl, const void *buf, size_t len) {
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(cl->fd, (const uint8_t *)buf + off, len - off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return hvd_error_set(HVD_ERR_PEER_LOST,
                                 "send() to the rendezvous server failed: %s",
                                 n == 0 ? "nothing sent" : strerror(errno));
        int64_t left_ms = (cl->deadline - hvd_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hvd_error_set(HVD_ERR_TIMEOUT, "send() timed out");
        struct pollfd pfd = {.fd = cl->fd, .events = POLLOUT};
        poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    }
    return HVD_OK;
}

/* Sends one message: msg is its length prefix and body; its tag follows. */
static hvd_status send_msg(rdv_client *cl, const uint8_t *msg, size_t len) {
    uint8_t tag[RDV_TAG];
    hvd_status st;

    if (hvd_rdv_seal(&cl->keys, msg, len, tag) != 0)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "could not tag a message to the rendezvous "
                             "server at %s:%d",
                             cl->addr, cl->port);
    st = send_all(cl, msg, len);
    if (st == HVD_OK)
        st = send_all(cl, tag, sizeof(tag));
    return st;
}

/* Checks and unpacks the whole message in cl->body. A message that fails
 * its tag is never unpacked: nothing of it is used, and the connection is
 * broken. */
static hvd_status open_result(rdv_client *cl, Hvd__Rdv__Result **res_out) {
    Hvd__Rdv__Result *res = NULL;
    int ok = hvd_rdv_open(&cl->keys, cl->lenbuf, cl->body, cl->body_len,
                          cl->body + cl->body_len) == 0;

    if (ok)
        res = hvd__rdv__result__unpack(NULL, cl->body_len, cl->body);
    free(cl->body);
    cl->body = NULL;
    cl->len_got = cl->body_len = cl->body_got = 0;
    if (!ok) {
        cl->broken = 1;
        cl->forged = 1;
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "a message from the rendezvous at %s:%d failed "
                             "authentication: it was changed, replayed or "
                             "reordered on the way, or one before it was "
                             "lost (message %llu from the server)",
                             cl->addr, cl->port,
                             (unsigned long long)(cl->keys.rx_n - 1));
    }
    if (res == NULL)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "malformed answer from the rendezvous "
                             "server for round %u",
                             cl->round);
    *res_out = res;
    return HVD_OK;
}

/*
 * Receives the next Result into *res_out, waiting until cl->deadline if
 * block, else returning HVD_OK with *res_out = NULL when no whole Result
 * has arrived. A partial Result stays buffered for the next call.
 * HVD_ERR_TIMEOUT (the caller writes the sentence), HVD_ERR_PEER_LOST,
 * HVD_ERR_PROTOCOL for an oversized or malformed Result.
 */
static hvd_status recv_result(rdv_client *cl, int block,
                              Hvd__Rdv__Result **res_out) {
    size_t max = (size_t)cl->bs.size * (HVD_RDV_MAX_BLOB + 8) + 64;

    if (max < MAX_OTHER_RESULT)
        max = MAX_OTHER_RESULT;
    *res_out = NULL;
    for (;;) {
        uint8_t *dst;
        size_t want;

        if (cl->len_got < LEN_PREFIX) {
            dst = cl->lenbuf + cl->len_got;
            want = LEN_PREFIX - cl->len_got;
        } else {
            dst = cl->body + cl->body_got;
            want = cl->body_len + RDV_TAG - cl->body_got;
        }
        if (want == 0)
            return open_result(cl, res_out);
        ssize_t n = recv(cl->fd, dst, want, MSG_DONTWAIT);
        if (n > 0) {
            if (cl->len_got < LEN_PREFIX) {
                cl->len_got += (size_t)n;
                if (cl->len_got < LEN_PREFIX)
                    continue;
                cl->body_len = hvd_get32(cl->lenbuf);
                if (cl->body_len > max)
                    return hvd_error_set(HVD_ERR_PROTOCOL,
                                         "the rendezvous server sent a "
                                         "%zu-byte answer (at most %zu)",
                                         cl->body_len, max);
                cl->body = malloc(cl->body_len + RDV_TAG);
                if (cl->body == NULL)
                    return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
                cl->body_got = 0;
            } else {
                cl->body_got += (size_t)n;
            }
            continue;
        }
        if (n == 0)
            return hvd_error_set(HVD_ERR_PEER_LOST,
                                 "the rendezvous server (hvdrun) closed the "
                                 "connection: it may have refused this rank "
                                 "or exited");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return hvd_error_set(HVD_ERR_PEER_LOST,
                                 "recv() from the rendezvous server failed: "
                                 "%s",
                                 strerror(errno));
        if (!block)
            return HVD_OK;
        int64_t left_ms = (cl->deadline - hvd_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hvd_error_set(HVD_ERR_TIMEOUT, "timed out");
        struct pollfd pfd = {.fd = cl->fd, .events = POLLIN};
        poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    }
}

/* Elastic: a Result with error set ends the connection; returns its
 * status with its sentence. */
static hvd_status server_error(rdv_client *cl, const Hvd__Rdv__Result *res) {
    cl->broken = 1;
    if (res->error_status <= HVD_OK || res->error_status > HVD_ERR_PROTOCOL)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "the rendezvous server ended the connection "
                             "with status %d: %s",
                             res->error_status,
                             res->error != NULL ? res->error : "");
    return hvd_error_set((hvd_status)res->error_status, "%s",
                         res->error != NULL && res->error[0]
                             ? res->error
                             : "the rendezvous server ended the connection");
}

/*
 * Elastic: the server may have ended the connection with an error Result
 * (a generation abandoned while this rank was between rounds) and closed
 * it before this rank sent again. Returns that Result's status and
 * sentence if it is still unread, else st with its sentence.
 */
static hvd_status unread_error(rdv_client *cl, hvd_status st) {
    char saved[HVD_ERROR_MAX];
    Hvd__Rdv__Result *res = NULL;

    snprintf(saved, sizeof(saved), "%s", hvd_error_get());
    for (int i = 0; i < 1024; i++) {
        hvd_status rst = recv_result(cl, 0, &res);
        /* A forged message says more than the broken connection. */
        if (rst == HVD_ERR_PROTOCOL && cl->forged)
            return rst;
        if (rst != HVD_OK || res == NULL)
            break;
        if (res->error_status != 0) {
            st = server_error(cl, res);
            hvd__rdv__result__free_unpacked(res, NULL);
            return st;
        }
        cl->notices += res->notice != 0;
        hvd__rdv__result__free_unpacked(res, NULL);
        res = NULL;
    }
    return hvd_error_copy(st, saved);
}

static hvd_status client_allgather(hvd_bootstrap *bs, const void *mine,
                                   size_t len, void *all_out) {
    rdv_client *cl = bs->ctx;
    Hvd__Rdv__Contribute msg = HVD__RDV__CONTRIBUTE__INIT;
    Hvd__Rdv__Result *res = NULL;
    uint8_t *buf = NULL;
    size_t plen;
    hvd_status st;

    if (len > HVD_RDV_MAX_BLOB)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "bootstrap blob of %zu bytes (at most %d)", len,
                             HVD_RDV_MAX_BLOB);
    if (cl->broken)
        return hvd_error_set(HVD_ERR_PEER_LOST,
                             "worker %d: the connection to the rendezvous "
                             "server ended before bootstrap round %u",
                             cl->worker, cl->round);
    msg.round = cl->round;
    msg.generation = cl->generation;
    msg.blob.data = (uint8_t *)(uintptr_t)mine;
    msg.blob.len = len;
    plen = hvd__rdv__contribute__get_packed_size(&msg);
    buf = malloc(plen + LEN_PREFIX);
    if (buf == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    hvd_put32(buf, (uint32_t)plen);
    hvd__rdv__contribute__pack(&msg, buf + LEN_PREFIX);
    st = send_msg(cl, buf, plen + LEN_PREFIX);
    free(buf);
    if (st == HVD_ERR_PEER_LOST && cl->elastic)
        st = unread_error(cl, st);
    if (st != HVD_OK)
        goto timeout;

    /* Elastic: notices pushed meanwhile are counted and skipped. */
    for (;;) {
        st = recv_result(cl, 1, &res);
        if (st != HVD_OK)
            goto timeout;
        if (!cl->elastic || !res->notice)
            break;
        cl->notices++;
        hvd__rdv__result__free_unpacked(res, NULL);
        res = NULL;
    }
    /* A fixed rendezvous sends an error only when it drops this rank
     * (a message from it failed authentication there). */
    if (res->error_status != 0) {
        st = server_error(cl, res);
        goto out;
    }
    if (res->round != cl->round || res->generation != cl->generation ||
        res->n_blobs != (size_t)bs->size) {
        st = hvd_error_set(HVD_ERR_PROTOCOL,
                           "malformed answer from the rendezvous server for "
                           "round %u",
                           cl->round);
        goto out;
    }
    for (int r = 0; r < bs->size; r++) {
        if (res->blobs[r].len != len) {
            st = hvd_error_set(HVD_ERR_MISMATCH,
                               "rank %d sent %zu bytes in bootstrap round %u "
                               "where rank %d sent %zu: ranks run different "
                               "hvd versions or settings",
                               r, res->blobs[r].len, cl->round, bs->rank, len);
            goto out;
        }
        memcpy((uint8_t *)all_out + (size_t)r * len, res->blobs[r].data, len);
    }
    cl->round++;
out:
    if (res != NULL)
        hvd__rdv__result__free_unpacked(res, NULL);
    return st;
timeout:
    if (st == HVD_ERR_TIMEOUT && cl->elastic)
        st = hvd_error_set(HVD_ERR_TIMEOUT,
                           "worker %d (rank %d): not every worker of "
                           "generation %u reached bootstrap round %u within "
                           "HVD_ELASTIC_TIMEOUT_SECONDS (%lld s)",
                           cl->worker, bs->rank, cl->generation, cl->round,
                           (long long)(cl->timeout_ns / 1000000000LL));
    else if (st == HVD_ERR_TIMEOUT)
        st = hvd_error_set(HVD_ERR_TIMEOUT,
                           "rank %d: not every rank reached hvd_init "
                           "within the start timeout "
                           "(HVD_START_TIMEOUT_SECONDS)",
                           bs->rank);
    if (st == HVD_ERR_PEER_LOST || st == HVD_ERR_TRANSPORT ||
        st == HVD_ERR_PROTOCOL)
        cl->broken = 1;
    return st;
}

/* What connect_auth saw while it tried: what its final sentence says. */
typedef struct auth_try {
    const char *addr;
    int port;
    const char *what; /* "rank", "worker" */
    int id;
    int64_t start;
    int drops;          /* closed by the server before the handshake ended */
    int64_t port_since; /* waiting for a free local port since; 0: not */
} auth_try;

/* The connect failed for want of a free local port (every port of the
 * range busy or in TIME_WAIT, as after a flood of connections): says so
 * once when the wait starts (HVD_INFO), since it may last long. */
static void note_port_wait(auth_try *t, int err, int64_t deadline) {
    long low, high;

    if (err != EADDRNOTAVAIL || t->port_since != 0)
        return;
    t->port_since = hvd_now_ns();
    hvd_net_port_range(&low, &high);
    HVD_INFO("rdv",
             "%s %d: no free local port to connect to the rendezvous at "
             "%s:%d: all ports of %ld-%ld busy or in TIME_WAIT; waiting up "
             "to %lld s (HVD_START_TIMEOUT_SECONDS)",
             t->what, t->id, t->addr, t->port, low, high,
             (long long)((deadline - t->port_since) / 1000000000LL));
}

static void note_port_found(auth_try *t) {
    if (t->port_since == 0)
        return;
    HVD_INFO("rdv", "%s %d: got a free local port after %.1f s", t->what, t->id,
             (double)(hvd_now_ns() - t->port_since) / 1e9);
    t->port_since = 0;
}

/* The deadline passed after the server closed connections of this rank
 * before their handshake ended: it was too busy with strangers to keep
 * them. The server cannot tell us then, so we say what we saw. */
static hvd_status flooded(const auth_try *t) {
    return hvd_error_set(HVD_ERR_TIMEOUT,
                         "%s %d: could not reach the rendezvous at %s:%d for "
                         "%.0f s: its connection was closed %d times before "
                         "the handshake finished -- the rendezvous may be "
                         "flooded by unauthenticated connections "
                         "(HVD_START_TIMEOUT_SECONDS)",
                         t->what, t->id, t->addr, t->port,
                         (double)(hvd_now_ns() - t->start) / 1e9, t->drops);
}

/*
 * One handshake on cl->fd, connected. HVD_OK; HVD_ERR_PEER_LOST when the
 * server dropped the connection without refusing it (try again); else a
 * final failure with its sentence.
 */
static hvd_status handshake_once(rdv_client *cl, auth_try *t,
                                 const uint8_t job_id[HVD_JOB_ID_LEN],
                                 const char *secret) {
    hvd_hs hs;
    hvd_status st = hvd_hs_client_init(&hs, job_id, secret,
                                       HVD_HS_KIND_RENDEZVOUS, t->id, 0, -1);

    if (st == HVD_OK)
        st = hvd_hs_run(&hs, cl->fd, cl->deadline);
    if (st == HVD_OK)
        return hvd_rdv_keys_init(&cl->keys, &hs, 1);
    if (st == HVD_ERR_INTERNAL)
        return st;
    /* Dropped before its CHALLENGE (PEER_LOST), or after it: a server
     * that proved it holds this job's secret shares ours, so it cannot
     * refuse our proof; a close or reset then is a server that dropped
     * this connection for others (strangers filled its table). The
     * client queues its RESPONSE only once the server's CHALLENGE checked
     * out. */
    int proved = hs.out_len == HVD_HS_RESPONSE_LEN;
    if (st != HVD_ERR_TIMEOUT && (st == HVD_ERR_PEER_LOST || proved)) {
        t->drops++;
        HVD_DEBUG("rdv", "%s %d: %s; trying again", t->what, t->id, hs.err);
        return HVD_ERR_PEER_LOST;
    }
    if (st == HVD_ERR_TIMEOUT && t->drops > 0)
        return flooded(t);
    return hvd_error_set(st,
                         "%s %d: the rendezvous server at %s:%d did not "
                         "accept this %s: %s",
                         t->what, t->id, t->addr, t->port, t->what, hs.err);
}

/*
 * Connects to the server and runs the handshake as id (a rank, or a
 * worker id in elastic mode), retrying while the server refuses or drops
 * the connection, up to cl->deadline. what names id in messages ("rank",
 * "worker").
 */
static hvd_status connect_auth(rdv_client *cl, const char *addr, int port,
                               const char *what, int id,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const char *secret) {
    auth_try t = {.addr = addr, .port = port, .what = what, .id = id};
    hvd_status st;

    snprintf(cl->addr, sizeof(cl->addr), "%s", addr);
    cl->port = port;
    t.start = hvd_now_ns();
    /* The server is normally up before any rank starts; retry a refusal
     * anyway, for launchers that start it alongside the ranks, and a
     * connection it dropped (strangers filled its table). */
    for (;;) {
        int err = 0;
        st = hvd_net_connect_start(addr, port, &cl->fd);
        if (st != HVD_OK) {
            note_port_wait(&t, errno, cl->deadline);
        } else {
            struct pollfd pfd = {.fd = cl->fd, .events = POLLOUT};
            int64_t left = (cl->deadline - hvd_now_ns()) / 1000000;
            note_port_found(&t);
            if (poll(&pfd, 1, left > 0 ? (int)left : 0) <= 0)
                err = ETIMEDOUT;
            else
                err = hvd_net_connect_result(cl->fd);
            if (err == 0) {
                st = handshake_once(cl, &t, job_id, secret);
                if (st == HVD_OK)
                    return HVD_OK;
                if (st != HVD_ERR_PEER_LOST)
                    return st;
                err = ECONNRESET;
            }
            close(cl->fd);
            cl->fd = -1;
            st = hvd_error_set(HVD_ERR_TRANSPORT,
                               "connect(%s:%d) to the rendezvous server "
                               "failed: %s",
                               addr, port, strerror(err));
        }
        if (st != HVD_ERR_INVALID_ARG && hvd_now_ns() > cl->deadline &&
            t.drops > 0)
            return flooded(&t);
        if (st == HVD_ERR_INVALID_ARG || hvd_now_ns() > cl->deadline) {
            hvd_error_prefix("HVD_RENDEZVOUS_ADDR/PORT: ");
            return st;
        }
        /* A dropped connection is tried again at once (the server is up
         * and shedding strangers); a refused one a little later. */
        poll(NULL, 0, err == ECONNRESET ? 10 : 100);
    }
}

static rdv_client *client_new(int64_t timeout_ns) {
    rdv_client *cl = calloc(1, sizeof(*cl));

    if (cl == NULL)
        return NULL;
    cl->fd = -1;
    cl->worker = -1;
    cl->timeout_ns = timeout_ns;
    cl->deadline = hvd_now_ns() + timeout_ns;
    cl->bs.allgather = client_allgather;
    cl->bs.ctx = cl;
    return cl;
}

hvd_status hvd_rdv_client_connect(const char *addr, int port, int rank,
                                  int size,
                                  const uint8_t job_id[HVD_JOB_ID_LEN],
                                  const char *secret, int64_t timeout_ns,
                                  hvd_bootstrap **out,
                                  char local_addr_out[64]) {
    rdv_client *cl = client_new(timeout_ns);
    hvd_status st;

    if (cl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    cl->bs.rank = rank;
    cl->bs.size = size;
    st = connect_auth(cl, addr, port, "rank", rank, job_id, secret);
    if (st != HVD_OK)
        goto fail;
    st = hvd_net_local_addr(cl->fd, local_addr_out, 64);
    if (st != HVD_OK)
        goto fail;
    cl->generation = client_generations++;
    *out = &cl->bs;
    return HVD_OK;
fail:
    hvd_rdv_client_close(&cl->bs);
    return st;
}

/* What a try on one port of a hosted rendezvous (hvd_rdv_client_try)
 * found there when the rank did not join. */
static int try_verdict(const hvd_hs *hs, hvd_status st) {
    if (st == HVD_ERR_PEER_LOST)
        return RDV_SKIP_NOBODY;
    if (hs->refusal == HVD_HS_WRONG_JOB)
        return RDV_SKIP_OTHER_JOB;
    if (hs->refusal == HVD_HS_BAD_PROOF || hs->refusal == HVD_HS_UNEXPECTED ||
        st == HVD_ERR_MISMATCH || st == HVD_ERR_INTERNAL)
        return 0; /* this job's rendezvous refused this rank: final */
    return RDV_SKIP_NOT_HVD;
}

hvd_status hvd_rdv_client_try(const char *addr, int port, int rank, int size,
                              const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret, int64_t try_deadline,
                              int64_t deadline, hvd_bootstrap **out,
                              char local_addr_out[64], int *skip_out) {
    rdv_client *cl = client_new(0);
    hvd_hs hs;
    hvd_status st;
    int err;

    *out = NULL;
    *skip_out = RDV_SKIP_NOBODY;
    if (cl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    cl->bs.rank = rank;
    cl->bs.size = size;
    cl->deadline = try_deadline;
    snprintf(cl->addr, sizeof(cl->addr), "%s", addr);
    cl->port = port;
    st = hvd_net_connect_start(addr, port, &cl->fd);
    if (st != HVD_OK) {
        /* A malformed address is final; a connect that fails at once
         * (no free local port) is tried again with the next cycle. */
        if (st != HVD_ERR_INVALID_ARG)
            st = HVD_OK;
        goto close;
    }
    struct pollfd pfd = {.fd = cl->fd, .events = POLLOUT};
    int64_t left = (try_deadline - hvd_now_ns()) / 1000000;
    err = poll(&pfd, 1, left > 0 ? (int)left : 0) <= 0
              ? ETIMEDOUT
              : hvd_net_connect_result(cl->fd);
    if (err != 0)
        goto close; /* nothing listens there */
    st = hvd_hs_client_init(&hs, job_id, secret, HVD_HS_KIND_RENDEZVOUS, rank,
                            0, -1);
    if (st == HVD_OK)
        st = hvd_hs_run(&hs, cl->fd, try_deadline);
    if (st == HVD_OK)
        st = hvd_rdv_keys_init(&cl->keys, &hs, 1);
    if (st == HVD_OK)
        st = hvd_net_local_addr(cl->fd, local_addr_out, 64);
    if (st == HVD_OK) {
        /* A hosted server serves one hvd_init: its rounds start at 0. */
        cl->deadline = deadline;
        *out = &cl->bs;
        return HVD_OK;
    }
    *skip_out = try_verdict(&hs, st);
    if (*skip_out == 0)
        st = hvd_error_set(st == HVD_ERR_INTERNAL ? st : hs.status,
                           "rank %d: the rendezvous of this job at %s:%d did "
                           "not accept this rank: %s",
                           rank, addr, port, hs.err);
    else
        st = HVD_OK;
close:
    hvd_rdv_client_close(&cl->bs);
    return st;
}

/* Elastic: checks an assignment the server sent. */
static int assignment_ok(const Hvd__Rdv__Assignment *a) {
    return a != NULL && a->size > 0 && a->rank >= 0 && a->rank < a->size &&
           a->local_size > 0 && a->local_rank >= 0 &&
           a->local_rank < a->local_size && a->local_size <= a->size &&
           a->cross_size > 0 && a->cross_rank >= 0 &&
           a->cross_rank < a->cross_size && a->cross_size <= a->size;
}

hvd_status hvd_rdv_client_join(const char *addr, int port, int worker,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const char *secret, int64_t timeout_ns,
                               hvd_bootstrap **out, char local_addr_out[64],
                               hvd_rdv_assignment *asg_out) {
    rdv_client *cl = client_new(timeout_ns);
    Hvd__Rdv__Contribute msg = HVD__RDV__CONTRIBUTE__INIT;
    Hvd__Rdv__Result *res = NULL;
    uint8_t buf[LEN_PREFIX + 16];
    size_t plen;
    hvd_status st;

    if (cl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (worker < 0) {
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "worker id %d (HVD_ELASTIC_WORKER) is negative",
                           worker);
        goto fail;
    }
    cl->elastic = 1;
    cl->worker = worker;
    cl->bs.rank = -1;
    st = connect_auth(cl, addr, port, "worker", worker, job_id, secret);
    if (st != HVD_OK)
        goto fail;
    st = hvd_net_local_addr(cl->fd, local_addr_out, 64);
    if (st != HVD_OK)
        goto fail;

    msg.join = 1;
    plen = hvd__rdv__contribute__get_packed_size(&msg);
    hvd_put32(buf, (uint32_t)plen);
    hvd__rdv__contribute__pack(&msg, buf + LEN_PREFIX);
    st = send_msg(cl, buf, plen + LEN_PREFIX);
    /* While this worker waits, the server sends a keepalive (a notice)
     * every second: the timeout is of the server's silence. */
    while (st == HVD_OK) {
        st = recv_result(cl, 1, &res);
        if (st != HVD_OK || !res->notice)
            break;
        cl->deadline = hvd_now_ns() + timeout_ns;
        hvd__rdv__result__free_unpacked(res, NULL);
        res = NULL;
    }
    if (st == HVD_ERR_TIMEOUT) {
        st = hvd_error_set(HVD_ERR_TIMEOUT,
                           "worker %d: the rendezvous server (hvdrun) said "
                           "nothing for HVD_ELASTIC_TIMEOUT_SECONDS (%lld s) "
                           "while this worker waited to be placed in a "
                           "generation: is hvdrun stopped or its host cut "
                           "off?",
                           worker, (long long)(timeout_ns / 1000000000LL));
        goto fail;
    }
    if (st != HVD_OK)
        goto fail;
    if (res->error_status != 0) {
        st = server_error(cl, res);
        goto fail;
    }
    if (res->generation == 0 || !assignment_ok(res->assignment)) {
        st = hvd_error_set(HVD_ERR_PROTOCOL,
                           "worker %d: malformed assignment from the "
                           "rendezvous server",
                           worker);
        goto fail;
    }
    asg_out->generation = res->generation;
    asg_out->rank = res->assignment->rank;
    asg_out->size = res->assignment->size;
    asg_out->local_rank = res->assignment->local_rank;
    asg_out->local_size = res->assignment->local_size;
    asg_out->cross_rank = res->assignment->cross_rank;
    asg_out->cross_size = res->assignment->cross_size;
    cl->bs.rank = asg_out->rank;
    cl->bs.size = asg_out->size;
    cl->generation = res->generation;
    cl->round = 0;
    cl->notices = 0;
    /* The generation's rounds get a timeout of their own. */
    cl->deadline = hvd_now_ns() + timeout_ns;
    hvd__rdv__result__free_unpacked(res, NULL);
    *out = &cl->bs;
    return HVD_OK;
fail:
    if (res != NULL)
        hvd__rdv__result__free_unpacked(res, NULL);
    hvd_rdv_client_close(&cl->bs);
    return st;
}

int hvd_rdv_client_updates(hvd_bootstrap *bs) {
    rdv_client *cl;

    if (bs == NULL)
        return 0;
    cl = bs->ctx;
    if (!cl->elastic)
        return 0;
    /* Bounded: a server pushing without end cannot hold the caller. */
    for (int i = 0; i < 1024 && !cl->broken; i++) {
        Hvd__Rdv__Result *res;
        hvd_status st = recv_result(cl, 0, &res);
        if (st != HVD_OK) {
            cl->broken = 1;
            break;
        }
        if (res == NULL)
            return cl->notices;
        if (res->notice && res->error_status == 0) {
            cl->notices++;
        } else if (res->error_status != 0) {
            server_error(cl, res);
        } else {
            hvd_error_set(HVD_ERR_PROTOCOL,
                          "worker %d: unexpected answer from the "
                          "rendezvous server outside a bootstrap round",
                          cl->worker);
            cl->broken = 1;
        }
        hvd__rdv__result__free_unpacked(res, NULL);
    }
    return cl->broken ? -1 : cl->notices;
}

void hvd_rdv_client_close(hvd_bootstrap *bs) {
    rdv_client *cl;

    if (bs == NULL)
        return;
    cl = bs->ctx;
    if (cl->fd >= 0)
        close(cl->fd);
    hvd_rdv_keys_free(&cl->keys);
    free(cl->body);
    free(cl);
}
