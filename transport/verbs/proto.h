/*
 * The wire protocol of the verbs transport, as pure functions (unit-tested
 * without a device).
 *
 * Each (peer, channel) pair has its own RC queue pair, so channels never
 * share buffers or credits. On a queue pair:
 *
 * - Small messages (up to the peer's eager buffer size less the header)
 *   go as one SEND: a 16-byte header, then the payload, into one of the
 *   receive buffers the peer has posted.
 * - Larger messages go as RDMA WRITE WITH IMMEDIATE of chunks into the
 *   peer's receive ring: `slots` registered slots of `slot_bytes`, used in
 *   order. The immediate holds the chunk's length and whether it is the
 *   message's last. Each write consumes a posted receive (it is how the
 *   peer learns that the chunk is there), never an eager buffer.
 * - Control messages (CREDIT, HEARTBEAT, BYE, HELLO, ABORT) are SENDs of a
 *   header (ABORT: plus a sentence).
 *
 * Flow control: the sender holds credits for the peer's eager buffers and
 * ring slots; each data message takes one. The receiver frees a buffer or
 * slot when a posted irecv has copied its data out, and returns the
 * credits in the header of its next eager message to that peer, or in a
 * CREDIT message once half of either kind is waiting to go back. A sender
 * whose credits are gone waits (its requests stay queued): a fast sender
 * cannot overrun a slow receiver.
 *
 * Posted receives are sized so that they never run out: eager credits,
 * plus slots, plus a reserve for control messages, whose buffers are
 * reposted as soon as they are read. Queue pairs retry forever on
 * "receiver not ready" as a last resort; a peer that stops reading is
 * caught by the transport's stall timeout, one that dies by the transport
 * retry limit.
 */
#ifndef HVD_TRANSPORT_VERBS_PROTO_H
#define HVD_TRANSPORT_VERBS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/hvd.h"

#define HVD_VHDR_LEN 16

typedef enum {
    HVD_VMSG_DATA = 1,      /* an eager message */
    HVD_VMSG_CREDIT = 2,    /* credits only */
    HVD_VMSG_HEARTBEAT = 3, /* this rank is alive and waiting */
    HVD_VMSG_BYE = 4,       /* orderly shutdown */
    HVD_VMSG_HELLO = 5,     /* connection check at open */
    HVD_VMSG_ABORT = 6      /* this rank failed; the payload says why */
} hvd_vmsg_type;

typedef struct hvd_vhdr {
    uint8_t type;
    uint16_t eager_ret; /* eager buffers returned to the receiver of this */
    uint16_t slot_ret;  /* ring slots returned */
    uint32_t len;       /* payload bytes after the header */
} hvd_vhdr;

/* Fixed little-endian layout: type, version, eager_ret, slot_ret, 2 bytes
 * zero, len, 4 bytes zero. */
void hvd_vhdr_encode(const hvd_vhdr *h, uint8_t out[HVD_VHDR_LEN]);

/* Decodes the header of a received buffer of n bytes (header and payload).
 * Returns HVD_ERR_TRANSPORT with a sentence for a short buffer, an unknown
 * type or version, or a length that disagrees with n. */
hvd_status hvd_vhdr_decode(const uint8_t *buf, size_t n, hvd_vhdr *out);

/* ABORT payload: status, culprit rank, origin rank, then the sentence. */
#define HVD_VABORT_TEXT_MAX 900
typedef struct hvd_vabort {
    int32_t status;
    int32_t culprit;
    int32_t origin;
    char text[HVD_VABORT_TEXT_MAX + 1];
} hvd_vabort;

size_t hvd_vabort_encode(const hvd_vabort *a, uint8_t *out, size_t cap);
hvd_status hvd_vabort_decode(const uint8_t *buf, size_t n, hvd_vabort *out);

/* The immediate of a chunk write: its length (< 2^31) and a last flag. */
#define HVD_VIMM_LAST 0x80000000u
#define HVD_VCHUNK_MAX 0x7fffffffu
static inline uint32_t hvd_vimm(uint32_t len, int last) {
    return len | (last ? HVD_VIMM_LAST : 0);
}
static inline uint32_t hvd_vimm_len(uint32_t imm) {
    return imm & ~HVD_VIMM_LAST;
}
static inline int hvd_vimm_last(uint32_t imm) {
    return (imm & HVD_VIMM_LAST) != 0;
}

