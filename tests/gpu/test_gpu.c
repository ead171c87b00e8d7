/*
 * Device buffers through hvd, on a machine with a CUDA GPU.
 *
 *     hvdrun -np N test_gpu [--max-count N] [--gpu-per-rank] [--quick]
 *
 * Whatever path HVD_TRANSPORT gives device tensors (nccl, staged over tcp
 * or shm, local), every rank checks, on device buffers of every dtype:
 * allreduce with every op (in and out of place, counts 0, 1, 7, 1009,
 * 65537 and --max-count), a burst of small asynchronous allreduces that
 * fuse (with host tensors among them, which must fuse apart), a grouped
 * allreduce, broadcast from every root, allgather (and in place), and the
 * refusals: host and device buffers in one call, a buffer on another GPU,
 * ranks that disagree on host or device memory (HVD_ERR_MISMATCH).
 *
 * Inputs are small integers of (rank, index), so every result is exact in
 * every dtype whatever the reduction order; results are read back with
 * cudaMemcpy and compared as numbers.
 *
 * Exit status: 0 pass, 1 fail, 2 usage, 77 skip (no CUDA device; with
 * --gpu-per-rank, fewer devices than ranks on this host, as NCCL needs).
 */
#include <hvd/hvd.h>

#include "testutil.h"

#ifdef HVD_TEST_SIM
#include "sim_cudart.h"
#else
#include <cuda_runtime_api.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = -1, g_size = -1;
static unsigned long g_checks;

static _Noreturn void fail(const char *what, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static _Noreturn void fail(const char *what, const char *fmt, ...) {
    va_list ap;

    printf("FAIL %s rank %d: ", what, g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

static void expect_status(const char *what, hvd_status got, hvd_status want) {
    if (got != want)
        fail(what, "status %s expected %s; last error: \"%s\"",
             status_name(got), status_name(want), hvd_last_error());
    g_checks++;
}

static void cuda_ok(const char *what, cudaError_t e) {
    if (e != cudaSuccess)
        fail(what, "%s", cudaGetErrorString(e));
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;

    cuda_ok("cudaMalloc", cudaMalloc(&p, bytes > 0 ? bytes : 1));
    return p;
}

static void *host_alloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL)
        fail("malloc", "%zu bytes", bytes);
    return p;
}

/* ------------------------------------------------------------------ */
/* Exact small integers in every dtype                                 */

static const hvd_dtype dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                   HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                   HVD_FLOAT32, HVD_FLOAT64};
static const char *const dtype_names[] = {"uint8",   "int8",    "int32",
                                          "int64",   "float16", "bfloat16",
                                          "float32", "float64"};
#define NDTYPES 8
static const hvd_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                             HVD_PRODUCT};
static const char *const op_names[] = {"sum", "average", "min", "max",
                                       "product"};
#define NOPS 5

/* The value of float16 / bfloat16 bits (the encoding: testutil.h). */
static double half_to_double(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);

    if (e == 31)
        v = m ? NAN : INFINITY;
    return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;

    memcpy(&f, &u, 4);
    return f;
}

static double get(hvd_dtype dt, const void *buf, size_t i) {
    switch (dt) {
    case HVD_UINT8:
        return ((const uint8_t *)buf)[i];
    case HVD_INT8:
        return ((const int8_t *)buf)[i];
    case HVD_INT32:
        return ((const int32_t *)buf)[i];
    case HVD_INT64:
        return (double)((const int64_t *)buf)[i];
    case HVD_FLOAT16:
        return half_to_double(((const uint16_t *)buf)[i]);
    case HVD_BFLOAT16:
        return bf16_to_double(((const uint16_t *)buf)[i]);
    case HVD_FLOAT32:
        return ((const float *)buf)[i];
    case HVD_FLOAT64:
        return ((const double *)buf)[i];
    }
    return NAN;
}

/* Rank r's input at index i for op: sums, averages and products stay
 * exact in every dtype for up to 8 ranks. */
