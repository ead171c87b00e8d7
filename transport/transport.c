#include "transport/transport.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "transport/base/error.h"
#include "transport/shm/shm.h"
#include "transport/tcp/tcp.h"
#ifdef HVD_WITH_MPI
#include "transport/mpi/mpi.h"
#endif
#ifdef HVD_WITH_VERBS
#include "transport/verbs/verbs.h"
#endif

/* The transports built in. Adding one is one line here (under its
 * HVD_WITH_<X>) and one folder. The first is the one that serves any job
 * on any machine (hvd_transport_always). */
static const hvd_transport_ops *const providers[] = {
    &hvd_tcp_ops,
    &hvd_shm_ops,
#ifdef HVD_WITH_MPI
    &hvd_mpi_ops,
#endif
#ifdef HVD_WITH_VERBS
    &hvd_verbs_ops,
#endif
};

#define NPROVIDERS (sizeof(providers) / sizeof(providers[0]))

static hvd_transport_ops filled[NPROVIDERS];
static char names[128];
static pthread_once_t fill_once = PTHREAD_ONCE_INIT;

static hvd_status unsup_probe(const hvd_transport_params *params,
                              hvd_caps *caps) {
    (void)params;
    memset(caps, 0, sizeof(*caps));
    strcpy(caps->reason, "transport has no probe");
    return HVD_OK;
}

static hvd_status unsup_open(const hvd_transport_params *params,
                             hvd_transport **out) {
    (void)params;
    (void)out;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "transport cannot be opened");
}

static hvd_status unsup_isend(hvd_transport *tp, int peer, int channel,
                              const void *buf, size_t len, hvd_req *req) {
    (void)peer, (void)channel, (void)buf, (void)len, (void)req;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "transport %s has no isend",
                         tp->ops->name);
}

static hvd_status unsup_irecv(hvd_transport *tp, int peer, int channel,
                              void *buf, size_t len, hvd_req *req) {
    (void)peer, (void)channel, (void)buf, (void)len, (void)req;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "transport %s has no irecv",
                         tp->ops->name);
}

static hvd_status unsup_irecv_upto(hvd_transport *tp, int peer, int channel,
                                   void *buf, size_t cap, hvd_req *req) {
    (void)peer, (void)channel, (void)buf, (void)cap, (void)req;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "transport %s has no irecv_upto",
                         tp->ops->name);
}

static hvd_status unsup_progress(hvd_transport *tp, int timeout_ms) {
    (void)tp;
    (void)timeout_ms;
    return HVD_OK;
}

static void unsup_wake(hvd_transport *tp) { (void)tp; }

static hvd_status unsup_shutdown(hvd_transport *tp) {
    (void)tp;
    return HVD_OK;
}

static void unsup_close(hvd_transport *tp) { (void)tp; }

static hvd_status unsup_allreduce(hvd_transport *tp, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "transport %s has no native allreduce", tp->ops->name);
}

static hvd_status unsup_allgather(hvd_transport *tp, const void *sendbuf,
                                  void *recvbuf, size_t count,
                                  hvd_dtype dtype) {
    (void)sendbuf, (void)recvbuf, (void)count, (void)dtype;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "transport %s has no native allgather", tp->ops->name);
}

static hvd_status unsup_broadcast(hvd_transport *tp, void *buf, size_t count,
                                  hvd_dtype dtype, int root) {
    (void)buf, (void)count, (void)dtype, (void)root;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "transport %s has no native broadcast", tp->ops->name);
}

static hvd_status unsup_get(hvd_transport *tp, int peer, void *buf,
                            uint64_t remote, size_t len) {
    (void)peer, (void)buf, (void)remote, (void)len;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "transport %s has no one-sided get", tp->ops->name);
}

static int unsup_can_get(hvd_transport *tp, int peer) {
    (void)tp, (void)peer;
    return 0;
}

static unsigned host_only(hvd_transport *tp) {
    (void)tp;
    return 0;
}

/* A member is set only if the provider's table is large enough to hold it
 * and it is not NULL. */
#define PROVIDED(src, member)                                                  \
    ((src)->size >=                                                            \
         offsetof(hvd_transport_ops, member) + sizeof((src)->member) &&        \
     (src)->member != NULL)

