#include "api/runtime/coordinator.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/namemap.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* The name of the join entry: a rank has one join in flight at most. */
#define JOIN_NAME "hvd.join"

typedef struct centry {
    struct centry *prev, *next; /* first-asked order */
    char *name;
    double first_seen;
    double warned_at;
    int nreported;
    int last_rank;           /* the rank that asked last */
    unsigned char *reported; /* per rank */
    hvd_opdesc *desc;        /* per rank; counts owned */
} centry;

struct hvd_coord {
    int size;
    double stall_check_s;
    double stall_shutdown_s;
    hvd_namemap by_name;
    centry *head, *tail;
    int count;
    unsigned char *stopped; /* per rank: it called hvd_shutdown */
    int nstopped;
    /* Process sets by id (0, the job, is implicit): members[id] flags
     * each rank, NULL once removed; nmembers[id] counts them. */
    unsigned char **members;
    int *nmembers;
    int nsets; /* ids given so far, 0 included */
};

/* 1 if rank r belongs to process set id (which exists). */
static int member(const hvd_coord *c, int id, int r) {
    return id == 0 || c->members[id][r];
}

/* The members of set id, or 0 if there is no such set. */
static int set_size(const hvd_coord *c, int id) {
    if (id == 0)
        return c->size;
    return id > 0 && id < c->nsets && c->members[id] != NULL ? c->nmembers[id]
                                                             : 0;
}

static void entry_free(hvd_coord *c, centry *e) {
    for (int r = 0; r < c->size; r++)
        free((void *)e->desc[r].counts);
    free(e->desc);
    free(e->reported);
    free(e->name);
    free(e);
}

static void entry_unlink(hvd_coord *c, centry *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    hvd_namemap_remove(&c->by_name, e->name);
    c->count--;
    entry_free(c, e);
}

