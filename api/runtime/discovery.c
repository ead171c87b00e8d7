#include "api/runtime/discovery.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/slurm_nodes.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/bootstrap/rendezvous.h"

#define MAX_RANKS (1L << 24)
/* The ports a hosted rendezvous may take: rank 0 binds the first free one,
 * so that a port held by something else does not stop the job. */
#define HOSTED_SPAN 32

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

static hvd_status check_cross(const hvd_procinfo *info, const char *rname,
                              const char *sname) {
    if (info->cross_rank >= 0 && info->cross_size >= 0 &&
        info->cross_rank >= info->cross_size)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s=%d is not below %s=%d",
                             rname, info->cross_rank, sname, info->cross_size);
    /* A host holds a rank at least: no more hosts than ranks. */
    if (info->cross_rank >= info->size || info->cross_size > info->size)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%d / %s=%d: more hosts than the job's %d "
                             "ranks",
                             rname, info->cross_rank, sname, info->cross_size,
                             info->size);
    return HVD_OK;
}

/* The hosted rendezvous's ports: [first, first + HOSTED_SPAN), cut at
 * 65535. HVD_RENDEZVOUS_PORT, when set, replaces the first port, for a
 * site whose firewall opens only some ports. */
static hvd_status hosted_ports(hvd_env_get_fn get, void *ctx, long first,
                               const char *origin, hvd_procinfo *info) {
    int port;
    hvd_status st = opt_int(get, ctx, "HVD_RENDEZVOUS_PORT", 1, 65535, &port);

    if (st != HVD_OK)
        return st;
    if (port > 0)
        first = port;
    else if (first > 65535)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s leaves no port above it for hvd's "
                             "rendezvous: set HVD_RENDEZVOUS_PORT",
                             origin);
    info->rdv_port = (int)first;
    info->rdv_port_span =
        65536 - first < HOSTED_SPAN ? (int)(65536 - first) : HOSTED_SPAN;
    return HVD_OK;
}

/* Copies a launcher's host name or address into rdv_addr. */
static hvd_status set_rdv_addr(hvd_procinfo *info, const char *name,
                               const char *value) {
    if (value[0] == '\0' || strlen(value) >= sizeof(info->rdv_addr))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is not a host name of 1 to %zu "
                             "characters",
                             name, value, sizeof(info->rdv_addr) - 1);
    snprintf(info->rdv_addr, sizeof(info->rdv_addr), "%s", value);
    return HVD_OK;
}

/*
 * torch's env:// convention (torchrun; Kubeflow's PyTorchJob, SageMaker and
 * Azure ML set the same variables): RANK, WORLD_SIZE, MASTER_ADDR and
 * MASTER_PORT. torch's own store listens on MASTER_PORT, so rank 0 hosts
 * hvd's rendezvous on the ports above it. The run id and restart count
 * enter the job's key: a restart by torchrun is a new job.
 */
