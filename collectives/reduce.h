/*
 * Reduction kernels: dst[i] = a[i] OP b[i] for every dtype and op.
 *
 * float16 and bfloat16 are widened to float32, combined, and rounded back
 * to nearest-even. Integer arithmetic wraps (two's complement), as in MPI
 * and NCCL; it is done on unsigned types so it is defined behaviour.
 * HVD_AVERAGE combines like HVD_SUM; the division by the number of ranks
 * is hvd_reduce_scale_div(), applied once to the final sum.
 *
 * dst may be the same pointer as a or b (in place); other overlaps are not
 * allowed. The loops are written so the compiler vectorizes them.
 */
#ifndef HVD_COLLECTIVES_REDUCE_H
#define HVD_COLLECTIVES_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"
#include "transport/base/dtype.h"

/*
 * dst[i] = a[i] op b[i] for i < count. An invalid dtype or op, or count 0,
 * does nothing (callers validate first); with count 0 the pointers may be
 * NULL. Thread-safe: no state.
 */
void hvd_reduce(void *dst, const void *a, const void *b, size_t count,
                hvd_dtype dtype, hvd_op op);

/*
 * buf[i] = buf[i] / divisor for i < count: float types divide in their own
 * precision (float16/bfloat16 in float32, rounded back), integer types
 * truncate toward zero (int8/int32/int64 signed, uint8 unsigned).
 * divisor >= 1; a divisor below 1 breaks the contract and is ignored (no
 * change) rather than dividing by zero.
 */
void hvd_reduce_scale_div(void *buf, size_t count, hvd_dtype dtype,
                          int divisor);

/*
 * Fills buf with count copies of op's neutral element (x op e == x): what a
 * rank that has joined contributes to the others' allreduces.
 */
void hvd_reduce_fill_neutral(void *buf, size_t count, hvd_dtype dtype,
                             hvd_op op);

/*
 * memcpy with non-temporal stores where the CPU has them (x86-64): dst
 * bypasses the caches and costs no read for ownership. For a result
 * written once and not read soon. The stores are fenced before it returns,
 * so whatever the caller does next (a message saying the data is there) is
 * seen after them. Other CPUs: memcpy.
 */
void hvd_copy_stream(void *dst, const void *src, size_t bytes);

/*
 * Conversions, bit-exact: round to nearest even (assumes the FPU's default
 * rounding mode), subnormals kept, overflow gives inf, NaN stays NaN (its
 * quiet bit set, sign and top payload bits kept).
 */
float hvd_half_to_float(uint16_t h);
uint16_t hvd_float_to_half(float f);
float hvd_bfloat16_to_float(uint16_t b);
uint16_t hvd_float_to_bfloat16(float f);

#endif
