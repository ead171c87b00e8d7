#include "transport/choose.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

/* At most this many transports take part in the choice (a bit each). */
#define MAX_TRANSPORTS 32

hvd_status hvd_transport_check_want(const char *want, const char *also) {
    const char *needs = hvd_transport_needs(want);
    char known[160] = "auto";

    if (strcasecmp(want, "auto") == 0 || hvd_transport_find(want) != NULL)
        return HVD_OK;
    if (needs != NULL)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=%s: that transport is not built "
                             "into this hvd (built in: %s; it needs %s when "
                             "hvd is built); unset it or use %s",
                             want, hvd_transport_names(), needs,
                             hvd_transport_always());
    for (size_t i = 0; i < hvd_transport_count(); i++) {
        size_t len = strlen(known);
        snprintf(known + len, sizeof(known) - len, ", %s",
                 hvd_transport_at(i)->name);
    }
    return hvd_error_set(
        HVD_ERR_INVALID_ARG, "HVD_TRANSPORT=%s is not one of %s%s%s (built in)",
        want, known, also != NULL ? ", " : "", also != NULL ? also : "");
}

/* The job's shape as the transports' reach sees it. */
typedef struct shape {
    int nhosts; /* distinct host names */
    int shared; /* some host runs more than one rank */
} shape;

static shape job_shape(const hvd_transport_params *p) {
    shape s = {0, 0};

    for (int i = 0; i < p->size; i++) {
        int first = 1, same = 0;
        for (int j = 0; j < p->size; j++) {
            if (strcmp(p->hosts[i], p->hosts[j]) != 0)
                continue;
            first &= j >= i;
            same++;
        }
        s.nhosts += first;
        s.shared |= same > 1;
    }
    return s;
}

/* The reach a primary needs to serve every pair of this job. */
static unsigned needed_reach(shape s) {
    if (s.nhosts == 1)
        return HVD_REACH_SAME_HOST;
    return HVD_REACH_OTHER_HOSTS | (s.shared ? HVD_REACH_SAME_HOST : 0u);
}

/* What every rank's probes said: a bit per transport, usable there. */
typedef struct verdicts {
    size_t n;
    hvd_caps caps[MAX_TRANSPORTS]; /* this rank's */
    uint32_t all;                  /* usable on every rank */
    int bad[MAX_TRANSPORTS];       /* the first rank that cannot, or -1 */
} verdicts;