#define FILL(dst, src, member, stub)                                           \
    (dst)->member = PROVIDED(src, member) ? (src)->member : (stub)

static void fill_tables(void) {
    size_t off = 0;

    for (size_t i = 0; i < NPROVIDERS; i++) {
        int n = snprintf(names + off, sizeof(names) - off, "%s%s", i ? "," : "",
                         providers[i]->name);
        if (n > 0 && off + (size_t)n < sizeof(names))
            off += (size_t)n;
    }
    for (size_t i = 0; i < NPROVIDERS; i++) {
        const hvd_transport_ops *src = providers[i];
        hvd_transport_ops *dst = &filled[i];

        dst->size = sizeof(*dst);
        dst->name = src->name;
        FILL(dst, src, title, src->name);
        if (PROVIDED(src, settings) &&
            src->size >= offsetof(hvd_transport_ops, settings_size) +
                             sizeof(src->settings_size)) {
            dst->settings = src->settings;
            dst->nsettings = src->nsettings;
            dst->settings_size = src->settings_size;
        }
        FILL(dst, src, probe, unsup_probe);
        FILL(dst, src, open, unsup_open);
        FILL(dst, src, isend, unsup_isend);
        FILL(dst, src, irecv, unsup_irecv);
        FILL(dst, src, irecv_upto, unsup_irecv_upto);
        dst->isendv = PROVIDED(src, isendv) ? src->isendv : NULL;
        FILL(dst, src, progress, unsup_progress);
        FILL(dst, src, wake, unsup_wake);
        FILL(dst, src, shutdown, unsup_shutdown);
        FILL(dst, src, close, unsup_close);
        FILL(dst, src, allreduce, unsup_allreduce);
        FILL(dst, src, allgather, unsup_allgather);
        FILL(dst, src, broadcast, unsup_broadcast);
        FILL(dst, src, get, unsup_get);
        FILL(dst, src, can_get, unsup_can_get);
        dst->expose = PROVIDED(src, expose) ? src->expose : NULL;
        FILL(dst, src, mem_types, host_only);
        /* The registry hooks stay NULL where not provided: the registry
         * skips them. */
        dst->bootstrap_open =
            PROVIDED(src, bootstrap_open) && PROVIDED(src, bootstrap_close)
                ? src->bootstrap_open
                : NULL;
        dst->bootstrap_close =
            dst->bootstrap_open != NULL ? src->bootstrap_close : NULL;
        dst->at_shutdown = PROVIDED(src, at_shutdown) ? src->at_shutdown : NULL;
        dst->cleanup_job = PROVIDED(src, cleanup_job) ? src->cleanup_job : NULL;
    }
}

/* Transports hvd knows but this build may lack, and what building them
 * needs, for the message that says so. */
static const struct {
    const char *name;
    const char *title;
    const char *needs;
    int bootstraps; /* it has a bootstrap_open: a launcher of its own */
} optional[] = {
    {"mpi", "MPI", "Open MPI's development files", 1},
    {"verbs", "verbs", "libibverbs' development files (RDMA)", 0},
};

#define NOPTIONAL (sizeof(optional) / sizeof(optional[0]))

const hvd_transport_ops *hvd_transport_find(const char *name) {
    pthread_once(&fill_once, fill_tables);
    for (size_t i = 0; i < NPROVIDERS; i++)
        if (strcasecmp(filled[i].name, name) == 0)
            return &filled[i];
    return NULL;
}

const char *hvd_transport_needs(const char *name) {
    if (hvd_transport_find(name) != NULL)
        return NULL;
    for (size_t i = 0; i < NOPTIONAL; i++)
        if (strcasecmp(optional[i].name, name) == 0)
            return optional[i].needs;
    return NULL;
}

hvd_status hvd_transport_lookup(const char *name,
                                const hvd_transport_ops **ops_out) {
    const hvd_transport_ops *ops = hvd_transport_find(name);
    const char *needs = hvd_transport_needs(name);

    if (ops != NULL) {
        *ops_out = ops;
        return HVD_OK;
    }
    if (needs != NULL)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "transport '%s' is not built into this hvd "
                             "(built in: %s; it needs %s when hvd is built)",
                             name, hvd_transport_names(), needs);
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "transport '%s' is not built into this hvd "
                         "(built in: %s)",
                         name, hvd_transport_names());
}

