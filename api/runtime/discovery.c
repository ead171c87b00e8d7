#include "api/runtime/discovery.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/base/error.h"
#include "transport/bootstrap/rendezvous.h"

#define MAX_RANKS (1L << 24)

/* Reads an optional integer variable; *out stays -1 when unset. */
static hvd_status opt_int(hvd_env_get_fn get, void *ctx, const char *name,
                          long min, long max, int *out) {
    const char *text = get(name, ctx);
    long v;

    *out = -1;
    if (text == NULL)
        return HVD_OK;
    hvd_status st = hvd_env_parse_long(name, text, min, max, &v);
    if (st != HVD_OK)
        return st;
    *out = (int)v;
    return HVD_OK;
}

/* A launcher's rank and size variables: both or neither. */
static hvd_status rank_size(hvd_env_get_fn get, void *ctx,
                            const char *rank_name, const char *size_name,
                            hvd_procinfo *info, int *found) {
    const char *r = get(rank_name, ctx), *s = get(size_name, ctx);
    hvd_status st;

    *found = 0;
    if (r == NULL && s == NULL)
        return HVD_OK;
    if (r == NULL || s == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s is set but %s is not: the launcher must set "
                             "both",
                             r ? rank_name : size_name,
                             r ? size_name : rank_name);
    st = opt_int(get, ctx, size_name, 1, MAX_RANKS, &info->size);
    if (st == HVD_OK)
        st = opt_int(get, ctx, rank_name, 0, MAX_RANKS - 1, &info->rank);
    if (st != HVD_OK)
        return st;
    if (info->rank >= info->size)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s=%d is not below %s=%d",
                             rank_name, info->rank, size_name, info->size);
    *found = 1;
    return HVD_OK;
}

static hvd_status check_local(const hvd_procinfo *info, const char *rname,
                              const char *sname) {
    if (info->local_rank >= 0 && info->local_size >= 0 &&
        info->local_rank >= info->local_size)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s=%d is not below %s=%d",
                             rname, info->local_rank, sname, info->local_size);
    if (info->local_size > info->size)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%d is larger than the job (%d ranks)", sname,
                             info->local_size, info->size);
    if (info->local_rank >= info->size)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%d is not below the job's size (%d ranks)",
                             rname, info->local_rank, info->size);
    return HVD_OK;
}

static hvd_status rendezvous(hvd_env_get_fn get, void *ctx,
                             hvd_procinfo *info) {
    const char *addr = get("HVD_RENDEZVOUS_ADDR", ctx);
    const char *secret = get("HVD_SECRET", ctx);
    const char *job = get("HVD_JOB_ID", ctx);
    hvd_status st;

    if (addr != NULL) {
        if (strlen(addr) >= sizeof(info->rdv_addr))
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "HVD_RENDEZVOUS_ADDR is too long");
        snprintf(info->rdv_addr, sizeof(info->rdv_addr), "%s", addr);
        st =
            opt_int(get, ctx, "HVD_RENDEZVOUS_PORT", 1, 65535, &info->rdv_port);
        if (st != HVD_OK)
            return st;
        if (info->rdv_port < 0)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "HVD_RENDEZVOUS_ADDR is set but "
                                 "HVD_RENDEZVOUS_PORT is not");
    } else if (!info->hosted) {
        info->rdv_port = 0;
    }
    if (secret != NULL) {
        if (strlen(secret) >= sizeof(info->secret))
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "HVD_SECRET is longer than %zu bytes",
                                 sizeof(info->secret) - 1);
        snprintf(info->secret, sizeof(info->secret), "%s", secret);
    }
    if (job != NULL) {
        if (hvd_job_id_parse(job, info->job_id) != 0)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "HVD_JOB_ID=%s is not 32 hex digits", job);
        info->have_job_id = 1;
    }
    return HVD_OK;
}

/* torch's env:// convention (torchrun): rank 0 hosts the rendezvous on
 * MASTER_ADDR, from MASTER_PORT + 1 (torch's own store has MASTER_PORT). */
