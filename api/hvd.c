/*
 * The public API's lifecycle: init and shutdown (the job's setup: the
 * bootstrap, the transports, the GPU, the paths, the engine), the job's
 * shape, the timeline and the build's parts. It owns the job's state; the
 * collectives' entry points (api/submit.c) reach it through api/job.h.
 */
#include "hvd/hvd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api/hvd_internal.h"
#include "api/job.h"
#include "api/runtime/config.h"
#include "api/runtime/discovery.h"
#include "api/runtime/engine.h"
#include "api/runtime/timeline.h"
#include "collectives/coll.h"
#include "collectives/select.h"
#include "gpu/gpu.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/base/memtype.h"
#include "transport/net.h"
#include "transport/rendezvous.h"
#include "transport/transport.h"

#include <openssl/rand.h>

#ifdef HVD_WITH_MPI
#include "transport/mpi/mpi.h"
#endif

typedef struct host_blob {
    char host[HVD_HOST_MAX];
    int32_t pid;
    int32_t flags; /* HOST_* */
} host_blob;

/* This rank has a usable RDMA device (the verbs transport's probe). */
#define HOST_VERBS 1

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

static struct {
    pthread_mutex_t lock;
    int initialized;
    int was_initialized; /* a multi-rank job was shut down */
    hvd_procinfo info;
    hvd_config cfg;
    const hvd_transport_ops *ops;
    hvd_transport *tp;
    const hvd_transport_ops *shm_ops; /* shm beside the primary (auto) */
    hvd_transport *shm_tp;
    hvd_paths paths;
    int have_paths;
    hvd_engine *engine;
    uint64_t unnamed[HVD_KIND_COUNT]; /* counters naming NULL-named ops */
    /* Device tensors (docs/gpu.md). */
    int homogeneous;  /* every host runs as many ranks (hvd_is_homogeneous) */
    int gpu_device;   /* this rank's CUDA device, -1: none */
    int nccl;         /* HVD_NCCL_* (api/runtime/devexec.h) */
    int nccl_have_id; /* nccl_id is rank 0's */
    uint8_t nccl_id[HVD_NCCL_ID_BYTES];
    unsigned tp_mem_types; /* the transport's caps.mem_types */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .gpu_device = -1};

const char *hvd_strerror(hvd_status status) {
    switch (status) {
#define HVD_STATUS_TEXT_(name, text)                                           \
    case name:                                                                 \
        return text;
        HVD_STATUS_MAP(HVD_STATUS_TEXT_)
#undef HVD_STATUS_TEXT_
    }
    return "unknown status";
}

const char *hvd_last_error(void) { return hvd_error_get(); }

/* ------------------------------------------------------------------ */
/* Init                                                                */

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

/* What HVD_TRANSPORT asks for: "tcp", "shm", "mpi", "verbs" or "auto"
 * (also for "nccl", whose control messages and host tensors take auto's
 * transports). */
static hvd_status transport_choice(const char *name, const char **out) {
    static const char *const known[] = {"auto", "tcp", "shm", "mpi", "verbs"};

    if (strcasecmp(name, "nccl") == 0 && g.nccl == HVD_NCCL_REQUIRED) {
        *out = "auto";
        return HVD_OK;
    }
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        const hvd_transport_ops *ops;
        int verbs = strcmp(known[i], "verbs") == 0;
        if (strcasecmp(name, known[i]) != 0)
            continue;
        *out = known[i];
        if (i > 0 && hvd_transport_lookup(*out, &ops) != HVD_OK)
            return hvd_error_set(
                HVD_ERR_UNSUPPORTED,
                "HVD_TRANSPORT=%s: that transport is not built into this hvd "
                "(built in: %s; %s support needs %s development files when "
                "hvd is built); unset it or use tcp",
                name, hvd_transport_names(), verbs ? "RDMA" : "MPI",
                verbs ? "libibverbs'" : "Open MPI's");
        return HVD_OK;
    }
    if (strcasecmp(name, "nccl") == 0)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=%s: that transport is not built "
                             "into this hvd (built in: %s); unset it or use "
                             "tcp",
                             name, hvd_transport_names());
    return hvd_error_set(HVD_ERR_INVALID_ARG,
                         "HVD_TRANSPORT=%s is not one of auto, tcp, shm, "
                         "mpi, verbs, nccl",
                         name);
}

/* The secret and job id rank 0 makes for a job bootstrapped through MPI
 * (MPI's own channel carries them, so no one else sees them). */
typedef struct job_blob {
    char secret[65];
    uint8_t job_id[HVD_JOB_ID_LEN];
} job_blob;

