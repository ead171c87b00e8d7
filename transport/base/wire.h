/*
 * Byte order on the wire: every multi-byte field of hvd's own frames and
 * handshakes (tcp frames, the handshake, the rendezvous, the verbs
 * connection records and headers) is little-endian, written and read a
 * byte at a time, so it needs no alignment and means the same on every
 * host.
 */
#ifndef HVD_BASE_WIRE_H
#define HVD_BASE_WIRE_H

#include <stdint.h>

static inline void hvd_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void hvd_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void hvd_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t hvd_get16(const uint8_t *p) {
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t hvd_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline uint64_t hvd_get64(const uint8_t *p) {
    return (uint64_t)hvd_get32(p) | (uint64_t)hvd_get32(p + 4) << 32;
}

#endif
