/*
 * What hvdrun writes: its own messages ("hvdrun: ..." on stderr, in one
 * write() each) and the ranks' output, copied line by line from their
 * pipes with the "[rank] " prefix. A remote rank's stderr is watched here
 * for the wrapper's start marker, and its last line is kept as the reason
 * when ssh fails.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/base/log.h"

/* ---- output helpers ---- */

/* Writes all of buf; gives up quietly on errors (EPIPE: nobody reads). */
void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* Prints "hvdrun: <message>\n" on stderr in one write(). */
void say(const char *fmt, ...) {
    char line[1024];
    int len = snprintf(line, sizeof(line), "hvdrun: ");
    va_list ap;

    va_start(ap, fmt);
    int more = vsnprintf(line + len, sizeof(line) - (size_t)len, fmt, ap);
    va_end(ap);
    if (more > 0)
        len += more;
    if ((size_t)len > sizeof(line) - 2)
        len = (int)sizeof(line) - 2;
    line[len++] = '\n';
    write_all(STDERR_FILENO, line, (size_t)len);
}

void usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    say("%s (see hvdrun --help)", msg);
}

const char *signal_name(int sig) {
    const char *abbrev = sigabbrev_np(sig);
    static char name[32];

    snprintf(name, sizeof(name), "SIG%s", abbrev != NULL ? abbrev : "?");
    return name;
}

void close_fd(int *fd) {
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- output ---- */

/* Until the start marker: drops it, or keeps the line as the last one. */
static int stream_check_start(struct stream *s) {
    const char *line = s->buf + s->prefix_len;
    size_t n = s->len;

    if (n == strlen(start_marker) && memcmp(line, start_marker, n) == 0) {
        s->awaiting_start = 0;
        s->len = 0;
        return 1;
    }
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
        n--; /* ssh ends its messages with \r\n */
    if (n > 0) {
        if (n >= sizeof(s->last_line))
            n = sizeof(s->last_line) - 1;
        memcpy(s->last_line, line, n);
        s->last_line[n] = '\0';
    }
    return 0;
}

static void stream_flush(struct stream *s) {
    if (s->awaiting_start && stream_check_start(s))
        return;
    s->buf[s->prefix_len + s->len] = '\n';
    write_all(s->out_fd, s->buf, s->prefix_len + s->len + 1);
    s->len = 0;
}

/* Grows the buffer towards want more bytes, up to the line limit; returns
 * the room there is (0: the pending piece is as long as a piece gets). */
static size_t stream_room(struct stream *s, size_t want) {
    size_t limit = s->prefix_len + LINE_MAX_BYTES + 1;
    size_t need = s->prefix_len + s->len + want + 1;

    if (need > limit)
        need = limit;
    if (need > s->cap) {
        size_t cap = s->cap;
        while (cap < need)
            cap *= 2;
        if (cap > limit)
            cap = limit;
        char *buf = realloc(s->buf, cap);
        if (buf != NULL) { /* else make do with the buffer there is */
            s->buf = buf;
            s->cap = cap;
        }
    }
    return s->cap - 1 - s->prefix_len - s->len;
}

/* Copies out every complete line of data; keeps the rest pending. */
static void stream_feed(struct stream *s, const char *data, size_t n) {
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t seg = nl != NULL ? (size_t)(nl - data) : n;
        size_t room = stream_room(s, seg);

        if (room == 0 && seg > 0) {
            stream_flush(s); /* a piece of a long line */
            continue;
        }
        size_t take = seg < room ? seg : room;
        memcpy(s->buf + s->prefix_len + s->len, data, take);
        s->len += take;
        data += take;
        n -= take;
        if (nl != NULL && take == seg) {
            stream_flush(s);
            data++;
            n--;
        }
    }
}

void stream_close(struct stream *s) {
    if (s->len > 0)
        stream_flush(s); /* a last line without its newline */
    close_fd(&s->fd);
}

/* Reads what the pipe has, at most max_bytes; closes it at EOF. */
void stream_read(struct stream *s, size_t max_bytes) {
    static char chunk[READ_CHUNK];
    size_t total = 0;

    while (s->fd >= 0 && total < max_bytes) {
        ssize_t n = read(s->fd, chunk, sizeof(chunk));
        if (n > 0) {
            stream_feed(s, chunk, (size_t)n);
            total += (size_t)n;
        } else if (n == 0) {
            stream_close(s);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
        } else if (errno != EINTR) {
            HVD_ERROR("hvdrun", "read() from a rank's pipe failed: %s",
                      strerror(errno));
            stream_close(s);
        }
    }
}