static hvd_status mpi_job_identity(hvd_bootstrap *bs, hvd_procinfo *info) {
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

/*
 * The bootstrap: hvdrun's rendezvous when it is given, else MPI (under
 * mpirun or srun, in an MPI build). local_addr_out gets the address to
 * listen on by default ("" when the bootstrap does not tell one).
 */
static hvd_status open_bootstrap(hvd_procinfo *info, hvd_bootstrap **bs_out,
                                 int *via_mpi, char local_addr_out[64]) {
    hvd_status st;

    local_addr_out[0] = '\0';
    *via_mpi = 0;
    if (info->rdv_port != 0) {
        if (info->secret[0] == '\0' || !info->have_job_id)
            return hvd_error_set(HVD_ERR_AUTH,
                                 "HVD_SECRET and HVD_JOB_ID must be set for "
                                 "a job of %d ranks (hvdrun sets them): "
                                 "refusing to connect without a job secret",
                                 info->size);
        return hvd_rdv_client_connect(info->rdv_addr, info->rdv_port,
                                      info->rank, info->size, info->job_id,
                                      info->secret, g.cfg.start_timeout_ns,
                                      bs_out, local_addr_out);
    }
#ifdef HVD_WITH_MPI
    int mrank, msize;
    st = hvd_mpi_env_init(&mrank, &msize);
    if (st != HVD_OK)
        return st;
    if (msize != info->size || mrank != info->rank) {
        /* MPI is the authority on who is who when it launched the job. */
        HVD_DEBUG("api", "MPI says rank %d of %d (%s said %d of %d)", mrank,
                  msize, info->source, info->rank, info->size);
        info->rank = mrank;
        info->size = msize;
        info->local_rank = info->local_size = -1;
        info->cross_rank = info->cross_size = -1;
        hvd_log_set_rank(mrank);
    }
    st = hvd_mpi_bootstrap_open(bs_out);
    if (st != HVD_OK)
        return st;
    *via_mpi = 1;
    st = mpi_job_identity(*bs_out, info);
    if (st != HVD_OK) {
        hvd_mpi_bootstrap_close(*bs_out);
        *bs_out = NULL;
    }
    return st;
#else
    (void)st;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "started by %s as rank %d of %d, but no rendezvous "
                         "is given (HVD_RENDEZVOUS_ADDR/PORT) and this hvd "
                         "was built without MPI to bootstrap through: start "
                         "the job with `hvdrun -np %d ...`, or build hvd "
                         "with Open MPI's development files",
                         info->source, info->rank, info->size, info->size);
#endif
}

static void close_bootstrap(hvd_bootstrap *bs, int via_mpi) {
#ifdef HVD_WITH_MPI
    if (via_mpi) {
        hvd_mpi_bootstrap_close(bs);
        return;
    }
#endif
    (void)via_mpi;
    hvd_rdv_client_close(bs);
}

/* The verbs transport's settings. */
static void ib_params(hvd_transport_params *p) {
    p->ib_device = g.cfg.ib_device;
    p->ib_port = g.cfg.ib_port;
    p->ib_gid_index = g.cfg.ib_gid_index;
    p->ib_chunk_bytes = g.cfg.ib_chunk_bytes;
    p->ib_ring_chunks = g.cfg.ib_ring_chunks;
    p->ib_mr_cache = g.cfg.ib_mr_cache;
    p->ib_gpudirect = g.cfg.ib_gpudirect;
}

#ifdef HVD_WITH_VERBS
/* 1 if this rank has a usable RDMA device; else why says what is missing. */
static int verbs_usable(char *why, size_t whylen) {
    const hvd_transport_ops *ops;
    hvd_transport_params p;
    hvd_caps caps;

    memset(&p, 0, sizeof(p));
    ib_params(&p);
    if (hvd_transport_lookup("verbs", &ops) != HVD_OK ||
        ops->probe(&p, &caps) != HVD_OK) {
        snprintf(why, whylen, "%s", hvd_error_get());
        return 0;
    }
    if (!caps.usable)
        snprintf(why, whylen, "%s", caps.reason);
    return caps.usable;
}
#endif

