/*
 * Unit tests for collectives/reduce.c: every dtype x op, aliasing, counts
 * that cross vector and block boundaries, integer wraparound, NaN
 * propagation, scale_div, and the float16/bfloat16 conversions against
 * independent references written here with frexp/ldexp/nearbyint.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reduce.h"

#define ALL_DTYPES 8
#define ALL_OPS 5

static const hvd_dtype dtypes[ALL_DTYPES] = {
    HVD_UINT8,   HVD_INT8,     HVD_INT32,   HVD_INT64,
    HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64,
};

static const hvd_op ops[ALL_OPS] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                    HVD_PRODUCT};

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t h(float f) { return hvd_float_to_half(f); }

static uint16_t bf(float f) { return hvd_float_to_bfloat16(f); }

static int half_is_nan(uint16_t x) {
    return (x & 0x7c00u) == 0x7c00u && (x & 0x03ffu) != 0;
}

static int bf16_is_nan(uint16_t x) {
    return (x & 0x7f80u) == 0x7f80u && (x & 0x007fu) != 0;
}

/* ---- Independent references for the conversions. ---- */

static double ref_half_to_double(uint16_t x) {
    int e = (x >> 10) & 31;
    int m = x & 1023;
    double v;

    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return (x & 0x8000u) ? -v : v;
}

/* Round to nearest even with the FPU's nearbyint (default mode: RNE). */
static uint16_t ref_float_to_half(float f) {
    uint16_t sign = signbit(f) ? 0x8000u : 0u;
    double x = fabs((double)f);
    int e;

    if (isnan(f))
        return sign | 0x7e00u;
    if (x >= 65520.0) /* includes inf */
        return sign | 0x7c00u;
    if (x < 0x1p-14)
        return sign | (uint16_t)nearbyint(x * 0x1p24);
    (void)frexp(x, &e); /* x in [2^(e-1), 2^e) */
    e -= 1;
    /* q in [1024, 2048]; 2048 carries into the exponent, as it should. */
    return sign | (uint16_t)(((e + 15) << 10) +
                             ((int)nearbyint(ldexp(x, 10 - e)) - 1024));
}

static uint16_t ref_float_to_bf16(float f) {
    uint16_t sign = signbit(f) ? 0x8000u : 0u;
    double x = fabs((double)f);
    int e;

    if (isnan(f))
        return sign | 0x7fc0u;
    if (isinf(f))
        return sign | 0x7f80u;
    if (x < 0x1p-126)
        return sign | (uint16_t)nearbyint(x * 0x1p133);
    (void)frexp(x, &e);
    e -= 1;
    return sign | (uint16_t)(((e + 127) << 7) +
                             ((int)nearbyint(ldexp(x, 7 - e)) - 128));
}

/* ---- Names, sizes, validity. ---- */

static void test_names_sizes_valid(void **state) {
    static const char *const dnames[ALL_DTYPES] = {
        "uint8",   "int8",     "int32",   "int64",
        "float16", "bfloat16", "float32", "float64"};
    static const size_t sizes[ALL_DTYPES] = {1, 1, 4, 8, 2, 2, 4, 8};
    static const char *const onames[ALL_OPS] = {"sum", "average", "min", "max",
                                                "product"};
    (void)state;

    for (int i = 0; i < ALL_DTYPES; i++) {
        assert_string_equal(hvd_dtype_name(dtypes[i]), dnames[i]);
        assert_int_equal(hvd_dtype_size(dtypes[i]), sizes[i]);
        assert_true(hvd_dtype_valid(dtypes[i]));
    }
    for (int i = 0; i < ALL_OPS; i++) {
        assert_string_equal(hvd_op_name(ops[i]), onames[i]);
        assert_true(hvd_op_valid(ops[i]));
    }
    assert_false(hvd_dtype_valid((hvd_dtype)8));
    assert_false(hvd_dtype_valid((hvd_dtype)-1));
    assert_false(hvd_op_valid((hvd_op)5));
    assert_false(hvd_op_valid((hvd_op)-1));
    assert_int_equal(hvd_dtype_size((hvd_dtype)8), 0);
    assert_non_null(hvd_dtype_name((hvd_dtype)99));
    assert_non_null(hvd_op_name((hvd_op)99));
}

/* ---- float16 conversions. ---- */

static void test_half_to_float_exhaustive(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t x = (uint16_t)i;
        float f = hvd_half_to_float(x);
        if (half_is_nan(x)) {
            assert_true(isnan(f));
            assert_int_equal(!!signbit(f), !!(x & 0x8000u));
            /* Payload kept, quiet bit set. */
            assert_int_equal(bits_of(f) & 0x7fffffffu,
                             0x7f800000u | 0x00400000u |
                                 ((uint32_t)(x & 0x3ffu) << 13));
        } else {
            double want = ref_half_to_double(x);
            assert_true((double)f == want);
            assert_int_equal(!!signbit(f), !!(x & 0x8000u));
        }
    }
}

