/*
 * The collectives of one libhvd call per tensor: allreduce, grouped
 * allreduce, broadcast, reduce-scatter and grouped reduce-scatter
 * (asynchronous kernels; ops.h says how they run and end).
 */
#include "python/hvd/tensorflow/_ops/ops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Output i of p's kernel shaped as input i, in input i's memory where
 * TensorFlow can give it (nobody else reads that input: the reduction then
 * runs in place), else new; both are kept until the kernel ends. *in_out
 * is input i, the output itself when it was forwarded. This kernel's own
 * reference to the input is dropped before asking, or TensorFlow could
 * never forward it. A failure of TensorFlow's is left in p->s.
 */
static void in_and_out(pending *p, int i, TF_Tensor **in_out,
                       TF_Tensor **out_out) {
    int64_t dims[MAX_DIMS];
    TF_Tensor *probe = NULL, *in = NULL, *out;
    int n, forwarded = -1;

    TF_GetInput(p->ctx, i, &probe, p->s);
    if (TF_GetCode(p->s) != TF_OK)
        return;
    n = hvd_tf_dims_of(probe, dims);
    TF_DeleteTensor(probe);
    out = TF_ForwardInputOrAllocateOutput(p->ctx, &i, 1, i, dims, n, &forwarded,
                                          p->s);
    if (TF_GetCode(p->s) == TF_OK && forwarded != i)
        TF_GetInput(p->ctx, i, &in, p->s);
    hvd_tf_pending_keep(p, in);
    hvd_tf_pending_keep(p, out);
    if (TF_GetCode(p->s) != TF_OK)
        return;
    *in_out = in != NULL ? in : out; /* forwarded: in place */
    *out_out = out;
}

void hvd_tf_allreduce_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    pending *p = hvd_tf_pending_start(ctx, done, "allreduce", k, 2);
    TF_Tensor *in = NULL, *out = NULL;
    int64_t dims[SHAPE_DIMS];
    char why[1024] = "";
    hvd_handle h = NULL;
    hvd_status st = HVD_OK;

    if (p == NULL)
        return;
    in_and_out(p, 0, &in, &out);
    CHECK_TF_GOTO(p->s, fail_kernel);
    CHECK_HVD_GOTO(hvd_tf_device_ready(p, k, why, sizeof(why)), st,
                   fail_kernel);
    /* With its shape, so that ranks disagreeing on it fail as in Horovod. */
    if (hvd_tf_blocking(k)) {
        st = hvd_ps_allreduce_shaped(
            k->ps, hvd_tf_op_name(k), hvd_tf_data_of(in), hvd_tf_data_of(out),
            hvd_tf_shape_of(in, dims), dims,
            (hvd_dtype)hvd_tf_type_of(TF_TensorType(in)), (hvd_op)k->reduce_op);
        hvd_tf_ended(p, st);
        return;
    }
    st = hvd_ps_allreduce_shaped_async(
        k->ps, hvd_tf_op_name(k), hvd_tf_data_of(in), hvd_tf_data_of(out),
        hvd_tf_shape_of(in, dims), dims,
        (hvd_dtype)hvd_tf_type_of(TF_TensorType(in)), (hvd_op)k->reduce_op, &h);
    hvd_tf_submitted(p, st, h);
    return;
fail_kernel:
    hvd_tf_pending_fail(p, st, why);
}

