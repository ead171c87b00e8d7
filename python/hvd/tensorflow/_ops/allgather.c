/*
 * HvdAllgather: the shapes first, then the data (an operation in two
 * libhvd steps, twostep.c). Every rank's first dimension may differ, as in
 * Horovod: the data are then gathered padded to the largest and unpadded
 * into the output on the helper thread. Executed eagerly on the CPU, both
 * steps are libhvd's blocking calls on the calling thread (twostep.c).
 */
#include "python/hvd/tensorflow/_ops/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gather {
    twostep t; /* first: a gather is its twostep */
    TF_Tensor *in;
    int nranks;
    int64_t mine[META];
    int64_t *metas; /* META per rank */
    size_t row;     /* elements (or bytes) per first-dimension slice */
    size_t esize;   /* bytes of one moved element */
    int64_t most;   /* the largest first dimension */
    void *send_pad; /* padded copies, when the first dimensions differ */
    void *recv_pad;
    void *out_data;
} gather;

static void gather_release(twostep *t) {
    gather *g = (gather *)t;

    free(g->metas);
    free(g->send_pad);
    free(g->recv_pad);
    free(g);
}

/* HVD_OK when every rank's shape agrees with this one's after the first
 * dimension, with the output's first dimension in *total_out and whether
 * every rank's first dimension is this one's in *same_out (the largest in
 * g->most); else why not, in why. */
static hvd_status gather_agree(gather *g, int64_t *total_out, int *same_out,
                               char *why, size_t len) {
    int64_t total = 0;
    int same = 1, nd = (int)g->mine[0];

    for (int r = 0; r < g->nranks; r++) {
        const int64_t *m = g->metas + (size_t)r * META;
        int agree = m[0] == g->mine[0] && m[1] == g->mine[1];

        for (int d = 1; agree && d < nd; d++)
            agree = m[2 + d] == g->mine[2 + d];
        if (!agree) {
            char a[256], b[256];

            hvd_tf_describe_meta(g->metas, a, sizeof(a));
            hvd_tf_describe_meta(m, b, sizeof(b));
            snprintf(why, len,
                     "ranks disagree on the type or the dimensions after the "
                     "first: rank 0: %s; rank %d: %s",
                     a, r, b);
            return HVD_ERR_MISMATCH;
        }
        total += m[2];
        if (m[2] > g->most)
            g->most = m[2];
        same = same && m[2] == g->mine[2];
    }
    *total_out = total;
    *same_out = same;
    return HVD_OK;
}

/* The padded copies, when the first dimensions differ: this rank's count
 * elements padded to the largest first dimension, and room for every
 * rank's. */
static hvd_status gather_pad(gather *g, size_t count, char *why, size_t len) {
    size_t slot = (size_t)g->most * g->row;

    g->send_pad = calloc(slot ? slot : 1, g->esize);
    g->recv_pad = calloc(slot * (size_t)g->nranks + 1, g->esize);
    if (g->send_pad == NULL || g->recv_pad == NULL)
        return hvd_tf_no_memory(why, len);
    memcpy(g->send_pad, hvd_tf_data_of(g->in), count * g->esize);
    return HVD_OK;
}

/* One step's allgather: libhvd's blocking call for a blocking kernel
 * (twostep.c then runs the next on this thread), else its asynchronous
 * one. */
static hvd_status gather_submit(const twostep *t, const char *name,
                                const void *send, void *recv, size_t count,
                                hvd_dtype type, hvd_handle *h) {
    if (hvd_tf_twostep_blocking(t))
        return hvd_ps_allgather(t->k.ps, name, send, recv, count, type);
    return hvd_ps_allgather_async(t->k.ps, name, send, recv, count, type, h);
}

/* The shapes are in: checks that they agree after the first dimension,
 * makes the output and gathers the data (helper thread). */
