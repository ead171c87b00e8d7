/*
 * What the collectives' entry points (api/call.c) need of the job that
 * api/hvd.c sets up and owns: handing a request to the engine, process
 * sets, and this rank's GPU. Every call is thread-safe.
 */
#ifndef HVD_API_JOB_H
#define HVD_API_JOB_H

#include "api/runtime/engine.h"
#include "hvd/hvd.h"

/*
 * Names fn's request (its caller's name, else the next unnamed one of its
 * kind and set; in a set the set is part of the name) and hands it to the
 * engine's one entry (hvd_engine_submit), which says in *express whether
 * this thread runs it at once. HVD_ERR_NOT_INITIALIZED before hvd_init.
 * On failure req is still the caller's and the sentence is set.
 */
hvd_status hvd_job_submit(const char *fn, const char *name, hvd_request *req,
                          int *express);

/*
 * Process set ps for fn's call: its members (*size) and this rank's place
 * among them (*index), or a sentence if there is no such set or this rank
 * is not in it.
 */
hvd_status hvd_job_pset(const char *fn, const char *name, int ps, int *size,
                        int *index);

/* The CUDA device of this rank's GPU work, -1: none. */
int hvd_job_gpu_device(void);

#endif
