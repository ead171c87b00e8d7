/*
 * hvd-bench --model: what a trainer sees instead of the sweep. One step
 * submits an async allreduce per gradient tensor of a real model (read
 * from its tensor list), in backward order, and is timed against one
 * pre-fused allreduce of the same size; then a cached 4-byte allreduce is
 * timed against the bare collective the engine runs under it, on the
 * engine thread through hvd_internal_call (hence the internal headers and
 * the static library).
 */
#include "tools/bench/bench.h"

#include "api/hvd_internal.h"
#include "collectives/coll.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* --model: one training step's gradients, and small-message latency   */

#define MODEL_DEFAULT_DIR HVD_SOURCE_DIR "/../shared/data"
#define LAT_WARMUP 20
#define LAT_ITERS 200

void model_free(struct model *m) {
    int j;

    for (j = 0; j < m->n; j++) {
        free(m->t[j].name);
        free(m->t[j].buf);
    }
    free(m->t);
    free(m->path);
    memset(m, 0, sizeof(*m));
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);

    if (p == NULL) {
        fprintf(stderr, "hvd-bench: rank %d: cannot allocate %zu bytes\n",
                g_rank, bytes);
        exit(1);
    }
    return p;
}

/* The product of a shape such as "64x3x7x7"; 0 if it is not one. */
static size_t shape_elements(const char *shape) {
    size_t product = 1;
    const char *s = shape;

    for (;;) {
        unsigned long long d;
        char *end;

        if (*s < '0' || *s > '9')
            return 0;
        errno = 0;
        d = strtoull(s, &end, 10);
        if (errno != 0 || d == 0 || product > SIZE_MAX / d)
            return 0;
        product *= (size_t)d;
        if (*end == '\0')
            return product;
        if (*end != 'x')
            return 0;
        s = end + 1;
    }
}

/* One "name<TAB>shape<TAB>elements" line (newline stripped) into t.
 * Returns 0, or -1 after printing why. */
static int parse_tensor(const char *path, long lineno, char *line,
                        struct tensor *t) {
    char *name = line, *shape, *elems, *end;
    unsigned long long count;

    shape = strchr(name, '\t');
    elems = shape != NULL ? strchr(shape + 1, '\t') : NULL;
    if (shape == NULL || elems == NULL || strchr(elems + 1, '\t') != NULL ||
        shape == name) {
        fprintf(stderr,
                "hvd-bench: %s:%ld: expected name<TAB>shape<TAB>elements, "
                "got \"%s\"\n",
                path, lineno, line);
        return -1;
    }
    *shape++ = '\0';
    *elems++ = '\0';
    errno = 0;
    count = strtoull(elems, &end, 10);
    if (*elems < '0' || *elems > '9' || *end != '\0' || errno != 0 ||
        count == 0 || count > SIZE_MAX / sizeof(float)) {
        fprintf(stderr,
                "hvd-bench: %s:%ld: tensor %s: bad element count \"%s\"\n",
                path, lineno, name, elems);
        return -1;
    }
    if (shape_elements(shape) != count) {
        fprintf(stderr,
                "hvd-bench: %s:%ld: tensor %s: shape %s does not have %llu "
                "elements\n",
                path, lineno, name, shape, count);
        return -1;
    }
    t->count = (size_t)count;
    t->name = xmalloc(strlen(name) + sizeof("grad."));
    sprintf(t->name, "grad.%s", name);
    return 0;
}

/* Reads the tensor list (before hvd_init: every rank reads its own copy,
 * and the engine reports a mismatch if they differ). Returns 0, or -1
 * after printing why. */
