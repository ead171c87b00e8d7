/*
 * The public API's lifecycle: init and shutdown (the job's setup itself is
 * api/runtime/setup.c: the bootstrap, the transports, the GPU, the paths;
 * then the engine), the job's shape, the timeline and the build's parts.
 * It owns the job's state; the collectives' entry points (api/submit.c)
 * reach it through api/job.h.
 */
#include "hvd/hvd.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api/hvd_internal.h"
#include "api/job.h"
#include "api/runtime/engine.h"
#include "api/runtime/setup.h"
#include "api/runtime/timeline.h"
#include "collectives/coll.h"
#include "collectives/select.h"
#include "gpu/gpu.h"
#include "transport/base/dtype.h"
#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/transport.h"

static struct {
    pthread_mutex_t lock;
    int initialized;
    hvd_setup job; /* api/runtime/setup.h */
    hvd_engine *engine;
    uint64_t unnamed[HVD_KIND_COUNT]; /* counters naming NULL-named ops */
    uint64_t *ps_unnamed; /* and in process sets: HVD_KIND_COUNT per id */
    int nps_unnamed;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .job.gpu_device = -1};

const char *hvd_last_error(void) { return hvd_error_get(); }

/* Prefixes the failure of hvd_init with who failed: the rank, the
 * elastic worker, or before discovery knew either (a bad setting), the
 * rank the launcher's environment names, else "rank ?". */
static void label_failure(void) {
    const char *name = "HVD_RANK";
    const char *text = hvd_env_lookup(hvd_env_getenv, NULL, &name);
    char *end = NULL;
    long rank = text != NULL ? strtol(text, &end, 10) : -1;

    if (g.job.info.elastic && g.job.info.rank < 0)
        hvd_error_prefix("hvd_init (worker %d): ", g.job.info.worker);
    else if (g.job.info.rank >= 0)
        hvd_error_prefix("hvd_init (rank %d): ", g.job.info.rank);
    else if (text != NULL && end != text && *end == '\0' && rank >= 0 &&
             rank <= INT32_MAX)
        hvd_error_prefix("hvd_init (rank %ld): ", rank);
    else
        hvd_error_prefix("hvd_init (rank ?): ");
}

/* hvd_init under the lock, one try. An elastic worker first joins the
 * rendezvous's next generation, which tells it its rank and size. */
static hvd_status init_once(void) {
    hvd_engine_config ec;
    hvd_status st;

    /* Not known until discovery succeeds: a failure before then must not
     * name the rank of an earlier hvd_init, or rank 0. */
    g.job.info.rank = -1;
    g.job.info.elastic = 0;
    g.job.info.worker = -1;
    st = hvd_log_init_from_env();
    if (st == HVD_OK)
        st = hvd_config_load(hvd_env_getenv, NULL, &g.job.cfg);
    if (st == HVD_OK)
        st = hvd_discover(hvd_env_getenv, NULL, &g.job.info);
    if (st == HVD_OK && g.job.info.elastic)
        st = hvd_setup_elastic_join(&g.job);
    if (st != HVD_OK)
        goto fail;
    hvd_log_set_rank(g.job.info.rank);
    g.job.tp_mem_types = 0;
    g.job.homogeneous = 1;
    st = hvd_setup_gpu(&g.job);
    if (st != HVD_OK)
        goto fail;
    if (g.job.info.size > 1) {
        st = hvd_setup_job(&g.job);
        if (st != HVD_OK)
            goto fail;
    }
    hvd_setup_engine_config(&g.job, &ec);
    st = hvd_engine_start(
        g.job.info.rank, g.job.info.size, g.job.tps.tp, &g.job.cfg.comm,
        g.job.have_paths ? &g.job.paths : NULL, &ec, &g.engine);
    if (st != HVD_OK)
        goto fail;
    memset(g.unnamed, 0, sizeof(g.unnamed));
    free(g.ps_unnamed);
    g.ps_unnamed = NULL;
    g.nps_unnamed = 0;
    g.initialized = 1;
    return HVD_OK;
fail:
    hvd_setup_close(&g.job);
    label_failure();
    HVD_ERROR("api", "%s", hvd_error_get());
    hvd_log_set_rank(-1);
    return st;
}

