/*
 * The ops' definitions and their kernels' registrations (run when the
 * library is loaded, by a constructor function: tf.load_op_library has no
 * other hook for a C library), the shape functions, the kernels'
 * construction from their attrs, and the synchronous kernels: join,
 * barrier and the job's facts (size, rank, local size and rank, a process
 * set's size and whether this rank is in it).
 */
#include "python/hvd/tensorflow/_ops/ops.h"

/* ops.h declares these as C++ does (struct tags only); C needs the names. */
typedef struct TF_DimensionHandle TF_DimensionHandle;
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
#include <tensorflow/c/ops.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The element types an allreduce can reduce. */
#define REDUCIBLE "{uint8, int8, int32, int64, half, bfloat16, float, double}"
/* What a broadcast or an allgather can move (as bytes, when libhvd has no
 * type of that width and kind). */
#define MOVABLE                                                                \
    "{uint8, int8, uint16, int16, uint32, int32, uint64, int64, half, "        \
    "bfloat16, float, double, bool}"

/* ------------------------------------------------------------------ */
/* Kernels' construction                                               */

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
        goto delete_status;
    }
    if (TF_OpKernelConstruction_HasAttr(c, "tensor_name", s))
        get_string_attr(c, "tensor_name", k->name, sizeof(k->name), s);
    CHECK_TF_GOTO(s, delete_status);
    if (TF_OpKernelConstruction_HasAttr(c, "reduce_op", s))
        TF_OpKernelConstruction_GetAttrInt32(c, "reduce_op", &k->reduce_op, s);
    CHECK_TF_GOTO(s, delete_status);
    if (TF_OpKernelConstruction_HasAttr(c, "root_rank", s))
        TF_OpKernelConstruction_GetAttrInt32(c, "root_rank", &k->root_rank, s);
    CHECK_TF_GOTO(s, delete_status);
    if (TF_OpKernelConstruction_HasAttr(c, "process_set_id", s))
        TF_OpKernelConstruction_GetAttrInt32(c, "process_set_id", &k->ps, s);
    CHECK_TF_GOTO(s, delete_status);
    if (TF_OpKernelConstruction_HasAttr(c, "blocking", s)) {
        TF_Bool blocking = 0;

        TF_OpKernelConstruction_GetAttrBool(c, "blocking", &blocking, s);
        k->blocking = blocking != 0;
    }
delete_status:
    /* A kernel that failed is still returned, for kernel_delete. */
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
        hvd_tf_fail(ctx, "join", "", st, hvd_last_error());
    else
        scalar_out(ctx, last);
}

static void barrier_compute(void *k, TF_OpKernelContext *ctx) {
    hvd_status st = hvd_barrier();

    (void)k;
    if (st != HVD_OK)
        hvd_tf_fail(ctx, "barrier", "", st, hvd_last_error());
}

#define FACT_KERNEL(fn, call)                                                  \
    static void fn(void *k, TF_OpKernelContext *ctx) {                         \
        int v = call();                                                        \
        (void)k;                                                               \
        if (v < 0)                                                             \
            hvd_tf_fail(ctx, #call, "", HVD_ERR_NOT_INITIALIZED,               \
                        "hvd is not initialized: call hvd.init() first");      \
        else                                                                   \
            scalar_out(ctx, v);                                                \
    }
FACT_KERNEL(rank_compute, hvd_rank)
FACT_KERNEL(local_size_compute, hvd_local_size)
FACT_KERNEL(local_rank_compute, hvd_local_rank)

/* Horovod's value for a process set that does not exist
 * (HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET): its size_op and
 * process_set_included_op return it rather than failing, and so do these. */
#define UNKNOWN_SET (-3)

/* The members of the kernel's process set (the job's size for set 0). */
static void size_compute(void *k, TF_OpKernelContext *ctx) {
    int ps = ((const kernel *)k)->ps;
    int v;

    if (hvd_size() < 0) {
        hvd_tf_fail(ctx, "hvd_size", "", HVD_ERR_NOT_INITIALIZED,
                    "hvd is not initialized: call hvd.init() first");
        return;
    }
    v = ps == 0 ? hvd_size() : hvd_process_set_size(ps);
    scalar_out(ctx, v < 0 ? UNKNOWN_SET : v);
}

