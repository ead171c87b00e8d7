#include "transport/verbs/conn.h"

#include <string.h>

#include "transport/base/error.h"
#include "transport/base/wire.h"

void hvd_vconn_encode(const hvd_vconn *c, const hvd_vqpinfo *qps,
                      uint8_t *out) {
    memset(out, 0, HVD_VCONN_LEN(c->size));
    hvd_put32(out, HVD_VCONN_MAGIC);
    hvd_put16(out + 4, HVD_VCONN_VERSION);
    hvd_put16(out + 6, c->flags);
    hvd_put32(out + 8, c->rank);
    hvd_put32(out + 12, c->size);
    hvd_put16(out + 16, c->lid);
    out[18] = c->port;
    out[19] = c->link_layer;
    out[20] = c->mtu;
    hvd_put16(out + 22, c->gid_index < 0 ? 0xffff : (uint16_t)c->gid_index);
    memcpy(out + 24, c->gid, 16);
    hvd_put64(out + 40, c->ring_addr);
    hvd_put32(out + 48, c->rkey);
    hvd_put32(out + 52, c->eager_bytes);
    for (int ch = 0; ch < 2; ch++) {
        hvd_put16(out + 56 + 2 * ch, c->eager_credits[ch]);
        hvd_put16(out + 60 + 2 * ch, c->slots[ch]);
        hvd_put32(out + 64 + 4 * ch, c->slot_bytes[ch]);
    }
    for (uint32_t p = 0; p < c->size; p++) {
        uint8_t *e = out + HVD_VCONN_HDR + (size_t)p * HVD_VCONN_PER_PEER;
        if (p == c->rank || qps == NULL)
            continue;
        for (int ch = 0; ch < 2; ch++) {
            hvd_put32(e + 8 * ch, qps[p * 2 + ch].qpn);
            hvd_put32(e + 8 * ch + 4, qps[p * 2 + ch].psn);
        }
    }
}

#define BAD(...) hvd_error_set(HVD_ERR_PROTOCOL, __VA_ARGS__)

/* The header of rank from's connection data: its size, magic, version,
 * place and flags (into c). */
static hvd_status decode_head(const uint8_t *buf, size_t len, int from,
                              int size, int me, hvd_vconn *c) {
    if (size < 1 || from < 0 || from >= size || me < 0 || me >= size)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "verbs connection data: rank %d or %d outside a "
                             "job of %d",
                             from, me, size);
    if (len < 8)
        return BAD("verbs connection data of rank %d is truncated (%zu "
                   "bytes)",
                   from, len);
    if (hvd_get32(buf) != HVD_VCONN_MAGIC)
        return BAD("verbs connection data of rank %d is not hvd's (magic "
                   "%#x)",
                   from, hvd_get32(buf));
    c->version = hvd_get16(buf + 4);
    if (c->version != HVD_VCONN_VERSION)
        return hvd_error_set(HVD_ERR_MISMATCH,
                             "rank %d speaks verbs connection format v%u and "
                             "this rank v%d: every rank must run the same hvd",
                             from, c->version, HVD_VCONN_VERSION);
    if (len != HVD_VCONN_LEN(size))
        return BAD("verbs connection data of rank %d has %zu bytes, expected "
                   "%zu for a job of %d",
                   from, len, HVD_VCONN_LEN(size), size);
    c->flags = hvd_get16(buf + 6);
    c->rank = hvd_get32(buf + 8);
    c->size = hvd_get32(buf + 12);
    if (c->rank != (uint32_t)from || c->size != (uint32_t)size)
        return BAD("verbs connection data in rank %d's place says rank %u of "
                   "%u (job of %d)",
                   from, c->rank, c->size, size);
    if ((c->flags & ~(HVD_VCONN_USABLE | HVD_VCONN_GPUDIRECT)) != 0)
        return BAD("verbs connection data of rank %d has unknown flags %#x",
                   from, c->flags);
    return HVD_OK;
}

/* The port and ring fields after the header (into c), and the queue
 * pairs rank from keeps for rank me (none from this rank itself). */
