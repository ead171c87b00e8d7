#include "sim_cudart.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int current;
static void (*add_range)(void *, size_t, int);
static void (*remove_range)(void *);

/* The stand-in driver, or exit: a simulated run without it would test
 * nothing. */
static void driver(void) {
    void *h;

    if (add_range != NULL)
        return;
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) {
        *(void **)&add_range = dlsym(h, "fake_cuda_add_range");
        *(void **)&remove_range = dlsym(h, "fake_cuda_remove_range");
    }
    if (add_range == NULL || remove_range == NULL) {
        printf("FAIL: the stand-in libcuda.so.1 (fake_libcuda.c) is not "
               "first on LD_LIBRARY_PATH\n");
        exit(1);
    }
}

cudaError_t cudaGetDeviceCount(int *count) {
    driver();
    *count = 2;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    current = device;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    driver();
    *p = malloc(bytes);
    if (*p == NULL)
        return cudaErrorSim;
    add_range(*p, bytes, current);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    driver();
    remove_range(p);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                       enum cudaMemcpyKind kind) {
    (void)kind;
    if (bytes > 0)
        memmove(dst, src, bytes);
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : "simulated error";
}
