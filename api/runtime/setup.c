/*
 * The job's setup (api/runtime/setup.h): who the ranks are and where they
 * run, the bootstrap they meet through, the GPU and NCCL choice, the
 * transports the registry chooses, and the paths the selector plans over.
 */
#include "api/runtime/setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api/runtime/hosted.h"
#include "collectives/coll.h"
#include "gpu/gpu.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/base/memtype.h"
#include "transport/bootstrap/job_id.h"
#include "transport/bootstrap/rendezvous.h"
#include "transport/transport.h"

#include <openssl/rand.h>

/* What each rank tells the others about itself at init. */
typedef struct host_blob {
    char host[HVD_HOST_MAX];
    int32_t pid;
} host_blob;

/* 1 if every host named in all[0..n) runs as many ranks as every other. */
static int same_ranks_per_host(int n, const host_blob *all) {
    int first = -1;

    for (int i = 0; i < n; i++) {
        int count = 0;
        for (int j = 0; j < n; j++)
            count += strcmp(all[i].host, all[j].host) == 0;
        if (first < 0)
            first = count;
        else if (count != first)
            return 0;
    }
    return 1;
}

/* Fills the local and cross ranks a launcher did not give from the host
 * names of all ranks: hosts are numbered in order of their lowest rank. */
static void place_ranks(hvd_procinfo *info, const host_blob *all) {
    int r = info->rank, local_rank = 0, local_size = 0;
    int cross_rank = -1, cross_size = 0;

    for (int i = 0; i < info->size; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            if (strcmp(all[j].host, all[i].host) == 0)
                first = 0;
        if (first) {
            if (strcmp(all[i].host, all[r].host) == 0)
                cross_rank = cross_size;
            cross_size++;
        }
        if (strcmp(all[i].host, all[r].host) == 0) {
            if (i < r)
                local_rank++;
            local_size++;
        }
    }
    if (info->local_rank < 0)
        info->local_rank = local_rank;
    if (info->local_size < 0)
        info->local_size = local_size;
    if (info->cross_rank < 0)
        info->cross_rank = cross_rank;
    if (info->cross_size < 0)
        info->cross_size = cross_size;
}

/* The secret and job id rank 0 makes for a job bootstrapped through its
 * launcher (its own channel carries them, so no one else sees them). */
typedef struct job_blob {
    char secret[65];
    uint8_t job_id[HVD_JOB_ID_LEN];
} job_blob;

static hvd_status launcher_job_identity(hvd_bootstrap *bs, hvd_procinfo *info) {
    job_blob mine, *all = calloc((size_t)bs->size, sizeof(*all));
    uint8_t raw[32];

    if (all == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    memset(&mine, 0, sizeof(mine));
    if (bs->rank == 0) {
        if (RAND_bytes(raw, sizeof(raw)) != 1 ||
            RAND_bytes(mine.job_id, sizeof(mine.job_id)) != 1) {
            free(all);
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "RAND_bytes failed to make a job secret");
        }
        for (size_t i = 0; i < sizeof(raw); i++)
            snprintf(mine.secret + 2 * i, 3, "%02x", raw[i]);
    }
    hvd_status st = bs->allgather(bs, &mine, sizeof(mine), all);
    if (st == HVD_OK) {
        all[0].secret[64] = '\0';
        snprintf(info->secret, sizeof(info->secret), "%s", all[0].secret);
        memcpy(info->job_id, all[0].job_id, HVD_JOB_ID_LEN);
        info->have_job_id = 1;
    }
    free(all);
    return st;
}

/* Under Slurm, MPI's word on the job's size is checked: srun without
 * --mpi=pmix starts every task as an MPI singleton, N jobs of one. */
