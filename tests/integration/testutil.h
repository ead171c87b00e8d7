/*
 * Small helpers shared by the integration test programs. Header-only:
 * each program is one file plus this.
 */
#ifndef HVD_TESTS_TESTUTIL_H
#define HVD_TESTS_TESTUTIL_H

#include <stdint.h>
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

/* ------------------------------------------------------------------ */
/* Exact encodings of small integers (the tests' inputs and results)   */

/* float16 bits of an integer v with |v| <= 2048 (exact there). */
static inline uint16_t int_to_half(long v) {
    uint16_t sign = v < 0 ? 0x8000 : 0;
    unsigned long m = (unsigned long)(v < 0 ? -v : v);
    unsigned long mant;
    int e = 0;

    if (m == 0)
        return sign;
    while ((m >> (e + 1)) != 0)
        e++;
    /* m = 1.f * 2^e; the 10 stored bits of f follow the leading one. */
    mant = e <= 10 ? m << (10 - e) : m >> (e - 10);
    return (uint16_t)(sign | (unsigned)((e + 15) << 10) | (mant & 0x3ff));
}

/* bfloat16 is the top half of float32; exact for |v| <= 256. */
static inline uint16_t int_to_bfloat16(long v) {
    float f = (float)v;
    uint32_t bits;

    memcpy(&bits, &f, sizeof(bits));
    return (uint16_t)(bits >> 16);
}

/* The bit pattern of integer v in dtype, in the low dtype-size bytes. */
static inline uint64_t encode(hvd_dtype dtype, long v) {
    switch (dtype) {
    case HVD_UINT8:
        return (uint8_t)v;
    case HVD_INT8:
        return (uint8_t)(int8_t)v;
    case HVD_INT32:
        return (uint32_t)(int32_t)v;
    case HVD_INT64:
        return (uint64_t)(int64_t)v;
    case HVD_FLOAT16:
        return int_to_half(v);
    case HVD_BFLOAT16:
        return int_to_bfloat16(v);
    case HVD_FLOAT32: {
        float f = (float)v;
        uint32_t bits;

        memcpy(&bits, &f, sizeof(bits));
        return bits;
    }
    case HVD_FLOAT64: {
        double d = (double)v;
        uint64_t bits;

        memcpy(&bits, &d, sizeof(bits));
        return bits;
    }
    }
    return 0;
}

/* Element i of buf (of dtype) := integer v, exactly (little-endian). */
static inline void put_value(hvd_dtype dtype, void *buf, size_t i, long v) {
    uint64_t bits = encode(dtype, v);
    size_t es = hvd_dtype_size(dtype);

    memcpy((unsigned char *)buf + i * es, &bits, es);
}

/* 1 if element i of buf holds exactly integer v in dtype. */
static inline int holds(hvd_dtype dtype, const void *buf, size_t i, long v) {
    uint64_t bits = encode(dtype, v);
    size_t es = hvd_dtype_size(dtype);

    return memcmp((const unsigned char *)buf + i * es, &bits, es) == 0;
}

/* Every dtype and every element-wise op, for the tests that run them all. */
#define HVD_TEST_DTYPES                                                        \
    {                                                                          \
        HVD_UINT8, HVD_INT8, HVD_INT32, HVD_INT64, HVD_FLOAT16, HVD_BFLOAT16,  \
            HVD_FLOAT32, HVD_FLOAT64                                           \
    }
#define HVD_TEST_OPS                                                           \
    { HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT }

/*
 * An input exact in every dtype for every op, from a hash h of (rank,
 * element, ...): in [-4, 4] (in [0, 8] for uint8), in {-2, -1, 1, 2} for a
 * product ({1, 2} for uint8: no zero, whose sign a float product keeps),
 * times the job size for an average (so that it is exact).
 */
static inline long exact_input(hvd_dtype dtype, hvd_op op, int size, size_t h) {
    long v;

    if (op == HVD_PRODUCT)
        v = dtype == HVD_UINT8 ? (long)(h % 2) + 1
                               : (long)(h % 4) - 2 + (h % 4 >= 2);
    else
        v = dtype == HVD_UINT8 ? (long)(h % 9) : (long)(h % 9) - 4;
    return op == HVD_AVERAGE ? v * size : v;
}

/* a op b on the integers of the tests' formulas (an average sums: the
 * division by the ranks comes once, at the end). */
static inline long combine(hvd_op op, long a, long b) {
    switch (op) {
    case HVD_MIN:
        return b < a ? b : a;
    case HVD_MAX:
        return b > a ? b : a;
    case HVD_PRODUCT:
        return a * b;
    default:
        return a + b;
    }
}

#endif
