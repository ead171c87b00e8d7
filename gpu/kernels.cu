/*
 * CUDA kernels: reductions bitwise equal to collectives/reduce.c, and the
 * batched copies that pack and unpack the device fusion buffer.
 *
 * Built with -fmad=false (a product is never fused into a following sum)
 * and without --use_fast_math (no flush-to-zero, IEEE division); the float
 * operations are the explicit round-to-nearest intrinsics anyway.
 *
 * Host code in this file is compiled without exceptions, RTTI or
 * thread-safe statics, so the objects link into libhvd with the C linker
 * and need no C++ runtime.
 */
#include "gpu/kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

const int kThreads = 256;
const unsigned kMaxBlocks = 4096;

unsigned blocks_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    return b == 0 ? 1u : b > kMaxBlocks ? kMaxBlocks : (unsigned)b;
}

/* The host CPU's default NaN (what inf - inf gives): x86 sets the sign. */
#if defined(__x86_64__) || defined(__i386__)
const uint32_t kDefaultNan32 = 0xffc00000u;
const unsigned long long kDefaultNan64 = 0xfff8000000000000ull;
#else
const uint32_t kDefaultNan32 = 0x7fc00000u;
const unsigned long long kDefaultNan64 = 0x7ff8000000000000ull;
#endif

struct Nans {
    uint32_t n32;
    unsigned long long n64;
};

/*
 * The element functions are compiled for the host too: the unit test
 * unit.kernels_host runs them on the CPU (hvd_cuda_*_emulated below)
 * against collectives/reduce.c where no GPU is. On the host the IEEE
 * intrinsics become plain operations whose NaN results are made the GPU's
 * canonical NaN, so the NaN rules below are tested as the GPU needs them.
 */
#define HD __host__ __device__ __forceinline__

HD uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

HD float f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

HD unsigned long long f64_bits(double d) {
#ifdef __CUDA_ARCH__
    return (unsigned long long)__double_as_longlong(d);
#else
    unsigned long long u;
    memcpy(&u, &d, 8);
    return u;
#endif
}

HD double f64_from_bits(unsigned long long u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, 8);
    return d;
#endif
}

#ifdef __CUDA_ARCH__
#define FADD __fadd_rn
#define FSUB __fsub_rn
#define FMUL __fmul_rn
#define FDIV __fdiv_rn
#define DADD __dadd_rn
#define DMUL __dmul_rn
#define DDIV __ddiv_rn
#else
/* volatile: one rounding per operation, as the intrinsics. */
inline float canon(float r) {
    volatile float v = r;
    return v == v ? v : f32_from_bits(0x7fffffffu);
}
inline double canon(double r) {
    volatile double v = r;
    return v == v ? v : f64_from_bits(0x7fffffffffffffffull);
}
inline float FADD(float a, float b) { return canon(a + b); }
inline float FSUB(float a, float b) { return canon(a - b); }
inline float FMUL(float a, float b) { return canon(a * b); }
inline float FDIV(float a, float b) { return canon(a / b); }
inline double DADD(double a, double b) { return canon(a + b); }
inline double DMUL(double a, double b) { return canon(a * b); }
inline double DDIV(double a, double b) { return canon(a / b); }
#endif

/* ---- conversions, ported bit for bit from collectives/reduce.c ---- */

HD float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    int32_t em = (int32_t)((uint32_t)(h & 0x7fffu) << 13);
    uint32_t is_sub = 0u - (uint32_t)(em < 0x00800000);
    uint32_t is_infnan = 0u - (uint32_t)(em >= 0x0f800000);
    uint32_t is_nan = 0u - (uint32_t)(em > 0x0f800000);
    uint32_t adj = (uint32_t)em + (112u << 23) + (is_sub & 0x00800000u);
    float v = FSUB(f32_from_bits(adj), f32_from_bits(is_sub & (113u << 23)));
    return f32_from_bits(f32_bits(v) | (is_infnan & 0x7f800000u) |
                         (is_nan & 0x00400000u) | sign);
}