static void test_half_roundtrip_exhaustive(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t x = (uint16_t)i;
        uint16_t back = hvd_float_to_half(hvd_half_to_float(x));
        if (half_is_nan(x)) {
            assert_true(half_is_nan(back));
            assert_int_equal(back, x | 0x0200u); /* quieted, same payload */
        } else {
            assert_int_equal(back, x);
        }
    }
}

/*
 * Every tie between two neighbouring finite halves (both signs), and the
 * floats just below and above it.
 */
static void test_half_all_ties(void **state) {
    (void)state;
    for (uint32_t s = 0; s < 2; s++) {
        for (uint32_t m = 0; m < 0x7bffu; m++) {
            uint16_t lo = (uint16_t)(m | (s << 15));
            uint16_t hi = (uint16_t)(lo + 1);
            float a = hvd_half_to_float(lo);
            float b = hvd_half_to_float(hi);
            float mid = (a + b) / 2; /* 12 significant bits: exact */
            uint16_t even = (lo & 1u) ? hi : lo;
            assert_int_equal(hvd_float_to_half(mid), even);
            assert_int_equal(hvd_float_to_half(nextafterf(mid, a)), lo);
            assert_int_equal(hvd_float_to_half(nextafterf(mid, b)), hi);
        }
    }
}

static void test_half_known_values(void **state) {
    (void)state;
    assert_int_equal(h(1.0f), 0x3c00);
    assert_int_equal(h(-2.0f), 0xc000);
    assert_int_equal(h(0.0f), 0x0000);
    assert_int_equal(h(-0.0f), 0x8000);
    /* RNE ties above 2048, where the half step is 2. */
    assert_int_equal(h(2049.0f), h(2048.0f));
    assert_int_equal(h(2048.0f), 0x6800);
    assert_int_equal(h(2051.0f), 0x6802);
    assert_true(hvd_half_to_float(0x6802) == 2052.0f);
    assert_int_equal(h(2050.0f), 0x6801);
    /* Smallest subnormal 2^-24; half of it is a tie that goes to 0. */
    assert_int_equal(h(0x1p-24f), 0x0001);
    assert_int_equal(h(0x1p-25f), 0x0000);
    assert_int_equal(h(-0x1p-25f), 0x8000);
    assert_int_equal(h(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(h(nextafterf(0x1p-25f, 0.0f)), 0x0000);
    assert_int_equal(h(3 * 0x1p-25f), 0x0002); /* tie 1|2 -> even 2 */
    assert_int_equal(h(5 * 0x1p-25f), 0x0002); /* tie 2|3 -> even 2 */
    assert_int_equal(h(1e-40f), 0x0000);       /* float subnormal */
    /* Largest subnormal, and the tie up into the smallest normal. */
    assert_int_equal(h(1023 * 0x1p-24f), 0x03ff);
    assert_int_equal(h(1023.5f * 0x1p-24f), 0x0400);
    assert_int_equal(h(0x1p-14f), 0x0400);
    /* Overflow. */
    assert_int_equal(h(65504.0f), 0x7bff);
    assert_int_equal(h(65519.99f), 0x7bff);
    assert_int_equal(h(nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(h(65520.0f), 0x7c00);
    assert_int_equal(h(-65520.0f), 0xfc00);
    assert_int_equal(h(1e10f), 0x7c00);
    assert_int_equal(h(3.4e38f), 0x7c00);
    assert_int_equal(h(INFINITY), 0x7c00);
    assert_int_equal(h(-INFINITY), 0xfc00);
    /* NaN stays NaN (quiet), sign kept; a payload only in low bits too. */
    assert_true(half_is_nan(h(NAN)));
    assert_true(half_is_nan(h(float_of(0x7f800001u))));
    assert_true(h(float_of(0x7f800001u)) & 0x0200u);
    assert_true(half_is_nan(h(float_of(0xffc00000u))));
    assert_true(h(float_of(0xffc00000u)) & 0x8000u);
}

/* About a million float patterns of every exponent, against the reference. */
static void test_half_sweep(void **state) {
    (void)state;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = float_of((uint32_t)u);
        uint16_t got = hvd_float_to_half(f);
        if (isnan(f)) {
            assert_true(half_is_nan(got));
            continue;
        }
        assert_int_equal(got, ref_float_to_half(f));
    }
}

/* ---- bfloat16 conversions. ---- */

static void test_bf16_conversions(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t x = (uint16_t)i;
        float f = hvd_bfloat16_to_float(x);
        assert_int_equal(bits_of(f), (uint32_t)x << 16);
        if (bf16_is_nan(x))
            assert_int_equal(hvd_float_to_bfloat16(f), x | 0x0040u);
        else
            assert_int_equal(hvd_float_to_bfloat16(f), x);
    }
    assert_int_equal(bf(1.0f), 0x3f80);
    /* Ties to even, and just above a tie. */
    assert_int_equal(bf(float_of(0x3f808000u)), 0x3f80);
    assert_int_equal(bf(float_of(0x3f818000u)), 0x3f82);
    assert_int_equal(bf(float_of(0x3f808001u)), 0x3f81);
    assert_int_equal(bf(float_of(0x3f807fffu)), 0x3f80);
    assert_int_equal(bf(257.0f), 0x4380); /* 256 */
    assert_int_equal(bf(259.0f), 0x4382); /* 260 */
    /* Largest float rounds to inf; inf stays inf. */
    assert_int_equal(bf(float_of(0x7f7fffffu)), 0x7f80);
    assert_int_equal(bf(INFINITY), 0x7f80);
    assert_int_equal(bf(-INFINITY), 0xff80);
    /* NaN stays NaN and quiet, even when the payload is in the low bits
     * only (plain rounding would turn 0x7f80ffff into inf). */
    assert_int_equal(bf(float_of(0x7fc00000u)), 0x7fc0);
    assert_int_equal(bf(float_of(0x7f80ffffu)), 0x7fc0);
    assert_int_equal(bf(float_of(0x7f800001u)), 0x7fc0);
    assert_int_equal(bf(float_of(0xffffffffu)), 0xffff);
    assert_true(bf16_is_nan(bf(NAN)));
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float f = float_of((uint32_t)u);
        uint16_t got = hvd_float_to_bfloat16(f);
        if (isnan(f))
            assert_true(bf16_is_nan(got));
        else
            assert_int_equal(got, ref_float_to_bf16(f));
    }
}

/* ---- Reduction helpers. ---- */

/*
 * Runs op out of place and with dst == a, dst == b, and checks each result
 * byte for byte, plus a guard byte after the end.
 */
static void check_op(hvd_dtype dt, hvd_op op, const void *a, const void *b,
                     const void *want, size_t n) {
    size_t bytes = n * hvd_dtype_size(dt);
    unsigned char *dst = malloc(bytes + 1);
    unsigned char *ca = malloc(bytes + 1);
    unsigned char *cb = malloc(bytes + 1);

    assert_non_null(dst);
    assert_non_null(ca);
    assert_non_null(cb);
    memcpy(ca, a, bytes);
    memcpy(cb, b, bytes);

    memset(dst, 0xa5, bytes + 1);
    hvd_reduce(dst, ca, cb, n, dt, op);
    assert_memory_equal(dst, want, bytes);
    assert_int_equal(dst[bytes], 0xa5);
    assert_memory_equal(ca, a, bytes); /* inputs untouched */
    assert_memory_equal(cb, b, bytes);

    memcpy(dst, a, bytes);
    hvd_reduce(dst, dst, cb, n, dt, op);
    assert_memory_equal(dst, want, bytes);

    memcpy(dst, b, bytes);
    hvd_reduce(dst, ca, dst, n, dt, op);
    assert_memory_equal(dst, want, bytes);
    assert_int_equal(dst[bytes], 0xa5);

    free(cb);
    free(ca);
    free(dst);
}

/* want[op] for SUM, MIN, MAX, PRODUCT; AVERAGE is checked against SUM. */
static void check_ops(hvd_dtype dt, const void *a, const void *b,
                      const void *sum, const void *min, const void *max,
                      const void *prod, size_t n) {
    check_op(dt, HVD_SUM, a, b, sum, n);
    check_op(dt, HVD_AVERAGE, a, b, sum, n);
    check_op(dt, HVD_MIN, a, b, min, n);
    check_op(dt, HVD_MAX, a, b, max, n);
    check_op(dt, HVD_PRODUCT, a, b, prod, n);
}

/* ---- Exact small vectors, per dtype. ---- */

static void test_uint8_ops(void **state) {
    const uint8_t a[] = {250, 3, 0, 200, 16, 255};
    const uint8_t b[] = {10, 5, 255, 100, 17, 255};
    const uint8_t sum[] = {4, 8, 255, 44, 33, 254};
    const uint8_t min[] = {10, 3, 0, 100, 16, 255};
    const uint8_t max[] = {250, 5, 255, 200, 17, 255};
    const uint8_t prod[] = {196, 15, 0, 32, 16, 1};
    (void)state;
    check_ops(HVD_UINT8, a, b, sum, min, max, prod, 6);
}

static void test_int8_ops(void **state) {
    const int8_t a[] = {127, -128, -5, 100, -1, -128};
    const int8_t b[] = {1, -1, 3, -100, 127, 127};
    const int8_t sum[] = {-128, 127, -2, 0, 126, -1};
    const int8_t min[] = {1, -128, -5, -100, -1, -128};
    const int8_t max[] = {127, -1, 3, 100, 127, 127};
    const int8_t prod[] = {127, -128, -15, -16, -127, -128};
    (void)state;
    check_ops(HVD_INT8, a, b, sum, min, max, prod, 6);
}

static void test_int32_ops(void **state) {
    const int32_t a[] = {INT32_MAX, INT32_MIN, -7, 65536, 3};
    const int32_t b[] = {1, -1, 2, 65536, -4};
    const int32_t sum[] = {INT32_MIN, INT32_MAX, -5, 131072, -1};
    const int32_t min[] = {1, INT32_MIN, -7, 65536, -4};
    const int32_t max[] = {INT32_MAX, -1, 2, 65536, 3};
    const int32_t prod[] = {INT32_MAX, INT32_MIN, -14, 0, -12};
    (void)state;
    check_ops(HVD_INT32, a, b, sum, min, max, prod, 5);
}

static void test_int64_ops(void **state) {
    const int64_t a[] = {INT64_MAX, INT64_MIN, -7, INT64_C(1) << 40,
                         INT64_C(5000000000)};
    const int64_t b[] = {1, -1, 2, INT64_C(1) << 30, INT64_C(-5000000000)};
    const int64_t sum[] = {INT64_MIN, INT64_MAX, -5,
                           (INT64_C(1) << 40) + (INT64_C(1) << 30), 0};
    const int64_t min[] = {1, INT64_MIN, -7, INT64_C(1) << 30,
                           INT64_C(-5000000000)};
    const int64_t max[] = {INT64_MAX, -1, 2, INT64_C(1) << 40,
                           INT64_C(5000000000)};
    /* 2^70 wraps to 0; -2.5e19 wraps to -2.5e19 + 2^64. */
    const int64_t prod[] = {INT64_MAX, INT64_MIN, -14, 0,
                            INT64_C(-6553255926290448384)};
    (void)state;
    check_ops(HVD_INT64, a, b, sum, min, max, prod, 5);
}

static const float fa[] = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 100.0f, -8.0f};
static const float fb[] = {2.5f, 4.0f, -0.5f, 0.5f, -0.75f, 0.125f, -8.0f};
static const float fsum[] = {4.0f,   2.0f,     -0.25f, 3.5f,
                             -1.25f, 100.125f, -16.0f};
