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
 * - Control messages (CREDIT, HEARTBEAT, BYE, HELLO, ABORT, RTR, RTS,
 *   RING) are SENDs of a header (ABORT: plus a sentence; RTR, RTS, RING:
 *   plus an hvd_vrdv).
 *
 * GPUDirect RDMA (only when every rank agreed at open that it can: CUDA
 * built and present, nvidia-peermem loaded, HVD_IB_GPUDIRECT not 0). The
 * CPU never touches CUDA device memory, so device buffers never go eager
 * and never land in a receive ring. Messages of a queue pair are numbered
 * in posting order on both sides (the n-th isend matches the n-th irecv):
 *
 * - A receive into device memory (len > 0) registers the buffer (remote
 *   write; the registration cache keys device regions by the driver's
 *   buffer id) and sends RTR {seq, addr, rkey, len}. The sender writes the
 *   message straight into it, from its own buffer (device or registered
 *   host memory, else through staging): plain RDMA WRITEs of chunks (at
 *   least 1 MiB from registered memory, a staging chunk else), the
 *   last one WITH IMMEDIATE carrying a FIN tag (hvd_vimm_fin) that
 *   completes the receive (once the receiver has flushed the HCA's
 *   writes to the GPU where it does not order them natively); it
 *   consumes one posted receive and no ring slot or credit. A receiver
 *   keeps at most HVD_VRTR_MAX RTRs outstanding per queue pair (more
 *   device receives wait their turn), so the sender's table of RTRs is
 *   bounded and the FINs fit the posted receives.
 * - A send from device memory with no RTR at hand sends RTS {seq, len}
 *   and waits. A receiver whose receive of that number is in host memory
 *   answers RING (once the receive is posted): the sender then writes the
 *   message into the receive ring from its registered device memory, by
 *   chunks as any large message (never eager, whatever its size). A
 *   receiver whose receive is in device memory answers with its RTR.
 * - A send from host memory goes as before unless an RTR for its number
 *   has arrived before it started (then it is written into the device
 *   buffer). The memory types of both sides must agree (the engine uses
 *   one memory type per operation on every rank): an RTR for a message
 *   already sent from host memory, or eager or ring data for a device
 *   receive, fails the transport with HVD_ERR_TRANSPORT and a sentence
 *   naming both ranks. A device sender whose receiver never posts the
 *   receive waits as any sender whose receiver is late: the stall
 *   timeout (HVD_TIMEOUT_SECONDS) ends it, naming the peer.
 * - Zero-length messages carry no bytes and always go eager.
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

#include "hvd/types.h"

#define HVD_VHDR_LEN 16

typedef enum {
    HVD_VMSG_DATA = 1,      /* an eager message */
    HVD_VMSG_CREDIT = 2,    /* credits only */
    HVD_VMSG_HEARTBEAT = 3, /* this rank is alive and waiting */
    HVD_VMSG_BYE = 4,       /* orderly shutdown */
    HVD_VMSG_HELLO = 5,     /* connection check at open */
    HVD_VMSG_ABORT = 6,     /* this rank failed; the payload says why */
    HVD_VMSG_RTR = 7,       /* write message seq into addr/rkey (device) */
    HVD_VMSG_RTS = 8,       /* where does device message seq go? */
    HVD_VMSG_RING = 9       /* message seq goes into the receive ring */
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
 * Returns HVD_ERR_PROTOCOL with a sentence for a short buffer, an unknown
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

/* The payload of RTR, RTS and RING: the message number on the queue
 * pair, and for RTR where to write it (addr, rkey) and how many bytes the
 * receive wants; RTS carries the sender's length; RING only seq. */
#define HVD_VRDV_LEN 32
typedef struct hvd_vrdv {
    uint64_t seq;
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
} hvd_vrdv;

void hvd_vrdv_encode(const hvd_vrdv *r, uint8_t out[HVD_VRDV_LEN]);
void hvd_vrdv_decode(const uint8_t in[HVD_VRDV_LEN], hvd_vrdv *out);

/* RTRs a receiver keeps outstanding per queue pair. */
#define HVD_VRTR_MAX 4

/* The immediate of a chunk write into the ring: its length (at most the
 * slot size, <= 2^30) and a last flag. The immediate of the last write of
 * a rendezvous (FIN) has bit 30 set and a nonzero tag in the low 30 bits,
 * which no ring chunk has. */
#define HVD_VIMM_LAST 0x80000000u
#define HVD_VIMM_RDV 0x40000000u
#define HVD_VIMM_TAG 0x3fffffffu
#define HVD_VCHUNK_MAX 0x7fffffffu
static inline uint32_t hvd_vimm_fin(uint64_t seq) {
    return HVD_VIMM_LAST | HVD_VIMM_RDV | (uint32_t)(seq % HVD_VIMM_TAG + 1);
}
static inline int hvd_vimm_is_fin(uint32_t imm) {
    return (imm & HVD_VIMM_RDV) != 0 && (imm & HVD_VIMM_TAG) != 0;
}
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