HD uint16_t float_to_half(float f) {
    uint32_t u = f32_bits(f);
    int32_t a = (int32_t)(u & 0x7fffffffu);
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7f800000);
    uint32_t is_sub = 0u - (uint32_t)(a < 0x38800000);
    uint32_t c = (uint32_t)(a < 0x47800000 ? a : 0x47800000);
    uint32_t normal = (c - (112u << 23) + 0x0fffu + ((c >> 13) & 1u)) << 3;
    uint32_t sub =
        (f32_bits(FADD(f32_from_bits((uint32_t)a), 0.5f)) - 0x3f000000u) << 16;
    uint32_t nan = 0x7e000000u | ((u << 3) & 0x03ff0000u);
    uint32_t r =
        (normal & ~(is_sub | is_nan)) | (sub & is_sub) | (nan & is_nan);
    return (uint16_t)(((r & 0x7fff0000u) | (u & 0x80000000u)) >> 16);
}

HD float bfloat16_to_float(uint16_t b) {
    return f32_from_bits((uint32_t)b << 16);
}

HD uint16_t float_to_bfloat16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rne;
    return (uint16_t)r;
}

/* ---- float arithmetic with the host's NaN results ---- */

HD float nan_of(float r, float a, float b, const Nans &n) {
    if (r == r)
        return r;
    if (a != a)
        return f32_from_bits(f32_bits(a) | 0x00400000u);
    if (b != b)
        return f32_from_bits(f32_bits(b) | 0x00400000u);
    return f32_from_bits(n.n32);
}

HD double nan_of(double r, double a, double b, const Nans &n) {
    if (r == r)
        return r;
    if (a != a)
        return f64_from_bits(f64_bits(a) | 0x0008000000000000ull);
    if (b != b)
        return f64_from_bits(f64_bits(b) | 0x0008000000000000ull);
    return f64_from_bits(n.n64);
}

HD float f_add(float a, float b, const Nans &n) {
    return nan_of(FADD(a, b), a, b, n);
}
HD float f_mul(float a, float b, const Nans &n) {
    return nan_of(FMUL(a, b), a, b, n);
}
HD float f_div(float a, float b, const Nans &n) {
    return nan_of(FDIV(a, b), a, b, n);
}
HD double f_add(double a, double b, const Nans &n) {
    return nan_of(DADD(a, b), a, b, n);
}
HD double f_mul(double a, double b, const Nans &n) {
    return nan_of(DMUL(a, b), a, b, n);
}
HD double f_div(double a, double b, const Nans &n) {
    return nan_of(DDIV(a, b), a, b, n);
}

/* ---- element operations, as reduce.c's OP_* macros ---- */

enum { K_SUM, K_MIN, K_MAX, K_PROD };

/* Integers: T the element type, U its unsigned twin (wrapping). */
template <typename T, typename U, int K> struct IntOp {
    HD T operator()(T x, T y, const Nans &) const {
        switch (K) {
        case K_SUM:
            return (T)(U)((U)x + (U)y);
        case K_PROD:
            return (T)(U)((U)x * (U)y);
        case K_MIN:
            return x < y ? x : y;
        default:
            return x > y ? x : y;
        }
    }
};

template <typename F, int K> struct FloatOp {
    HD F operator()(F x, F y, const Nans &n) const {
        switch (K) {
        case K_SUM:
            return f_add(x, y, n);
        case K_PROD:
            return f_mul(x, y, n);
        case K_MIN:
            return ((x < y) || (x != x)) ? x : y;
        default:
            return ((x > y) || (x != x)) ? x : y;
        }
    }
};

/* 16-bit floats: widen, combine as float32, round back. */
template <int K, bool BF16> struct HalfOp {
    HD uint16_t operator()(uint16_t x, uint16_t y, const Nans &n) const {
        float a = BF16 ? bfloat16_to_float(x) : half_to_float(x);
        float b = BF16 ? bfloat16_to_float(y) : half_to_float(y);
        float r = FloatOp<float, K>()(a, b, n);
        return BF16 ? float_to_bfloat16(r) : float_to_half(r);
    }
};

template <typename T, typename Op>
__global__ void reduce_kernel(T *dst, const T *a, const T *b, size_t n,
                              Nans nans) {
    Op op;
    size_t stride = (size_t)gridDim.x * blockDim.x;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        dst[i] = op(a[i], b[i], nans);
}

/* Runs the reduction on the stream, or (host) on the CPU, element for
 * element the same. */
template <typename T, typename Op>
int launch_reduce(void *dst, const void *a, const void *b, size_t n,
                  cudaStream_t s, bool host) {
    Nans nans = {kDefaultNan32, kDefaultNan64};
    if (host) {
        Op op;
        for (size_t i = 0; i < n; i++)
            ((T *)dst)[i] = op(((const T *)a)[i], ((const T *)b)[i], nans);
        return 0;
    }
    reduce_kernel<T, Op><<<blocks_for(n), kThreads, 0, s>>>(
        (T *)dst, (const T *)a, (const T *)b, n, nans);
    return (int)cudaGetLastError();
}

