/*
 * Device memory where no GPU can be used: what hvd refuses, and with which
 * sentence; host tensors unaffected.
 *
 *     hvdrun -np N test_gpu_nodev MODE BUILD
 *
 * BUILD is what hvd was built with: nocuda, cuda (without NCCL) or nccl.
 * MODE:
 *   nogpu  a machine without a CUDA device (SKIP, 77, where there is one):
 *          HVD_TRANSPORT=nccl fails hvd_init with HVD_ERR_UNSUPPORTED
 *          saying why; then, without it, host collectives of every dtype
 *          work as before.
 *   fake   under tests/gpu/fake_libcuda.c (LD_LIBRARY_PATH), whose two
 *          "devices" own two buffers here: host and device buffers in one
 *          call are refused (HVD_ERR_INVALID_ARG); without CUDA built in a
 *          device buffer is refused (HVD_ERR_UNSUPPORTED, "built without
 *          CUDA"); with it, a buffer on the other device is refused
 *          (HVD_ERR_INVALID_ARG), ranks that disagree on host or device
 *          memory get HVD_ERR_MISMATCH, and a device allreduce reaches the
 *          engine, whose GPU setup fails on every rank (the runtime finds
 *          no usable driver): every rank gets HVD_ERR_UNSUPPORTED saying
 *          so, for that and later device operations, and host operations
 *          go on.
 *   nccl   the fake driver and HVD_TRANSPORT=nccl: hvd_init fails with
 *          HVD_ERR_UNSUPPORTED naming HVD_TRANSPORT=nccl (NCCL cannot be
 *          used on rank 0).
 * Exit status: 0 pass, 1 fail, 2 usage, 77 skip.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = -1;

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

/* st must be want, and the sentence must contain each of the texts. */
static void expect(const char *what, hvd_status st, hvd_status want, ...) {
    va_list ap;
    const char *text;

    if (st != want)
        fail(what, "status %s expected %s; last error: \"%s\"", status_name(st),
             status_name(want), hvd_last_error());
    va_start(ap, want);
    while ((text = va_arg(ap, const char *)) != NULL) {
        if (strstr(hvd_last_error(), text) == NULL) {
            va_end(ap);
            fail(what, "the sentence lacks \"%s\": \"%s\"", text,
                 hvd_last_error());
        }
    }
    va_end(ap);
    if (st != HVD_OK)
        printf("ok %s: %s\n", what, hvd_last_error());
}

/* Whether a real CUDA driver sees a device (as hvd's probe does). */
static int real_device(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*init)(unsigned int), (*count)(int *);
    int n = 0;

    if (h == NULL)
        return 0;
    *(void **)&init = dlsym(h, "cuInit");
    *(void **)&count = dlsym(h, "cuDeviceGetCount");
    if (dlsym(h, "fake_cuda_add_range") != NULL || init == NULL ||
        count == NULL || init(0) != 0 || count(&n) != 0)
        n = 0;
    dlclose(h);
    return n;
}

static void host_collectives(void) {
    static const hvd_dtype dts[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                    HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                    HVD_FLOAT32, HVD_FLOAT64};
    int size = hvd_size();
    char name[64];

    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        size_t es = hvd_dtype_size(dts[d]), n = 1001;
        unsigned char *buf = calloc(n + 1, es);
        if (buf == NULL)
            fail("calloc", "out of memory");
        /* Ones (element n keeps the pattern): every dtype sums them
         * exactly. */
        for (size_t i = 0; i <= n; i++) {
            unsigned char *p = buf + i * es;
            switch (dts[d]) {
            case HVD_FLOAT16:
                p[1] = 0x3c;
                break;
            case HVD_BFLOAT16:
                p[1] = 0x3f;
                p[0] = 0x80;
                break;
            case HVD_FLOAT32: {
                float one = 1;
                memcpy(p, &one, 4);
                break;
            }
            case HVD_FLOAT64: {
                double one = 1;
                memcpy(p, &one, 8);
                break;
            }
            default:
                p[0] = 1;
                break;
            }
        }
        snprintf(name, sizeof(name), "host.%zu", d);
        expect(name, hvd_allreduce(name, buf, buf, n, dts[d], HVD_AVERAGE),
               HVD_OK, NULL);
        /* The average of ones is one, in the same bits. */
        for (size_t i = 0; i < n; i++)
            if (memcmp(buf + i * es, buf + n * es, es) != 0)
                fail(name, "element %zu is not one", i);
        (void)size;
        free(buf);
    }
    expect("barrier", hvd_barrier(), HVD_OK, NULL);
}

static int mode_nogpu(const char *build) {
    if (real_device() > 0) {
        printf("SKIP: this machine has a CUDA device\n");
        return 77;
    }
    setenv("HVD_TRANSPORT", "nccl", 1);
    expect("HVD_TRANSPORT=nccl", hvd_init(), HVD_ERR_UNSUPPORTED,
           "HVD_TRANSPORT=nccl",
           strcmp(build, "nccl") == 0 ? "no CUDA device" : "built without",
           NULL);
    unsetenv("HVD_TRANSPORT");
    expect("hvd_init", hvd_init(), HVD_OK, NULL);
    g_rank = hvd_rank();
    host_collectives();
    expect("hvd_shutdown", hvd_shutdown(), HVD_OK, NULL);
    return 0;
}

