/*
 * The communicator the collectives run on: this rank's place in the job,
 * the transport that carries the messages (whichever it is), tuning, and
 * the memory the algorithms reuse from call to call (scratch buffers, a
 * pool of transfers), so that no collective allocates per message.
 *
 * Contract of every collective in this folder: blocking, on the caller's
 * thread; every rank calls the same collectives in the same order with the
 * same count, dtype, op and root; the result is bitwise identical on every
 * rank. On failure the status is returned and hvd_last_error() holds the
 * sentence from the layer that classified it.
 */
#ifndef HVD_COLLECTIVES_COMM_H
#define HVD_COLLECTIVES_COMM_H

#include <stddef.h>

#include "hvd/types.h"
#include "transport/base/memops.h"
#include "transport/transport.h"

/*
 * The algorithms. Three names are not algorithms, one per meaning "auto"
 * had: UNFORCED, in a configuration (HVD_ALGORITHM=auto, the default): the
 * selector chooses; LOCAL, in a plan: one rank, a local copy and nothing
 * sent; ANY, as a filter of the selector's candidates: no algorithm in
 * particular. Only UNFORCED and the algorithms have a name to parse
 * ("auto", "ring", ...); LOCAL prints as "local".
 */
typedef enum {
    HVD_ALGO_UNFORCED = 0,
    HVD_ALGO_RING,         /* allreduce, allgather */
    HVD_ALGO_RD,           /* recursive doubling allreduce */
    HVD_ALGO_TREE,         /* binomial-tree broadcast */
    HVD_ALGO_PIPELINE,     /* pipelined chain broadcast */
    HVD_ALGO_NATIVE,       /* the transport's own collective (MPI) */
    HVD_ALGO_RABENSEIFNER, /* recursive halving + doubling allreduce */
    HVD_ALGO_DIRECT,       /* one-sided reads of the peers' buffers (shm) */
    HVD_ALGO_HIER,         /* same-host, then cross-host, then same-host */
    HVD_ALGO_COUNT,        /* the names a configuration may use */
    HVD_ALGO_LOCAL = HVD_ALGO_COUNT,
    HVD_ALGO_ANY
} hvd_algo;

typedef struct hvd_comm_config {
    size_t chunk_bytes;      /* pipeline unit of ring and chain */
    int depth;               /* chunks in flight per direction */
    size_t allreduce_rd_max; /* bytes: recursive doubling up to this */
    size_t bcast_tree_max;   /* bytes: binomial tree up to this */
    hvd_algo allreduce_algo; /* UNFORCED, RING, RD, ... or NATIVE */
    hvd_algo bcast_algo;     /* UNFORCED, TREE, PIPELINE or NATIVE */
    int native;              /* the transport has native collectives */
    size_t stream_min;       /* bytes: from this size on, the direct reductions
                                write their result with non-temporal stores */
    size_t pipe_min;         /* bytes: from this size on, a direct allreduce
                                of two ranks copies the peer's result as
                                it is made */
} hvd_comm_config;

/* Defaults: the crossovers measured on loopback TCP (docs/benchmarks.md). */
void hvd_comm_config_default(hvd_comm_config *cfg);

struct hvd_paths;

/* Host memory, with the CPU (the default of every communicator). */
extern const hvd_memops hvd_host_memops;

typedef struct hvd_comm {
    int rank;
    int size;
    hvd_transport *tp;       /* NULL in a job of one */
    int channel;             /* the transport channel its messages use */
    const int *map;          /* comm rank -> transport rank; NULL: the same */
    struct hvd_paths *paths; /* other ways to reach the same ranks, and the
                                selector's table (collectives/select.h);
                                NULL: this comm only, cfg decides */
    hvd_comm_config cfg;
    void *scratch;
    size_t scratch_cap;
    hvd_req *reqs;    /* pool of nreqs transfers (sends, receives) */
    void *peer_addrs; /* the direct algorithms' buffer addresses */
    int nreqs;
    const char *last_path;      /* algorithm of the last collective */
    const char *last_transport; /* and its transport */
    const hvd_memops *mem;      /* hvd_host_memops unless set */
    void *mem_ctx;
} hvd_comm;

/* A communicator over channel of tp (NULL in a job of one). */
hvd_status hvd_comm_create(int rank, int size, hvd_transport *tp, int channel,
                           const hvd_comm_config *cfg, hvd_comm **out);

/*
 * A communicator over a subset of tp's ranks: comm rank i is transport rank
 * map[i] (size entries, copied); this rank is comm rank rank. It never uses
 * the transport's native collectives (they span all of its ranks).
 */
hvd_status hvd_comm_create_sub(int rank, int size, const int *map,
                               hvd_transport *tp, int channel,
                               const hvd_comm_config *cfg, hvd_comm **out);
void hvd_comm_destroy(hvd_comm *comm);