template <typename T, typename U>
int int_reduce(void *d, const void *a, const void *b, size_t n, hvd_op op,
               cudaStream_t s, bool h) {
    switch (op) {
    case HVD_MIN:
        return launch_reduce<T, IntOp<T, U, K_MIN>>(d, a, b, n, s, h);
    case HVD_MAX:
        return launch_reduce<T, IntOp<T, U, K_MAX>>(d, a, b, n, s, h);
    case HVD_PRODUCT:
        return launch_reduce<T, IntOp<T, U, K_PROD>>(d, a, b, n, s, h);
    default:
        return launch_reduce<T, IntOp<T, U, K_SUM>>(d, a, b, n, s, h);
    }
}

template <typename F>
int float_reduce(void *d, const void *a, const void *b, size_t n, hvd_op op,
                 cudaStream_t s, bool h) {
    switch (op) {
    case HVD_MIN:
        return launch_reduce<F, FloatOp<F, K_MIN>>(d, a, b, n, s, h);
    case HVD_MAX:
        return launch_reduce<F, FloatOp<F, K_MAX>>(d, a, b, n, s, h);
    case HVD_PRODUCT:
        return launch_reduce<F, FloatOp<F, K_PROD>>(d, a, b, n, s, h);
    default:
        return launch_reduce<F, FloatOp<F, K_SUM>>(d, a, b, n, s, h);
    }
}

template <bool BF16>
int half_reduce(void *d, const void *a, const void *b, size_t n, hvd_op op,
                cudaStream_t s, bool h) {
    switch (op) {
    case HVD_MIN:
        return launch_reduce<uint16_t, HalfOp<K_MIN, BF16>>(d, a, b, n, s, h);
    case HVD_MAX:
        return launch_reduce<uint16_t, HalfOp<K_MAX, BF16>>(d, a, b, n, s, h);
    case HVD_PRODUCT:
        return launch_reduce<uint16_t, HalfOp<K_PROD, BF16>>(d, a, b, n, s, h);
    default:
        return launch_reduce<uint16_t, HalfOp<K_SUM, BF16>>(d, a, b, n, s, h);
    }
}

int reduce_any(void *dst, const void *a, const void *b, size_t count,
               hvd_dtype dtype, hvd_op op, cudaStream_t s, bool h) {
    if (count == 0)
        return 0;
    switch (dtype) {
    case HVD_UINT8:
        return int_reduce<uint8_t, uint8_t>(dst, a, b, count, op, s, h);
    case HVD_INT8:
        return int_reduce<int8_t, uint8_t>(dst, a, b, count, op, s, h);
    case HVD_INT32:
        return int_reduce<int32_t, uint32_t>(dst, a, b, count, op, s, h);
    case HVD_INT64:
        return int_reduce<long long, unsigned long long>(dst, a, b, count, op,
                                                         s, h);
    case HVD_FLOAT16:
        return half_reduce<false>(dst, a, b, count, op, s, h);
    case HVD_BFLOAT16:
        return half_reduce<true>(dst, a, b, count, op, s, h);
    case HVD_FLOAT32:
        return float_reduce<float>(dst, a, b, count, op, s, h);
    case HVD_FLOAT64:
        return float_reduce<double>(dst, a, b, count, op, s, h);
    }
    return (int)cudaErrorInvalidValue;
}

/* ---- division, as hvd_reduce_scale_div ---- */

/* Integers: T the element type, W the type C's division is done in. */
template <typename T, typename W> struct DivInt {
    W d;
    HD T operator()(T x, const Nans &) const { return (T)((W)x / d); }
};

template <typename F> struct DivFloat {
    F d;
    HD F operator()(F x, const Nans &n) const { return f_div(x, d, n); }
};

template <bool BF16> struct DivHalf {
    float d;
    HD uint16_t operator()(uint16_t x, const Nans &n) const {
        float f = BF16 ? bfloat16_to_float(x) : half_to_float(x);
        f = f_div(f, d, n);
        return BF16 ? float_to_bfloat16(f) : float_to_half(f);
    }
};