size_t hvd_transport_count(void) { return NPROVIDERS; }

const hvd_transport_ops *hvd_transport_at(size_t i) {
    pthread_once(&fill_once, fill_tables);
    return i < NPROVIDERS ? &filled[i] : NULL;
}

/* Large enough for any transport's settings struct. */
#define SETTINGS_MAX 1024

hvd_status hvd_transport_read_settings(const hvd_transport_ops *ops,
                                       const hvd_transport_params *params,
                                       void *out) {
    hvd_env_get_fn get =
        params != NULL && params->env != NULL ? params->env : hvd_env_getenv;
    void *ctx = params != NULL ? params->env_ctx : NULL;

    memset(out, 0, ops->settings_size);
    return hvd_env_read_settings(ops->settings, ops->nsettings, get, ctx, out);
}

hvd_status hvd_transport_check_settings(hvd_env_get_fn get, void *ctx) {
    _Alignas(max_align_t) unsigned char scratch[SETTINGS_MAX];

    pthread_once(&fill_once, fill_tables);
    for (size_t i = 0; i < NPROVIDERS; i++) {
        if (filled[i].settings_size > sizeof(scratch))
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "transport %s: its settings take %zu bytes, "
                                 "more than the registry's %d",
                                 filled[i].name, filled[i].settings_size,
                                 SETTINGS_MAX);
        hvd_status st = hvd_env_read_settings(
            filled[i].settings, filled[i].nsettings, get, ctx, scratch);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

const char *hvd_transport_names(void) {
    pthread_once(&fill_once, fill_tables);
    return names;
}

/* What hvd could bootstrap a job through, missing from this build: the
 * first optional transport with a launcher of its own that is not built
 * in. NULL when every one is. */
static size_t missing_bootstrap(void) {
    for (size_t i = 0; i < NOPTIONAL; i++)
        if (optional[i].bootstraps &&
            hvd_transport_find(optional[i].name) == NULL)
            return i;
    return NOPTIONAL;
}

hvd_status hvd_transport_bootstrap_open(const char *launcher, int rank,
                                        int size, hvd_bootstrap **bs_out,
                                        const hvd_transport_ops **by_out) {
    size_t missing;

    pthread_once(&fill_once, fill_tables);
    for (size_t i = 0; i < NPROVIDERS; i++) {
        if (filled[i].bootstrap_open == NULL)
            continue;
        hvd_status st = filled[i].bootstrap_open(bs_out);
        if (st == HVD_OK)
            *by_out = &filled[i];
        if (st != HVD_ERR_UNSUPPORTED)
            return st;
    }
    missing = missing_bootstrap();
    if (missing < NOPTIONAL)
        return hvd_error_set(
            HVD_ERR_UNSUPPORTED,
            "started by %s as rank %d of %d, but no rendezvous is given "
            "(HVD_RENDEZVOUS_ADDR/PORT) and this hvd was built without %s "
            "to bootstrap through: start the job with `hvdrun -np %d ...`, "
            "or build hvd with %s",
            launcher, rank, size, optional[missing].title, size,
            optional[missing].needs);
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "started by %s as rank %d of %d, but no rendezvous "
                         "is given (HVD_RENDEZVOUS_ADDR/PORT) and no "
                         "transport of this hvd can bootstrap the job: start "
                         "the job with `hvdrun -np %d ...`",
                         launcher, rank, size, size);
}

void hvd_transport_bootstrap_close(const hvd_transport_ops *by,
                                   hvd_bootstrap *bs) {
    if (by != NULL && bs != NULL && by->bootstrap_close != NULL)
        by->bootstrap_close(bs);
}

void hvd_transport_at_shutdown(int orderly) {
    pthread_once(&fill_once, fill_tables);
    for (size_t i = 0; i < NPROVIDERS; i++)
        if (filled[i].at_shutdown != NULL)
            filled[i].at_shutdown(orderly);
}

int hvd_transport_cleanup_job(const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret) {
    int removed = 0;

    pthread_once(&fill_once, fill_tables);
    for (size_t i = 0; i < NPROVIDERS; i++)
        if (filled[i].cleanup_job != NULL)
            removed += filled[i].cleanup_job(job_id, secret);
    return removed;
}

const char *hvd_transport_always(void) { return providers[0]->name; }