static const float fmin_[] = {1.5f, -2.0f, -0.5f, 0.5f, -0.75f, 0.125f, -8.0f};
static const float fmax_[] = {2.5f, 4.0f, 0.25f, 3.0f, -0.5f, 100.0f, -8.0f};
static const float fprod[] = {3.75f,  -8.0f, -0.125f, 1.5f,
                              0.375f, 12.5f, 64.0f};
#define FN (sizeof fa / sizeof fa[0])

static void test_float32_ops(void **state) {
    (void)state;
    check_ops(HVD_FLOAT32, fa, fb, fsum, fmin_, fmax_, fprod, FN);
}

static void test_float64_ops(void **state) {
    double a[FN], b[FN], s[FN], mn[FN], mx[FN], p[FN];
    (void)state;
    for (size_t i = 0; i < FN; i++) {
        a[i] = fa[i];
        b[i] = fb[i];
        s[i] = fsum[i];
        mn[i] = fmin_[i];
        mx[i] = fmax_[i];
        p[i] = fprod[i];
    }
    a[0] = 0.1; /* something float32 cannot hold */
    b[0] = 0.2;
    s[0] = 0.1 + 0.2;
    mn[0] = 0.1;
    mx[0] = 0.2;
    p[0] = 0.1 * 0.2;
    check_ops(HVD_FLOAT64, a, b, s, mn, mx, p, FN);
}

