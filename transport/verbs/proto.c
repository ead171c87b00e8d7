#include "transport/verbs/proto.h"

#include <stdio.h>
#include <string.h>

#include "transport/base/error.h"
#include "transport/base/wire.h"

#define VHDR_VERSION 1

void hvd_vhdr_encode(const hvd_vhdr *h, uint8_t out[HVD_VHDR_LEN]) {
    memset(out, 0, HVD_VHDR_LEN);
    out[0] = h->type;
    out[1] = VHDR_VERSION;
    hvd_put16(out + 2, h->eager_ret);
    hvd_put16(out + 4, h->slot_ret);
    hvd_put32(out + 8, h->len);
}

hvd_status hvd_vhdr_decode(const uint8_t *buf, size_t n, hvd_vhdr *out) {
    hvd_vhdr h;

    if (n < HVD_VHDR_LEN)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "a message of %zu bytes is shorter than the "
                             "%d-byte header",
                             n, HVD_VHDR_LEN);
    if (buf[1] != VHDR_VERSION)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "message header version %u (this hvd speaks "
                             "%d): every rank must run the same hvd",
                             buf[1], VHDR_VERSION);
    h.type = buf[0];
    h.eager_ret = hvd_get16(buf + 2);
    h.slot_ret = hvd_get16(buf + 4);
    h.len = hvd_get32(buf + 8);
    if (h.type < HVD_VMSG_DATA || h.type > HVD_VMSG_RING)
        return hvd_error_set(HVD_ERR_PROTOCOL, "unknown message type %u",
                             h.type);
    if ((size_t)h.len != n - HVD_VHDR_LEN)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "message header says %u payload bytes but %zu "
                             "arrived",
                             h.len, n - HVD_VHDR_LEN);
    if (h.type >= HVD_VMSG_RTR && h.len != HVD_VRDV_LEN)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "control message of type %u carries %u bytes "
                             "instead of %d",
                             h.type, h.len, HVD_VRDV_LEN);
    if (h.type != HVD_VMSG_DATA && h.type != HVD_VMSG_ABORT &&
        h.type < HVD_VMSG_RTR && h.len != 0)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "control message of type %u carries %u bytes",
                             h.type, h.len);
    *out = h;
    return HVD_OK;
}

void hvd_vrdv_encode(const hvd_vrdv *r, uint8_t out[HVD_VRDV_LEN]) {
    memset(out, 0, HVD_VRDV_LEN);
    hvd_put64(out, r->seq);
    hvd_put64(out + 8, r->addr);
    hvd_put64(out + 16, r->len);
    hvd_put32(out + 24, r->rkey);
}

void hvd_vrdv_decode(const uint8_t in[HVD_VRDV_LEN], hvd_vrdv *out) {
    out->seq = hvd_get64(in);
    out->addr = hvd_get64(in + 8);
    out->len = hvd_get64(in + 16);
    out->rkey = hvd_get32(in + 24);
}

size_t hvd_vabort_encode(const hvd_vabort *a, uint8_t *out, size_t cap) {
    size_t tlen = strnlen(a->text, HVD_VABORT_TEXT_MAX);

    if (cap < 12)
        return 0;
    if (tlen > cap - 12)
        tlen = cap - 12;
    hvd_put32(out, (uint32_t)a->status);
    hvd_put32(out + 4, (uint32_t)a->culprit);
    hvd_put32(out + 8, (uint32_t)a->origin);
    memcpy(out + 12, a->text, tlen);
    return 12 + tlen;
}

hvd_status hvd_vabort_decode(const uint8_t *buf, size_t n, hvd_vabort *out) {
    size_t tlen;

    if (n < 12)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "an ABORT message of %zu bytes is too short", n);
    out->status = (int32_t)hvd_get32(buf);
    out->culprit = (int32_t)hvd_get32(buf + 4);
    out->origin = (int32_t)hvd_get32(buf + 8);
    if (out->status <= HVD_OK || out->status > HVD_ERR_INTERNAL)
        out->status = HVD_ERR_TRANSPORT;
    tlen = n - 12 < HVD_VABORT_TEXT_MAX ? n - 12 : HVD_VABORT_TEXT_MAX;
    memcpy(out->text, buf + 12, tlen);
    out->text[tlen] = '\0';
    for (size_t i = 0; i < tlen; i++)
        if ((unsigned char)out->text[i] < 0x20)
            out->text[i] = ' ';
    return HVD_OK;
}

