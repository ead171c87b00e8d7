/*
 * Ranks that disagree on a count: rank 1 reduces one element more than the
 * others. In this release the collectives are not negotiated, so the first
 * message whose size differs is detected by its receiver; every rank must
 * get HVD_ERR_MISMATCH (directly or through the receiver's abort), within
 * seconds and without a hang. Exit 0 on pass, 1 on fail.
 */
#include <stdio.h>
#include <stdlib.h>

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
    /* An agreed call first. A rank that is still finishing it when a
     * faster rank detects the mismatch of the next call fails here: a
     * failure fails every operation in flight, and that is right too. */
    t0 = now_s();
    st = hvd_allreduce("agreed", buf, buf, count, HVD_FLOAT32, HVD_SUM);
    if (st == HVD_OK) {
        t0 = now_s();
        st = hvd_allreduce("disagreed", buf, buf, count + (rank == 1),
                           HVD_FLOAT32, HVD_SUM);
    }
    double dt = now_s() - t0;
    if (st != HVD_ERR_MISMATCH || dt > 10.0) {
        printf("FAIL mismatch rank %d: got %s after %.1f s: %s\n", rank,
               status_name(st), dt, hvd_last_error());
        return 1;
    }
    /* Later calls fail too. */
    if (hvd_allreduce("after", buf, buf, 1, HVD_FLOAT32, HVD_SUM) == HVD_OK) {
        printf("FAIL mismatch rank %d: a later call succeeded\n", rank);
        return 1;
    }
    printf("PASS mismatch rank %d: %.3f s: %s\n", rank, dt, hvd_last_error());
    hvd_shutdown();
    free(buf);
    return 0;
}
