/*
 * The registration cache of the verbs transport: memory regions (ibv_mr)
 * covering user buffers, kept for reuse because ibv_reg_mr costs tens of
 * microseconds plus page pinning, far more than sending a chunk.
 *
 * - A lookup that falls inside a cached region of the same memory type is
 *   a hit. A miss registers the buffer rounded out to whole pages; cached
 *   regions it overlaps are merged into the new one (the union of two
 *   overlapping mapped ranges is mapped) and invalidated.
 * - The cache is bounded (entries and bytes); when over a bound, the least
 *   recently used regions that no operation holds are deregistered.
 * - Every hvd_mr_get is paired with an hvd_mr_put once the last work
 *   request that uses the region has completed. An invalidated region
 *   leaves the lookup at once but is deregistered only when nobody holds
 *   it, so an operation in flight never loses its region.
 *
 * Memory types: host memory, and CUDA device memory for GPUDirect RDMA,
 * which ibv_reg_mr accepts only when the nvidia-peermem module is loaded
 * (checked before registering). Regions of different types never match.
 * Device regions are registered for remote writes too: peers write
 * messages into device receive buffers (transport/verbs/proto.h).
 *
 * Device regions and address reuse: a device region is registered as
 * given (no rounding: that could reach into another allocation) and
 * carries the driver's buffer id of its allocation
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID, unique for the process's lifetime).
 * A lookup hits only a region of the same id. A caching allocator (the
 * frameworks') that hands a block of its pool out again keeps the
 * allocation, so the id and the registration stay good; one that frees
 * the allocation (cudaFree) and gets a new one at the same address gets
 * another id: the lookup then finds the old regions overlapping with a
 * different id, drops them (nvidia-peermem has already invalidated their
 * mappings when the memory was freed) and registers the new allocation.
 * Overlapping regions of the same id are merged, as host regions are
 * (their union lies inside one allocation). A new device registration
 * sets SYNC_MEMOPS on its allocation (seam->sync_memops), so synchronous
 * CUDA copies into it are complete when they return.
 *
 * A pinned region keeps the pages it was registered with: if the caller
 * frees a buffer and a later allocation reuses the address, a hit would
 * send the old pages. The transport therefore registers user buffers with
 * on-demand paging (odp: the HCA follows the process's page tables), or
 * only when told that buffers are stable (HVD_IB_MR_CACHE=on), and calls
 * hvd_mr_invalidate when it learns that a range went away.
 *
 * Not thread-safe: one transport, one thread.
 */
#ifndef HVD_TRANSPORT_VERBS_MR_H
#define HVD_TRANSPORT_VERBS_MR_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"
#include "transport/transport.h"
#include "transport/verbs/seam.h"

/* The memory types of transport.h: host, or CUDA device memory. */
typedef hvd_memtype hvd_mem_type;

typedef struct hvd_mr_entry hvd_mr_entry;
struct hvd_mr_entry {
    uintptr_t start; /* registered range [start, end) */
    uintptr_t end;
    hvd_mem_type type;
    uint64_t buffer_id; /* device regions: the allocation's id; else 0 */
    struct ibv_mr *mr;
    int refs;
    int live; /* found by lookups; 0 once invalidated or evicted */
    hvd_mr_entry *prev;
    hvd_mr_entry *next;
};

typedef struct hvd_mr_stats {
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions;     /* regions dropped to stay within the bounds */
    uint64_t invalidations; /* regions dropped by invalidate or a merge */
    uint64_t reused;        /* device regions dropped: address reused by
                               another allocation */
    uint64_t deregs;        /* ibv_dereg_mr calls */
    int live;               /* regions in the lookup */
    int held_dead;          /* dropped regions still held by operations */
    size_t live_bytes;
} hvd_mr_stats;

typedef struct hvd_mr_cache hvd_mr_cache;

/*
 * A cache registering into pd with access (IBV_ACCESS_* flags; on-demand
 * paging is added for host memory when odp is 1). max_entries >= 1 and
 * max_bytes bound the regions nobody holds.
 */
hvd_status hvd_mr_cache_create(const hvd_ibv_seam *seam, struct ibv_pd *pd,
                               int access, int odp, int max_entries,
                               size_t max_bytes, hvd_mr_cache **out);

/*
 * A region of the given type covering [addr, addr + len), held until
 * hvd_mr_put. len 0 is treated as 1 byte. On failure (ibv_reg_mr refused,
 * CUDA memory without nvidia-peermem) the status comes with a sentence
 * and *out is untouched.
 */
hvd_status hvd_mr_get(hvd_mr_cache *c, const void *addr, size_t len,
                      hvd_mem_type type, hvd_mr_entry **out);

/* As hvd_mr_get, for memory whose allocation has the given id (device
 * memory; 0 where unknown). */
hvd_status hvd_mr_get_id(hvd_mr_cache *c, const void *addr, size_t len,
                         hvd_mem_type type, uint64_t buffer_id,
                         hvd_mr_entry **out);

/* 1 and a hold on it in *out if a cached region of host memory, or a
 * region of any type held now (hvd_verbs_register's promise: the memory
 * stays allocated while registered), covers [addr, addr + len) (a hit);
 * 0 otherwise, registering nothing. A device region no one holds does
 * not answer: its allocation may be gone and the address be host memory
 * now, with other pages behind it. */
int hvd_mr_find_host(hvd_mr_cache *c, const void *addr, size_t len,
                     hvd_mr_entry **out);

/* Releases a hold taken by hvd_mr_get or hvd_mr_find_host. */
void hvd_mr_put(hvd_mr_cache *c, hvd_mr_entry *e);

/* Drops every region overlapping [addr, addr + len) from the lookup
 * (deregistered now, or when the last hold is released). */
void hvd_mr_invalidate(hvd_mr_cache *c, const void *addr, size_t len);

void hvd_mr_cache_stats(const hvd_mr_cache *c, hvd_mr_stats *out);

/* Deregisters everything, held or not (the queue pairs must be gone);
 * accepts NULL. */
void hvd_mr_cache_destroy(hvd_mr_cache *c);

#endif
