/*
 * A bootstrap for ranks that are threads of one process (test_tcp_connect.c,
 * test_choose.c): allgather is a barrier over slots in shared memory, two
 * sets of them by round parity, so that a rank already in the next round
 * never overwrites what a slower one is still copying out of this one.
 *
 * One rank can be made silent: its allgather returns only once another
 * thread calls thread_bootstrap_release, so that it takes part in the
 * exchange but then neither connects nor answers.
 */
#ifndef HVD_TESTS_UNIT_THREAD_BOOTSTRAP_H
#define HVD_TESTS_UNIT_THREAD_BOOTSTRAP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define THREAD_BOOTSTRAP_MAXR 4
#define THREAD_BOOTSTRAP_SLOT 512

typedef struct thread_bootstrap {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    int arrived;
    unsigned round;
    uint8_t slots[2][THREAD_BOOTSTRAP_MAXR][THREAD_BOOTSTRAP_SLOT];
    int silent; /* -1: none */
    int released;
} thread_bootstrap;

void thread_bootstrap_init(thread_bootstrap *tb, int size, int silent);
void thread_bootstrap_destroy(thread_bootstrap *tb);

/* Rank rank's hvd_bootstrap over tb. */
hvd_bootstrap thread_bootstrap_of(thread_bootstrap *tb, int rank);

/* Lets the silent rank's allgather return. */
void thread_bootstrap_release(thread_bootstrap *tb);

#endif