static hvd_status from_torchrun(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                                int *found) {
    const char *addr = get("MASTER_ADDR", ctx);
    const char *port_text = get("MASTER_PORT", ctx);
    const char *run = get("TORCHELASTIC_RUN_ID", ctx);
    int port, restart;
    hvd_status st;
    int n;

    *found = 0;
    if (addr == NULL || port_text == NULL ||
        (get("RANK", ctx) == NULL && get("WORLD_SIZE", ctx) == NULL))
        return HVD_OK;
    st = rank_size(get, ctx, "RANK", "WORLD_SIZE", pi, found);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "LOCAL_RANK", 0, MAX_RANKS, &pi->local_rank);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "LOCAL_WORLD_SIZE", 1, MAX_RANKS,
                     &pi->local_size);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "GROUP_RANK", 0, MAX_RANKS, &pi->cross_rank);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "GROUP_WORLD_SIZE", 1, MAX_RANKS,
                     &pi->cross_size);
    if (st == HVD_OK)
        st = check_local(pi, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    if (st == HVD_OK)
        st = check_cross(pi, "GROUP_RANK", "GROUP_WORLD_SIZE");
    if (st != HVD_OK)
        return st;
    if (pi->local_size > 0 && pi->cross_size > 0 &&
        (long)pi->local_size * pi->cross_size != pi->size)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "WORLD_SIZE=%d is not LOCAL_WORLD_SIZE=%d times "
                             "GROUP_WORLD_SIZE=%d",
                             pi->size, pi->local_size, pi->cross_size);
    st = opt_int(get, ctx, "MASTER_PORT", 1, 65535, &port);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "TORCHELASTIC_RESTART_COUNT", 0, 1L << 30,
                     &restart);
    if (st == HVD_OK)
        st = set_rdv_addr(pi, "MASTER_ADDR", addr);
    if (st == HVD_OK)
        st = hosted_ports(get, ctx, port + 1L, "MASTER_PORT=65535", pi);
    if (st != HVD_OK)
        return st;
    n = snprintf(pi->job_key, sizeof(pi->job_key), "torchrun:%s:%d:%s:%d",
                 run != NULL ? run : "none", restart < 0 ? 0 : restart, addr,
                 port);
    if (n < 0 || (size_t)n >= sizeof(pi->job_key))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "TORCHELASTIC_RUN_ID=%s is too long: the job's "
                             "key takes at most %zu characters",
                             run, sizeof(pi->job_key) - 1);
    pi->hosted = 1;
    pi->source = "torchrun";
    return HVD_OK;
}

/* RANK and WORLD_SIZE without the rest of torch's variables: a job that
 * would run as one process while its launcher waits for several. */
static hvd_status torch_incomplete(hvd_env_get_fn get, void *ctx) {
    const char *addr = get("MASTER_ADDR", ctx);

    if (get("RANK", ctx) == NULL || get("WORLD_SIZE", ctx) == NULL)
        return HVD_OK;
    return hvd_error_set(
        HVD_ERR_INVALID_ARG,
        "RANK and WORLD_SIZE are set but %s: hvd reads torch's variables "
        "only with MASTER_ADDR and MASTER_PORT (rank 0's address and its "
        "store's port), and runs no job of one while a launcher started "
        "several",
        addr == NULL && get("MASTER_PORT", ctx) == NULL ? "MASTER_ADDR and "
                                                          "MASTER_PORT are "
                                                          "not"
        : addr == NULL                                  ? "MASTER_ADDR is not"
                                                        : "MASTER_PORT is not");
}

static hvd_status rendezvous(hvd_env_get_fn get, void *ctx,
                             hvd_procinfo *info) {
    const char *addr = get("HVD_RENDEZVOUS_ADDR", ctx);
    const char *secret = get("HVD_SECRET", ctx);
    const char *job = get("HVD_JOB_ID", ctx);
    hvd_status st;

    if (info->hosted) {
        /* The launcher named rank 0's host; HVD_RENDEZVOUS_ADDR names it
         * better where that name does not resolve to the right network.
         * HVD_RENDEZVOUS_PORT was read with the launcher's ports. */
        if (addr != NULL) {
            st = set_rdv_addr(info, "HVD_RENDEZVOUS_ADDR", addr);
            if (st != HVD_OK)
                return st;
        }
    } else if (addr != NULL) {
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
    } else {
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
    info->rank = info->size = -1;
    *found = 1;
    return HVD_OK;
}

static hvd_status from_hvdrun(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                              int *found) {
    hvd_status st = rank_size(get, ctx, "HVD_RANK", "HVD_SIZE", pi, found);

    if (st != HVD_OK || !*found)
        return st;
    pi->source = "hvdrun";
    st = opt_int(get, ctx, "HVD_LOCAL_RANK", 0, MAX_RANKS, &pi->local_rank);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "HVD_LOCAL_SIZE", 1, MAX_RANKS, &pi->local_size);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "HVD_CROSS_RANK", 0, MAX_RANKS, &pi->cross_rank);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "HVD_CROSS_SIZE", 1, MAX_RANKS, &pi->cross_size);
    if (st == HVD_OK)
        st = check_local(pi, "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE");
    if (st == HVD_OK)
        st = check_cross(pi, "HVD_CROSS_RANK", "HVD_CROSS_SIZE");
    return st;
}

