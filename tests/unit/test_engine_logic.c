/* The engine's pure parts: the coordinator's decisions (readiness,
 * mismatches, join, a rank that stopped, the stall inspector) and the response
 * cache (slots, updates, deterministic LRU eviction), plus the name map. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/cache.h"
#include "api/runtime/coordinator.h"
#include "api/runtime/namemap.h"
#include "transport/base/log.h"

static hvd_opdesc ar(const uint64_t *count, hvd_dtype dt, hvd_op op) {
    hvd_opdesc d = {.kind = HVD_KIND_ALLREDUCE,
                    .dtype = dt,
                    .op = op,
                    .ncounts = 1,
                    .counts = count};
    return d;
}

static const Hvd__Engine__Response *find(const Hvd__Engine__ResponseList *l,
                                         const char *name) {
    for (size_t i = 0; i < l->n_responses; i++)
        if (strcmp(l->responses[i]->name, name) == 0)
            return l->responses[i];
    return NULL;
}

static void ready_only_when_all_ranks_ask(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t n = 10;
    hvd_opdesc d = ar(&n, HVD_FLOAT32, HVD_SUM);

    assert_int_equal(hvd_coord_create(3, 0, 0, &c), HVD_OK);
    assert_int_equal(hvd_coord_add(c, 0, "a", &d, 0, 1.0), HVD_OK);
    assert_int_equal(hvd_coord_add(c, 2, "a", &d, 0, 1.0), HVD_OK);
    assert_int_equal(hvd_coord_add(c, 1, "b", &d, 0, 1.0), HVD_OK);
    assert_int_equal(hvd_coord_collect(c, 1.0, &l), HVD_OK);
    assert_int_equal(l.n_responses, 0);
    assert_int_equal(hvd_coord_pending(c), 2);

    /* Ranks ask in different orders; responses come in first-asked
     * order. */
    hvd_coord_add(c, 0, "b", &d, 0, 2.0);
    hvd_coord_add(c, 2, "b", &d, 0, 2.0);
    hvd_coord_add(c, 1, "a", &d, 0, 2.0);
    assert_int_equal(hvd_coord_collect(c, 2.0, &l), HVD_OK);
    assert_int_equal(l.n_responses, 2);
    assert_string_equal(l.responses[0]->name, "a");
    assert_string_equal(l.responses[1]->name, "b");
    assert_int_equal(l.responses[0]->status, HVD_OK);
    assert_int_equal(l.responses[0]->contributors, 3);
    assert_int_equal(l.responses[0]->counts[0], 10);
    assert_int_equal(hvd_coord_pending(c), 0);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