static hvd_status probe_all(const char *want, const hvd_transport_params *p,
                            verdicts *v) {
    uint32_t mine = 0, *every;
    hvd_status st;

    memset(v, 0, sizeof(*v));
    v->n = hvd_transport_count();
    if (v->n > MAX_TRANSPORTS)
        v->n = MAX_TRANSPORTS;
    for (size_t i = 0; i < v->n; i++) {
        const hvd_transport_ops *ops = hvd_transport_at(i);
        hvd_caps *c = &v->caps[i];
        v->bad[i] = -1;
        if (strcasecmp(want, "auto") != 0 && strcasecmp(want, ops->name) != 0)
            continue;
        if (ops->probe(p, c) != HVD_OK) {
            memset(c, 0, sizeof(*c));
            snprintf(c->reason, sizeof(c->reason), "%s", hvd_error_get());
        }
        if (c->usable)
            mine |= 1u << i;
    }
    every = calloc((size_t)p->size, sizeof(*every));
    if (every == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    st = p->bootstrap->allgather(p->bootstrap, &mine, sizeof(mine), every);
    if (st == HVD_OK) {
        v->all = ~0u;
        for (int r = 0; r < p->size; r++) {
            v->all &= every[r];
            for (size_t i = 0; i < v->n; i++)
                if (!(every[r] & (1u << i)) && v->bad[i] < 0)
                    v->bad[i] = r;
        }
    }
    free(every);
    return st;
}

/* One rank's open of a transport, as every rank hears of it. */
typedef struct outcome {
    int32_t ok;
    uint32_t pad;
    uint64_t why; /* a hash of the sentence it logs */
} outcome;

/* FNV-1a: equal sentences, equal hashes (for telling them apart only). */
static uint64_t text_hash(const char *text) {
    uint64_t h = 0xcbf29ce484222325ULL;

    for (; *text != '\0'; text++)
        h = (h ^ (uint8_t)*text) * 0x100000001b3ULL;
    return h;
}

/*
 * What every rank's open gave (an allgather over the bootstrap): *all_out
 * 1 if every rank opened it, *bad_out the first rank that did not, and
 * *loud_out whether this rank logs its sentence why (why: what it logs)
 * as a warning. A rank is quiet (its line goes to the debug level) when
 * a rank before it on the same host had the same outcome and the same
 * sentence: a transport that agrees inside its open (shm) fails on every
 * rank, but only the ranks that failed themselves, and the first other
 * rank of each host, have something of their own to say.
 */
static hvd_status agree(const hvd_transport_params *p, int ok, const char *why,
                        int *all_out, int *bad_out, int *loud_out) {
    outcome mine = {ok, 0, text_hash(why)},
            *every = calloc((size_t)p->size, sizeof(*every));
    hvd_status st;

    if (every == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    st = p->bootstrap->allgather(p->bootstrap, &mine, sizeof(mine), every);
    *all_out = 1;
    *bad_out = -1;
    *loud_out = 1;
    for (int r = 0; st == HVD_OK && r < p->size; r++) {
        if (!every[r].ok && *bad_out < 0)
            *bad_out = r;
        *all_out &= every[r].ok != 0;
        if (r < p->rank && every[r].ok == mine.ok && every[r].why == mine.why &&
            (p->hosts == NULL || strcmp(p->hosts[r], p->hosts[p->rank]) == 0))
            *loud_out = 0;
    }
    free(every);
    return st;
}

/* The sentence of a rank whose open worked where another's did not. */
static void other_failed(const hvd_transport_params *p, int bad, char *why,
                         size_t len) {
    snprintf(why, len, "rank %d (on %s) could not set it up; its log says why",
             bad, p->hosts != NULL ? p->hosts[bad] : "?");
}

/* HVD_TRANSPORT=<name>: that transport, or why it cannot serve. */
static hvd_status open_named(const char *want, const hvd_transport_params *p,
                             const verdicts *v, shape s,
                             hvd_transport_choice *c) {
    const hvd_transport_ops *ops = NULL;
    size_t i = 0;

    for (; i < v->n; i++) {
        ops = hvd_transport_at(i);
        if (strcasecmp(ops->name, want) == 0)
            break;
    }
    if (i == v->n)
        return hvd_transport_lookup(want, &ops);
    const hvd_caps *caps = &v->caps[i];
    unsigned need = needed_reach(s);
    if (caps->reach != 0 && (caps->reach & need) != need)
        return hvd_error_set(
            HVD_ERR_UNSUPPORTED,
            "HVD_TRANSPORT=%s: %s serves only ranks on one host, and this "
            "job has ranks on %d hosts: unset it (auto uses %s within each "
            "host) or use %s",
            ops->name, ops->title, s.nhosts, ops->title,
            hvd_transport_always());
    if (!caps->usable)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=%s: %s; unset HVD_TRANSPORT or "
                             "use %s",
                             ops->name, caps->reason, hvd_transport_always());
    if (!(v->all & (1u << i)))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=%s: rank %d (on %s) cannot use "
                             "%s (its log says why); unset HVD_TRANSPORT or "
                             "use %s",
                             ops->name, v->bad[i], p->hosts[v->bad[i]],
                             ops->title, hvd_transport_always());
    hvd_status st = ops->open(p, &c->tp);
    if (st == HVD_OK) {
        c->ops = ops;
        c->caps = *caps;
    }
    return st;
}

/* The candidates of auto for a primary, best first: usable on every rank,
 * reaching every pair, by priority (registry order among equals). */
static size_t candidates(const verdicts *v, shape s, size_t *order) {
    unsigned need = needed_reach(s);
    size_t n = 0;

    for (size_t i = 0; i < v->n; i++) {
        const hvd_caps *c = &v->caps[i];
        if (!(v->all & (1u << i)) || (c->reach & need) != need)
            continue;
        size_t at = n++;
        while (at > 0 && v->caps[order[at - 1]].priority < c->priority) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = i;
    }
    return n;
}

/* HVD_TRANSPORT=auto: the best that opens on every rank. *failed gets a
 * bit for each transport that did not (open_local tries none of them
 * again: one warning each). */
static hvd_status open_auto(const hvd_transport_params *params,
                            const verdicts *v, shape s, hvd_transport_choice *c,
                            uint32_t *failed) {
    size_t order[MAX_TRANSPORTS];
    size_t n = candidates(v, s, order);
    hvd_transport_params p = *params;
    hvd_status st = HVD_OK;

    for (size_t i = 0; i < v->n; i++) {
        const char *title = hvd_transport_at(i)->title;
        if (!v->caps[i].usable)
            HVD_DEBUG("transport", "HVD_TRANSPORT=auto: not %s (%s)", title,
                      v->caps[i].reason);
        else if (!(v->all & (1u << i)))
            HVD_DEBUG("transport",
                      "HVD_TRANSPORT=auto: not %s (rank %d cannot use it)",
                      title, v->bad[i]);
    }
    for (size_t k = 0; k < n; k++) {
        const hvd_transport_ops *ops = hvd_transport_at(order[k]);
        hvd_transport *tp = NULL;
        char why[HVD_ERROR_MAX] = "";
        int all = 0, bad = -1, loud = 1;

        p.may_fall_back = k + 1 < n;
        st = ops->open(&p, &tp);
        if (!p.may_fall_back) {
            if (st == HVD_OK) {
                c->ops = ops;
                c->tp = tp;
                c->caps = v->caps[order[k]];
            }
            return st;
        }
        if (st != HVD_OK)
            snprintf(why, sizeof(why), "%s", hvd_error_get());
        hvd_status ast = agree(&p, st == HVD_OK, why, &all, &bad, &loud);
        if (ast == HVD_OK && all) {
            c->ops = ops;
            c->tp = tp;
            c->caps = v->caps[order[k]];
            return HVD_OK;
        }
        ops->close(tp);
        if (ast != HVD_OK)
            return ast;
        *failed |= 1u << order[k];
        if (st == HVD_OK)
            other_failed(&p, bad, why, sizeof(why));
        HVD_LOG(loud ? HVD_LOG_WARN : HVD_LOG_DEBUG, "transport",
                "HVD_TRANSPORT=auto: %s could not be set up (%s); using %s "
                "instead",
                ops->title, why, hvd_transport_at(order[k + 1])->title);
    }
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "HVD_TRANSPORT=auto: no transport built into this "
                         "hvd (%s) can connect the %d ranks on %d host(s)",
                         hvd_transport_names(), params->size, s.nhosts);
}

