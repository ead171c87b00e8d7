#include "api/runtime/namemap.h"

#include <stdlib.h>
#include <string.h>

static char tombstone_mark;
#define TOMBSTONE (&tombstone_mark)

/* A hash of the key read 8 bytes at a time (names are often long and
 * alike: "grad.layer3.conv2.weight"); every byte counts, and so does the
 * length. */
uint64_t hvd_namemap_hash(const char *s) {
    const uint64_t k = 0x9e3779b97f4a7c15ull;
    size_t n = strlen(s), i = 0;
    uint64_t h = n * k;

    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * k;
        h ^= h >> 29;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, s + i, n - i);
        h = (h ^ w) * k;
        h ^= h >> 29;
    }
    return h ^ (h >> 32);
}

void hvd_namemap_init(hvd_namemap *map) { memset(map, 0, sizeof(*map)); }

void hvd_namemap_init_borrowed(hvd_namemap *map) {
    hvd_namemap_init(map);
    map->borrowed = 1;
}

/* Frees a key the map copied. */
static void drop_key(const hvd_namemap *map, char *key) {
    if (!map->borrowed)
        free(key);
}

void hvd_namemap_destroy(hvd_namemap *map) {
    int borrowed = map->borrowed;

    for (size_t i = 0; i < map->cap; i++)
        if (map->slots[i].key != NULL && map->slots[i].key != TOMBSTONE)
            drop_key(map, map->slots[i].key);
    free(map->slots);
    memset(map, 0, sizeof(*map));
    map->borrowed = borrowed;
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
        } else if (s->hash == hash &&
                   (s->key == key || strcmp(s->key, key) == 0)) {
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

void *hvd_namemap_get_h(const hvd_namemap *map, const char *key,
                        uint64_t hash) {
    int found;

    if (map->cap == 0)
        return NULL;
    hvd_namemap_slot *s = find(map, key, hash, &found);
    return found ? s->value : NULL;
}

void *hvd_namemap_get(const hvd_namemap *map, const char *key) {
    return map->cap == 0 ? NULL
                         : hvd_namemap_get_h(map, key, hvd_namemap_hash(key));
}

int hvd_namemap_put_h(hvd_namemap *map, const char *key, uint64_t hash,
                      void *value) {
    int found;

    if ((map->used + 1) * 4 > map->cap * 3 && grow(map) != 0)
        return -1;
    hvd_namemap_slot *s = find(map, key, hash, &found);
    if (found) {
        s->value = value;
        return 0;
    }
    char *copy = map->borrowed ? (char *)key : strdup(key);
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

int hvd_namemap_put(hvd_namemap *map, const char *key, void *value) {
    return hvd_namemap_put_h(map, key, hvd_namemap_hash(key), value);
}

void *hvd_namemap_remove_h(hvd_namemap *map, const char *key, uint64_t hash) {
    int found;

    if (map->cap == 0)
        return NULL;
    hvd_namemap_slot *s = find(map, key, hash, &found);
    if (!found)
        return NULL;
    void *value = s->value;
    drop_key(map, s->key);
    s->key = TOMBSTONE;
    s->value = NULL;
    map->count--;
    return value;
}

void *hvd_namemap_remove(hvd_namemap *map, const char *key) {
    return map->cap == 0
               ? NULL
               : hvd_namemap_remove_h(map, key, hvd_namemap_hash(key));
}
