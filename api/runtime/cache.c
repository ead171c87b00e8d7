#include "api/runtime/cache.h"

#include <stdlib.h>
#include <string.h>

int hvd_cache_init(hvd_cache *cache, int capacity) {
    memset(cache, 0, sizeof(*cache));
    hvd_namemap_init(&cache->by_name);
    if (capacity <= 0)
        return 0;
    cache->slots = calloc((size_t)capacity, sizeof(*cache->slots));
    if (cache->slots == NULL)
        return -1;
    cache->capacity = capacity;
    return 0;
}

void hvd_cache_destroy(hvd_cache *cache) {
    for (int i = 0; i < cache->nslots; i++) {
        free(cache->slots[i].name);
        free(cache->slots[i].counts);
    }
    free(cache->slots);
    hvd_namemap_destroy(&cache->by_name);
    memset(cache, 0, sizeof(*cache));
}

int hvd_cache_lookup(const hvd_cache *cache, const char *name, uint64_t hash) {
    void *v = hvd_namemap_get_h(&cache->by_name, name, hash);

    return v == NULL ? -1 : (int)((uintptr_t)v - 1);
}

void hvd_cache_erase(hvd_cache *cache, int slot) {
    hvd_cache_entry *e = &cache->slots[slot];

    if (e->name == NULL)
        return;
    hvd_namemap_remove_h(&cache->by_name, e->name, e->hash);
    free(e->name);
    free(e->counts);
    memset(e, 0, sizeof(*e));
}

void hvd_cache_touch(hvd_cache *cache, int slot, uint64_t tick) {
    cache->slots[slot].last_used = tick;
}

/* A slot for a new entry: the lowest free one, else a never-used one (the
 * bit vector grows), else the least recently used (lowest slot on ties). */
static int pick_slot(hvd_cache *cache) {
    int victim = -1;

    for (int i = 0; i < cache->nslots; i++)
        if (cache->slots[i].name == NULL)
            return i;
    if (cache->nslots < cache->capacity)
        return cache->nslots++;
    for (int i = 0; i < cache->nslots; i++)
        if (victim < 0 ||
            cache->slots[i].last_used < cache->slots[victim].last_used)
            victim = i;
    hvd_cache_erase(cache, victim);
    return victim;
}

int hvd_cache_put(hvd_cache *cache, const char *name, const hvd_opdesc *desc,
                  uint64_t tick) {
    int slot;
    uint64_t *counts;

    if (cache->capacity == 0)
        return -1;
    counts = malloc((desc->ncounts ? desc->ncounts : 1) * sizeof(*counts));
    if (counts == NULL)
        return -1;
    memcpy(counts, desc->counts, desc->ncounts * sizeof(*counts));
    uint64_t hash = hvd_namemap_hash(name);
    slot = hvd_cache_lookup(cache, name, hash);
    if (slot >= 0) {
        hvd_cache_entry *e = &cache->slots[slot];
        free(e->counts);
        e->counts = counts;
        e->desc = *desc;
        e->desc.counts = counts;
        e->last_used = tick;
        return slot;
    }
    char *copy = strdup(name);
    if (copy == NULL) {
        free(counts);
        return -1;
    }
    slot = pick_slot(cache);
    if (hvd_namemap_put_h(&cache->by_name, name, hash,
                          (void *)(uintptr_t)(slot + 1)) != 0) {
        free(copy);
        free(counts);
        return -1;
    }
    hvd_cache_entry *e = &cache->slots[slot];
    e->name = copy;
    e->hash = hash;
    e->counts = counts;
    e->desc = *desc;
    e->desc.counts = counts;
    e->last_used = tick;
    return slot;
}
