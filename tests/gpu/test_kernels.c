/*
 * The CUDA kernels (gpu/kernels.cu) against the CPU kernels
 * (collectives/reduce.c), bit for bit, on a machine with a GPU.
 *
 *     test_kernels [--emulated]
 *
 * Every dtype and op, out of place and in place (dst == a, dst == b), on
 * random bit patterns: for floats, NaNs with payloads, infinities,
 * subnormals, signed zeros and numbers that overflow when combined. The
 * results must be the same bits, except where both operands of a sum or
 * product are NaN (which NaN comes out is the CPU compiler's choice; it
 * must be a NaN). Also the division of averages, the neutral fills, and the
 * batched copies of the fusion buffer with every alignment and odd sizes.
 *
 * --emulated runs the kernels' own element code on the CPU instead (with
 * the GPU's canonical NaNs), where no GPU is: the reductions and divisions
 * only (unit.kernels_host).
 *
 * Exit status: 0 pass, 1 fail, 77 skip (no CUDA device).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reduce.h"
#include "gpu/kernels.h"

static unsigned long checks;
static int emulated;
static uint64_t rng = 88172645463325252ull;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#define CHECK_CUDA(call)                                                       \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));            \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* A random element of dtype: often special for floats. */
static void random_element(hvd_dtype dt, uint8_t *p) {
    uint64_t r = next();
    unsigned kind = (unsigned)(next() % 16);

    switch (dt) {
    case HVD_FLOAT16:
    case HVD_BFLOAT16: {
        int bf = dt == HVD_BFLOAT16;
        uint16_t exp_mask = bf ? 0x7f80 : 0x7c00;
        uint16_t v = (uint16_t)r;
        if (kind == 0)
            v |= exp_mask; /* inf or NaN */
        else if (kind == 1)
            v &= (uint16_t)~exp_mask; /* zero or subnormal */
        else if (kind == 2)
            v &= 0x8000;   /* signed zero */
        else if (kind < 8) /* small numbers: sums are exact-ish */
            v = (uint16_t)((v & 0x83ff) | (bf ? 0x3f00 : 0x3c00));
        memcpy(p, &v, 2);
        break;
    }
    case HVD_FLOAT32: {
        uint32_t v = (uint32_t)r;
        if (kind == 0)
            v |= 0x7f800000u;
        else if (kind == 1)
            v &= 0x807fffffu;
        else if (kind == 2)
            v &= 0x80000000u;
        else if (kind == 3)
            v |= 0x7f000000u; /* huge: sums overflow */
        memcpy(p, &v, 4);
        break;
    }
    case HVD_FLOAT64: {
        uint64_t v = r;
        if (kind == 0)
            v |= 0x7ff0000000000000ull;
        else if (kind == 1)
            v &= 0x800fffffffffffffull;
        else if (kind == 2)
            v &= 0x8000000000000000ull;
        else if (kind == 3)
            v |= 0x7fe0000000000000ull;
        memcpy(p, &v, 8);
        break;
    }
    default:
        memcpy(p, &r, hvd_dtype_size(dt));
        break;
    }
}

static int is_nan(hvd_dtype dt, const uint8_t *p) {
    switch (dt) {
    case HVD_FLOAT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return (v & 0x7c00) == 0x7c00 && (v & 0x3ff);
    }
    case HVD_BFLOAT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return (v & 0x7f80) == 0x7f80 && (v & 0x7f);
    }
    case HVD_FLOAT32: {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    case HVD_FLOAT64: {
        double f;
        memcpy(&f, p, 8);
        return isnan(f);
    }
    default:
        return 0;
    }
}

