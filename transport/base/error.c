#include "transport/base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[HVD_ERROR_MAX];

hvd_status hvd_error_set(hvd_status status, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return status;
}

void hvd_error_prefix(const char *fmt, ...) {
    char prefix[256];
    char old[HVD_ERROR_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof(old));
    size_t n = strnlen(prefix, sizeof(prefix));
    size_t m = strnlen(old, sizeof(old) - 1);
    if (n > sizeof(last_error) - 1)
        n = sizeof(last_error) - 1;
    if (m > sizeof(last_error) - 1 - n)
        m = sizeof(last_error) - 1 - n;
    memcpy(last_error, prefix, n);
    memcpy(last_error + n, old, m);
    last_error[n + m] = '\0';
}

hvd_status hvd_error_copy(hvd_status status, const char *text) {
    if (text != last_error)
        snprintf(last_error, sizeof(last_error), "%s", text ? text : "");
    return status;
}

const char *hvd_error_get(void) { return last_error; }

void hvd_error_clear(void) { last_error[0] = '\0'; }

const char *hvd_status_name(hvd_status status) {
    switch (status) {
#define HVD_STATUS_NAME_(name, text)                                           \
    case name:                                                                 \
        return #name;
        HVD_STATUS_MAP(HVD_STATUS_NAME_)
#undef HVD_STATUS_NAME_
    }
    return "HVD_ERR_UNKNOWN";
}

const char *hvd_strerror(hvd_status status) {
    switch (status) {
#define HVD_STATUS_TEXT_(name, text)                                           \
    case name:                                                                 \
        return text;
        HVD_STATUS_MAP(HVD_STATUS_TEXT_)
#undef HVD_STATUS_TEXT_
    }
    return "unknown status";
}