static hvd_status from_openmpi(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                               int *found) {
    hvd_status st = rank_size(get, ctx, "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_SIZE", pi, found);

    if (st != HVD_OK || !*found)
        return st;
    pi->source = "openmpi";
    st = opt_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_RANK", 0, MAX_RANKS,
                 &pi->local_rank);
    if (st == HVD_OK)
        st = opt_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, MAX_RANKS,
                     &pi->local_size);
    if (st == HVD_OK)
        st = check_local(pi, "OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE");
    return st;
}

/* Slurm's step ids from SLURM_BATCH_SCRIPT up (slurm.h: the batch script,
 * the extern step, pending steps) and the interactive step below it run
 * no tasks of srun. */
#define SLURM_FIRST_SPECIAL_STEP 0xfffffffaL

/*
 * Which step this process runs in. The batch script's environment has
 * SLURM_PROCID=0 and SLURM_NTASKS of the whole allocation but no srun
 * step: it has no SLURM_STEP_NUM_TASKS, and its SLURM_STEP_ID, where set,
 * is a special id. *task_step tells an srun step; *step_id is its id
 * (0 where srun gave none).
 */
static hvd_status slurm_step(hvd_env_get_fn get, void *ctx, long *step_id,
                             int *task_step) {
    const char *name =
        get("SLURM_STEP_ID", ctx) != NULL ? "SLURM_STEP_ID" : "SLURM_STEPID";
    const char *text = get(name, ctx);
    long id = 0;

    *step_id = 0;
    *task_step = 0;
    if (text == NULL) {
        *task_step = get("SLURM_STEP_NUM_TASKS", ctx) != NULL;
        return HVD_OK;
    }
    if (strcmp(text, "batch") == 0 || strcmp(text, "extern") == 0 ||
        strcmp(text, "interactive") == 0)
        return HVD_OK;
    /* Slurm 22.05 sets no step id in the batch script; later versions
     * print the batch step's id as a signed number (-5). */
    if (hvd_env_parse_long(name, text, -0x80000000L, 0xffffffffL, &id) !=
        HVD_OK)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is not a Slurm step id", name, text);
    if (id < 0 || id >= SLURM_FIRST_SPECIAL_STEP)
        return HVD_OK;
    *step_id = id;
    *task_step = 1;
    return HVD_OK;
}

/* The first of the variables named that is set, or NULL. */
static const char *first_set(hvd_env_get_fn get, void *ctx,
                             const char *const *names, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (get(names[k], ctx) != NULL)
            return names[k];
    return NULL;
}

/*
 * This node's index in the step's node list, from SLURMD_NODENAME (else
 * SLURM_NODEID, the node's index in the step), and the number of tasks per
 * node. Where only the allocation's lists are set (no srun step's), values
 * that do not fit the step are left to the host names.
 */