/* Opens transport name, and learns whether it has native collectives. */
static hvd_status open_transport(const char *name,
                                 const hvd_transport_params *params) {
    hvd_caps caps;
    hvd_status st = hvd_transport_lookup(name, &g.ops);

    if (st == HVD_OK)
        st = g.ops->probe(params, &caps);
    if (st == HVD_OK)
        st = g.ops->open(params, &g.tp);
    if (st == HVD_OK) {
        g.cfg.comm.native = caps.native_collectives;
        /* What this rank could do, and what every rank agreed on. */
        g.tp_mem_types = caps.mem_types & g.ops->mem_types(g.tp);
        const char *direct = hvd_env_getenv("HVD_TEST_GPU_DIRECT", NULL);
        if (hvd_gpu_simulated() && direct != NULL && strcmp(direct, "1") == 0)
            g.tp_mem_types |= HVD_MEM_BIT(HVD_MEM_DEVICE);
    }
    return st;
}

/* ------------------------------------------------------------------ */
/* GPU and NCCL choice                                                 */

/*
 * Before anything else: what HVD_TRANSPORT says about NCCL, and whether
 * this rank can honour it. Device tensors need no choice here: they take
 * NCCL, or the staging pipeline over the transport chosen.
 */
static hvd_status gpu_choice(void) {
    int required = strcasecmp(g.cfg.transport, "nccl") == 0;
    int ndev = 0;
    char why[320];

    g.nccl = HVD_NCCL_OFF;
    g.nccl_have_id = 0;
    g.gpu_device = -1;
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
        int local = g.info.local_rank > 0 ? g.info.local_rank : 0;
        if (g.cfg.gpu_device >= ndev)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "HVD_GPU_DEVICE=%d, but this rank sees %d "
                                 "CUDA device(s) (0 to %d; "
                                 "CUDA_VISIBLE_DEVICES may hide others)",
                                 g.cfg.gpu_device, ndev, ndev - 1);
        g.gpu_device = g.cfg.gpu_device >= 0 ? g.cfg.gpu_device : local % ndev;
    }
    if (required)
        g.nccl = HVD_NCCL_REQUIRED;
    else if (strcasecmp(g.cfg.transport, "auto") == 0 && hvd_gpu_nccl_built())
        g.nccl = HVD_NCCL_AUTO;
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
static hvd_status nccl_agree(hvd_bootstrap *bs,
                             const char (*hosts)[HVD_HOST_MAX]) {
    nccl_blob mine, *all;
    int ndev = g.gpu_device >= 0 ? hvd_mem_device_count() : 0;
    int bad = -1, dup_a = -1, dup_b = -1;
    hvd_status st;

    if (ndev > 0 && g.cfg.gpu_device < 0)
        g.gpu_device = (g.info.local_rank > 0 ? g.info.local_rank : 0) % ndev;
    if (g.nccl == HVD_NCCL_OFF)
        return HVD_OK;
    memset(&mine, 0, sizeof(mine));
    mine.device = g.gpu_device;
    if (ndev == 0) {
        snprintf(mine.why, sizeof(mine.why), "no CUDA device: %s",
                 hvd_mem_no_device_reason());
    } else if (!hvd_gpu_nccl_usable(mine.why, sizeof(mine.why))) {
        /* why is set */
    } else if (hvd_gpu_bus_id(g.gpu_device, mine.bus, sizeof(mine.bus)) !=
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
        if (g.nccl == HVD_NCCL_REQUIRED)
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
        g.nccl = HVD_NCCL_OFF;
    } else {
        memcpy(g.nccl_id, all[0].id, HVD_NCCL_ID_BYTES);
        g.nccl_have_id = 1;
    }
    free(all);
    return st;
}

/*
 * The ways data can travel besides the primary transport: in auto, shared
 * memory among the ranks of each host; the communicators over them; and
 * the selector's table (collectives/select.h). Collective.
 */
