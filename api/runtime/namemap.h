/*
 * A map from operation names to pointers: open addressing with linear
 * probing, FNV-1a hashes, keys copied. Used for the names in flight on a
 * rank, the coordinator's table and the response cache.
 */
#ifndef HVD_API_NAMEMAP_H
#define HVD_API_NAMEMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct hvd_namemap_slot {
    char *key; /* NULL: empty; TOMBSTONE: removed */
    uint64_t hash;
    void *value;
} hvd_namemap_slot;

typedef struct hvd_namemap {
    hvd_namemap_slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t count;
    size_t used; /* count plus tombstones */
} hvd_namemap;

void hvd_namemap_init(hvd_namemap *map);
void hvd_namemap_destroy(hvd_namemap *map);

/* The value stored under key, or NULL. */
void *hvd_namemap_get(const hvd_namemap *map, const char *key);

/* Stores value under key (replacing any). Returns 0, or -1 when out of
 * memory (the map is unchanged). */
int hvd_namemap_put(hvd_namemap *map, const char *key, void *value);

/* Removes key; returns its value or NULL. */
void *hvd_namemap_remove(hvd_namemap *map, const char *key);

#endif
