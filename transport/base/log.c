#include "transport/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/env.h"
#include "transport/base/error.h"

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

hvd_status hvd_log_init_from_env(void) {
    const char *name = "HVD_LOG_LEVEL";
    const char *text = hvd_env_lookup(hvd_env_getenv, NULL, &name);
    hvd_log_level level;

    if (text == NULL || *text == '\0')
        return HVD_OK;
    if (hvd_log_parse_level(text, &level) != 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is not one of error, warn, info, debug, "
                             "trace (or 0-4)",
                             name, text);
    hvd_log_current = level;
    return HVD_OK;
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

void hvd_log_limiter_init(hvd_log_limiter *l, const char *subsys,
                          const char *verb, const char *why) {
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->lock, NULL);
    l->subsys = subsys;
    l->verb = verb;
    l->why = why;
}

void hvd_log_limiter_destroy(hvd_log_limiter *l) {
    pthread_mutex_destroy(&l->lock);
}

/* Counts one event of addr (its port dropped) in the interval's table. */
static void limit_count_addr(hvd_log_limiter *l, const char *addr) {
    char host[sizeof(l->addrs[0].addr)];
    size_t n = strlen(addr);
    const char *colon = strrchr(addr, ':');

    /* "ip:port" and "[ip6]:port" lose the port; a bare IPv6 address has
     * colons too but no port (and no "]" or "." before its last colon). */
    if (colon != NULL && (addr[0] == '[' || strchr(addr, ':') == colon))
        n = (size_t)(colon - addr);
    if (n >= sizeof(host))
        n = sizeof(host) - 1;
    memcpy(host, addr, n);
    host[n] = '\0';
    for (int i = 0; i < l->naddrs; i++) {
        if (strcmp(l->addrs[i].addr, host) == 0) {
            l->addrs[i].n++;
            return;
        }
    }
    if (l->naddrs < HVD_LOG_LIMIT_ADDRS) {
        snprintf(l->addrs[l->naddrs].addr, sizeof(l->addrs[0].addr), "%s",
                 host);
        l->addrs[l->naddrs++].n = 1;
    } else {
        l->more_addrs = 1;
    }
}

/* Writes the interval's summary (lock held) if it had events without a
 * line of their own, and starts the next interval at now_ns. */
static void limit_summary(hvd_log_limiter *l, int64_t now_ns) {
    char list[512];
    size_t off = 0;

    list[0] = '\0';
    for (int i = 0; i < l->naddrs && off < sizeof(list); i++) {
        int k = snprintf(list + off, sizeof(list) - off, "%s%s: %llu",
                         i ? ", " : "", l->addrs[i].addr,
                         (unsigned long long)l->addrs[i].n);
        if (k > 0)
            off += (size_t)k;
    }
    if (l->more_addrs && off < sizeof(list))
        snprintf(list + off, sizeof(list) - off, ", others");
    if (l->count > l->logged && HVD_LOG_WARN <= hvd_log_current)
        hvd_log_write(
            HVD_LOG_WARN, l->subsys,
            "%s %llu connections from %s%d address%s in the last "
            "%lld s (%s; %llu of them logged above): %s",
            l->verb, (unsigned long long)l->count,
            l->more_addrs ? "more than " : "", l->naddrs,
            l->naddrs == 1 && !l->more_addrs ? "" : "es",
            (long long)((now_ns - l->start_ns + 999999999LL) / 1000000000LL),
            list, (unsigned long long)l->logged, l->why);
    l->start_ns = now_ns;
    l->count = l->logged = 0;
    l->naddrs = 0;
    l->more_addrs = 0;
}

int hvd_log_limit_note_at(hvd_log_limiter *l, const char *addr,
                          int64_t now_ns) {
    const int64_t full = HVD_LOG_LIMIT_BURST * HVD_LOG_LIMIT_LINE_NS;
    int own;

    pthread_mutex_lock(&l->lock);
    if (!l->primed) {
        l->primed = 1;
        l->credit = full;
    } else if (now_ns > l->last_ns) {
        l->credit += now_ns - l->last_ns;
        if (l->credit > full)
            l->credit = full;
    }
    l->last_ns = now_ns;
    if (l->start_ns == 0)
        l->start_ns = now_ns;
    else if (now_ns - l->start_ns >= HVD_LOG_LIMIT_INTERVAL_NS)
        limit_summary(l, now_ns);
    l->count++;
    l->total++;
    limit_count_addr(l, addr != NULL ? addr : "?");
    own = l->credit >= HVD_LOG_LIMIT_LINE_NS;
    if (own) {
        l->credit -= HVD_LOG_LIMIT_LINE_NS;
        l->logged++;
    }
    pthread_mutex_unlock(&l->lock);
    return own;
}

int hvd_log_limit_note(hvd_log_limiter *l, const char *addr) {
    return hvd_log_limit_note_at(l, addr, hvd_now_ns());
}

void hvd_log_limit_flush_at(hvd_log_limiter *l, int64_t now_ns, int force) {
    pthread_mutex_lock(&l->lock);
    if (l->start_ns != 0 &&
        (force || now_ns - l->start_ns >= HVD_LOG_LIMIT_INTERVAL_NS)) {
        limit_summary(l, now_ns);
        /* The next event starts the next interval. */
        l->start_ns = 0;
    }
    pthread_mutex_unlock(&l->lock);
}

void hvd_log_limit_flush(hvd_log_limiter *l, int force) {
    hvd_log_limit_flush_at(l, hvd_now_ns(), force);
}

uint64_t hvd_log_limit_total(hvd_log_limiter *l) {
    uint64_t total;

    pthread_mutex_lock(&l->lock);
    total = l->total;
    pthread_mutex_unlock(&l->lock);
    return total;
}
