/*
 * How a transport fails for good, in one place for every transport.
 *
 * The first failure wins: it is recorded with its sentence, logged once,
 * and from then on every call of the transport returns it. What failing
 * means besides (completing every request in flight with the status,
 * telling the peers why, stopping the hardware) is the transport's own
 * fail function; this is the part they share:
 *
 *   hvd_tp_failure    the recorded failure, a member of the transport
 *   hvd_tp_failure_set  records the first one (0 if one was there)
 *   hvd_tp_failure_error  the recorded one as this thread's error
 *   hvd_tp_failf      formats a sentence and calls the fail function
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_FAILURE_H
#define HVD_TRANSPORT_BOOTSTRAP_FAILURE_H

#include "hvd/types.h"
#include "transport/base/error.h"
#include "transport/bootstrap/bootstrap.h"

typedef struct hvd_tp_failure {
    hvd_status status;        /* HVD_OK until the transport fails */
    char text[HVD_ERROR_MAX]; /* this rank's sentence for it */
} hvd_tp_failure;

/*
 * Records a failure if f holds none yet: status, and text as this rank's
 * sentence, or "rank <origin> reported: <text>" when the rank that found
 * it (origin) is not this one (self), so that a relayed cause is named
 * once, not once per hop. Logs the sentence under what (the transport's
 * name). Returns 1 if it was recorded (the caller then fails what is in
 * flight and tells its peers), 0 if f had failed already.
 */
int hvd_tp_failure_set(hvd_tp_failure *f, const char *what, hvd_status status,
                       int self, int origin, const char *text);

/* f's status, with its sentence as this thread's error (HVD_OK: none). */
hvd_status hvd_tp_failure_error(const hvd_tp_failure *f);

/*
 * A transport's fail function: records the failure (hvd_tp_failure_set),
 * fails every request in flight, tells the peers; returns the status the
 * transport now has, with its sentence as this thread's error. text is
 * the sentence of origin, the rank that found the failure; culprit is the
 * rank at fault (-1: none known).
 */
typedef hvd_status (*hvd_tp_fail_fn)(void *tp, hvd_status status, int culprit,
                                     int origin, const char *text);

/* Formats a failure found on this rank (self) and hands it to fail. */
hvd_status hvd_tp_failf(hvd_tp_fail_fn fail, void *tp, int self,
                        hvd_status status, int culprit, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/*
 * Copies the job's host names and pids (size entries each, as a
 * transport's params carry them), when it has them, for a transport's
 * sentences (hvd_tp_describe); the caller frees both copies. Without them
 * (either NULL), or without memory, both are NULL and the sentences say
 * "rank N" only.
 */
void hvd_tp_copy_names(const char (*job_hosts)[HVD_HOST_MAX],
                       const int *job_pids, int size,
                       char (**hosts)[HVD_HOST_MAX], int **pids);

/*
 * Writes how a transport names peer in its sentences into out: "rank 3
 * (pid 1234 on host-a)", "rank 3" when host is NULL or pid < 0 (not
 * known yet), "an unknown peer" when peer is not in [0, size).
 */
void hvd_tp_describe(char *out, size_t outlen, int peer, int size,
                     const char *host, int pid);

/*
 * Fails the transport because peer (described by who, e.g. "rank 1 on
 * host a") sent nothing, not even a heartbeat, for timeout_ns while this
 * rank (self) waited on it: HVD_ERR_TIMEOUT with culprit peer, in the one
 * sentence every transport uses. Returns what fail returns.
 */
hvd_status hvd_tp_fail_stalled(hvd_tp_fail_fn fail, void *tp, int self,
                               int peer, const char *who, int64_t timeout_ns);

#endif