static void decode_body(const uint8_t *buf, int from, int me, hvd_vconn *c,
                        hvd_vqpinfo q[2]) {
    uint16_t gi;

    c->lid = hvd_get16(buf + 16);
    c->port = buf[18];
    c->link_layer = buf[19];
    c->mtu = buf[20];
    gi = hvd_get16(buf + 22);
    c->gid_index = gi == 0xffff ? -1 : gi;
    memcpy(c->gid, buf + 24, 16);
    c->ring_addr = hvd_get64(buf + 40);
    c->rkey = hvd_get32(buf + 48);
    c->eager_bytes = hvd_get32(buf + 52);
    for (int ch = 0; ch < 2; ch++) {
        c->eager_credits[ch] = hvd_get16(buf + 56 + 2 * ch);
        c->slots[ch] = hvd_get16(buf + 60 + 2 * ch);
        c->slot_bytes[ch] = hvd_get32(buf + 64 + 4 * ch);
    }
    memset(q, 0, 2 * sizeof(*q));
    if (from != me) {
        const uint8_t *e =
            buf + HVD_VCONN_HDR + (size_t)me * HVD_VCONN_PER_PEER;
        for (int ch = 0; ch < 2; ch++) {
            q[ch].qpn = hvd_get32(e + 8 * ch);
            q[ch].psn = hvd_get32(e + 8 * ch + 4);
        }
    }
}

/* Checks what a usable rank from says about its port, rings and queue
 * pairs. */
static hvd_status check_usable(const hvd_vconn *c, const hvd_vqpinfo q[2],
                               int from, int size, int me) {
    if (c->port == 0)
        return BAD("verbs connection data of rank %d: port 0", from);
    if (c->link_layer != 1 && c->link_layer != 2)
        return BAD("verbs connection data of rank %d: link layer %u", from,
                   c->link_layer);
    if (c->link_layer == 1 && c->lid == 0)
        return BAD("verbs connection data of rank %d: InfiniBand port "
                   "without a LID",
                   from);
    if (c->link_layer == 2 && c->gid_index < 0)
        return BAD("verbs connection data of rank %d: RoCE port without "
                   "a GID",
                   from);
    if (c->mtu < 1 || c->mtu > 5)
        return BAD("verbs connection data of rank %d: MTU code %u", from,
                   c->mtu);
    if (c->ring_addr == 0 || c->rkey == 0)
        return BAD("verbs connection data of rank %d: no receive ring", from);
    if (c->eager_bytes < HVD_VCONN_EAGER_MIN ||
        c->eager_bytes > HVD_VCONN_EAGER_MAX)
        return BAD("verbs connection data of rank %d: eager buffers of "
                   "%u bytes",
                   from, c->eager_bytes);
    for (int ch = 0; ch < 2; ch++) {
        if (c->eager_credits[ch] < 1 || c->slots[ch] < 1 ||
            c->slots[ch] > HVD_VCONN_SLOTS_MAX ||
            c->slot_bytes[ch] < HVD_VCONN_SLOT_MIN ||
            c->slot_bytes[ch] > HVD_VCONN_SLOT_MAX)
            return BAD("verbs connection data of rank %d: channel %d has "
                       "%u eager credits and %u slots of %u bytes",
                       from, ch, c->eager_credits[ch], c->slots[ch],
                       c->slot_bytes[ch]);
    }
    /* The ring must fit in the address space it claims. */
    uint32_t sl[2] = {c->slots[0], c->slots[1]};
    uint64_t ring = (uint64_t)(size - 1) * ((uint64_t)sl[0] * c->slot_bytes[0] +
                                            (uint64_t)sl[1] * c->slot_bytes[1]);
    if (c->ring_addr + ring < c->ring_addr)
        return BAD("verbs connection data of rank %d: receive ring wraps "
                   "the address space",
                   from);
    if (from != me) {
        for (int ch = 0; ch < 2; ch++)
            if (q[ch].qpn == 0 || q[ch].qpn > 0xffffff || q[ch].psn > 0xffffff)
                return BAD("verbs connection data of rank %d: queue pair "
                           "%#x (PSN %#x) for rank %d",
                           from, q[ch].qpn, q[ch].psn, me);
    }
    return HVD_OK;
}

hvd_status hvd_vconn_decode(const uint8_t *buf, size_t len, int from, int size,
                            int me, hvd_vconn *out, hvd_vqpinfo qps_out[2]) {
    hvd_vconn c;
    hvd_vqpinfo q[2];
    hvd_status st;

    memset(&c, 0, sizeof(c));
    st = decode_head(buf, len, from, size, me, &c);
    if (st != HVD_OK)
        return st;
    decode_body(buf, from, me, &c, q);
    if (c.flags & HVD_VCONN_USABLE) {
        st = check_usable(&c, q, from, size, me);
        if (st != HVD_OK)
            return st;
    }
    *out = c;
    qps_out[0] = q[0];
    qps_out[1] = q[1];
    return HVD_OK;
}