static hvd_status check_singletons(const hvd_procinfo *info,
                                   const hvd_bootstrap *bs) {
    if (info->source == NULL || strcmp(info->source, "slurm") != 0 ||
        bs->size == info->size)
        return HVD_OK;
    return hvd_error_set(HVD_ERR_MISMATCH,
                         "MPI sees a job of %d rank%s but Slurm started %d "
                         "(SLURM_NTASKS): srun without --mpi=pmix starts each "
                         "task as an MPI singleton (Open MPI 5 needs PMIx); "
                         "use srun --mpi=pmix, or leave HVD_TRANSPORT at "
                         "auto/tcp and hvd finds its peers by itself",
                         bs->size, bs->size == 1 ? "" : "s", info->size);
}

/* HVD_TRANSPORT=mpi in a job whose launcher started no MPI job (torchrun,
 * srun without --mpi=pmix): MPI would see each rank as a singleton. */
static hvd_status hosted_without_mpi(const hvd_procinfo *info) {
    if (strcmp(info->source, "slurm") == 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=mpi, but srun started these %d "
                             "tasks without an MPI plugin (no PMIx or PMI "
                             "variables): each would be an MPI singleton, a "
                             "job of one (Open MPI 5 needs PMIx); use srun "
                             "--mpi=pmix, or leave HVD_TRANSPORT at auto/tcp "
                             "and hvd finds its peers by itself",
                             info->size);
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "HVD_TRANSPORT=mpi, but %s starts no MPI job: each "
                         "rank would be an MPI singleton, a job of one; use "
                         "mpirun, or leave HVD_TRANSPORT at auto/tcp and hvd "
                         "finds its peers by itself",
                         info->source);
}

/*
 * The bootstrap: hvdrun's rendezvous when it is given, else the launcher's
 * through a transport that can bootstrap the job (MPI under mpirun or
 * srun, in an MPI build); *by_out then names that transport, else it is
 * NULL. local_addr_out gets the address to listen on by default ("" when
 * the bootstrap does not tell one).
 */
static hvd_status open_bootstrap(hvd_setup *s, hvd_bootstrap **bs_out,
                                 const hvd_transport_ops **by_out,
                                 char local_addr_out[64]) {
    hvd_procinfo *info = &s->info;
    hvd_status st;

    local_addr_out[0] = '\0';
    *by_out = NULL;
    if (s->elastic_bs != NULL) {
        /* This generation's rendezvous connection (hvd_setup_elastic_join),
         * kept open for hvdrun's notices. */
        snprintf(local_addr_out, 64, "%s", s->elastic_addr);
        *bs_out = s->elastic_bs;
        return HVD_OK;
    }
    if (info->hosted && strcasecmp(s->cfg.transport, "mpi") == 0)
        return hosted_without_mpi(info);
    if (info->hosted)
        return hvd_setup_open_hosted(s, bs_out, local_addr_out);
    if (info->rdv_port != 0) {
        if (info->secret[0] == '\0' || !info->have_job_id)
            return hvd_error_set(HVD_ERR_AUTH,
                                 "HVD_SECRET and HVD_JOB_ID must be set for "
                                 "a job of %d ranks (hvdrun sets them): "
                                 "refusing to connect without a job secret",
                                 info->size);
        return hvd_rdv_client_connect(info->rdv_addr, info->rdv_port,
                                      info->rank, info->size, info->job_id,
                                      info->secret, s->cfg.start_timeout_ns,
                                      bs_out, local_addr_out);
    }
    /* Started by a launcher of a transport's own (mpirun): the registry
     * asks the transports that can bootstrap through it. */
    st = hvd_transport_bootstrap_open(info->source, info->rank, info->size,
                                      bs_out, by_out);
    if (st != HVD_OK)
        return st;
    st = check_singletons(info, *bs_out);
    if (st != HVD_OK) {
        hvd_transport_bootstrap_close(*by_out, *bs_out);
        *bs_out = NULL;
        *by_out = NULL;
        return st;
    }
    if ((*bs_out)->size != info->size || (*bs_out)->rank != info->rank) {
        /* The launcher is the authority on who is who when it launched
         * the job (under Slurm, on the size only: checked above). */
        HVD_DEBUG("api", "%s says rank %d of %d (%s said %d of %d)",
                  (*by_out)->title, (*bs_out)->rank, (*bs_out)->size,
                  info->source, info->rank, info->size);
        info->rank = (*bs_out)->rank;
        info->size = (*bs_out)->size;
        info->local_rank = info->local_size = -1;
        info->cross_rank = info->cross_size = -1;
        hvd_log_set_rank(info->rank);
    }
    st = launcher_job_identity(*bs_out, info);
    if (st != HVD_OK) {
        hvd_transport_bootstrap_close(*by_out, *bs_out);
        *bs_out = NULL;
        *by_out = NULL;
    }
    return st;
}

