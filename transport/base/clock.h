#ifndef HVD_BASE_CLOCK_H
#define HVD_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic time in nanoseconds (a vDSO call, no syscall). */
static inline int64_t hvd_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