/*
 * auto where a host runs several ranks: the best same-host specialist
 * beside a primary that is not one. Every rank takes part, its host
 * shared or not (the open is collective), and every rank hears whether it
 * opened everywhere (ranks of one host may fail where others did not:
 * /dev/shm filled up between them), so a failure leaves the primary alone
 * everywhere, with a warning. Fails only if the bootstrap does.
 */
static hvd_status open_local(const hvd_transport_params *params,
                             const verdicts *v, uint32_t failed,
                             hvd_transport_choice *c) {
    const hvd_transport_ops *best = NULL;
    hvd_transport_params p = *params;
    hvd_transport *tp = NULL;
    char why[HVD_ERROR_MAX] = "";
    int best_priority = 0, all = 0, bad = -1, loud = 1;
    hvd_status st, ast;

    if (c->caps.reach == HVD_REACH_SAME_HOST)
        return HVD_OK;
    for (size_t i = 0; i < v->n; i++) {
        const hvd_transport_ops *ops = hvd_transport_at(i);
        if (v->caps[i].reach != HVD_REACH_SAME_HOST || ops == c->ops ||
            (failed & (1u << i)))
            continue;
        if (best == NULL || v->caps[i].priority > best_priority) {
            best = ops;
            best_priority = v->caps[i].priority;
        }
    }
    if (best == NULL)
        return HVD_OK;
    /* The primary carries everything if this cannot be opened. */
    p.may_fall_back = 1;
    st = best->open(&p, &tp);
    if (st != HVD_OK)
        snprintf(why, sizeof(why), "%s", hvd_error_get());
    ast = agree(&p, st == HVD_OK, why, &all, &bad, &loud);
    if (ast == HVD_OK && all) {
        c->local_ops = best;
        c->local_tp = tp;
        return HVD_OK;
    }
    best->close(tp);
    if (ast != HVD_OK)
        return ast;
    if (st == HVD_OK)
        other_failed(&p, bad, why, sizeof(why));
    HVD_LOG(loud ? HVD_LOG_WARN : HVD_LOG_DEBUG, "transport",
            "%s is not used: %s; same-host ranks talk over %s", best->title,
            why, c->ops->name);
    return HVD_OK;
}

hvd_status hvd_transport_choose(const char *want,
                                const hvd_transport_params *params,
                                hvd_transport_choice *out) {
    hvd_transport_choice c;
    verdicts *v = calloc(1, sizeof(*v));
    shape s = job_shape(params);
    int automatic = strcasecmp(want, "auto") == 0;
    uint32_t failed = 0;
    hvd_status st;

    if (v == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    memset(&c, 0, sizeof(c));
    st = probe_all(want, params, v);
    if (st == HVD_OK)
        st = automatic ? open_auto(params, v, s, &c, &failed)
                       : open_named(want, params, v, s, &c);
    if (st == HVD_OK && automatic && s.shared) {
        st = open_local(params, v, failed, &c);
        if (st != HVD_OK)
            hvd_transport_choice_close(&c);
    }
    free(v);
    if (st == HVD_OK)
        *out = c;
    return st;
}

hvd_status hvd_transport_choice_shutdown(hvd_transport_choice *c) {
    hvd_status st = HVD_OK;

    if (c->local_tp != NULL)
        st = c->local_ops->shutdown(c->local_tp);
    if (st == HVD_OK && c->tp != NULL)
        st = c->ops->shutdown(c->tp);
    return st;
}

void hvd_transport_choice_close(hvd_transport_choice *c) {
    if (c->local_tp != NULL)
        c->local_ops->close(c->local_tp);
    if (c->tp != NULL)
        c->ops->close(c->tp);
    memset(c, 0, sizeof(*c));
}
