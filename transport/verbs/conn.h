/*
 * Connection data of the verbs transport, exchanged through the bootstrap
 * allgather at open: one blob per rank, the same length on every rank
 * (HVD_VCONN_LEN(size)), little-endian, versioned, checked field by field
 * on decode so that a blob of another hvd version, a truncated one or a
 * corrupted one is refused with a sentence instead of connecting queue
 * pairs to garbage.
 *
 * Layout (offsets in bytes):
 *   0 magic "HVIB" (0x42495648)   4 version (u16)   6 flags (u16)
 *   8 rank (u32)                 12 size (u32)
 *  16 lid (u16)  18 port (u8)  19 link layer (u8)  20 mtu (u8)
 *  21 reserved (u8)  22 gid index (u16, 0xffff: none)
 *  24 gid (16 bytes)
 *  40 ring address (u64)         48 ring rkey (u32)
 *  52 eager buffer bytes (u32)
 *  56 eager credits, channel 0 and 1 (u16 each)
 *  60 ring slots, channel 0 and 1 (u16 each)
 *  64 slot bytes, channel 0 and 1 (u32 each)
 *  72 per rank p: QPN and PSN of the queue pairs this rank made for p,
 *     channel 0 then 1 (4 x u32); zero for p == rank.
 */
#ifndef HVD_TRANSPORT_VERBS_CONN_H
#define HVD_TRANSPORT_VERBS_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"

#define HVD_VCONN_MAGIC 0x42495648u
#define HVD_VCONN_VERSION 1
#define HVD_VCONN_HDR 72
#define HVD_VCONN_PER_PEER 16
#define HVD_VCONN_LEN(size)                                                    \
    ((size_t)HVD_VCONN_HDR + (size_t)(size)*HVD_VCONN_PER_PEER)

/* flags */
#define HVD_VCONN_USABLE 1u /* this rank has a device and set up its QPs */
#define HVD_VCONN_GPUDIRECT                                                    \
    2u /* this rank can send and receive CUDA device                           \
          memory (GPUDirect RDMA) */

/* Bounds checked on decode. */
#define HVD_VCONN_EAGER_MIN 256u
#define HVD_VCONN_EAGER_MAX (1u << 20)
#define HVD_VCONN_SLOT_MIN 4096u
#define HVD_VCONN_SLOT_MAX (1u << 30)
#define HVD_VCONN_SLOTS_MAX 4096u

typedef struct hvd_vconn {
    uint16_t version;
    uint16_t flags;
    uint32_t rank;
    uint32_t size;
    uint16_t lid;
    uint8_t port;
    uint8_t link_layer; /* IBV_LINK_LAYER_* */
    uint8_t mtu;        /* enum ibv_mtu, 1 (256) to 5 (4096) */
    int gid_index;      /* -1: none */
    uint8_t gid[16];
    uint64_t ring_addr;
    uint32_t rkey;
    uint32_t eager_bytes;
    uint16_t eager_credits[2];
    uint16_t slots[2];
    uint32_t slot_bytes[2];
} hvd_vconn;

/* The queue pair one rank made for another, on one channel. */
typedef struct hvd_vqpinfo {
    uint32_t qpn; /* 24 bits */
    uint32_t psn; /* 24 bits */
} hvd_vqpinfo;

/*
 * Writes the blob of c (c->rank of c->size ranks) into out, which holds
 * HVD_VCONN_LEN(c->size) bytes; qps has 2 * size entries: [p * 2 + ch] is
 * the queue pair made for rank p on channel ch.
 */
void hvd_vconn_encode(const hvd_vconn *c, const hvd_vqpinfo *qps, uint8_t *out);

/*
 * Decodes the blob that rank `from` sent (len bytes) in a job of `size`,
 * as seen by rank `me`: *out gets the header, qps_out[0..1] the queue
 * pairs `from` made for `me`. Checks the magic, version, length, the rank
 * and size fields and, when the blob says usable, every field's range.
 * HVD_ERR_TRANSPORT (HVD_ERR_MISMATCH for another version) with a sentence
 * naming rank `from` otherwise.
 */
hvd_status hvd_vconn_decode(const uint8_t *buf, size_t len, int from, int size,
                            int me, hvd_vconn *out, hvd_vqpinfo qps_out[2]);

#endif
