/*
 * What the collectives' entry points (api/submit.c) need of the job that
 * api/hvd.c sets up and owns: a new request, handing it to the engine, and
 * this rank's GPU. Every call is thread-safe.
 */
#ifndef HVD_API_JOB_H
#define HVD_API_JOB_H

#include "api/runtime/engine.h"
#include "hvd/hvd.h"

/*
 * A request of kind for n buffers in process set ps (0: the job), for fn:
 * HVD_ERR_NOT_INITIALIZED before hvd_init. A NULL name gets
 * "hvd.<kind>.<k>" for the k-th unnamed operation of its kind (in its
 * set), which matches the k-th of every rank (of the set). In a set, the
 * request's name is "<name> (process set <ps>)": names are the set's own.
 * The caller fills in the rest.
 */
hvd_status hvd_job_request(const char *fn, const char *name, hvd_kind kind,
                           int ps, int n, hvd_request **req_out);

/*
 * Process set ps for fn's call: its members (*size) and this rank's place
 * among them (*index), or a sentence if there is no such set or this rank
 * is not in it.
 */
hvd_status hvd_job_pset(const char *fn, const char *name, int ps, int *size,
                        int *index);

/* Hands a filled request to the engine; on failure it is freed here. */
hvd_status hvd_job_hand_over(const char *fn, hvd_request *req, hvd_handle *out);

/*
 * A blocking call's filled request (on the caller's stack) run at once by
 * this thread if the engine is free (hvd_engine_express_enter): 1 with its
 * outcome in *st (the sentence set on failure, without the call's prefix);
 * 0 if it must go the usual way (hvd_job_request, hvd_job_hand_over).
 */
int hvd_job_express(hvd_request *req, hvd_status *st);

/* The CUDA device of this rank's GPU work, -1: none. */
int hvd_job_gpu_device(void);

#endif