static void close_bootstrap(hvd_setup *s, hvd_bootstrap *bs,
                            const hvd_transport_ops *by) {
    if (bs == s->elastic_bs)
        return; /* hvd_setup_close closes it */
    if (by != NULL) {
        hvd_transport_bootstrap_close(by, bs);
        return;
    }
    hvd_rdv_client_close(bs);
}

/* ------------------------------------------------------------------ */
/* GPU and NCCL choice                                                 */

/*
 * Before anything else: what HVD_TRANSPORT says about NCCL, and whether
 * this rank can honour it. Device tensors need no choice here: they take
 * NCCL, or the staging pipeline over the transport chosen.
 */
hvd_status hvd_setup_gpu(hvd_setup *s) {
    int required = strcasecmp(s->cfg.transport, "nccl") == 0;
    int ndev = 0;
    char why[320];

    s->nccl = HVD_NCCL_OFF;
    s->nccl_have_id = 0;
    s->gpu_device = -1;
    if (required && !hvd_gpu_nccl_built())
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=nccl: this hvd was built without "
                             "%s (it needs the CUDA toolkit with NCCL when hvd "
                             "is built; docs/gpu.md); unset it or use tcp",
                             hvd_gpu_built() ? "NCCL" : "CUDA and NCCL");
    /* The device probe (cuInit, no context) is paid only where CUDA is
     * built in. */
    if (hvd_gpu_built())
        ndev = hvd_mem_device_count();
    if (required && ndev == 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=nccl: no CUDA device on this rank "
                             "(%s); unset it or use tcp",
                             hvd_mem_no_device_reason());
    if (required && !hvd_gpu_nccl_usable(why, sizeof(why)))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=nccl: %s; set HVD_NCCL_LIBRARY to "
                             "libnccl.so.2, or use tcp",
                             why);
    if (ndev > 0) {
        int local = s->info.local_rank > 0 ? s->info.local_rank : 0;
        if (s->cfg.gpu_device >= ndev)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "HVD_GPU_DEVICE=%d, but this rank sees %d "
                                 "CUDA device(s) (0 to %d; "
                                 "CUDA_VISIBLE_DEVICES may hide others)",
                                 s->cfg.gpu_device, ndev, ndev - 1);
        s->gpu_device =
            s->cfg.gpu_device >= 0 ? s->cfg.gpu_device : local % ndev;
    }
    if (required)
        s->nccl = HVD_NCCL_REQUIRED;
    else if (strcasecmp(s->cfg.transport, "auto") == 0 && hvd_gpu_nccl_built())
        s->nccl = HVD_NCCL_AUTO;
    return HVD_OK;
}

/* What each rank tells the others about NCCL at init. */
typedef struct nccl_blob {
    int32_t usable;
    int32_t device;
    char bus[32];
    char why[216];
    uint8_t id[HVD_NCCL_ID_BYTES];
} nccl_blob;

/*
 * A job of several: picks each rank's device by its local rank (unless
 * HVD_GPU_DEVICE), and agrees through the bootstrap whether NCCL is used:
 * every rank can load it and has a GPU of its own (NCCL refuses two ranks
 * on one GPU). Rank 0's NCCL unique id travels with the answer; the
 * communicator itself is made when the first device tensor comes.
 * Every rank of an NCCL build with HVD_TRANSPORT auto or nccl takes part,
 * device or not, so the bootstrap calls match.
 */