static void gather_data(gather *g) {
    pending *p = g->t.p;
    TF_DataType tf_type = TF_TensorType(g->in);
    int64_t dims[MAX_DIMS], total = 0;
    char nbuf[NAME_MAX_LEN + 8], why[2048] = "";
    const char *name = hvd_tf_step_name(&g->t, "data", nbuf, sizeof(nbuf));
    int same = 1, nd = (int)g->mine[0];
    hvd_dtype type = HVD_UINT8;
    hvd_handle h = NULL;
    TF_Tensor *out;
    size_t count;
    hvd_status st = HVD_OK;

    CHECK_HVD_GOTO(gather_agree(g, &total, &same, why, sizeof(why)), st,
                   fail_kernel);
    for (int d = 0; d < nd; d++)
        dims[d] = g->mine[2 + d];
    dims[0] = total;
    /* One first-dimension slice, in moved elements (as bytes when hvd has
     * no type of this one's width and kind). */
    g->row = 1;
    for (int d = 1; d < nd; d++)
        g->row *= (size_t)dims[d];
    if (hvd_tf_type_of(tf_type) >= 0)
        type = (hvd_dtype)hvd_tf_type_of(tf_type);
    else
        g->row *= TF_DataTypeSize(tf_type);
    g->esize = hvd_dtype_size(type);
    count = (size_t)g->mine[2] * g->row;
    out = TF_AllocateOutput(p->ctx, 0, tf_type, dims, nd,
                            (size_t)total * g->row * g->esize, p->s);
    CHECK_TF_GOTO(p->s, fail_kernel);
    hvd_tf_pending_keep(p, out);
    g->out_data = hvd_tf_data_of(out);
    g->t.step = 2;
    if (!same) {
        CHECK_HVD_GOTO(gather_pad(g, count, why, sizeof(why)), st, fail_kernel);
        count = (size_t)g->most * g->row;
    }
    st = gather_submit(&g->t, name, same ? hvd_tf_data_of(g->in) : g->send_pad,
                       same ? g->out_data : g->recv_pad, count, type, &h);
    CHECK_HVD_GOTO(hvd_tf_twostep_submitted(&g->t, st, h, why, sizeof(why)), st,
                   fail_kernel);
    return;
fail_kernel:
    hvd_tf_twostep_end(&g->t, st, why);
}

/* The data are in: unpads them if needed and ends the kernel. */
static void gather_finish(gather *g) {
    if (g->recv_pad != NULL) {
        char *dst = g->out_data;
        size_t slot = (size_t)g->most * g->row * g->esize;

        for (int r = 0; r < g->nranks; r++) {
            size_t n =
                (size_t)g->metas[(size_t)r * META + 2] * g->row * g->esize;
            memcpy(dst, (char *)g->recv_pad + (size_t)r * slot, n);
            dst += n;
        }
    }
    hvd_tf_twostep_end(&g->t, HVD_OK, NULL);
}

static void gather_run(job *j) {
    gather *g = (gather *)j;

    if (g->t.st != HVD_OK)
        hvd_tf_twostep_end(&g->t, g->t.st, g->t.error);
    else if (g->t.step == 1)
        gather_data(g);
    else
        gather_finish(g);
}

void hvd_tf_allgather_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    gather *g = hvd_tf_twostep_new(sizeof(*g), ctx, done, k, "allgather", 2,
                                   gather_run, gather_release);
    char nbuf[NAME_MAX_LEN + 8], why[2048] = "";
    TF_Tensor *in = NULL;
    hvd_handle h = NULL;
    hvd_status st = HVD_OK;
    int nd;

    if (g == NULL)
        return;
    TF_GetInput(ctx, 0, &in, g->t.p->s);
    CHECK_TF_GOTO(g->t.p->s, fail_kernel);
    hvd_tf_pending_keep(g->t.p, in);
    g->in = in;
    nd = TF_NumDims(in);
    if (nd < 1 || nd > MAX_DIMS) {
        snprintf(why, sizeof(why),
                 "an allgathered tensor needs 1 to %d dimensions; this one "
                 "has %d",
                 MAX_DIMS, nd);
        st = HVD_ERR_INVALID_ARG;
        goto fail_kernel;
    }
    CHECK_HVD_GOTO(hvd_tf_not_member(k, why, sizeof(why)), st, fail_kernel);
    g->nranks = hvd_tf_set_size(k->ps);
    g->metas = calloc((size_t)g->nranks * META, sizeof(int64_t));
    if (g->metas == NULL) {
        st = hvd_tf_no_memory(why, sizeof(why));
        goto fail_kernel;
    }
    g->mine[0] = nd;
    g->mine[1] = (int64_t)TF_TensorType(in);
    hvd_tf_dims_of(in, &g->mine[2]);
    st = gather_submit(&g->t,
                       hvd_tf_step_name(&g->t, "shape", nbuf, sizeof(nbuf)),
                       g->mine, g->metas, META, HVD_INT64, &h);
    CHECK_HVD_GOTO(hvd_tf_twostep_submitted(&g->t, st, h, why, sizeof(why)), st,
                   fail_kernel);
    return;
fail_kernel:
    hvd_tf_twostep_end(&g->t, st, why);
}