/* Whether an elastic worker tries again: its generation lost a member
 * while it was being set up (the rendezvous abandoned it, or a peer went
 * away while the transports connected). */
static int join_again(hvd_status st) {
    return st == HVD_ERR_PEERS_CHANGED || st == HVD_ERR_PEER_LOST ||
           st == HVD_ERR_TRANSPORT || st == HVD_ERR_PROTOCOL ||
           st == HVD_ERR_TIMEOUT;
}

#define ELASTIC_MAX_TRIES 64

static hvd_status init_locked(void) {
    hvd_status st = init_once();
    int tries = 1;

    /* A failure of the join itself (no rank yet) is final: the server
     * was not reached within HVD_ELASTIC_TIMEOUT_SECONDS, went away, or
     * said why (the sentence tells); only a generation that failed while
     * it was set up is worth joining again. */
    while (st != HVD_OK && g.job.info.elastic && g.job.info.rank >= 0 &&
           join_again(st) && tries < ELASTIC_MAX_TRIES) {
        HVD_INFO("api",
                 "worker %d: generation lost a member while it was "
                 "set up (%s); joining the next",
                 g.job.info.worker, hvd_error_get());
        st = init_once();
        tries++;
    }
    if (st != HVD_OK && g.job.info.elastic && g.job.info.rank >= 0 &&
        join_again(st) && st != HVD_ERR_TIMEOUT) {
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        st = hvd_error_set(HVD_ERR_PEERS_CHANGED, "%s", text);
    }
    return st;
}

hvd_status hvd_init(void) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized)
        st = init_locked();
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* hvd_shutdown under the lock; reset: for hvd_elastic_reset (what is
 * pending fails with HVD_ERR_PEERS_CHANGED). */
static hvd_status shutdown_locked(int reset) {
    hvd_status st;

    /* Every rank leaves the engine together; then the transport says
     * goodbye, unless the job failed (nothing orderly is left to do). */
    if (reset)
        hvd_engine_mark_reset(g.engine);
    st = hvd_engine_stop(g.engine);
    g.engine = NULL;
    if (g.job.tps.tp != NULL && st == HVD_OK)
        st = hvd_setup_goodbye(&g.job);
    hvd_setup_close(&g.job);
    /* What outlives the transports learns how the job ended (MPI, if hvd
     * initialized it, is finalized at exit, and only after an orderly
     * end). */
    hvd_transport_at_shutdown(st == HVD_OK);
    g.initialized = 0;
    hvd_log_set_rank(-1);
    return st;
}

hvd_status hvd_shutdown(void) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&g.lock);
    if (g.initialized)
        st = shutdown_locked(0);
    pthread_mutex_unlock(&g.lock);
    return st;
}

int hvd_elastic_enabled(void) {
    const char *on = hvd_env_getenv("HVD_ELASTIC", NULL);

    return on != NULL && strcmp(on, "1") == 0;
}

hvd_status hvd_elastic_reset(void) {
    hvd_status st;

    if (!hvd_elastic_enabled())
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "hvd_elastic_reset: this job is not elastic "
                             "(start it with hvdrun --min-np/--max-np/"
                             "--host-discovery-script)");
    pthread_mutex_lock(&g.lock);
    /* The old generation ends here whatever state it is in: a failed
     * engine stops at once, a healthy one with the ranks that reset too
     * (bounded by HVD_TIMEOUT_SECONDS). Its status does not matter. */
    if (g.initialized)
        (void)shutdown_locked(1);
    st = init_locked();
    if (st != HVD_OK)
        hvd_error_prefix("hvd_elastic_reset: ");
    pthread_mutex_unlock(&g.lock);
    return st;
}

