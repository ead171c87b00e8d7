#include "transport/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "transport/base/env.h"

hvd_log_level hvd_log_current = HVD_LOG_WARN;
static int log_rank = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug",
                                          "trace"};

int hvd_log_parse_level(const char *text, hvd_log_level *level_out) {
    if (text == NULL || *text == '\0')
        return -1;
    for (int i = 0; i <= HVD_LOG_TRACE; i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *level_out = (hvd_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(text, "warning") == 0) {
        *level_out = HVD_LOG_WARN;
        return 0;
    }
    /* Horovod's HOROVOD_LOG_LEVEL has fatal above error; hvd logs no
     * fatal messages, so it is error here. */
    if (strcasecmp(text, "fatal") == 0) {
        *level_out = HVD_LOG_ERROR;
        return 0;
    }
    if (text[0] >= '0' && text[0] <= '4' && text[1] == '\0') {
        *level_out = (hvd_log_level)(text[0] - '0');
        return 0;
    }
    return -1;
}

void hvd_log_init_from_env(void) {
    const char *name = "HVD_LOG_LEVEL";
    const char *text = hvd_env_lookup(hvd_env_getenv, NULL, &name);
    hvd_log_level level;

    if (text == NULL || *text == '\0')
        return;
    if (hvd_log_parse_level(text, &level) == 0)
        hvd_log_current = level;
    else
        HVD_WARN("log",
                 "%s=%s is not one of error, warn, info, debug, "
                 "trace; keeping %s",
                 name, text, level_names[hvd_log_current]);
}

void hvd_log_set_rank(int rank) { log_rank = rank; }

void hvd_log_write(hvd_log_level level, const char *subsys, const char *fmt,
                   ...) {
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG",
                                       "TRACE"};
    char host[64];
    char line[1024];
    int len;
    va_list ap;

    if (gethostname(host, sizeof(host)) != 0)
        strcpy(host, "?");
    host[sizeof(host) - 1] = '\0';
    char *dot = strchr(host, '.');
    if (dot != NULL)
        *dot = '\0';

    len = snprintf(line, sizeof(line), "[%s:%d rank %d %s] %s ", host,
                   (int)getpid(), log_rank, subsys, tags[level]);
    if (len < 0)
        return;
    if ((size_t)len < sizeof(line)) {
        va_start(ap, fmt);
        int more = vsnprintf(line + len, sizeof(line) - (size_t)len, fmt, ap);
        va_end(ap);
        if (more > 0)
            len += more;
    }
    if ((size_t)len >= sizeof(line) - 1)
        len = (int)sizeof(line) - 2;
    line[len++] = '\n';
    /* One write() per line keeps lines of concurrent ranks whole. */
    ssize_t ignored = write(STDERR_FILENO, line, (size_t)len);
    (void)ignored;
}
