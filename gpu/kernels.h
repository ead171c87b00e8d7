/*
 * CUDA kernels (gpu/kernels.cu), callable from C. Each one is queued on
 * stream (a cudaStream_t) and returns the cudaError_t of the launch (0:
 * queued; errors of the run show up later on the stream).
 *
 * The reductions give bitwise the results of collectives/reduce.c for the
 * same inputs: the same float16/bfloat16 conversions (ported bit for bit:
 * widened to float32, combined, rounded to nearest even), IEEE float
 * arithmetic without contraction or flush-to-zero, the same MIN/MAX
 * selects (NaN propagates), wrapping integer arithmetic, truncating
 * integer division, and the host CPU's NaN rules for sums, products and
 * quotients (a NaN operand comes out quieted, first operand first; a NaN
 * made from numbers is the CPU's default NaN). Only which NaN comes out
 * when both operands are NaNs may differ, as it does between compilers.
 */
#ifndef HVD_GPU_KERNELS_H
#define HVD_GPU_KERNELS_H

#include <stddef.h>

#include "hvd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = a[i] op b[i] (dst may be a or b); HVD_AVERAGE sums. */
int hvd_cuda_reduce(void *dst, const void *a, const void *b, size_t count,
                    hvd_dtype dtype, hvd_op op, void *stream);

/* buf[i] /= divisor, as hvd_reduce_scale_div(). */
int hvd_cuda_scale_div(void *buf, size_t count, hvd_dtype dtype, int divisor,
                       void *stream);

/* count copies of op's neutral element, as hvd_reduce_fill_neutral(). */
int hvd_cuda_fill_neutral(void *buf, size_t count, hvd_dtype dtype, hvd_op op,
                          void *stream);

/* One copy of a batch: bytes from src to dst, device memory both, not
 * overlapping. */
typedef struct hvd_cuda_copy {
    void *dst;
    const void *src;
    size_t bytes;
} hvd_cuda_copy;

/* Copies per kernel launch (they travel as kernel parameters). */
#define HVD_CUDA_COPY_BATCH 64

/*
 * Runs n copies with one kernel launch per HVD_CUDA_COPY_BATCH of them:
 * how the engine packs tensors into the device fusion buffer and unpacks
 * them, instead of one cudaMemcpyAsync (a few microseconds each) per
 * tensor. Each copy moves 16, 8, 4, 2 or 1 bytes per load, the most its
 * two addresses' alignment allows.
 */
int hvd_cuda_copy_batch(const hvd_cuda_copy *items, size_t n, void *stream);

/*
 * The same element code run on the CPU, with the GPU's canonical NaN for
 * every NaN an operation makes (so the NaN rules above are exercised as
 * on the GPU): what unit.kernels_host compares with collectives/reduce.c
 * where there is no GPU.
 */
void hvd_cuda_reduce_emulated(void *dst, const void *a, const void *b,
                              size_t count, hvd_dtype dtype, hvd_op op);
void hvd_cuda_scale_div_emulated(void *buf, size_t count, hvd_dtype dtype,
                                 int divisor);

#ifdef __cplusplus
}
#endif

#endif