static hvd_status nccl_agree(hvd_setup *s, hvd_bootstrap *bs,
                             const char (*hosts)[HVD_HOST_MAX]) {
    nccl_blob mine, *all;
    int ndev = s->gpu_device >= 0 ? hvd_mem_device_count() : 0;
    int bad = -1, dup_a = -1, dup_b = -1;
    hvd_status st;

    if (ndev > 0 && s->cfg.gpu_device < 0)
        s->gpu_device =
            (s->info.local_rank > 0 ? s->info.local_rank : 0) % ndev;
    if (s->nccl == HVD_NCCL_OFF)
        return HVD_OK;
    memset(&mine, 0, sizeof(mine));
    mine.device = s->gpu_device;
    if (ndev == 0) {
        snprintf(mine.why, sizeof(mine.why), "no CUDA device: %s",
                 hvd_mem_no_device_reason());
    } else if (!hvd_gpu_nccl_usable(mine.why, sizeof(mine.why))) {
        /* why is set */
    } else if (hvd_gpu_bus_id(s->gpu_device, mine.bus, sizeof(mine.bus)) !=
               HVD_OK) {
        snprintf(mine.why, sizeof(mine.why), "%s", hvd_error_get());
    } else if (bs->rank == 0 && hvd_gpu_nccl_unique_id(mine.id) != HVD_OK) {
        snprintf(mine.why, sizeof(mine.why), "%s", hvd_error_get());
    } else {
        mine.usable = 1;
    }
    all = calloc((size_t)bs->size, sizeof(*all));
    if (all == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    st = bs->allgather(bs, &mine, sizeof(mine), all);
    if (st != HVD_OK) {
        free(all);
        return st;
    }
    for (int r = 0; r < bs->size && bad < 0; r++) {
        all[r].why[sizeof(all[r].why) - 1] = '\0';
        all[r].bus[sizeof(all[r].bus) - 1] = '\0';
        if (!all[r].usable)
            bad = r;
    }
    for (int r = 0; r < bs->size && bad < 0 && dup_a < 0; r++)
        for (int q = r + 1; q < bs->size && dup_a < 0; q++)
            if (strcmp(hosts[r], hosts[q]) == 0 &&
                strcmp(all[r].bus, all[q].bus) == 0) {
                dup_a = r;
                dup_b = q;
            }
    if (bad >= 0 || dup_a >= 0) {
        char text[HVD_ERROR_MAX];
        if (bad >= 0)
            snprintf(text, sizeof(text), "rank %d cannot use NCCL (%s)", bad,
                     all[bad].why);
        else
            snprintf(text, sizeof(text),
                     "ranks %d and %d share CUDA device %d (%s) on host %s, "
                     "and NCCL needs a GPU per rank",
                     dup_a, dup_b, all[dup_a].device, all[dup_a].bus,
                     hosts[dup_a]);
        if (s->nccl == HVD_NCCL_REQUIRED)
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_TRANSPORT=nccl: %s; %suse "
                               "HVD_TRANSPORT=tcp (device tensors are then "
                               "staged through host memory)",
                               text,
                               bad >= 0 ? ""
                                        : "give each rank its own GPU "
                                          "(HVD_GPU_DEVICE, "
                                          "CUDA_VISIBLE_DEVICES) or ");
        else
            HVD_INFO("api",
                     "NCCL is not used: %s; device tensors are staged "
                     "through host memory",
                     text);
        s->nccl = HVD_NCCL_OFF;
    } else {
        memcpy(s->nccl_id, all[0].id, HVD_NCCL_ID_BYTES);
        s->nccl_have_id = 1;
    }
    free(all);
    return st;
}

/*
 * The ways data can travel: the primary transport, and in auto the local
 * transport beside it among the ranks of each host; the communicators over
 * them; and the selector's table (collectives/select.h). Collective.
 */