/* The float table's values are exact in float16 and bfloat16 too. */
static void check_16bit_table(hvd_dtype dt, uint16_t (*conv)(float)) {
    uint16_t a[FN], b[FN], s[FN], mn[FN], mx[FN], p[FN];
    for (size_t i = 0; i < FN; i++) {
        a[i] = conv(fa[i]);
        b[i] = conv(fb[i]);
        s[i] = conv(fsum[i]);
        mn[i] = conv(fmin_[i]);
        mx[i] = conv(fmax_[i]);
        p[i] = conv(fprod[i]);
    }
    check_ops(dt, a, b, s, mn, mx, p, FN);
}

static void test_float16_ops(void **state) {
    (void)state;
    assert_int_equal(h(1.5f), 0x3e00); /* spot-check the table's encoding */
    assert_int_equal(h(100.125f), 0x5642);
    check_16bit_table(HVD_FLOAT16, hvd_float_to_half);
}

static void test_bfloat16_ops(void **state) {
    (void)state;
    /* 100.125 needs 10 significant bits; bfloat16 has 8. */
    assert_int_equal(bf(100.125f), bf(100.0f));
    check_16bit_table(HVD_BFLOAT16, hvd_float_to_bfloat16);
}

/* ---- Rounding of 16-bit results. ---- */

static void test_float16_result_rounding(void **state) {
    const uint16_t a[] = {h(2048),     h(2050),     h(65504),
                          h(65504),    0x0001,      0x0001,
                          h(0x1p-12f), h(0x1p-13f), h(1.5f * 0x1p-13f)};
    const uint16_t b[] = {h(1),   h(1),        h(15),       h(16),      0x0001,
                          0x8002, h(0x1p-12f), h(0x1p-12f), h(0x1p-12f)};
    const uint16_t sum[] = {h(2048), h(2052), h(65504), 0x7c00, 0x0002, 0x8001};
    const uint16_t prod[] = {0x0001, 0x0000, 0x0001};
    uint16_t out[9];
    (void)state;

    hvd_reduce(out, a, b, 6, HVD_FLOAT16, HVD_SUM);
    assert_memory_equal(out, sum, sizeof sum);
    /* 2^-12 * 2^-12 = 2^-24 (subnormal); 2^-25 is a tie to 0; 1.5 * 2^-25
     * is above the tie. */
    hvd_reduce(out, a + 6, b + 6, 3, HVD_FLOAT16, HVD_PRODUCT);
    assert_memory_equal(out, prod, sizeof prod);
}

