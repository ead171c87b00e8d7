/*
 * What the operations in two libhvd steps (allgather.c, alltoall.c)
 * share: the operation's start, the callback of each step (which hands
 * what comes next to the helper thread), its end, its steps' names.
 */
#include "python/hvd/tensorflow/_ops/ops.h"

#include <stdio.h>
#include <stdlib.h>

void hvd_tf_twostep_end(twostep *t, hvd_status st, const char *sentence) {
    hvd_tf_pending_fail(t->p, st, sentence);
    t->release(t);
}

/* hvd_on_done's function for both steps (engine thread): the rest is the
 * helper thread's. */
static void step_done(hvd_status st, const char *error, void *arg) {
    twostep *t = arg;

    t->st = st;
    snprintf(t->error, sizeof(t->error), "%s", error != NULL ? error : "");
    if (hvd_tf_post_job(&t->job) != 0)
        hvd_tf_twostep_end(t, HVD_ERR_INTERNAL, "could not start a thread");
}

hvd_status hvd_tf_twostep_submitted(twostep *t, hvd_status st, hvd_handle h,
                                    char *why, size_t len) {
    if (hvd_tf_twostep_blocking(t)) {
        /* The step is over: what comes next (the data step, or the end)
         * runs here, as the helper thread would have run it. */
        t->st = st;
        snprintf(t->error, sizeof(t->error), "%s",
                 st != HVD_OK ? hvd_tf_blocking_error() : "");
        t->job.run(&t->job);
        return HVD_OK;
    }
    if (st == HVD_OK)
        st = hvd_on_done(h, step_done, t);
    if (st != HVD_OK)
        snprintf(why, len, "%s", hvd_last_error());
    return st;
}

void *hvd_tf_twostep_new(size_t size, TF_OpKernelContext *ctx,
                         TF_AsyncOpKernelDoneCallback *done, const kernel *k,
                         const char *what, int ntensors, void (*run)(job *),
                         void (*release)(twostep *)) {
    pending *p = hvd_tf_pending_start(ctx, done, what, k, ntensors);
    twostep *t;

    if (p == NULL)
        return NULL;
    t = calloc(1, size);
    if (t == NULL) {
        hvd_tf_pending_fail(p, HVD_ERR_NO_MEMORY, "out of memory");
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

const char *hvd_tf_step_name(const twostep *t, const char *suffix, char *buf,
                             size_t len) {
    if (t->k.name[0] == '\0')
        return NULL;
    snprintf(buf, len, "%s.%s", t->k.name, suffix);
    return buf;
}

void hvd_tf_describe_meta(const int64_t *m, char *out, size_t len) {
    size_t off = 0;

    off += (size_t)snprintf(out + off, len - off, "type %lld, shape [",
                            (long long)m[1]);
    for (int64_t d = 0; d < m[0] && d < MAX_DIMS && off < len; d++)
        off += (size_t)snprintf(out + off, len - off, "%s%lld", d ? ", " : "",
                                (long long)m[2 + d]);
    if (off < len)
        snprintf(out + off, len - off, "]");
}
