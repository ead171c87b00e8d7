#include "collectives/comm.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "collectives/reduce.h"
#include "transport/base/error.h"
#include "transport/base/grow.h"

#define POLL_MS 1000

static void host_reduce(void *ctx, void *dst, const void *a, const void *b,
                        size_t count, hvd_dtype dtype, hvd_op op) {
    (void)ctx;
    hvd_reduce(dst, a, b, count, dtype, op);
}

static void host_scale_div(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                           int divisor) {
    (void)ctx;
    hvd_reduce_scale_div(buf, count, dtype, divisor);
}

static void host_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (dst != src && bytes > 0)
        memmove(dst, src, bytes);
}

static hvd_status host_alloc(void *ctx, size_t bytes, void **out) {
    void *p = malloc(bytes);

    (void)ctx;
    if (p == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY,
                             "out of memory for %zu bytes of scratch", bytes);
    *out = p;
    return HVD_OK;
}

static void host_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

const hvd_memops hvd_host_memops = {
    .name = "host",
    .reduce = host_reduce,
    .scale_div = host_scale_div,
    .copy = host_copy,
    .alloc = host_alloc,
    .free = host_free,
};

void hvd_comm_config_default(hvd_comm_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->chunk_bytes = 512 * 1024;
    cfg->depth = 4;
    cfg->allreduce_rd_max = 512 * 1024;
    cfg->bcast_tree_max = 4 * 1024 * 1024;
    cfg->stream_min = 64 * 1024 * 1024;
    cfg->pipe_min = 64 * 1024 * 1024;
    cfg->allreduce_algo = HVD_ALGO_UNFORCED;
    cfg->bcast_algo = HVD_ALGO_UNFORCED;
}