static void test_bfloat16_result_rounding(void **state) {
    const uint16_t a[] = {bf(256), bf(258), bf(1), 0x0001};
    const uint16_t b[] = {bf(1), bf(1), bf(0x1p-8f), 0x0001};
    const uint16_t sum[] = {bf(256), bf(260), bf(1), 0x0002};
    uint16_t out[4];
    (void)state;
    hvd_reduce(out, a, b, 4, HVD_BFLOAT16, HVD_SUM);
    assert_memory_equal(out, sum, sizeof sum);
}

/* ---- NaN propagation. ---- */

static void check_nan_minmax(hvd_dtype dt) {
    enum { N = 1001 };
    size_t es = hvd_dtype_size(dt);
    double *va = calloc(N, sizeof *va);
    double *vb = calloc(N, sizeof *vb);
    unsigned char *a = calloc(N, es);
    unsigned char *b = calloc(N, es);
    unsigned char *d = calloc(N, es);

    assert_non_null(va);
    assert_non_null(vb);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(d);
    for (size_t i = 0; i < N; i++) {
        va[i] = (double)(i % 7) - 3;
        vb[i] = (double)(i % 5) - 2;
    }
    /* NaN in a, in b, in both; at vector/block boundaries and the tail. */
    va[0] = NAN;
    vb[1] = NAN;
    va[2] = vb[2] = NAN;
    va[3] = -INFINITY;
    vb[4] = INFINITY;
    va[255] = NAN;
    vb[256] = NAN;
    va[1000] = NAN;
    for (size_t i = 0; i < N; i++) {
        float x = (float)va[i], y = (float)vb[i];
        switch (dt) {
        case HVD_FLOAT16:
            ((uint16_t *)a)[i] = h(x);
            ((uint16_t *)b)[i] = h(y);
            break;
        case HVD_BFLOAT16:
            ((uint16_t *)a)[i] = bf(x);
            ((uint16_t *)b)[i] = bf(y);
            break;
        case HVD_FLOAT32:
            ((float *)a)[i] = x;
            ((float *)b)[i] = y;
            break;
        default:
            ((double *)a)[i] = va[i];
            ((double *)b)[i] = vb[i];
            break;
        }
    }
    for (int k = 0; k < 2; k++) {
        hvd_op op = k ? HVD_MAX : HVD_MIN;
        hvd_reduce(d, a, b, N, dt, op);
        for (size_t i = 0; i < N; i++) {
            double got;
            double want;
            switch (dt) {
            case HVD_FLOAT16:
                got = hvd_half_to_float(((uint16_t *)d)[i]);
                break;
            case HVD_BFLOAT16:
                got = hvd_bfloat16_to_float(((uint16_t *)d)[i]);
                break;
            case HVD_FLOAT32:
                got = ((float *)d)[i];
                break;
            default:
                got = ((double *)d)[i];
                break;
            }
            if (isnan(va[i]) || isnan(vb[i])) {
                assert_true(isnan(got));
                continue;
            }
            want = k ? fmax(va[i], vb[i]) : fmin(va[i], vb[i]);
            assert_true(got == want);
        }
    }
    free(d);
    free(b);
    free(a);
    free(vb);
    free(va);
}

static void test_nan_propagation(void **state) {
    float x[3] = {NAN, 1.0f, 2.0f};
    float y[3] = {1.0f, NAN, 3.0f};
    (void)state;
    check_nan_minmax(HVD_FLOAT16);
    check_nan_minmax(HVD_BFLOAT16);
    check_nan_minmax(HVD_FLOAT32);
    check_nan_minmax(HVD_FLOAT64);
    /* In place keeps propagating. */
    hvd_reduce(x, x, y, 3, HVD_FLOAT32, HVD_MIN);
    assert_true(isnan(x[0]) && isnan(x[1]) && x[2] == 2.0f);
    hvd_reduce(y, x, y, 3, HVD_FLOAT32, HVD_MAX);
    assert_true(isnan(y[0]) && isnan(y[1]) && y[2] == 3.0f);
}

/*
 * Where the ops are not commutative bit for bit (which NaN payload, which
 * zero sign MIN/MAX return), in place must give exactly the out-of-place
 * bytes.
 */
