/*
 * Small helpers shared by the integration test programs. Header-only:
 * each program is one file plus this.
 */
#ifndef HVD_TESTS_TESTUTIL_H
#define HVD_TESTS_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hvd/hvd.h>

/* "HVD_ERR_TIMEOUT" for HVD_ERR_TIMEOUT. */
static inline const char *status_name(hvd_status status) {
    switch (status) {
#define STATUS_NAME_(name, text)                                               \
    case name:                                                                 \
        return #name;
        HVD_STATUS_MAP(STATUS_NAME_)
#undef STATUS_NAME_
    }
    return "(unknown status)";
}

/* Monotonic time in seconds. */
static inline double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 1 if text names "rank <rank>" as a whole number ("rank 1" is not in
 * "rank 12"). */
static inline int names_rank(const char *text, int rank) {
    char needle[32];
    const char *p = text;
    size_t n;

    n = (size_t)snprintf(needle, sizeof(needle), "rank %d", rank);
    while ((p = strstr(p, needle)) != NULL) {
        if (p[n] < '0' || p[n] > '9')
            return 1;
        p += n;
    }
    return 0;
}

/* A non-negative decimal integer up to 10^9; 0 on success. */
static inline int parse_int(const char *s, int *value_out) {
    char *end;
    long v;

    if (s == NULL || s[0] == '\0')
        return -1;
    v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000000L)
        return -1;
    *value_out = (int)v;
    return 0;
}

#endif
