/*
 * Which transports a job uses: the registry's choice, made the same way on
 * every rank from what each transport's probe says (caps: usable, reach,
 * priority). No transport is named here or above: adding one is its folder
 * and its entry in transport.c.
 *
 * HVD_TRANSPORT=<name> takes that transport for everything, and fails with
 * a sentence saying why when it cannot serve this job. HVD_TRANSPORT=auto
 * takes, of the transports usable on every rank whose reach covers the job
 * (one host, or several), the one of the highest priority; if opening it
 * fails on any rank, every rank logs why and takes the next. Where a host
 * runs several ranks of a job that spans hosts (or a primary that is not a
 * same-host specialist), auto also opens the best transport that serves
 * only ranks on one host, as the local transport beside the primary
 * (hier's paths, collectives/select.h).
 */
#ifndef HVD_TRANSPORT_CHOOSE_H
#define HVD_TRANSPORT_CHOOSE_H

#include "transport/transport.h"

typedef struct hvd_transport_choice {
    const hvd_transport_ops *ops; /* the primary: between every pair */
    hvd_transport *tp;
    hvd_caps caps;                      /* the primary's, on this rank */
    const hvd_transport_ops *local_ops; /* beside it, within hosts; or NULL */
    hvd_transport *local_tp;
} hvd_transport_choice;

/*
 * Checks an HVD_TRANSPORT value before the job starts: "auto" or the name
 * of a built-in transport. also lists the other values the caller accepts
 * (for the message, e.g. "nccl"). HVD_ERR_UNSUPPORTED for a transport this
 * build lacks, HVD_ERR_INVALID_ARG for an unknown name, each with a
 * sentence.
 */
hvd_status hvd_transport_check_want(const char *want, const char *also);

/*
 * Chooses and opens the job's transports (collective: every rank calls it
 * with the same want, over params->bootstrap, bounded by its timeouts).
 * params->may_fall_back is set here per attempt. On success *out holds the
 * open transports; on failure nothing is left open and *out is untouched.
 */
hvd_status hvd_transport_choose(const char *want,
                                const hvd_transport_params *params,
                                hvd_transport_choice *out);

/* Says goodbye on both transports (local first), as ops->shutdown. */
hvd_status hvd_transport_choice_shutdown(hvd_transport_choice *c);

/* Closes both transports; accepts a choice with none open. */
void hvd_transport_choice_close(hvd_transport_choice *c);

#endif