template <typename T, typename Op>
__global__ void map_kernel(T *p, size_t n, Op op, Nans nans) {
    size_t stride = (size_t)gridDim.x * blockDim.x;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        p[i] = op(p[i], nans);
}

template <typename T, typename Op>
int launch_map(void *p, size_t n, Op op, cudaStream_t s, bool host) {
    Nans nans = {kDefaultNan32, kDefaultNan64};
    if (host) {
        for (size_t i = 0; i < n; i++)
            ((T *)p)[i] = op(((T *)p)[i], nans);
        return 0;
    }
    map_kernel<T, Op><<<blocks_for(n), kThreads, 0, s>>>((T *)p, n, op, nans);
    return (int)cudaGetLastError();
}

int scale_div_any(void *buf, size_t count, hvd_dtype dtype, int divisor,
                  cudaStream_t s, bool h) {
    /* As hvd_reduce_scale_div: dividing by 1 (or less) changes nothing. */
    if (count == 0 || divisor <= 1)
        return 0;
    switch (dtype) {
    case HVD_UINT8:
        return launch_map<uint8_t>(
            buf, count, DivInt<uint8_t, unsigned int>{(unsigned)divisor}, s, h);
    case HVD_INT8:
        return launch_map<int8_t>(buf, count, DivInt<int8_t, int>{divisor}, s,
                                  h);
    case HVD_INT32:
        return launch_map<int32_t>(buf, count,
                                   DivInt<int32_t, int32_t>{divisor}, s, h);
    case HVD_INT64:
        return launch_map<long long>(
            buf, count, DivInt<long long, long long>{divisor}, s, h);
    case HVD_FLOAT16:
        return launch_map<uint16_t>(buf, count, DivHalf<false>{(float)divisor},
                                    s, h);
    case HVD_BFLOAT16:
        return launch_map<uint16_t>(buf, count, DivHalf<true>{(float)divisor},
                                    s, h);
    case HVD_FLOAT32:
        return launch_map<float>(buf, count, DivFloat<float>{(float)divisor}, s,
                                 h);
    case HVD_FLOAT64:
        return launch_map<double>(buf, count, DivFloat<double>{(double)divisor},
                                  s, h);
    }
    return (int)cudaErrorInvalidValue;
}

/* ---- fill ---- */

template <typename T> __global__ void fill_kernel(T *p, size_t n, T v) {
    size_t stride = (size_t)gridDim.x * blockDim.x;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        p[i] = v;
}

template <typename T> int launch_fill(void *p, size_t n, T v, cudaStream_t s) {
    fill_kernel<T><<<blocks_for(n), kThreads, 0, s>>>((T *)p, n, v);
    return (int)cudaGetLastError();
}

/* ---- batched copies ---- */

struct CopyBatch {
    hvd_cuda_copy items[HVD_CUDA_COPY_BATCH];
};

template <typename V>
HD void copy_words(uint8_t *dst, const uint8_t *src, size_t words, size_t tid,
                   size_t stride) {
    V *d = (V *)dst;
    const V *s = (const V *)src;

    for (size_t i = tid; i < words; i += stride)
        d[i] = s[i];
}

/* blockIdx.y picks the copy; the x blocks share it. */
__global__ void copy_batch_kernel(CopyBatch batch) {
    hvd_cuda_copy it = batch.items[blockIdx.y];
    uint8_t *dst = (uint8_t *)it.dst;
    const uint8_t *src = (const uint8_t *)it.src;
    uintptr_t mis = (uintptr_t)dst | (uintptr_t)src;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t w = (mis & 15) == 0  ? 16
               : (mis & 7) == 0 ? 8
               : (mis & 3) == 0 ? 4
               : (mis & 1) == 0 ? 2
                                : 1;
    size_t words = it.bytes / w, body = words * w;

    switch (w) {
    case 16:
        copy_words<uint4>(dst, src, words, tid, stride);
        break;
    case 8:
        copy_words<unsigned long long>(dst, src, words, tid, stride);
        break;
    case 4:
        copy_words<uint32_t>(dst, src, words, tid, stride);
        break;
    case 2:
        copy_words<uint16_t>(dst, src, words, tid, stride);
        break;
    default:
        copy_words<uint8_t>(dst, src, words, tid, stride);
        break;
    }
    for (size_t i = body + tid; i < it.bytes; i += stride)
        dst[i] = src[i];
}

} // namespace

