/*
 * A small engine for the engine's unit tests (test_engine_step.c,
 * test_engine_cycle.c): a zeroed hvd_engine with what the step and the
 * passes read (rank and size, settings, the cache, the process-set table,
 * the step's buffers, control and data communicators, on rank 0 the vote
 * table and the coordinator) over a fake transport. The transport records
 * the receives the engine posts and the messages it sends (each send is
 * done at once); the test plays the other ranks: it completes a posted
 * receive with what a peer would have sent, then the engine pumps it.
 * No thread, no network.
 */
#ifndef HVD_TESTS_UNIT_ENGINE_FAKE_H
#define HVD_TESTS_UNIT_ENGINE_FAKE_H

#include "api/runtime/engine_state.h"

#define EF_MAXRANKS 4
#define EF_MAXPOSTED 4
#define EF_MAXREQS 8
#define EF_SENT_MAX 1024

/* A receive the engine posted. */
typedef struct ef_posted {
    void *buf;
    size_t len; /* upto: the most it takes */
    hvd_req *req;
    int upto; /* irecv_upto */
} ef_posted;

/* What the engine sent one peer: how many times, and the last message's
 * bytes (its first message and the rest, end to end). */
typedef struct ef_sent {
    int nsends; /* isendv calls */
    size_t len;
    uint8_t bytes[EF_SENT_MAX];
} ef_sent;

typedef struct ef_transport {
    hvd_transport base;
    ef_posted posted[EF_MAXRANKS][EF_MAXPOSTED]; /* by peer, oldest first */
    int nposted[EF_MAXRANKS];
    ef_sent sent[EF_MAXRANKS];
} ef_transport;

typedef struct ef_engine {
    ef_transport tp;
    hvd_engine *eng;
    hvd_request *reqs[EF_MAXREQS]; /* freed at the end */
    int nreqs;
} ef_engine;

/* Rank rank of size, a cache of capacity slots, ports open: 0 or -1. */
int ef_setup(ef_engine *ef, int rank, int size, int capacity);
void ef_teardown(ef_engine *ef);

/* Puts name (an allreduce of n floats, summed, in the job) in the cache
 * (cycle 1): its slot. */
int ef_cache(ef_engine *ef, const char *name, uint64_t n);

/* A request for name (an allreduce of n floats from send into recv),
 * taken in by the engine: pending, and cached if the cache knows it. */
hvd_request *ef_request(ef_engine *ef, const char *name, uint64_t n,
                        const float *send, float *recv);

/*
 * Delivers peer's part of step number as that peer sends it: a Step
 * offering ready, carrying the data of carried (data, dlen bytes, each
 * tensor padded to 8), and with rank 0's decision dec (or NULL); the
 * engine takes it in (hvd_eng_pump).
 */
void ef_peer_step(ef_engine *ef, int peer, uint64_t number,
                  const uint32_t *ready, size_t nready, const uint32_t *carried,
                  size_t ncarried, const void *data, size_t dlen,
                  Hvd__Engine__Cycle *dec);

/* The header of the last message the engine sent peer. */
msg_header ef_sent_header(const ef_engine *ef, int peer);

#endif
