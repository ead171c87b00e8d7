#include "transport/bootstrap/failure.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/base/log.h"

int hvd_tp_failure_set(hvd_tp_failure *f, const char *what, hvd_status status,
                       int self, int origin, const char *text) {
    if (f->status != HVD_OK)
        return 0;
    f->status = status;
    if (origin == self || origin < 0)
        snprintf(f->text, sizeof(f->text), "%s", text);
    else
        snprintf(f->text, sizeof(f->text), "rank %d reported: %s", origin,
                 text);
    HVD_ERROR(what, "%s", f->text);
    return 1;
}

hvd_status hvd_tp_failure_error(const hvd_tp_failure *f) {
    return f->status == HVD_OK ? HVD_OK : hvd_error_copy(f->status, f->text);
}

hvd_status hvd_tp_failf(hvd_tp_fail_fn fail, void *tp, int self,
                        hvd_status status, int culprit, const char *fmt, ...) {
    char text[HVD_ERROR_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    return fail(tp, status, culprit, self, text);
}

void hvd_tp_copy_names(const char (*job_hosts)[HVD_HOST_MAX],
                       const int *job_pids, int size,
                       char (**hosts)[HVD_HOST_MAX], int **pids) {
    *hosts = NULL;
    *pids = NULL;
    if (job_hosts == NULL || job_pids == NULL)
        return;
    *hosts = malloc((size_t)size * sizeof(**hosts));
    *pids = malloc((size_t)size * sizeof(**pids));
    if (*hosts == NULL || *pids == NULL) {
        free(*hosts);
        free(*pids);
        *hosts = NULL;
        *pids = NULL;
        return;
    }
    memcpy(*hosts, job_hosts, (size_t)size * sizeof(**hosts));
    memcpy(*pids, job_pids, (size_t)size * sizeof(**pids));
}

void hvd_tp_describe(char *out, size_t outlen, int peer, int size,
                     const char *host, int pid) {
    if (peer < 0 || peer >= size)
        snprintf(out, outlen, "an unknown peer");
    else if (host != NULL && pid >= 0)
        snprintf(out, outlen, "rank %d (pid %d on %s)", peer, pid, host);
    else
        snprintf(out, outlen, "rank %d", peer);
}

hvd_status hvd_tp_fail_stalled(hvd_tp_fail_fn fail, void *tp, int self,
                               int peer, const char *who, int64_t timeout_ns) {
    return hvd_tp_failf(fail, tp, self, HVD_ERR_TIMEOUT, peer,
                        "nothing (not even a heartbeat) arrived from %s for "
                        "%.0f s while rank %d waited on it: it is stopped, "
                        "hung or busy outside hvd, or the network to it is "
                        "down (HVD_TIMEOUT_SECONDS sets this limit)",
                        who, (double)timeout_ns / 1e9, self);
}
