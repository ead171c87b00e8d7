/*
 * TensorFlow ops over libhvd: HvdAllreduce, HvdGroupedAllreduce,
 * HvdBroadcast, HvdAllgather, HvdAlltoall, HvdReducescatter,
 * HvdGroupedReducescatter (asynchronous kernels), HvdJoin, HvdBarrier,
 * HvdSize, HvdRank, HvdLocalSize, HvdLocalRank (synchronous ones). The
 * collectives take a process_set_id attr (0, every rank, by default) and
 * call libhvd's hvd_ps_ forms.
 *
 * Written against TensorFlow's C API only (tensorflow/c/kernels.h,
 * tensorflow/c/ops.h), so one source builds for any TensorFlow 2 with
 * those headers and needs no C++ ABI match. python/hvd/tensorflow loads
 * the library with tf.load_op_library; the registrations run when it is
 * loaded (a constructor function).
 *
 * An asynchronous kernel hands the tensors' memory to libhvd's _async call
 * and returns; libhvd calls back (hvd_on_done) on its engine thread when
 * the operation has finished, and the callback ends the kernel
 * (through python/hvd/tensorflow/_ops/keep_done.cc). TensorFlow's executor runs
 * other ops meanwhile, so every gradient of a step is in flight at once and the
 * engine fuses them. Work that is more than a few instructions (the second
 * step of an allgather or an alltoall, copying a padded allgather into
 * place) is not done on the engine thread but on this library's one helper
 * thread.
 *
 * A failure ends the kernel with a TensorFlow error whose message is
 * "hvd <op> '<name>' on rank R: <libhvd's sentence> [HVD_ERR_...]".
 */
#include <hvd/hvd.h>