extern "C" int hvd_cuda_reduce(void *dst, const void *a, const void *b,
                               size_t count, hvd_dtype dtype, hvd_op op,
                               void *stream) {
    return reduce_any(dst, a, b, count, dtype, op, (cudaStream_t)stream, false);
}

extern "C" int hvd_cuda_scale_div(void *buf, size_t count, hvd_dtype dtype,
                                  int divisor, void *stream) {
    return scale_div_any(buf, count, dtype, divisor, (cudaStream_t)stream,
                         false);
}

extern "C" void hvd_cuda_reduce_emulated(void *dst, const void *a,
                                         const void *b, size_t count,
                                         hvd_dtype dtype, hvd_op op) {
    reduce_any(dst, a, b, count, dtype, op, 0, true);
}

extern "C" void hvd_cuda_scale_div_emulated(void *buf, size_t count,
                                            hvd_dtype dtype, int divisor) {
    scale_div_any(buf, count, dtype, divisor, 0, true);
}

extern "C" int hvd_cuda_fill_neutral(void *buf, size_t count, hvd_dtype dtype,
                                     hvd_op op, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    int prod = op == HVD_PRODUCT, min = op == HVD_MIN;

    if (count == 0)
        return 0;
    if (op == HVD_SUM || op == HVD_AVERAGE)
        return (int)cudaMemsetAsync(buf, 0, count * hvd_dtype_size(dtype), s);
    switch (dtype) {
    case HVD_UINT8:
        return launch_fill<uint8_t>(buf, count, prod ? 1 : min ? 0xff : 0, s);
    case HVD_INT8:
        return launch_fill<int8_t>(buf, count,
                                   prod  ? 1
                                   : min ? (int8_t)127
                                         : (int8_t)-128,
                                   s);
    case HVD_INT32:
        return launch_fill<int32_t>(buf, count,
                                    prod  ? 1
                                    : min ? (int32_t)0x7fffffff
                                          : (int32_t)(-0x7fffffff - 1),
                                    s);
    case HVD_INT64:
        return launch_fill<long long>(buf, count,
                                      prod  ? 1LL
                                      : min ? 0x7fffffffffffffffLL
                                            : (-0x7fffffffffffffffLL - 1),
                                      s);
    case HVD_FLOAT16: /* 1.0 = 0x3c00, +inf = 0x7c00, -inf = 0xfc00 */
        return launch_fill<uint16_t>(buf, count,
                                     prod  ? 0x3c00
                                     : min ? 0x7c00
                                           : 0xfc00,
                                     s);
    case HVD_BFLOAT16: /* 1.0 = 0x3f80, +inf = 0x7f80, -inf = 0xff80 */
        return launch_fill<uint16_t>(buf, count,
                                     prod  ? 0x3f80
                                     : min ? 0x7f80
                                           : 0xff80,
                                     s);
    case HVD_FLOAT32: /* bit patterns: 1.0, +inf, -inf */
        return launch_fill<uint32_t>(buf, count,
                                     prod  ? 0x3f800000u
                                     : min ? 0x7f800000u
                                           : 0xff800000u,
                                     s);
    case HVD_FLOAT64:
        return launch_fill<unsigned long long>(buf, count,
                                               prod  ? 0x3ff0000000000000ull
                                               : min ? 0x7ff0000000000000ull
                                                     : 0xfff0000000000000ull,
                                               s);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int hvd_cuda_copy_batch(const hvd_cuda_copy *items, size_t n,
                                   void *stream) {
    cudaStream_t s = (cudaStream_t)stream;

    for (size_t first = 0; first < n; first += HVD_CUDA_COPY_BATCH) {
        CopyBatch batch;
        size_t m =
            n - first < HVD_CUDA_COPY_BATCH ? n - first : HVD_CUDA_COPY_BATCH;
        size_t most = 0, k = 0;
        for (size_t i = 0; i < m; i++) {
            if (items[first + i].bytes == 0)
                continue;
            batch.items[k++] = items[first + i];
            if (items[first + i].bytes > most)
                most = items[first + i].bytes;
        }
        if (k == 0)
            continue;
        /* Enough blocks for the largest copy at 16 bytes per thread. */
        dim3 grid(blocks_for((most + 15) / 16), (unsigned)k);
        copy_batch_kernel<<<grid, kThreads, 0, s>>>(batch);
        int rc = (int)cudaGetLastError();
        if (rc != 0)
            return rc;
    }
    return 0;
}
