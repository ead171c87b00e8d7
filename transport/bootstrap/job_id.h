/*
 * The job id: the 16 random bytes hvdrun makes for a job, which every
 * handshake and every shared-memory name carries, as text (hvdrun hands
 * it to the ranks in HVD_JOB_ID), and the id of an elastic job's
 * generation. What a transport names after a job (shm's segments) it
 * removes itself when hvdrun asks the registry
 * (hvd_transport_cleanup_job).
 *
 * The job id of a generation (docs/elastic.md) is the job id hvdrun made,
 * with the generation folded into its last four bytes, so a message,
 * connection or segment of one generation can never be taken by another.
 * The rendezvous itself keeps hvdrun's id; hvdrun uses this to clean up
 * what every generation left.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_JOB_ID_H
#define HVD_TRANSPORT_BOOTSTRAP_JOB_ID_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "transport/bootstrap/bootstrap.h"

/* Hex text <-> job id (32 hex digits). Returns 0 on success. */
int hvd_job_id_parse(const char *hex, uint8_t job_id_out[HVD_JOB_ID_LEN]);
void hvd_job_id_format(const uint8_t job_id[HVD_JOB_ID_LEN], char hex[33]);

static inline void
hvd_job_id_of_generation(const uint8_t job_id[HVD_JOB_ID_LEN],
                         uint32_t generation, uint8_t out[HVD_JOB_ID_LEN]) {
    memcpy(out, job_id, HVD_JOB_ID_LEN);
    for (int i = 0; i < 4; i++)
        out[HVD_JOB_ID_LEN - 1 - i] ^= (uint8_t)(generation >> (8 * i));
}

#endif