#include <tensorflow/c/kernels.h>
/* ops.h declares these as C++ does (struct tags only); C needs the names. */
typedef struct TF_DimensionHandle TF_DimensionHandle;
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
#include <tensorflow/c/ops.h>
#include <tensorflow/c/tf_status.h>
#include <tensorflow/c/tf_tensor.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* python/hvd/tensorflow/_ops/keep_done.cc: the kernel's completion, kept past
 * the compute function (TensorFlow's C API gives a pointer that dies with it).
 */
void *hvd_tf_keep_done(void *done);
void hvd_tf_run_done(void *kept);
/* device_sync.cc: waits for the kernel's GPU stream (0), or -1 and why. */
int hvd_tf_sync_device(TF_OpKernelContext *ctx, char *why, size_t whylen);

#define NAME_MAX_LEN 512
#define MAX_DIMS 16

/* ------------------------------------------------------------------ */
/* Types, names, errors                                                */

/* The element types an allreduce can reduce. */
#define REDUCIBLE "{uint8, int8, int32, int64, half, bfloat16, float, double}"
/* What a broadcast or an allgather can move (as bytes, when libhvd has no
 * type of that width and kind). */
#define MOVABLE                                                                \
    "{uint8, int8, uint16, int16, uint32, int32, uint64, int64, half, "        \
    "bfloat16, float, double, bool}"

/* hvd's type for a TensorFlow one; -1 when hvd has none. */
static int hvd_type_of(TF_DataType t) {
    switch (t) {
    case TF_UINT8:
        return HVD_UINT8;
    case TF_INT8:
        return HVD_INT8;
    case TF_INT32:
        return HVD_INT32;
    case TF_INT64:
        return HVD_INT64;
    case TF_HALF:
        return HVD_FLOAT16;
    case TF_BFLOAT16:
        return HVD_BFLOAT16;
    case TF_FLOAT:
        return HVD_FLOAT32;
    case TF_DOUBLE:
        return HVD_FLOAT64;
    default:
        return -1;
    }
}

static TF_Code tf_code_of(hvd_status s) {
    switch (s) {
    case HVD_OK:
        return TF_OK;
    case HVD_ERR_INVALID_ARG:
        return TF_INVALID_ARGUMENT;
    case HVD_ERR_NOT_INITIALIZED:
    case HVD_ERR_MISMATCH:
        return TF_FAILED_PRECONDITION;
    case HVD_ERR_PEER_LOST:
    case HVD_ERR_TRANSPORT:
        return TF_UNAVAILABLE;
    case HVD_ERR_TIMEOUT:
        return TF_DEADLINE_EXCEEDED;
    case HVD_ERR_AUTH:
        return TF_UNAUTHENTICATED;
    case HVD_ERR_NO_MEMORY:
        return TF_RESOURCE_EXHAUSTED;
    case HVD_ERR_UNSUPPORTED:
        return TF_UNIMPLEMENTED;
    case HVD_ERR_SHUTDOWN:
        return TF_ABORTED;
    default:
        return TF_INTERNAL;
    }
}

/* "HVD_ERR_MISMATCH" for HVD_ERR_MISMATCH: the names of hvd.h's table. */
static const char *status_name(hvd_status s) {
    switch (s) {
#define HVD_TF_STATUS_NAME_(name, text)                                        \
    case name:                                                                 \
        return #name;
        HVD_STATUS_MAP(HVD_TF_STATUS_NAME_)
#undef HVD_TF_STATUS_NAME_
    }
    return "HVD_ERR_INTERNAL";
}

/* Fails the kernel of ctx with hvd's status and sentence. */
static void fail_ctx(TF_OpKernelContext *ctx, const char *what,
                     const char *name, hvd_status st, const char *sentence) {
    char msg[4096];
    TF_Status *s = TF_NewStatus();

    snprintf(msg, sizeof(msg), "hvd %s '%s' on rank %d: %s [%s]", what,
             name[0] != '\0' ? name : "(unnamed)", hvd_rank(),
             sentence != NULL && sentence[0] != '\0' ? sentence
                                                     : hvd_strerror(st),
             status_name(st));
    TF_SetStatus(s, tf_code_of(st), msg);
    TF_OpKernelContext_Failure(ctx, s);
    TF_DeleteStatus(s);
}

/* A failure of TensorFlow's own (an allocation): passed on as it is. */
static int tf_failed(TF_OpKernelContext *ctx, TF_Status *s) {
    if (TF_GetCode(s) == TF_OK)
        return 0;
    TF_OpKernelContext_Failure(ctx, s);
    return 1;
}

/* ------------------------------------------------------------------ */
/* The helper thread                                                   */

/* A piece of work for the helper thread, embedded in what it works on. */
typedef struct job {
    struct job *next;
    void (*run)(struct job *);
} job;

static pthread_mutex_t jobs_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cond = PTHREAD_COND_INITIALIZER;
static job *jobs_head, *jobs_tail;
static int helper_started;

static void *helper_main(void *unused) {
    (void)unused;
    for (;;) {
        job *j;

        pthread_mutex_lock(&jobs_lock);
        while (jobs_head == NULL)
            pthread_cond_wait(&jobs_cond, &jobs_lock);
        j = jobs_head;
        jobs_head = j->next;
        if (jobs_head == NULL)
            jobs_tail = NULL;
        pthread_mutex_unlock(&jobs_lock);
        j->run(j);
    }
    return NULL;
}

/* Queues j for the helper thread (any thread, the engine's included).
 * Returns nonzero if the thread could not be started. */
static int post_job(job *j) {
    int err = 0;

    j->next = NULL;
    pthread_mutex_lock(&jobs_lock);
    if (!helper_started) {
        pthread_t t;
        pthread_attr_t attr;

        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        err = pthread_create(&t, &attr, helper_main, NULL);
        pthread_attr_destroy(&attr);
        helper_started = err == 0;
    }
    if (err == 0) {
        if (jobs_tail != NULL)
            jobs_tail->next = j;
        else
            jobs_head = j;
        jobs_tail = j;
        pthread_cond_signal(&jobs_cond);
    }
    pthread_mutex_unlock(&jobs_lock);
    return err;
}

/* ------------------------------------------------------------------ */
/* Kernels' common parts                                               */

/* What every kernel remembers from its construction. */
typedef struct kernel {
    char name[NAME_MAX_LEN]; /* the tensor_name attr: "" means unnamed */
    int reduce_op;
    int root_rank;
    int ps;     /* the process_set_id attr: 0 is every rank */
    int on_gpu; /* a GPU kernel: its tensors are in device memory */
} kernel;

static void get_string_attr(TF_OpKernelConstruction *c, const char *attr,
                            char *out, size_t outlen, TF_Status *s) {
    int32_t list_size = 0, total = 0;

    out[0] = '\0';
    TF_OpKernelConstruction_GetAttrSize(c, attr, &list_size, &total, s);
    if (TF_GetCode(s) != TF_OK)
        return;
    if ((size_t)total >= outlen) {
        TF_SetStatus(s, TF_INVALID_ARGUMENT,
                     "hvd: the name of an operation is limited to 511 bytes");
        return;
    }
    TF_OpKernelConstruction_GetAttrString(c, attr, out, outlen, s);
    out[total] = '\0';
}

static void *kernel_create(TF_OpKernelConstruction *c) {
    kernel *k = calloc(1, sizeof(*k));
    TF_Status *s = TF_NewStatus();

    if (k == NULL) {
        TF_SetStatus(s, TF_RESOURCE_EXHAUSTED, "hvd: out of memory");
        TF_OpKernelConstruction_Failure(c, s);
        TF_DeleteStatus(s);
        return NULL;
    }
    if (TF_OpKernelConstruction_HasAttr(c, "tensor_name", s))
        get_string_attr(c, "tensor_name", k->name, sizeof(k->name), s);
    if (TF_GetCode(s) == TF_OK &&
        TF_OpKernelConstruction_HasAttr(c, "reduce_op", s))
        TF_OpKernelConstruction_GetAttrInt32(c, "reduce_op", &k->reduce_op, s);
    if (TF_GetCode(s) == TF_OK &&
        TF_OpKernelConstruction_HasAttr(c, "root_rank", s))
        TF_OpKernelConstruction_GetAttrInt32(c, "root_rank", &k->root_rank, s);
    if (TF_GetCode(s) == TF_OK &&
        TF_OpKernelConstruction_HasAttr(c, "process_set_id", s))
        TF_OpKernelConstruction_GetAttrInt32(c, "process_set_id", &k->ps, s);
    if (TF_GetCode(s) != TF_OK)
        TF_OpKernelConstruction_Failure(c, s);
    TF_DeleteStatus(s);
    return k;
}

/* A GPU kernel: the same, with tensors in device memory. */
static void *kernel_create_gpu(TF_OpKernelConstruction *c) {
    kernel *k = kernel_create(c);

    if (k != NULL)
        k->on_gpu = 1;
    return k;
}

static void kernel_delete(void *k) { free(k); }

/* libhvd's name for an operation: NULL for an unnamed one (matched by
 * order, which is program order in eager mode). */
static const char *op_name(const kernel *k) {
    return k->name[0] != '\0' ? k->name : NULL;
}

/* The members of process set ps (the job's size for 0), or -1 when there
 * is no such set. */
static int set_size(int ps) {
    return ps == 0 ? hvd_size() : hvd_process_set_size(ps);
}

/* This rank's place in set ps, or -1 when it is not a member. */
static int set_rank(int ps) {
    return ps == 0 ? hvd_rank() : hvd_process_set_rank(ps);
}

/* HVD_OK when this rank may run k's operation in its set; else why not,
 * in text. */
static hvd_status not_member(const kernel *k, char *text, size_t len) {
    if (!hvd_initialized()) {
        snprintf(text, len, "hvd is not initialized: call hvd.init() first");
        return HVD_ERR_NOT_INITIALIZED;
    }
    if (set_size(k->ps) >= 1 && set_rank(k->ps) >= 0)
        return HVD_OK;
    snprintf(text, len,
             "rank %d is not a member of process set %d (or there is no "
             "such set): only its members may call its operations",
             hvd_rank(), k->ps);
    return HVD_ERR_INVALID_ARG;
}

static int dims_of(TF_Tensor *t, int64_t *dims) {
    int n = TF_NumDims(t);

    for (int i = 0; i < n && i < MAX_DIMS; i++)
        dims[i] = TF_Dim(t, i);
    return n;
}

/* The shape libhvd compares across ranks (hvd_allreduce_shaped_async):
 * at most 8 dimensions, those past the eighth folded into it. */
enum { SHAPE_DIMS = 8 };
static int shape_of(TF_Tensor *t, int64_t *dims) {
    int n = TF_NumDims(t);

    for (int i = 0; i < n; i++) {
        if (i < SHAPE_DIMS)
            dims[i] = TF_Dim(t, i);
        else
            dims[SHAPE_DIMS - 1] *= TF_Dim(t, i);
    }
    return n < SHAPE_DIMS ? n : SHAPE_DIMS;
}

/* A buffer libhvd accepts for a tensor that may be empty (TensorFlow may
 * give NULL for no elements). */
static void *data_of(TF_Tensor *t) {
    static char empty[8];
    void *p = TF_TensorData(t);

    return p != NULL ? p : empty;
}

/* ------------------------------------------------------------------ */
/* Allreduce, grouped allreduce, broadcast: one libhvd call each       */

/* One running kernel: what its end needs. */
typedef struct pending {
    TF_OpKernelContext *ctx;
    void *done; /* hvd_tf_keep_done's copy */
    const char *what;
    char name[NAME_MAX_LEN];
    int ntensors;
    TF_Tensor **tensors; /* inputs and outputs to release at the end */
} pending;

static pending *pending_new(TF_OpKernelContext *ctx,
                            TF_AsyncOpKernelDoneCallback *done,
                            const char *what, const kernel *k, int ntensors) {
    pending *p = calloc(1, sizeof(*p) + (size_t)ntensors * sizeof(TF_Tensor *));

    if (p == NULL)
        return NULL;
    p->done = hvd_tf_keep_done(done);
    if (p->done == NULL) {
        free(p);
        return NULL;
    }
    p->ctx = ctx;
    p->what = what;
    snprintf(p->name, sizeof(p->name), "%s", k->name);
    p->tensors = (TF_Tensor **)(p + 1);
    return p;
}

/* Releases p's tensors and ends its kernel. */
static void pending_end(pending *p) {
    void *done = p->done;

    for (int i = 0; i < p->ntensors; i++)
        TF_DeleteTensor(p->tensors[i]);
    free(p);
    hvd_tf_run_done(done);
}

/* hvd_on_done's function (engine thread): ends the kernel. */
static void on_done(hvd_status st, const char *error, void *arg) {
    pending *p = arg;

    if (st != HVD_OK)
        fail_ctx(p->ctx, p->what, p->name, st, error);
    pending_end(p);
}

/*
 * A GPU kernel's inputs are only queued on TensorFlow's stream when it
 * runs: waits until they are there, before libhvd (on a stream of its
 * own) reads them. 1 when ready; else the kernel has been failed and ended.
 */
static int device_ready(pending *p, const kernel *k) {
    char why[1024];

    if (!k->on_gpu || hvd_tf_sync_device(p->ctx, why, sizeof(why)) == 0)
        return 1;
    fail_ctx(p->ctx, p->what, p->name, HVD_ERR_INTERNAL, why);
    pending_end(p);
    return 0;
}

/* Hands h to on_done, or fails the kernel with the submission's st. */
static void submitted(pending *p, hvd_status st, hvd_handle h) {
    if (st == HVD_OK)
        st = hvd_on_done(h, on_done, p);
    if (st != HVD_OK) {
        fail_ctx(p->ctx, p->what, p->name, st, hvd_last_error());
        pending_end(p);
    }
}

/*
 * Output i shaped as input i, in input i's memory where TensorFlow can give
 * it (nobody else reads that input: the reduction then runs in place), else
 * new. *in is input i, or NULL when it was forwarded (the output is then
 * the input). This kernel's own reference to the input is dropped before
 * asking, or TensorFlow could never forward it.
 */
static void in_and_out(TF_OpKernelContext *ctx, int i, TF_Tensor **in,
                       TF_Tensor **out, TF_Status *s) {
    int64_t dims[MAX_DIMS];
    TF_Tensor *probe = NULL;
    int n, forwarded = -1;

    *in = *out = NULL;
    TF_GetInput(ctx, i, &probe, s);
    if (TF_GetCode(s) != TF_OK)
        return;
    n = dims_of(probe, dims);
    TF_DeleteTensor(probe);
    *out =
        TF_ForwardInputOrAllocateOutput(ctx, &i, 1, i, dims, n, &forwarded, s);
    if (TF_GetCode(s) == TF_OK && forwarded != i)
        TF_GetInput(ctx, i, in, s);
}

/*
 * The start of a kernel of one input and one output shaped as it: p with
 * both tensors in *in and *out (the same one when TensorFlow forwarded the
 * input: in place), or NULL when the kernel could not start (it has been
 * failed and ended).
 */
static pending *start_one(TF_OpKernelContext *ctx,
                          TF_AsyncOpKernelDoneCallback *done, const char *what,
                          const kernel *k, TF_Tensor **in, TF_Tensor **out) {
    TF_Status *s = TF_NewStatus();
    pending *p = pending_new(ctx, done, what, k, 2);

    *in = *out = NULL;
    if (p == NULL) {
        fail_ctx(ctx, what, k->name, HVD_ERR_NO_MEMORY, "out of memory");
        TF_DeleteStatus(s);
        TF_RunAsyncOpKernelDoneCallback(done);
        return NULL;
    }
    in_and_out(ctx, 0, in, out, s);
    if (*in != NULL)
        p->tensors[p->ntensors++] = *in;
    if (*out != NULL)
        p->tensors[p->ntensors++] = *out;
    if (tf_failed(ctx, s)) {
        TF_DeleteStatus(s);
        pending_end(p);
        return NULL;
    }
    TF_DeleteStatus(s);
    if (*in == NULL)
        *in = *out; /* forwarded: in place */
    return p;
}

static void allreduce_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    TF_Tensor *in, *out;
    pending *p = start_one(ctx, done, "allreduce", k, &in, &out);
    hvd_handle h = NULL;
    int64_t dims[SHAPE_DIMS];
    hvd_status st;

    if (p == NULL || !device_ready(p, k))
        return;
    /* With its shape, so that ranks disagreeing on it fail as in Horovod. */
    st = hvd_ps_allreduce_shaped_async(
        k->ps, op_name(k), data_of(in), data_of(out), shape_of(in, dims), dims,
        (hvd_dtype)hvd_type_of(TF_TensorType(in)), (hvd_op)k->reduce_op, &h);
    submitted(p, st, h);
}

