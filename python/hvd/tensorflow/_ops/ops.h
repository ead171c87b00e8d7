/*
 * The TensorFlow op library (libhvd_tensorflow.so): TensorFlow ops over
 * libhvd. HvdAllreduce, HvdGroupedAllreduce, HvdBroadcast, HvdAllgather,
 * HvdAlltoall, HvdReducescatter, HvdGroupedReducescatter (asynchronous
 * kernels), HvdJoin, HvdBarrier, HvdSize, HvdRank, HvdLocalSize,
 * HvdLocalRank (synchronous ones). The collectives take a process_set_id
 * attr (0, every rank, by default) and call libhvd's hvd_ps_ forms.
 *
 * Written against TensorFlow's C API only (tensorflow/c/kernels.h,
 * tensorflow/c/ops.h), so one source builds for any TensorFlow 2 with
 * those headers and needs no C++ ABI match. python/hvd/tensorflow loads
 * the library with tf.load_op_library; the registrations run when it is
 * loaded (a constructor function).
 *
 * An asynchronous kernel hands the tensors' memory to libhvd's _async call
 * and returns; libhvd calls back (hvd_on_done) on its engine thread when
 * the operation has finished, and the callback ends the kernel (through
 * keep_done.cc). TensorFlow's executor runs other ops meanwhile, so every
 * gradient of a step is in flight at once and the engine fuses them. Work
 * that is more than a few instructions (the second step of an allgather or
 * an alltoall, copying a padded allgather into place) is not done on the
 * engine thread but on this library's one helper thread.
 *
 * A failure ends the kernel with a TensorFlow error whose message is
 * "hvd <op> '<name>' on rank R: <libhvd's sentence> [HVD_ERR_...]".
 *
 * The files, by role; each calls only those below it:
 *   register.c      the ops' definitions, shape functions and kernel
 *                   registrations, the kernels' construction, and the
 *                   synchronous kernels (join, barrier, size and rank)
 *   reduce.c        allreduce, grouped allreduce, broadcast and
 *                   reduce-scatter: one libhvd call per tensor
 *   allgather.c     allgather   } operations in two libhvd steps: the
 *   alltoall.c      alltoall    } shapes first, then the data
 *   twostep.c       what those two share: the steps' callback, failure
 *   glue.c          conversions (types, statuses), failing a kernel, the
 *                   helper thread, a running kernel's record (pending)
 *   keep_done.cc, device_sync.cc: the two things the C API cannot do (C++)
 *
 * Error paths: a function has one cleanup label, reached through
 * CHECK_HVD_GOTO and CHECK_TF_GOTO; a kernel that has started fails and ends
 * through hvd_tf_pending_fail (or hvd_tf_twostep_end), which passes on
 * TensorFlow's own failure where there is one and hvd's otherwise.
 */
#ifndef HVD_TF_OPS_H
#define HVD_TF_OPS_H

#include <hvd/hvd.h>

/* kernels.h defines this constant, which in C (unlike C++) has external
 * linkage: weak, so that every file of the library may include it. */
#pragma weak TF_InputRange_Args_STRUCT_SIZE
#include <tensorflow/c/kernels.h>
#include <tensorflow/c/tf_status.h>
#include <tensorflow/c/tf_tensor.h>

#include <stddef.h>
#include <stdint.h>

#define NAME_MAX_LEN 512
#define MAX_DIMS 16

/* The shape libhvd compares across ranks (hvd_allreduce_shaped_async):
 * at most 8 dimensions, those past the eighth folded into it. */
enum { SHAPE_DIMS = 8 };

/* A two-step operation's record per rank: the number of dimensions, the
 * type, then each dimension. */
#define META (2 + MAX_DIMS)

/* NCCL's NCCLCHECKGOTO: st = call, and on a failure a jump to the
 * function's one cleanup label. */
#define CHECK_HVD_GOTO(call, st, label)                                        \
    do {                                                                       \
        (st) = (call);                                                         \
        if ((st) != HVD_OK)                                                    \
            goto label;                                                        \
    } while (0)

/* The same for a TensorFlow call that reported into the status s. */
#define CHECK_TF_GOTO(s, label)                                                \
    do {                                                                       \
        if (TF_GetCode(s) != TF_OK)                                            \
            goto label;                                                        \
    } while (0)

