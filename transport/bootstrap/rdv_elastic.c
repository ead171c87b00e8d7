/*
 * The elastic rendezvous server (docs/elastic.md; rendezvous.h says what
 * hvdrun and the workers see): the workers hvdrun adds and removes, the
 * generations formed of those that wait, a member leaving its generation,
 * the notices to the members, the end of the job, and the keepalive of
 * waiting workers. It calls rdv_conn.c; rdv_server.c calls it.
 */
#include "transport/bootstrap/rdv_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

static void drop_blobs(hvd_rdv_server *srv) {
    for (int r = 0; r < srv->max_workers; r++) {
        free(srv->blobs[r]);
        srv->blobs[r] = NULL;
    }
    srv->have = 0;
}

/*
 * Elastic: worker, rank rank of the current generation, leaves it (hvdrun
 * removed it, or it joins again on a new connection). No round of the
 * generation can complete without it, so the generation is dead: its
 * members must join again.
 *
 * The server does not know how many bootstrap rounds the library runs, so
 * it cannot tell "between two rounds" from "all rounds done". The rule:
 * - a round is open (some members contributed and wait), or round 0 has
 *   not completed (members were placed and are setting up): the
 *   generation is abandoned now: every other member with an open
 *   connection gets HVD_ERR_PEERS_CHANGED with the sentence, and the
 *   round's blobs are dropped;
 * - otherwise the members may be done with their rounds and running (they
 *   get only the notice, and their transport sees the loss itself), or
 *   about to start the next round: any later contribution to the dead
 *   generation is answered with HVD_ERR_PEERS_CHANGED at once.
 */
static void member_leave(hvd_rdv_server *srv, int worker, int rank) {
    srv->workers[worker].rank = -1;
    if (srv->gen_dead)
        return;
    srv->gen_dead = 1;
    snprintf(srv->dead_why, sizeof(srv->dead_why),
             "worker %d (rank %d) left while generation %u was being set up",
             worker, rank, srv->generation);
    if (srv->round > 0 && srv->have == 0) {
        HVD_INFO("rdv",
                 "worker %d (rank %d) left generation %u after %u rounds",
                 worker, rank, srv->generation, srv->round);
        return;
    }
    HVD_INFO("rdv", "generation %u abandoned: %s", srv->generation,
             srv->dead_why);
    drop_blobs(srv);
    for (int r = 0; r < srv->size; r++)
        if (r != rank && srv->rank_conn[r] >= 0)
            hvd_rdv_conn_fail(srv, &srv->conns[srv->rank_conn[r]],
                              HVD_ERR_PEERS_CHANGED, srv->dead_why);
}

/* Elastic: every member of the current generation with an open
 * connection is owed one more notice. */
static void notify_members(hvd_rdv_server *srv) {
    if (srv->generation == 0 || srv->notice == NULL)
        return;
    for (int r = 0; r < srv->size; r++) {
        if (srv->rank_conn[r] < 0)
            continue;
        rconn *c = &srv->conns[srv->rank_conn[r]];
        c->notices++;
        if (c->qlen == 0)
            hvd_rdv_conn_flush(srv, c);
    }
}