static _Alignas(4096) unsigned char fake_mem[2][65536];

static void declare_fake_devices(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void (*add)(void *, size_t, int) = NULL;

    if (h != NULL)
        *(void **)&add = dlsym(h, "fake_cuda_add_range");
    if (add == NULL)
        fail("setup", "the fake libcuda.so.1 is not first on "
                      "LD_LIBRARY_PATH");
    add(fake_mem[0], sizeof(fake_mem[0]), 0);
    add(fake_mem[1], sizeof(fake_mem[1]), 1);
    /* The handle stays open: hvd's dlopen shares it. */
}

static int mode_fake(const char *build) {
    float host[16] = {0};
    int cuda = strcmp(build, "nocuda") != 0;
    const void *gs[2];
    void *gr[2];
    size_t gc[2] = {4, 4};

    declare_fake_devices();
    expect("hvd_init", hvd_init(), HVD_OK, NULL);
    g_rank = hvd_rank();
    int mine = hvd_local_rank() % 2, other = (mine + 1) % 2;
    float *dev = (float *)(void *)fake_mem[mine];
    float *odev = (float *)(void *)fake_mem[other];

    expect("mixed", hvd_allreduce("mixed", host, dev, 4, HVD_FLOAT32, HVD_SUM),
           HVD_ERR_INVALID_ARG, "host memory", "CUDA device", NULL);
    gs[0] = host;
    gs[1] = dev;
    gr[0] = host;
    gr[1] = dev;
    expect("grouped mixed",
           hvd_grouped_allreduce("gmixed", 2, gs, gr, gc, HVD_FLOAT32, HVD_SUM),
           HVD_ERR_INVALID_ARG, "sendbufs[1]", NULL);
    /* Empty buffers are not looked at. */
    expect("empty", hvd_allreduce("empty", host, dev, 0, HVD_FLOAT32, HVD_SUM),
           HVD_OK, NULL);
    if (!cuda) {
        expect("allreduce",
               hvd_allreduce("dev", dev, dev, 4, HVD_FLOAT32, HVD_SUM),
               HVD_ERR_UNSUPPORTED, "built without CUDA", NULL);
        expect("broadcast", hvd_broadcast("devb", dev, 4, HVD_FLOAT32, 0),
               HVD_ERR_UNSUPPORTED, "built without CUDA", NULL);
        expect("allgather",
               hvd_allgather("devg", dev, dev + 64, 4, HVD_FLOAT32),
               HVD_ERR_UNSUPPORTED, "built without CUDA", NULL);
    } else {
        char where[64];
        snprintf(where, sizeof(where), "on CUDA device %d", mine);
        expect("other device",
               hvd_allreduce("odev", odev, odev, 4, HVD_FLOAT32, HVD_SUM),
               HVD_ERR_INVALID_ARG, where, "HVD_GPU_DEVICE", NULL);
        /* Ranks that disagree on host or device memory for one name: the
         * coordinator says so before any GPU is used. */
        if (hvd_size() > 1) {
            float *buf = hvd_rank() == 0 ? host : dev;
            expect("host or device",
                   hvd_allreduce("where", buf, buf, 4, HVD_FLOAT32, HVD_SUM),
                   HVD_ERR_MISMATCH, "on the GPU", NULL);
        }
        /* The engine tries the GPU, every rank fails alike. */
        expect("allreduce",
               hvd_allreduce("dev", dev, dev, 4, HVD_FLOAT32, HVD_SUM),
               HVD_ERR_UNSUPPORTED, "device tensors cannot be used",
               "CUDA setup failed on rank(s) 0", NULL);
        expect("broadcast", hvd_broadcast("devb", dev, 4, HVD_FLOAT32, 0),
               HVD_ERR_UNSUPPORTED, "device tensors cannot be used", NULL);
    }
    host_collectives();
    expect("hvd_shutdown", hvd_shutdown(), HVD_OK, NULL);
    return 0;
}

static int mode_nccl(void) {
    declare_fake_devices();
    setenv("HVD_TRANSPORT", "nccl", 1);
    expect("HVD_TRANSPORT=nccl", hvd_init(), HVD_ERR_UNSUPPORTED,
           "HVD_TRANSPORT=nccl", NULL);
    return 0;
}

int main(int argc, char **argv) {
    int rc;

    if (argc != 3 ||
        (strcmp(argv[2], "nocuda") != 0 && strcmp(argv[2], "cuda") != 0 &&
         strcmp(argv[2], "nccl") != 0)) {
        fprintf(stderr, "usage: %s nogpu|fake|nccl nocuda|cuda|nccl\n",
                argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "nogpu") == 0)
        rc = mode_nogpu(argv[2]);
    else if (strcmp(argv[1], "fake") == 0)
        rc = mode_fake(argv[2]);
    else if (strcmp(argv[1], "nccl") == 0)
        rc = mode_nccl();
    else
        return 2;
    if (rc == 0)
        printf("PASS gpu_nodev %s rank %d\n", argv[1], g_rank);
    return rc;
}