/* ------------------------------------------------------------------ */

void hvd_vcredit_init(hvd_vcredit *c, uint32_t peer_eager, uint32_t peer_slots,
                      uint32_t my_eager, uint32_t my_slots) {
    memset(c, 0, sizeof(*c));
    c->eager = c->eager_max = peer_eager;
    c->slots = c->slot_max = peer_slots;
    c->eager_thresh = my_eager / 2 > 0 ? my_eager / 2 : 1;
    c->slot_thresh = my_slots / 2 > 0 ? my_slots / 2 : 1;
}

int hvd_vcredit_take_eager(hvd_vcredit *c) {
    if (c->eager == 0)
        return 0;
    c->eager--;
    return 1;
}

int hvd_vcredit_take_slot(hvd_vcredit *c) {
    if (c->slots == 0)
        return 0;
    c->slots--;
    return 1;
}

int hvd_vcredit_grant(hvd_vcredit *c, uint32_t eager, uint32_t slots) {
    if (eager > c->eager_max - c->eager || slots > c->slot_max - c->slots)
        return -1;
    c->eager += eager;
    c->slots += slots;
    return 0;
}

void hvd_vcredit_freed_eager(hvd_vcredit *c) { c->eager_ret++; }

void hvd_vcredit_freed_slot(hvd_vcredit *c) { c->slot_ret++; }

int hvd_vcredit_due(const hvd_vcredit *c) {
    return c->eager_ret >= c->eager_thresh || c->slot_ret >= c->slot_thresh;
}

void hvd_vcredit_collect(hvd_vcredit *c, uint16_t *eager, uint16_t *slots) {
    uint32_t e = c->eager_ret > 0xffff ? 0xffff : c->eager_ret;
    uint32_t s = c->slot_ret > 0xffff ? 0xffff : c->slot_ret;

    c->eager_ret -= e;
    c->slot_ret -= s;
    *eager = (uint16_t)e;
    *slots = (uint16_t)s;
}

/* ------------------------------------------------------------------ */

size_t hvd_vnchunks(size_t len, size_t chunk) {
    if (chunk == 0)
        return 0;
    return len == 0 ? 1 : (len - 1) / chunk + 1;
}

void hvd_vchunk_next(size_t len, size_t off, size_t chunk, size_t *n_out,
                     int *last_out) {
    size_t left = off < len ? len - off : 0;
    size_t n = left < chunk ? left : chunk;

    *n_out = n;
    *last_out = off + n >= len;
}

uint64_t hvd_vring_offset(int size, int to, int from, int ch, uint32_t slot,
                          const uint32_t slots[2],
                          const uint32_t slot_bytes[2]) {
    uint64_t ring0 = (uint64_t)slots[0] * slot_bytes[0];
    uint64_t ring1 = (uint64_t)slots[1] * slot_bytes[1];
    uint64_t base = ch == 0 ? 0 : (uint64_t)(size - 1) * ring0;
    uint64_t index = (uint64_t)(from < to ? from : from - 1);

    return base + index * (ch == 0 ? ring0 : ring1) +
           (uint64_t)slot * slot_bytes[ch];
}

uint64_t hvd_vring_bytes(int size, const uint32_t slots[2],
                         const uint32_t slot_bytes[2]) {
    return (uint64_t)(size - 1) * ((uint64_t)slots[0] * slot_bytes[0] +
                                   (uint64_t)slots[1] * slot_bytes[1]);
}

hvd_vrx hvd_vrx_chunk(size_t want, size_t got, size_t clen, int last,
                      size_t *got_out) {
    size_t total = got + clen;

    *got_out = total;
    if (total > want || (total == want && !last))
        return HVD_VRX_TOO_LONG;
    if (last && total < want)
        return HVD_VRX_TOO_SHORT;
    return last ? HVD_VRX_DONE : HVD_VRX_MORE;
}