/* keep_done.cc: the kernel's completion, kept past the compute function
 * (TensorFlow's C API gives a pointer that dies with it). */
void *hvd_tf_keep_done(void *done);
void hvd_tf_run_done(void *kept);
/* device_sync.cc, a library of its own (HVD_TF_GPU_LIBRARY, loaded by
 * glue.c at the first GPU kernel): waits for the kernel's GPU stream (0),
 * or -1 and why. */
int hvd_tf_sync_device(TF_OpKernelContext *ctx, char *why, size_t whylen);
#define HVD_TF_GPU_LIBRARY "libhvd_tensorflow_gpu.so"

/* ------------------------------------------------------------------ */
/* glue.c                                                              */

/* hvd's type for a TensorFlow one; -1 when hvd has none. */
int hvd_tf_type_of(TF_DataType t);

/* Fails the kernel of ctx with hvd's status and sentence. */
void hvd_tf_fail(TF_OpKernelContext *ctx, const char *what, const char *name,
                 hvd_status st, const char *sentence);

/* A failure of TensorFlow's own (an allocation): passed on as it is;
 * 1 if there was one. */
int hvd_tf_failed(TF_OpKernelContext *ctx, TF_Status *s);

/* HVD_ERR_NO_MEMORY, with its sentence in why. */
hvd_status hvd_tf_no_memory(char *why, size_t len);

/* A piece of work for the helper thread, embedded in what it works on. */
typedef struct job {
    struct job *next;
    void (*run)(struct job *);
} job;

/* Queues j for the helper thread (any thread, the engine's included).
 * Returns nonzero if the thread could not be started. */
int hvd_tf_post_job(job *j);

/* What every kernel remembers from its construction. */
typedef struct kernel {
    char name[NAME_MAX_LEN]; /* the tensor_name attr: "" means unnamed */
    int reduce_op;
    int root_rank;
    int ps;     /* the process_set_id attr: 0 is every rank */
    int on_gpu; /* a GPU kernel: its tensors are in device memory */
    /* The blocking attr (an eager call, register.c): a CPU kernel runs
     * libhvd's blocking form on the calling thread. */
    int blocking;
} kernel;

/* libhvd's name for an operation: NULL for an unnamed one (matched by
 * order, which is program order in eager mode). */
const char *hvd_tf_op_name(const kernel *k);

/* The members of process set ps (the job's size for 0), or -1 when there
 * is no such set. */
int hvd_tf_set_size(int ps);

/* This rank's place in set ps, or -1 when it is not a member. */
int hvd_tf_set_rank(int ps);

/* HVD_OK when this rank may run k's operation in its set; else why not,
 * in why. */
hvd_status hvd_tf_not_member(const kernel *k, char *why, size_t len);

/* t's dimensions (the first MAX_DIMS) into dims; returns how many t has. */
int hvd_tf_dims_of(TF_Tensor *t, int64_t *dims);

/* t's shape as libhvd compares it (SHAPE_DIMS at most); returns its
 * number of dimensions. */
int hvd_tf_shape_of(TF_Tensor *t, int64_t *dims);

/* A buffer libhvd accepts for a tensor that may be empty (TensorFlow may
 * give NULL for no elements). */
void *hvd_tf_data_of(TF_Tensor *t);

/* One running kernel: what its end needs. */
typedef struct pending {
    TF_OpKernelContext *ctx;
    void *done;   /* hvd_tf_keep_done's copy */
    TF_Status *s; /* for the kernel's TensorFlow calls */
    const char *what;
    char name[NAME_MAX_LEN];
    int ntensors;
    TF_Tensor **tensors; /* inputs and outputs to release at the end */
} pending;

/* The record of the kernel k's call in ctx, with room for ntensors; NULL,
 * with ctx failed and done called, when out of memory. */
pending *hvd_tf_pending_start(TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done,
                              const char *what, const kernel *k, int ntensors);

/* Keeps t (an input or output; NULL is none) until the kernel ends. */
void hvd_tf_pending_keep(pending *p, TF_Tensor *t);

/* Releases p's tensors and ends its kernel. */
void hvd_tf_pending_end(pending *p);