int hvd_elastic_hosts_updated(void) {
    char saved[HVD_ERROR_MAX];
    int n = 0;

    /* A question, not an operation: hvd_last_error() stays the caller's
     * (a broken rendezvous connection sets a sentence, and shows up as
     * the next operation's failure anyway). */
    snprintf(saved, sizeof(saved), "%s", hvd_error_get());
    pthread_mutex_lock(&g.lock);
    if (g.initialized && g.job.info.elastic)
        n = hvd_setup_elastic_updates(&g.job);
    pthread_mutex_unlock(&g.lock);
    if (n < 0)
        hvd_error_copy(HVD_OK, saved);
    return n > 0;
}

int hvd_elastic_generation(void) {
    if (!g.initialized)
        return -1;
    return g.job.info.elastic ? (int)g.job.generation - 1 : 0;
}

int hvd_initialized(void) { return g.initialized; }

int hvd_is_homogeneous(void) { return g.initialized ? g.job.homogeneous : -1; }

hvd_status hvd_start_timeline(const char *path, int mark_cycles) {
    hvd_timeline *tl = NULL;
    hvd_status st = HVD_OK;

    if (path == NULL || path[0] == '\0')
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_start_timeline: no file name");
    pthread_mutex_lock(&g.lock);
    if (!g.initialized)
        st = hvd_error_set(HVD_ERR_NOT_INITIALIZED,
                           "hvd_start_timeline: hvd is not initialized");
    else if (g.job.info.rank == 0)
        st = hvd_timeline_open(path, &tl);
    if (st == HVD_OK && tl != NULL)
        hvd_engine_set_timeline(g.engine, tl, mark_cycles != 0);
    pthread_mutex_unlock(&g.lock);
    return st;
}

hvd_status hvd_stop_timeline(void) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized)
        st = hvd_error_set(HVD_ERR_NOT_INITIALIZED,
                           "hvd_stop_timeline: hvd is not initialized");
    else if (g.job.info.rank == 0)
        hvd_engine_set_timeline(g.engine, NULL, 0);
    pthread_mutex_unlock(&g.lock);
    return st;
}

int hvd_nccl_version(void) { return hvd_gpu_nccl_version(); }

int hvd_built(const char *part) {
    if (part == NULL)
        return 0;
    if (hvd_transport_find(part) != NULL)
        return 1;
    if (strcmp(part, "cuda") == 0)
        return hvd_gpu_built() && !hvd_gpu_simulated();
    if (strcmp(part, "nccl") == 0)
        return hvd_gpu_nccl_built();
    return 0;
}

int hvd_rank(void) { return g.initialized ? g.job.info.rank : -1; }

int hvd_size(void) { return g.initialized ? g.job.info.size : -1; }

int hvd_local_rank(void) { return g.initialized ? g.job.info.local_rank : -1; }

int hvd_local_size(void) { return g.initialized ? g.job.info.local_size : -1; }

int hvd_cross_rank(void) { return g.initialized ? g.job.info.cross_rank : -1; }

int hvd_cross_size(void) { return g.initialized ? g.job.info.cross_size : -1; }