static hvd_status torchrun(hvd_env_get_fn get, void *ctx, hvd_procinfo *info,
                           int *found) {
    const char *addr = get("MASTER_ADDR", ctx), *run, *restart;
    int port;
    hvd_status st;

    *found = 0;
    if (addr == NULL || get("MASTER_PORT", ctx) == NULL ||
        get("RANK", ctx) == NULL)
        return HVD_OK;
    st = rank_size(get, ctx, "RANK", "WORLD_SIZE", info, found);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "MASTER_PORT", 1, 65534, &port);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "LOCAL_RANK", 0, MAX_RANKS, &info->local_rank);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "LOCAL_WORLD_SIZE", 1, MAX_RANKS,
                     &info->local_size);
    if (st == HVD_OK)
        st =
            opt_int(get, ctx, "HVD_RENDEZVOUS_PORT", 1, 65535, &info->rdv_port);
    if (st == HVD_OK)
        st = check_local(info, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    if (st != HVD_OK || !*found)
        return st;
    if (strlen(addr) >= sizeof(info->rdv_addr))
        return hvd_error_set(HVD_ERR_INVALID_ARG, "MASTER_ADDR is too long");
    snprintf(info->rdv_addr, sizeof(info->rdv_addr), "%s", addr);
    if (info->rdv_port < 0)
        info->rdv_port = port + 1;
    info->rdv_port_span = 32;
    run = get("TORCHELASTIC_RUN_ID", ctx);
    restart = get("TORCHELASTIC_RESTART_COUNT", ctx);
    snprintf(info->job_key, sizeof(info->job_key), "torchrun|%.60s|%.12s|%s|%d",
             run != NULL ? run : "none", restart != NULL ? restart : "0",
             info->rdv_addr, port);
    info->hosted = 1;
    info->source = "torchrun";
    return HVD_OK;
}

/* srun without MPI (no PMIx/PMI variables): rank 0 hosts the rendezvous
 * on the step's first node. Minimal: a node list of plain names only. */
static hvd_status slurm_hosted(hvd_env_get_fn get, void *ctx,
                               hvd_procinfo *info) {
    const char *nodes = get("SLURM_STEP_NODELIST", ctx);
    const char *job = get("SLURM_JOB_ID", ctx),
               *step = get("SLURM_STEP_ID", ctx);
    size_t n;
    hvd_status st;

    if (get("PMIX_RANK", ctx) != NULL || get("PMI_RANK", ctx) != NULL ||
        nodes == NULL || job == NULL || step == NULL ||
        strchr(nodes, '[') != NULL)
        return HVD_OK;
    n = strcspn(nodes, ",");
    if (n == 0 || n >= sizeof(info->rdv_addr))
        return HVD_OK;
    st = opt_int(get, ctx, "HVD_RENDEZVOUS_PORT", 1, 65535, &info->rdv_port);
    if (st != HVD_OK)
        return st;
    if (info->rdv_port < 0)
        info->rdv_port = 10000 + (int)((strtoul(job, NULL, 10) * 131 +
                                        strtoul(step, NULL, 10) * 17) %
                                       22000);
    memcpy(info->rdv_addr, nodes, n);
    info->rdv_addr[n] = '\0';
    info->rdv_port_span = 32;
    snprintf(info->job_key, sizeof(info->job_key), "slurm|%.40s|%.20s|%.20s",
             get("SLURM_CLUSTER_NAME", ctx) ? get("SLURM_CLUSTER_NAME", ctx)
                                            : "",
             job, step);
    info->hosted = 1;
    return HVD_OK;
}

/* hvdrun's elastic worker: its id; the rendezvous gives the rest. */
static hvd_status elastic_worker(hvd_env_get_fn get, void *ctx,
                                 hvd_procinfo *info, int *found) {
    const char *on = get("HVD_ELASTIC", ctx);
    hvd_status st;

    *found = 0;
    if (on == NULL || strcmp(on, "1") != 0)
        return HVD_OK;
    st = opt_int(get, ctx, "HVD_ELASTIC_WORKER", 0, MAX_RANKS, &info->worker);
    if (st != HVD_OK)
        return st;
    if (info->worker < 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "HVD_ELASTIC=1 but HVD_ELASTIC_WORKER is not "
                             "set: start elastic jobs with hvdrun --min-np/"
                             "--max-np/--host-discovery-script");
    if (get("HVD_RENDEZVOUS_ADDR", ctx) == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "HVD_ELASTIC=1 but HVD_RENDEZVOUS_ADDR is not "
                             "set: an elastic job needs hvdrun's rendezvous");
    info->elastic = 1;
    info->source = "hvdrun";
    *found = 1;
    return HVD_OK;
}