void hvd_tf_grouped_compute(void *kp, TF_OpKernelContext *ctx,
                            TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    int n = TF_NumInputs(ctx);
    pending *p = hvd_tf_pending_start(ctx, done, "grouped_allreduce", k, 2 * n);
    const void **sends = calloc((size_t)n + 1, sizeof(*sends));
    void **recvs = calloc((size_t)n + 1, sizeof(*recvs));
    size_t *counts = calloc((size_t)n + 1, sizeof(*counts));
    TF_DataType type = TF_FLOAT;
    char why[1024] = "";
    hvd_handle h = NULL;
    hvd_status st = HVD_OK;

    if (p == NULL)
        goto free_arrays;
    if (sends == NULL || recvs == NULL || counts == NULL) {
        st = hvd_tf_no_memory(why, sizeof(why));
        goto free_arrays;
    }
    for (int i = 0; i < n; i++) {
        TF_Tensor *in = NULL, *out = NULL;

        in_and_out(p, i, &in, &out);
        CHECK_TF_GOTO(p->s, free_arrays);
        type = TF_TensorType(in);
        sends[i] = hvd_tf_data_of(in);
        recvs[i] = hvd_tf_data_of(out);
        counts[i] = (size_t)TF_TensorElementCount(in);
    }
    CHECK_HVD_GOTO(hvd_tf_device_ready(p, k, why, sizeof(why)), st,
                   free_arrays);
    if (hvd_tf_blocking(k)) {
        st = hvd_ps_grouped_allreduce(
            k->ps, hvd_tf_op_name(k), n, (const void *const *)sends,
            (void *const *)recvs, counts, (hvd_dtype)hvd_tf_type_of(type),
            (hvd_op)k->reduce_op);
        hvd_tf_ended(p, st);
        p = NULL;
        goto free_arrays;
    }
    st = hvd_ps_grouped_allreduce_async(
        k->ps, hvd_tf_op_name(k), n, (const void *const *)sends,
        (void *const *)recvs, counts, (hvd_dtype)hvd_tf_type_of(type),
        (hvd_op)k->reduce_op, &h);
    hvd_tf_submitted(p, st, h);
    p = NULL; /* libhvd ends the kernel now (or hvd_tf_submitted has) */
free_arrays:
    if (p != NULL)
        hvd_tf_pending_fail(p, st, why);
    free(counts);
    free(recvs);
    free(sends);
}

/* Element count and hvd type of a tensor moved as it is, or as bytes when
 * hvd has no type for it. */
static void moved_as(TF_Tensor *t, size_t *count, hvd_dtype *type) {
    int ht = hvd_tf_type_of(TF_TensorType(t));

    if (ht >= 0) {
        *count = (size_t)TF_TensorElementCount(t);
        *type = (hvd_dtype)ht;
    } else {
        *count = TF_TensorByteSize(t);
        *type = HVD_UINT8;
    }
}

void hvd_tf_broadcast_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    pending *p = hvd_tf_pending_start(ctx, done, "broadcast", k, 2);
    TF_Tensor *in = NULL, *out = NULL, *buf;
    int64_t dims[SHAPE_DIMS];
    char why[1024] = "";
    hvd_handle h = NULL;
    hvd_dtype type;
    size_t count;
    hvd_status st = HVD_OK;

    if (p == NULL)
        return;
    in_and_out(p, 0, &in, &out);
    CHECK_TF_GOTO(p->s, fail_kernel);
    CHECK_HVD_GOTO(hvd_tf_device_ready(p, k, why, sizeof(why)), st,
                   fail_kernel);
    /* The root sends its input; the others' output is overwritten. */
    buf = out;
    if (TF_TensorData(out) != TF_TensorData(in) && hvd_rank() == k->root_rank) {
        if (k->on_gpu) {
            /* Device memory: the root's output is its input, which the
             * broadcast only reads. */
            TF_SetOutput(ctx, 0, in, p->s);
            CHECK_TF_GOTO(p->s, fail_kernel);
            buf = in;
        } else {
            memcpy(hvd_tf_data_of(out), hvd_tf_data_of(in),
                   TF_TensorByteSize(in));
        }
    }
    moved_as(in, &count, &type);
    if (hvd_tf_blocking(k)) {
        if (count == (size_t)TF_TensorElementCount(in))
            st = hvd_ps_broadcast_shaped(
                k->ps, hvd_tf_op_name(k), hvd_tf_data_of(buf),
                hvd_tf_shape_of(in, dims), dims, type, k->root_rank);
        else
            st = hvd_ps_broadcast(k->ps, hvd_tf_op_name(k), hvd_tf_data_of(buf),
                                  count, type, k->root_rank);
        hvd_tf_ended(p, st);
        return;
    }
    if (count == (size_t)TF_TensorElementCount(in))
        st = hvd_ps_broadcast_shaped_async(
            k->ps, hvd_tf_op_name(k), hvd_tf_data_of(buf),
            hvd_tf_shape_of(in, dims), dims, type, k->root_rank, &h);
    else /* as bytes: the count is not the shape's */
        st = hvd_ps_broadcast_async(k->ps, hvd_tf_op_name(k),
                                    hvd_tf_data_of(buf), count, type,
                                    k->root_rank, &h);
    hvd_tf_submitted(p, st, h);
    return;
fail_kernel:
    hvd_tf_pending_fail(p, st, why);
}

