/* A bootstrap for ranks that are threads (thread_bootstrap.h). */
#include "thread_bootstrap.h"

#include <string.h>

static hvd_status barrier_allgather(hvd_bootstrap *bs, const void *mine,
                                    size_t len, void *all_out) {
    thread_bootstrap *tb = bs->ctx;

    if (len > THREAD_BOOTSTRAP_SLOT)
        return HVD_ERR_INTERNAL;
    pthread_mutex_lock(&tb->mu);
    unsigned round = tb->round;
    uint8_t(*slots)[THREAD_BOOTSTRAP_SLOT] = tb->slots[round & 1];
    memcpy(slots[bs->rank], mine, len);
    if (++tb->arrived == tb->size) {
        tb->arrived = 0;
        tb->round++;
        pthread_cond_broadcast(&tb->cv);
    }
    while (tb->round == round)
        pthread_cond_wait(&tb->cv, &tb->mu);
    /* Round + 1 writes the other slots, and round + 2 cannot start before
     * this rank has arrived at round + 1. */
    for (int r = 0; r < tb->size; r++)
        memcpy((uint8_t *)all_out + (size_t)r * len, slots[r], len);
    while (bs->rank == tb->silent && !tb->released)
        pthread_cond_wait(&tb->cv, &tb->mu);
    pthread_mutex_unlock(&tb->mu);
    return HVD_OK;
}

void thread_bootstrap_init(thread_bootstrap *tb, int size, int silent) {
    memset(tb, 0, sizeof(*tb));
    pthread_mutex_init(&tb->mu, NULL);
    pthread_cond_init(&tb->cv, NULL);
    tb->size = size;
    tb->silent = silent;
}

void thread_bootstrap_destroy(thread_bootstrap *tb) {
    pthread_mutex_destroy(&tb->mu);
    pthread_cond_destroy(&tb->cv);
}

hvd_bootstrap thread_bootstrap_of(thread_bootstrap *tb, int rank) {
    return (hvd_bootstrap){.rank = rank,
                           .size = tb->size,
                           .allgather = barrier_allgather,
                           .ctx = tb};
}

void thread_bootstrap_release(thread_bootstrap *tb) {
    pthread_mutex_lock(&tb->mu);
    tb->released = 1;
    pthread_cond_broadcast(&tb->cv);
    pthread_mutex_unlock(&tb->mu);
}