static hvd_status slurm_layout(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                               const char *list_name,
                               const hvd_slurm_nodes *nodes) {
    static const char *const tpn_names[] = {"SLURM_STEP_TASKS_PER_NODE",
                                            "SLURM_TASKS_PER_NODE"};
    const char *tpn_name = first_set(get, ctx, tpn_names, 2);
    const char *host = get("SLURMD_NODENAME", ctx);
    int strict = strcmp(list_name, "SLURM_STEP_NODELIST") == 0 &&
                 tpn_name != NULL && tpn_name == tpn_names[0];
    int *counts = NULL, index = -1;
    size_t ncounts = 0;
    long sum = 0;
    hvd_status st = HVD_OK;

    if (host != NULL) {
        index = (int)hvd_slurm_nodes_find(nodes, host);
        if (index < 0 && strict)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "SLURMD_NODENAME=%s is not in %s=%s", host,
                                 list_name, get(list_name, ctx));
    } else {
        st = opt_int(get, ctx, "SLURM_NODEID", 0, MAX_RANKS, &index);
        if (st != HVD_OK)
            return st;
        if (index >= (long)nodes->n) {
            if (strict)
                return hvd_error_set(HVD_ERR_INVALID_ARG,
                                     "SLURM_NODEID=%d is not below the %zu "
                                     "nodes of %s",
                                     index, nodes->n, list_name);
            index = -1;
        }
    }
    if (tpn_name == NULL)
        return HVD_OK;
    st =
        hvd_slurm_tasks_expand(tpn_name, get(tpn_name, ctx), &counts, &ncounts);
    if (st != HVD_OK)
        return st;
    for (size_t k = 0; k < ncounts; k++)
        sum += counts[k];
    if (strict && ncounts != nodes->n)
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s=%s counts %zu nodes but %s=%s names %zu",
                           tpn_name, get(tpn_name, ctx), ncounts, list_name,
                           get(list_name, ctx), nodes->n);
    else if (strict && sum != pi->size)
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "%s=%s adds up to %ld tasks, not the step's %d",
                           tpn_name, get(tpn_name, ctx), sum, pi->size);
    else if (ncounts == nodes->n && sum == pi->size) {
        pi->cross_size = (int)nodes->n;
        if (index >= 0) {
            pi->cross_rank = index;
            pi->local_size = counts[index];
        }
        st = check_local(pi, "SLURM_LOCALID",
                         "this node's count in SLURM_STEP_TASKS_PER_NODE");
    }
    free(counts);
    return st;
}

/* srun without MPI: rank 0 hosts the rendezvous on the step's first node,
 * on ports derived from the job and step ids (below the ephemeral range,
 * so that two steps of a job, or two jobs on a node, rarely meet). */
static hvd_status slurm_hosted(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                               long step, const char *list_name,
                               const hvd_slurm_nodes *nodes) {
    const char *job_name =
        get("SLURM_JOB_ID", ctx) != NULL ? "SLURM_JOB_ID" : "SLURM_JOBID";
    const char *job_text = get(job_name, ctx);
    const char *cluster = get("SLURM_CLUSTER_NAME", ctx);
    long job;
    int n;
    hvd_status st;

    if (job_text == NULL || list_name == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "SLURM_PROCID is set (an srun step without MPI) "
                             "but %s is not: hvd needs the job id and the "
                             "step's nodes to find rank 0",
                             job_text == NULL ? "SLURM_JOB_ID"
                                              : "SLURM_STEP_NODELIST");
    st = hvd_env_parse_long(job_name, job_text, 1, 0xffffffffL, &job);
    if (st == HVD_OK)
        st = set_rdv_addr(pi, list_name, nodes->names[0]);
    if (st == HVD_OK)
        st = hosted_ports(get, ctx, 10000 + (job * 131 + step * 17) % 22000,
                          "SLURM_JOB_ID", pi);
    if (st != HVD_OK)
        return st;
    n = snprintf(pi->job_key, sizeof(pi->job_key), "slurm:%s:%ld:%ld",
                 cluster != NULL ? cluster : "", job, step);
    if (n < 0 || (size_t)n >= sizeof(pi->job_key))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "SLURM_CLUSTER_NAME=%s is too long", cluster);
    pi->hosted = 1;
    return HVD_OK;
}

/* srun --mpi=pmi2 gives PMI_RANK equal to SLURM_PROCID; a PMI launcher
 * that runs its proxies in a Slurm step (Hydra's mpiexec) gives its own
 * ranks, and SLURM_PROCID is the proxy's. */
static int pmi_differs(hvd_env_get_fn get, void *ctx, const hvd_procinfo *pi) {
    long r, s;

    return get("PMI_RANK", ctx) != NULL && get("PMI_SIZE", ctx) != NULL &&
           hvd_env_parse_long("PMI_RANK", get("PMI_RANK", ctx), 0, MAX_RANKS,
                              &r) == HVD_OK &&
           hvd_env_parse_long("PMI_SIZE", get("PMI_SIZE", ctx), 1, MAX_RANKS,
                              &s) == HVD_OK &&
           (r != pi->rank || s != pi->size);
}