/* ------------------------------------------------------------------ */
/* Reduce-scatter and grouped reduce-scatter                           */

/*
 * One kernel of n reduce-scatters (n = 1 for HvdReducescatter): each
 * input's first dimension is cut as Horovod cuts it (the first rows % size
 * members get one more row) and this rank's rows of the reduction are its
 * output. The parts are submitted together and the kernel ends when the
 * last one has finished.
 */
typedef struct scatter {
    pending *p;
    pthread_mutex_t lock;
    int left; /* parts still running, plus one while submitting */
    hvd_status st;
    char error[2048];
} scatter;

/* One part is done (engine thread, or the submitting one); the last ends
 * the kernel. */
static void scatter_part_done(hvd_status st, const char *error, void *arg) {
    scatter *sc = arg;
    int last;

    pthread_mutex_lock(&sc->lock);
    if (st != HVD_OK && sc->st == HVD_OK) {
        sc->st = st;
        snprintf(sc->error, sizeof(sc->error), "%s",
                 error != NULL ? error : "");
    }
    last = --sc->left == 0;
    pthread_mutex_unlock(&sc->lock);
    if (!last)
        return;
    if (sc->st != HVD_OK)
        hvd_tf_fail(sc->p->ctx, sc->p->what, sc->p->name, sc->st, sc->error);
    hvd_tf_pending_end(sc->p);
    pthread_mutex_destroy(&sc->lock);
    free(sc);
}

/* Every input of p's kernel and its output, taken before anything is
 * submitted (a kernel fails whole or not at all), into ins and outs:
 * HVD_OK; else a failure of TensorFlow's in p->s, or why not in why. */
static hvd_status scatter_tensors(pending *p, const kernel *k, int n,
                                  TF_Tensor **ins, TF_Tensor **outs, char *why,
                                  size_t len) {
    int nranks = hvd_tf_set_size(k->ps), me = hvd_tf_set_rank(k->ps);

    for (int i = 0; i < n; i++) {
        int64_t dims[MAX_DIMS];
        size_t row = 1;
        int nd;

        TF_GetInput(p->ctx, i, &ins[i], p->s);
        if (TF_GetCode(p->s) != TF_OK)
            return HVD_ERR_INTERNAL; /* TensorFlow's failure, in p->s */
        hvd_tf_pending_keep(p, ins[i]);
        nd = TF_NumDims(ins[i]);
        if (nd < 1 || nd > MAX_DIMS) {
            snprintf(why, len,
                     "a reduce-scatter needs a tensor of 1 to %d dimensions; "
                     "input %d has %d",
                     MAX_DIMS, i, nd);
            return HVD_ERR_INVALID_ARG;
        }
        hvd_tf_dims_of(ins[i], dims);
        for (int d = 1; d < nd; d++)
            row *= (size_t)dims[d];
        dims[0] = (int64_t)hvd_reducescatter_count((size_t)dims[0], nranks, me);
        outs[i] = TF_AllocateOutput(p->ctx, i, TF_TensorType(ins[i]), dims, nd,
                                    (size_t)dims[0] * row *
                                        TF_DataTypeSize(TF_TensorType(ins[i])),
                                    p->s);
        if (TF_GetCode(p->s) != TF_OK)
            return HVD_ERR_INTERNAL; /* TensorFlow's failure, in p->s */
        hvd_tf_pending_keep(p, outs[i]);
    }
    return HVD_OK;
}

/* libhvd's name for part i of n: the kernel's, "<name>_<i+1>of<n>" in a
 * group (NULL for an unnamed kernel: its parts match by order). */
static const char *part_name(const kernel *k, int i, int n, char *buf,
                             size_t len) {
    const char *name = hvd_tf_op_name(k);

    if (name == NULL || n == 1)
        return name;
    snprintf(buf, len, "%s_%dof%d", k->name, i + 1, n);
    return buf;
}

/* The n parts one after the other, each libhvd's blocking call on this
 * thread (an eager CPU kernel), then the kernel's end. Every part is
 * called even after one failed, as the asynchronous kernel submits every
 * part, so that a rank that submitted them all is never left waiting; the
 * first failure is the kernel's. */