static void mismatches_name_every_rank(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t n10 = 10, n11 = 11;
    hvd_opdesc a = ar(&n10, HVD_FLOAT32, HVD_SUM);
    hvd_opdesc b = ar(&n11, HVD_FLOAT32, HVD_SUM);
    hvd_opdesc d = ar(&n10, HVD_INT32, HVD_SUM);
    hvd_opdesc o = ar(&n10, HVD_FLOAT32, HVD_MAX);

    hvd_coord_create(2, 0, 0, &c);
    hvd_coord_add(c, 0, "count", &a, 0, 0);
    hvd_coord_add(c, 1, "count", &b, 0, 0);
    hvd_coord_add(c, 0, "dtype", &a, 0, 0);
    hvd_coord_add(c, 1, "dtype", &d, 0, 0);
    hvd_coord_add(c, 0, "op", &a, 0, 0);
    hvd_coord_add(c, 1, "op", &o, 0, 0);
    hvd_coord_add(c, 0, "same", &a, 0, 0);
    hvd_coord_add(c, 1, "same", &a, 0, 0);
    assert_int_equal(hvd_coord_collect(c, 0, &l), HVD_OK);
    assert_int_equal(l.n_responses, 4);
    const Hvd__Engine__Response *r = find(&l, "count");
    assert_int_equal(r->status, HVD_ERR_MISMATCH);
    assert_string_equal(r->error,
                        "ranks disagree on 'count': rank 0: allreduce float32 "
                        "sum count 10; rank 1: allreduce float32 sum count 11");
    assert_int_equal(find(&l, "dtype")->status, HVD_ERR_MISMATCH);
    assert_non_null(strstr(find(&l, "dtype")->error, "int32"));
    assert_int_equal(find(&l, "op")->status, HVD_ERR_MISMATCH);
    assert_non_null(strstr(find(&l, "op")->error, "max"));
    assert_int_equal(find(&l, "same")->status, HVD_OK);
    hvd_coord_free_responses(&l);

    /* Kind and root count too. */
    hvd_opdesc bc0 = {.kind = HVD_KIND_BROADCAST,
                      .dtype = HVD_FLOAT32,
                      .root = 0,
                      .ncounts = 1,
                      .counts = &n10};
    hvd_opdesc bc1 = bc0;
    bc1.root = 1;
    hvd_coord_add(c, 0, "root", &bc0, 0, 0);
    hvd_coord_add(c, 1, "root", &bc1, 0, 0);
    hvd_coord_add(c, 0, "kind", &bc0, 0, 0);
    hvd_coord_add(c, 1, "kind", &a, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(find(&l, "root")->status, HVD_ERR_MISMATCH);
    assert_non_null(strstr(find(&l, "root")->error, "root 1"));
    assert_int_equal(find(&l, "kind")->status, HVD_ERR_MISMATCH);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

/* Ranks of an alltoall send their own counts: they agree on the rest (the
 * dtype, the memory, one count for each rank). A reducescatter's op and
 * shape count as an allreduce's. */
static void alltoall_and_reducescatter(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t s0[2] = {3, 0}, s1[2] = {1, 7}, n8 = 8;
    hvd_opdesc a0 = {.kind = HVD_KIND_ALLTOALL,
                     .dtype = HVD_FLOAT32,
                     .ncounts = 2,
                     .counts = s0};
    hvd_opdesc a1 = a0, a1i = a0;
    a1.counts = s1;
    a1i.counts = s1;
    a1i.dtype = HVD_INT32;
    hvd_opdesc rs = {.kind = HVD_KIND_REDUCESCATTER,
                     .dtype = HVD_FLOAT32,
                     .op = HVD_SUM,
                     .ncounts = 1,
                     .counts = &n8};
    hvd_opdesc rs_max = rs;
    rs_max.op = HVD_MAX;

    assert_true(hvd_opdesc_agree(&a0, &a1));
    assert_false(hvd_opdesc_equal(&a0, &a1));
    assert_false(hvd_opdesc_agree(&a0, &a1i));
    assert_false(hvd_opdesc_agree(&rs, &rs_max));
    hvd_coord_create(2, 0, 0, &c);
    hvd_coord_add(c, 0, "a2a", &a0, 0, 0);
    hvd_coord_add(c, 1, "a2a", &a1, 0, 0);
    hvd_coord_add(c, 0, "a2a.dtype", &a0, 0, 0);
    hvd_coord_add(c, 1, "a2a.dtype", &a1i, 0, 0);
    hvd_coord_add(c, 0, "rs", &rs, 0, 0);
    hvd_coord_add(c, 1, "rs", &rs_max, 0, 0);
    assert_int_equal(hvd_coord_collect(c, 0, &l), HVD_OK);
    assert_int_equal(find(&l, "a2a")->status, HVD_OK);
    assert_int_equal(find(&l, "a2a")->n_counts, 2);
    assert_int_equal(find(&l, "a2a.dtype")->status, HVD_ERR_MISMATCH);
    assert_string_equal(find(&l, "a2a.dtype")->error,
                        "ranks disagree on 'a2a.dtype': rank 0: alltoall "
                        "float32 splits 3,0; rank 1: alltoall int32 splits "
                        "1,7");
    assert_int_equal(find(&l, "rs")->status, HVD_ERR_MISMATCH);
    assert_non_null(strstr(find(&l, "rs")->error, "reducescatter float32 max"));
    hvd_coord_free_responses(&l);

    /* While a rank is joined neither can complete (as in Horovod). */
    hvd_opdesc jd = {.kind = HVD_KIND_JOIN, .ncounts = 1, .counts = &n8};
    hvd_coord_add(c, 1, "hvd.join", &jd, 0, 0);
    hvd_coord_add(c, 0, "a2a.joined", &a0, 0, 0);
    hvd_coord_add(c, 0, "rs.joined", &rs, 0, 0);
    assert_int_equal(hvd_coord_collect(c, 0, &l), HVD_OK);
    assert_int_equal(find(&l, "a2a.joined")->status, HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(find(&l, "a2a.joined")->error, "hvd_join"));
    assert_int_equal(find(&l, "rs.joined")->status, HVD_ERR_INVALID_ARG);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

static void join(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t n = 4, zero = 0;
    hvd_opdesc d = ar(&n, HVD_FLOAT32, HVD_AVERAGE);
    hvd_opdesc j = {.kind = HVD_KIND_JOIN, .ncounts = 1, .counts = &zero};
    hvd_opdesc bc = {.kind = HVD_KIND_BROADCAST,
                     .dtype = HVD_FLOAT32,
                     .ncounts = 1,
                     .counts = &n};

    hvd_coord_create(3, 0, 0, &c);
    hvd_coord_add(c, 2, "hvd.join", &j, 0, 0);
    /* Ranks 0 and 1 allreduce without rank 2. */
    hvd_coord_add(c, 0, "g", &d, 0, 0);
    hvd_coord_add(c, 1, "g", &d, 0, 0);
    hvd_coord_add(c, 0, "bc", &bc, 0, 0);
    hvd_coord_add(c, 1, "bc", &bc, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 2);
    const Hvd__Engine__Response *g = find(&l, "g");
    assert_int_equal(g->status, HVD_OK);
    assert_int_equal(g->contributors, 2);
    assert_int_equal(g->n_joined, 1);
    assert_int_equal(g->joined[0], 2);
    /* A broadcast cannot complete without a joined rank. */
    assert_int_equal(find(&l, "bc")->status, HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(find(&l, "bc")->error, "rank(s) 2"));
    hvd_coord_free_responses(&l);
    /* Nor can it once one rank asks: it fails at once (the other may ask
     * under another name, having skipped a call, and would wait). */
    hvd_coord_add(c, 0, "bc2", &bc, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->status, HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(l.responses[0]->error, "rank(s) 2 have"));
    hvd_coord_free_responses(&l);

    /* The join completes once all have joined, naming the last. */
    hvd_coord_add(c, 0, "hvd.join", &j, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 0);
    hvd_coord_add(c, 1, "hvd.join", &j, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->kind, HVD_KIND_JOIN);
    assert_int_equal(l.responses[0]->last_joined, 1);
    assert_int_equal(hvd_coord_pending(c), 0);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

/* A rank that called hvd_shutdown never asks again: what it has not asked
 * for, and a join it has not joined, fail at once naming it; what every
 * rank asked for still runs. */
static void stopped_rank(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t n = 4, zero = 0;
    hvd_opdesc d = ar(&n, HVD_FLOAT32, HVD_SUM);
    hvd_opdesc j = {.kind = HVD_KIND_JOIN, .ncounts = 1, .counts = &zero};

    hvd_coord_create(3, 0, 0, &c);
    for (int r = 0; r < 3; r++)
        hvd_coord_add(c, r, "all", &d, 0, 0);
    hvd_coord_add(c, 0, "without2", &d, 0, 0);
    hvd_coord_add(c, 1, "without2", &d, 0, 0);
    hvd_coord_add(c, 1, "hvd.join", &j, 0, 0);
    hvd_coord_collect(c, 0, &l);
    /* Before rank 2 stops, 'without2' and the join wait for it. */
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(find(&l, "all")->status, HVD_OK);
    hvd_coord_free_responses(&l);
    hvd_coord_stopped(c, 2);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 2);
    assert_int_equal(find(&l, "without2")->status, HVD_ERR_SHUTDOWN);
    assert_non_null(
        strstr(find(&l, "without2")->error, "rank(s) 2 called hvd_shutdown"));
    assert_int_equal(find(&l, "hvd.join")->status, HVD_ERR_SHUTDOWN);
    assert_non_null(strstr(find(&l, "hvd.join")->error, "without joining"));
    assert_int_equal(hvd_coord_pending(c), 0);
    hvd_coord_free_responses(&l);
    /* Asked for by every rank that has not stopped: still fails. */
    hvd_coord_add(c, 0, "later", &d, 0, 0);
    hvd_coord_add(c, 1, "later", &d, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->status, HVD_ERR_SHUTDOWN);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

/* Process sets: a set's creation is decided when every rank of the job
 * asks (it gets the next id), refused for ranks a set has already; a set's
 * operation is decided once its members ask (non-members never do), and
 * fails with a sentence once the set is removed; a stopped member fails
 * it naming that member only. */
static void process_sets(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t members[2] = {0, 2}, other[2] = {1, 2}, n = 4, zero = 0;
    hvd_opdesc mk = {.kind = HVD_KIND_PSET,
                     .op = (hvd_op)HVD_PSET_CREATE,
                     .ncounts = 2,
                     .counts = members};
    hvd_opdesc mk2 = mk, rm = {.kind = HVD_KIND_PSET,
                               .op = (hvd_op)HVD_PSET_REMOVE,
                               .ncounts = 1,
                               .counts = &zero};
    hvd_opdesc d = ar(&n, HVD_FLOAT32, HVD_SUM);

    mk2.counts = other;
    assert_int_equal(hvd_coord_create(3, 0, 0, &c), HVD_OK);
    for (int r = 0; r < 3; r++)
        hvd_coord_add(c, r, "mk.0", &mk, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->status, HVD_OK);
    assert_int_equal(l.responses[0]->created_set, 1);
    hvd_coord_free_responses(&l);
    /* The same ranks again, then other ranks: refused, then id 2. */
    for (int r = 0; r < 3; r++)
        hvd_coord_add(c, r, "mk.1", &mk, 0, 0);
    for (int r = 0; r < 3; r++)
        hvd_coord_add(c, r, "mk.2", &mk2, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 2);
    assert_int_equal(find(&l, "mk.1")->status, HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(find(&l, "mk.1")->error, "exists already (id 1)"));
    assert_int_equal(find(&l, "mk.2")->created_set, 2);
    hvd_coord_free_responses(&l);

    /* Set 1 is ranks 0 and 2: decided without rank 1. */
    d.pset = 1;
    hvd_coord_add(c, 0, "g (process set 1)", &d, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 0);
    hvd_coord_add(c, 2, "g (process set 1)", &d, 0, 0);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->status, HVD_OK);
    assert_int_equal(l.responses[0]->contributors, 2);
    assert_int_equal(l.responses[0]->process_set, 1);
    hvd_coord_free_responses(&l);

    /* Rank 2 stops: set 1's operation fails naming it, not rank 1. */
    hvd_coord_add(c, 0, "h (process set 1)", &d, 0, 0);
    hvd_coord_stopped(c, 1);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 0);
    hvd_coord_stopped(c, 2);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->status, HVD_ERR_SHUTDOWN);
    assert_non_null(strstr(l.responses[0]->error, "rank(s) 2 called"));
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);

    /* Removal: what waits in the set fails; removing it twice too. */
    assert_int_equal(hvd_coord_create(3, 0, 0, &c), HVD_OK);
    for (int r = 0; r < 3; r++)
        hvd_coord_add(c, r, "mk.0", &mk, 0, 0);
    hvd_coord_collect(c, 0, &l);
    hvd_coord_free_responses(&l);
    hvd_coord_add(c, 0, "w (process set 1)", &d, 0, 0);
    rm.root = 1;
    for (int k = 0; k < 2; k++) {
        char name[16];
        snprintf(name, sizeof(name), "rm.%d", k);
        for (int r = 0; r < 3; r++)
            hvd_coord_add(c, r, name, &rm, 0, 0);
    }
    hvd_coord_collect(c, 0, &l);
    hvd_coord_collect(c, 0, &l);
    assert_int_equal(l.n_responses, 3);
    assert_int_equal(find(&l, "rm.0")->status, HVD_OK);
    assert_int_equal(find(&l, "rm.1")->status, HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(find(&l, "rm.1")->error, "no process set 1"));
    assert_int_equal(find(&l, "w (process set 1)")->status,
                     HVD_ERR_INVALID_ARG);
    assert_non_null(
        strstr(find(&l, "w (process set 1)")->error, "does not exist"));
    assert_int_equal(hvd_coord_pending(c), 0);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

static void stall_inspector(void **state) {
    (void)state;
    hvd_coord *c;
    Hvd__Engine__ResponseList l = HVD__ENGINE__RESPONSE_LIST__INIT;
    uint64_t n = 1;
    hvd_opdesc d = ar(&n, HVD_FLOAT32, HVD_SUM);

    hvd_coord_create(3, 2.0, 5.0, &c);
    assert_true(hvd_coord_next_deadline(c) < 0);
    /* Submitted 1 s before it reached rank 0. */
    hvd_coord_add(c, 0, "late", &d, 1.0, 10.0);
    assert_true(hvd_coord_next_deadline(c) == 11.0);
    hvd_coord_collect(c, 10.5, &l);
    assert_int_equal(l.n_responses, 0);
    hvd_coord_collect(c, 11.0, &l); /* warns (log), still waits */
    assert_int_equal(l.n_responses, 0);
    assert_true(hvd_coord_next_deadline(c) == 13.0);
    hvd_coord_collect(c, 14.0, &l);
    assert_int_equal(l.n_responses, 1);
    assert_int_equal(l.responses[0]->status, HVD_ERR_TIMEOUT);
    assert_non_null(strstr(l.responses[0]->error, "rank(s) 1,2"));
    assert_int_equal(hvd_coord_pending(c), 0);
    hvd_coord_free_responses(&l);
    hvd_coord_destroy(c);
}

static void cache_slots_and_updates(void **state) {
    (void)state;
    hvd_cache c;
    uint64_t n1 = 1, n2 = 2;
    hvd_opdesc a = ar(&n1, HVD_FLOAT32, HVD_SUM);
    hvd_opdesc b = ar(&n2, HVD_FLOAT32, HVD_SUM);

    assert_int_equal(hvd_cache_init(&c, 3), 0);
    assert_int_equal(hvd_cache_lookup(&c, "x", hvd_namemap_hash("x")), -1);
    assert_int_equal(hvd_cache_put(&c, "x", &a, 1), 0);
    assert_int_equal(hvd_cache_put(&c, "y", &a, 1), 1);
    assert_int_equal(hvd_cache_lookup(&c, "y", hvd_namemap_hash("y")), 1);
    /* New values replace the old in the same slot. */
    assert_int_equal(hvd_cache_put(&c, "x", &b, 2), 0);
    assert_true(hvd_opdesc_equal(&c.slots[0].desc, &b));
    /* An erased slot is reused before the vector grows. */
    hvd_cache_erase(&c, 0);
    assert_int_equal(hvd_cache_lookup(&c, "x", hvd_namemap_hash("x")), -1);
    assert_int_equal(hvd_cache_put(&c, "z", &a, 3), 0);
    assert_int_equal(c.nslots, 2);
    assert_int_equal(hvd_cache_put(&c, "w", &a, 4), 2);
    assert_int_equal(c.nslots, 3);
    /* Full: the least recently used goes (y, used at 1); touching z keeps
     * it. */
    hvd_cache_touch(&c, 0, 5);
    assert_int_equal(hvd_cache_put(&c, "v", &a, 6), 1);
    assert_int_equal(hvd_cache_lookup(&c, "y", hvd_namemap_hash("y")), -1);
    assert_int_equal(hvd_cache_lookup(&c, "v", hvd_namemap_hash("v")), 1);
    hvd_cache_destroy(&c);

    /* Capacity 0: nothing is cached. */
    assert_int_equal(hvd_cache_init(&c, 0), 0);
    assert_int_equal(hvd_cache_put(&c, "x", &a, 1), -1);
    hvd_cache_destroy(&c);
}

/* Two caches fed the same sequence end up slot-for-slot identical: that
 * is what lets ranks vote by slot number. */
static void cache_is_deterministic(void **state) {
    (void)state;
    hvd_cache c1, c2;
    uint64_t n = 1;
    hvd_opdesc a = ar(&n, HVD_FLOAT32, HVD_SUM);
    char name[32];

    hvd_cache_init(&c1, 8);
    hvd_cache_init(&c2, 8);
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof(name), "t%d", (i * 7) % 23);
        for (int k = 0; k < 2; k++) {
            hvd_cache *c = k ? &c2 : &c1;
            int s = hvd_cache_lookup(c, name, hvd_namemap_hash(name));
            if (s >= 0 && i % 5 == 0)
                hvd_cache_erase(c, s);
            else if (s >= 0)
                hvd_cache_touch(c, s, (uint64_t)i);
            else
                hvd_cache_put(c, name, &a, (uint64_t)i);
        }
    }
    assert_int_equal(c1.nslots, c2.nslots);
    for (int s = 0; s < c1.nslots; s++) {
        if (c1.slots[s].name == NULL) {
            assert_null(c2.slots[s].name);
            continue;
        }
        assert_string_equal(c1.slots[s].name, c2.slots[s].name);
    }
    hvd_cache_destroy(&c1);
    hvd_cache_destroy(&c2);
}