/*
 * Slurm: srun's step variables. With PMIX_RANK, PMI_RANK or
 * OMPI_COMM_WORLD_RANK also set (srun --mpi=pmix, pmi2) MPI bootstraps the
 * job; without, rank 0 hosts the rendezvous. In the batch script no srun
 * step runs: a job of one.
 */
static hvd_status from_slurm(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                             int *found) {
    static const char *const list_names[] = {
        "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
    const char *ntasks = get("SLURM_STEP_NUM_TASKS", ctx) != NULL
                             ? "SLURM_STEP_NUM_TASKS"
                             : "SLURM_NTASKS";
    const char *list_name = first_set(get, ctx, list_names, 3);
    int mpi = get("PMIX_RANK", ctx) != NULL || get("PMI_RANK", ctx) != NULL ||
              get("OMPI_COMM_WORLD_RANK", ctx) != NULL;
    hvd_slurm_nodes nodes = {NULL, 0};
    int task_step;
    long step;
    hvd_status st;

    *found = 0;
    if (get("SLURM_PROCID", ctx) == NULL)
        return HVD_OK;
    st = slurm_step(get, ctx, &step, &task_step);
    if (st != HVD_OK)
        return st;
    if (!task_step && !mpi) {
        HVD_LOG(HVD_LOG_INFO, "init",
                "Slurm's batch script, outside any srun step: a job of one "
                "(start the ranks with srun to run several)");
        pi->source = "slurm";
        pi->rank = 0;
        pi->size = 1;
        *found = 1;
        return HVD_OK;
    }
    st = rank_size(get, ctx, "SLURM_PROCID", ntasks, pi, found);
    if (st != HVD_OK || !*found)
        return st;
    if (pmi_differs(get, ctx, pi)) {
        *found = 0;
        return HVD_OK;
    }
    pi->source = "slurm";
    st = opt_int(get, ctx, "SLURM_LOCALID", 0, MAX_RANKS, &pi->local_rank);
    if (st == HVD_OK)
        st = check_local(pi, "SLURM_LOCALID", "(the local size)");
    if (st == HVD_OK && list_name != NULL)
        st = hvd_slurm_nodes_expand(list_name, get(list_name, ctx), &nodes);
    if (st == HVD_OK && list_name != NULL)
        st = slurm_layout(get, ctx, pi, list_name, &nodes);
    if (st == HVD_OK && !mpi)
        st = slurm_hosted(get, ctx, pi, step, list_name, &nodes);
    hvd_slurm_nodes_free(&nodes);
    return st;
}

static hvd_status from_pmi(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                           int *found) {
    hvd_status st = rank_size(get, ctx, "PMI_RANK", "PMI_SIZE", pi, found);

    if (st == HVD_OK && *found)
        pi->source = "pmi";
    return st;
}

typedef hvd_status (*source_fn)(hvd_env_get_fn get, void *ctx, hvd_procinfo *pi,
                                int *found);

/* The launchers, first match wins: hvdrun's variables name the job even
 * where hvdrun runs inside another launcher's job, and an MPI launcher's
 * inside an allocation's. */
static const source_fn sources[] = {elastic_worker, from_hvdrun, from_openmpi,
                                    from_torchrun,  from_slurm,  from_pmi};

hvd_status hvd_discover(hvd_env_get_fn get, void *ctx, hvd_procinfo *info) {
    hvd_procinfo pi;
    int found = 0;
    hvd_status st = HVD_OK;

    memset(&pi, 0, sizeof(pi));
    pi.local_rank = pi.local_size = pi.cross_rank = pi.cross_size = -1;
    pi.worker = -1;

    for (size_t k = 0; k < sizeof(sources) / sizeof(sources[0]); k++) {
        st = sources[k](get, ctx, &pi, &found);
        if (st != HVD_OK)
            return st;
        if (found)
            break;
    }
    if (!found) {
        st = torch_incomplete(get, ctx);
        if (st != HVD_OK)
            return st;
        pi.source = "single";
        pi.rank = 0;
        pi.size = 1;
    }
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
