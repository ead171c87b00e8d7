/*
 * The response cache. Every rank holds an identical copy: entries are
 * inserted, touched and erased only as the responses of a cycle are run,
 * and every rank runs the same responses in the same order with the same
 * cycle number, so slot numbers agree everywhere without being exchanged.
 * That lets ranks agree on a cached operation through one bit per slot in
 * the cycle's small allreduce instead of sending its name to rank 0.
 *
 * Eviction is least-recently-used by cycle number, ties to the lowest slot:
 * deterministic, hence identical on every rank.
 */
#ifndef HVD_API_CACHE_H
#define HVD_API_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "api/runtime/namemap.h"
#include "api/runtime/opdesc.h"

typedef struct hvd_cache_entry {
    char *name;    /* NULL: the slot is free */
    uint64_t hash; /* hvd_namemap_hash(name) */
    hvd_opdesc desc;
    uint64_t *counts; /* desc.counts points here */
    uint64_t last_used;
} hvd_cache_entry;

typedef struct hvd_cache {
    int capacity; /* 0: caching is off */
    int nslots;   /* slots ever used: the same on every rank */
    hvd_cache_entry *slots;
    hvd_namemap by_name; /* name -> slot + 1 */
} hvd_cache;

int hvd_cache_init(hvd_cache *cache, int capacity);
void hvd_cache_destroy(hvd_cache *cache);

/* The slot of name, or -1 (hash: hvd_namemap_hash(name)). */
int hvd_cache_lookup(const hvd_cache *cache, const char *name, uint64_t hash);

/* Inserts or updates name; returns its slot, or -1 when caching is off or
 * memory ran out (the cache then simply does not hold it: still the same
 * on every rank only if memory runs out everywhere, so a failure here is
 * reported by the caller as fatal). */
int hvd_cache_put(hvd_cache *cache, const char *name, const hvd_opdesc *desc,
                  uint64_t tick);

void hvd_cache_touch(hvd_cache *cache, int slot, uint64_t tick);
void hvd_cache_erase(hvd_cache *cache, int slot);

#endif
