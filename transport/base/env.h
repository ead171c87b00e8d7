/*
 * Parsing of HVD_* configuration values. Every parser takes the variable's
 * name for its message and returns HVD_ERR_INVALID_ARG with a sentence that
 * names the variable, the value and what is accepted.
 */
#ifndef HVD_BASE_ENV_H
#define HVD_BASE_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/hvd.h"

/* Looks a variable up: getenv() in the library, a table in unit tests.
 * Returns NULL when unset. */
typedef const char *(*hvd_env_get_fn)(const char *name, void *ctx);

/* getenv() with the signature above (ctx unused). */
const char *hvd_env_getenv(const char *name, void *ctx);

/* Horovod's name for the HVD_* variable name that means the same, in the
 * same units (HOROVOD_FUSION_THRESHOLD for HVD_FUSION_THRESHOLD), or NULL
 * when Horovod has none. */
const char *hvd_env_horovod_name(const char *name);

/* Looks up *name, and when it is unset, Horovod's name for it: the HVD_
 * form wins. *name becomes the variable whose value is returned, so that
 * a message about the value names what the user set. NULL when neither is
 * set. */
const char *hvd_env_lookup(hvd_env_get_fn get, void *ctx, const char **name);

/* Decimal integer in [min, max]. */
hvd_status hvd_env_parse_long(const char *name, const char *text, long min,
                              long max, long *value_out);

/* Byte count with an optional K, M, G suffix (powers of 1024), e.g. "64M". */
hvd_status hvd_env_parse_bytes(const char *name, const char *text,
                               uint64_t *value_out);

/* 1/0, true/false, yes/no, on/off. */
hvd_status hvd_env_parse_bool(const char *name, const char *text,
                              int *value_out);

#endif