static hvd_status setup_paths(hvd_setup *s,
                              const hvd_transport_params *params) {
    hvd_paths *P = &s->paths;
    int size = params->size, rank = params->rank;
    int *host_of = calloc((size_t)size, sizeof(int));
    int *count = calloc((size_t)size, sizeof(int));
    int *map = calloc((size_t)size, sizeof(int));
    int nhosts = 0, equal = 1, shared = 0, n = 0, me = -1;
    const hvd_transport_choice *tps = &s->tps;
    hvd_transport *shm_tp = NULL;
    hvd_comm *net = NULL;
    hvd_status st = HVD_OK;

    memset(P, 0, sizeof(*P));
    if (host_of == NULL || count == NULL || map == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    /* Hosts numbered by their lowest rank. */
    for (int i = 0; i < size; i++) {
        host_of[i] = -1;
        for (int j = 0; j < i && host_of[i] < 0; j++)
            if (strcmp(params->hosts[i], params->hosts[j]) == 0)
                host_of[i] = host_of[j];
        if (host_of[i] < 0)
            host_of[i] = nhosts++;
        count[host_of[i]]++;
    }
    for (int h = 0; h < nhosts; h++) {
        equal &= count[h] == count[0];
        shared |= count[h] > 1;
    }
    P->single_host = nhosts == 1;
    P->net_name = tps->ops->name;
    /* The local transport carries the same-host part of hier: itself when
     * it is the primary (one host), else the one beside the primary. */
    if (tps->caps.reach == HVD_REACH_SAME_HOST)
        shm_tp = tps->tp;
    else if (tps->local_tp != NULL)
        shm_tp = tps->local_tp;
    snprintf(P->hier_name, sizeof(P->hier_name), "%s+%s",
             tps->local_ops != NULL ? tps->local_ops->name : "local",
             tps->ops->name);

    /* This host's ranks, in rank order. */
    for (int i = 0; i < size; i++) {
        if (host_of[i] == host_of[rank]) {
            if (i == rank)
                me = n;
            map[n++] = i;
        }
    }
    if (shm_tp != NULL && P->single_host)
        st = hvd_comm_create(rank, size, shm_tp, HVD_CHANNEL_DATA, &s->cfg.comm,
                             &P->shm);
    else if (shm_tp != NULL)
        st = hvd_comm_create_sub(me, n, map, shm_tp, HVD_CHANNEL_DATA,
                                 &s->cfg.comm, &P->local);
    /* The ranks of this local rank on every host, in host order. */
    if (st == HVD_OK && !P->single_host && equal) {
        int xn = 0;
        for (int h = 0; h < nhosts; h++) {
            int k = 0;
            for (int i = 0; i < size; i++) {
                if (host_of[i] != h)
                    continue;
                if (k++ == me)
                    map[xn++] = i;
            }
        }
        st = hvd_comm_create_sub(host_of[rank], xn, map, tps->tp,
                                 HVD_CHANNEL_DATA, &s->cfg.comm, &P->cross);
    }
    if (st == HVD_OK)
        st = hvd_comm_create(rank, size, tps->tp, HVD_CHANNEL_DATA,
                             &s->cfg.comm, &net);
    if (st != HVD_OK)
        goto out;

    hvd_model *m = &P->model;
    m->size = size;
    m->local_size = equal ? count[0] : 0;
    m->cross_size = nhosts;
    m->native = s->cfg.comm.native;
    m->hier = P->local != NULL && P->cross != NULL;
    for (int t = 0; t < HVD_NTPS; t++)
        for (int c = 0; c < HVD_NCLASSES; c++)
            m->link[t][c].alpha = -1;
    m->chunk[HVD_TP_NET] = (uint32_t)s->cfg.comm.chunk_bytes;
    m->chunk[HVD_TP_SHM] =
        s->cfg.chunk_forced ? (uint32_t)s->cfg.comm.chunk_bytes : 256 * 1024;
    /* One-sided reads only if every rank can make them. */
    {
        int32_t direct = P->shm != NULL     ? hvd_comm_can_get(P->shm)
                         : P->local != NULL ? hvd_comm_can_get(P->local)
                                            : 0;
        st = hvd_rd_allreduce(net, &direct, &direct, 1, HVD_INT32, HVD_MIN);
        m->direct = direct;
    }
    if (st == HVD_OK)
        st = hvd_paths_tune(P, net, s->cfg.comm.allreduce_algo,
                            s->cfg.comm.bcast_algo, s->cfg.tuning_file);
    if (st == HVD_OK)
        s->have_paths = 1;
out:
    hvd_comm_destroy(net);
    if (st != HVD_OK)
        hvd_paths_clear(P);
    free(host_of);
    free(count);
    free(map);
    return st;
}

void hvd_setup_close(hvd_setup *s) {
    if (s->have_paths)
        hvd_paths_clear(&s->paths);
    s->have_paths = 0;
    hvd_transport_choice_close(&s->tps);
    hvd_rdv_client_close(s->elastic_bs);
    s->elastic_bs = NULL;
    hvd_rdv_host_stop(s->rdv_host);
    s->rdv_host = NULL;
}

/* How long a polling thread that has a core only pauses between looks: a
 * step of small parts takes a few microseconds where each rank has a core,
 * and a peer that has not answered by then is likely waiting for one. */
#define SPIN_CALM_NS (10 * 1000LL)

void hvd_setup_engine_config(const hvd_setup *s, hvd_engine_config *ec) {
    memset(ec, 0, sizeof(*ec));
    ec->fusion_threshold = s->cfg.fusion_threshold;
    ec->fusion_tensor_max = s->cfg.fusion_tensor_max;
    ec->step_carry_bytes = s->cfg.step_carry_bytes;
    /* A part of another kind than an allreduce: an eighth of the budget
     * where the control channel is memory (the part's three copies soon
     * cost more than the collective's own exchanges), half of it where it
     * is a network, whose every exchange costs tens of microseconds
     * (docs/benchmarks.md, "Issue 35: engine small-message costs"). */
    ec->carry_part_max = s->tps.caps.reach == HVD_REACH_SAME_HOST
                             ? s->cfg.step_carry_bytes / 8
                             : s->cfg.step_carry_bytes / 2;
    ec->carry_counts_free = s->tps.caps.reach != HVD_REACH_SAME_HOST;
    /* A waiting thread runs the engine only in jobs without a GPU (the
     * device executor stays on the engine thread). It polls before it
     * blocks: 50 us while this host has a core for every rank, pausing
     * between looks for the first SPIN_CALM_NS and yielding the core
     * after, else 100 us yielding the core between looks (what the other
     * ranks need is a time slice: sleeping costs a wake-up). */
    ec->caller_progress = s->cfg.caller_progress && s->gpu_device < 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    ec->spin_yield = ncpu > 0 && s->info.local_size > ncpu;
    int spin_us = s->cfg.spin_us >= 0 ? s->cfg.spin_us
                  : ec->spin_yield    ? 100
                                      : 50;
    ec->spin_ns = (int64_t)spin_us * 1000;
    ec->spin_calm_ns = SPIN_CALM_NS;
    ec->cache_capacity = s->cfg.cache_capacity;
    ec->cycle_time_ms = s->cfg.cycle_time_ms;
    ec->stall_check_s = s->cfg.stall_check_s;
    ec->stall_shutdown_s = s->cfg.stall_shutdown_s;
    ec->timeout_ns = s->cfg.timeout_ns;
    ec->timeline_path = s->cfg.timeline[0] != '\0' ? s->cfg.timeline : NULL;
    ec->timeline_mark_cycles = s->cfg.timeline_mark_cycles;
    ec->elastic = s->info.elastic;
    ec->dev.tp_mem_types = s->tp_mem_types;
    ec->dev.gpu.device = s->gpu_device;
    ec->dev.gpu.stage_bytes = s->cfg.gpu_stage_bytes;
    ec->dev.gpu.stage_depth = s->cfg.gpu_stage_depth;
    ec->dev.gpu.nccl_timeout_ns = s->cfg.start_timeout_ns;
    /* A job of one takes NCCL only when told to (it then runs every
     * device collective through a communicator of one). */
    ec->dev.nccl = s->info.size > 1 || s->nccl == HVD_NCCL_REQUIRED
                       ? s->nccl
                       : HVD_NCCL_OFF;
    ec->dev.nccl_have_id = s->nccl_have_id;
    memcpy(ec->dev.nccl_id, s->nccl_id, HVD_NCCL_ID_BYTES);
}
/* ------------------------------------------------------------------ */
/* The job                                                             */

/* The transport HVD_TRANSPORT asks for: "auto" or a transport's name;
 * "nccl" is the GPU module's (hvd_setup_gpu): its control messages and
 * host tensors take auto's transports. */
static hvd_status transport_want(const hvd_setup *s, const char **out) {
    const char *name = s->cfg.transport;

    if (strcasecmp(name, "nccl") == 0 && s->nccl == HVD_NCCL_REQUIRED) {
        *out = "auto";
        return HVD_OK;
    }
    if (strcasecmp(name, "nccl") == 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=%s: that transport is not built "
                             "into this hvd (built in: %s); unset it or use "
                             "tcp",
                             name, hvd_transport_names());
    hvd_status st = hvd_transport_check_want(name, "nccl");
    if (st == HVD_OK)
        *out = name;
    return st;
}

/* The primary's memory types (what this rank could do and what every rank
 * agreed on) and whether it has native collectives. */
static void note_primary(hvd_setup *s) {
    const hvd_transport_choice *c = &s->tps;
    const char *direct = hvd_env_getenv("HVD_TEST_GPU_DIRECT", NULL);

    s->cfg.comm.native = c->caps.native_collectives;
    s->tp_mem_types = c->caps.mem_types & c->ops->mem_types(c->tp);
    if (hvd_gpu_simulated() && direct != NULL && strcmp(direct, "1") == 0)
        s->tp_mem_types |= HVD_MEM_BIT(HVD_MEM_DEVICE);
}

hvd_status hvd_setup_job(hvd_setup *s) {
    hvd_procinfo *info = &s->info;
    hvd_bootstrap *bs = NULL;
    host_blob mine, *all = NULL;
    char local_addr[64];
    const char(*hosts)[HVD_HOST_MAX] = NULL;
    int *pids = NULL;
    const hvd_transport_ops *bs_by = NULL;
    const char *want = "auto";
    hvd_transport_params params;
    hvd_status st;

    st = transport_want(s, &want);
    if (st == HVD_OK)
        st = open_bootstrap(s, &bs, &bs_by, local_addr);
    if (st != HVD_OK)
        return st;

    memset(&mine, 0, sizeof(mine));
    /* HVD_HOSTNAME (as Horovod's HOROVOD_HOSTNAME) names the host this
     * rank counts as: ranks of one name share memory and form the local
     * groups of hier. */
    if (s->cfg.hostname[0] != '\0')
        snprintf(mine.host, sizeof(mine.host), "%s", s->cfg.hostname);
    else if (gethostname(mine.host, sizeof(mine.host) - 1) != 0)
        snprintf(mine.host, sizeof(mine.host), "unknown");
    mine.pid = (int32_t)getpid();
    all = calloc((size_t)info->size, sizeof(*all));
    hosts = calloc((size_t)info->size, HVD_HOST_MAX);
    pids = calloc((size_t)info->size, sizeof(*pids));
    if (all == NULL || hosts == NULL || pids == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    st = bs->allgather(bs, &mine, sizeof(mine), all);
    if (st != HVD_OK)
        goto out;
    for (int i = 0; i < info->size; i++) {
        all[i].host[HVD_HOST_MAX - 1] = '\0';
        memcpy((char *)hosts[i], all[i].host, HVD_HOST_MAX);
        pids[i] = all[i].pid;
    }
    /* HVD_HOSTNAME renames the hosts: local and cross ranks follow the
     * names, whatever the launcher said. */
    if (s->cfg.hostname[0] != '\0')
        info->local_rank = info->local_size = info->cross_rank =
            info->cross_size = -1;
    place_ranks(info, all);
    s->homogeneous = same_ranks_per_host(info->size, all);
    st = nccl_agree(s, bs, hosts);
    if (st != HVD_OK)
        goto out;

    memset(&params, 0, sizeof(params));
    params.rank = info->rank;
    params.size = info->size;
    params.bootstrap = bs;
    memcpy(params.job_id, info->job_id, HVD_JOB_ID_LEN);
    params.secret = info->secret;
    params.hosts = hosts;
    params.pids = pids;
    params.timeout_ns = s->cfg.timeout_ns;
    params.connect_timeout_ns = s->cfg.start_timeout_ns;
    params.env = hvd_env_getenv;
    params.launcher_addr = local_addr;
    params.gpu_device = s->gpu_device;
    st = hvd_transport_choose(want, &params, &s->tps);
    if (st != HVD_OK)
        goto out;
    note_primary(s);
    HVD_INFO("api",
             "rank %d of %d (local %d of %d, host %d of %d) via %s, "
             "transport %s%s%s",
             info->rank, info->size, info->local_rank, info->local_size,
             info->cross_rank, info->cross_size,
             bs_by != NULL ? bs_by->title : info->source, s->tps.ops->name,
             s->tps.local_ops != NULL ? " beside " : "",
             s->tps.local_ops != NULL ? s->tps.local_ops->name : "");
    st = setup_paths(s, &params);
out:
    free(all);
    free((void *)hosts);
    free(pids);
    /* A failed init stops rank 0's hosted server first: the ranks leaving
     * it then are not news. */
    if (st != HVD_OK) {
        hvd_rdv_host_stop(s->rdv_host);
        s->rdv_host = NULL;
    }
    close_bootstrap(s, bs, bs_by);
    return st;
}

hvd_status hvd_setup_elastic_join(hvd_setup *s) {
    hvd_procinfo *info = &s->info;
    hvd_rdv_assignment asg;
    hvd_status st;

    if (info->secret[0] == '\0' || !info->have_job_id)
        return hvd_error_set(HVD_ERR_AUTH,
                             "HVD_SECRET and HVD_JOB_ID must be set for an "
                             "elastic job (hvdrun sets them)");
    if (!s->have_elastic_job_id) {
        memcpy(s->elastic_job_id, info->job_id, HVD_JOB_ID_LEN);
        s->have_elastic_job_id = 1;
    }
    st = hvd_rdv_client_join(info->rdv_addr, info->rdv_port, info->worker,
                             s->elastic_job_id, info->secret,
                             s->cfg.elastic_timeout_ns, &s->elastic_bs,
                             s->elastic_addr, &asg);
    if (st != HVD_OK)
        return st;
    info->rank = asg.rank;
    info->size = asg.size;
    info->local_rank = asg.local_rank;
    info->local_size = asg.local_size;
    info->cross_rank = asg.cross_rank;
    info->cross_size = asg.cross_size;
    s->generation = asg.generation;
    /* Transports and shared memory of this generation only. */
    hvd_job_id_of_generation(s->elastic_job_id, asg.generation, info->job_id);
    HVD_INFO("api", "worker %d: rank %d of %d in generation %u", info->worker,
             info->rank, info->size, asg.generation);
    return HVD_OK;
}

int hvd_setup_elastic_updates(hvd_setup *s) {
    return s->elastic_bs != NULL ? hvd_rdv_client_updates(s->elastic_bs) : 0;
}

hvd_status hvd_setup_goodbye(hvd_setup *s) {
    return hvd_transport_choice_shutdown(&s->tps);
}