static void grouped_compute(void *kp, TF_OpKernelContext *ctx,
                            TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    int n = TF_NumInputs(ctx);
    TF_Status *s = TF_NewStatus();
    pending *p = pending_new(ctx, done, "grouped_allreduce", k, 2 * n);
    const void **sends = calloc((size_t)n + 1, sizeof(*sends));
    void **recvs = calloc((size_t)n + 1, sizeof(*recvs));
    size_t *counts = calloc((size_t)n + 1, sizeof(*counts));
    TF_DataType type = TF_FLOAT;
    hvd_handle h = NULL;
    hvd_status st;

    if (p == NULL || sends == NULL || recvs == NULL || counts == NULL) {
        fail_ctx(ctx, "grouped_allreduce", k->name, HVD_ERR_NO_MEMORY,
                 "out of memory");
        free(sends);
        free(recvs);
        free(counts);
        TF_DeleteStatus(s);
        if (p != NULL)
            pending_end(p);
        else
            TF_RunAsyncOpKernelDoneCallback(done);
        return;
    }
    for (int i = 0; i < n; i++) {
        TF_Tensor *in, *out;

        in_and_out(ctx, i, &in, &out, s);
        if (in != NULL)
            p->tensors[p->ntensors++] = in;
        if (out != NULL)
            p->tensors[p->ntensors++] = out;
        if (tf_failed(ctx, s))
            break;
        if (in == NULL)
            in = out; /* forwarded: in place */
        type = TF_TensorType(in);
        sends[i] = data_of(in);
        recvs[i] = data_of(out);
        counts[i] = (size_t)TF_TensorElementCount(in);
    }
    if (TF_GetCode(s) != TF_OK) {
        free(sends);
        free(recvs);
        free(counts);
        TF_DeleteStatus(s);
        pending_end(p);
        return;
    }
    TF_DeleteStatus(s);
    if (!device_ready(p, k)) {
        free(sends);
        free(recvs);
        free(counts);
        return;
    }
    st = hvd_ps_grouped_allreduce_async(
        k->ps, op_name(k), n, (const void *const *)sends, (void *const *)recvs,
        counts, (hvd_dtype)hvd_type_of(type), (hvd_op)k->reduce_op, &h);
    free(sends);
    free(recvs);
    free(counts);
    submitted(p, st, h);
}

/* Element count and hvd type of a tensor moved as it is, or as bytes when
 * hvd has no type for it. */
static void moved_as(TF_Tensor *t, size_t *count, hvd_dtype *type) {
    int ht = hvd_type_of(TF_TensorType(t));

    if (ht >= 0) {
        *count = (size_t)TF_TensorElementCount(t);
        *type = (hvd_dtype)ht;
    } else {
        *count = TF_TensorByteSize(t);
        *type = HVD_UINT8;
    }
}

