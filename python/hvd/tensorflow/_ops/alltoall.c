/*
 * HvdAlltoall: the shapes first, then the data (an operation in two
 * libhvd steps, twostep.c).
 *
 * The output's first dimension is the sum of the rows every rank sends
 * this one, which only those ranks know: a first alltoall sends each rank
 * a META record (the number of dimensions, the type, the rows it gets and
 * the other dimensions), the second moves the data into an output of the
 * size the records add up to. A rank whose input is invalid (its splits,
 * its rank) still takes part in the first step, with a record marked
 * invalid, so that every rank fails instead of waiting for it.
 */
#include "python/hvd/tensorflow/_ops/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct a2a {
    twostep t; /* first: an a2a is its twostep */
    TF_Tensor *in;
    int nranks;
    int64_t rows;       /* the input's first dimension */
    int64_t *splits;    /* rows to each rank */
    int64_t *sends;     /* META per rank, sent */
    int64_t *metas;     /* META per rank, received */
    size_t *counts;     /* moved elements to each rank */
    size_t row;         /* moved elements per row */
    hvd_dtype type;     /* as moved */
    char invalid[1024]; /* why this rank's input is invalid, or "" */
} a2a;

static void a2a_release(twostep *t) {
    a2a *a = (a2a *)t;

    free(a->splits);
    free(a->sends);
    free(a->metas);
    free(a->counts);
    free(a);
}

/* HVD_OK when every rank's record is valid and agrees with this one's
 * after the first dimension, with the rows this rank gets in *total_out;
 * else why not, in why. */
static hvd_status a2a_agree(const a2a *a, int64_t *total_out, char *why,
                            size_t len) {
    const int64_t *mine = a->sends; /* the same but for the rows */
    int64_t total = 0;
    int nd = (int)mine[0];

    if (a->invalid[0] != '\0') {
        snprintf(why, len, "%s", a->invalid);
        return HVD_ERR_INVALID_ARG;
    }
    for (int r = 0; r < a->nranks; r++) {
        const int64_t *m = a->metas + (size_t)r * META;
        int agree = m[0] == mine[0] && m[1] == mine[1];
        char x[256], y[256];
        int64_t mm[META];

        if (m[0] < 0) {
            snprintf(why, len,
                     "rank %d of the set passed an invalid alltoall (its "
                     "error says why)",
                     r);
            return HVD_ERR_INVALID_ARG;
        }
        for (int d = 1; agree && d < nd; d++)
            agree = m[2 + d] == mine[2 + d];
        if (!agree) {
            memcpy(mm, mine, sizeof(mm));
            mm[2] = a->rows;
            hvd_tf_describe_meta(mm, x, sizeof(x));
            hvd_tf_describe_meta(m, y, sizeof(y));
            snprintf(why, len,
                     "ranks disagree on the type or the dimensions after the "
                     "first: this rank: %s; rank %d of the set: %s (rows "
                     "for this rank)",
                     x, r, y);
            return HVD_ERR_MISMATCH;
        }
        total += m[2];
    }
    *total_out = total;
    return HVD_OK;
}

/* One step's alltoall: libhvd's blocking call for a blocking kernel
 * (twostep.c then runs the next on this thread), else its asynchronous
 * one. */
static hvd_status a2a_submit(const twostep *t, const char *name,
                             const void *send, size_t count,
                             const size_t *counts, void *recv, size_t cap,
                             hvd_dtype type, hvd_handle *h) {
    if (hvd_tf_twostep_blocking(t))
        return hvd_ps_alltoall(t->k.ps, name, send, count, counts, recv, cap,
                               NULL, type);
    return hvd_ps_alltoall_async(t->k.ps, name, send, count, counts, recv, cap,
                                 NULL, type, h);
}

/* The records are in: checks them, makes the outputs and moves the data
 * (helper thread). */
