#include "api/runtime/slurm_nodes.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/base/error.h"

/* Digits of a number in a list: below 10^9, so that a range is counted in
 * a long without overflow. */
#define MAX_DIGITS 9
/* How much of a value a sentence quotes: a list may be very long. */
#define QUOTE 120

/* The names found so far: their text, NUL-terminated one after the other,
 * and where each starts. */
typedef struct builder {
    const char *var, *text; /* for the sentences */
    char *buf;
    size_t len, cap;
    size_t *offs;
    size_t n, ncap;
    char name[HVD_SLURM_MAX_NAME + 1]; /* the name being built */
} builder;

static hvd_status bad_list(const builder *b, const char *why) {
    return hvd_error_set(
        HVD_ERR_INVALID_ARG, "%s=%.*s%s is not a Slurm host list: %s", b->var,
        QUOTE, b->text, strlen(b->text) > QUOTE ? "..." : "", why);
}

static hvd_status push(builder *b, size_t name_len) {
    if (b->n >= HVD_SLURM_MAX_NODES)
        return bad_list(b, "it names more than 65536 hosts");
    if (b->n == b->ncap) {
        size_t ncap = b->ncap ? 2 * b->ncap : 16;
        size_t *offs = realloc(b->offs, ncap * sizeof(*offs));
        if (offs == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory for %s",
                                 b->var);
        b->offs = offs;
        b->ncap = ncap;
    }
    if (b->len + name_len + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        char *buf;

        while (cap < b->len + name_len + 1)
            cap *= 2;
        buf = realloc(b->buf, cap);
        if (buf == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory for %s",
                                 b->var);
        b->buf = buf;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, b->name, name_len);
    b->buf[b->len + name_len] = '\0';
    b->offs[b->n++] = b->len;
    b->len += name_len + 1;
    return HVD_OK;
}

/* Appends text to the name being built, which holds len characters. */
static hvd_status append(builder *b, size_t *len, const char *text, size_t n) {
    if (*len + n > HVD_SLURM_MAX_NAME)
        return bad_list(b, "a host name is longer than 255 characters");
    memcpy(b->name + *len, text, n);
    *len += n;
    return HVD_OK;
}

/* One number of a bracket group: digits only, at most MAX_DIGITS. */
static hvd_status number(builder *b, const char *s, size_t n, long *out) {
    long v = 0;

    if (n == 0 || n > MAX_DIGITS)
        return bad_list(b, n == 0 ? "a range lacks a number"
                                  : "a number has more than 9 digits");
    for (size_t k = 0; k < n; k++) {
        if (!isdigit((unsigned char)s[k]))
            return bad_list(b, "a bracket holds something other than "
                               "numbers, ranges and commas");
        v = v * 10 + (s[k] - '0');
    }
    *out = v;
    return HVD_OK;
}

static hvd_status expand_rest(builder *b, size_t len, const char *rest,
                              size_t n);

/* The bracket group group[0..n) (without its brackets), then the rest of
 * the name after it, with the name built so far holding len characters. */
static hvd_status expand_group(builder *b, size_t len, const char *group,
                               size_t n, const char *rest, size_t rest_n) {
    hvd_status st = HVD_OK;

    if (n == 0)
        return bad_list(b, "a bracket is empty");
    while (n > 0) {
        size_t item = strcspn(group, ","), lo_n;
        const char *dash;
        long lo, hi;

        if (item > n)
            item = n;
        dash = memchr(group, '-', item);
        lo_n = dash != NULL ? (size_t)(dash - group) : item;
        st = number(b, group, lo_n, &lo);
        if (st == HVD_OK)
            st = dash != NULL ? number(b, dash + 1, item - lo_n - 1, &hi)
                              : (hi = lo, HVD_OK);
        if (st != HVD_OK)
            return st;
        if (hi < lo)
            return bad_list(b, "a range goes down");
        for (long v = lo; v <= hi; v++) {
            char digits[MAX_DIGITS + 2];
            size_t l2 = len;
            int d = snprintf(digits, sizeof(digits), "%0*ld", (int)lo_n, v);

            st = append(b, &l2, digits, (size_t)d);
            if (st == HVD_OK)
                st = expand_rest(b, l2, rest, rest_n);
            if (st != HVD_OK)
                return st;
        }
        if (item < n && item + 1 == n)
            return bad_list(b, "a bracket ends with a comma");
        group += item < n ? item + 1 : item;
        n -= item < n ? item + 1 : item;
    }
    return st;
}

/* The rest of a name, rest[0..n), after len characters built. */
static hvd_status expand_rest(builder *b, size_t len, const char *rest,
                              size_t n) {
    const char *open = memchr(rest, '[', n);
    const char *close;
    hvd_status st;

    if (open == NULL) {
        st = append(b, &len, rest, n);
        return st == HVD_OK ? push(b, len) : st;
    }
    close = memchr(open, ']', n - (size_t)(open - rest));
    if (close == NULL)
        return bad_list(b, "a bracket is not closed");
    st = append(b, &len, rest, (size_t)(open - rest));
    if (st != HVD_OK)
        return st;
    return expand_group(b, len, open + 1, (size_t)(close - open - 1), close + 1,
                        n - (size_t)(close + 1 - rest));
}

