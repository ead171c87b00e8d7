#include "transport/tcp/frame.h"

#include <string.h>

#include "transport/base/error.h"
#include "transport/base/wire.h"

void hvd_frame_encode(const hvd_frame *frame, uint8_t out[HVD_FRAME_HDR_LEN]) {
    hvd_put16(out, HVD_FRAME_MAGIC);
    out[2] = (uint8_t)frame->type;
    out[3] = 0;
    hvd_put32(out + 4, frame->seq);
    hvd_put64(out + 8, frame->msg_len);
    hvd_put64(out + 16, frame->len);
}

hvd_status hvd_frame_decode(const uint8_t *buf, size_t len, uint32_t expect_seq,
                            hvd_frame *frame_out) {
    hvd_frame f;

    if (len < HVD_FRAME_HDR_LEN)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "truncated frame header (%zu of %d bytes)", len,
                             HVD_FRAME_HDR_LEN);
    if ((buf[0] | buf[1] << 8) != HVD_FRAME_MAGIC || buf[3] != 0)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "malformed frame header (magic 0x%02x%02x, "
                             "flags %u): the stream is corrupt",
                             buf[1], buf[0], buf[3]);
    f.type = (hvd_frame_type)buf[2];
    f.seq = hvd_get32(buf + 4);
    f.msg_len = hvd_get64(buf + 8);
    f.len = hvd_get64(buf + 16);
    if (f.seq != expect_seq)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "frame %u arrived where frame %u was expected: "
                             "the stream is corrupt",
                             f.seq, expect_seq);
    switch (f.type) {
    case HVD_FRAME_DATA:
        if (f.len > f.msg_len)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "data frame of %llu bytes is longer than its "
                                 "message (%llu bytes)",
                                 (unsigned long long)f.len,
                                 (unsigned long long)f.msg_len);
        break;
    case HVD_FRAME_BYE:
    case HVD_FRAME_HEARTBEAT:
        if (f.len != 0 || f.msg_len != 0)
            return hvd_error_set(
                HVD_ERR_PROTOCOL, "%s frame with a payload of %llu bytes",
                f.type == HVD_FRAME_BYE ? "goodbye" : "heartbeat",
                (unsigned long long)f.len);
        break;
    case HVD_FRAME_ABORT:
        if (f.len < 12 || f.len > HVD_FRAME_ABORT_MAX)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "abort frame of %llu bytes (expected 12 to "
                                 "%d)",
                                 (unsigned long long)f.len,
                                 HVD_FRAME_ABORT_MAX);
        break;
    default:
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "unknown frame type %u: the stream is corrupt",
                             buf[2]);
    }
    *frame_out = f;
    return HVD_OK;
}

size_t hvd_frame_abort_encode(const hvd_frame_abort *abort_msg, uint8_t *out) {
    size_t n = strnlen(abort_msg->text, HVD_FRAME_ABORT_TEXT_MAX);

    hvd_put32(out, (uint32_t)abort_msg->status);
    hvd_put32(out + 4, (uint32_t)abort_msg->culprit);
    hvd_put32(out + 8, (uint32_t)abort_msg->origin);
    memcpy(out + 12, abort_msg->text, n);
    return 12 + n;
}

hvd_status hvd_frame_abort_decode(const uint8_t *buf, size_t len,
                                  hvd_frame_abort *abort_out) {
    hvd_frame_abort a;
    uint32_t status;

    if (len < 12 || len > HVD_FRAME_ABORT_MAX)
        return hvd_error_set(HVD_ERR_PROTOCOL, "abort payload of %zu bytes",
                             len);
    status = hvd_get32(buf);
    a.status = (status == HVD_OK || status > HVD_ERR_PROTOCOL)
                   ? HVD_ERR_INTERNAL
                   : (hvd_status)status;
    a.culprit = (int)hvd_get32(buf + 4);
    a.origin = (int)hvd_get32(buf + 8);
    len -= 12;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = buf[12 + i];
        a.text[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    a.text[len] = '\0';
    *abort_out = a;
    return HVD_OK;
}
