/*
 * The coordinator: rank 0's table of the operations ranks have asked for,
 * by name. An operation is decided once every rank has asked for it (a
 * joined rank counts as having asked for an allreduce): it becomes a
 * response to run, or an error response when ranks disagree on what it is.
 * The stall inspector warns about operations some ranks have not asked for
 * after HVD_STALL_CHECK_SECONDS and, with HVD_STALL_SHUTDOWN_SECONDS,
 * fails them.
 *
 * Pure logic with no I/O besides log lines, so it is unit-tested directly.
 * Times are seconds on any monotonic clock.
 */
#ifndef HVD_API_COORDINATOR_H
#define HVD_API_COORDINATOR_H

#include "api/runtime/engine.pb-c.h"
#include "api/runtime/opdesc.h"
#include "hvd/types.h"

typedef struct hvd_coord hvd_coord;

/* stall_shutdown_s <= 0: stalled operations are only warned about. */
hvd_status hvd_coord_create(int size, double stall_check_s,
                            double stall_shutdown_s, hvd_coord **out);
void hvd_coord_destroy(hvd_coord *coord);

/*
 * Records that rank asks for name, described by desc (copied), submitted
 * age_s seconds before now. A second request for the same name from the
 * same rank replaces the first.
 */
hvd_status hvd_coord_add(hvd_coord *coord, int rank, const char *name,
                         const hvd_opdesc *desc, double age_s, double now);

/*
 * Appends to list every response decided at time now, in the order the
 * operations were first asked for. Entries of list are allocated here and
 * released by hvd_coord_free_responses.
 */
hvd_status hvd_coord_collect(hvd_coord *coord, double now,
                             Hvd__Engine__ResponseList *list);

/*
 * Records that rank has called hvd_shutdown (it submits nothing more and
 * has nothing in flight): from the next hvd_coord_collect on, every
 * operation it has not asked for, and a join it has not joined, fail with
 * HVD_ERR_SHUTDOWN on the ranks that asked, naming it, instead of waiting
 * for it.
 */
void hvd_coord_stopped(hvd_coord *coord, int rank);

/* Frees what hvd_coord_collect added to list and empties it. */
void hvd_coord_free_responses(Hvd__Engine__ResponseList *list);

/* When the stall inspector next has something to do (a time comparable to
 * now), or a negative value if nothing is waiting. */
double hvd_coord_next_deadline(const hvd_coord *coord);

/* Operations waiting in the table. */
int hvd_coord_pending(const hvd_coord *coord);

/* Ranks that have called hvd_join and wait for the others to. */
int hvd_coord_joined(const hvd_coord *coord);

#endif
