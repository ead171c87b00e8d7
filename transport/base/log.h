/*
 * Logging. One line per message on stderr, prefixed
 * "[host:pid rank N subsys] LEVEL". The level comes from HVD_LOG_LEVEL
 * (error, warn, info, debug, trace; default warn). The macros test the level
 * before they evaluate their arguments, so a disabled debug line costs one
 * comparison.
 */
#ifndef HVD_BASE_LOG_H
#define HVD_BASE_LOG_H

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

/* Reads HVD_LOG_LEVEL. An unknown value leaves the level and warns. */
void hvd_log_init_from_env(void);

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

#endif