static void namemap(void **state) {
    (void)state;
    hvd_namemap m;
    char key[32];
    static int values[5000];

    hvd_namemap_init(&m);
    assert_null(hvd_namemap_get(&m, "x"));
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(hvd_namemap_put(&m, key, &values[i]), 0);
    }
    for (int i = 0; i < 5000; i += 2) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_ptr_equal(hvd_namemap_remove(&m, key), &values[i]);
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        if (i % 2)
            assert_ptr_equal(hvd_namemap_get(&m, key), &values[i]);
        else
            assert_null(hvd_namemap_get(&m, key));
    }
    /* Removing and adding many times does not fill the table with
     * tombstones. */
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 100; i++) {
            snprintf(key, sizeof(key), "r%d.%d", round, i);
            hvd_namemap_put(&m, key, &values[i]);
        }
        for (int i = 0; i < 100; i++) {
            snprintf(key, sizeof(key), "r%d.%d", round, i);
            hvd_namemap_remove(&m, key);
        }
    }
    assert_int_equal(m.count, 2500);
    assert_true(m.cap <= 16384);
    hvd_namemap_destroy(&m);
}

/* Names that differ only in their length, in one byte past the first
 * word, or in a trailing byte are different keys; a borrowed map keeps the
 * caller's pointers. */
