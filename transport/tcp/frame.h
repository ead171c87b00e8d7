/*
 * The TCP wire format after the handshake: a stream of frames, each a
 * 24-byte header and a payload.
 *
 *   offset  size  field
 *        0     2  magic 0x4856 ("HV"), little-endian
 *        2     1  type: DATA, BYE, ABORT or HEARTBEAT
 *        3     1  flags (0)
 *        4     4  seq: frame number on this socket, from 0
 *        8     8  msg_len: length of the whole message (DATA)
 *       16     8  len: payload bytes that follow this header
 *
 * A message of msg_len bytes travels as one DATA frame, or striped over the
 * sockets of a peer pair as one DATA frame per socket (see progress.c).
 * BYE (len 0) says the sender is leaving in an orderly way. ABORT carries
 * why the sender failed (status, the rank at fault, a sentence) so every
 * rank reports the same cause. HEARTBEAT (len 0) is sent about once a
 * second by a rank that waits on the network, so that its peers can tell a
 * rank that is alive but waiting on someone else from one that is stopped.
 */
#ifndef HVD_TRANSPORT_TCP_FRAME_H
#define HVD_TRANSPORT_TCP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"

#define HVD_FRAME_MAGIC 0x4856
#define HVD_FRAME_HDR_LEN 24
#define HVD_FRAME_ABORT_TEXT_MAX 512
#define HVD_FRAME_ABORT_MAX (12 + HVD_FRAME_ABORT_TEXT_MAX)

typedef enum {
    HVD_FRAME_DATA = 1,
    HVD_FRAME_BYE = 2,
    HVD_FRAME_ABORT = 3,
    HVD_FRAME_HEARTBEAT = 4
} hvd_frame_type;

typedef struct hvd_frame {
    hvd_frame_type type;
    uint32_t seq;
    uint64_t msg_len;
    uint64_t len;
} hvd_frame;

/* An ABORT frame's payload. */
typedef struct hvd_frame_abort {
    hvd_status status;
    int culprit; /* rank at fault, -1 if none */
    int origin;  /* rank that first detected the failure */
    char text[HVD_FRAME_ABORT_TEXT_MAX + 1];
} hvd_frame_abort;

void hvd_frame_encode(const hvd_frame *frame, uint8_t out[HVD_FRAME_HDR_LEN]);

/*
 * Decodes and checks a header: magic, type, flags, seq == expect_seq,
 * len <= msg_len for DATA, len == 0 for BYE, len <= HVD_FRAME_ABORT_MAX for
 * ABORT. Returns HVD_ERR_PROTOCOL with a sentence (no peer named: the
 * caller adds it) for a malformed header.
 */
hvd_status hvd_frame_decode(const uint8_t *buf, size_t len, uint32_t expect_seq,
                            hvd_frame *frame_out);

/* Writes an ABORT payload into out (at most HVD_FRAME_ABORT_MAX bytes);
 * returns its length. */
size_t hvd_frame_abort_encode(const hvd_frame_abort *abort_msg, uint8_t *out);

/* Decodes an ABORT payload of len bytes; the text is NUL-terminated and
 * stripped of control characters. */
hvd_status hvd_frame_abort_decode(const uint8_t *buf, size_t len,
                                  hvd_frame_abort *abort_out);

#endif
