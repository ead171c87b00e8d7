/*
 * The op library's common parts (ops.h lists the files): conversions
 * between TensorFlow's and hvd's types and statuses, failing a kernel,
 * the helper thread, the process-set and tensor helpers, and a running
 * kernel's record (pending) from its start to its end.
 */
#include "python/hvd/tensorflow/_ops/ops.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Types, names, errors                                                */

int hvd_tf_type_of(TF_DataType t) {
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
    case HVD_ERR_PROTOCOL:
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

void hvd_tf_fail(TF_OpKernelContext *ctx, const char *what, const char *name,
                 hvd_status st, const char *sentence) {
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

int hvd_tf_failed(TF_OpKernelContext *ctx, TF_Status *s) {
    if (TF_GetCode(s) == TF_OK)
        return 0;
    TF_OpKernelContext_Failure(ctx, s);
    return 1;
}

hvd_status hvd_tf_no_memory(char *why, size_t len) {
    snprintf(why, len, "out of memory");
    return HVD_ERR_NO_MEMORY;
}

/* ------------------------------------------------------------------ */
/* The helper thread                                                   */

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

int hvd_tf_post_job(job *j) {
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
/* Process sets and tensors                                            */

const char *hvd_tf_op_name(const kernel *k) {
    return k->name[0] != '\0' ? k->name : NULL;
}

int hvd_tf_set_size(int ps) {
    return ps == 0 ? hvd_size() : hvd_process_set_size(ps);
}

int hvd_tf_set_rank(int ps) {
    return ps == 0 ? hvd_rank() : hvd_process_set_rank(ps);
}

hvd_status hvd_tf_not_member(const kernel *k, char *why, size_t len) {
    if (!hvd_initialized()) {
        snprintf(why, len, "hvd is not initialized: call hvd.init() first");
        return HVD_ERR_NOT_INITIALIZED;
    }
    if (hvd_tf_set_size(k->ps) >= 1 && hvd_tf_set_rank(k->ps) >= 0)
        return HVD_OK;
    snprintf(why, len,
             "rank %d is not a member of process set %d (or there is no "
             "such set): only its members may call its operations",
             hvd_rank(), k->ps);
    return HVD_ERR_INVALID_ARG;
}

int hvd_tf_dims_of(TF_Tensor *t, int64_t *dims) {
    int n = TF_NumDims(t);

    for (int i = 0; i < n && i < MAX_DIMS; i++)
        dims[i] = TF_Dim(t, i);
    return n;
}

int hvd_tf_shape_of(TF_Tensor *t, int64_t *dims) {
    int n = TF_NumDims(t);

    for (int i = 0; i < n; i++) {
        if (i < SHAPE_DIMS)
            dims[i] = TF_Dim(t, i);
        else
            dims[SHAPE_DIMS - 1] *= TF_Dim(t, i);
    }
    return n < SHAPE_DIMS ? n : SHAPE_DIMS;
}

void *hvd_tf_data_of(TF_Tensor *t) {
    static char empty[8];
    void *p = TF_TensorData(t);

    return p != NULL ? p : empty;
}

/* ------------------------------------------------------------------ */
/* A running kernel                                                    */

pending *hvd_tf_pending_start(TF_OpKernelContext *ctx,
                              TF_AsyncOpKernelDoneCallback *done,
                              const char *what, const kernel *k, int ntensors) {
    pending *p = calloc(1, sizeof(*p) + (size_t)ntensors * sizeof(TF_Tensor *));

    if (p != NULL)
        p->done = hvd_tf_keep_done(done);
    if (p == NULL || p->done == NULL) {
        hvd_tf_fail(ctx, what, k->name, HVD_ERR_NO_MEMORY, "out of memory");
        free(p);
        TF_RunAsyncOpKernelDoneCallback(done);
        return NULL;
    }
    p->ctx = ctx;
    p->s = TF_NewStatus();
    p->what = what;
    snprintf(p->name, sizeof(p->name), "%s", k->name);
    p->tensors = (TF_Tensor **)(p + 1);
    return p;
}

void hvd_tf_pending_keep(pending *p, TF_Tensor *t) {
    if (t != NULL)
        p->tensors[p->ntensors++] = t;
}

void hvd_tf_pending_end(pending *p) {
    void *done = p->done;

    for (int i = 0; i < p->ntensors; i++)
        TF_DeleteTensor(p->tensors[i]);
    TF_DeleteStatus(p->s);
    free(p);
    hvd_tf_run_done(done);
}

void hvd_tf_pending_fail(pending *p, hvd_status st, const char *sentence) {
    /* hvd_tf_failed passes TensorFlow's own failure on, which then wins. */
    if (!hvd_tf_failed(p->ctx, p->s) && st != HVD_OK)
        hvd_tf_fail(p->ctx, p->what, p->name, st,
                    sentence != NULL ? sentence : hvd_last_error());
    hvd_tf_pending_end(p);
}

const char *hvd_tf_blocking_error(void) {
    const char *text = hvd_last_error(), *mark = strstr(text, "') on rank ");

    /* A blocking call's sentence starts "<call>('<name>') on rank <r>: ",
     * which hvd_tf_fail says in its own words. */
    if (strncmp(text, "hvd_", 4) == 0 && mark != NULL &&
        strchr(mark, ':') != NULL && strchr(mark, ':')[1] == ' ')
        text = strchr(mark, ':') + 2;
    return text;
}

void hvd_tf_ended(pending *p, hvd_status st) {
    hvd_tf_pending_fail(p, st, st != HVD_OK ? hvd_tf_blocking_error() : NULL);
}

/* hvd_on_done's function (engine thread): ends the kernel. */
static void on_done(hvd_status st, const char *error, void *arg) {
    pending *p = arg;

    if (st != HVD_OK)
        hvd_tf_fail(p->ctx, p->what, p->name, st, error);
    hvd_tf_pending_end(p);
}

/* device_sync.cc's function, from HVD_TF_GPU_LIBRARY beside this library,
 * loaded at the first GPU kernel: it is C++ against TensorFlow's own
 * classes, so it loads only in the TensorFlow it was built against, while
 * this library, TensorFlow's C API only, loads in any (docs/tensorflow.md). */
static pthread_once_t sync_once = PTHREAD_ONCE_INIT;
static int (*sync_device)(TF_OpKernelContext *ctx, char *why, size_t whylen);
static char sync_why[1280];

static void load_sync(void) {
    Dl_info self;
    char path[1024];
    const char *slash = NULL;
    void *h;

    if (dladdr((void *)load_sync, &self) != 0 && self.dli_fname != NULL)
        slash = strrchr(self.dli_fname, '/');
    snprintf(path, sizeof(path), "%.*s%s",
             slash != NULL ? (int)(slash - self.dli_fname + 1) : 0,
             slash != NULL ? self.dli_fname : "", HVD_TF_GPU_LIBRARY);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(sync_why, sizeof(sync_why),
                 "GPU tensors need %s, built against this TensorFlow (%s)",
                 path, dlerror());
        return;
    }
    *(void **)&sync_device = dlsym(h, "hvd_tf_sync_device");
    if (sync_device == NULL)
        snprintf(sync_why, sizeof(sync_why), "%s has no hvd_tf_sync_device",
                 path);
}

hvd_status hvd_tf_device_ready(const pending *p, const kernel *k, char *why,
                               size_t len) {
    if (!k->on_gpu)
        return HVD_OK;
    pthread_once(&sync_once, load_sync);
    if (sync_device == NULL) {
        snprintf(why, len, "%s", sync_why);
        return HVD_ERR_UNSUPPORTED;
    }
    if (sync_device(p->ctx, why, len) == 0)
        return HVD_OK;
    return HVD_ERR_INTERNAL;
}

void hvd_tf_submitted(pending *p, hvd_status st, hvd_handle h) {
    if (st == HVD_OK)
        st = hvd_on_done(h, on_done, p);
    if (st != HVD_OK)
        hvd_tf_pending_fail(p, st, NULL);
}
