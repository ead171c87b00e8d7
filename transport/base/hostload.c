/* Whether this host has a core for every runnable thread (hostload.h). */
#include "transport/base/hostload.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void hvd_hostload_open(hvd_hostload *h, const char *path, int ncpu) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);

    h->ncpu = ncpu > 0 ? ncpu : online > 0 ? (int)online : 1;
    h->room = 1;
    h->checked = INT64_MIN;
    h->fd = open(path != NULL ? path : "/proc/loadavg", O_RDONLY | O_CLOEXEC);
}

void hvd_hostload_close(hvd_hostload *h) {
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
}

int hvd_hostload_running(const char *line) {
    const char *slash = strchr(line, '/');
    const char *start;

    if (slash == NULL)
        return -1;
    start = slash;
    while (start > line && start[-1] >= '0' && start[-1] <= '9')
        start--;
    return start < slash ? atoi(start) : -1;
}

int hvd_hostload_room(hvd_hostload *h, int64_t now) {
    char buf[128];
    ssize_t n;
    int running;

    if (h->checked != INT64_MIN && now - h->checked < HVD_HOSTLOAD_CHECK_NS)
        return h->room;
    h->checked = now;
    h->room = 1;
    if (h->fd < 0 || (n = pread(h->fd, buf, sizeof(buf) - 1, 0)) <= 0)
        return 1;
    buf[n] = '\0';
    running = hvd_hostload_running(buf);
    h->room = running < 0 || running <= h->ncpu;
    return h->room;
}