static void compare(const char *what, hvd_dtype dt, hvd_op op, const uint8_t *a,
                    const uint8_t *b, const uint8_t *cpu, const uint8_t *gpu,
                    size_t n) {
    size_t es = hvd_dtype_size(dt);
    int loose = op == HVD_SUM || op == HVD_AVERAGE || op == HVD_PRODUCT;

    for (size_t i = 0; i < n; i++) {
        const uint8_t *c = cpu + i * es, *g = gpu + i * es;
        if (memcmp(c, g, es) == 0)
            continue;
        if (loose && a != NULL && is_nan(dt, a + i * es) &&
            is_nan(dt, b + i * es) && is_nan(dt, g))
            continue;
        printf("FAIL %s dtype %s op %s element %zu of %zu:", what,
               hvd_dtype_name(dt), hvd_op_name(op), i, n);
        for (size_t k = 0; k < es; k++)
            printf(" %02x/%02x", c[es - 1 - k], g[es - 1 - k]);
        printf(" (cpu/gpu, high byte first)\n");
        exit(1);
    }
    checks++;
}

static void reductions(void) {
    const size_t n = 100003;
    static const hvd_dtype dts[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                    HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                    HVD_FLOAT32, HVD_FLOAT64};
    static const hvd_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                 HVD_PRODUCT};

    for (size_t d = 0; d < 8; d++) {
        hvd_dtype dt = dts[d];
        size_t es = hvd_dtype_size(dt), bytes = n * es;
        uint8_t *a = malloc(bytes), *b = malloc(bytes), *cpu = malloc(bytes),
                *gpu = malloc(bytes);
        void *da, *db, *dd;
        if (!a || !b || !cpu || !gpu) {
            printf("FAIL malloc\n");
            exit(1);
        }
        if (emulated) {
            for (size_t o = 0; o < 5; o++) {
                hvd_op op = ops[o];
                for (size_t i = 0; i < n; i++) {
                    random_element(dt, a + i * es);
                    random_element(dt, b + i * es);
                }
                hvd_reduce(cpu, a, b, n, dt, op);
                hvd_cuda_reduce_emulated(gpu, a, b, n, dt, op);
                compare("reduce (emulated)", dt, op, a, b, cpu, gpu, n);
                memcpy(gpu, a, bytes);
                hvd_cuda_reduce_emulated(gpu, gpu, b, n, dt, op);
                compare("reduce in place (emulated)", dt, op, a, b, cpu, gpu,
                        n);
            }
            for (int divisor = 1; divisor <= 7; divisor += 2) {
                for (size_t i = 0; i < n; i++)
                    random_element(dt, a + i * es);
                memcpy(cpu, a, bytes);
                memcpy(gpu, a, bytes);
                hvd_reduce_scale_div(cpu, n, dt, divisor);
                hvd_cuda_scale_div_emulated(gpu, n, dt, divisor);
                compare("scale_div (emulated)", dt, HVD_MIN, NULL, NULL, cpu,
                        gpu, n);
            }
            free(a);
            free(b);
            free(cpu);
            free(gpu);
            continue;
        }
        CHECK_CUDA(cudaMalloc(&da, bytes));
        CHECK_CUDA(cudaMalloc(&db, bytes));
        CHECK_CUDA(cudaMalloc(&dd, bytes));
        for (size_t o = 0; o < 5; o++) {
            hvd_op op = ops[o];
            for (size_t i = 0; i < n; i++) {
                random_element(dt, a + i * es);
                random_element(dt, b + i * es);
            }
            CHECK_CUDA(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
            hvd_reduce(cpu, a, b, n, dt, op);
            /* Out of place. */
            CHECK_CUDA((cudaError_t)hvd_cuda_reduce(dd, da, db, n, dt, op, 0));
            CHECK_CUDA(cudaMemcpy(gpu, dd, bytes, cudaMemcpyDeviceToHost));
            compare("reduce", dt, op, a, b, cpu, gpu, n);
            /* dst == a, then dst == b: the same bits. */
            CHECK_CUDA((cudaError_t)hvd_cuda_reduce(da, da, db, n, dt, op, 0));
            CHECK_CUDA(cudaMemcpy(gpu, da, bytes, cudaMemcpyDeviceToHost));
            compare("reduce in place (a)", dt, op, a, b, cpu, gpu, n);
            CHECK_CUDA(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
            CHECK_CUDA((cudaError_t)hvd_cuda_reduce(db, da, db, n, dt, op, 0));
            CHECK_CUDA(cudaMemcpy(gpu, db, bytes, cudaMemcpyDeviceToHost));
            compare("reduce in place (b)", dt, op, a, b, cpu, gpu, n);
        }
        /* Division of an average. */
        for (int divisor = 1; divisor <= 7; divisor += 2) {
            for (size_t i = 0; i < n; i++)
                random_element(dt, a + i * es);
            memcpy(cpu, a, bytes);
            hvd_reduce_scale_div(cpu, n, dt, divisor);
            CHECK_CUDA(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
            CHECK_CUDA((cudaError_t)hvd_cuda_scale_div(da, n, dt, divisor, 0));
            CHECK_CUDA(cudaMemcpy(gpu, da, bytes, cudaMemcpyDeviceToHost));
            compare("scale_div", dt, HVD_MIN, NULL, NULL, cpu, gpu, n);
        }
        /* Neutral elements. */
        for (size_t o = 0; o < 5; o++) {
            hvd_reduce_fill_neutral(cpu, n, dt, ops[o]);
            CHECK_CUDA(
                (cudaError_t)hvd_cuda_fill_neutral(dd, n, dt, ops[o], 0));
            CHECK_CUDA(cudaMemcpy(gpu, dd, bytes, cudaMemcpyDeviceToHost));
            compare("fill_neutral", dt, ops[o], NULL, NULL, cpu, gpu, n);
        }
        cudaFree(da);
        cudaFree(db);
        cudaFree(dd);
        free(a);
        free(b);
        free(cpu);
        free(gpu);
    }
}

/* Many copies at every alignment, sizes 0 and odd, more than one launch
 * of them; what lies between them is untouched. */
static void batched_copies(void) {
    enum { N = 200, SPAN = 6000 };
    size_t total = (size_t)N * SPAN;
    uint8_t *src = malloc(total), *dst = malloc(total), *want = malloc(total);
    hvd_cuda_copy items[N];
    uint8_t *dsrc, *ddst;

    if (!src || !dst || !want) {
        printf("FAIL malloc\n");
        exit(1);
    }
    for (size_t i = 0; i < total; i++) {
        src[i] = (uint8_t)next();
        want[i] = 0xA5;
    }
    CHECK_CUDA(cudaMalloc((void **)&dsrc, total));
    CHECK_CUDA(cudaMalloc((void **)&ddst, total));
    CHECK_CUDA(cudaMemcpy(dsrc, src, total, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(ddst, 0xA5, total));
    for (size_t i = 0; i < N; i++) {
        size_t soff = next() % 17, doff = next() % 17;
        size_t len = i % 10 == 0 ? 0 : next() % (SPAN - 32);
        items[i].src = dsrc + i * SPAN + soff;
        items[i].dst = ddst + i * SPAN + doff;
        items[i].bytes = len;
        memcpy(want + i * SPAN + doff, src + i * SPAN + soff, len);
    }
    CHECK_CUDA((cudaError_t)hvd_cuda_copy_batch(items, N, 0));
    CHECK_CUDA(cudaMemcpy(dst, ddst, total, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < total; i++) {
        if (dst[i] != want[i]) {
            printf("FAIL copy_batch: byte %zu (copy %zu) is %02x, expected "
                   "%02x\n",
                   i, i / SPAN, dst[i], want[i]);
            exit(1);
        }
    }
    checks++;
    cudaFree(dsrc);
    cudaFree(ddst);
    free(src);
    free(dst);
    free(want);
}

int main(int argc, char **argv) {
    int ndev = 0;
    cudaError_t e;

    if (argc == 2 && strcmp(argv[1], "--emulated") == 0) {
        emulated = 1;
        reductions();
        printf("PASS kernels (emulated on the CPU): %lu checks, bitwise "
               "equal to the CPU kernels\n",
               checks);
        return 0;
    }
    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    reductions();
    batched_copies();
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("PASS kernels: %lu checks, bitwise equal to the CPU kernels\n",
           checks);
    return 0;
}
