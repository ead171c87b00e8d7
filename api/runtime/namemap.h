/*
 * A map from operation names to pointers: open addressing with linear
 * probing, a word-at-a-time hash, keys copied (or borrowed: see
 * hvd_namemap_init_borrowed). Used for the names in flight on a rank, the
 * coordinator's table and the response cache.
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
    size_t used;  /* count plus tombstones */
    int borrowed; /* keys are the caller's, not copies */
} hvd_namemap;

void hvd_namemap_init(hvd_namemap *map);

/* A map that keeps the caller's key pointers instead of copies: each key
 * must stay valid and unchanged until it is removed or the map destroyed
 * (a request's own name, in the maps of requests in flight). */
void hvd_namemap_init_borrowed(hvd_namemap *map);
void hvd_namemap_destroy(hvd_namemap *map);

/* The hash a map files key under. A caller that looks one name up many
 * times computes it once and passes it to the *_h forms, which are the
 * plain ones without the hashing. */
uint64_t hvd_namemap_hash(const char *key);
void *hvd_namemap_get_h(const hvd_namemap *map, const char *key, uint64_t hash);
int hvd_namemap_put_h(hvd_namemap *map, const char *key, uint64_t hash,
                      void *value);
void *hvd_namemap_remove_h(hvd_namemap *map, const char *key, uint64_t hash);

/* The value stored under key, or NULL. */
void *hvd_namemap_get(const hvd_namemap *map, const char *key);

/* Stores value under key (replacing any). Returns 0, or -1 when out of
 * memory (the map is unchanged). */
int hvd_namemap_put(hvd_namemap *map, const char *key, void *value);

/* Removes key; returns its value or NULL. */
void *hvd_namemap_remove(hvd_namemap *map, const char *key);

#endif