/* Checks the list's characters and brackets before anything is expanded:
 * no nesting, no stray bracket, no empty name, no space. */
static hvd_status check_list(builder *b) {
    int depth = 0;
    size_t name_len = 0;

    if (b->text[0] == '\0')
        return bad_list(b, "it is empty");
    for (const char *p = b->text;; p++) {
        if (*p == '\0' || (*p == ',' && depth == 0)) {
            if (depth != 0)
                return bad_list(b, "a bracket is not closed");
            if (name_len == 0)
                return bad_list(b, "it holds an empty name");
            if (*p == '\0')
                return HVD_OK;
            name_len = 0;
            continue;
        }
        if (isspace((unsigned char)*p) || iscntrl((unsigned char)*p))
            return bad_list(b, "it holds a space or control character");
        if (*p == '[' && depth++ != 0)
            return bad_list(b, "a bracket is inside a bracket");
        if (*p == ']' && --depth != 0)
            return bad_list(b, "a bracket closes that was not opened");
        name_len++;
    }
}

hvd_status hvd_slurm_nodes_expand(const char *var, const char *text,
                                  hvd_slurm_nodes *out) {
    builder b = {.var = var, .text = text};
    const char *p = text;
    char **names;
    hvd_status st = check_list(&b);

    while (st == HVD_OK && *p != '\0') {
        size_t n = 0;
        int depth = 0;

        /* The name ends at the first comma outside a bracket. */
        while (p[n] != '\0' && (p[n] != ',' || depth != 0)) {
            depth += p[n] == '[' ? 1 : p[n] == ']' ? -1 : 0;
            n++;
        }
        st = expand_rest(&b, 0, p, n);
        p += p[n] == ',' ? n + 1 : n;
    }
    if (st != HVD_OK)
        goto free_builder;
    names = malloc(b.n * sizeof(*names) + b.len);
    if (names == NULL) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory for %s", var);
        goto free_builder;
    }
    memcpy((char *)(names + b.n), b.buf, b.len);
    for (size_t k = 0; k < b.n; k++)
        names[k] = (char *)(names + b.n) + b.offs[k];
    out->names = names;
    out->n = b.n;
free_builder:
    free(b.buf);
    free(b.offs);
    return st;
}

void hvd_slurm_nodes_free(hvd_slurm_nodes *nodes) {
    free(nodes->names);
    nodes->names = NULL;
    nodes->n = 0;
}

long hvd_slurm_nodes_find(const hvd_slurm_nodes *nodes, const char *name) {
    for (size_t k = 0; k < nodes->n; k++)
        if (strcmp(nodes->names[k], name) == 0)
            return (long)k;
    return -1;
}

static hvd_status bad_tasks(const char *var, const char *text,
                            const char *why) {
    return hvd_error_set(HVD_ERR_INVALID_ARG,
                         "%s=%.*s%s is not a Slurm task count per node "
                         "(such as 2(x3),1): %s",
                         var, QUOTE, text, strlen(text) > QUOTE ? "..." : "",
                         why);
}

/* A decimal number of 1 to 9 digits at *p, at least 1; *p moves past it. */
static int count_at(const char **p, long *out) {
    long v = 0;
    int digits = 0;

    while (isdigit((unsigned char)**p) && digits < MAX_DIGITS) {
        v = v * 10 + (**p - '0');
        (*p)++;
        digits++;
    }
    *out = v;
    return digits > 0 && v > 0 && !isdigit((unsigned char)**p);
}

hvd_status hvd_slurm_tasks_expand(const char *var, const char *text,
                                  int **counts_out, size_t *n_out) {
    const char *p = text;
    size_t n = 0;
    int *counts = NULL;

    /* Counted first, so that the array is allocated once, bounded. */
    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0;

        p = text;
        while (1) {
            long tasks, times = 1;

            if (!count_at(&p, &tasks) || tasks > (1L << 24))
                return bad_tasks(var, text,
                                 "a count is not a number of "
                                 "1 to 16777216");
            if (*p == '(') {
                p++;
                if (*p++ != 'x' || !count_at(&p, &times) || *p++ != ')')
                    return bad_tasks(var, text, "a repeat is not (xN)");
            }
            if (times > HVD_SLURM_MAX_NODES ||
                k + (size_t)times > HVD_SLURM_MAX_NODES)
                return bad_tasks(var, text,
                                 "it counts more than 65536 "
                                 "nodes");
            for (long r = 0; r < times; r++, k++)
                if (pass == 1)
                    counts[k] = (int)tasks;
            if (*p == '\0')
                break;
            if (*p++ != ',')
                return bad_tasks(var, text,
                                 "counts are separated by "
                                 "commas");
        }
        if (pass == 0) {
            n = k;
            counts = malloc(n * sizeof(*counts));
            if (counts == NULL)
                return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory for %s",
                                     var);
        }
    }
    *counts_out = counts;
    *n_out = n;
    return HVD_OK;
}