static void broadcast_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    TF_Tensor *in, *out;
    pending *p = start_one(ctx, done, "broadcast", k, &in, &out);
    hvd_handle h = NULL;
    hvd_dtype type;
    size_t count;
    int64_t dims[SHAPE_DIMS];
    hvd_status st;

    if (p == NULL || !device_ready(p, k))
        return;
    /* The root sends its input; the others' output is overwritten. */
    TF_Tensor *buf = out;
    if (TF_TensorData(out) != TF_TensorData(in) && hvd_rank() == k->root_rank) {
        if (k->on_gpu) {
            /* Device memory: the root's output is its input, which the
             * broadcast only reads. */
            TF_Status *s = TF_NewStatus();
            TF_SetOutput(ctx, 0, in, s);
            if (tf_failed(ctx, s)) {
                TF_DeleteStatus(s);
                pending_end(p);
                return;
            }
            TF_DeleteStatus(s);
            buf = in;
        } else {
            memcpy(data_of(out), data_of(in), TF_TensorByteSize(in));
        }
    }
    moved_as(in, &count, &type);
    if (count == (size_t)TF_TensorElementCount(in))
        st = hvd_ps_broadcast_shaped_async(k->ps, op_name(k), data_of(buf),
                                           shape_of(in, dims), dims, type,
                                           k->root_rank, &h);
    else /* as bytes: the count is not the shape's */
        st = hvd_ps_broadcast_async(k->ps, op_name(k), data_of(buf), count,
                                    type, k->root_rank, &h);
    submitted(p, st, h);
}

/* ------------------------------------------------------------------ */
/* Operations in two steps                                             */

/*
 * An operation in two libhvd steps (allgather, alltoall): a first exchange
 * sizes the output, a second moves the data, and the helper thread runs
 * what comes between (job.run). The first member of gather and a2a.
 */
typedef struct twostep {
    job job;
    pending *p;
    kernel k;
    const char *what;                  /* "allgather", "alltoall" */
    void (*release)(struct twostep *); /* frees the operation */
    hvd_status st;                     /* of the step that just finished */
    char error[2048];
    int step; /* 1: the sizes are in; 2: the data */
} twostep;

static void twostep_fail(twostep *t, hvd_status st, const char *sentence) {
    fail_ctx(t->p->ctx, t->what, t->k.name, st, sentence);
    pending_end(t->p);
    t->release(t);
}

/* hvd_on_done's function for both steps (engine thread): the rest is the
 * helper thread's. */
static void twostep_step_done(hvd_status st, const char *error, void *arg) {
    twostep *t = arg;

    t->st = st;
    snprintf(t->error, sizeof(t->error), "%s", error != NULL ? error : "");
    if (post_job(&t->job) != 0)
        twostep_fail(t, HVD_ERR_INTERNAL, "could not start a thread");
}

/*
 * A new operation of size bytes (a gather or an a2a: a twostep first) for
 * the kernel k's call in ctx, at its first step, with its pending (room
 * for ntensors); NULL, with ctx failed and done called, when out of memory.
 */
static void *twostep_new(size_t size, TF_OpKernelContext *ctx,
                         TF_AsyncOpKernelDoneCallback *done, const kernel *k,
                         const char *what, int ntensors, void (*run)(job *),
                         void (*release)(twostep *)) {
    pending *p = pending_new(ctx, done, what, k, ntensors);
    twostep *t = calloc(1, size);

    if (p == NULL || t == NULL) {
        fail_ctx(ctx, what, k->name, HVD_ERR_NO_MEMORY, "out of memory");
        free(t);
        if (p != NULL)
            pending_end(p);
        else
            TF_RunAsyncOpKernelDoneCallback(done);
        return NULL;
    }
    t->p = p;
    t->k = *k;
    t->job.run = run;
    t->what = what;
    t->release = release;
    t->step = 1;
    return t;
}

/* A sub-name for one step: "<name>.shape", "<name>.data" (NULL stays NULL:
 * unnamed steps match by order like their op). */
static const char *step_name(const twostep *t, const char *suffix, char *buf,
                             size_t len) {
    if (t->k.name[0] == '\0')
        return NULL;
    snprintf(buf, len, "%s.%s", t->k.name, suffix);
    return buf;
}

/* ------------------------------------------------------------------ */
/* Allgather: the shapes first, then the data                          */

/* Per rank: the number of dimensions, the type, then each dimension. */
#define META (2 + MAX_DIMS)

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

static void gather_free(gather *g) {
    free(g->metas);
    free(g->send_pad);
    free(g->recv_pad);
    free(g);
}

static void gather_release(twostep *t) { gather_free((gather *)t); }

static void describe_meta(const int64_t *m, char *out, size_t len) {
    size_t off = 0;

    off += (size_t)snprintf(out + off, len - off, "type %lld, shape [",
                            (long long)m[1]);
    for (int64_t d = 0; d < m[0] && d < MAX_DIMS && off < len; d++)
        off += (size_t)snprintf(out + off, len - off, "%s%lld", d ? ", " : "",
                                (long long)m[2 + d]);
    if (off < len)
        snprintf(out + off, len - off, "]");
}

/* The shapes are in: checks that they agree after the first dimension,
 * makes the output and gathers the data (helper thread). */
static void gather_data(gather *g) {
    TF_Status *s;
    TF_Tensor *out;
    int64_t dims[MAX_DIMS], total = 0;
    char nbuf[NAME_MAX_LEN + 8];
    int same = 1, nd = (int)g->mine[0];
    hvd_handle h = NULL;
    hvd_dtype type;
    size_t count;
    hvd_status st;

    for (int r = 0; r < g->nranks; r++) {
        const int64_t *m = g->metas + (size_t)r * META;
        int agree = m[0] == g->mine[0] && m[1] == g->mine[1];

        for (int d = 1; agree && d < nd; d++)
            agree = m[2 + d] == g->mine[2 + d];
        if (!agree) {
            char text[2048], a[256], b[256];

            describe_meta(g->metas, a, sizeof(a));
            describe_meta(m, b, sizeof(b));
            snprintf(text, sizeof(text),
                     "ranks disagree on the type or the dimensions after the "
                     "first: rank 0: %s; rank %d: %s",
                     a, r, b);
            twostep_fail(&g->t, HVD_ERR_MISMATCH, text);
            return;
        }
        total += m[2];
        if (m[2] > g->most)
            g->most = m[2];
        same = same && m[2] == g->mine[2];
    }
    for (int d = 0; d < nd; d++)
        dims[d] = g->mine[2 + d];
    dims[0] = total;
    /* One first-dimension slice, in moved elements. */
    g->row = 1;
    for (int d = 1; d < nd; d++)
        g->row *= (size_t)dims[d];
    if (hvd_type_of(TF_TensorType(g->in)) >= 0) {
        type = (hvd_dtype)hvd_type_of(TF_TensorType(g->in));
    } else {
        type = HVD_UINT8;
        g->row *= TF_DataTypeSize(TF_TensorType(g->in));
    }
    g->esize = hvd_dtype_size(type);
    count = (size_t)g->mine[2] * g->row;
    s = TF_NewStatus();
    out = TF_AllocateOutput(g->t.p->ctx, 0, TF_TensorType(g->in), dims, nd,
                            (size_t)total * g->row * g->esize, s);
    if (TF_GetCode(s) != TF_OK) {
        TF_OpKernelContext_Failure(g->t.p->ctx, s);
        TF_DeleteStatus(s);
        pending_end(g->t.p);
        gather_free(g);
        return;
    }
    TF_DeleteStatus(s);
    g->t.p->tensors[g->t.p->ntensors++] = out;
    g->out_data = data_of(out);
    g->t.step = 2;
    if (same) {
        st = hvd_ps_allgather_async(
            g->t.k.ps, step_name(&g->t, "data", nbuf, sizeof(nbuf)),
            data_of(g->in), g->out_data, count, type, &h);
    } else {
        size_t slot = (size_t)g->most * g->row;

        g->send_pad = calloc(slot ? slot : 1, g->esize);
        g->recv_pad = calloc(slot * (size_t)g->nranks + 1, g->esize);
        if (g->send_pad == NULL || g->recv_pad == NULL) {
            twostep_fail(&g->t, HVD_ERR_NO_MEMORY, "out of memory");
            return;
        }
        memcpy(g->send_pad, data_of(g->in), count * g->esize);
        st = hvd_ps_allgather_async(
            g->t.k.ps, step_name(&g->t, "data", nbuf, sizeof(nbuf)),
            g->send_pad, g->recv_pad, slot, type, &h);
    }
    if (st == HVD_OK)
        st = hvd_on_done(h, twostep_step_done, &g->t);
    if (st != HVD_OK)
        twostep_fail(&g->t, st, hvd_last_error());
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
    pending_end(g->t.p);
    gather_free(g);
}

