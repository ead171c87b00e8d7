/*
 * Memory operations: the vocabulary between the collectives, which use
 * them, and whoever owns the memory (collectives/comm.c for host memory,
 * gpu/ for device memory), so that neither includes the other.
 */
#ifndef HVD_BASE_MEMOPS_H
#define HVD_BASE_MEMOPS_H

#include <stddef.h>

#include "hvd/types.h"

/*
 * What the collectives do to the buffers themselves, besides sending and
 * receiving them: combine, divide, copy, and get scratch memory. The
 * default works on host memory with the CPU, at once. gpu/ gives a set
 * for device memory whose operations are queued on a CUDA stream, in
 * order with the copies that stage the messages (gpu/stage.h), so a
 * result is there for every later operation on that stream but not yet
 * for the CPU; the owner of that stream reports the errors of what it
 * queued. So a collective touches its buffers only through these and
 * through the transport, never with the CPU directly.
 */
typedef struct hvd_memops {
    const char *name;
    /* hvd_reduce() (collectives/reduce.h): dst = a op b. */
    void (*reduce)(void *ctx, void *dst, const void *a, const void *b,
                   size_t count, hvd_dtype dtype, hvd_op op);
    /* hvd_reduce_scale_div(). */
    void (*scale_div)(void *ctx, void *buf, size_t count, hvd_dtype dtype,
                      int divisor);
    /* memmove(dst, src, bytes); dst == src or bytes == 0 does nothing. */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    /* Scratch memory of bytes (> 0), kept by the communicator. */
    hvd_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *p); /* p may be NULL */
} hvd_memops;

#endif
