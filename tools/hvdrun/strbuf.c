/*
 * Two small builders for the commands hvdrun runs: a growing string
 * (struct sbuf) with quoting for POSIX sh, and a NULL-terminated argument
 * vector (struct strv). launch.c builds the ssh command and its remote
 * script with them, mpi.c the mpirun command. Both record running out of
 * memory in a flag, so a builder checks once at the end.
 */
#include "tools/hvdrun/hvdrun.h"

#include <stdlib.h>
#include <string.h>

void sbuf_addn(struct sbuf *b, const char *text, size_t n) {
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap == 0 ? 1024 : b->cap;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            free(b->p);
            memset(b, 0, sizeof(*b));
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, text, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sbuf_add(struct sbuf *b, const char *text) {
    sbuf_addn(b, text, strlen(text));
}

/* text as one word of POSIX sh: in single quotes, each ' as '\''. */
void sbuf_quote(struct sbuf *b, const char *text) {
    sbuf_add(b, "'");
    for (const char *q; (q = strchr(text, '\'')) != NULL; text = q + 1) {
        sbuf_addn(b, text, (size_t)(q - text));
        sbuf_add(b, "'\\''");
    }
    sbuf_add(b, text);
    sbuf_add(b, "'");
}

void strv_push(struct strv *a, const char *arg) {
    char *copy = a->failed ? NULL : strdup(arg);

    if (copy != NULL && a->n + 2 > a->cap) {
        size_t cap = a->cap == 0 ? 32 : 2 * a->cap;
        char **v = realloc(a->v, cap * sizeof(*v));
        if (v == NULL) {
            free(copy);
            copy = NULL;
        } else {
            a->v = v;
            a->cap = cap;
        }
    }
    if (copy == NULL) {
        a->failed = 1;
        return;
    }
    a->v[a->n++] = copy;
    a->v[a->n] = NULL;
}

void strv_free(struct strv *a) {
    for (size_t k = 0; k < a->n; k++)
        free(a->v[k]);
    free(a->v);
    memset(a, 0, sizeof(*a));
}

/* The arguments as one line for messages, each quoted for sh if needed. */
char *strv_text(char *const *argv) {
    struct sbuf b = {0};

    for (char *const *a = argv; *a != NULL; a++) {
        if (a != argv)
            sbuf_add(&b, " ");
        if (**a != '\0' &&
            strspn(*a, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkl"
                       "mnopqrstuvwxyz0123456789_-+=/.,:@%") == strlen(*a))
            sbuf_add(&b, *a);
        else
            sbuf_quote(&b, *a);
    }
    return b.failed ? NULL : b.p;
}
