#include "transport/base/env.h"

#include <errno.h>
#include <stdlib.h>
#include <strings.h>

#include "transport/base/error.h"

const char *hvd_env_getenv(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
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