hvd_status hvd_comm_create(int rank, int size, hvd_transport *tp, int channel,
                           const hvd_comm_config *cfg, hvd_comm **out) {
    hvd_comm *comm = calloc(1, sizeof(*comm));

    if (comm == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    comm->rank = rank;
    comm->size = size;
    comm->tp = tp;
    comm->channel = channel;
    comm->cfg = *cfg;
    if (comm->cfg.depth < 1)
        comm->cfg.depth = 1;
    if (comm->cfg.chunk_bytes < 64)
        comm->cfg.chunk_bytes = 64;
    /* Ring and chain keep depth receives and depth sends in flight; the
     * binomial tree up to log2(size) sends; the direct algorithms one
     * receive and one send per peer. */
    comm->nreqs = 2 * comm->cfg.depth + 2 * size + 64;
    comm->reqs = calloc((size_t)comm->nreqs, sizeof(*comm->reqs));
    if (comm->reqs == NULL) {
        free(comm);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    comm->last_path = "none";
    comm->last_transport = tp != NULL ? tp->ops->name : "local";
    comm->mem = &hvd_host_memops;
    *out = comm;
    return HVD_OK;
}

hvd_status hvd_comm_create_sub(int rank, int size, const int *map,
                               hvd_transport *tp, int channel,
                               const hvd_comm_config *cfg, hvd_comm **out) {
    int *copy = malloc((size_t)size * sizeof(*copy));
    hvd_comm *comm;
    hvd_status st;

    if (copy == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    memcpy(copy, map, (size_t)size * sizeof(*copy));
    st = hvd_comm_create(rank, size, tp, channel, cfg, &comm);
    if (st != HVD_OK) {
        free(copy);
        return st;
    }
    comm->map = copy;
    /* A transport's own collectives (MPI's) span all its ranks, not a
     * subset: a sub-communicator runs hvd's algorithms. */
    comm->cfg.native = 0;
    if (comm->cfg.allreduce_algo == HVD_ALGO_NATIVE)
        comm->cfg.allreduce_algo = HVD_ALGO_UNFORCED;
    if (comm->cfg.bcast_algo == HVD_ALGO_NATIVE)
        comm->cfg.bcast_algo = HVD_ALGO_UNFORCED;
    *out = comm;
    return HVD_OK;
}

int hvd_comm_can_get(const hvd_comm *comm) {
    if (comm->tp == NULL)
        return comm->size == 1;
    for (int i = 0; i < comm->size; i++)
        if (i != comm->rank &&
            !comm->tp->ops->can_get(comm->tp, hvd_comm_peer(comm, i)))
            return 0;
    return 1;
}

void hvd_comm_destroy(hvd_comm *comm) {
    if (comm == NULL)
        return;
    free((void *)comm->map);
    free(comm->peer_addrs);
    comm->mem->free(comm->mem_ctx, comm->scratch);
    free(comm->reqs);
    free(comm);
}

void hvd_comm_set_memops(hvd_comm *comm, const hvd_memops *mem, void *ctx) {
    comm->mem->free(comm->mem_ctx, comm->scratch);
    comm->scratch = NULL;
    comm->scratch_cap = 0;
    comm->mem = mem;
    comm->mem_ctx = ctx;
}

hvd_status hvd_comm_scratch(hvd_comm *comm, size_t bytes, void **out) {
    if (bytes > comm->scratch_cap) {
        size_t cap = hvd_grow_cap(bytes, 0);
        void *p;
        hvd_status st = comm->mem->alloc(comm->mem_ctx, cap, &p);
        if (st != HVD_OK)
            return st;
        comm->mem->free(comm->mem_ctx, comm->scratch);
        comm->scratch = p;
        comm->scratch_cap = cap;
    }
    *out = comm->scratch;
    return HVD_OK;
}

hvd_status hvd_comm_progress(hvd_comm *comm) {
    return comm->tp->ops->progress(comm->tp, POLL_MS);
}

hvd_status hvd_comm_wait(hvd_comm *comm, hvd_req *req) {
    while (!req->done) {
        hvd_status st = comm->tp->ops->progress(comm->tp, POLL_MS);
        if (st != HVD_OK)
            return st;
    }
    if (req->status != HVD_OK) {
        /* The transport failed while this request was in flight: progress
         * returns the failure with its sentence. */
        hvd_status st = comm->tp->ops->progress(comm->tp, 0);
        return st != HVD_OK ? st : req->status;
    }
    return HVD_OK;
}

hvd_status hvd_comm_waitall(hvd_comm *comm, hvd_req *reqs, int n) {
    for (int i = 0; i < n; i++) {
        hvd_status st = hvd_comm_wait(comm, &reqs[i]);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

void hvd_part_range(size_t count, size_t n, size_t i, size_t *off,
                    size_t *cnt) {
    size_t base = count / n, extra = count % n;

    *off = i * base + (i < extra ? i : extra);
    *cnt = base + (i < extra ? 1 : 0);
}

size_t hvd_nchunks(size_t count, size_t chunk) {
    if (chunk == 0)
        chunk = 1;
    return count == 0 ? 1 : (count + chunk - 1) / chunk;
}

static const char *const algo_names[HVD_ALGO_COUNT] = {
    [HVD_ALGO_UNFORCED] = "auto",
    [HVD_ALGO_RING] = "ring",
    [HVD_ALGO_RD] = "rd",
    [HVD_ALGO_TREE] = "tree",
    [HVD_ALGO_PIPELINE] = "pipeline",
    [HVD_ALGO_NATIVE] = "native",
    [HVD_ALGO_RABENSEIFNER] = "rabenseifner",
    [HVD_ALGO_DIRECT] = "direct",
    [HVD_ALGO_HIER] = "hier",
};

const char *hvd_algo_name(hvd_algo algo) {
    if (algo == HVD_ALGO_LOCAL)
        return "local";
    if (algo == HVD_ALGO_ANY)
        return "any";
    return (unsigned)algo < HVD_ALGO_COUNT ? algo_names[algo] : "unknown";
}

int hvd_algo_parse(const char *text, hvd_algo *algo_out) {
    for (int i = 0; i < HVD_ALGO_COUNT; i++) {
        if (strcasecmp(text, algo_names[i]) == 0) {
            *algo_out = (hvd_algo)i;
            return 0;
        }
    }
    return -1;
}