hvd_status hvd_path(const char *collective, size_t bytes, hvd_dtype dtype,
                    char *out, size_t outlen) {
    static const char *const kinds[HVD_COLL_NKINDS] = {
        [HVD_COLL_ALLREDUCE] = "allreduce",
        [HVD_COLL_ALLGATHER] = "allgather",
        [HVD_COLL_BROADCAST] = "broadcast"};
    hvd_status st = HVD_OK;
    int kind = -1;
    hvd_plan plan;

    /* Alltoall and reducescatter take the transport an allgather of the
     * size takes, with an algorithm of their own. */
    const char *own = NULL;

    hvd_error_clear();
    for (int k = 0; collective != NULL && k < HVD_COLL_NKINDS; k++)
        if (strcmp(collective, kinds[k]) == 0)
            kind = k;
    if (collective != NULL && strcmp(collective, "alltoall") == 0)
        own = "pairwise";
    else if (collective != NULL && strcmp(collective, "reducescatter") == 0)
        own = "ring";
    if (own != NULL)
        kind = HVD_COLL_ALLGATHER;
    if (kind < 0 || out == NULL || outlen == 0 || !hvd_dtype_valid(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_path: collective must be allreduce, "
                             "allgather, broadcast, alltoall or "
                             "reducescatter, dtype valid, and out a buffer "
                             "(got %s)",
                             collective != NULL ? collective : "NULL");
    pthread_mutex_lock(&g.lock);
    if (!g.initialized) {
        st = hvd_error_set(HVD_ERR_NOT_INITIALIZED, "hvd_path before hvd_init");
    } else {
        const char *step = kind == HVD_COLL_ALLREDUCE
                               ? hvd_engine_step_path(g.engine, bytes)
                               : NULL;
        if (own != NULL)
            hvd_coll_plan_scatter(hvd_engine_data(g.engine), bytes, dtype,
                                  &plan);
        else
            hvd_coll_plan(hvd_engine_data(g.engine), (hvd_coll_kind)kind, bytes,
                          dtype, &plan);
        if (step != NULL)
            snprintf(out, outlen, "%s/step/%zu", step,
                     g.job.cfg.step_carry_bytes);
        else if (plan.algo == HVD_ALGO_LOCAL)
            snprintf(out, outlen, "local");
        else if (own != NULL)
            snprintf(out, outlen, "%s/%s/%zu", hvd_plan_transport(&plan),
                     plan.algo == HVD_ALGO_DIRECT ? "direct" : own, plan.chunk);
        else
            snprintf(out, outlen, "%s/%s/%zu", hvd_plan_transport(&plan),
                     hvd_algo_name(plan.algo), plan.chunk);
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* ------------------------------------------------------------------ */
/* What submission needs of the job (api/job.h)                        */

static uint64_t unnamed_in_set(int ps, hvd_kind kind);

/*
 * The name req is known by: the caller's, or "hvd.<kind>.<k>" for the
 * k-th unnamed operation of its kind (in its set), which matches the k-th
 * of every rank (of the set); in a set, "<name> (process set <ps>)" (names
 * are the set's own). A blocking call's own name is borrowed (the call
 * outlives its request). An unnamed one's name is written to shown. -1
 * when out of memory (under g.lock).
 */
/* Kept out of hvd_job_submit's fast path, for its buffers. */
__attribute__((noinline)) static int name_request(hvd_request *req,
                                                  const char *name, char *shown,
                                                  size_t shown_len) {
    char key[96], *big = NULL;
    const char *use = name;
    int ps = req->desc.pset, rc;

    if (name == NULL) {
        /* A set's members count its unnamed operations among themselves. */
        hvd_kind kind = req->desc.kind;
        uint64_t k = ps == 0 ? g.unnamed[kind]++ : unnamed_in_set(ps, kind);
        snprintf(shown, shown_len, "hvd.%s.%llu", hvd_kind_name(kind),
                 (unsigned long long)k);
        use = shown;
    }
    if (ps != 0) {
        /* Names are per set (as in Horovod): the set is part of the key
         * the ranks match requests by. */
        size_t len = strlen(use) + 32;
        char *dst = len <= sizeof(key) ? key : (big = malloc(len));
        if (dst == NULL)
            return -1;
        snprintf(dst, len, "%s (process set %d)", use, ps);
        use = dst;
    }
    rc = hvd_request_name(req, use, use == name && !req->heap);
    free(big);
    return rc;
}

/* Under g.lock, what hvd_job_submit does besides naming a request by the
 * caller's name in the job's set: a sentence (g.lock released) if the
 * job is not initialized or naming req ran out of memory. */
__attribute__((noinline)) static hvd_status
name_other(const char *fn, const char *name, hvd_request *req) {
    char shown[64];

    if (!g.initialized) {
        pthread_mutex_unlock(&g.lock);
        return hvd_error_set(HVD_ERR_NOT_INITIALIZED,
                             "%s('%s'): hvd is not initialized: call "
                             "hvd_init() first",
                             fn, name != NULL ? name : "");
    }
    if (name_request(req, name, shown, sizeof(shown)) != 0) {
        pthread_mutex_unlock(&g.lock);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "%s('%s'): out of memory", fn,
                             name != NULL ? name : shown);
    }
    return HVD_OK;
}

hvd_status hvd_job_submit(const char *fn, const char *name, hvd_request *req,
                          int *express) {
    hvd_status st;

    pthread_mutex_lock(&g.lock);
    /* The common case: the caller's own name, in the job's set. */
    if (!g.initialized || name == NULL || req->desc.pset != 0) {
        st = name_other(fn, name, req);
        if (st != HVD_OK)
            return st;
    } else if (hvd_request_name(req, name, !req->heap) != 0) {
        pthread_mutex_unlock(&g.lock);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "%s('%s'): out of memory", fn,
                             name);
    }
    /* The engine stays while the job's lock is held (hvd_shutdown takes
     * it), and, for an express request, until this thread lets go of it
     * (hvd_engine_stop waits for it). */
    st = hvd_engine_submit(g.engine, req, express);
    pthread_mutex_unlock(&g.lock);
    if (st != HVD_OK)
        hvd_error_prefix("%s('%s') on rank %d: ", fn, req->name,
                         g.job.info.rank);
    return st;
}

hvd_status hvd_job_pset(const char *fn, const char *name, int ps, int *size,
                        int *index) {
    hvd_status st;

    pthread_mutex_lock(&g.lock);
    st = g.initialized ? hvd_engine_pset(g.engine, ps, size, index, NULL, 0)
                       : HVD_ERR_NOT_INITIALIZED;
    pthread_mutex_unlock(&g.lock);
    if (st == HVD_ERR_NOT_INITIALIZED)
        return hvd_error_set(st,
                             "%s('%s'): hvd is not initialized: call "
                             "hvd_init() first",
                             fn, name != NULL ? name : "");
    if (st != HVD_OK)
        return hvd_error_set(st,
                             "%s('%s'): there is no process set %d (it was "
                             "removed, or never created)",
                             fn, name != NULL ? name : "", ps);
    if (*index < 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s('%s'): rank %d is not a member of process "
                             "set %d: only its members call its collectives",
                             fn, name != NULL ? name : "", g.job.info.rank, ps);
    return HVD_OK;
}

/* The counter of unnamed operations of kind in set ps (under g.lock). */
static uint64_t unnamed_in_set(int ps, hvd_kind kind) {
    if (ps >= g.nps_unnamed) {
        int n = ps + 16;
        uint64_t *v =
            realloc(g.ps_unnamed, (size_t)n * HVD_KIND_COUNT * sizeof(*v));
        if (v == NULL)
            return (uint64_t)-1; /* hvd_request_new fails alike */
        memset(v + (size_t)g.nps_unnamed * HVD_KIND_COUNT, 0,
               (size_t)(n - g.nps_unnamed) * HVD_KIND_COUNT * sizeof(*v));
        g.ps_unnamed = v;
        g.nps_unnamed = n;
    }
    return g.ps_unnamed[(size_t)ps * HVD_KIND_COUNT + kind]++;
}

int hvd_process_set_size(int id) {
    int size = -1, index = -1;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized ||
        hvd_engine_pset(g.engine, id, &size, &index, NULL, 0) != HVD_OK)
        size = -1;
    pthread_mutex_unlock(&g.lock);
    return size;
}

int hvd_process_set_rank(int id) {
    int size = -1, index = -1;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized ||
        hvd_engine_pset(g.engine, id, &size, &index, NULL, 0) != HVD_OK)
        index = -1;
    pthread_mutex_unlock(&g.lock);
    return index;
}

int hvd_process_set_ranks(int id, int *ranks, int cap) {
    int size = -1, index = -1;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized || hvd_engine_pset(g.engine, id, &size, &index, ranks,
                                          ranks != NULL ? cap : 0) != HVD_OK)
        size = -1;
    pthread_mutex_unlock(&g.lock);
    return size;
}

int hvd_job_gpu_device(void) { return g.job.gpu_device; }