static hvd_status setup_paths(const hvd_transport_params *params,
                              const char *want) {
    hvd_paths *P = &g.paths;
    int size = params->size, rank = params->rank;
    int *host_of = calloc((size_t)size, sizeof(int));
    int *count = calloc((size_t)size, sizeof(int));
    int *map = calloc((size_t)size, sizeof(int));
    int nhosts = 0, equal = 1, shared = 0, n = 0, me = -1;
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
    P->net_name = g.ops->name;
    P->hier_name = strcmp(g.ops->name, "mpi") == 0     ? "shm+mpi"
                   : strcmp(g.ops->name, "verbs") == 0 ? "shm+verbs"
                                                       : "shm+tcp";

    if (strcmp(want, "auto") == 0 && shared &&
        strcmp(g.ops->name, "shm") != 0) {
        hvd_caps caps;
        st = hvd_transport_lookup("shm", &g.shm_ops);
        if (st == HVD_OK)
            st = g.shm_ops->probe(params, &caps);
        if (st == HVD_OK)
            st = g.shm_ops->open(params, &g.shm_tp);
        if (st != HVD_OK) {
            /* Every rank reached the same verdict (shm.c): carry on over the
             * primary alone. */
            HVD_WARN("api",
                     "shared memory is not used: %s; same-host ranks talk "
                     "over %s",
                     hvd_error_get(), g.ops->name);
            g.shm_tp = NULL;
            st = HVD_OK;
        }
    }
    shm_tp = strcmp(g.ops->name, "shm") == 0 ? g.tp : g.shm_tp;

    /* This host's ranks, in rank order. */
    for (int i = 0; i < size; i++) {
        if (host_of[i] == host_of[rank]) {
            if (i == rank)
                me = n;
            map[n++] = i;
        }
    }
    if (shm_tp != NULL && P->single_host)
        st = hvd_comm_create(rank, size, shm_tp, HVD_CHANNEL_DATA, &g.cfg.comm,
                             &P->shm);
    else if (shm_tp != NULL)
        st = hvd_comm_create_sub(me, n, map, shm_tp, HVD_CHANNEL_DATA,
                                 &g.cfg.comm, &P->local);
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
        st = hvd_comm_create_sub(host_of[rank], xn, map, g.tp, HVD_CHANNEL_DATA,
                                 &g.cfg.comm, &P->cross);
    }
    if (st == HVD_OK)
        st = hvd_comm_create(rank, size, g.tp, HVD_CHANNEL_DATA, &g.cfg.comm,
                             &net);
    if (st != HVD_OK)
        goto out;

    hvd_model *m = &P->model;
    m->size = size;
    m->local_size = equal ? count[0] : 0;
    m->cross_size = nhosts;
    m->native = g.cfg.comm.native;
    m->hier = P->local != NULL && P->cross != NULL;
    for (int t = 0; t < HVD_NTPS; t++)
        for (int c = 0; c < HVD_NCLASSES; c++)
            m->link[t][c].alpha = -1;
    m->chunk[HVD_TP_NET] = (uint32_t)g.cfg.comm.chunk_bytes;
    m->chunk[HVD_TP_SHM] =
        g.cfg.chunk_forced ? (uint32_t)g.cfg.comm.chunk_bytes : 256 * 1024;
    /* One-sided reads only if every rank can make them. */
    {
        int32_t direct = P->shm != NULL     ? hvd_comm_can_get(P->shm)
                         : P->local != NULL ? hvd_comm_can_get(P->local)
                                            : 0;
        st = hvd_rd_allreduce(net, &direct, &direct, 1, HVD_INT32, HVD_MIN);
        m->direct = direct;
    }
    if (st == HVD_OK)
        st = hvd_paths_tune(P, net, g.cfg.comm.allreduce_algo,
                            g.cfg.comm.bcast_algo, g.cfg.tuning_file);
    if (st == HVD_OK)
        g.have_paths = 1;
out:
    hvd_comm_destroy(net);
    if (st != HVD_OK)
        hvd_paths_clear(P);
    free(host_of);
    free(count);
    free(map);
    return st;
}

/*
 * HVD_TRANSPORT=auto in a job across hosts where every rank has a usable
 * RDMA device: the verbs transport. Opening it is collective and
 * all-or-nothing, so on failure every rank logs why and goes on to TCP.
 */
static hvd_status auto_verbs(const hvd_transport_params *params) {
    hvd_status st = open_transport("verbs", params);

    if (st != HVD_OK) {
        g.tp = NULL;
        HVD_WARN("api",
                 "HVD_TRANSPORT=auto: RDMA could not be set up (%s); using "
                 "TCP instead",
                 hvd_error_get());
    }
    return st;
}

/*
 * HVD_TRANSPORT=auto with every rank on one host: shared memory carries
 * everything, control messages too, and no port is opened. Opening it is
 * collective and every rank reaches the same verdict, so on failure every
 * rank logs why and goes on to the network.
 */
static hvd_status auto_shm(const hvd_transport_params *params) {
    hvd_status st = open_transport("shm", params);

    if (st != HVD_OK) {
        g.tp = NULL;
        HVD_WARN("api",
                 "HVD_TRANSPORT=auto: shared memory could not be set up (%s); "
                 "using the network instead",
                 hvd_error_get());
    }
    return st;
}

