/*
 * The element types and reduction ops of the public API (hvd/types.h), as
 * every layer needs them: validity, names for sentences, sizes. The
 * reductions themselves are collectives/reduce.h's.
 */
#ifndef HVD_BASE_DTYPE_H
#define HVD_BASE_DTYPE_H

#include <stddef.h>

#include "hvd/types.h"

/* Returns 1 if dtype/op are valid values of their enums, else 0;
 * hvd_op_valid: the element-wise reductions (not HVD_ADASUM, which is an
 * allreduce of its own, collectives/adasum.c). */
int hvd_dtype_valid(hvd_dtype dtype);
int hvd_op_valid(hvd_op op);
/* Lower-case names ("float16", "sum"); "invalid" for an invalid value,
 * never NULL. */
const char *hvd_dtype_name(hvd_dtype dtype);
const char *hvd_op_name(hvd_op op);
/* hvd_dtype_size (bytes of one element, 0 if invalid) is declared in
 * hvd/types.h and defined in dtype.c. */

#endif
