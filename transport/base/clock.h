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

/* The same clock as of the last timer tick (a millisecond or a few old),
 * for about a fifth of the cost: for liveness stamps and heartbeats,
 * which are compared against limits of 100 ms and more, on paths that
 * run once per message. */
static inline int64_t hvd_coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A short pause in a polling loop (lets a sibling hyperthread run and
 * saves power), without giving up the core. */
static inline void hvd_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