static hvd_status init_multi(void) {
    hvd_procinfo *info = &g.info;
    hvd_bootstrap *bs = NULL;
    host_blob mine, *all = NULL;
    char local_addr[64], bind_addr[64];
    const char(*hosts)[HVD_HOST_MAX] = NULL;
    int *pids = NULL;
    int via_mpi = 0, verbs_all = 0, verbs_bad = -1;
    const char *want = "auto";
    char verbs_why[256] = "";
    hvd_transport_params params;
    hvd_status st;

    st = transport_choice(g.cfg.transport, &want);
    if (st == HVD_OK)
        st = open_bootstrap(info, &bs, &via_mpi, local_addr);
    if (st != HVD_OK)
        return st;

    memset(&mine, 0, sizeof(mine));
    /* HVD_HOSTNAME (as Horovod's HOROVOD_HOSTNAME) names the host this
     * rank counts as: ranks of one name share memory and form the local
     * groups of hier. */
    if (g.cfg.hostname[0] != '\0')
        snprintf(mine.host, sizeof(mine.host), "%s", g.cfg.hostname);
    else if (gethostname(mine.host, sizeof(mine.host) - 1) != 0)
        snprintf(mine.host, sizeof(mine.host), "unknown");
    mine.pid = (int32_t)getpid();
#ifdef HVD_WITH_VERBS
    /* Every rank says whether it could use RDMA, so that all decide the
     * same (probe opens the device; only when verbs may be chosen). */
    if ((strcmp(want, "verbs") == 0 ||
         (strcmp(want, "auto") == 0 && info->cross_size != 1)) &&
        verbs_usable(verbs_why, sizeof(verbs_why)))
        mine.flags |= HOST_VERBS;
#endif
    all = calloc((size_t)info->size, sizeof(*all));
    hosts = calloc((size_t)info->size, HVD_HOST_MAX);
    pids = calloc((size_t)info->size, sizeof(*pids));
    if (all == NULL || hosts == NULL || pids == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    {
        hvd_status bst = bs->allgather(bs, &mine, sizeof(mine), all);
        if (bst != HVD_OK) {
            st = bst;
            goto out;
        }
    }
    for (int i = 0; i < info->size; i++) {
        all[i].host[HVD_HOST_MAX - 1] = '\0';
        memcpy((char *)hosts[i], all[i].host, HVD_HOST_MAX);
        pids[i] = all[i].pid;
        if (!(all[i].flags & HOST_VERBS) && verbs_bad < 0)
            verbs_bad = i;
    }
    verbs_all = verbs_bad < 0;
    /* HVD_HOSTNAME renames the hosts: local and cross ranks follow the
     * names, whatever the launcher said. */
    if (g.cfg.hostname[0] != '\0')
        info->local_rank = info->local_size = info->cross_rank =
            info->cross_size = -1;
    place_ranks(info, all);
    g.homogeneous = same_ranks_per_host(info->size, all);
    if (strcmp(want, "auto") == 0 && info->cross_size > 1 && !verbs_all)
        HVD_DEBUG("api", "HVD_TRANSPORT=auto: not RDMA (rank %d: %s)",
                  verbs_bad,
                  verbs_bad == info->rank && verbs_why[0]
                      ? verbs_why
                      : "has no usable RDMA device or no verbs support");
    st = nccl_agree(bs, hosts);
    if (st != HVD_OK)
        goto out;

    /* Listen where the rendezvous host reached us, unless told; under MPI
     * on loopback when every rank is on this host, else on this host's
     * first routable address. A bad HVD_IFACE fails TCP (and, with auto
     * under MPI, makes every rank take MPI). */
    if (g.cfg.iface[0] != '\0')
        st = hvd_net_iface_addr(g.cfg.iface, bind_addr, sizeof(bind_addr));
    else if (local_addr[0] != '\0')
        snprintf(bind_addr, sizeof(bind_addr), "%s", local_addr);
    else if (info->cross_size == 1)
        snprintf(bind_addr, sizeof(bind_addr), "127.0.0.1");
    else
        st = hvd_net_host_addr(bind_addr, sizeof(bind_addr));
    if (st != HVD_OK && strcmp(want, "tcp") == 0)
        goto out;

    memset(&params, 0, sizeof(params));
    params.rank = info->rank;
    params.size = info->size;
    params.bootstrap = bs;
    params.bind_addr = bind_addr;
    memcpy(params.job_id, info->job_id, HVD_JOB_ID_LEN);
    params.secret = info->secret;
    params.hosts = hosts;
    params.pids = pids;
    params.timeout_ns = g.cfg.timeout_ns;
    params.connect_timeout_ns = g.cfg.start_timeout_ns;
    params.tcp_nsocks = g.cfg.tcp_nsocks;
    params.tcp_stripe_min = g.cfg.tcp_stripe_min;
    ib_params(&params);
    params.gpu_device = g.gpu_device;

    if (strcmp(want, "shm") == 0) {
        if (info->cross_size > 1) {
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_TRANSPORT=shm needs every rank on one "
                               "host, and this job has ranks on %d hosts: "
                               "unset it (auto uses shared memory within "
                               "each host) or use tcp",
                               info->cross_size);
            goto out;
        }
        st = open_transport("shm", &params);
    } else if (strcmp(want, "verbs") == 0) {
        if (!verbs_all && (mine.flags & HOST_VERBS))
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_TRANSPORT=verbs: rank %d (on %s) has no "
                               "usable RDMA device (its log says why); unset "
                               "HVD_TRANSPORT or use tcp",
                               verbs_bad, hosts[verbs_bad]);
        else if (!verbs_all)
            st = hvd_error_set(HVD_ERR_UNSUPPORTED,
                               "HVD_TRANSPORT=verbs: %s; unset HVD_TRANSPORT "
                               "or use tcp",
                               verbs_why);
        else
            st = open_transport("verbs", &params);
    } else if (strcmp(want, "auto") == 0 && verbs_all && info->cross_size > 1 &&
               auto_verbs(&params) == HVD_OK) {
        st = HVD_OK;
    } else if (strcmp(want, "auto") == 0 && info->cross_size == 1 &&
               auto_shm(&params) == HVD_OK) {
        st = HVD_OK;
    } else if (strcmp(want, "mpi") == 0) {
        st = open_transport("mpi", &params);
    } else if (strcmp(want, "tcp") == 0 || !via_mpi) {
        st = st == HVD_OK ? open_transport("tcp", &params) : st;
    } else {
#ifdef HVD_WITH_MPI
        /* auto under MPI: TCP if every rank can set it up in time, else
         * MPI; every rank decides the same. */
        char why[HVD_ERROR_MAX] = "";
        int all_ok = 0;
        params.connect_timeout_ns = g.cfg.tcp_setup_timeout_ns;
        if (st == HVD_OK)
            st = open_transport("tcp", &params);
        if (st != HVD_OK)
            snprintf(why, sizeof(why), "%s", hvd_error_get());
        hvd_status ast = hvd_mpi_agree(st == HVD_OK, &all_ok);
        if (ast != HVD_OK) {
            st = ast;
            goto out;
        }
        if (!all_ok) {
            if (g.tp != NULL)
                g.ops->close(g.tp);
            g.tp = NULL;
            HVD_WARN("api",
                     "HVD_TRANSPORT=auto: the TCP mesh could not be set up "
                     "(%s; the limit is HVD_TCP_SETUP_SECONDS=%.0f); using "
                     "MPI instead",
                     why[0] ? why : "another rank could not set it up",
                     (double)g.cfg.tcp_setup_timeout_ns / 1e9);
            st = open_transport("mpi", &params);
        }
#endif
    }
    if (st != HVD_OK)
        goto out;
    HVD_INFO("api",
             "rank %d of %d (local %d of %d, host %d of %d) via %s, "
             "transport %s on %s",
             info->rank, info->size, info->local_rank, info->local_size,
             info->cross_rank, info->cross_size, via_mpi ? "MPI" : info->source,
             g.ops->name, bind_addr);
    st = setup_paths(&params, want);