/* Elastic: places the waiting workers in generation + 1. */
static void form_generation(hvd_rdv_server *srv, int n) {
    Hvd__Rdv__Result res = HVD__RDV__RESULT__INIT;
    Hvd__Rdv__Assignment asg = HVD__RDV__ASSIGNMENT__INIT;
    int *w = srv->gen_worker;
    int hosts = 0, k = 0;

    drop_blobs(srv);
    for (int r = 0; r < srv->size; r++)
        srv->rank_conn[r] = -1;
    for (int i = 0; i < srv->nconns; i++)
        if (srv->conns[i].state == RC_READY)
            srv->conns[i].rank = -1;
    for (int id = 0; id < srv->max_workers; id++) {
        srv->workers[id].rank = -1;
        if (srv->workers[id].state == W_ADDED && srv->workers[id].waiting)
            w[k++] = id;
    }
    srv->generation++;
    srv->round = 0;
    srv->size = n;
    srv->gen_dead = 0;
    hvd_rdv_result_put(srv->notice);
    res.notice = 1;
    res.generation = srv->generation;
    srv->notice = hvd_rdv_result_pack(&res);
    res.notice = 0;
    for (int r = 0; r < n; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++)
            if (strcmp(srv->workers[w[q]].host, srv->workers[w[r]].host) == 0)
                first = 0;
        hosts += first;
    }
    HVD_INFO("rdv", "generation %u formed: %d workers on %d hosts",
             srv->generation, n, hosts);
    for (int r = 0; r < n; r++) {
        rworker *wr = &srv->workers[w[r]];
        int local_rank = 0, local_size = 0, cross = -1, seen = 0;
        for (int q = 0; q < n; q++) {
            const char *h = srv->workers[w[q]].host;
            int first = 1;
            for (int p = 0; p < q && first; p++)
                if (strcmp(srv->workers[w[p]].host, h) == 0)
                    first = 0;
            if (first && strcmp(h, wr->host) == 0)
                cross = seen;
            seen += first;
            if (strcmp(h, wr->host) == 0) {
                local_size++;
                local_rank += q < r;
            }
        }
        wr->rank = r;
        wr->waiting = 0;
        asg.rank = r;
        asg.size = n;
        asg.local_rank = local_rank;
        asg.local_size = local_size;
        asg.cross_rank = cross;
        asg.cross_size = hosts;
        res.generation = srv->generation;
        res.assignment = &asg;
        rconn *c = &srv->conns[wr->conn];
        c->rank = r;
        srv->rank_conn[r] = wr->conn;
        HVD_DEBUG("rdv",
                  "generation %u: worker %d on %s is rank %d (local %d of "
                  "%d, cross %d of %d)",
                  srv->generation, w[r], wr->host, r, local_rank, local_size,
                  cross, hosts);
        rresult *out = hvd_rdv_result_pack(&res);
        if (out == NULL) {
            HVD_ERROR("rdv", "out of memory placing worker %d", w[r]);
            hvd_rdv_conn_close(srv, c);
            continue;
        }
        hvd_rdv_conn_send(srv, c, out);
        hvd_rdv_result_put(out);
    }
}

int hvd_rdv_server_state_lost(const hvd_rdv_server *srv) {
    if (!srv->elastic || !srv->any_placed)
        return 0;
    for (int id = 0; id < srv->max_workers; id++)
        if (srv->workers[id].state == W_ADDED && srv->workers[id].placed)
            return 0;
    return 1;
}

/* Elastic: forms the next generation once every worker added and not
 * removed waits and there are min_np of them. */
static void check_formation(hvd_rdv_server *srv) {
    int live = 0, waiting = 0;

    /* Once no worker that was ever placed is left, nobody holds the
     * training state: a generation of new workers only would start from
     * scratch without anyone noticing (horovodrun's driver refuses too). */
    if (!srv->elastic || srv->ended || hvd_rdv_server_state_lost(srv))
        return;
    for (int id = 0; id < srv->max_workers; id++) {
        if (srv->workers[id].state != W_ADDED)
            continue;
        live++;
        waiting += srv->workers[id].waiting;
    }
    if (live > 0 && waiting == live && live >= srv->min_np)
        form_generation(srv, live);
}

hvd_status hvd_rdv_server_add_worker(hvd_rdv_server *srv, int worker,
                                     const char *host) {
    rworker *w;

    if (!srv->elastic || worker < 0 || worker >= srv->max_workers)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "worker id %d is outside 0..%d of this elastic "
                             "rendezvous",
                             worker, srv->max_workers - 1);
    w = &srv->workers[worker];
    if (w->state != W_NONE)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "worker id %d was added before (ids are never "
                             "reused)",
                             worker);
    w->host = strdup(host != NULL ? host : "");
    if (w->host == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    w->state = W_ADDED;
    HVD_DEBUG("rdv", "worker %d on %s added", worker, w->host);
    notify_members(srv);
    check_formation(srv);
    return HVD_OK;
}

