#include "transport/base/env.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
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

const char *hvd_env_vars_get(const char *name, void *ctx) {
    for (const hvd_env_var *v = ctx; v != NULL && v->name != NULL; v++)
        if (strcmp(v->name, name) == 0)
            return v->value;
    return NULL;
}

/* A byte count as a user would write it: 64, 4K, 1G, 1T. */
static void format_bytes(long long v, char *out, size_t outlen) {
    static const char units[] = "KMGT";
    int u = -1;

    while (v >= 1024 && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(out, outlen, "%lld", v);
    else
        snprintf(out, outlen, "%lld%c", v, units[u]);
}

/* Stores in at (size bytes) the entry of choices ("a|b|c") that text names
 * in any case; HVD_ERR_INVALID_ARG listing them when none does. */
static hvd_status store_choice(const char *name, const char *text,
                               const char *choices, char *at, size_t size) {
    char list[256] = "";
    size_t used = 0;

    for (const char *c = choices; *c != '\0';) {
        size_t len = strcspn(c, "|");
        if (strlen(text) == len && strncasecmp(c, text, len) == 0 &&
            len < size) {
            memcpy(at, c, len);
            at[len] = '\0';
            return HVD_OK;
        }
        int w = snprintf(list + used, sizeof(list) - used, "%s%.*s",
                         used == 0 ? "" : ", ", (int)len, c);
        if (w > 0 && (size_t)w < sizeof(list) - used)
            used += (size_t)w;
        c += len + (c[len] == '|');
    }
    return hvd_error_set(HVD_ERR_INVALID_ARG, "%s=%s is not one of %s", name,
                         text, list);
}

/* Parses text for s (checking the range when check) and stores it in out.
 * name is the variable the text came from, for the message. */
static hvd_status store(const hvd_setting *s, const char *name,
                        const char *text, int check, void *out) {
    char *at = (char *)out + s->offset;
    long long min = check ? s->min : LLONG_MIN;
    long long max = check ? s->max : LLONG_MAX;
    long lv;
    uint64_t bv;
    int b;
    hvd_status st;

    switch (s->kind) {
    case HVD_SETTING_INT:
    case HVD_SETTING_SECONDS:
        st = hvd_env_parse_long(name, text, (long)min, (long)max, &lv);
        if (st != HVD_OK)
            return st;
        if (s->kind == HVD_SETTING_INT)
            *(int *)(void *)at = (int)lv;
        else
            *(int64_t *)(void *)at = (int64_t)lv * 1000000000LL;
        return HVD_OK;
    case HVD_SETTING_BYTES:
        st = hvd_env_parse_bytes(name, text, &bv);
        if (st != HVD_OK)
            return st;
        if (check && (bv < (uint64_t)s->min || bv > (uint64_t)s->max)) {
            char lo[32], hi[32];
            format_bytes(s->min, lo, sizeof(lo));
            format_bytes(s->max, hi, sizeof(hi));
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s=%s is out of range; expected %s to %s",
                                 name, text, lo, hi);
        }
        *(size_t *)(void *)at = (size_t)bv;
        return HVD_OK;
    case HVD_SETTING_TEXT:
        if (strlen(text) >= s->size)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s is too long (%zu characters at most)",
                                 name, s->size - 1);
        memcpy(at, text, strlen(text) + 1);
        return HVD_OK;
    case HVD_SETTING_AUTO_ON_OFF:
        if (strcasecmp(text, "auto") == 0) {
            *(int *)(void *)at = 2;
            return HVD_OK;
        }
        if (hvd_env_parse_bool(name, text, &b) != HVD_OK)
            return hvd_error_set(HVD_ERR_INVALID_ARG,
                                 "%s=%s is not one of auto, on, off", name,
                                 text);
        *(int *)(void *)at = b;
        return HVD_OK;
    case HVD_SETTING_CHOICE:
        return store_choice(name, text, s->choices, at, s->size);
    }
    return hvd_error_set(HVD_ERR_INTERNAL, "%s: unknown kind of setting", name);
}

hvd_status hvd_env_read_settings(const hvd_setting *table, size_t n,
                                 hvd_env_get_fn get, void *ctx, void *out) {
    for (size_t i = 0; i < n; i++) {
        const hvd_setting *s = &table[i];
        const char *name = s->name;
        const char *text = hvd_env_lookup(get, ctx, &name);
        hvd_status st = s->fallback != NULL
                            ? store(s, s->name, s->fallback, 0, out)
                            : HVD_OK;

        if (st != HVD_OK)
            return st;
        if (text == NULL ||
            (*text == '\0' && s->kind == HVD_SETTING_AUTO_ON_OFF))
            continue;
        st = store(s, name, text, 1, out);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}