out:
    free(all);
    free((void *)hosts);
    free(pids);
    close_bootstrap(bs, via_mpi);
    return st;
}

/* Frees the paths and closes every transport (after the engine stopped). */
static void close_transports(void) {
    if (g.have_paths)
        hvd_paths_clear(&g.paths);
    g.have_paths = 0;
    if (g.shm_tp != NULL)
        g.shm_ops->close(g.shm_tp);
    g.shm_tp = NULL;
    if (g.tp != NULL)
        g.ops->close(g.tp);
    g.tp = NULL;
}

static void engine_config(hvd_engine_config *ec) {
    memset(ec, 0, sizeof(*ec));
    ec->fusion_threshold = g.cfg.fusion_threshold;
    ec->fusion_tensor_max = g.cfg.fusion_tensor_max;
    ec->cache_capacity = g.cfg.cache_capacity;
    ec->cycle_time_ms = g.cfg.cycle_time_ms;
    ec->stall_check_s = g.cfg.stall_check_s;
    ec->stall_shutdown_s = g.cfg.stall_shutdown_s;
    ec->timeout_ns = g.cfg.timeout_ns;
    ec->timeline_path = g.cfg.timeline[0] != '\0' ? g.cfg.timeline : NULL;
    ec->timeline_mark_cycles = g.cfg.timeline_mark_cycles;
    ec->dev.tp_mem_types = g.tp_mem_types;
    ec->dev.gpu.device = g.gpu_device;
    ec->dev.gpu.stage_bytes = g.cfg.gpu_stage_bytes;
    ec->dev.gpu.stage_depth = g.cfg.gpu_stage_depth;
    ec->dev.gpu.nccl_timeout_ns = g.cfg.start_timeout_ns;
    /* A job of one takes NCCL only when told to (it then runs every
     * device collective through a communicator of one). */
    ec->dev.nccl =
        g.info.size > 1 || g.nccl == HVD_NCCL_REQUIRED ? g.nccl : HVD_NCCL_OFF;
    ec->dev.nccl_have_id = g.nccl_have_id;
    memcpy(ec->dev.nccl_id, g.nccl_id, HVD_NCCL_ID_BYTES);
}

