/*
 * What an operation is, independent of its buffers: the values ranks must
 * agree on before it can run (and that the response cache remembers).
 */
#ifndef HVD_API_OPDESC_H
#define HVD_API_OPDESC_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"
#include "transport/transport.h"

typedef enum {
    HVD_KIND_ALLREDUCE = 0,
    HVD_KIND_BROADCAST,
    HVD_KIND_ALLGATHER,
    HVD_KIND_BARRIER,
    HVD_KIND_JOIN,
    HVD_KIND_CALL, /* internal: runs a function on the engine thread */
    /* counts: the elements to each rank (size of them); ranks differ in
     * them, and tell each other when it runs */
    HVD_KIND_ALLTOALL,
    HVD_KIND_REDUCESCATTER, /* dims[0] rows are cut, else elements */
    /* internal, every rank of the job: op HVD_PSET_CREATE (counts: the
     * set's ranks, ascending) or HVD_PSET_REMOVE (root: the set's id) */
    HVD_KIND_PSET,
    HVD_KIND_COUNT
} hvd_kind;

enum { HVD_DESC_MAX_DIMS = 8 };

/* The op of an HVD_KIND_PSET request. */
enum { HVD_PSET_CREATE = 0, HVD_PSET_REMOVE = 1 };

typedef struct hvd_opdesc {
    hvd_kind kind;
    hvd_dtype dtype;
    hvd_op op;
    int root;       /* a broadcast's root: a rank of the job, in any set */
    int pset;       /* the process set it runs in; 0: every rank */
    size_t ncounts; /* buffers: 1, or n for a grouped allreduce */
    const uint64_t *counts; /* elements per buffer; owned by the holder */
    /* Where the buffers are (all of them; host for barrier, join, call):
     * ranks must agree, since host and device tensors take different
     * paths and never share a fusion buffer. */
    hvd_memtype mem;
    /* The tensor's shape, where the caller gave one of two or more
     * dimensions (hvd_allreduce_shaped_async, hvd_broadcast_shaped_async):
     * ranks must agree on it as on the count, as Horovod's frameworks
     * require. ndims 0: the count alone (a flat buffer, a vector, a scalar).
     * Dimensions past HVD_DESC_MAX_DIMS are folded into the last one. A
     * value, so that a copy of the description carries it. */
    int ndims;
    int64_t dims[HVD_DESC_MAX_DIMS];
} hvd_opdesc;

/* Sets d's shape from ndim dimensions (see hvd_opdesc.dims). */
void hvd_opdesc_set_shape(hvd_opdesc *d, int ndim, const int64_t *shape);

const char *hvd_kind_name(hvd_kind kind);

/* 1 if a and b describe the same operation. */
int hvd_opdesc_equal(const hvd_opdesc *a, const hvd_opdesc *b);

/* 1 if two ranks' requests a and b may run together: equal, except that
 * the ranks of an alltoall each send their own counts. */
int hvd_opdesc_agree(const hvd_opdesc *a, const hvd_opdesc *b);

/* 1 if d's kind is reduced (allreduce, reducescatter): its op matters. */
int hvd_kind_reduces(hvd_kind kind);

/* The elements a reduce-scatter's rows are cut in: the product of the
 * dimensions after the first, 1 without a shape. */
uint64_t hvd_opdesc_unit(const hvd_opdesc *d);

/* "allreduce float32 sum count 10", "broadcast int32 root 1 count 5". */
void hvd_opdesc_format(const hvd_opdesc *d, char *out, size_t outlen);

/* Total elements over all buffers. */
uint64_t hvd_opdesc_total(const hvd_opdesc *d);

#endif
