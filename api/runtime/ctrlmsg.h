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
#include "hvd/hvd.h"

/* Most buffers of one (grouped) operation a peer may describe. */
#define HVD_CTRL_MAX_COUNTS (1 << 20)

/*
 * Checks a Request of an Update in a job of size ranks and describes it in
 * *desc_out (counts point into the message). Returns HVD_ERR_TRANSPORT with
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

#endif
