#include "api/runtime/arena.h"

#include <stdalign.h>
#include <stdlib.h>

/* A block from malloc for what did not fit in the buffer. */
struct hvd_arena_block {
    hvd_arena_block *next;
    max_align_t data[]; /* what was asked for */
};

#define ALIGN_TO alignof(max_align_t)
#define FIRST_CAP 1024

static void *pb_alloc(void *data, size_t size) {
    return hvd_arena_alloc(data, size);
}

/* Memory goes back at the reset, all of it at once. */
static void pb_free(void *data, void *ptr) {
    (void)data;
    (void)ptr;
}

void hvd_arena_init(hvd_arena *a) {
    a->buf = NULL;
    a->cap = a->used = 0;
    a->overflow = NULL;
    a->overflow_bytes = 0;
    a->pb.alloc = pb_alloc;
    a->pb.free = pb_free;
    a->pb.allocator_data = a;
}

void *hvd_arena_alloc(hvd_arena *a, size_t size) {
    size_t need = (size + ALIGN_TO - 1) & ~(size_t)(ALIGN_TO - 1);

    if (need < size)
        return NULL;
    if (a->buf == NULL && a->overflow == NULL) {
        size_t cap = need > FIRST_CAP ? need : FIRST_CAP;
        a->buf = malloc(cap);
        if (a->buf != NULL)
            a->cap = cap;
    }
    if (a->buf != NULL && need <= a->cap - a->used) {
        void *p = a->buf + a->used;
        a->used += need;
        return p;
    }
    if (need > SIZE_MAX - sizeof(hvd_arena_block))
        return NULL;
    hvd_arena_block *b = malloc(sizeof(*b) + need);
    if (b == NULL)
        return NULL;
    b->next = a->overflow;
    a->overflow = b;
    a->overflow_bytes += need;
    return b->data;
}

void hvd_arena_reset(hvd_arena *a) {
    size_t want = a->used + a->overflow_bytes;

    while (a->overflow != NULL) {
        hvd_arena_block *next = a->overflow->next;
        free(a->overflow);
        a->overflow = next;
    }
    /* What overflowed fits next time (a larger buffer, or none if that
     * fails: the next allocation tries again). */
    if (want > a->cap) {
        free(a->buf);
        a->buf = malloc(want * 2);
        a->cap = a->buf != NULL ? want * 2 : 0;
    }
    a->used = 0;
    a->overflow_bytes = 0;
}

void hvd_arena_destroy(hvd_arena *a) {
    if (a == NULL)
        return;
    a->used = 0;
    a->overflow_bytes = 0;
    hvd_arena_reset(a);
    free(a->buf);
    a->buf = NULL;
    a->cap = 0;
}