void hvd_rdv_server_remove_worker(hvd_rdv_server *srv, int worker,
                                  const char *why) {
    rworker *w;
    char sentence[256];

    if (!srv->elastic || worker < 0 || worker >= srv->max_workers ||
        srv->workers[worker].state != W_ADDED)
        return;
    w = &srv->workers[worker];
    w->state = W_REMOVED;
    w->waiting = 0;
    snprintf(w->why, sizeof(w->why), "%s",
             why != NULL && why[0] ? why : "no reason given");
    HVD_INFO("rdv", "worker %d on %s removed: %s", worker, w->host, w->why);
    if (w->rank >= 0)
        member_leave(srv, worker, w->rank);
    if (w->conn >= 0) {
        snprintf(sentence, sizeof(sentence),
                 "worker %d was removed from the job (%s); it is not "
                 "re-admitted",
                 worker, w->why);
        hvd_rdv_conn_fail(srv, &srv->conns[w->conn], HVD_ERR_AUTH, sentence);
    }
    notify_members(srv);
    check_formation(srv);
}

uint32_t hvd_rdv_server_generation(const hvd_rdv_server *srv) {
    return srv->generation;
}

int hvd_rdv_server_workers(const hvd_rdv_server *srv) {
    int n = 0;

    for (int id = 0; id < srv->max_workers; id++)
        n += srv->workers[id].state == W_ADDED;
    return n;
}

int hvd_rdv_server_waiting(const hvd_rdv_server *srv) {
    int n = 0;

    for (int id = 0; id < srv->max_workers; id++)
        n += srv->workers[id].state == W_ADDED && srv->workers[id].waiting;
    return n;
}

int hvd_rdv_server_worker_waiting(const hvd_rdv_server *srv, int worker) {
    return srv->elastic && worker >= 0 && worker < srv->max_workers &&
           srv->workers[worker].state == W_ADDED &&
           srv->workers[worker].waiting;
}

int hvd_rdv_server_worker_member(const hvd_rdv_server *srv, int worker) {
    return srv->elastic && worker >= 0 && worker < srv->max_workers &&
           srv->workers[worker].state == W_ADDED &&
           srv->workers[worker].rank >= 0 && !srv->gen_dead;
}

void hvd_rdv_server_end(hvd_rdv_server *srv, const char *why) {
    if (!srv->elastic)
        return;
    srv->ended = 1;
    snprintf(srv->end_why, sizeof(srv->end_why), "%s",
             why != NULL && why[0] ? why : "the job is ending");
    HVD_INFO("rdv", "the job ends: %s", srv->end_why);
    for (int id = 0; id < srv->max_workers; id++) {
        rworker *w = &srv->workers[id];
        if (w->waiting && w->conn >= 0)
            hvd_rdv_conn_fail(srv, &srv->conns[w->conn], HVD_ERR_SHUTDOWN,
                              srv->end_why);
    }
}

/* Elastic: c authenticated as worker c->worker. */
void hvd_rdv_elastic_admitted(hvd_rdv_server *srv, rconn *c) {
    int idx = (int)(c - srv->conns);
    char sentence[256];
    rworker *w;

    c->state = RC_READY;
    c->counted = 1;
    srv->joined++;
    hvd_rdv_conn_watch(srv, c, EPOLLIN);
    if (c->worker >= srv->max_workers ||
        srv->workers[c->worker].state == W_NONE) {
        snprintf(sentence, sizeof(sentence),
                 "worker %d was never added to the job by the launcher; it "
                 "is not admitted (hvdrun sets HVD_ELASTIC_WORKER)",
                 c->worker);
        HVD_WARN("rdv", "refused connection from %s: %s", c->name, sentence);
        c->worker = -1;
        hvd_rdv_conn_fail(srv, c, HVD_ERR_AUTH, sentence);
        return;
    }
    w = &srv->workers[c->worker];
    if (w->state == W_REMOVED) {
        snprintf(sentence, sizeof(sentence),
                 "worker %d was removed from the job (%s); it is not "
                 "re-admitted",
                 c->worker, w->why);
        HVD_WARN("rdv", "refused connection from %s: %s", c->name, sentence);
        c->worker = -1;
        hvd_rdv_conn_fail(srv, c, HVD_ERR_AUTH, sentence);
        return;
    }
    /* A process joins again (hvd_init after hvd_shutdown, or
     * hvd_elastic_reset): its old connection goes, and it leaves its
     * generation. */
    if (w->conn >= 0) {
        HVD_DEBUG("rdv", "worker %d connected again from %s", c->worker,
                  c->name);
        hvd_rdv_conn_close(srv, &srv->conns[w->conn]);
    }
    if (w->rank >= 0)
        member_leave(srv, c->worker, w->rank);
    w->conn = idx;
    HVD_DEBUG("rdv", "worker %d authenticated from %s", c->worker, c->name);
}