static void test_alias_bit_consistency(void **state) {
    const float va[] = {-0.0f,
                        0.0f,
                        float_of(0x7fc00001u),
                        1.0f,
                        float_of(0xffc00002u),
                        -0.0f,
                        2.0f,
                        0.0f,
                        3.0f};
    const float vb[] = {0.0f,
                        -0.0f,
                        float_of(0x7fc00004u),
                        float_of(0x7fc00008u),
                        1.0f,
                        -0.0f,
                        2.0f,
                        0.0f,
                        -3.0f};
    enum { N = sizeof va / sizeof va[0] };
    (void)state;
    for (int di = 4; di < ALL_DTYPES; di++) {
        hvd_dtype dt = dtypes[di];
        size_t es = hvd_dtype_size(dt);
        unsigned char a[N * 8], b[N * 8], want[N * 8];
        for (size_t i = 0; i < N; i++) {
            double da = va[i], db = vb[i];
            uint16_t ha = dt == HVD_FLOAT16 ? h(va[i]) : bf(va[i]);
            uint16_t hb = dt == HVD_FLOAT16 ? h(vb[i]) : bf(vb[i]);
            if (dt == HVD_FLOAT32) {
                memcpy(a + i * es, &va[i], es);
                memcpy(b + i * es, &vb[i], es);
            } else if (dt == HVD_FLOAT64) {
                memcpy(a + i * es, &da, es);
                memcpy(b + i * es, &db, es);
            } else {
                memcpy(a + i * es, &ha, es);
                memcpy(b + i * es, &hb, es);
            }
        }
        for (int oi = 0; oi < ALL_OPS; oi++) {
            hvd_reduce(want, a, b, N, dt, ops[oi]);
            check_op(dt, ops[oi], a, b, want, N);
        }
    }
}

/* ---- Every dtype x op at many counts, against a scalar reference. ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random finite values of every magnitude, including subnormals. */
static void fill_random(hvd_dtype dt, void *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng();
        switch (dt) {
        case HVD_UINT8:
        case HVD_INT8:
            ((uint8_t *)buf)[i] = (uint8_t)r;
            break;
        case HVD_INT32:
            ((uint32_t *)buf)[i] = (uint32_t)r;
            break;
        case HVD_INT64:
            ((uint64_t *)buf)[i] = r;
            break;
        case HVD_FLOAT16: {
            uint16_t x = (uint16_t)r;
            if ((x & 0x7c00u) == 0x7c00u)
                x ^= 0x4000u;
            ((uint16_t *)buf)[i] = x;
            break;
        }
        case HVD_BFLOAT16: {
            uint16_t x = (uint16_t)r;
            if ((x & 0x7f80u) == 0x7f80u)
                x ^= 0x4000u;
            ((uint16_t *)buf)[i] = x;
            break;
        }
        case HVD_FLOAT32: {
            uint32_t x = (uint32_t)r;
            if ((x & 0x7f800000u) == 0x7f800000u)
                x ^= 0x40000000u;
            memcpy((float *)buf + i, &x, 4);
            break;
        }
        case HVD_FLOAT64: {
            uint64_t x = r;
            if ((x & 0x7ff0000000000000ull) == 0x7ff0000000000000ull)
                x ^= 0x4000000000000000ull;
            memcpy((double *)buf + i, &x, 8);
            break;
        }
        }
    }
}

static int64_t wrap_signed(uint64_t v, int bits) {
    uint64_t m = bits == 64 ? ~0ull : (1ull << bits) - 1;
    uint64_t sbit = 1ull << (bits - 1);
    v &= m;
    return (v & sbit) ? -(int64_t)(m - v) - 1 : (int64_t)v;
}

static double dcombine(hvd_op op, double x, double y) {
    switch (op) {
    case HVD_MIN:
        return x < y ? x : y;
    case HVD_MAX:
        return x > y ? x : y;
    case HVD_PRODUCT:
        return x * y;
    default:
        return x + y;
    }
}