int model_load(const struct options *o, struct model *m) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int capn = 0, rc = -1;
    FILE *f;

    memset(m, 0, sizeof(*m));
    if (o->model_file != NULL) {
        m->path = xmalloc(strlen(o->model_file) + 1);
        strcpy(m->path, o->model_file);
    } else {
        m->path = xmalloc(sizeof(MODEL_DEFAULT_DIR) + strlen(o->model) +
                          sizeof("/_params.tsv"));
        sprintf(m->path, "%s/%s_params.tsv", MODEL_DEFAULT_DIR, o->model);
    }
    f = fopen(m->path, "r");
    if (f == NULL) {
        fprintf(stderr,
                "hvd-bench: --model %s: cannot open its tensor list %s: %s; "
                "give the file with --model-file PATH\n",
                o->model, m->path, strerror(errno));
        goto out_free;
    }
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (m->n == capn) {
            struct tensor *grown;

            capn = capn > 0 ? 2 * capn : 64;
            grown = realloc(m->t, sizeof(*grown) * (size_t)capn);
            if (grown == NULL) {
                fprintf(stderr, "hvd-bench: out of memory\n");
                goto out_close;
            }
            m->t = grown;
        }
        memset(&m->t[m->n], 0, sizeof(m->t[m->n]));
        if (parse_tensor(m->path, lineno, line, &m->t[m->n]) != 0)
            goto out_close;
        m->total += m->t[m->n].count;
        m->n++;
    }
    if (ferror(f)) {
        fprintf(stderr, "hvd-bench: reading %s: %s\n", m->path,
                strerror(errno));
        goto out_close;
    }
    if (m->n == 0) {
        fprintf(stderr, "hvd-bench: %s lists no tensors\n", m->path);
        goto out_close;
    }
    rc = 0;
out_close:
    fclose(f);
out_free:
    free(line);
    if (rc != 0)
        model_free(m);
    return rc;
}

/*
 * Gradient element i of tensor j on rank r: g_size * (r + 1 + k) with
 * k = (7 j + i) % 13, so that a misplaced tensor or offset shows. The sum
 * over ranks is g_size * (g_size (g_size + 1) / 2 + g_size k), the
 * average model_expected(j, i): small integers, exact in float32 (and an
 * in-place average of equal inputs gives them back).
 */
static void model_fill(float *buf, size_t count, int j) {
    float base = (float)g_size * (float)(g_rank + 1);
    float step = (float)g_size;
    size_t i, k = (7 * (size_t)j) % 13;

    for (i = 0; i < count; i++) {
        buf[i] = base + step * (float)k;
        k = k == 12 ? 0 : k + 1;
    }
}