static void scatter_blocking(pending *p, const kernel *k, int n,
                             TF_Tensor **ins, TF_Tensor **outs) {
    char error[2048] = "";
    hvd_status first = HVD_OK;

    for (int i = 0; i < n; i++) {
        char nbuf[NAME_MAX_LEN + 32];
        int64_t shape[SHAPE_DIMS];
        hvd_status st = hvd_ps_reducescatter_shaped(
            k->ps, part_name(k, i, n, nbuf, sizeof(nbuf)),
            hvd_tf_data_of(ins[i]), hvd_tf_data_of(outs[i]),
            hvd_tf_shape_of(ins[i], shape), shape,
            (hvd_dtype)hvd_tf_type_of(TF_TensorType(ins[i])),
            (hvd_op)k->reduce_op);

        if (st != HVD_OK && first == HVD_OK) {
            first = st;
            snprintf(error, sizeof(error), "%s", hvd_tf_blocking_error());
        }
    }
    hvd_tf_pending_fail(p, first, first != HVD_OK ? error : NULL);
}

/* Submits the n parts; sc (and the kernel) is theirs from here: the last
 * part to finish ends the kernel and frees sc. */
static void scatter_submit(scatter *sc, pending *p, const kernel *k, int n,
                           TF_Tensor **ins, TF_Tensor **outs) {
    sc->p = p;
    sc->left = n + 1;
    pthread_mutex_init(&sc->lock, NULL);
    for (int i = 0; i < n; i++) {
        char nbuf[NAME_MAX_LEN + 32];
        const char *name = part_name(k, i, n, nbuf, sizeof(nbuf));
        int64_t shape[SHAPE_DIMS];
        hvd_handle h = NULL;
        hvd_status st;

        st = hvd_ps_reducescatter_shaped_async(
            k->ps, name, hvd_tf_data_of(ins[i]), hvd_tf_data_of(outs[i]),
            hvd_tf_shape_of(ins[i], shape), shape,
            (hvd_dtype)hvd_tf_type_of(TF_TensorType(ins[i])),
            (hvd_op)k->reduce_op, &h);
        if (st == HVD_OK)
            st = hvd_on_done(h, scatter_part_done, sc);
        if (st != HVD_OK)
            scatter_part_done(st, hvd_last_error(), sc);
    }
    scatter_part_done(HVD_OK, NULL, sc); /* the submission's own share */
}

static void scatter_compute(const kernel *k, TF_OpKernelContext *ctx,
                            TF_AsyncOpKernelDoneCallback *done,
                            const char *what) {
    int n = TF_NumInputs(ctx);
    pending *p = hvd_tf_pending_start(ctx, done, what, k, 2 * n);
    scatter *sc = calloc(1, sizeof(*sc));
    TF_Tensor **ins = calloc((size_t)n + 1, sizeof(*ins));
    TF_Tensor **outs = calloc((size_t)n + 1, sizeof(*outs));
    char why[1024] = "";
    hvd_status st = HVD_OK;

    if (p == NULL)
        goto free_arrays;
    if (sc == NULL || ins == NULL || outs == NULL) {
        st = hvd_tf_no_memory(why, sizeof(why));
        goto free_arrays;
    }
    CHECK_HVD_GOTO(hvd_tf_not_member(k, why, sizeof(why)), st, free_arrays);
    CHECK_HVD_GOTO(scatter_tensors(p, k, n, ins, outs, why, sizeof(why)), st,
                   free_arrays);
    CHECK_HVD_GOTO(hvd_tf_device_ready(p, k, why, sizeof(why)), st,
                   free_arrays);
    if (hvd_tf_blocking(k)) {
        scatter_blocking(p, k, n, ins, outs);
        p = NULL;
        goto free_arrays;
    }
    scatter_submit(sc, p, k, n, ins, outs);
    sc = NULL; /* the parts' now: the last one frees it */
    p = NULL;
free_arrays:
    if (p != NULL)
        hvd_tf_pending_fail(p, st, why);
    free(outs);
    free(ins);
    free(sc);
}

void hvd_tf_reducescatter_compute(void *kp, TF_OpKernelContext *ctx,
                                  TF_AsyncOpKernelDoneCallback *done) {
    scatter_compute(kp, ctx, done, "reducescatter");
}

void hvd_tf_grouped_reducescatter_compute(void *kp, TF_OpKernelContext *ctx,
                                          TF_AsyncOpKernelDoneCallback *done) {
    scatter_compute(kp, ctx, done, "grouped_reducescatter");
}
