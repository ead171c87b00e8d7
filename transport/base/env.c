#include "transport/base/env.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transport/base/error.h"

const char *hvd_env_getenv(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

/* Horovod's variables that hvd honours, each beside ours. Only those of the
 * same meaning and units are here; a trainer moving from Horovod keeps its
 * environment for these. */
static const struct {
    const char *hvd;
    const char *horovod;
} horovod_names[] = {
    {"HVD_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"},
    {"HVD_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"},
    {"HVD_TIMELINE", "HOROVOD_TIMELINE"},
    {"HVD_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES"},
    {"HVD_LOG_LEVEL", "HOROVOD_LOG_LEVEL"},
    {"HVD_STALL_CHECK_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"},
    {"HVD_STALL_SHUTDOWN_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
    {"HVD_HOSTNAME", "HOROVOD_HOSTNAME"},
    {"HVD_GPU_DEVICE", "HOROVOD_GPU_DEVICE"},
};

const char *hvd_env_horovod_name(const char *name) {
    for (size_t i = 0; i < sizeof(horovod_names) / sizeof(horovod_names[0]);
         i++)
        if (strcmp(name, horovod_names[i].hvd) == 0)
            return horovod_names[i].horovod;
    return NULL;
}

const char *hvd_env_lookup(hvd_env_get_fn get, void *ctx, const char **name) {
    const char *value = get(*name, ctx);
    const char *alias;

    if (value != NULL)
        return value;
    alias = hvd_env_horovod_name(*name);
    if (alias == NULL)
        return NULL;
    value = get(alias, ctx);
    if (value != NULL)
        *name = alias;
    return value;
}

hvd_status hvd_env_parse_long(const char *name, const char *text, long min,
                              long max, long *value_out) {
    char *end = NULL;
    long value;

    if (text == NULL || *text == '\0')
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s is empty; expected an "
                             "integer from %ld to %ld",
                             name, min, max);
    errno = 0;
    value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is not an integer; expected %ld to %ld",
                             name, text, min, max);
    if (value < min || value > max)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is out of range; expected %ld to %ld", name,
                             text, min, max);
    *value_out = value;
    return HVD_OK;
}

hvd_status hvd_env_parse_bytes(const char *name, const char *text,
                               uint64_t *value_out) {
    char *end = NULL;
    unsigned long long value;
    unsigned shift = 0;

    if (text == NULL || *text == '\0' || *text == '-')
        goto bad;
    errno = 0;
    value = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        goto bad;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        goto bad;
    }
    if (shift != 0 && (*end == 'b' || *end == 'B'))
        end++;
    if (*end != '\0')
        goto bad;
    if (shift != 0 && value > (UINT64_MAX >> shift))
        goto bad;
    *value_out = (uint64_t)value << shift;
    return HVD_OK;
bad:
    return hvd_error_set(HVD_ERR_INVALID_ARG,
                         "%s=%s is not a byte count; expected a number with "
                         "an optional K, M or G suffix, e.g. 64M",
                         name, text ? text : "");
}

hvd_status hvd_env_parse_bool(const char *name, const char *text,
                              int *value_out) {
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};

    for (size_t i = 0; text != NULL && i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_out = 1;
            return HVD_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_out = 0;
            return HVD_OK;
        }
    }
    return hvd_error_set(HVD_ERR_INVALID_ARG,
                         "%s=%s is not a boolean; expected 1/0, true/false, "
                         "yes/no or on/off",
                         name, text ? text : "");
}