static void gather_run(job *j) {
    gather *g = (gather *)j;

    if (g->t.st != HVD_OK)
        twostep_fail(&g->t, g->t.st, g->t.error);
    else if (g->t.step == 1)
        gather_data(g);
    else
        gather_finish(g);
}

static void allgather_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    TF_Tensor *in = NULL;
    gather *g = twostep_new(sizeof(*g), ctx, done, k, "allgather", 2,
                            gather_run, gather_release);
    char nbuf[NAME_MAX_LEN + 8];
    hvd_handle h = NULL;
    hvd_status st;
    int nd;

    if (g == NULL)
        return;
    pending *p = g->t.p;
    TF_Status *s = TF_NewStatus();
    TF_GetInput(ctx, 0, &in, s);
    if (tf_failed(ctx, s)) {
        TF_DeleteStatus(s);
        pending_end(p);
        gather_free(g);
        return;
    }
    TF_DeleteStatus(s);
    p->tensors[p->ntensors++] = in;
    g->in = in;
    nd = TF_NumDims(in);
    if (nd < 1 || nd > MAX_DIMS) {
        char text[256];
        snprintf(text, sizeof(text),
                 "an allgathered tensor needs 1 to %d dimensions; this one "
                 "has %d",
                 MAX_DIMS, nd);
        twostep_fail(&g->t, HVD_ERR_INVALID_ARG, text);
        return;
    }
    {
        char text[256];
        hvd_status why = not_member(k, text, sizeof(text));

        if (why != HVD_OK) {
            twostep_fail(&g->t, why, text);
            return;
        }
    }
    g->nranks = set_size(k->ps);
    g->metas = calloc((size_t)g->nranks * META, sizeof(int64_t));
    if (g->metas == NULL) {
        twostep_fail(&g->t, HVD_ERR_NO_MEMORY, "out of memory");
        return;
    }
    g->mine[0] = nd;
    g->mine[1] = (int64_t)TF_TensorType(in);
    dims_of(in, &g->mine[2]);
    st = hvd_ps_allgather_async(g->t.k.ps,
                                step_name(&g->t, "shape", nbuf, sizeof(nbuf)),
                                g->mine, g->metas, META, HVD_INT64, &h);
    if (st == HVD_OK)
        st = hvd_on_done(h, twostep_step_done, &g->t);
    if (st != HVD_OK)
        twostep_fail(&g->t, st, hvd_last_error());
}

/* ------------------------------------------------------------------ */
/* Alltoall: the shapes first, then the data                           */

/*
 * The output's first dimension is the sum of the rows every rank sends
 * this one, which only those ranks know: a first alltoall sends each rank
 * a META record (the number of dimensions, the type, the rows it gets and
 * the other dimensions), the second moves the data into an output of the
 * size the records add up to. A rank whose input is invalid (its splits,
 * its rank) still takes part in the first step, with a record marked
 * invalid, so that every rank fails instead of waiting for it.
 */
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

static void a2a_free(a2a *a) {
    free(a->splits);
    free(a->sends);
    free(a->metas);
    free(a->counts);
    free(a);
}

static void a2a_release(twostep *t) { a2a_free((a2a *)t); }

/* The records are in: checks them, makes the outputs and moves the data
 * (helper thread). */
static void a2a_data(a2a *a) {
    const int64_t *mine = a->sends; /* the same but for the rows */
    int nd = (int)mine[0];
    int64_t dims[MAX_DIMS], total = 0, count;
    char nbuf[NAME_MAX_LEN + 8];
    TF_Status *s;
    TF_Tensor *out, *rsplits;
    hvd_handle h = NULL;
    hvd_status st;

    if (a->invalid[0] != '\0') {
        twostep_fail(&a->t, HVD_ERR_INVALID_ARG, a->invalid);
        return;
    }
    for (int r = 0; r < a->nranks; r++) {
        const int64_t *m = a->metas + (size_t)r * META;
        int agree = m[0] == mine[0] && m[1] == mine[1];
        char text[2048], x[256], y[256];

        if (m[0] < 0) {
            snprintf(text, sizeof(text),
                     "rank %d of the set passed an invalid alltoall (its "
                     "error says why)",
                     r);
            twostep_fail(&a->t, HVD_ERR_INVALID_ARG, text);
            return;
        }
        for (int d = 1; agree && d < nd; d++)
            agree = m[2 + d] == mine[2 + d];
        if (!agree) {
            int64_t mm[META];

            memcpy(mm, mine, sizeof(mm));
            mm[2] = a->rows;
            describe_meta(mm, x, sizeof(x));
            describe_meta(m, y, sizeof(y));
            snprintf(text, sizeof(text),
                     "ranks disagree on the type or the dimensions after the "
                     "first: this rank: %s; rank %d of the set: %s (rows "
                     "for this rank)",
                     x, r, y);
            twostep_fail(&a->t, HVD_ERR_MISMATCH, text);
            return;
        }
        total += m[2];
    }
    for (int d = 1; d < nd; d++)
        dims[d] = mine[2 + d];
    dims[0] = total;
    s = TF_NewStatus();
    out =
        TF_AllocateOutput(a->t.p->ctx, 0, TF_TensorType(a->in), dims, nd,
                          (size_t)total * a->row * hvd_dtype_size(a->type), s);
    if (TF_GetCode(s) == TF_OK)
        a->t.p->tensors[a->t.p->ntensors++] = out;
    dims[0] = a->nranks;
    rsplits = TF_GetCode(s) == TF_OK
                  ? TF_AllocateOutput(a->t.p->ctx, 1, TF_INT32, dims, 1,
                                      (size_t)a->nranks * sizeof(int32_t), s)
                  : NULL;
    if (TF_GetCode(s) != TF_OK) {
        TF_OpKernelContext_Failure(a->t.p->ctx, s);
        TF_DeleteStatus(s);
        pending_end(a->t.p);
        a2a_free(a);
        return;
    }
    TF_DeleteStatus(s);
    for (int r = 0; r < a->nranks; r++)
        ((int32_t *)TF_TensorData(rsplits))[r] =
            (int32_t)a->metas[(size_t)r * META + 2];
    TF_DeleteTensor(rsplits);
    a->t.step = 2;
    count = a->rows * (int64_t)a->row;
    st = hvd_ps_alltoall_async(
        a->t.k.ps, step_name(&a->t, "data", nbuf, sizeof(nbuf)), data_of(a->in),
        (size_t)count, a->counts, data_of(out), (size_t)total * a->row, NULL,
        a->type, &h);
    if (st == HVD_OK)
        st = hvd_on_done(h, twostep_step_done, &a->t);
    if (st != HVD_OK)
        twostep_fail(&a->t, st, hvd_last_error());
}

