/*
 * The job id of an elastic job's generation (docs/elastic.md): the job id
 * hvdrun made, with the generation folded into its last four bytes. Every
 * handshake between ranks and every shared-memory name carries the job
 * id, so a message, connection or segment of one generation can never be
 * taken by another. The rendezvous itself keeps hvdrun's id; hvdrun uses
 * this to clean up the segments of every generation.
 */
#ifndef HVD_TRANSPORT_JOB_GENERATION_H
#define HVD_TRANSPORT_JOB_GENERATION_H

#include <stdint.h>
#include <string.h>

#include "transport/transport.h"

static inline void
hvd_job_id_of_generation(const uint8_t job_id[HVD_JOB_ID_LEN],
                         uint32_t generation, uint8_t out[HVD_JOB_ID_LEN]) {
    memcpy(out, job_id, HVD_JOB_ID_LEN);
    for (int i = 0; i < 4; i++)
        out[HVD_JOB_ID_LEN - 1 - i] ^= (uint8_t)(generation >> (8 * i));
}

#endif
