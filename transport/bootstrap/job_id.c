#include "transport/bootstrap/job_id.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

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

void hvd_job_segment_name(const uint8_t job_id[HVD_JOB_ID_LEN], int rank,
                          char *out, size_t outlen) {
    char hex[2 * HVD_JOB_ID_LEN + 1];
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", job_id[i]);
    snprintf(out, outlen, "/hvd-%s-%d", hex, rank);
}

int hvd_job_cleanup_segments(const uint8_t job_id[HVD_JOB_ID_LEN]) {
    char prefix[96];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int removed = 0;
    size_t plen;

    if (d == NULL)
        return 0;
    hvd_job_segment_name(job_id, 0, prefix, sizeof(prefix));
    plen = strlen(prefix) - 1; /* "/hvd-<hex>-" */
    while ((e = readdir(d)) != NULL) {
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (strncmp(name, prefix, plen) == 0 && shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
