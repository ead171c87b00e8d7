/*
 * Checks of the engine's control messages (api/runtime/engine.proto) as they
 * come off the wire, before the engine acts on them. The sender is an
 * authenticated rank of the job, but a bug, ranks of different versions or
 * a corrupted stream must end in an error that names the message, never in
 * a crash, a division by zero or a collective over buffers of the wrong
 * size. Pure functions: unit-tested and fuzzed (tests/fuzz/fuzz_ctrl.c).
 */
#ifndef HVD_API_CTRLMSG_H
#define HVD_API_CTRLMSG_H

#include "api/runtime/engine.pb-c.h"
#include "api/runtime/opdesc.h"
#include "hvd/types.h"

/* Most buffers of one (grouped) operation a peer may describe. */
#define HVD_CTRL_MAX_COUNTS (1 << 20)

/*
 * Checks a Request of an Update in a job of size ranks and describes it in
 * *desc_out (counts point into the message). Returns HVD_ERR_PROTOCOL with
 * a sentence on what is wrong: a kind, dtype or op out of range, no or too
 * many counts, a root outside the job, a total size beyond SIZE_MAX / 2.
 */
hvd_status hvd_ctrl_check_request(const Hvd__Engine__Request *req, int size,
                                  hvd_opdesc *desc_out);

/*
 * Checks a Response of a Cycle the same way, and what a response adds: a
 * known status, an error sentence, 1 to size contributors for one to run,
 * a last joined rank and joined ranks inside the job.
 */
hvd_status hvd_ctrl_check_response(const Hvd__Engine__Response *resp, int size,
                                   hvd_opdesc *desc_out);

/*
 * The brief form of a Step: what a step is in steady state, the cache
 * slots a rank offers and carries and nothing else, as a fixed layout
 * instead of protobuf (it is sent and taken in every step: the fast path's
 * cost per operation). A 16-byte head, then n_ready and n_carried slot
 * numbers (uint32, host order, as the control frame's header). A step in
 * which rank 0 decided something is sent as protobuf.
 */
typedef struct hvd_ctrl_brief {
    uint64_t number;
    uint32_t n_ready;
    uint32_t n_carried;
} hvd_ctrl_brief;

_Static_assert(sizeof(hvd_ctrl_brief) == 16, "the brief step head is 16 bytes");

/* Bytes of step m in the brief form, or 0 if it does not fit that form
 * (its cycle says more than its number). */
size_t hvd_ctrl_brief_size(const Hvd__Engine__Step *m);

/* Writes step m, for which hvd_ctrl_brief_size said n > 0, into out[n]
 * (4-byte aligned). */
void hvd_ctrl_brief_pack(const Hvd__Engine__Step *m, uint8_t *out);

/*
 * Reads a brief step from buf[len] (4-byte aligned) into *m, whose lists
 * point into buf (valid while buf is). A step from rank 0 carries its
 * cycle's number: pass cycle (storage the caller keeps with m) to have
 * m->cycle point at an empty cycle of that number; else NULL. Returns
 * HVD_ERR_PROTOCOL with a sentence if the lengths do not add up.
 */
hvd_status hvd_ctrl_brief_unpack(const uint8_t *buf, size_t len,
                                 Hvd__Engine__Step *m,
                                 Hvd__Engine__Cycle *cycle);

#endif