static void namemap_keys(void **state) {
    (void)state;
    static const char *keys[] = {"",
                                 "a",
                                 "aaaaaaa",
                                 "aaaaaaaa",
                                 "aaaaaaaaa",
                                 "aaaaaaaab",
                                 "grad.layer1.weight",
                                 "grad.layer1.weighs",
                                 "grad.layer2.weight",
                                 "grad.layer1.weight.",
                                 "\x01",
                                 "\x01\x01"};
    size_t n = sizeof(keys) / sizeof(keys[0]);
    hvd_namemap copied, borrowed;
    static int values[16];

    hvd_namemap_init(&copied);
    hvd_namemap_init_borrowed(&borrowed);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(hvd_namemap_put(&copied, keys[i], &values[i]), 0);
        assert_int_equal(hvd_namemap_put(&borrowed, keys[i], &values[i]), 0);
    }
    assert_int_equal(copied.count, n);
    assert_int_equal(borrowed.count, n);
    for (size_t i = 0; i < n; i++) {
        char copy[64];
        snprintf(copy, sizeof(copy), "%s", keys[i]);
        assert_ptr_equal(hvd_namemap_get(&copied, copy), &values[i]);
        assert_ptr_equal(hvd_namemap_get(&borrowed, copy), &values[i]);
    }
    /* The borrowed map holds the very pointers it was given. */
    for (size_t i = 0; i < borrowed.cap; i++) {
        const char *k = borrowed.slots[i].key;
        if (k == NULL || borrowed.slots[i].value == NULL)
            continue;
        size_t at = (size_t)((int *)borrowed.slots[i].value - values);
        assert_ptr_equal(k, keys[at]);
    }
    for (size_t i = 0; i < n; i++)
        assert_ptr_equal(hvd_namemap_remove(&borrowed, keys[i]), &values[i]);
    assert_int_equal(borrowed.count, 0);
    hvd_namemap_destroy(&copied);
    hvd_namemap_destroy(&borrowed);
    assert_int_equal(borrowed.borrowed, 1); /* still, for reuse */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ready_only_when_all_ranks_ask),
        cmocka_unit_test(mismatches_name_every_rank),
        cmocka_unit_test(alltoall_and_reducescatter),
        cmocka_unit_test(join),
        cmocka_unit_test(stopped_rank),
        cmocka_unit_test(process_sets),
        cmocka_unit_test(stall_inspector),
        cmocka_unit_test(cache_slots_and_updates),
        cmocka_unit_test(cache_is_deterministic),
        cmocka_unit_test(namemap),
        cmocka_unit_test(namemap_keys),
    };
    hvd_log_current = HVD_LOG_ERROR; /* the stall warnings are expected */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
