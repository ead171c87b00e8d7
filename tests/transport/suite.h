/*
 * One suite for every transport: what transport/transport.h promises,
 * checked the same way against each (as UCX instantiates one test suite
 * for all its transports). A transport that passes it can serve the
 * engine. The cases are in suite.c; a driver starts the ranks of a job:
 *
 *   test_transport.c        tcp, shm: forks NP processes, the parent is
 *                           their bootstrap
 *   test_transport_mpi.c    mpi: one process per rank under mpirun, MPI
 *                           is the bootstrap
 *   test_transport_fake.c   verbs over the fake libibverbs
 *                           (tests/unit/verbs_fake.h): one thread per rank
 *
 * Each case runs in a fresh job (a new open on every rank):
 *
 *   order     every size from 0 bytes to 1 MiB + 3 (odd ones included), on
 *             both channels, to every peer and from every peer, receives
 *             posted before and after the sends; contents and order exact
 *   sendv     isendv (or isends where a transport lacks it): batches of
 *             every size behind a queued send, each message matched by its
 *             own receive, in order, contents exact
 *   control   a control-channel ping-pong of 200 rounds completes while a
 *             64 MiB data message waits for its receive (the channels are
 *             independent)
 *   wake      a progress call waiting with nothing to do (-1) returns soon
 *             after wake() from another thread
 *   mismatch  a receive of 16 bytes meets a send of 8: a fatal error on
 *             the receiver, every request in flight completes with it, and
 *             the other ranks hear of it (no hang)
 *   kill      the last rank leaves (no goodbye) while every other rank has
 *             receives in flight from every peer: each of them gets an
 *             error naming it within the transport's timeout, and every
 *             request completes
 *   pending   messages sent but never received, then shutdown on every
 *             rank: it returns, bounded, and close frees what is queued
 *   zeros     messages of 1 byte to past a shared-memory cell whose ends
 *             are zero bytes, from none to all of them, on both channels:
 *             contents exact, nothing written past the end
 *   upto      control messages of 0 bytes to HVD_UPTO_MAX, received by
 *             irecv_upto with caps from their length to the most and by
 *             exact irecvs among them, posted before and after the sends,
 *             some sent in a batch: lengths reported, contents exact,
 *             nothing written past the message
 *   upto_long a message longer than the irecv_upto's cap: a mismatch on
 *             the receiver naming the sender, the others hear of it
 */
#ifndef HVD_TESTS_TRANSPORT_SUITE_H
#define HVD_TESTS_TRANSPORT_SUITE_H

#include "transport/transport.h"

enum { SUITE_MAX_RANKS = 8, SUITE_TIMEOUT_S = 5 };

/* One rank of a job, as its driver set it up. */
typedef struct suite_rank {
    const char *transport; /* its name, for messages */
    int rank, size;
    const hvd_transport_ops *ops;
    hvd_transport *tp; /* open; NULL once the rank has left */
    /* Leaves the job without a goodbye, as a killed process does: a
     * process exits; a thread closes its transport (tp becomes NULL). */
    void (*leave)(struct suite_rank *r);
} suite_rank;

typedef struct suite_case {
    const char *name;
    void (*run)(suite_rank *r);
    int needs; /* ranks it needs */
    int fatal; /* leaves the transport failed: no shutdown after it */
} suite_case;

extern const suite_case suite_cases[];
extern const int suite_ncases;

/* The case named name, or NULL. */
const suite_case *suite_find(const char *name);

/*
 * Whether case i is to run at np ranks: named among names[0..n) (all when
 * n is 0) and np is enough for it.
 */
int suite_wanted(int i, int np, char **names, int n);

/*
 * The parameters every driver opens with: rank, size, bootstrap, the
 * timeouts, a job id and secret, and the test's settings (two sockets
 * per pair for tcp, host memory only for verbs). hosts and pids are the
 * driver's (tables of size entries, or NULL).
 */
void suite_params(hvd_transport_params *p, int rank, int size,
                  hvd_bootstrap *bs, const char (*hosts)[HVD_HOST_MAX],
                  const int *pids, unsigned job);

/*
 * Runs case tc on r (open), then shuts down (unless the case is fatal or
 * the rank left) and closes. Returns 0; a failure prints its reason
 * ("FAIL transport T CASE rank R: ...") and exits the process with 1.
 */
int suite_run(suite_rank *r, const suite_case *tc);

/* Prints the failure of the calling rank's case and exits with 1. */
void suite_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
