#ifndef HVD_BASE_HOSTLOAD_H
#define HVD_BASE_HOSTLOAD_H

#include <stdint.h>

/*
 * Whether this host has a core for every runnable thread: the running
 * count of /proc/loadavg against the cores online, read again at most
 * every HVD_HOSTLOAD_CHECK_NS. A rank that waits for a peer polls only
 * where the answer is yes; where it is no, other processes hold the cores,
 * and a wait that yields the core hands it to one of them for a whole time
 * slice (milliseconds), while a sleeper is woken at once by its peer's
 * message. Used by the TCP and shared-memory transports' waits and by the
 * engine's (api/runtime/engine_cycle.c).
 */
#define HVD_HOSTLOAD_CHECK_NS (10 * 1000 * 1000LL)

typedef struct hvd_hostload {
    int fd;          /* /proc/loadavg, -1 if it cannot be read */
    int ncpu;        /* cores online */
    int room;        /* the answer when last looked at */
    int64_t checked; /* when that was (hvd_now_ns) */
} hvd_hostload;

/* Opens path (NULL: /proc/loadavg) for a host of ncpu cores (0: the cores
 * online). Where it cannot be read the host always has room. */
void hvd_hostload_open(hvd_hostload *h, const char *path, int ncpu);
void hvd_hostload_close(hvd_hostload *h);

/* 1 if the host had a core for every runnable thread when last looked at,
 * looking again if that was HVD_HOSTLOAD_CHECK_NS before now. */
int hvd_hostload_room(hvd_hostload *h, int64_t now);

/* The running count in a line of /proc/loadavg ("0.37 1.48 1.74 2/187
 * 4905": 2), -1 if the line has none. */
int hvd_hostload_running(const char *line);

#endif
