/*
 * The per-thread last-error sentence behind hvd_last_error().
 *
 * The layer that first classifies a failure calls hvd_error_set() with the
 * status and a sentence (what failed, on which rank, with which peer, what to
 * do), and returns that status. Layers above may add context in front with
 * hvd_error_prefix() ("hvd_allreduce('grad.w1'): ...").
 */
#ifndef HVD_BASE_ERROR_H
#define HVD_BASE_ERROR_H

#include "hvd/types.h"

#define HVD_ERROR_MAX 1024

/* Records the sentence for this thread and returns status unchanged. */
hvd_status hvd_error_set(hvd_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Puts a formatted context in front of this thread's sentence. */
void hvd_error_prefix(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Copies a sentence (e.g. one recorded on another thread) into this
 * thread's; returns status. */
hvd_status hvd_error_copy(hvd_status status, const char *text);

const char *hvd_error_get(void);
void hvd_error_clear(void);

/* Name of a status value ("HVD_ERR_TIMEOUT"), for messages. */
const char *hvd_status_name(hvd_status status);

/* The status's description from HVD_STATUS_MAP ("out of memory"), never
 * NULL: the public hvd_strerror, declared in hvd/hvd.h too and defined
 * here, so that every layer can describe a status without the API. */
HVD_EXPORT const char *hvd_strerror(hvd_status status);

#endif