hvd_status hvd_coord_create(int size, double stall_check_s,
                            double stall_shutdown_s, hvd_coord **out) {
    hvd_coord *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    c->stopped = calloc((size_t)size, 1);
    if (c->stopped == NULL) {
        free(c);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    c->size = size;
    c->stall_check_s = stall_check_s;
    c->stall_shutdown_s = stall_shutdown_s;
    c->nsets = 1;
    hvd_namemap_init(&c->by_name);
    *out = c;
    return HVD_OK;
}

void hvd_coord_destroy(hvd_coord *c) {
    if (c == NULL)
        return;
    while (c->head != NULL)
        entry_unlink(c, c->head);
    hvd_namemap_destroy(&c->by_name);
    for (int i = 1; c->members != NULL && i < c->nsets; i++)
        free(c->members[i]);
    free(c->members);
    free(c->nmembers);
    free(c->stopped);
    free(c);
}

void hvd_coord_stopped(hvd_coord *c, int rank) {
    if (rank >= 0 && rank < c->size && !c->stopped[rank]) {
        c->stopped[rank] = 1;
        c->nstopped++;
    }
}

int hvd_coord_pending(const hvd_coord *c) { return c->count; }

int hvd_coord_joined(const hvd_coord *c) {
    if (c->count == 0)
        return 0;
    const centry *join = hvd_namemap_get(&c->by_name, JOIN_NAME);

    return join != NULL ? join->nreported : 0;
}

hvd_status hvd_coord_add(hvd_coord *c, int rank, const char *name,
                         const hvd_opdesc *desc, double age_s, double now) {
    centry *e = hvd_namemap_get(&c->by_name, name);
    uint64_t *counts;

    if (rank < 0 || rank >= c->size)
        return hvd_error_set(HVD_ERR_INTERNAL, "request from rank %d", rank);
    if (e == NULL) {
        e = calloc(1, sizeof(*e));
        if (e == NULL)
            goto oom;
        e->name = strdup(name);
        e->reported = calloc((size_t)c->size, 1);
        e->desc = calloc((size_t)c->size, sizeof(*e->desc));
        if (e->name == NULL || e->reported == NULL || e->desc == NULL ||
            hvd_namemap_put(&c->by_name, name, e) != 0) {
            free(e->name);
            free(e->reported);
            free(e->desc);
            free(e);
            goto oom;
        }
        e->first_seen = now - age_s;
        e->warned_at = -1;
        e->prev = c->tail;
        if (c->tail)
            c->tail->next = e;
        else
            c->head = e;
        c->tail = e;
        c->count++;
    }
    counts = malloc((desc->ncounts ? desc->ncounts : 1) * sizeof(*counts));
    if (counts == NULL)
        goto oom;
    memcpy(counts, desc->counts, desc->ncounts * sizeof(*counts));
    free((void *)e->desc[rank].counts);
    e->desc[rank] = *desc;
    e->desc[rank].counts = counts;
    if (!e->reported[rank]) {
        e->reported[rank] = 1;
        e->nreported++;
    }
    e->last_rank = rank;
    if (now - age_s < e->first_seen)
        e->first_seen = now - age_s;
    return HVD_OK;
oom:
    return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory in the coordinator");
}

/* "1,3,4" (at most a few dozen, then "..."): the members of e's set that
 * have (want_reported) or have not asked for it. */
static void rank_list(const hvd_coord *c, const centry *e, int want_reported,
                      const unsigned char *skip, char *out, size_t outlen) {
    size_t off = 0;
    int n = 0, id = e->desc[e->last_rank].pset;

    out[0] = '\0';
    for (int r = 0; r < c->size && off + 16 < outlen; r++) {
        if (!!e->reported[r] != want_reported || (skip != NULL && skip[r]) ||
            (set_size(c, id) > 0 && !member(c, id, r)))
            continue;
        off +=
            (size_t)snprintf(out + off, outlen - off, "%s%d", n ? "," : "", r);
        n++;
    }
    if (off + 16 >= outlen)
        snprintf(out + off, outlen - off, ",...");
    if (n == 0 && off == 0)
        snprintf(out, outlen, "none");
}

static Hvd__Engine__Response *
new_response(const centry *e, int rank, hvd_status status, const char *error) {
    Hvd__Engine__Response *r = malloc(sizeof(*r));
    const hvd_opdesc *d = &e->desc[rank];

    if (r == NULL)
        return NULL;
    hvd__engine__response__init(r);
    r->kind = d->kind;
    r->name = strdup(e->name);
    r->dtype = d->dtype;
    r->op = d->op;
    r->root = d->root;
    r->mem = d->mem;
    r->process_set = (uint32_t)d->pset;
    r->n_counts = d->ncounts;
    r->counts = malloc((d->ncounts ? d->ncounts : 1) * sizeof(uint64_t));
    r->n_shape = (size_t)d->ndims;
    r->shape = malloc((d->ndims ? (size_t)d->ndims : 1) * sizeof(int64_t));
    r->status = status;
    r->error = strdup(error ? error : "");
    r->last_joined = -1;
    if (r->name == NULL || r->counts == NULL || r->shape == NULL ||
        r->error == NULL) {
        free(r->name);
        free(r->counts);
        free(r->shape);
        free(r->error);
        free(r);
        return NULL;
    }
    memcpy(r->counts, d->counts, d->ncounts * sizeof(uint64_t));
    memcpy(r->shape, d->dims, (size_t)d->ndims * sizeof(int64_t));
    return r;
}

static int append(Hvd__Engine__ResponseList *list, Hvd__Engine__Response *r) {
    Hvd__Engine__Response **v =
        realloc(list->responses, (list->n_responses + 1) * sizeof(*v));

    if (v == NULL)
        return -1;
    v[list->n_responses++] = r;
    list->responses = v;
    return 0;
}

/* Each asking rank's values, for a mismatch sentence. */
static void describe_ranks(const hvd_coord *c, const centry *e, char *out,
                           size_t outlen) {
    size_t off =
        (size_t)snprintf(out, outlen, "ranks disagree on '%s': ", e->name);
    int shown = 0;

    for (int r = 0; r < c->size && off + 80 < outlen; r++) {
        char what[160];
        if (!e->reported[r])
            continue;
        if (shown == 16) {
            snprintf(out + off, outlen - off, "; ...");
            return;
        }
        hvd_opdesc_format(&e->desc[r], what, sizeof(what));
        off += (size_t)snprintf(out + off, outlen - off, "%srank %d: %s",
                                shown ? "; " : "", r, what);
        shown++;
    }
}

/* "'x': rank(s) 2,3 called hvd_shutdown without submitting it". */
static void gone_text(const hvd_coord *c, const centry *e,
                      const unsigned char *joined, char *out, size_t outlen) {
    size_t off = 0;
    int n = 0, is_join = strcmp(e->name, JOIN_NAME) == 0;
    char ranks[128];

    int id = e->desc[e->last_rank].pset;

    ranks[0] = '\0';
    for (int r = 0; r < c->size && off + 16 < sizeof(ranks); r++)
        if (c->stopped[r] && !e->reported[r] &&
            (set_size(c, id) == 0 || member(c, id, r)) &&
            (joined == NULL || !joined[r] || is_join))
            off += (size_t)snprintf(ranks + off, sizeof(ranks) - off, "%s%d",
                                    n++ ? "," : "", r);
    if (is_join)
        snprintf(out, outlen,
                 "rank(s) %s called hvd_shutdown without joining; "
                 "the joined ranks would wait for them forever",
                 ranks);
    else
        snprintf(out, outlen,
                 "'%s': rank(s) %s called hvd_shutdown without submitting it",
                 e->name, ranks);
}

/*
 * Every rank asked to create or remove a process set (the same one): the
 * response that does it, registered here (a new set gets the next id, in
 * the response's created_set), or an error response.
 */
static Hvd__Engine__Response *pset_decide(hvd_coord *c, const centry *e,
                                          int first, char *text,
                                          size_t textlen) {
    const hvd_opdesc *d = &e->desc[first];
    Hvd__Engine__Response *r;

    if ((int)d->op == HVD_PSET_REMOVE) {
        int id = d->root;
        if (set_size(c, id) == 0) {
            snprintf(text, textlen, "there is no process set %d to remove", id);
            return new_response(e, first, HVD_ERR_INVALID_ARG, text);
        }
        free(c->members[id]);
        c->members[id] = NULL;
        r = new_response(e, first, HVD_OK, NULL);
        if (r != NULL)
            r->contributors = (uint32_t)c->size;
        return r;
    }
    if (d->ncounts == (size_t)c->size) {
        snprintf(text, textlen,
                 "a process set of these ranks exists already (id 0: every "
                 "rank of the job)");
        return new_response(e, first, HVD_ERR_INVALID_ARG, text);
    }
    for (int id = 1; id < c->nsets; id++) {
        int same = c->members[id] != NULL && c->nmembers[id] == (int)d->ncounts;
        for (size_t i = 0; same && i < d->ncounts; i++)
            same = c->members[id][d->counts[i]];
        if (same) {
            snprintf(text, textlen,
                     "a process set of these ranks exists already (id %d)", id);
            return new_response(e, first, HVD_ERR_INVALID_ARG, text);
        }
    }
    unsigned char **m =
        realloc(c->members, (size_t)(c->nsets + 1) * sizeof(*m));
    if (m != NULL) {
        m[0] = NULL; /* the job: every rank */
        c->members = m;
    }
    int *n = realloc(c->nmembers, (size_t)(c->nsets + 1) * sizeof(*n));
    if (n != NULL)
        c->nmembers = n;
    unsigned char *flags = calloc((size_t)c->size, 1);
    if (m == NULL || n == NULL || flags == NULL) {
        free(flags);
        return NULL;
    }
    for (size_t i = 0; i < d->ncounts; i++)
        flags[d->counts[i]] = 1;
    r = new_response(e, first, HVD_OK, NULL);
    if (r == NULL) {
        free(flags);
        return NULL;
    }
    c->members[c->nsets] = flags;
    c->nmembers[c->nsets] = (int)d->ncounts;
    r->created_set = (uint32_t)c->nsets++;
    r->contributors = (uint32_t)c->size;
    return r;
}

/* Who of entry e's set has asked (first: the first of them, -1: none;
 * same: whether they agree), and who has not: joined, or missing (gone:
 * of those, how many have stopped). */
typedef struct tally {
    int first, same, missing, joined_missing, gone;
} tally;

static void count_ranks(const hvd_coord *c, const centry *e, int id,
                        const unsigned char *joined, tally *t) {
    memset(t, 0, sizeof(*t));
    t->first = -1;
    t->same = 1;
    for (int k = 0; k < c->size; k++) {
        if (!member(c, id, k))
            continue;
        if (e->reported[k]) {
            if (t->first < 0)
                t->first = k;
            else if (!hvd_opdesc_agree(&e->desc[t->first], &e->desc[k]))
                t->same = 0;
        } else if (joined != NULL && joined[k]) {
            t->joined_missing++;
        } else {
            t->missing++;
            t->gone += c->stopped[k];
        }
    }
}

/* The failure of e's kind while some of its set's ranks are joined. */
static Hvd__Engine__Response *joined_failure(const hvd_coord *c,
                                             const centry *e, int id, int first,
                                             const unsigned char *joined,
                                             char *text, size_t len) {
    char ranks[128];
    size_t off = 0;

    for (int k = 0; k < c->size && off + 16 < sizeof(ranks); k++)
        if (joined[k] && !e->reported[k] && member(c, id, k))
            off += (size_t)snprintf(ranks + off, sizeof(ranks) - off, "%s%d",
                                    off ? "," : "", k);
    snprintf(text, len,
             "'%s': a %s cannot complete while rank(s) %s have called "
             "hvd_join",
             e->name, hvd_kind_name(e->desc[first].kind), ranks);
    return new_response(e, first, HVD_ERR_INVALID_ARG, text);
}

/* e decided: every member asked (the joined ones contribute the neutral
 * element). NULL when out of memory. */
static Hvd__Engine__Response *success(const hvd_coord *c, const centry *e,
                                      int id, const tally *t,
                                      const unsigned char *joined) {
    Hvd__Engine__Response *r = new_response(e, t->first, HVD_OK, NULL);

    if (r == NULL)
        return NULL;
    r->contributors = (uint32_t)(set_size(c, id) - t->joined_missing);
    if (t->joined_missing == 0)
        return r;
    r->joined = malloc((size_t)t->joined_missing * sizeof(uint32_t));
    if (r->joined == NULL) {
        hvd__engine__response__free_unpacked(r, NULL);
        return NULL;
    }
    for (int k = 0; k < c->size; k++)
        if (!e->reported[k] && joined[k])
            r->joined[r->n_joined++] = (uint32_t)k;
    return r;
}

/* Not every rank has asked for e yet: the stall inspector warns, or fails
 * it (the response; NULL: it waits on). */
static Hvd__Engine__Response *stall(hvd_coord *c, centry *e, int first,
                                    double now, const unsigned char *joined,
                                    char *text, size_t len) {
    double age = now - e->first_seen;
    char ranks[128], have[128];

    if (c->stall_shutdown_s > 0 && age >= c->stall_shutdown_s) {
        rank_list(c, e, 0, joined, ranks, sizeof(ranks));
        snprintf(text, len,
                 "'%s' waited %.0f s for rank(s) %s to submit it; failing it "
                 "(HVD_STALL_SHUTDOWN_SECONDS=%g)",
                 e->name, age, ranks, c->stall_shutdown_s);
        HVD_ERROR("engine", "%s", text);
        return new_response(e, first, HVD_ERR_TIMEOUT, text);
    }
    if (c->stall_check_s > 0 && age >= c->stall_check_s &&
        (e->warned_at < 0 || now - e->warned_at >= c->stall_check_s)) {
        rank_list(c, e, 0, joined, ranks, sizeof(ranks));
        rank_list(c, e, 1, NULL, have, sizeof(have));
        HVD_WARN("engine",
                 "stall: '%s' waits %.0f s for rank(s) %s (submitted by %s): "
                 "a rank skipped it, submits it later, or runs another branch",
                 e->name, age, ranks, have);
        e->warned_at = now;
    }
    return NULL;
}

/*
 * What rank 0 decides for entry e now: *r the response (NULL: it waits).
 * -1 when out of memory.
 */
static int decide(hvd_coord *c, centry *e, double now,
                  const unsigned char *joined, Hvd__Engine__Response **r) {
    char text[HVD_ERROR_MAX];
    int id = e->desc[e->last_rank].pset;
    tally t;

    *r = NULL;
    if (set_size(c, id) == 0) {
        snprintf(text, sizeof(text),
                 "'%s': process set %d does not exist (it was removed, or "
                 "never created)",
                 e->name, id);
        *r = new_response(e, e->last_rank, HVD_ERR_INVALID_ARG, text);
        return *r != NULL ? 0 : -1;
    }
    count_ranks(c, e, id, joined, &t);
    hvd_kind kind = e->desc[t.first].kind;
    /* A joined rank contributes a neutral element to the job's allreduces
     * and barriers; a process set waits for its members. */
    int neutral_ok =
        id == 0 && (kind == HVD_KIND_ALLREDUCE || kind == HVD_KIND_BARRIER);

    if (t.gone > 0) {
        /* A rank that called hvd_shutdown submits nothing more. */
        gone_text(c, e, joined, text, sizeof(text));
        *r = new_response(e, t.first, HVD_ERR_SHUTDOWN, text);
    } else if (t.missing == 0 && !t.same) {
        describe_ranks(c, e, text, sizeof(text));
        *r = new_response(e, t.first, HVD_ERR_MISMATCH, text);
    } else if (t.joined_missing > 0 && !neutral_ok) {
        /* It cannot complete while they are joined, and the ranks that
         * asked wait in it instead of joining: fail it at once, on the
         * ranks that asked (the others fail alike when they ask, which
         * they may under other names, having skipped a call). */
        *r = joined_failure(c, e, id, t.first, joined, text, sizeof(text));
    } else if (t.missing == 0 && kind == HVD_KIND_PSET) {
        *r = pset_decide(c, e, t.first, text, sizeof(text));
    } else if (t.missing == 0) {
        *r = success(c, e, id, &t, joined);
    } else {
        *r = stall(c, e, t.first, now, joined, text, sizeof(text));
        return 0;
    }
    return *r != NULL ? 0 : -1;
}

/* The join's response, once every rank has joined or one that has not
 * stopped (the joined ranks would wait for a rank that has left). -1 when
 * out of memory. */
static int decide_join(hvd_coord *c, centry *join, int njoined,
                       Hvd__Engine__ResponseList *list) {
    Hvd__Engine__Response *r = NULL;
    char text[HVD_ERROR_MAX];
    int join_gone = 0;

    for (int k = 0; k < c->size; k++)
        join_gone += c->stopped[k] && !join->reported[k];
    if (join_gone > 0) {
        gone_text(c, join, join->reported, text, sizeof(text));
        r = new_response(join, join->last_rank, HVD_ERR_SHUTDOWN, text);
    } else if (njoined == c->size) {
        r = new_response(join, join->last_rank, HVD_OK, NULL);
        if (r != NULL) {
            r->last_joined = join->last_rank;
            r->contributors = (uint32_t)c->size;
        }
    } else {
        return 0;
    }
    if (r == NULL || append(list, r) != 0) {
        if (r != NULL)
            hvd__engine__response__free_unpacked(r, NULL);
        return -1;
    }
    entry_unlink(c, join);
    return 0;
}

hvd_status hvd_coord_collect(hvd_coord *c, double now,
                             Hvd__Engine__ResponseList *list) {
    if (c->head == NULL)
        return HVD_OK; /* nothing asked for */
    centry *join = hvd_namemap_get(&c->by_name, JOIN_NAME);
    const unsigned char *joined = join != NULL ? join->reported : NULL;
    int njoined = join != NULL ? join->nreported : 0;

    for (centry *e = c->head, *next; e != NULL; e = next) {
        Hvd__Engine__Response *r;

        next = e->next;
        if (e == join)
            continue;
        if (decide(c, e, now, joined, &r) != 0)
            goto oom;
        if (r == NULL)
            continue;
        if (append(list, r) != 0) {
            hvd__engine__response__free_unpacked(r, NULL);
            goto oom;
        }
        entry_unlink(c, e);
    }
    if (join != NULL && decide_join(c, join, njoined, list) != 0)
        goto oom;
    return HVD_OK;
oom:
    return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory in the coordinator");
}

void hvd_coord_free_responses(Hvd__Engine__ResponseList *list) {
    for (size_t i = 0; i < list->n_responses; i++)
        hvd__engine__response__free_unpacked(list->responses[i], NULL);
    free(list->responses);
    list->responses = NULL;
    list->n_responses = 0;
}

double hvd_coord_next_deadline(const hvd_coord *c) {
    double next = -1;

    for (const centry *e = c->head; e != NULL; e = e->next) {
        double t = -1;
        if (strcmp(e->name, JOIN_NAME) == 0)
            continue; /* joined ranks wait for the others by design */
        if (c->stall_check_s > 0)
            t = e->warned_at < 0 ? e->first_seen + c->stall_check_s
                                 : e->warned_at + c->stall_check_s;
        if (c->stall_shutdown_s > 0) {
            double s = e->first_seen + c->stall_shutdown_s;
            if (t < 0 || s < t)
                t = s;
        }
        if (t >= 0 && (next < 0 || t < next))
            next = t;
    }
    return next;
}
