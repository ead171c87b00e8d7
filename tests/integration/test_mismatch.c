/*
 * Ranks that disagree on a count: rank 1 reduces one element more than the
 * others. The coordinator compares what every rank asked for before any
 * data moves: every rank gets HVD_ERR_MISMATCH with each rank's values,
 * and the runtime keeps working. Exit 0 on pass, 1 on fail.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hvd/hvd.h>

#include "testutil.h"

int main(void) {
    size_t count = 1 << 20;
    float *buf;
    hvd_status st;
    double t0;

    if (hvd_init() != HVD_OK) {
        printf("FAIL mismatch: hvd_init: %s\n", hvd_last_error());
        return 1;
    }
    int rank = hvd_rank();
    buf = calloc(count + 1, sizeof(float));
    if (buf == NULL)
        return 1;
    st = hvd_allreduce("agreed", buf, buf, count, HVD_FLOAT32, HVD_SUM);
    if (st != HVD_OK) {
        printf("FAIL mismatch rank %d: agreed call: %s\n", rank,
               hvd_last_error());
        return 1;
    }
    t0 = now_s();
    st = hvd_allreduce("disagreed", buf, buf, count + (rank == 1), HVD_FLOAT32,
                       HVD_SUM);
    double dt = now_s() - t0;
    if (st != HVD_ERR_MISMATCH || dt > 10.0 ||
        strstr(hvd_last_error(), "'disagreed'") == NULL ||
        !names_rank(hvd_last_error(), 0) || !names_rank(hvd_last_error(), 1)) {
        printf("FAIL mismatch rank %d: got %s after %.1f s: %s\n", rank,
               status_name(st), dt, hvd_last_error());
        return 1;
    }
    /* The runtime keeps working. */
    st = hvd_allreduce("after", buf, buf, count, HVD_FLOAT32, HVD_SUM);
    if (st != HVD_OK) {
        printf("FAIL mismatch rank %d: the next call failed: %s\n", rank,
               hvd_last_error());
        return 1;
    }
    printf("PASS mismatch rank %d: %.3f s: %s\n", rank, dt, hvd_last_error());
    hvd_shutdown();
    free(buf);
    return 0;
}
