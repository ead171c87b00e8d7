#include "api/runtime/opdesc.h"

#include <stdio.h>
#include <string.h>

#include "transport/base/dtype.h"

const char *hvd_kind_name(hvd_kind kind) {
    static const char *const names[HVD_KIND_COUNT] = {
        [HVD_KIND_ALLREDUCE] = "allreduce",
        [HVD_KIND_BROADCAST] = "broadcast",
        [HVD_KIND_ALLGATHER] = "allgather",
        [HVD_KIND_BARRIER] = "barrier",
        [HVD_KIND_JOIN] = "join",
        [HVD_KIND_CALL] = "call",
        [HVD_KIND_ALLTOALL] = "alltoall",
        [HVD_KIND_REDUCESCATTER] = "reducescatter",
        [HVD_KIND_PSET] = "process set",
    };
    return (unsigned)kind < HVD_KIND_COUNT ? names[kind] : "unknown";
}

int hvd_kind_reduces(hvd_kind kind) {
    return kind == HVD_KIND_ALLREDUCE || kind == HVD_KIND_REDUCESCATTER;
}

/* The kinds that move data of a dtype. */
static int has_dtype(hvd_kind kind) {
    return kind <= HVD_KIND_ALLGATHER || kind == HVD_KIND_ALLTOALL ||
           kind == HVD_KIND_REDUCESCATTER;
}

/* Equal but for the counts' values. */
static int same_kind_of_op(const hvd_opdesc *a, const hvd_opdesc *b) {
    if (a->kind != b->kind || a->ncounts != b->ncounts || a->pset != b->pset)
        return 0;
    if (a->kind == HVD_KIND_PSET && (a->op != b->op || a->root != b->root))
        return 0;
    if (hvd_kind_reduces(a->kind) && a->op != b->op)
        return 0;
    if (a->kind == HVD_KIND_BROADCAST && a->root != b->root)
        return 0;
    if (has_dtype(a->kind) && a->dtype != b->dtype)
        return 0;
    return a->mem == b->mem;
}

int hvd_opdesc_agree(const hvd_opdesc *a, const hvd_opdesc *b) {
    if (a->kind == HVD_KIND_ALLTOALL)
        return same_kind_of_op(a, b);
    return hvd_opdesc_equal(a, b);
}

uint64_t hvd_opdesc_unit(const hvd_opdesc *d) {
    uint64_t unit = 1;

    for (int i = 1; i < d->ndims; i++)
        unit *= (uint64_t)d->dims[i];
    return unit;
}

int hvd_opdesc_equal(const hvd_opdesc *a, const hvd_opdesc *b) {
    if (!same_kind_of_op(a, b))
        return 0;
    for (size_t i = 0; i < a->ncounts; i++)
        if (a->counts[i] != b->counts[i])
            return 0;
    if (a->ndims != b->ndims)
        return 0;
    for (int i = 0; i < a->ndims; i++)
        if (a->dims[i] != b->dims[i])
            return 0;
    return 1;
}

void hvd_opdesc_set_shape(hvd_opdesc *d, int ndim, const int64_t *shape) {
    d->ndims = 0;
    if (ndim < 2)
        return;
    for (int i = 0; i < ndim; i++) {
        if (i < HVD_DESC_MAX_DIMS)
            d->dims[i] = shape[i];
        else
            d->dims[HVD_DESC_MAX_DIMS - 1] *= shape[i];
    }
    d->ndims = ndim < HVD_DESC_MAX_DIMS ? ndim : HVD_DESC_MAX_DIMS;
}

uint64_t hvd_opdesc_total(const hvd_opdesc *d) {
    uint64_t n = 0;

    for (size_t i = 0; i < d->ncounts; i++)
        n += d->counts[i];
    return n;
}

void hvd_opdesc_format(const hvd_opdesc *d, char *out, size_t outlen) {
    int n = 0;

    switch (d->kind) {
    case HVD_KIND_ALLREDUCE:
        n = snprintf(out, outlen, "allreduce %s %s", hvd_dtype_name(d->dtype),
                     hvd_op_name(d->op));
        break;
    case HVD_KIND_BROADCAST:
        n = snprintf(out, outlen, "broadcast %s root %d",
                     hvd_dtype_name(d->dtype), d->root);
        break;
    case HVD_KIND_ALLGATHER:
        n = snprintf(out, outlen, "allgather %s", hvd_dtype_name(d->dtype));
        break;
    case HVD_KIND_ALLTOALL:
        n = snprintf(out, outlen, "alltoall %s", hvd_dtype_name(d->dtype));
        break;
    case HVD_KIND_REDUCESCATTER:
        n = snprintf(out, outlen, "reducescatter %s %s",
                     hvd_dtype_name(d->dtype), hvd_op_name(d->op));
        break;
    case HVD_KIND_PSET:
        if ((int)d->op == HVD_PSET_REMOVE) {
            snprintf(out, outlen, "remove process set %d", d->root);
            return;
        }
        n = snprintf(out, outlen, "create process set of ranks");
        for (size_t i = 0; n > 0 && (size_t)n < outlen && i < d->ncounts; i++) {
            int m = snprintf(out + n, outlen - (size_t)n, "%s%llu",
                             i ? "," : " ", (unsigned long long)d->counts[i]);
            if (m < 0)
                return;
            n += m;
        }
        return;
    default:
        snprintf(out, outlen, "%s", hvd_kind_name(d->kind));
        return;
    }
    if (n < 0 || (size_t)n >= outlen)
        return;
    if (d->mem == HVD_MEM_DEVICE) {
        int m = snprintf(out + n, outlen - (size_t)n, " on the GPU");
        if (m < 0 || (size_t)(n + m) >= outlen)
            return;
        n += m;
    }
    if (d->pset != 0) {
        int m = snprintf(out + n, outlen - (size_t)n, " in process set %d",
                         d->pset);
        if (m < 0 || (size_t)(n + m) >= outlen)
            return;
        n += m;
    }
    if (d->ncounts == 1 && d->ndims > 0) {
        int m = snprintf(out + n, outlen - (size_t)n, " shape [");
        for (int i = 0; m > 0 && i < d->ndims && (size_t)(n + m) < outlen;
             i++) {
            n += m;
            m = snprintf(out + n, outlen - (size_t)n, "%s%lld", i ? ", " : "",
                         (long long)d->dims[i]);
        }
        if (m > 0 && (size_t)(n + m) < outlen)
            snprintf(out + n + m, outlen - (size_t)(n + m), "]");
        return;
    }
    if (d->ncounts == 1) {
        snprintf(out + n, outlen - (size_t)n, " count %llu",
                 (unsigned long long)d->counts[0]);
        return;
    }
    int m = snprintf(out + n, outlen - (size_t)n,
                     d->kind == HVD_KIND_ALLTOALL ? " splits " : " counts ");
    for (size_t i = 0; m > 0 && i < d->ncounts && (size_t)(n + m) < outlen;
         i++) {
        n += m;
        m = snprintf(out + n, outlen - (size_t)n, "%s%llu", i ? "," : "",
                     (unsigned long long)d->counts[i]);
    }
}
