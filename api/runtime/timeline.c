#include "api/runtime/timeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/namemap.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"

struct hvd_timeline {
    FILE *f;
    int64_t t0;
    int first; /* no event written yet */
    int next_pid;
    hvd_namemap pids; /* tensor -> pid */
};

hvd_status hvd_timeline_open(const char *path, hvd_timeline **out) {
    hvd_timeline *tl = calloc(1, sizeof(*tl));

    if (tl == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tl->f = fopen(path, "w");
    if (tl->f == NULL) {
        int err = errno;
        free(tl);
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "timeline %s: cannot open it for writing: %s",
                             path, strerror(err));
    }
    tl->t0 = hvd_now_ns();
    tl->first = 1;
    tl->next_pid = 1;
    hvd_namemap_init(&tl->pids);
    fputs("[\n", tl->f);
    *out = tl;
    return HVD_OK;
}

/* Writes s as a JSON string body (without quotes). */
static void json_text(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

static void sep(hvd_timeline *tl) {
    if (!tl->first)
        fputs(",\n", tl->f);
    tl->first = 0;
}

static int pid_of(hvd_timeline *tl, const char *tensor) {
    void *v = hvd_namemap_get(&tl->pids, tensor);

    if (v != NULL)
        return (int)(uintptr_t)v;
    int pid = tl->next_pid++;
    if (hvd_namemap_put(&tl->pids, tensor, (void *)(uintptr_t)pid) != 0)
        return 0;
    sep(tl);
    fprintf(tl->f,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, "
            "\"args\": {\"name\": \"",
            pid);
    json_text(tl->f, tensor);
    fputs("\"}}", tl->f);
    return pid;
}

static double us(const hvd_timeline *tl, int64_t ts_ns) {
    return (double)(ts_ns - tl->t0) / 1000.0;
}

void hvd_timeline_begin(hvd_timeline *tl, const char *tensor, const char *event,
                        int64_t ts_ns, const char *args) {
    if (tl == NULL)
        return;
    int pid = pid_of(tl, tensor);
    sep(tl);
    fprintf(tl->f,
            "{\"name\": \"%s\", \"ph\": \"B\", \"ts\": %.3f, \"pid\": %d, "
            "\"tid\": 0",
            event, us(tl, ts_ns), pid);
    if (args != NULL)
        fprintf(tl->f, ", \"args\": {%s}", args);
    fputs("}", tl->f);
}

void hvd_timeline_end(hvd_timeline *tl, const char *tensor, int64_t ts_ns) {
    if (tl == NULL)
        return;
    int pid = pid_of(tl, tensor);
    sep(tl);
    fprintf(tl->f, "{\"ph\": \"E\", \"ts\": %.3f, \"pid\": %d, \"tid\": 0}",
            us(tl, ts_ns), pid);
}

void hvd_timeline_mark(hvd_timeline *tl, const char *event, int64_t ts_ns) {
    if (tl == NULL)
        return;
    sep(tl);
    fprintf(tl->f,
            "{\"name\": \"%s\", \"ph\": \"i\", \"s\": \"g\", \"ts\": %.3f, "
            "\"pid\": 0, \"tid\": 0}",
            event, us(tl, ts_ns));
}

void hvd_timeline_flush(hvd_timeline *tl) {
    if (tl != NULL)
        fflush(tl->f);
}

void hvd_timeline_close(hvd_timeline *tl) {
    if (tl == NULL)
        return;
    fputs("\n]\n", tl->f);
    fclose(tl->f);
    hvd_namemap_destroy(&tl->pids);
    free(tl);
}
