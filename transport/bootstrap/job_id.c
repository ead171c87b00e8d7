#include "transport/bootstrap/job_id.h"

#include <stdio.h>
#include <string.h>

int hvd_job_id_parse(const char *hex, uint8_t job_id_out[HVD_JOB_ID_LEN]) {
    uint8_t id[HVD_JOB_ID_LEN];

    if (hex == NULL || strlen(hex) != 2 * HVD_JOB_ID_LEN)
        return -1;
    for (int i = 0; i < 2 * HVD_JOB_ID_LEN; i++) {
        char c = hex[i];
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0)
            return -1;
        if (i % 2 == 0)
            id[i / 2] = (uint8_t)(v << 4);
        else
            id[i / 2] |= (uint8_t)v;
    }
    memcpy(job_id_out, id, HVD_JOB_ID_LEN);
    return 0;
}

void hvd_job_id_format(const uint8_t job_id[HVD_JOB_ID_LEN], char hex[33]) {
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", job_id[i]);
}