static void a2a_data(a2a *a) {
    pending *p = a->t.p;
    const int64_t *mine = a->sends;
    int nd = (int)mine[0];
    int64_t dims[MAX_DIMS], total = 0, count;
    char nbuf[NAME_MAX_LEN + 8], why[2048] = "";
    TF_Tensor *out, *rsplits;
    hvd_handle h = NULL;
    hvd_status st = HVD_OK;

    CHECK_HVD_GOTO(a2a_agree(a, &total, why, sizeof(why)), st, fail_kernel);
    for (int d = 1; d < nd; d++)
        dims[d] = mine[2 + d];
    dims[0] = total;
    out = TF_AllocateOutput(p->ctx, 0, TF_TensorType(a->in), dims, nd,
                            (size_t)total * a->row * hvd_dtype_size(a->type),
                            p->s);
    CHECK_TF_GOTO(p->s, fail_kernel);
    hvd_tf_pending_keep(p, out);
    dims[0] = a->nranks;
    rsplits = TF_AllocateOutput(p->ctx, 1, TF_INT32, dims, 1,
                                (size_t)a->nranks * sizeof(int32_t), p->s);
    CHECK_TF_GOTO(p->s, fail_kernel);
    for (int r = 0; r < a->nranks; r++)
        ((int32_t *)TF_TensorData(rsplits))[r] =
            (int32_t)a->metas[(size_t)r * META + 2];
    TF_DeleteTensor(rsplits);
    a->t.step = 2;
    count = a->rows * (int64_t)a->row;
    st = a2a_submit(&a->t, hvd_tf_step_name(&a->t, "data", nbuf, sizeof(nbuf)),
                    hvd_tf_data_of(a->in), (size_t)count, a->counts,
                    hvd_tf_data_of(out), (size_t)total * a->row, a->type, &h);
    CHECK_HVD_GOTO(hvd_tf_twostep_submitted(&a->t, st, h, why, sizeof(why)), st,
                   fail_kernel);
    return;
fail_kernel:
    hvd_tf_twostep_end(&a->t, st, why);
}

static void a2a_run(job *j) {
    a2a *a = (a2a *)j;

    if (a->t.st != HVD_OK)
        hvd_tf_twostep_end(&a->t, a->t.st, a->t.error);
    else if (a->t.step == 1)
        a2a_data(a);
    else
        hvd_tf_twostep_end(&a->t, HVD_OK, NULL);
}

/* The rows to each rank from the splits input (none: the rows evenly);
 * "" in a->invalid when they are valid, else why not, in Horovod's words. */
static void a2a_splits(a2a *a, TF_Tensor *sp) {
    int64_t n = TF_TensorElementCount(sp), sum = 0;
    const int32_t *v = TF_TensorData(sp);

    if (n == 0) {
        if (a->rows % a->nranks != 0) {
            snprintf(a->invalid, sizeof(a->invalid),
                     "splits not provided, but the first dimension of the "
                     "tensor (%lld) is not an even multiple of the number of "
                     "workers (%d)",
                     (long long)a->rows, a->nranks);
            return;
        }
        for (int r = 0; r < a->nranks; r++)
            a->splits[r] = a->rows / a->nranks;
        return;
    }
    if (n != a->nranks) {
        snprintf(a->invalid, sizeof(a->invalid),
                 "Number of entries in splits (%lld) does not equal number "
                 "of workers (%d)",
                 (long long)n, a->nranks);
        return;
    }
    for (int r = 0; r < a->nranks; r++) {
        if (v[r] < 0) {
            snprintf(a->invalid, sizeof(a->invalid),
                     "splits must not be negative (entry %d is %d)", r,
                     (int)v[r]);
            return;
        }
        a->splits[r] = v[r];
        sum += v[r];
    }
    if (sum > a->rows)
        snprintf(a->invalid, sizeof(a->invalid),
                 "Sum of splits entries (%lld) is greater than the first "
                 "dimension of tensor (%lld)",
                 (long long)sum, (long long)a->rows);
}