/* Elastic: a Contribute from c. Returns with c possibly closed. */
void hvd_rdv_elastic_message(hvd_rdv_server *srv, rconn *c,
                             const Hvd__Rdv__Contribute *msg) {
    if (msg->join) {
        rworker *w = &srv->workers[c->worker];
        if (c->join_seen || c->rank >= 0) {
            HVD_WARN("rdv", "dropped worker %d at %s: it asked to join twice",
                     c->worker, c->name);
            hvd_rdv_conn_close(srv, c);
            return;
        }
        c->join_seen = 1;
        if (srv->ended) {
            hvd_rdv_conn_fail(srv, c, HVD_ERR_SHUTDOWN, srv->end_why);
            return;
        }
        w->waiting = 1;
        w->keepalive_at = hvd_now_ns();
        hvd_rdv_arm_timer(srv, 1);
        HVD_DEBUG("rdv", "worker %d waits for generation %u (%d of %d)",
                  c->worker, srv->generation + 1, hvd_rdv_server_waiting(srv),
                  hvd_rdv_server_workers(srv));
        check_formation(srv);
        return;
    }
    if (c->rank < 0 || msg->generation != srv->generation) {
        HVD_WARN("rdv",
                 "dropped worker %d at %s: contribution to round %u of "
                 "generation %u while it is not a member of generation %u",
                 c->worker, c->name, msg->round, msg->generation,
                 srv->generation);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (srv->gen_dead) {
        hvd_rdv_conn_fail(srv, c, HVD_ERR_PEERS_CHANGED, srv->dead_why);
        return;
    }
    if (msg->round != srv->round || srv->blobs[c->rank] != NULL ||
        msg->blob.len > HVD_RDV_MAX_BLOB) {
        HVD_WARN("rdv",
                 "dropped worker %d (rank %d) at %s: contribution to round "
                 "%u (%zu bytes) while round %u of generation %u is open",
                 c->worker, c->rank, c->name, msg->round, msg->blob.len,
                 srv->round, srv->generation);
        hvd_rdv_conn_close(srv, c);
        return;
    }
    srv->blobs[c->rank] = malloc(msg->blob.len ? msg->blob.len : 1);
    if (srv->blobs[c->rank] == NULL) {
        HVD_ERROR("rdv", "out of memory");
        hvd_rdv_conn_close(srv, c);
        return;
    }
    if (msg->blob.len)
        memcpy(srv->blobs[c->rank], msg->blob.data, msg->blob.len);
    srv->blob_len[c->rank] = msg->blob.len;
    if (++srv->have == srv->size)
        hvd_rdv_finish_round(srv);
}

/*
 * Elastic: a worker waiting to be placed hears from the server every
 * KEEPALIVE_NS (a notice, which a joining client skips), so that its
 * timeout (HVD_ELASTIC_TIMEOUT_SECONDS) measures the server's silence, not
 * the wait: it may wait as long as the members take to reach their next
 * commit, while hvdrun lives. Returns the number of waiting workers.
 */
int hvd_rdv_keep_alive(hvd_rdv_server *srv, int64_t now) {
    int waiting = 0;

    if (!srv->elastic || srv->keepalive == NULL)
        return 0;
    for (int id = 0; id < srv->max_workers; id++) {
        rworker *w = &srv->workers[id];
        if (w->state != W_ADDED || !w->waiting || w->conn < 0)
            continue;
        waiting++;
        rconn *c = &srv->conns[w->conn];
        /* Half the period: the sweep's ticks (every KEEPALIVE_NS) need
         * not line up with when the worker began to wait, and a tick just
         * short of a whole period would double the silence. */
        if (now - w->keepalive_at < KEEPALIVE_NS / 2 || c->qlen > 0 ||
            c->state != RC_READY)
            continue;
        c->q[c->qhead] = srv->keepalive;
        srv->keepalive->refs++;
        c->qlen = 1;
        c->out_off = 0;
        w->keepalive_at = now;
        hvd_rdv_conn_flush(srv, c);
    }
    return waiting;
}
