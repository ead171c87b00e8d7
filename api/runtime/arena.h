/*
 * A bump allocator for unpacking control messages (protobuf-c's
 * ProtobufCAllocator): what one message unpacks into comes from one
 * buffer, and is all released at once by hvd_arena_reset, with no malloc
 * or free per field. A message larger than the buffer still unpacks (the
 * overflow comes from malloc and is freed at the reset), and the buffer
 * grows at that reset to hold it next time.
 */
#ifndef HVD_API_ARENA_H
#define HVD_API_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct hvd_arena_block hvd_arena_block;

typedef struct hvd_arena {
    unsigned char *buf; /* owned; NULL until the first allocation */
    size_t cap;
    size_t used;
    hvd_arena_block *overflow; /* malloc'd blocks since the last reset */
    size_t overflow_bytes;
    ProtobufCAllocator pb; /* hands out this arena's memory */
} hvd_arena;

/* An empty arena (no memory yet). */
void hvd_arena_init(hvd_arena *a);

/* Releases everything handed out since the last reset (nothing that came
 * from the arena may be used after it). */
void hvd_arena_reset(hvd_arena *a);

/* Frees the arena's memory; the arena is empty afterwards. NULL is
 * accepted. */
void hvd_arena_destroy(hvd_arena *a);

/* size bytes aligned for any type, valid until the next reset; NULL when
 * out of memory. */
void *hvd_arena_alloc(hvd_arena *a, size_t size);

#endif