/* 1 if this rank is a member of the kernel's process set, else 0. */
static void included_compute(void *k, TF_OpKernelContext *ctx) {
    int ps = ((const kernel *)k)->ps;

    if (hvd_size() < 0) {
        hvd_tf_fail(ctx, "hvd_process_set_rank", "", HVD_ERR_NOT_INITIALIZED,
                    "hvd is not initialized: call hvd.init() first");
        return;
    }
    if (ps != 0 && hvd_process_set_size(ps) < 0)
        scalar_out(ctx, UNKNOWN_SET);
    else
        scalar_out(ctx, ps == 0 || hvd_process_set_rank(ps) >= 0);
}

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
/* Set by the Python wrapper when it executes eagerly: the CPU kernel then
 * runs libhvd's blocking call on the calling thread (which drives the
 * engine, docs/design.md "From Python"). Inside a graph an inter-op thread
 * must not block: the op stays asynchronous. Either way the call is the
 * same (name, buffers, shape, type, op), so ranks may mix them. */
#define BLOCKING_ATTR "blocking: bool = false"

static const op_spec specs[] = {
    {"HvdAllreduce",
     {"T: " REDUCIBLE, "reduce_op: int", "tensor_name: string = ''", PS_ATTR,
      BLOCKING_ATTR},
     {"tensor: T"},
     {"sum: T"},
     shape_same,
     hvd_tf_allreduce_compute,
     NULL,
     1},
    {"HvdGroupedAllreduce",
     {"T: " REDUCIBLE, "N: int >= 1", "reduce_op: int",
      "tensor_name: string = ''", PS_ATTR, BLOCKING_ATTR},
     {"tensors: N * T"},
     {"sums: N * T"},
     shape_same,
     hvd_tf_grouped_compute,
     NULL,
     1},
    {"HvdBroadcast",
     {"T: " MOVABLE, "root_rank: int", "tensor_name: string = ''", PS_ATTR,
      BLOCKING_ATTR},
     {"tensor: T"},
     {"output: T"},
     shape_same,
     hvd_tf_broadcast_compute,
     NULL,
     1},
    {"HvdAllgather",
     {"T: " MOVABLE, "tensor_name: string = ''", PS_ATTR, BLOCKING_ATTR},
     {"tensor: T"},
     {"output: T"},
     shape_unknown,
     hvd_tf_allgather_compute,
     NULL,
     0},
    /* libhvd takes host memory only for these two (for now): no GPU
     * kernels, TensorFlow copies GPU tensors to the host and back. */
    {"HvdAlltoall",
     {"T: " MOVABLE, "tensor_name: string = ''", PS_ATTR, BLOCKING_ATTR},
     {"tensor: T", "splits: int32"},
     {"output: T", "received_splits: int32"},
     shape_alltoall,
     hvd_tf_alltoall_compute,
     NULL,
     0},
    {"HvdReducescatter",
     {"T: " REDUCIBLE, "reduce_op: int", "tensor_name: string = ''", PS_ATTR,
      BLOCKING_ATTR},
     {"tensor: T"},
     {"output: T"},
     shape_scattered,
     hvd_tf_reducescatter_compute,
     NULL,
     0},
    {"HvdGroupedReducescatter",
     {"T: " REDUCIBLE, "N: int >= 1", "reduce_op: int",
      "tensor_name: string = ''", PS_ATTR, BLOCKING_ATTR},
     {"tensors: N * T"},
     {"outputs: N * T"},
     shape_scattered,
     hvd_tf_grouped_reducescatter_compute,
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
     {PS_ATTR},
     {NULL},
     {"size: int32"},
     shape_scalar,
     NULL,
     size_compute,
     0},
    {"HvdProcessSetIncluded",
     {PS_ATTR},
     {NULL},
     {"included: int32"},
     shape_scalar,
     NULL,
     included_compute,
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

/* GPU kernels of o, one per type libhvd has (a type constraint takes one
 * type): their tensors' device memory goes to libhvd's device path. Other
 * types, and allgather, run on the CPU kernel, with TensorFlow's copies to
 * and from the GPU. None when s holds a failure already. */
static void register_gpu_kernels(const op_spec *o, TF_Status *s) {
    static const TF_DataType gpu_types[] = {TF_UINT8, TF_INT8,  TF_INT32,
                                            TF_INT64, TF_HALF,  TF_BFLOAT16,
                                            TF_FLOAT, TF_DOUBLE};

    for (size_t i = 0;
         TF_GetCode(s) == TF_OK && i < sizeof(gpu_types) / sizeof(gpu_types[0]);
         i++) {
        TF_KernelBuilder *kb = TF_NewAsyncKernelBuilder(
            o->name, "GPU", kernel_create_gpu, o->async_fn, kernel_delete);

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
}

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
        goto delete_status;
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
    if (o->gpu)
        register_gpu_kernels(o, s);
delete_status:
    TF_DeleteStatus(s);
}

__attribute__((constructor)) static void register_all(void) {
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        register_op(&specs[i]);
}
