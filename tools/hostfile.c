#include "tools/hostfile.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int error(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int error(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;

    if (errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Adds len bytes of name with slots; a name given again gets the sum of
 * its slots. */
static int add_host(hvd_hostlist *list, const char *name, size_t len,
                    long slots, const char *where, char *err, size_t errlen) {
    if (len == 0)
        return error(err, errlen, "%s: empty host name", where);
    if (name[0] == '-')
        return error(err, errlen, "%s: host name %.*s starts with '-'", where,
                     (int)len, name);
    for (size_t k = 0; k < len; k++) {
        unsigned char c = (unsigned char)name[k];
        if (c <= ' ' || c == 0x7f || c == ',' || c == '\'' || c == '"')
            return error(err, errlen,
                         "%s: host name %.*s has a character ssh would not "
                         "take",
                         where, (int)len, name);
    }
    for (int h = 0; h < list->n; h++) {
        if (strlen(list->v[h].name) == len &&
            memcmp(list->v[h].name, name, len) == 0) {
            if (list->v[h].slots + slots > HVD_HOST_MAX_SLOTS)
                return error(err, errlen,
                             "%s: host %.*s has more than %d slots", where,
                             (int)len, name, HVD_HOST_MAX_SLOTS);
            list->v[h].slots += (int)slots;
            return 0;
        }
    }
    if (list->n == list->cap) {
        int cap = list->cap == 0 ? 8 : 2 * list->cap;
        hvd_hostspec *v = realloc(list->v, (size_t)cap * sizeof(*v));
        if (v == NULL)
            return error(err, errlen, "out of memory");
        list->v = v;
        list->cap = cap;
    }
    hvd_hostspec *host = &list->v[list->n];
    if ((host->name = strndup(name, len)) == NULL)
        return error(err, errlen, "out of memory");
    host->slots = (int)slots;
    list->n++;
    return 0;
}

/* The slot count of len bytes of text, 1 to HVD_HOST_MAX_SLOTS. */
static int parse_slots(const char *text, size_t len, const char *where,
                       long *slots_out, char *err, size_t errlen) {
    char buf[16];
    size_t digits = 0;
    long v;

    while (digits < len && text[digits] >= '0' && text[digits] <= '9')
        digits++;
    if (len == 0 || len >= sizeof(buf) || digits < len)
        return error(err, errlen,
                     "%s: slots %.*s: expected a whole number from 1 to %d",
                     where, (int)len, text, HVD_HOST_MAX_SLOTS);
    memcpy(buf, text, len);
    buf[len] = '\0';
    v = strtol(buf, NULL, 10);
    if (v < 1 || v > HVD_HOST_MAX_SLOTS)
        return error(err, errlen,
                     "%s: slots %s: expected a whole number from 1 to %d",
                     where, buf, HVD_HOST_MAX_SLOTS);
    *slots_out = v;
    return 0;
}

/* One host spec of len bytes. slots > 0 is a hostfile's "slots=N", which
 * excludes ":N"; max_slots > 0 its "max_slots=M", which the slots may not
 * exceed. */
static int parse_spec(hvd_hostlist *list, const char *spec, size_t len,
                      long slots, long max_slots, const char *where, char *err,
                      size_t errlen) {
    const char *name = spec;
    size_t name_len = len;
    const char *count = NULL;
    size_t count_len = 0;
    long n = 1;

    if (len > 0 && spec[0] == '[') {
        const char *close = memchr(spec, ']', len);
        if (close == NULL || (close + 1 < spec + len && close[1] != ':'))
            return error(err, errlen,
                         "%s: %.*s: expected [address] or [address]:SLOTS",
                         where, (int)len, spec);
        name = spec + 1;
        name_len = (size_t)(close - name);
        if (close + 1 < spec + len) {
            count = close + 2;
            count_len = len - (size_t)(count - spec);
        }
    } else {
        const char *colon = memchr(spec, ':', len);
        if (colon != NULL &&
            memchr(colon + 1, ':', len - (size_t)(colon + 1 - spec)) == NULL) {
            name_len = (size_t)(colon - spec);
            count = colon + 1;
            count_len = len - name_len - 1;
        }
    }
    if (count != NULL &&
        parse_slots(count, count_len, where, &n, err, errlen) != 0)
        return -1;
    if (slots > 0) {
        if (count != NULL)
            return error(err, errlen,
                         "%s: %.*s: give the slots as :N or as slots=N, not "
                         "both",
                         where, (int)len, spec);
        n = slots;
    }
    if (max_slots > 0 && n > max_slots)
        return error(err, errlen,
                     "%s: max_slots=%ld is less than the %ld slots", where,
                     max_slots, n);
    return add_host(list, name, name_len, n, where, err, errlen);
}

int hvd_hostlist_parse_list(hvd_hostlist *list, const char *text, char *err,
                            size_t errlen) {
    const char *p = text;

    if (*text == '\0')
        return error(err, errlen, "-H needs a host list");
    for (;;) {
        size_t len = strcspn(p, ",");
        if (parse_spec(list, p, len, 0, 0, "-H", err, errlen) != 0)
            return -1;
        if (p[len] == '\0')
            return 0;
        p += len + 1;
    }
}

/* One line (NUL-terminated, modified in place). Open MPI's max_slots=N
 * (or max-slots=N) caps what its mpirun oversubscribes; hvdrun places
 * ranks by slots alone, so it is checked (at least the slots) and then
 * ignored. */
static int parse_line(hvd_hostlist *list, char *line, const char *where,
                      char *err, size_t errlen) {
    char *save = NULL;
    long slots = 0, max_slots = 0;

    line[strcspn(line, "#")] = '\0';
    char *spec = strtok_r(line, " \t\r\n\v\f", &save);
    if (spec == NULL)
        return 0;
    for (char *tok; (tok = strtok_r(NULL, " \t\r\n\v\f", &save)) != NULL;) {
        long *field = &slots;
        size_t skip = 6;
        if (strncmp(tok, "max_slots=", 10) == 0 ||
            strncmp(tok, "max-slots=", 10) == 0) {
            field = &max_slots;
            skip = 10;
        } else if (strncmp(tok, "slots=", 6) != 0) {
            return error(err, errlen,
                         "%s: unknown field '%s' (lines are HOST, HOST:SLOTS "
                         "or HOST slots=SLOTS [max_slots=MAX])",
                         where, tok);
        }
        if (parse_slots(tok + skip, strlen(tok + skip), where, field, err,
                        errlen) != 0)
            return -1;
    }
    return parse_spec(list, spec, strlen(spec), slots, max_slots, where, err,
                      errlen);
}

int hvd_hostlist_parse_text(hvd_hostlist *list, const char *text, size_t len,
                            const char *where, char *err, size_t errlen) {
    size_t off = 0;
    int lineno = 0, before = list->n;
    char *line = NULL;
    size_t cap = 0;

    while (off < len) {
        const char *nl = memchr(text + off, '\n', len - off);
        size_t n = nl != NULL ? (size_t)(nl - (text + off)) : len - off;
        char at[PATH_MAX + 32];

        lineno++;
        if (n + 1 > cap) {
            char *p = realloc(line, n + 1);
            if (p == NULL) {
                free(line);
                return error(err, errlen, "out of memory");
            }
            line = p;
            cap = n + 1;
        }
        /* A NUL byte ends the line, as it would for getline + strtok. */
        memcpy(line, text + off, n);
        line[n] = '\0';
        snprintf(at, sizeof(at), "%s:%d", where, lineno);
        if (parse_line(list, line, at, err, errlen) != 0) {
            free(line);
            return -1;
        }
        off += n + (nl != NULL);
    }
    free(line);
    if (list->n == before)
        return error(err, errlen, "--hostfile %s names no host", where);
    return 0;
}

int hvd_hostlist_parse_file(hvd_hostlist *list, const char *path, char *err,
                            size_t errlen) {
    FILE *f = fopen(path, "r");
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc;

    if (f == NULL)
        return error(err, errlen, "--hostfile %s: cannot open it: %s", path,
                     strerror(errno));
    for (;;) {
        if (cap - len < 4096) {
            size_t ncap = cap ? 2 * cap : 8192;
            char *p = realloc(text, ncap);
            if (p == NULL) {
                free(text);
                fclose(f);
                return error(err, errlen, "out of memory");
            }
            text = p;
            cap = ncap;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        rc = error(err, errlen, "--hostfile %s: read failed: %s", path,
                   strerror(errno));
    } else {
        rc = hvd_hostlist_parse_text(list, text, len, path, err, errlen);
    }
    free(text);
    fclose(f);
    return rc;
}

void hvd_hostlist_free(hvd_hostlist *list) {
    for (int h = 0; h < list->n; h++)
        free(list->v[h].name);
    free(list->v);
    list->v = NULL;
    list->n = list->cap = 0;
}
