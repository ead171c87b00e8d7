#include "transport/base/grow.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *hvd_ring_grow(void *v, size_t elem, size_t *cap, size_t *head,
                    size_t count, size_t need) {
    size_t ncap = *cap ? *cap * 2 : 16;
    uint8_t *nv;

    while (ncap < need)
        ncap *= 2;
    nv = malloc(ncap * elem);
    if (nv == NULL)
        return NULL;
    for (size_t i = 0; i < count; i++)
        memcpy(nv + i * elem, (uint8_t *)v + ((*head + i) % *cap) * elem, elem);
    free(v);
    *cap = ncap;
    *head = 0;
    return nv;
}