/* The per-rank arrays of a's nranks members. */
static hvd_status a2a_alloc(a2a *a, char *why, size_t len) {
    a->splits = calloc((size_t)a->nranks, sizeof(int64_t));
    a->sends = calloc((size_t)a->nranks * META, sizeof(int64_t));
    a->metas = calloc((size_t)a->nranks * META, sizeof(int64_t));
    a->counts = calloc((size_t)a->nranks, sizeof(size_t));
    if (a->splits == NULL || a->sends == NULL || a->metas == NULL ||
        a->counts == NULL)
        return hvd_tf_no_memory(why, len);
    return HVD_OK;
}

/* This rank's record for each member (a->sends) and the elements it sends
 * each (a->counts), from the input in and the splits sp; where they are
 * invalid (a->invalid says why), records marked so (-1 dimensions) and
 * nothing sent, so that every rank fails. */
static void a2a_records(a2a *a, TF_Tensor *in, TF_Tensor *sp) {
    int64_t mine[META] = {0};
    int nd = TF_NumDims(in);

    if (nd < 1 || nd > MAX_DIMS) {
        snprintf(a->invalid, sizeof(a->invalid),
                 "an alltoall needs a tensor of 1 to %d dimensions; this one "
                 "has %d",
                 MAX_DIMS, nd);
    } else {
        int ht = hvd_tf_type_of(TF_TensorType(in));

        a->rows = TF_Dim(in, 0);
        a->row = 1;
        for (int d = 1; d < nd; d++)
            a->row *= (size_t)TF_Dim(in, d);
        /* As bytes when hvd has no type of this one's width and kind. */
        a->type = ht >= 0 ? (hvd_dtype)ht : HVD_UINT8;
        if (ht < 0)
            a->row *= TF_DataTypeSize(TF_TensorType(in));
        a2a_splits(a, sp);
        mine[0] = nd;
        mine[1] = (int64_t)TF_TensorType(in);
        hvd_tf_dims_of(in, &mine[2]);
    }
    if (a->invalid[0] != '\0') {
        mine[0] = -1; /* every rank fails with this one */
        memset(a->splits, 0, (size_t)a->nranks * sizeof(int64_t));
    }
    for (int r = 0; r < a->nranks; r++) {
        memcpy(a->sends + (size_t)r * META, mine, sizeof(mine));
        a->sends[(size_t)r * META + 2] = a->splits[r];
        a->counts[r] = (size_t)a->splits[r] * a->row;
    }
}

void hvd_tf_alltoall_compute(void *kp, TF_OpKernelContext *ctx,
                             TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    a2a *a = hvd_tf_twostep_new(sizeof(*a), ctx, done, k, "alltoall", 4,
                                a2a_run, a2a_release);
    char nbuf[NAME_MAX_LEN + 8], why[2048] = "";
    TF_Tensor *in = NULL, *sp = NULL;
    hvd_handle h = NULL;
    hvd_status st = HVD_OK;

    if (a == NULL)
        return;
    TF_GetInput(ctx, 0, &in, a->t.p->s);
    CHECK_TF_GOTO(a->t.p->s, fail_kernel);
    hvd_tf_pending_keep(a->t.p, in);
    TF_GetInput(ctx, 1, &sp, a->t.p->s);
    CHECK_TF_GOTO(a->t.p->s, fail_kernel);
    hvd_tf_pending_keep(a->t.p, sp);
    a->in = in;
    CHECK_HVD_GOTO(hvd_tf_not_member(k, why, sizeof(why)), st, fail_kernel);
    a->nranks = hvd_tf_set_size(k->ps);
    CHECK_HVD_GOTO(a2a_alloc(a, why, sizeof(why)), st, fail_kernel);
    a2a_records(a, in, sp);
    st = a2a_submit(&a->t, hvd_tf_step_name(&a->t, "shape", nbuf, sizeof(nbuf)),
                    a->sends, (size_t)a->nranks * META, NULL, a->metas,
                    (size_t)a->nranks * META, HVD_INT64, &h);
    CHECK_HVD_GOTO(hvd_tf_twostep_submitted(&a->t, st, h, why, sizeof(why)), st,
                   fail_kernel);
    return;
fail_kernel:
    hvd_tf_twostep_end(&a->t, st, why);
}