static void a2a_run(job *j) {
    a2a *a = (a2a *)j;

    if (a->t.st != HVD_OK) {
        twostep_fail(&a->t, a->t.st, a->t.error);
    } else if (a->t.step == 1) {
        a2a_data(a);
    } else {
        pending_end(a->t.p);
        a2a_free(a);
    }
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

static void alltoall_compute(void *kp, TF_OpKernelContext *ctx,
                             TF_AsyncOpKernelDoneCallback *done) {
    const kernel *k = kp;
    TF_Tensor *in = NULL, *sp = NULL;
    a2a *a = twostep_new(sizeof(*a), ctx, done, k, "alltoall", 4, a2a_run,
                         a2a_release);
    char nbuf[NAME_MAX_LEN + 8];
    int64_t mine[META] = {0};
    hvd_handle h = NULL;
    hvd_status st;
    int nd;

    if (a == NULL)
        return;
    pending *p = a->t.p;
    TF_Status *s = TF_NewStatus();
    TF_GetInput(ctx, 0, &in, s);
    if (TF_GetCode(s) == TF_OK)
        p->tensors[p->ntensors++] = in;
    if (TF_GetCode(s) == TF_OK)
        TF_GetInput(ctx, 1, &sp, s);
    if (TF_GetCode(s) == TF_OK)
        p->tensors[p->ntensors++] = sp;
    if (tf_failed(ctx, s)) {
        TF_DeleteStatus(s);
        pending_end(p);
        a2a_free(a);
        return;
    }
    TF_DeleteStatus(s);
    a->in = in;
    {
        char text[256];
        hvd_status why = not_member(k, text, sizeof(text));

        if (why != HVD_OK) {
            twostep_fail(&a->t, why, text);
            return;
        }
    }
    a->nranks = set_size(k->ps);
    a->splits = calloc((size_t)a->nranks, sizeof(int64_t));
    a->sends = calloc((size_t)a->nranks * META, sizeof(int64_t));
    a->metas = calloc((size_t)a->nranks * META, sizeof(int64_t));
    a->counts = calloc((size_t)a->nranks, sizeof(size_t));
    if (a->splits == NULL || a->sends == NULL || a->metas == NULL ||
        a->counts == NULL) {
        twostep_fail(&a->t, HVD_ERR_NO_MEMORY, "out of memory");
        return;
    }
    nd = TF_NumDims(in);
    if (nd < 1 || nd > MAX_DIMS) {
        snprintf(a->invalid, sizeof(a->invalid),
                 "an alltoall needs a tensor of 1 to %d dimensions; this one "
                 "has %d",
                 MAX_DIMS, nd);
    } else {
        int ht = hvd_type_of(TF_TensorType(in));

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
        dims_of(in, &mine[2]);
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
    st = hvd_ps_alltoall_async(
        k->ps, step_name(&a->t, "shape", nbuf, sizeof(nbuf)), a->sends,
        (size_t)a->nranks * META, NULL, a->metas, (size_t)a->nranks * META,
        NULL, HVD_INT64, &h);
    if (st == HVD_OK)
        st = hvd_on_done(h, twostep_step_done, &a->t);
    if (st != HVD_OK)
        twostep_fail(&a->t, st, hvd_last_error());
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
        fail_ctx(sc->p->ctx, sc->p->what, sc->p->name, sc->st, sc->error);
    pending_end(sc->p);
    pthread_mutex_destroy(&sc->lock);
    free(sc);
}

static void scatter_compute(const kernel *k, TF_OpKernelContext *ctx,
                            TF_AsyncOpKernelDoneCallback *done,
                            const char *what) {
    int n = TF_NumInputs(ctx);
    TF_Status *s = TF_NewStatus();
    pending *p = pending_new(ctx, done, what, k, 2 * n);
    scatter *sc = calloc(1, sizeof(*sc));
    TF_Tensor **ins = calloc((size_t)n + 1, sizeof(*ins));
    TF_Tensor **outs = calloc((size_t)n + 1, sizeof(*outs));
    int nranks = set_size(k->ps), me = set_rank(k->ps);
    char text[256];
    hvd_status why;

    if (p == NULL || sc == NULL || ins == NULL || outs == NULL) {
        fail_ctx(ctx, what, k->name, HVD_ERR_NO_MEMORY, "out of memory");
        free(sc);
        free(ins);
        free(outs);
        TF_DeleteStatus(s);
        if (p != NULL)
            pending_end(p);
        else
            TF_RunAsyncOpKernelDoneCallback(done);
        return;
    }
    text[0] = '\0';
    why = not_member(k, text, sizeof(text));
    if (why == HVD_OK)
        why = HVD_ERR_INVALID_ARG; /* for the dimensions, below */
    /* Every input and output first: a kernel fails whole or not at all. */
    for (int i = 0; i < n && text[0] == '\0'; i++) {
        int64_t dims[MAX_DIMS];
        size_t row = 1;
        int nd;

        TF_GetInput(ctx, i, &ins[i], s);
        if (TF_GetCode(s) != TF_OK)
            break;
        p->tensors[p->ntensors++] = ins[i];
        nd = TF_NumDims(ins[i]);
        if (nd < 1 || nd > MAX_DIMS) {
            snprintf(text, sizeof(text),
                     "a reduce-scatter needs a tensor of 1 to %d dimensions; "
                     "input %d has %d",
                     MAX_DIMS, i, nd);
            break;
        }
        dims_of(ins[i], dims);
        for (int d = 1; d < nd; d++)
            row *= (size_t)dims[d];
        dims[0] = (int64_t)hvd_reducescatter_count((size_t)dims[0], nranks, me);
        outs[i] = TF_AllocateOutput(
            ctx, i, TF_TensorType(ins[i]), dims, nd,
            (size_t)dims[0] * row * TF_DataTypeSize(TF_TensorType(ins[i])), s);
        if (TF_GetCode(s) != TF_OK)
            break;
        p->tensors[p->ntensors++] = outs[i];
    }
    if (TF_GetCode(s) != TF_OK || text[0] != '\0') {
        if (!tf_failed(ctx, s))
            fail_ctx(ctx, what, k->name, why, text);
        TF_DeleteStatus(s);
        free(sc);
        free(ins);
        free(outs);
        pending_end(p);
        return;
    }
    TF_DeleteStatus(s);
    if (!device_ready(p, k)) {
        free(sc);
        free(ins);
        free(outs);
        return;
    }
    sc->p = p;
    sc->left = n + 1;
    pthread_mutex_init(&sc->lock, NULL);
    for (int i = 0; i < n; i++) {
        char nbuf[NAME_MAX_LEN + 32];
        const char *name = op_name(k);
        int64_t shape[SHAPE_DIMS];
        hvd_handle h = NULL;
        hvd_status st;

        if (name != NULL && n > 1) {
            snprintf(nbuf, sizeof(nbuf), "%s_%dof%d", k->name, i + 1, n);
            name = nbuf;
        }
        st = hvd_ps_reducescatter_shaped_async(
            k->ps, name, data_of(ins[i]), data_of(outs[i]),
            shape_of(ins[i], shape), shape,
            (hvd_dtype)hvd_type_of(TF_TensorType(ins[i])), (hvd_op)k->reduce_op,
            &h);
        if (st == HVD_OK)
            st = hvd_on_done(h, scatter_part_done, sc);
        if (st != HVD_OK)
            scatter_part_done(st, hvd_last_error(), sc);
    }
    free(ins);
    free(outs);
    scatter_part_done(HVD_OK, NULL, sc); /* the submission's own share */
}

static void reducescatter_compute(void *kp, TF_OpKernelContext *ctx,
                                  TF_AsyncOpKernelDoneCallback *done) {
    scatter_compute(kp, ctx, done, "reducescatter");
}

static void grouped_reducescatter_compute(void *kp, TF_OpKernelContext *ctx,
                                          TF_AsyncOpKernelDoneCallback *done) {
    scatter_compute(kp, ctx, done, "grouped_reducescatter");
}

/* ------------------------------------------------------------------ */
/* Synchronous kernels: join, barrier, the job's facts                 */

static void scalar_out(TF_OpKernelContext *ctx, int32_t v) {
    TF_Status *s = TF_NewStatus();
    TF_Tensor *t = TF_AllocateOutput(ctx, 0, TF_INT32, NULL, 0, sizeof(v), s);

    if (TF_GetCode(s) == TF_OK) {
        memcpy(TF_TensorData(t), &v, sizeof(v));
        TF_DeleteTensor(t);
    } else {
        TF_OpKernelContext_Failure(ctx, s);
    }
    TF_DeleteStatus(s);
}

static void join_compute(void *k, TF_OpKernelContext *ctx) {
    int last = -1;
    hvd_status st = hvd_join(&last);

    (void)k;
    if (st != HVD_OK)
        fail_ctx(ctx, "join", "", st, hvd_last_error());
    else
        scalar_out(ctx, last);
}

static void barrier_compute(void *k, TF_OpKernelContext *ctx) {
    hvd_status st = hvd_barrier();

    (void)k;
    if (st != HVD_OK)
        fail_ctx(ctx, "barrier", "", st, hvd_last_error());
}

#define FACT_KERNEL(fn, call)                                                  \
    static void fn(void *k, TF_OpKernelContext *ctx) {                         \
        int v = call();                                                        \
        (void)k;                                                               \
        if (v < 0)                                                             \
            fail_ctx(ctx, #call, "", HVD_ERR_NOT_INITIALIZED,                  \
                     "hvd is not initialized: call hvd.init() first");         \
        else                                                                   \
            scalar_out(ctx, v);                                                \
    }
FACT_KERNEL(size_compute, hvd_size)
FACT_KERNEL(rank_compute, hvd_rank)
FACT_KERNEL(local_size_compute, hvd_local_size)
FACT_KERNEL(local_rank_compute, hvd_local_rank)

/* ------------------------------------------------------------------ */
/* Shapes                                                              */

/* Every output i has input i's shape. */
static void shape_same(TF_ShapeInferenceContext *c, TF_Status *s) {
    int64_t n = TF_ShapeInferenceContextNumInputs(c);
    TF_ShapeHandle *h = TF_NewShapeHandle();

    for (int64_t i = 0; i < n && TF_GetCode(s) == TF_OK; i++) {
        TF_ShapeInferenceContextGetInput(c, (int)i, h, s);
        if (TF_GetCode(s) == TF_OK)
            TF_ShapeInferenceContextSetOutput(c, (int)i, h, s);
    }
    TF_DeleteShapeHandle(h);
}

/* No outputs. */
static void shape_none(TF_ShapeInferenceContext *c, TF_Status *s) {
    (void)c;
    (void)s;
}

static void shape_scalar(TF_ShapeInferenceContext *c, TF_Status *s) {
    TF_ShapeHandle *h = TF_ShapeInferenceContextScalar(c);

    TF_ShapeInferenceContextSetOutput(c, 0, h, s);
    TF_DeleteShapeHandle(h);
}

/* The first dimension is known only when it runs (python/hvd/tensorflow
 * sets the others on the result). */
static void shape_unknown(TF_ShapeInferenceContext *c, TF_Status *s) {
    TF_ShapeInferenceContextSetUnknownShape(c, s);
}

/* Output i is input i with an unknown first dimension (known when it
 * runs: the rows it gets), for i below n; a scalar input is refused. */
static void rows_unknown(TF_ShapeInferenceContext *c, int n, TF_Status *s) {
    TF_ShapeHandle *in = TF_NewShapeHandle(), *rest = TF_NewShapeHandle();
    TF_ShapeHandle *out = TF_NewShapeHandle();
    TF_ShapeHandle *first = TF_ShapeInferenceContextVectorFromSize(c, -1);

    for (int i = 0; i < n && TF_GetCode(s) == TF_OK; i++) {
        TF_ShapeInferenceContextGetInput(c, i, in, s);
        if (TF_GetCode(s) == TF_OK)
            TF_ShapeInferenceContextWithRankAtLeast(c, in, 1, in, s);
        if (TF_GetCode(s) == TF_OK)
            TF_ShapeInferenceContextSubshape(c, in, 1, INT64_MAX, rest, s);
        if (TF_GetCode(s) == TF_OK)
            TF_ShapeInferenceContextConcatenateShapes(c, first, rest, out, s);
        if (TF_GetCode(s) == TF_OK)
            TF_ShapeInferenceContextSetOutput(c, i, out, s);
    }
    TF_DeleteShapeHandle(first);
    TF_DeleteShapeHandle(out);
    TF_DeleteShapeHandle(rest);
    TF_DeleteShapeHandle(in);
}

/* Reduce-scatters: every input's rows are cut. */
static void shape_scattered(TF_ShapeInferenceContext *c, TF_Status *s) {
    rows_unknown(c, (int)TF_ShapeInferenceContextNumInputs(c), s);
}

/* Alltoall: the rows received, and one count per member. */
static void shape_alltoall(TF_ShapeInferenceContext *c, TF_Status *s) {
    rows_unknown(c, 1, s);
    if (TF_GetCode(s) == TF_OK) {
        TF_ShapeHandle *v = TF_ShapeInferenceContextVectorFromSize(c, -1);
        TF_ShapeInferenceContextSetOutput(c, 1, v, s);
        TF_DeleteShapeHandle(v);
    }
}

/* ------------------------------------------------------------------ */
/* Registration                                                        */

typedef struct op_spec {
    const char *name;
    const char *attrs[6];
    const char *inputs[2];
    const char *outputs[2];
    void (*shape)(TF_ShapeInferenceContext *, TF_Status *);
    void (*async_fn)(void *, TF_OpKernelContext *,
                     TF_AsyncOpKernelDoneCallback *);
    void (*sync_fn)(void *, TF_OpKernelContext *);
    int gpu; /* also a GPU kernel (for the types libhvd has) */
} op_spec;

/* The process set an operation runs in (0: every rank; hvd.h, "Process
 * sets"). */
#define PS_ATTR "process_set_id: int = 0"

static const op_spec specs[] = {
    {"HvdAllreduce",
     {"T: " REDUCIBLE, "reduce_op: int", "tensor_name: string = ''", PS_ATTR},
     {"tensor: T"},
     {"sum: T"},
     shape_same,
     allreduce_compute,
     NULL,
     1},
    {"HvdGroupedAllreduce",
     {"T: " REDUCIBLE, "N: int >= 1", "reduce_op: int",
      "tensor_name: string = ''", PS_ATTR},
     {"tensors: N * T"},
     {"sums: N * T"},
     shape_same,
     grouped_compute,
     NULL,
     1},
    {"HvdBroadcast",
     {"T: " MOVABLE, "root_rank: int", "tensor_name: string = ''", PS_ATTR},
     {"tensor: T"},
     {"output: T"},
     shape_same,
     broadcast_compute,
     NULL,
     1},
    {"HvdAllgather",
     {"T: " MOVABLE, "tensor_name: string = ''", PS_ATTR},
     {"tensor: T"},
     {"output: T"},
     shape_unknown,
     allgather_compute,
     NULL,
     0},
    /* libhvd takes host memory only for these two (for now): no GPU
     * kernels, TensorFlow copies GPU tensors to the host and back. */
    {"HvdAlltoall",
     {"T: " MOVABLE, "tensor_name: string = ''", PS_ATTR},
     {"tensor: T", "splits: int32"},
     {"output: T", "received_splits: int32"},
     shape_alltoall,
     alltoall_compute,
     NULL,
     0},
    {"HvdReducescatter",
     {"T: " REDUCIBLE, "reduce_op: int", "tensor_name: string = ''", PS_ATTR},
     {"tensor: T"},
     {"output: T"},
     shape_scattered,
     reducescatter_compute,
     NULL,
     0},
    {"HvdGroupedReducescatter",
     {"T: " REDUCIBLE, "N: int >= 1", "reduce_op: int",
      "tensor_name: string = ''", PS_ATTR},
     {"tensors: N * T"},
     {"outputs: N * T"},
     shape_scattered,
     grouped_reducescatter_compute,
     NULL,
     0},
    {"HvdJoin",
     {NULL},
     {NULL},
     {"last_rank: int32"},
     shape_scalar,
     NULL,
     join_compute,
     0},
    {"HvdBarrier",
     {NULL},
     {NULL},
     {NULL},
     shape_none,
     NULL,
     barrier_compute,
     0},
    {"HvdSize",
     {NULL},
     {NULL},
     {"size: int32"},
     shape_scalar,
     NULL,
     size_compute,
     0},
    {"HvdRank",
     {NULL},
     {NULL},
     {"rank: int32"},
     shape_scalar,
     NULL,
     rank_compute,
     0},
    {"HvdLocalSize",
     {NULL},
     {NULL},
     {"local_size: int32"},
     shape_scalar,
     NULL,
     local_size_compute,
     0},
    {"HvdLocalRank",
     {NULL},
     {NULL},
     {"local_rank: int32"},
     shape_scalar,
     NULL,
     local_rank_compute,
     0},
};

static void register_op(const op_spec *o) {
    TF_Status *s = TF_NewStatus();
    TF_OpDefinitionBuilder *b = TF_NewOpDefinitionBuilder(o->name);
    TF_KernelBuilder *kb;

    for (int i = 0; i < 6 && o->attrs[i] != NULL; i++)
        TF_OpDefinitionBuilderAddAttr(b, o->attrs[i]);
    for (int i = 0; i < 2 && o->inputs[i] != NULL; i++)
        TF_OpDefinitionBuilderAddInput(b, o->inputs[i]);
    for (int i = 0; i < 2 && o->outputs[i] != NULL; i++)
        TF_OpDefinitionBuilderAddOutput(b, o->outputs[i]);
    /* Never folded, pruned or merged: each run is a collective. */
    TF_OpDefinitionBuilderSetIsStateful(b, true);
    if (o->shape != NULL)
        TF_OpDefinitionBuilderSetShapeInferenceFunction(b, o->shape);
    TF_RegisterOpDefinition(b, s);
    if (TF_GetCode(s) != TF_OK) {
        fprintf(stderr, "hvd: registering the op %s failed: %s\n", o->name,
                TF_Message(s));
        TF_DeleteStatus(s);
        return;
    }
    if (o->async_fn != NULL)
        kb = TF_NewAsyncKernelBuilder(o->name, "CPU", kernel_create,
                                      o->async_fn, kernel_delete);
    else
        kb = TF_NewKernelBuilder(o->name, "CPU", kernel_create, o->sync_fn,
                                 kernel_delete);
    TF_RegisterKernelBuilder(o->name, kb, s);
    if (TF_GetCode(s) != TF_OK)
        fprintf(stderr, "hvd: registering the kernel of %s failed: %s\n",
                o->name, TF_Message(s));
    /* GPU kernels, one per type libhvd has (a type constraint takes one
     * type): their tensors' device memory goes to libhvd's device path.
     * Other types, and allgather, run on the CPU kernel, with TensorFlow's
     * copies to and from the GPU. */
    static const TF_DataType gpu_types[] = {TF_UINT8, TF_INT8,  TF_INT32,
                                            TF_INT64, TF_HALF,  TF_BFLOAT16,
                                            TF_FLOAT, TF_DOUBLE};
    for (size_t i = 0; o->gpu && TF_GetCode(s) == TF_OK &&
                       i < sizeof(gpu_types) / sizeof(gpu_types[0]);
         i++) {
        kb = TF_NewAsyncKernelBuilder(o->name, "GPU", kernel_create_gpu,
                                      o->async_fn, kernel_delete);
        TF_KernelBuilder_TypeConstraint(kb, "T", gpu_types[i], s);
        if (TF_GetCode(s) == TF_OK)
            TF_RegisterKernelBuilder(o->name, kb, s);
        else
            TF_DeleteKernelBuilder(kb);
        if (TF_GetCode(s) != TF_OK)
            fprintf(stderr,
                    "hvd: registering the GPU kernel of %s failed: %s\n",
                    o->name, TF_Message(s));
    }
    TF_DeleteStatus(s);
}

__attribute__((constructor)) static void register_all(void) {
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        register_op(&specs[i]);
}
