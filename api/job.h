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
 * A request of kind for n buffers, for fn: HVD_ERR_NOT_INITIALIZED before
 * hvd_init. A NULL name gets "hvd.<kind>.<k>" for the k-th unnamed
 * operation of its kind, which matches the k-th of every rank. The caller
 * fills in the rest.
 */
hvd_status hvd_job_request(const char *fn, const char *name, hvd_kind kind,
                           int n, hvd_request **req_out);

/* Hands a filled request to the engine; on failure it is freed here. */
hvd_status hvd_job_hand_over(const char *fn, hvd_request *req, hvd_handle *out);

/* The CUDA device of this rank's GPU work, -1: none. */
int hvd_job_gpu_device(void);

#endif