static long value(hvd_dtype dt, hvd_op op, int r, size_t i) {
    int u = dt == HVD_UINT8;

    switch (op) {
    case HVD_AVERAGE: /* the same on every rank: the average is exact */
        return u ? (long)(i % 4) : (long)(i % 7) - 3;
    case HVD_PRODUCT:
        return u ? (long)((i * 5 + (size_t)r) % 2) + 1
                 : (long)((i * 5 + (size_t)r) % 3) - 1;
    default:
        return u ? (long)((i * 7 + (size_t)r * 3) % 4)
                 : (long)((i * 7 + (size_t)r * 3) % 7) - 3;
    }
}

static long expected(hvd_dtype dt, hvd_op op, size_t i) {
    long acc = value(dt, op, 0, i);

    for (int r = 1; r < g_size; r++) {
        long v = value(dt, op, r, i);
        acc = combine(op, acc, v);
    }
    return op == HVD_AVERAGE ? acc / g_size : acc;
}

/* Copies count elements of dt made by fn(i) to new device memory. */
static void *dev_input(hvd_dtype dt, hvd_op op, int r, size_t count) {
    size_t bytes = count * hvd_dtype_size(dt);
    void *h = host_alloc(bytes), *d = dev_alloc(bytes);

    for (size_t i = 0; i < count; i++)
        put_value(dt, h, i, value(dt, op, r, i));
    cuda_ok("cudaMemcpy H2D", cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void check_allreduce(const char *what, hvd_dtype dt, hvd_op op,
                            const void *dres, size_t count) {
    size_t bytes = count * hvd_dtype_size(dt);
    void *h = host_alloc(bytes);

    cuda_ok("cudaMemcpy D2H",
            cudaMemcpy(h, dres, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) {
        double got = get(dt, h, i), want = (double)expected(dt, op, i);
        if (got != want)
            fail(what, "element %zu of %zu is %g, expected %g", i, count, got,
                 want);
    }
    free(h);
    g_checks++;
}

/* ------------------------------------------------------------------ */
/* The checks                                                          */

static void allreduce_all(size_t max_count, int quick) {
    size_t counts[] = {0, 1, 7, 1009, 65537, max_count};
    size_t ncounts = sizeof(counts) / sizeof(counts[0]);
    char name[128];

    for (size_t d = 0; d < NDTYPES; d++) {
        for (size_t o = 0; o < NOPS; o++) {
            for (size_t c = 0; c < ncounts; c++) {
                hvd_dtype dt = dtypes[d];
                hvd_op op = ops[o];
                size_t n = counts[c];
                if (quick && n > 1009)
                    continue;
                void *in = dev_input(dt, op, g_rank, n);
                void *out = dev_alloc(n * hvd_dtype_size(dt));
                snprintf(name, sizeof(name), "ar.%s.%s.%zu", dtype_names[d],
                         op_names[o], n);
                expect_status(name, hvd_allreduce(name, in, out, n, dt, op),
                              HVD_OK);
                check_allreduce(name, dt, op, out, n);
                /* In place. */
                snprintf(name, sizeof(name), "ar.%s.%s.%zu.inplace",
                         dtype_names[d], op_names[o], n);
                expect_status(name, hvd_allreduce(name, in, in, n, dt, op),
                              HVD_OK);
                check_allreduce(name, dt, op, in, n);
                cudaFree(in);
                cudaFree(out);
            }
        }
    }
}

/* Many small device tensors at once (they fuse on the device), host
 * tensors among them (fused apart), and a grouped allreduce. */
static void fusion_and_grouped(void) {
    enum { NDEV = 64, NHOST = 16, NGROUP = 5 };
    void *din[NDEV], *hin[NHOST];
    hvd_handle h[NDEV + NHOST];
    char name[64];
    int k = 0;

    for (int i = 0; i < NDEV; i++) {
        size_t n = (size_t)(i % 13) * 11 + (size_t)i;
        hvd_dtype dt = i % 3 == 0 ? HVD_FLOAT16 : HVD_FLOAT32;
        din[i] = dev_input(dt, HVD_SUM, g_rank, n);
        snprintf(name, sizeof(name), "burst.dev.%d", i);
        expect_status(
            name,
            hvd_allreduce_async(name, din[i], din[i], n, dt, HVD_SUM, &h[k++]),
            HVD_OK);
        if (i % 4 == 0) {
            int j = i / 4;
            size_t hn = (size_t)j * 17 + 1;
            hin[j] = host_alloc(hn * 4);
            for (size_t e = 0; e < hn; e++)
                put_value(HVD_FLOAT32, hin[j], e,
                          value(HVD_FLOAT32, HVD_SUM, g_rank, e));
            snprintf(name, sizeof(name), "burst.host.%d", j);
            expect_status(name,
                          hvd_allreduce_async(name, hin[j], hin[j], hn,
                                              HVD_FLOAT32, HVD_SUM, &h[k++]),
                          HVD_OK);
        }
    }
    for (int i = 0; i < k; i++)
        expect_status("burst wait", hvd_wait(h[i]), HVD_OK);
    for (int i = 0; i < NDEV; i++) {
        size_t n = (size_t)(i % 13) * 11 + (size_t)i;
        hvd_dtype dt = i % 3 == 0 ? HVD_FLOAT16 : HVD_FLOAT32;
        snprintf(name, sizeof(name), "burst.dev.%d", i);
        check_allreduce(name, dt, HVD_SUM, din[i], n);
        cudaFree(din[i]);
    }
    for (int j = 0; j < NHOST; j++) {
        size_t hn = (size_t)j * 17 + 1;
        for (size_t e = 0; e < hn; e++)
            if (get(HVD_FLOAT32, hin[j], e) !=
                (double)expected(HVD_FLOAT32, HVD_SUM, e))
                fail("burst.host", "tensor %d element %zu", j, e);
        free(hin[j]);
        g_checks++;
    }

    /* Grouped: one collective over five device tensors. */
    size_t gc[NGROUP] = {0, 3, 1000, 1, 77};
    const void *gs[NGROUP];
    void *gr[NGROUP];
    for (int i = 0; i < NGROUP; i++) {
        gs[i] = dev_input(HVD_INT32, HVD_MAX, g_rank, gc[i]);
        gr[i] = dev_alloc(gc[i] * 4);
    }
    expect_status("grouped",
                  hvd_grouped_allreduce("grouped", NGROUP, gs, gr, gc,
                                        HVD_INT32, HVD_MAX),
                  HVD_OK);
    for (int i = 0; i < NGROUP; i++) {
        check_allreduce("grouped", HVD_INT32, HVD_MAX, gr[i], gc[i]);
        cudaFree((void *)gs[i]);
        cudaFree(gr[i]);
    }
}

static void broadcast_allgather(void) {
    size_t counts[] = {0, 1, 1009, 300001};
    char name[96];

    for (size_t d = 0; d < NDTYPES; d++) {
        hvd_dtype dt = dtypes[d];
        size_t es = hvd_dtype_size(dt);
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            size_t n = counts[c];
            for (int root = 0; root < g_size; root++) {
                void *buf = dev_input(dt, HVD_SUM, g_rank, n);
                void *h = host_alloc(n * es);
                snprintf(name, sizeof(name), "bc.%s.%zu.%d", dtype_names[d], n,
                         root);
                expect_status(name, hvd_broadcast(name, buf, n, dt, root),
                              HVD_OK);
                cuda_ok("D2H",
                        cudaMemcpy(h, buf, n * es, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < n; i++)
                    if (get(dt, h, i) != (double)value(dt, HVD_SUM, root, i))
                        fail(name, "element %zu", i);
                g_checks++;
                free(h);
                cudaFree(buf);
            }
            /* Allgather: out of place; in place with the input in its
             * block; in place with the input at the start. */
            for (int inplace = 0; inplace < 3; inplace++) {
                size_t total = n * (size_t)g_size;
                void *in = dev_input(dt, HVD_SUM, g_rank, n);
                void *out = dev_alloc(total * es);
                void *h = host_alloc(total * es);
                const void *send = in;
                if (inplace == 1) {
                    cuda_ok("D2D",
                            cudaMemcpy((char *)out + (size_t)g_rank * n * es,
                                       in, n * es, cudaMemcpyDeviceToDevice));
                    send = (char *)out + (size_t)g_rank * n * es;
                } else if (inplace == 2) {
                    cuda_ok("D2D", cudaMemcpy(out, in, n * es,
                                              cudaMemcpyDeviceToDevice));
                    send = out;
                }
                snprintf(name, sizeof(name), "ag.%s.%zu.%d", dtype_names[d], n,
                         inplace);
                expect_status(name, hvd_allgather(name, send, out, n, dt),
                              HVD_OK);
                cuda_ok("D2H",
                        cudaMemcpy(h, out, total * es, cudaMemcpyDeviceToHost));
                for (int r = 0; r < g_size; r++)
                    for (size_t i = 0; i < n; i++)
                        if (get(dt, h, (size_t)r * n + i) !=
                            (double)value(dt, HVD_SUM, r, i))
                            fail(name, "rank %d's element %zu", r, i);
                g_checks++;
                free(h);
                cudaFree(in);
                cudaFree(out);
            }
        }
    }
}

static void refusals(int ndev, int dev) {
    float host[4] = {1, 2, 3, 4};
    void *d = dev_alloc(sizeof(host));

    /* Host and device memory in one call. */
    expect_status("mixed",
                  hvd_allreduce("mixed", host, d, 4, HVD_FLOAT32, HVD_SUM),
                  HVD_ERR_INVALID_ARG);
    if (strstr(hvd_last_error(), "host memory") == NULL)
        fail("mixed", "the sentence does not say why: %s", hvd_last_error());
    /* Ranks that disagree on host or device memory for one name. */
    if (g_size > 1) {
        void *buf = g_rank == 0 ? (void *)host : d;
        expect_status("mismatch",
                      hvd_allreduce("where", buf, buf, 4, HVD_FLOAT32, HVD_SUM),
                      HVD_ERR_MISMATCH);
        if (strstr(hvd_last_error(), "on the GPU") == NULL)
            fail("mismatch", "the sentence does not say where: %s",
                 hvd_last_error());
    }
    /* A buffer on a GPU hvd does not use on this rank. */
    if (ndev > 1) {
        void *other = NULL;
        cuda_ok("cudaSetDevice", cudaSetDevice((dev + 1) % ndev));
        other = dev_alloc(16);
        cuda_ok("cudaSetDevice", cudaSetDevice(dev));
        expect_status(
            "other gpu",
            hvd_allreduce("other", other, other, 4, HVD_FLOAT32, HVD_SUM),
            HVD_ERR_INVALID_ARG);
        cudaFree(other);
    }
    cudaFree(d);
    /* The job still works. */
    expect_status("after refusals", hvd_barrier(), HVD_OK);
}

int main(int argc, char **argv) {
    size_t max_count = (size_t)1 << 20;
    int per_rank = 0, quick = 0, ndev = 0, dev;
    const char *env;
    cudaError_t e;

    for (int i = 1; i < argc; i++) {
        int v;
        if (strcmp(argv[i], "--max-count") == 0 && i + 1 < argc &&
            parse_int(argv[i + 1], &v) == 0) {
            max_count = (size_t)v;
            i++;
        } else if (strcmp(argv[i], "--gpu-per-rank") == 0) {
            per_rank = 1;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr,
                    "usage: %s [--max-count N] [--gpu-per-rank] [--quick]\n",
                    argv[0]);
            return 2;
        }
    }
    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    env = getenv("HVD_LOCAL_SIZE");
    if (per_rank && env != NULL && atoi(env) > ndev) {
        printf("SKIP: %s ranks on this host but %d CUDA device(s); NCCL "
               "needs one per rank\n",
               env, ndev);
        return 77;
    }
    expect_status("hvd_init", hvd_init(), HVD_OK);
    g_rank = hvd_rank();
    g_size = hvd_size();
    env = getenv("HVD_GPU_DEVICE");
    dev = env != NULL ? atoi(env) : hvd_local_rank() % ndev;
    cuda_ok("cudaSetDevice", cudaSetDevice(dev));

    allreduce_all(max_count, quick);
    fusion_and_grouped();
    broadcast_allgather();
    refusals(ndev, dev);

    expect_status("hvd_shutdown", hvd_shutdown(), HVD_OK);
    printf("PASS gpu rank %d of %d: %lu checks\n", g_rank, g_size, g_checks);
    return 0;
}