static long long model_wrong(const float *buf, size_t count, int j) {
    float base = (float)g_size * (float)(g_size + 1) / 2;
    float step = (float)g_size;
    size_t i, k = (7 * (size_t)j) % 13;
    long long wrong = 0;

    for (i = 0; i < count; i++) {
        wrong += buf[i] != base + step * (float)k;
        k = k == 12 ? 0 : k + 1;
    }
    return wrong;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Per-iteration times to the slowest rank's, in place: an operation is
 * done when it is done everywhere. */
static void slowest_per_iter(const char *name, double *v, int n) {
    bench_hvd_check("hvd_allreduce",
                    hvd_allreduce(name, v, v, (size_t)n, HVD_FLOAT64, HVD_MAX));
}

static long long sum_over_ranks(long long mine) {
    int64_t v = mine;

    bench_hvd_check("hvd_allreduce", hvd_allreduce("hvd-bench.wrong", &v, &v, 1,
                                                   HVD_INT64, HVD_SUM));
    return (long long)v;
}

/* One step as a trainer runs it: every gradient submitted as backward
 * produces it (last layer first), then all waited for. Returns the time
 * from the first submit to the last wait's return. */
static double model_step(struct model *m, hvd_handle *h) {
    double t0 = now_s();
    int j;

    for (j = m->n - 1; j >= 0; j--)
        bench_hvd_check("hvd_allreduce_async",
                        hvd_allreduce_async(m->t[j].name, m->t[j].buf,
                                            m->t[j].buf, m->t[j].count,
                                            HVD_FLOAT32, HVD_AVERAGE, &h[j]));
    for (j = m->n - 1; j >= 0; j--)
        bench_hvd_check("hvd_wait", hvd_wait(h[j]));
    return now_s() - t0;
}

struct step_result {
    double median_s;
    double min_s;
    long long wrong;
};

/*
 * The inputs are refilled before each step (not timed), and a barrier
 * starts the step on every rank at about the same time, so that a step's
 * time is the operation's and not the skew of the refill.
 */
static void bench_per_tensor(const struct options *o, struct model *m,
                             struct step_result *res) {
    double *times = xmalloc(sizeof(double) * (size_t)o->iters);
    hvd_handle *h = xmalloc(sizeof(*h) * (size_t)m->n);
    long long wrong = 0;
    int s, j;

    for (j = 0; j < m->n; j++)
        m->t[j].buf = xmalloc(m->t[j].count * sizeof(float));
    for (s = 0; s < o->warmup + o->iters; s++) {
        double dt;

        for (j = 0; j < m->n; j++)
            model_fill(m->t[j].buf, m->t[j].count, j);
        bench_hvd_check("hvd_barrier", hvd_barrier());
        dt = model_step(m, h);
        if (s >= o->warmup)
            times[s - o->warmup] = dt;
    }
    for (j = 0; j < m->n; j++)
        wrong += model_wrong(m->t[j].buf, m->t[j].count, j);
    slowest_per_iter("hvd-bench.model.times", times, o->iters);
    res->wrong = sum_over_ranks(wrong);
    res->median_s = median(times, o->iters);
    res->min_s = times[0]; /* median sorted them */
    free(h);
    free(times);
}

static void bench_pre_fused(const struct options *o, const struct model *m,
                            struct step_result *res) {
    double *times = xmalloc(sizeof(double) * (size_t)o->iters);
    float *buf = xmalloc(m->total * sizeof(float));
    int s;

    for (s = 0; s < o->warmup + o->iters; s++) {
        double t0;

        model_fill(buf, m->total, 0);
        bench_hvd_check("hvd_barrier", hvd_barrier());
        t0 = now_s();
        bench_hvd_check("hvd_allreduce",
                        hvd_allreduce("hvd-bench.model.fused", buf, buf,
                                      m->total, HVD_FLOAT32, HVD_AVERAGE));
        if (s >= o->warmup)
            times[s - o->warmup] = now_s() - t0;
    }
    res->wrong = sum_over_ranks(model_wrong(buf, m->total, 0));
    slowest_per_iter("hvd-bench.model.times", times, o->iters);
    res->median_s = median(times, o->iters);
    res->min_s = times[0]; /* median sorted them */
    free(buf);
    free(times);
}

/* What the engine thread measures for the caller, through the arg of
 * hvd_internal_call. */
struct bare_arg {
    double times[LAT_ITERS];
    long long wrong;
    hvd_status status;
    char error[512]; /* hvd_last_error() of the engine thread */
};

/* Runs on the engine thread, on every rank at the same point. */
static void bare_allreduce(void *argp, hvd_comm *comm) {
    struct bare_arg *a = argp;
    int it;

    for (it = 0; it < LAT_WARMUP + LAT_ITERS; it++) {
        float x = 1.0f;
        double t0 = now_s();
        hvd_status st =
            hvd_coll_allreduce(comm, &x, &x, 1, HVD_FLOAT32, HVD_SUM);
        double dt = now_s() - t0;

        if (st != HVD_OK) {
            a->status = st;
            snprintf(a->error, sizeof(a->error), "%s", hvd_last_error());
            return;
        }
        a->wrong += x != (float)comm->size;
        if (it >= LAT_WARMUP)
            a->times[it - LAT_WARMUP] = dt;
    }
    a->status = HVD_OK;
}

struct latency_result {
    double engine_s;
    double bare_s;
    long long engine_wrong;
    long long bare_wrong;
};

static void bench_latency(struct latency_result *res) {
    static struct bare_arg bare; /* too big for a thread's stack to spare */
    double times[LAT_ITERS];
    long long wrong = 0;
    int it;

    /* The same name every time: after the first, the response cache
     * decides it with no message through rank 0. */
    for (it = 0; it < LAT_WARMUP + LAT_ITERS; it++) {
        float x = 1.0f;
        double t0 = now_s();

        bench_hvd_check("hvd_allreduce",
                        hvd_allreduce("hvd-bench.latency", &x, &x, 1,
                                      HVD_FLOAT32, HVD_SUM));
        if (it >= LAT_WARMUP)
            times[it - LAT_WARMUP] = now_s() - t0;
        wrong += x != (float)g_size;
    }
    slowest_per_iter("hvd-bench.latency.times", times, LAT_ITERS);
    res->engine_wrong = sum_over_ranks(wrong);
    res->engine_s = median(times, LAT_ITERS);

    memset(&bare, 0, sizeof(bare));
    bare.status = HVD_ERR_INTERNAL;
    snprintf(bare.error, sizeof(bare.error), "the function never ran");
    bench_hvd_check("hvd_internal_call",
                    hvd_internal_call("hvd-bench.bare", bare_allreduce, &bare));
    if (bare.status != HVD_OK) {
        fprintf(stderr,
                "hvd-bench: rank %d: hvd_coll_allreduce (engine thread) "
                "failed: %s: %s\n",
                g_rank, hvd_strerror(bare.status), bare.error);
        exit(1);
    }
    slowest_per_iter("hvd-bench.latency.times", bare.times, LAT_ITERS);
    res->bare_wrong = sum_over_ranks(bare.wrong);
    res->bare_s = median(bare.times, LAT_ITERS);
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

/* Returns the exit status: 0, or 1 if a value was wrong. */
int bench_model(const struct options *o, struct model *m) {
    struct step_result per = {0}, fused = {0};
    struct latency_result lat = {0};
    long long wrong;

    /* The largest input, g_size * (g_size + 13), must be exact. */
    if ((long)g_size * (g_size + 13) > dtypes[6].max_exact) {
        if (g_rank == 0)
            fprintf(stderr,
                    "hvd-bench: --model's float32 checks are exact up to "
                    "4089 ranks, not %d\n",
                    g_size);
        return 1;
    }
    if (g_rank == 0) {
        printf("#\n# model %s: %d tensors, %zu elements (%.1f MB) per "
               "step\n",
               o->model, m->n, m->total,
               (double)m->total * sizeof(float) / 1e6);
        printf("#  from %s\n", m->path);
        printf("#  float32 average, in place, backward order; warmup %d "
               "iters %d; time of a step: the slowest rank's\n",
               o->warmup, o->iters);
    }
    bench_per_tensor(o, m, &per);
    bench_pre_fused(o, m, &fused);
    bench_latency(&lat);
    wrong = per.wrong + fused.wrong + lat.engine_wrong + lat.bare_wrong;
    if (g_rank == 0) {
        printf("#\n#%-36s  %11s  %11s  %8s\n", " step", "median (ms)",
               "min (ms)", "#wrong");
        printf(" %-36s  %11.2f  %11.2f  %8lld\n",
               "per-tensor (engine, fused by hvd)", per.median_s * 1e3,
               per.min_s * 1e3, per.wrong);
        printf(" %-36s  %11.2f  %11.2f  %8lld\n", "one pre-fused allreduce",
               fused.median_s * 1e3, fused.min_s * 1e3, fused.wrong);
        printf("%s step: per-tensor %.2f ms, pre-fused %.2f ms, ratio %.3f\n",
               o->model, per.median_s * 1e3, fused.median_s * 1e3,
               ratio(per.median_s, fused.median_s));
        printf("#\n# cached 4-byte allreduce (1 float32, sum, same name): "
               "warmup %d iters %d; time of an iteration: the slowest "
               "rank's\n",
               LAT_WARMUP, LAT_ITERS);
        printf("#%-36s  %11s  %8s\n", " path", "median (us)", "#wrong");
        printf(" %-36s  %11.2f  %8lld\n", "engine (hvd_allreduce)",
               lat.engine_s * 1e6, lat.engine_wrong);
        printf(" %-36s  %11.2f  %8lld\n",
               "bare collective (hvd_coll_allreduce)", lat.bare_s * 1e6,
               lat.bare_wrong);
        printf("cached 4-byte allreduce: engine %.2f us, bare collective "
               "%.2f us, ratio %.2f\n",
               lat.engine_s * 1e6, lat.bare_s * 1e6,
               ratio(lat.engine_s, lat.bare_s));
        printf("# Out of bounds values : %lld %s\n#\n", wrong,
               wrong == 0 ? "OK" : "FAILED");
    }
    return wrong == 0 ? 0 : 1;
}