/*
 * Fails p's kernel and ends it: with TensorFlow's own failure when p->s
 * holds one (passed on as it is), else with hvd's st and sentence (NULL:
 * libhvd's last error on this thread, the failed call being libhvd's);
 * with neither, it only ends it.
 */
void hvd_tf_pending_fail(pending *p, hvd_status st, const char *sentence);

/* A GPU kernel's inputs are only queued on TensorFlow's stream when it
 * runs: waits until they are there, before libhvd (on a stream of its
 * own) reads them. HVD_OK when ready; else why not, in why. */
hvd_status hvd_tf_device_ready(const pending *p, const kernel *k, char *why,
                               size_t len);

/* Hands h to the kernel's end (on libhvd's completion), or fails and ends
 * the kernel with the submission's st. p is no longer the caller's. */
void hvd_tf_submitted(pending *p, hvd_status st, hvd_handle h);

/* Whether k runs libhvd's blocking form on the calling thread. */
static inline int hvd_tf_blocking(const kernel *k) {
    return k->blocking && !k->on_gpu;
}

/* Ends p's kernel after libhvd's blocking call returned st: a failure
 * says what the asynchronous form's would (hvd_last_error without the
 * blocking call's own prefix). */
void hvd_tf_ended(pending *p, hvd_status st);

/* libhvd's last error on this thread after a blocking call failed, without
 * the call's own prefix: what the asynchronous form's failure says. */
const char *hvd_tf_blocking_error(void);

/* ------------------------------------------------------------------ */
/* twostep.c                                                           */

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

/* Whether t's steps are libhvd's blocking calls, run on the calling
 * thread (an eager CPU kernel), one after the other. */
static inline int hvd_tf_twostep_blocking(const twostep *t) {
    return hvd_tf_blocking(&t->k);
}

/*
 * A new operation of size bytes (a gather or an a2a: a twostep first) for
 * the kernel k's call in ctx, at its first step, with its pending (room
 * for ntensors); NULL, with ctx failed and done called, when out of memory.
 */
void *hvd_tf_twostep_new(size_t size, TF_OpKernelContext *ctx,
                         TF_AsyncOpKernelDoneCallback *done, const kernel *k,
                         const char *what, int ntensors, void (*run)(job *),
                         void (*release)(twostep *));

/* Ends t's kernel as hvd_tf_pending_fail does (st HVD_OK and no failure
 * of TensorFlow's: the operation is done) and frees t. */
void hvd_tf_twostep_end(twostep *t, hvd_status st, const char *sentence);

/* Hands h, the handle of a step's submission whose status is st, to the
 * helper thread for when the step finishes: HVD_OK, and t is no longer the
 * caller's; else what failed, with libhvd's sentence in why. For a
 * blocking kernel (hvd_tf_blocking: the step was libhvd's blocking call,
 * st its result, h NULL) what comes next runs at once on this thread
 * instead, and the result is HVD_OK. */
hvd_status hvd_tf_twostep_submitted(twostep *t, hvd_status st, hvd_handle h,
                                    char *why, size_t len);

/* A sub-name for one step: "<name>.shape", "<name>.data" (NULL stays NULL:
 * unnamed steps match by order like their op). */
const char *hvd_tf_step_name(const twostep *t, const char *suffix, char *buf,
                             size_t len);

/* A META record in words: "type T, shape [d0, d1, ...]". */
void hvd_tf_describe_meta(const int64_t *m, char *out, size_t len);

/* ------------------------------------------------------------------ */
/* The asynchronous kernels (reduce.c, allgather.c, alltoall.c)        */

void hvd_tf_allreduce_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done);
void hvd_tf_grouped_compute(void *kp, TF_OpKernelContext *ctx,
                            TF_AsyncOpKernelDoneCallback *done);
void hvd_tf_broadcast_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done);
void hvd_tf_reducescatter_compute(void *kp, TF_OpKernelContext *ctx,
                                  TF_AsyncOpKernelDoneCallback *done);
void hvd_tf_grouped_reducescatter_compute(void *kp, TF_OpKernelContext *ctx,
                                          TF_AsyncOpKernelDoneCallback *done);
void hvd_tf_allgather_compute(void *kp, TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done);
void hvd_tf_alltoall_compute(void *kp, TF_OpKernelContext *ctx,
                             TF_AsyncOpKernelDoneCallback *done);

#endif