/* ------------------------------------------------------------------ */
/* Credits of one queue pair, both directions                          */

typedef struct hvd_vcredit {
    /* Sending: what the peer has free for us. */
    uint32_t eager;     /* eager buffers */
    uint32_t slots;     /* ring slots */
    uint32_t eager_max; /* the peer's totals, for checking returns */
    uint32_t slot_max;
    /* Receiving: what we freed and have not told the peer yet. */
    uint32_t eager_ret;
    uint32_t slot_ret;
    uint32_t eager_thresh; /* send a CREDIT when a count reaches this */
    uint32_t slot_thresh;
} hvd_vcredit;

/* peer_eager/peer_slots: what the peer posted for us; my_eager/my_slots:
 * what we posted for it. */
void hvd_vcredit_init(hvd_vcredit *c, uint32_t peer_eager, uint32_t peer_slots,
                      uint32_t my_eager, uint32_t my_slots);

/* Takes one eager credit / one slot credit; 0 if none is left. */
int hvd_vcredit_take_eager(hvd_vcredit *c);
int hvd_vcredit_take_slot(hvd_vcredit *c);

/* Credits the peer returned. -1 (nothing changed) if that would exceed
 * what the peer has: a protocol error. */
int hvd_vcredit_grant(hvd_vcredit *c, uint32_t eager, uint32_t slots);

/* Counts a buffer / slot freed here. */
void hvd_vcredit_freed_eager(hvd_vcredit *c);
void hvd_vcredit_freed_slot(hvd_vcredit *c);

/* 1 if enough is waiting to go back that a CREDIT message is due. */
int hvd_vcredit_due(const hvd_vcredit *c);

/* Moves what is waiting to go back into *eager and *slots (for a header) and
 * zeroes it; clamped to 16 bits, the rest stays for the next message. */
void hvd_vcredit_collect(hvd_vcredit *c, uint16_t *eager, uint16_t *slots);

/* ------------------------------------------------------------------ */
/* Chunks                                                              */

/* 1 if a message of len bytes goes eager to a peer whose eager buffers
 * hold eager_bytes (header included). */
static inline int hvd_veager(size_t len, size_t eager_bytes) {
    return len + HVD_VHDR_LEN <= eager_bytes;
}

/* Number of chunk writes for len bytes with chunks of at most chunk. */
size_t hvd_vnchunks(size_t len, size_t chunk);

/* The next chunk of a message of len bytes of which off are sent:
 * *n_out bytes, *last_out set on the final one. */
void hvd_vchunk_next(size_t len, size_t off, size_t chunk, size_t *n_out,
                     int *last_out);

/* Byte offset, in the receive ring of rank `to`, of slot `slot` of the
 * ring it keeps for rank `from` on channel ch. Rings are laid out by
 * channel, then by sending rank (skipping `to` itself), then by slot. */
uint64_t hvd_vring_offset(int size, int to, int from, int ch, uint32_t slot,
                          const uint32_t slots[2],
                          const uint32_t slot_bytes[2]);

/* Total bytes of the receive rings a rank keeps. */
uint64_t hvd_vring_bytes(int size, const uint32_t slots[2],
                         const uint32_t slot_bytes[2]);

/* ------------------------------------------------------------------ */
/* Reassembly at the receiver                                          */

typedef enum {
    HVD_VRX_MORE = 0,      /* chunk taken, more to come */
    HVD_VRX_DONE = 1,      /* chunk taken, message complete */
    HVD_VRX_TOO_LONG = -1, /* the sender's message is longer than want */
    HVD_VRX_TOO_SHORT = -2 /* the sender's message ended at *got_out */
} hvd_vrx;

/* A chunk of clen bytes (last or not) arrives for a receive of want bytes
 * that has got bytes so far. *got_out gets the new total. */
hvd_vrx hvd_vrx_chunk(size_t want, size_t got, size_t clen, int last,
                      size_t *got_out);

#endif
