/*
 * The few CUDA runtime calls tests/gpu/test_gpu.c makes, over the
 * simulated GPU (sim_gpu.c): "device memory" is host memory registered
 * with the stand-in driver (fake_libcuda.c), which must be first on
 * LD_LIBRARY_PATH.
 */
#ifndef HVD_TESTS_SIM_CUDART_H
#define HVD_TESTS_SIM_CUDART_H

#include <stddef.h>

typedef enum { cudaSuccess = 0, cudaErrorSim = 999 } cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                       enum cudaMemcpyKind kind);
const char *cudaGetErrorString(cudaError_t e);

#endif