/* One element of the expected result, computed without the kernels. */
static void ref_elem(hvd_dtype dt, hvd_op op, const void *pa, const void *pb,
                     size_t i, void *out) {
    switch (dt) {
    case HVD_UINT8: {
        unsigned x = ((const uint8_t *)pa)[i], y = ((const uint8_t *)pb)[i];
        unsigned r = op == HVD_MIN       ? (x < y ? x : y)
                     : op == HVD_MAX     ? (x > y ? x : y)
                     : op == HVD_PRODUCT ? x * y
                                         : x + y;
        ((uint8_t *)out)[i] = (uint8_t)(r & 0xffu);
        break;
    }
    case HVD_INT8:
    case HVD_INT32: {
        int bits = dt == HVD_INT8 ? 8 : 32;
        int64_t x =
            dt == HVD_INT8 ? ((const int8_t *)pa)[i] : ((const int32_t *)pa)[i];
        int64_t y =
            dt == HVD_INT8 ? ((const int8_t *)pb)[i] : ((const int32_t *)pb)[i];
        /* |x*y| <= 2^62: exact in int64. */
        int64_t r = op == HVD_MIN       ? (x < y ? x : y)
                    : op == HVD_MAX     ? (x > y ? x : y)
                    : op == HVD_PRODUCT ? x * y
                                        : x + y;
        int64_t w = wrap_signed((uint64_t)r, bits);
        if (dt == HVD_INT8)
            ((int8_t *)out)[i] = (int8_t)w;
        else
            ((int32_t *)out)[i] = (int32_t)w;
        break;
    }
    case HVD_INT64: {
        int64_t x = ((const int64_t *)pa)[i], y = ((const int64_t *)pb)[i];
        int64_t r;
        if (op == HVD_MIN)
            r = x < y ? x : y;
        else if (op == HVD_MAX)
            r = x > y ? x : y;
        else if (op == HVD_PRODUCT)
            r = wrap_signed((uint64_t)x * (uint64_t)y, 64);
        else
            r = wrap_signed((uint64_t)x + (uint64_t)y, 64);
        ((int64_t *)out)[i] = r;
        break;
    }
    case HVD_FLOAT16: {
        double x = ref_half_to_double(((const uint16_t *)pa)[i]);
        double y = ref_half_to_double(((const uint16_t *)pb)[i]);
        /* float32 result (exact-then-rounded: double has > 2*24+2 bits),
         * then rounded to half. */
        float r = (float)dcombine(op, x, y);
        ((uint16_t *)out)[i] = ref_float_to_half(r);
        break;
    }
    case HVD_BFLOAT16: {
        float x = float_of((uint32_t)((const uint16_t *)pa)[i] << 16);
        float y = float_of((uint32_t)((const uint16_t *)pb)[i] << 16);
        float r = (float)dcombine(op, x, y);
        ((uint16_t *)out)[i] = ref_float_to_bf16(r);
        break;
    }
    case HVD_FLOAT32: {
        float x = ((const float *)pa)[i], y = ((const float *)pb)[i];
        ((float *)out)[i] = (float)dcombine(op, x, y);
        break;
    }
    case HVD_FLOAT64: {
        double x = ((const double *)pa)[i], y = ((const double *)pb)[i];
        ((double *)out)[i] = dcombine(op, x, y);
        break;
    }
    }
}

static void test_all_counts(void **state) {
    static const size_t counts[] = {1,   2,   7,   8,   15,   16,   17,  255,
                                    256, 257, 511, 513, 1001, 1031, 4099};
    (void)state;
    for (int di = 0; di < ALL_DTYPES; di++) {
        hvd_dtype dt = dtypes[di];
        size_t es = hvd_dtype_size(dt);
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            size_t n = counts[ci];
            unsigned char *a = malloc(n * es);
            unsigned char *b = malloc(n * es);
            unsigned char *want = malloc(n * es);
            unsigned char *self = malloc(n * es);
            assert_non_null(a);
            assert_non_null(b);
            assert_non_null(want);
            assert_non_null(self);
            fill_random(dt, a, n);
            fill_random(dt, b, n);
            for (int oi = 0; oi < ALL_OPS; oi++) {
                hvd_op op = ops[oi];
                for (size_t i = 0; i < n; i++)
                    ref_elem(dt, op, a, b, i, want);
                check_op(dt, op, a, b, want, n);
                /* dst == a == b. */
                for (size_t i = 0; i < n; i++)
                    ref_elem(dt, op, a, a, i, want);
                memcpy(self, a, n * es);
                hvd_reduce(self, self, self, n, dt, op);
                assert_memory_equal(self, want, n * es);
            }
            free(self);
            free(want);
            free(b);
            free(a);
        }
    }
}

/* Count 0, invalid dtype and invalid op change nothing and do not crash. */
static void test_noops(void **state) {
    int32_t a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, d[3] = {7, 8, 9};
    const int32_t keep[3] = {7, 8, 9};
    (void)state;
    for (int di = 0; di < ALL_DTYPES; di++) {
        for (int oi = 0; oi < ALL_OPS; oi++) {
            hvd_reduce(NULL, NULL, NULL, 0, dtypes[di], ops[oi]);
            hvd_reduce(d, a, b, 0, dtypes[di], ops[oi]);
        }
        hvd_reduce_scale_div(NULL, 0, dtypes[di], 3);
    }
    assert_memory_equal(d, keep, sizeof keep);
    hvd_reduce(d, a, b, 3, (hvd_dtype)8, HVD_SUM);
    hvd_reduce(d, a, b, 3, (hvd_dtype)-1, HVD_SUM);
    hvd_reduce(d, a, b, 3, HVD_INT32, (hvd_op)5);
    hvd_reduce(d, a, b, 3, HVD_INT32, (hvd_op)-1);
    assert_memory_equal(d, keep, sizeof keep);
    hvd_reduce_scale_div(d, 3, (hvd_dtype)8, 2);
    hvd_reduce_scale_div(d, 3, HVD_INT32, 1);
    hvd_reduce_scale_div(d, 3, HVD_INT32, 0); /* breaks the contract */
    hvd_reduce_scale_div(d, 3, HVD_INT32, -2);
    assert_memory_equal(d, keep, sizeof keep);
}

/* ---- scale_div. ---- */

