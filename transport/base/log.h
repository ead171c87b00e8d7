/*
 * Logging. One line per message on stderr, prefixed
 * "[host:pid rank N subsys] LEVEL". The level comes from HVD_LOG_LEVEL
 * (error, warn, info, debug, trace; default warn). The macros test the level
 * before they evaluate their arguments, so a disabled debug line costs one
 * comparison.
 */
#ifndef HVD_BASE_LOG_H
#define HVD_BASE_LOG_H

#include <pthread.h>
#include <stdint.h>

#include "hvd/types.h"

typedef enum {
    HVD_LOG_ERROR = 0,
    HVD_LOG_WARN,
    HVD_LOG_INFO,
    HVD_LOG_DEBUG,
    HVD_LOG_TRACE
} hvd_log_level;

extern hvd_log_level hvd_log_current;

/* Parses a level name ("error" ... "trace", or 0-4). Returns 0 on success. */
int hvd_log_parse_level(const char *text, hvd_log_level *level_out);

/* Reads HVD_LOG_LEVEL (or HOROVOD_LOG_LEVEL). An unknown value leaves the
 * level as it was and returns HVD_ERR_INVALID_ARG with a sentence naming
 * the valid values; logging keeps working either way. */
hvd_status hvd_log_init_from_env(void);

/* Sets the rank shown in the prefix (-1 before it is known). */
void hvd_log_set_rank(int rank);

void hvd_log_write(hvd_log_level level, const char *subsys, const char *fmt,
                   ...) __attribute__((format(printf, 3, 4)));

#define HVD_LOG(level, subsys, ...)                                            \
    do {                                                                       \
        if ((level) <= hvd_log_current)                                        \
            hvd_log_write((level), (subsys), __VA_ARGS__);                     \
    } while (0)

#define HVD_ERROR(subsys, ...) HVD_LOG(HVD_LOG_ERROR, subsys, __VA_ARGS__)
#define HVD_WARN(subsys, ...) HVD_LOG(HVD_LOG_WARN, subsys, __VA_ARGS__)
#define HVD_INFO(subsys, ...) HVD_LOG(HVD_LOG_INFO, subsys, __VA_ARGS__)
#define HVD_DEBUG(subsys, ...) HVD_LOG(HVD_LOG_DEBUG, subsys, __VA_ARGS__)
#define HVD_TRACE(subsys, ...) HVD_LOG(HVD_LOG_TRACE, subsys, __VA_ARGS__)

/*
 * A rate limiter for lines about events that anyone can cause at any rate
 * (connections from strangers). Lines of their own are a token bucket:
 * HVD_LOG_LIMIT_BURST at once, then one per HVD_LOG_LIMIT_LINE_NS; the
 * other events are only counted, per source address, and summed up in
 * one line per interval (HVD_LOG_LIMIT_INTERVAL_NS) that had any:
 * "refused 41234 connections from 1 address in the last 10 s (127.0.0.1:
 * 41234; 64 of them logged above): not authenticated". So the log grows
 * by a bounded number of lines per second whatever the rate. Thread-safe
 * (a mutex); define one with HVD_LOG_LIMITER_INIT or
 * hvd_log_limiter_init. The summary of an interval is written by the
 * first event after it ends, or by hvd_log_limit_flush.
 */
#define HVD_LOG_LIMIT_BURST 64
#define HVD_LOG_LIMIT_LINE_NS (1000000000LL)
#define HVD_LOG_LIMIT_INTERVAL_NS (10 * 1000000000LL)
#define HVD_LOG_LIMIT_ADDRS 8

typedef struct hvd_log_limiter {
    pthread_mutex_t lock;
    const char *subsys;
    const char *verb; /* starts the summary line: "refused" */
    const char *why;  /* ends it: "not authenticated" */
    int primed;       /* the bucket was filled (first event) */
    int64_t credit;   /* ns of credit for lines of their own */
    int64_t last_ns;  /* credit was last added then */
    int64_t start_ns; /* the current interval began; 0: none yet */
    uint64_t count;   /* events of this interval */
    uint64_t logged;  /* of them, written as lines of their own */
    uint64_t total;   /* events ever */
    int naddrs;       /* distinct addresses of this interval, counted up to
                         HVD_LOG_LIMIT_ADDRS (more_addrs: more) */
    int more_addrs;
    struct {
        char addr[48];
        uint64_t n;
    } addrs[HVD_LOG_LIMIT_ADDRS];
} hvd_log_limiter;

#define HVD_LOG_LIMITER_INIT(sub, verb_text, why_text)                         \
    {                                                                          \
        .lock = PTHREAD_MUTEX_INITIALIZER, .subsys = (sub),                    \
        .verb = (verb_text), .why = (why_text)                                 \
    }

/* Initializes l in place (as HVD_LOG_LIMITER_INIT does). */
void hvd_log_limiter_init(hvd_log_limiter *l, const char *subsys,
                          const char *verb, const char *why);
void hvd_log_limiter_destroy(hvd_log_limiter *l);

/* Counts one event from addr ("ip:port", "[ip6]:port" or "ip"; the port
 * is dropped) at now_ns; writes the summary of the interval that ended,
 * if one did. Returns 1 when the event may have a line of its own. */
int hvd_log_limit_note_at(hvd_log_limiter *l, const char *addr, int64_t now_ns);
int hvd_log_limit_note(hvd_log_limiter *l, const char *addr);

/* Writes the summary of the current interval when it has events that got
 * no line of their own and is over (or at once: force); the next event
 * starts a new interval. */
void hvd_log_limit_flush_at(hvd_log_limiter *l, int64_t now_ns, int force);
void hvd_log_limit_flush(hvd_log_limiter *l, int force);

/* Events ever counted. */
uint64_t hvd_log_limit_total(hvd_log_limiter *l);

/* A warning about an event from addr, rate limited by l. */
#define HVD_WARN_LIMITED(l, addr, subsys, ...)                                 \
    do {                                                                       \
        if (hvd_log_limit_note((l), (addr)) &&                                 \
            HVD_LOG_WARN <= hvd_log_current)                                   \
            hvd_log_write(HVD_LOG_WARN, (subsys), __VA_ARGS__);                \
    } while (0)

#endif