hvd_status hvd_init(void) {
    hvd_engine_config ec;
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&g.lock);
    if (g.initialized)
        goto out;
    hvd_log_init_from_env();
    st = hvd_config_load(hvd_env_getenv, NULL, &g.cfg);
    if (st == HVD_OK)
        st = hvd_discover(hvd_env_getenv, NULL, &g.info);
    if (st != HVD_OK)
        goto fail;
    hvd_log_set_rank(g.info.rank);
    if (g.was_initialized && g.info.size > 1) {
        st = hvd_error_set(HVD_ERR_SHUTDOWN,
                           "hvd_init after hvd_shutdown is not supported in "
                           "a job of %d ranks in this release",
                           g.info.size);
        goto fail;
    }
    g.tp_mem_types = 0;
    g.homogeneous = 1;
    st = gpu_choice();
    if (st != HVD_OK)
        goto fail;
    if (g.info.size > 1) {
        st = init_multi();
        if (st != HVD_OK)
            goto fail;
    }
    engine_config(&ec);
    st = hvd_engine_start(g.info.rank, g.info.size, g.tp, &g.cfg.comm,
                          g.have_paths ? &g.paths : NULL, &ec, &g.engine);
    if (st != HVD_OK)
        goto fail;
    memset(g.unnamed, 0, sizeof(g.unnamed));
    g.initialized = 1;
    goto out;
fail:
    close_transports();
    hvd_error_prefix("hvd_init (rank %d): ", g.info.rank);
    HVD_ERROR("api", "%s", hvd_error_get());
    hvd_log_set_rank(-1);
out:
    pthread_mutex_unlock(&g.lock);
    return st;
}

hvd_status hvd_shutdown(void) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized)
        goto out;
    /* Every rank leaves the engine together; then the transport says
     * goodbye, unless the job failed (nothing orderly is left to do). */
    st = hvd_engine_stop(g.engine);
    g.engine = NULL;
    if (g.tp != NULL) {
        if (st == HVD_OK && g.shm_tp != NULL)
            st = g.shm_ops->shutdown(g.shm_tp);
        if (st == HVD_OK)
            st = g.ops->shutdown(g.tp);
        g.was_initialized = 1;
    }
    close_transports();
#ifdef HVD_WITH_MPI
    /* Only if hvd initialized MPI, and only after an orderly end:
     * MPI_Finalize waits for every rank, so after a lost or stopped rank
     * it would never return. MPI is then left as it is; the process is
     * about to report the failure and exit. */
    if (st == HVD_OK)
        hvd_mpi_env_finalize();
    else
        HVD_INFO("api", "not finalizing MPI: the job failed, and "
                        "MPI_Finalize would wait for the rank it lost");
#endif
    g.initialized = 0;
    hvd_log_set_rank(-1);
out:
    pthread_mutex_unlock(&g.lock);
    return st;
}

int hvd_initialized(void) { return g.initialized; }

int hvd_is_homogeneous(void) { return g.initialized ? g.homogeneous : -1; }

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
    else if (g.info.rank == 0)
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
    else if (g.info.rank == 0)
        hvd_engine_set_timeline(g.engine, NULL, 0);
    pthread_mutex_unlock(&g.lock);
    return st;
}

