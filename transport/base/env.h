/*
 * Parsing of HVD_* configuration values. Every parser takes the variable's
 * name for its message and returns HVD_ERR_INVALID_ARG with a sentence that
 * names the variable, the value and what is accepted.
 */
#ifndef HVD_BASE_ENV_H
#define HVD_BASE_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"

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

/* A variable and its value, for tables of them (tests, a transport's
 * params in a test). */
typedef struct hvd_env_var {
    const char *name;
    const char *value;
} hvd_env_var;

/* hvd_env_get_fn over a table of variables ending with a NULL name. */
const char *hvd_env_vars_get(const char *name, void *ctx);

/*
 * Settings tables: a component (a transport, the runtime's configuration)
 * declares each HVD_* variable it reads once, with its type, range and
 * default, and hvd_env_read_settings fills the component's own struct
 * from them. Horovod's name for a variable is honoured where hvd's is
 * unset (hvd_env_lookup).
 */
typedef enum hvd_setting_kind {
    HVD_SETTING_INT,         /* int: a decimal integer in [min, max] */
    HVD_SETTING_BYTES,       /* size_t: a byte count (K, M, G) in [min, max] */
    HVD_SETTING_SECONDS,     /* int64_t nanoseconds: whole seconds in
                                [min, max] */
    HVD_SETTING_TEXT,        /* char[size]: shorter than size; may be "" */
    HVD_SETTING_AUTO_ON_OFF, /* int: 2 auto, 1 on, 0 off ("" is the default) */
    HVD_SETTING_CHOICE,      /* char[size]: one of choices (any case), kept
                                as written in choices */
} hvd_setting_kind;

typedef struct hvd_setting {
    const char *name; /* "HVD_TCP_NSOCKS" */
    hvd_setting_kind kind;
    size_t offset;        /* of the member in the owner's struct */
    size_t size;          /* of that member */
    const char *fallback; /* the value when unset, written as a user would
                             write it; trusted, so it may lie outside the
                             range (e.g. -1 for "chosen"); NULL: the member
                             keeps what the caller put there */
    long long min, max;   /* the range a user's value must be in (INT,
                             BYTES, SECONDS) */
    const char *help;     /* one line: what it sets */
    const char *choices;  /* CHOICE: the accepted values, "a|b|c" */
} hvd_setting;

/* The offset and size members of an entry for member of struct owner. */
#define HVD_SETTING_AT(owner, member)                                          \
    .offset = offsetof(owner, member), .size = sizeof(((owner *)0)->member)

/*
 * Fills out (the owner's struct) from table[0..n): each member gets its
 * variable's value, or the fallback when unset. A malformed or out-of-range
 * value is HVD_ERR_INVALID_ARG with a sentence naming the variable the user
 * set, its value and what is accepted; out is then partly filled.
 */
hvd_status hvd_env_read_settings(const hvd_setting *table, size_t n,
                                 hvd_env_get_fn get, void *ctx, void *out);

#endif