/* Makes the collectives of comm work on the memory mem is for (its
 * scratch memory is released first). ctx is passed to every call. */
void hvd_comm_set_memops(hvd_comm *comm, const hvd_memops *mem, void *ctx);

static inline void hvd_comm_reduce(hvd_comm *comm, void *dst, const void *a,
                                   const void *b, size_t count, hvd_dtype dtype,
                                   hvd_op op) {
    comm->mem->reduce(comm->mem_ctx, dst, a, b, count, dtype, op);
}

static inline void hvd_comm_scale_div(hvd_comm *comm, void *buf, size_t count,
                                      hvd_dtype dtype, int divisor) {
    comm->mem->scale_div(comm->mem_ctx, buf, count, dtype, divisor);
}

static inline void hvd_comm_copy(hvd_comm *comm, void *dst, const void *src,
                                 size_t bytes) {
    comm->mem->copy(comm->mem_ctx, dst, src, bytes);
}

/* Scratch memory of at least bytes, kept for later calls. */
hvd_status hvd_comm_scratch(hvd_comm *comm, size_t bytes, void **out);

/* The transport rank of comm rank peer. */
static inline int hvd_comm_peer(const hvd_comm *comm, int peer) {
    return comm->map != NULL ? comm->map[peer] : peer;
}

static inline hvd_status hvd_comm_isend(hvd_comm *comm, int peer,
                                        const void *buf, size_t len,
                                        hvd_req *req) {
    return comm->tp->ops->isend(comm->tp, hvd_comm_peer(comm, peer),
                                comm->channel, buf, len, req);
}

/* Sends n messages to comm rank peer as n hvd_comm_isend calls would, in
 * one go where the transport can (transport.h, isendv). */
static inline hvd_status hvd_comm_isendv(hvd_comm *comm, int peer,
                                         const hvd_sendv *msgs, int n,
                                         hvd_req *reqs) {
    hvd_transport *tp = comm->tp;
    int to = hvd_comm_peer(comm, peer);

    if (tp->ops->isendv != NULL)
        return tp->ops->isendv(tp, to, comm->channel, msgs, n, reqs);
    for (int i = 0; i < n; i++) {
        hvd_status st = tp->ops->isend(tp, to, comm->channel, msgs[i].buf,
                                       msgs[i].len, &reqs[i]);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

static inline hvd_status hvd_comm_irecv(hvd_comm *comm, int peer, void *buf,
                                        size_t len, hvd_req *req) {
    return comm->tp->ops->irecv(comm->tp, hvd_comm_peer(comm, peer),
                                comm->channel, buf, len, req);
}

/* A receive of a message of up to cap bytes (transport.h, irecv_upto);
 * req->got says its length once done. */
static inline hvd_status hvd_comm_irecv_upto(hvd_comm *comm, int peer,
                                             void *buf, size_t cap,
                                             hvd_req *req) {
    return comm->tp->ops->irecv_upto(comm->tp, hvd_comm_peer(comm, peer),
                                     comm->channel, buf, cap, req);
}

/* One-sided read from comm rank peer (transport.h, get). */
static inline hvd_status hvd_comm_get(hvd_comm *comm, int peer, void *buf,
                                      uint64_t remote, size_t len) {
    return comm->tp->ops->get(comm->tp, hvd_comm_peer(comm, peer), buf, remote,
                              len);
}

/* The peers are about to read [buf, buf + len) of this rank with
 * hvd_comm_get, and likely will again (transport.h, expose). */
static inline void hvd_comm_expose(hvd_comm *comm, const void *buf,
                                   size_t len) {
    if (comm->tp->ops->expose != NULL && len > 0)
        comm->tp->ops->expose(comm->tp, buf, len);
}

/* 1 if every peer of comm can be read with hvd_comm_get. */
int hvd_comm_can_get(const hvd_comm *comm);

/* Waits (bounded) for the network and moves data. */
hvd_status hvd_comm_progress(hvd_comm *comm);

/* Drives the transport until req is done; returns its status (with the
 * sentence in hvd_last_error()). */
hvd_status hvd_comm_wait(hvd_comm *comm, hvd_req *req);
hvd_status hvd_comm_waitall(hvd_comm *comm, hvd_req *reqs, int n);

/* Element range [off, off + cnt) of part i when count elements are cut
 * into n parts whose sizes differ by at most one (the first count % n parts
 * are one larger). */
void hvd_part_range(size_t count, size_t n, size_t i, size_t *off, size_t *cnt);

/* Number of chunks of at most chunk elements that cover count elements
 * (at least 1, so that an empty range still takes one step). */
size_t hvd_nchunks(size_t count, size_t chunk);

const char *hvd_algo_name(hvd_algo algo);
/* Parses HVD_ALGORITHM's value; returns 0 on success. */
int hvd_algo_parse(const char *text, hvd_algo *algo_out);

#endif