int hvd_built(const char *part) {
    if (part == NULL)
        return 0;
    if (strcmp(part, "tcp") == 0 || strcmp(part, "shm") == 0)
        return 1;
#ifdef HVD_WITH_MPI
    if (strcmp(part, "mpi") == 0)
        return 1;
#endif
#ifdef HVD_WITH_VERBS
    if (strcmp(part, "verbs") == 0)
        return 1;
#endif
    if (strcmp(part, "cuda") == 0)
        return hvd_gpu_built() && !hvd_gpu_simulated();
    if (strcmp(part, "nccl") == 0)
        return hvd_gpu_nccl_built();
    return 0;
}

int hvd_rank(void) { return g.initialized ? g.info.rank : -1; }

int hvd_size(void) { return g.initialized ? g.info.size : -1; }

int hvd_local_rank(void) { return g.initialized ? g.info.local_rank : -1; }

int hvd_local_size(void) { return g.initialized ? g.info.local_size : -1; }

int hvd_cross_rank(void) { return g.initialized ? g.info.cross_rank : -1; }

int hvd_cross_size(void) { return g.initialized ? g.info.cross_size : -1; }

hvd_status hvd_path(const char *collective, size_t bytes, hvd_dtype dtype,
                    char *out, size_t outlen) {
    static const char *const kinds[HVD_COLL_NKINDS] = {
        [HVD_COLL_ALLREDUCE] = "allreduce",
        [HVD_COLL_ALLGATHER] = "allgather",
        [HVD_COLL_BROADCAST] = "broadcast"};
    hvd_status st = HVD_OK;
    int kind = -1;
    hvd_plan plan;

    hvd_error_clear();
    for (int k = 0; collective != NULL && k < HVD_COLL_NKINDS; k++)
        if (strcmp(collective, kinds[k]) == 0)
            kind = k;
    if (kind < 0 || out == NULL || outlen == 0 || !hvd_dtype_valid(dtype))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "hvd_path: collective must be allreduce, "
                             "allgather or broadcast, dtype valid, and out a "
                             "buffer (got %s)",
                             collective != NULL ? collective : "NULL");
    pthread_mutex_lock(&g.lock);
    if (!g.initialized) {
        st = hvd_error_set(HVD_ERR_NOT_INITIALIZED, "hvd_path before hvd_init");
    } else {
        hvd_coll_plan(hvd_engine_data(g.engine), (hvd_coll_kind)kind, bytes,
                      dtype, &plan);
        if (plan.algo == HVD_ALGO_AUTO)
            snprintf(out, outlen, "local");
        else
            snprintf(out, outlen, "%s/%s/%zu", hvd_plan_transport(&plan),
                     hvd_algo_name(plan.algo), plan.chunk);
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* ------------------------------------------------------------------ */
/* What submission needs of the job (api/job.h)                        */

/*
 * Builds a request of kind for n buffers. A NULL name gets
 * "hvd.<kind>.<k>" for the k-th unnamed operation of its kind, which
 * matches the k-th of every rank. The caller fills in the rest.
 */
hvd_status hvd_job_request(const char *fn, const char *name, hvd_kind kind,
                           int n, hvd_request **req_out) {
    char auto_name[64];
    hvd_request *req;

    pthread_mutex_lock(&g.lock);
    if (!g.initialized) {
        pthread_mutex_unlock(&g.lock);
        return hvd_error_set(HVD_ERR_NOT_INITIALIZED,
                             "%s('%s'): hvd is not initialized: call "
                             "hvd_init() first",
                             fn, name != NULL ? name : "");
    }
    if (name == NULL) {
        snprintf(auto_name, sizeof(auto_name), "hvd.%s.%llu",
                 hvd_kind_name(kind), (unsigned long long)g.unnamed[kind]++);
        name = auto_name;
    }
    req = hvd_request_new(name, n);
    pthread_mutex_unlock(&g.lock);
    if (req == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "%s('%s'): out of memory", fn,
                             name != NULL ? name : "");
    req->desc.kind = kind;
    *req_out = req;
    return HVD_OK;
}

/* Hands a filled request to the engine; on failure it is freed here. */
hvd_status hvd_job_hand_over(const char *fn, hvd_request *req,
                             hvd_handle *out) {
    hvd_status st;

    pthread_mutex_lock(&g.lock);
    st = g.initialized
             ? hvd_engine_submit(g.engine, req)
             : hvd_error_set(HVD_ERR_NOT_INITIALIZED, "hvd is not initialized");
    pthread_mutex_unlock(&g.lock);
    if (st != HVD_OK) {
        hvd_error_prefix("%s('%s') on rank %d: ", fn, req->name, g.info.rank);
        hvd_request_free(req);
        return st;
    }
    *out = req;
    return HVD_OK;
}

int hvd_job_gpu_device(void) { return g.gpu_device; }