static void test_scale_div_int(void **state) {
    uint8_t u8[] = {255, 7, 1, 0, 128};
    const uint8_t u8_2[] = {127, 3, 0, 0, 64};
    int8_t i8[] = {-7, 7, -128, 127, -1};
    const int8_t i8_2[] = {-3, 3, -64, 63, 0};
    int32_t i32[] = {-7, 7, INT32_MIN, INT32_MAX, -1, -2};
    const int32_t i32_3[] = {-2, 2, -715827882, 715827882, 0, 0};
    int64_t i64[] = {-7, 7, INT64_MIN, INT64_MAX, -1, -6};
    const int64_t i64_3[] = {-2, 2, INT64_MIN / 3, INT64_MAX / 3, 0, -2};
    uint8_t big[] = {255, 200};
    (void)state;

    hvd_reduce_scale_div(u8, 5, HVD_UINT8, 2);
    assert_memory_equal(u8, u8_2, sizeof u8);
    hvd_reduce_scale_div(i8, 5, HVD_INT8, 2);
    assert_memory_equal(i8, i8_2, sizeof i8);
    hvd_reduce_scale_div(i32, 6, HVD_INT32, 3);
    assert_memory_equal(i32, i32_3, sizeof i32);
    hvd_reduce_scale_div(i64, 6, HVD_INT64, 3);
    assert_memory_equal(i64, i64_3, sizeof i64);
    assert_int_equal(INT64_MIN / 3, INT64_C(-3074457345618258602));
    hvd_reduce_scale_div(big, 2, HVD_UINT8, 300);
    assert_int_equal(big[0], 0);
    assert_int_equal(big[1], 0);
}

static void test_scale_div_float(void **state) {
    enum { N = 1001 };
    float *f32 = malloc(N * sizeof *f32);
    double *f64 = malloc(N * sizeof *f64);
    uint16_t *f16 = malloc(N * sizeof *f16);
    uint16_t *b16 = malloc(N * sizeof *b16);
    (void)state;

    assert_non_null(f32);
    assert_non_null(f64);
    assert_non_null(f16);
    assert_non_null(b16);
    for (size_t i = 0; i < N; i++) {
        float v = (float)i - 500.0f;
        f32[i] = v;
        f64[i] = v;
        f16[i] = h(v);
        b16[i] = bf(v);
    }
    hvd_reduce_scale_div(f32, N, HVD_FLOAT32, 3);
    hvd_reduce_scale_div(f64, N, HVD_FLOAT64, 3);
    hvd_reduce_scale_div(f16, N, HVD_FLOAT16, 3);
    hvd_reduce_scale_div(b16, N, HVD_BFLOAT16, 3);
    for (size_t i = 0; i < N; i++) {
        float v = (float)i - 500.0f;
        assert_true(f32[i] == v / 3.0f);
        assert_true(f64[i] == (double)v / 3.0);
        assert_int_equal(f16[i],
                         ref_float_to_half(hvd_half_to_float(h(v)) / 3.0f));
        assert_int_equal(
            b16[i], ref_float_to_bf16(hvd_bfloat16_to_float(bf(v)) / 3.0f));
    }
    assert_int_equal(f16[501], 0x3555); /* 1/3 */
    assert_true(f32[501] == 1.0f / 3.0f);
    assert_true(f32[500] == 0.0f);

    /* Subnormal result, and NaN/inf pass through. */
    f16[0] = 0x0003;
    f16[1] = 0x7c00;
    f16[2] = 0x7e00;
    hvd_reduce_scale_div(f16, 3, HVD_FLOAT16, 2);
    assert_int_equal(f16[0], 0x0002); /* 1.5 * 2^-24: tie to even 2 */
    assert_int_equal(f16[1], 0x7c00);
    assert_true(half_is_nan(f16[2]));

    free(b16);
    free(f16);
    free(f64);
    free(f32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_sizes_valid),
        cmocka_unit_test(test_half_to_float_exhaustive),
        cmocka_unit_test(test_half_roundtrip_exhaustive),
        cmocka_unit_test(test_half_all_ties),
        cmocka_unit_test(test_half_known_values),
        cmocka_unit_test(test_half_sweep),
        cmocka_unit_test(test_bf16_conversions),
        cmocka_unit_test(test_uint8_ops),
        cmocka_unit_test(test_int8_ops),
        cmocka_unit_test(test_int32_ops),
        cmocka_unit_test(test_int64_ops),
        cmocka_unit_test(test_float32_ops),
        cmocka_unit_test(test_float64_ops),
        cmocka_unit_test(test_float16_ops),
        cmocka_unit_test(test_bfloat16_ops),
        cmocka_unit_test(test_float16_result_rounding),
        cmocka_unit_test(test_bfloat16_result_rounding),
        cmocka_unit_test(test_nan_propagation),
        cmocka_unit_test(test_alias_bit_consistency),
        cmocka_unit_test(test_all_counts),
        cmocka_unit_test(test_noops),
        cmocka_unit_test(test_scale_div_int),
        cmocka_unit_test(test_scale_div_float),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
