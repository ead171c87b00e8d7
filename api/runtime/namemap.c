#include "api/runtime/namemap.h"

#include <stdlib.h>
#include <string.h>

static char tombstone_mark;
#define TOMBSTONE (&tombstone_mark)

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;

    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ull;
    }
    return h;
}

void hvd_namemap_init(hvd_namemap *map) { memset(map, 0, sizeof(*map)); }

void hvd_namemap_destroy(hvd_namemap *map) {
    for (size_t i = 0; i < map->cap; i++)
        if (map->slots[i].key != NULL && map->slots[i].key != TOMBSTONE)
            free(map->slots[i].key);
    free(map->slots);
    memset(map, 0, sizeof(*map));
}

/* The slot holding key, or the first free one on its probe path. */
static hvd_namemap_slot *find(const hvd_namemap *map, const char *key,
                              uint64_t hash, int *found) {
    hvd_namemap_slot *free_slot = NULL;
    size_t mask = map->cap - 1;

    *found = 0;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        hvd_namemap_slot *s = &map->slots[i];
        if (s->key == NULL)
            return free_slot != NULL ? free_slot : s;
        if (s->key == TOMBSTONE) {
            if (free_slot == NULL)
                free_slot = s;
        } else if (s->hash == hash && strcmp(s->key, key) == 0) {
            *found = 1;
            return s;
        }
    }
}

static int grow(hvd_namemap *map) {
    size_t cap = map->cap ? map->cap * 2 : 16;
    hvd_namemap_slot *old = map->slots;
    size_t oldcap = map->cap;

    /* Only rehash in place of tombstones when they dominate. */
    if (map->count * 2 < map->cap)
        cap = map->cap;
    map->slots = calloc(cap, sizeof(*map->slots));
    if (map->slots == NULL) {
        map->slots = old;
        return -1;
    }
    map->cap = cap;
    map->used = map->count;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i].key == NULL || old[i].key == TOMBSTONE)
            continue;
        int found;
        *find(map, old[i].key, old[i].hash, &found) = old[i];
    }
    free(old);
    return 0;
}

void *hvd_namemap_get(const hvd_namemap *map, const char *key) {
    int found;

    if (map->cap == 0)
        return NULL;
    hvd_namemap_slot *s = find(map, key, fnv1a(key), &found);
    return found ? s->value : NULL;
}

int hvd_namemap_put(hvd_namemap *map, const char *key, void *value) {
    uint64_t hash = fnv1a(key);
    int found;

    if ((map->used + 1) * 4 > map->cap * 3 && grow(map) != 0)
        return -1;
    hvd_namemap_slot *s = find(map, key, hash, &found);
    if (found) {
        s->value = value;
        return 0;
    }
    char *copy = strdup(key);
    if (copy == NULL)
        return -1;
    if (s->key == NULL)
        map->used++;
    s->key = copy;
    s->hash = hash;
    s->value = value;
    map->count++;
    return 0;
}

void *hvd_namemap_remove(hvd_namemap *map, const char *key) {
    int found;

    if (map->cap == 0)
        return NULL;
    hvd_namemap_slot *s = find(map, key, fnv1a(key), &found);
    if (!found)
        return NULL;
    void *value = s->value;
    free(s->key);
    s->key = TOMBSTONE;
    s->value = NULL;
    map->count--;
    return value;
}
