#ifndef HVD_BASE_GROW_H
#define HVD_BASE_GROW_H

#include <stddef.h>

/*
 * The capacity to give a buffer that must hold need bytes: the next power
 * of two, but not above limit (when limit >= need; 0: no limit).
 *
 * Buffers that grow to the largest message seen so far (scratch, fusion)
 * would otherwise be freed and allocated again, a little larger, for many
 * messages of a run; each time the allocator may place the new block past
 * the old one, and the process's memory creeps up. Rounded up, a buffer
 * grows at most once per doubling.
 */
static inline size_t hvd_grow_cap(size_t need, size_t limit) {
    size_t cap = 1;

    while (cap < need && cap <= ((size_t)-1 >> 1))
        cap <<= 1;
    if (cap < need)
        cap = need;
    if (limit >= need && cap > limit)
        cap = limit;
    return cap;
}

/*
 * Grows a ring of entries of elem bytes (v, *cap entries, the count in
 * use from *head on, wrapping) to hold at least need: twice its capacity
 * (16 at first) until it does, the entries moved to the front (*head 0).
 * Returns the new buffer, or NULL without memory (v is then kept). Rings
 * never shrink, so a steady state does not allocate. A ring grown from
 * nothing only ever has a power of two entries, so it is indexed with a
 * mask (& (cap - 1)), not a division.
 */
void *hvd_ring_grow(void *v, size_t elem, size_t *cap, size_t *head,
                    size_t count, size_t need);

#endif