hvd_status hvd_discover(hvd_env_get_fn get, void *ctx, hvd_procinfo *info) {
    hvd_procinfo pi;
    int found = 0;
    hvd_status st;

    memset(&pi, 0, sizeof(pi));
    pi.local_rank = pi.local_size = pi.cross_rank = pi.cross_size = -1;
    pi.worker = -1;

    st = elastic_worker(get, ctx, &pi, &found);
    if (st != HVD_OK)
        return st;
    if (found) {
        pi.rank = pi.size = -1;
        goto out;
    }

    st = rank_size(get, ctx, "HVD_RANK", "HVD_SIZE", &pi, &found);
    if (st != HVD_OK)
        return st;
    if (found) {
        pi.source = "hvdrun";
        st = opt_int(get, ctx, "HVD_LOCAL_RANK", 0, MAX_RANKS, &pi.local_rank);
        if (st == HVD_OK)
            st = opt_int(get, ctx, "HVD_LOCAL_SIZE", 1, MAX_RANKS,
                         &pi.local_size);
        if (st == HVD_OK)
            st = opt_int(get, ctx, "HVD_CROSS_RANK", 0, MAX_RANKS,
                         &pi.cross_rank);
        if (st == HVD_OK)
            st = opt_int(get, ctx, "HVD_CROSS_SIZE", 1, MAX_RANKS,
                         &pi.cross_size);
        if (st == HVD_OK)
            st = check_local(&pi, "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE");
        if (st == HVD_OK && pi.cross_rank >= 0 && pi.cross_size >= 0 &&
            pi.cross_rank >= pi.cross_size)
            st = hvd_error_set(HVD_ERR_INVALID_ARG,
                               "HVD_CROSS_RANK=%d is not below "
                               "HVD_CROSS_SIZE=%d",
                               pi.cross_rank, pi.cross_size);
        /* A host holds a rank at least: no more hosts than ranks. */
        if (st == HVD_OK &&
            (pi.cross_rank >= pi.size || pi.cross_size > pi.size))
            st = hvd_error_set(HVD_ERR_INVALID_ARG,
                               "HVD_CROSS_RANK=%d / HVD_CROSS_SIZE=%d: more "
                               "hosts than the job's %d ranks",
                               pi.cross_rank, pi.cross_size, pi.size);
        goto out;
    }
    st = rank_size(get, ctx, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   &pi, &found);
    if (st != HVD_OK)
        return st;
    if (found) {
        pi.source = "openmpi";
        st = opt_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_RANK", 0, MAX_RANKS,
                     &pi.local_rank);
        if (st == HVD_OK)
            st = opt_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, MAX_RANKS,
                         &pi.local_size);
        if (st == HVD_OK)
            st = check_local(&pi, "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE");
        goto out;
    }
    st = torchrun(get, ctx, &pi, &found);
    if (st != HVD_OK || found)
        goto out;
    st = rank_size(get, ctx, "SLURM_PROCID", "SLURM_NTASKS", &pi, &found);
    if (st != HVD_OK)
        return st;
    if (found) {
        pi.source = "slurm";
        st = opt_int(get, ctx, "SLURM_LOCALID", 0, MAX_RANKS, &pi.local_rank);
        if (st == HVD_OK)
            st = check_local(&pi, "SLURM_LOCALID", "(the local size)");
        if (st == HVD_OK && pi.size > 1)
            st = slurm_hosted(get, ctx, &pi);
        goto out;
    }
    st = rank_size(get, ctx, "PMI_RANK", "PMI_SIZE", &pi, &found);
    if (st != HVD_OK)
        return st;
    if (found) {
        pi.source = "pmi";
        goto out;
    }
    pi.source = "single";
    pi.rank = 0;
    pi.size = 1;
out:
    if (st != HVD_OK)
        return st;
    if (pi.size == 1) {
        pi.local_rank = pi.cross_rank = 0;
        pi.local_size = pi.cross_size = 1;
    }
    st = rendezvous(get, ctx, &pi);
    if (st != HVD_OK)
        return st;
    *info = pi;
    return HVD_OK;
}
