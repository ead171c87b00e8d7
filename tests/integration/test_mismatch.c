/*
 * Ranks that disagree on a count: rank 1 reduces one element more than the
 * others. The coordinator compares what every rank asked for before any
 * data moves: every rank gets HVD_ERR_MISMATCH with each rank's values,
 * and the runtime keeps working. Then the same for shapes of equal counts
 * (hvd_allreduce_shaped_async, hvd_broadcast_shaped_async): rank 1 passes
 * [3, 2] where the others pass [2, 3], also after the response cache has
 * learnt the name with the agreed shape. Exit 0 on pass, 1 on fail.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hvd/hvd.h>

#include "testutil.h"

/* Whether the sentence of a failed call names both shapes. */
static int names_shapes(const char *error) {
    return strstr(error, "shape [2, 3]") != NULL &&
           strstr(error, "shape [3, 2]") != NULL;
}

/*
 * The shaped calls: agreed shapes give exact results (three times, so the
 * later ones run from the response cache), disagreeing ones a mismatch
 * naming both shapes on every rank. 1 on pass.
 */
static int shapes(int rank, int size) {
    const int64_t agreed[2] = {2, 3}, swapped[2] = {3, 2};
    const int64_t *mine = rank == 1 ? swapped : agreed;
    float buf[6];
    hvd_handle h;
    hvd_status st;

    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 6; i++)
            buf[i] = (float)(rank + i);
        /* Rounds 0-2 agree; round 3 disagrees on the cached name. */
        st = hvd_allreduce_shaped_async("shaped", buf, buf, 2,
                                        round < 3 ? agreed : mine, HVD_FLOAT32,
                                        HVD_SUM, &h);
        if (st == HVD_OK)
            st = hvd_wait(h);
        if (round < 3) {
            if (st != HVD_OK) {
                printf("FAIL mismatch rank %d: shaped round %d: %s\n", rank,
                       round, hvd_last_error());
                return 0;
            }
            for (int i = 0; i < 6; i++) {
                float want = (float)(size * i + size * (size - 1) / 2);
                if (buf[i] != want) {
                    printf("FAIL mismatch rank %d: shaped[%d] = %g, not %g\n",
                           rank, i, (double)buf[i], (double)want);
                    return 0;
                }
            }
        } else if (st != HVD_ERR_MISMATCH || !names_shapes(hvd_last_error())) {
            printf("FAIL mismatch rank %d: shaped allreduce: got %s: %s\n",
                   rank, status_name(st), hvd_last_error());
            return 0;
        }
    }
    st = hvd_broadcast_shaped_async("shaped_bcast", buf, 2, mine, HVD_FLOAT32,
                                    0, &h);
    if (st == HVD_OK)
        st = hvd_wait(h);
    if (st != HVD_ERR_MISMATCH || !names_shapes(hvd_last_error())) {
        printf("FAIL mismatch rank %d: shaped broadcast: got %s: %s\n", rank,
               status_name(st), hvd_last_error());
        return 0;
    }
    /* A malformed shape is refused on the calling rank alone. */
    const int64_t negative[2] = {2, -3};
    if (hvd_allreduce_shaped_async("bad", buf, buf, 2, negative, HVD_FLOAT32,
                                   HVD_SUM, &h) != HVD_ERR_INVALID_ARG) {
        printf("FAIL mismatch rank %d: a negative dimension was taken\n", rank);
        return 0;
    }
    return 1;
}

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
    char sentence[1024];
    snprintf(sentence, sizeof(sentence), "%s", hvd_last_error());
    if (!shapes(rank, hvd_size()))
        return 1;
    /* The runtime keeps working. */
    st = hvd_allreduce("after", buf, buf, count, HVD_FLOAT32, HVD_SUM);
    if (st != HVD_OK) {
        printf("FAIL mismatch rank %d: the next call failed: %s\n", rank,
               hvd_last_error());
        return 1;
    }
    printf("PASS mismatch rank %d: %.3f s: %s\n", rank, dt, sentence);
    hvd_shutdown();
    free(buf);
    return 0;
}
