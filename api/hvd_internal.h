/*
 * Internal entry points for in-tree tools and tests (linked statically;
 * not exported by libhvd).
 */
#ifndef HVD_API_HVD_INTERNAL_H
#define HVD_API_HVD_INTERNAL_H

#include "api/runtime/engine.h"

/*
 * Runs fn(arg, comm) on the engine thread, once every rank has called
 * this with the same name, at the same point of the operation order on
 * every rank; comm is the engine's data communicator. Blocking. hvd-bench
 * uses it to time the bare collectives under the engine.
 */
hvd_status hvd_internal_call(const char *name, hvd_engine_fn fn, void *arg);

#endif
