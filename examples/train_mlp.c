/*
 * train_mlp: a small multilayer perceptron trained data-parallel with hvd.
 *
 *     hvdrun -np 2 build/train_mlp [--steps 300] [--batch 64] [--hidden 64]
 *            [--lr 0.1] [--samples 4096] [--print-every 50] [--save FILE]
 *
 * Plain C, no BLAS, float32 throughout and deterministic: every rank builds
 * the same synthetic data set from a fixed seed, rank 0 initialises the
 * weights and broadcasts them, and each step every rank trains on its own
 * slice of the global batch. The backward pass hands each layer's gradients
 * to hvd_allreduce_async as soon as they are computed and goes on with the
 * earlier layers while they travel; the weights are updated once all of them
 * are back. Run on 1 rank and on 2 with the same global batch, it ends with
 * the same weights up to float rounding, which
 * tests/integration/run_mlp_equivalence.sh checks.
 *
 * Model: D -> H (ReLU) -> H/2 (ReLU) -> C, softmax cross-entropy, plain SGD.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hvd/hvd.h>

#define FEATURES 32
#define CLASSES 4
#define NLAYERS 3
#define DATA_SEED 0x5eed0001u
#define INIT_SEED 0x5eed0002u

struct options {
    long steps, batch, hidden, samples, print_every;
    float lr;
    const char *save; /* NULL: do not save */
};

/* One fully connected layer: out = w * in + b, w stored row-major
 * (out rows of in columns). gw and gb are the gradients; between their
 * hvd_allreduce_async and hvd_wait they belong to hvd. */
struct layer {
    int in, out;
    float *w, *b, *gw, *gb;
    float *act;   /* this layer's output for the current batch */
    float *delta; /* d loss / d (pre-activation output) */
    char wname[16], bname[16];
};

static int rank, size;

/* An example may simply stop on the first failure; hvdrun then takes the
 * other ranks down. */
static void check(hvd_status st, const char *what) {
    if (st == HVD_OK)
        return;
    fprintf(stderr, "train_mlp: rank %d: %s failed: %s: %s\n", rank, what,
            hvd_strerror(st), hvd_last_error());
    exit(1);
}

static void *xcalloc(size_t n, size_t elem) {
    void *p = calloc(n, elem);
    if (p == NULL) {
        fprintf(stderr, "train_mlp: out of memory (%zu x %zu bytes)\n", n,
                elem);
        exit(1);
    }
    return p;
}

/* splitmix64: tiny, and the same numbers on every machine. */
static uint64_t next_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), from the top 24 bits so it is exact in float. */
static float next_uniform(uint64_t *state) {
    return (float)(next_u64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* Inputs uniform in [-1, 1)^D; labels the argmax of a random linear
 * "teacher", so the classes are separable and the task learnable. */
static void make_data(long n, float *x, int *y) {
    uint64_t s = DATA_SEED;
    float teacher[CLASSES * FEATURES];
    for (int k = 0; k < CLASSES * FEATURES; k++)
        teacher[k] = next_uniform(&s);
    for (long i = 0; i < n; i++) {
        float *xi = x + i * FEATURES;
        int best = 0;
        float best_score = -INFINITY;
        for (int d = 0; d < FEATURES; d++)
            xi[d] = next_uniform(&s);
        for (int c = 0; c < CLASSES; c++) {
            float score = 0.0f;
            for (int d = 0; d < FEATURES; d++)
                score += teacher[c * FEATURES + d] * xi[d];
            if (score > best_score) {
                best_score = score;
                best = c;
            }
        }
        y[i] = best;
    }
}

/* Only rank 0's values matter (they are broadcast); the others start from
 * NaN so that a broadcast that did not happen shows up as a NaN loss. */
static void init_layers(struct layer *l, long batch_local) {
    uint64_t s = INIT_SEED;
    for (int k = 0; k < NLAYERS; k++) {
        size_t nw = (size_t)l[k].in * (size_t)l[k].out;
        /* He initialisation: keeps the ReLU activations' scale. */
        float scale = sqrtf(6.0f / (float)l[k].in);
        l[k].w = xcalloc(nw, sizeof(float));
        l[k].b = xcalloc((size_t)l[k].out, sizeof(float));
        l[k].gw = xcalloc(nw, sizeof(float));
        l[k].gb = xcalloc((size_t)l[k].out, sizeof(float));
        l[k].act =
            xcalloc((size_t)batch_local * (size_t)l[k].out, sizeof(float));
        l[k].delta =
            xcalloc((size_t)batch_local * (size_t)l[k].out, sizeof(float));
        for (size_t i = 0; i < nw; i++)
            l[k].w[i] = rank == 0 ? scale * next_uniform(&s) : NAN;
        for (int o = 0; o < l[k].out; o++)
            l[k].b[o] = rank == 0 ? 0.0f : NAN;
        snprintf(l[k].wname, sizeof(l[k].wname), "l%d.w", k + 1);
        snprintf(l[k].bname, sizeof(l[k].bname), "l%d.b", k + 1);
    }
}

static void broadcast_layers(struct layer *l) {
    char name[32];
    for (int k = 0; k < NLAYERS; k++) {
        snprintf(name, sizeof(name), "param.%s", l[k].wname);
        check(hvd_broadcast(name, l[k].w, (size_t)l[k].in * (size_t)l[k].out,
                            HVD_FLOAT32, 0),
              name);
        snprintf(name, sizeof(name), "param.%s", l[k].bname);
        check(hvd_broadcast(name, l[k].b, (size_t)l[k].out, HVD_FLOAT32, 0),
              name);
    }
}

/* Copies samples start, start+1, ... (wrapping at n_total) into xb, yb. */
static void gather(const float *x, const int *y, long n_total, long start,
                   long n, float *xb, int *yb) {
    for (long j = 0; j < n; j++) {
        long i = (start + j) % n_total;
        memcpy(xb + j * FEATURES, x + i * FEATURES, FEATURES * sizeof(float));
        yb[j] = y[i];
    }
}

static void forward(struct layer *l, const float *xb, long n) {
    const float *in = xb;
    for (int k = 0; k < NLAYERS; k++) {
        int relu = k < NLAYERS - 1;
        for (long j = 0; j < n; j++) {
            const float *a = in + j * l[k].in;
            float *z = l[k].act + j * l[k].out;
            for (int o = 0; o < l[k].out; o++) {
                const float *w = l[k].w + (size_t)o * (size_t)l[k].in;
                float s = l[k].b[o];
                for (int i = 0; i < l[k].in; i++)
                    s += w[i] * a[i];
                z[o] = relu && s < 0.0f ? 0.0f : s;
            }
        }
        in = l[k].act;
    }
}

/* Softmax cross-entropy of the last layer's logits. Returns the sum of the
 * per-sample losses and adds the number of right answers to *correct. With
 * delta_scale > 0 it also leaves d(loss)/d(logits) * delta_scale in the last
 * layer's delta. */
static float softmax_xent(struct layer *last, const int *yb, long n,
                          float delta_scale, long *correct) {
    float loss = 0.0f;
    for (long j = 0; j < n; j++) {
        const float *z = last->act + j * CLASSES;
        float *d = last->delta + j * CLASSES;
        float max = z[0], sum = 0.0f, e[CLASSES];
        int best = 0;
        for (int c = 1; c < CLASSES; c++)
            if (z[c] > max) {
                max = z[c];
                best = c;
            }
        for (int c = 0; c < CLASSES; c++) {
            e[c] = expf(z[c] - max);
            sum += e[c];
        }
        loss += logf(sum) - (z[yb[j]] - max);
        *correct += best == yb[j];
        if (delta_scale > 0.0f)
            for (int c = 0; c < CLASSES; c++)
                d[c] = (e[c] / sum - (c == yb[j] ? 1.0f : 0.0f)) * delta_scale;
    }
    return loss;
}

/* Backward pass from the last layer to the first. As soon as a layer's
 * gradients are complete they go to hvd_allreduce_async, and the pass goes
 * on with the earlier layers while they travel: that overlap is the point
 * of the async API. The deltas of the earlier layers need only w, which
 * stays untouched until every handle is waited for. */
static void backward(struct layer *l, const float *xb, long n,
                     hvd_handle *handles) {
    for (int k = NLAYERS - 1; k >= 0; k--) {
        const float *in = k > 0 ? l[k - 1].act : xb;
        int nin = l[k].in, nout = l[k].out;
        char name[32];

        /* Summed over the samples in order, so each element's sum is
         * formed the same way whatever the rank count. */
        memset(l[k].gw, 0, (size_t)nin * (size_t)nout * sizeof(float));
        memset(l[k].gb, 0, (size_t)nout * sizeof(float));
        for (long j = 0; j < n; j++) {
            const float *a = in + j * nin;
            const float *d = l[k].delta + j * nout;
            for (int o = 0; o < nout; o++) {
                float *gw = l[k].gw + (size_t)o * (size_t)nin;
                l[k].gb[o] += d[o];
                for (int i = 0; i < nin; i++)
                    gw[i] += d[o] * a[i];
            }
        }
        snprintf(name, sizeof(name), "grad.%s", l[k].wname);
        check(hvd_allreduce_async(name, l[k].gw, l[k].gw,
                                  (size_t)nin * (size_t)nout, HVD_FLOAT32,
                                  HVD_AVERAGE, &handles[2 * k]),
              name);
        snprintf(name, sizeof(name), "grad.%s", l[k].bname);
        check(hvd_allreduce_async(name, l[k].gb, l[k].gb, (size_t)nout,
                                  HVD_FLOAT32, HVD_AVERAGE,
                                  &handles[2 * k + 1]),
              name);

        if (k == 0)
            break;
        /* Delta of the previous layer: through w, then through its ReLU
         * (its output is positive exactly where the ReLU let it through). */
        for (long j = 0; j < n; j++) {
            const float *d = l[k].delta + j * nout;
            const float *a = in + j * nin;
            float *dp = l[k - 1].delta + j * nin;
            for (int i = 0; i < nin; i++) {
                float s = 0.0f;
                if (a[i] > 0.0f)
                    for (int o = 0; o < nout; o++)
                        s += d[o] * l[k].w[(size_t)o * (size_t)nin + i];
                dp[i] = s;
            }
        }
    }
}

static void sgd(struct layer *l, float lr) {
    for (int k = 0; k < NLAYERS; k++) {
        size_t nw = (size_t)l[k].in * (size_t)l[k].out;
        for (size_t i = 0; i < nw; i++)
            l[k].w[i] -= lr * l[k].gw[i];
        for (int o = 0; o < l[k].out; o++)
            l[k].b[o] -= lr * l[k].gb[o];
    }
}

static void save_layers(const struct layer *l, const char *path) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "train_mlp: fopen(%s) failed: %s\n", path,
                strerror(errno));
        exit(1);
    }
    for (int k = 0; k < NLAYERS; k++) {
        size_t nw = (size_t)l[k].in * (size_t)l[k].out;
        for (size_t i = 0; i < nw; i++)
            fprintf(f, "%.9g\n", l[k].w[i]);
        for (int o = 0; o < l[k].out; o++)
            fprintf(f, "%.9g\n", l[k].b[o]);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "train_mlp: writing %s failed: %s\n", path,
                strerror(errno));
        exit(1);
    }
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(const char *msg, const char *arg) {
    fprintf(stderr,
            "train_mlp: %s%s\nusage: train_mlp [--steps N] [--batch B] "
            "[--hidden H] [--lr LR] [--samples N] [--print-every K] "
            "[--save FILE]\n",
            msg, arg);
    exit(2);
}

static long parse_long(const char *opt, const char *val) {
    char *end;
    long v;
    errno = 0;
    v = strtol(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || v < 1 || v > 100000000)
        usage("expected a positive integer after ", opt);
    return v;
}

static void parse_options(int argc, char **argv, struct options *o) {
    *o = (struct options){.steps = 300,
                          .batch = 64,
                          .hidden = 64,
                          .samples = 4096,
                          .print_every = 50,
                          .lr = 0.1f};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (val == NULL)
            usage("unknown option or missing value: ", opt);
        i++;
        if (strcmp(opt, "--steps") == 0)
            o->steps = parse_long(opt, val);
        else if (strcmp(opt, "--batch") == 0)
            o->batch = parse_long(opt, val);
        else if (strcmp(opt, "--hidden") == 0)
            o->hidden = parse_long(opt, val);
        else if (strcmp(opt, "--samples") == 0)
            o->samples = parse_long(opt, val);
        else if (strcmp(opt, "--print-every") == 0)
            o->print_every = parse_long(opt, val);
        else if (strcmp(opt, "--save") == 0)
            o->save = val;
        else if (strcmp(opt, "--lr") == 0) {
            o->lr = strtof(val, &end);
            if (end == val || *end != '\0' || !(o->lr > 0.0f))
                usage("expected a positive number after ", opt);
        } else
            usage("unknown option: ", opt);
    }
}

int main(int argc, char **argv) {
    struct options opt;
    struct layer l[NLAYERS];
    hvd_handle handles[2 * NLAYERS];
    float *x, *xb;
    int *y, *yb;
    long local;
    double t_last;
    long s_last = 0;

    parse_options(argc, argv, &opt);
    check(hvd_init(), "hvd_init");
    rank = hvd_rank();
    size = hvd_size();
    if (opt.batch % size != 0) {
        /* Every rank sees the same numbers, so all stop here together. */
        if (rank == 0)
            fprintf(stderr,
                    "train_mlp: --batch %ld is not divisible by the %d "
                    "ranks; use a multiple of %d\n",
                    opt.batch, size, size);
        hvd_shutdown();
        return 1;
    }
    local = opt.batch / size;

    x = xcalloc((size_t)opt.samples * FEATURES, sizeof(float));
    y = xcalloc((size_t)opt.samples, sizeof(int));
    xb = xcalloc((size_t)local * FEATURES, sizeof(float));
    yb = xcalloc((size_t)local, sizeof(int));
    make_data(opt.samples, x, y);

    l[0] = (struct layer){.in = FEATURES, .out = (int)opt.hidden};
    l[1] = (struct layer){.in = (int)opt.hidden,
                          .out = opt.hidden > 1 ? (int)opt.hidden / 2 : 1};
    l[2] = (struct layer){.in = l[1].out, .out = CLASSES};
    init_layers(l, local);
    broadcast_layers(l);

    if (rank == 0)
        printf("train_mlp: %d rank(s), %ld samples, %d-%d-%d-%d MLP, global "
               "batch %ld (%ld per rank), lr %g, %ld steps\n",
               size, opt.samples, FEATURES, l[0].out, l[1].out, CLASSES,
               opt.batch, local, (double)opt.lr, opt.steps);

    t_last = now_seconds();
    for (long step = 1; step <= opt.steps; step++) {
        long correct = 0;
        float loss;

        /* The global batch is a fixed window over the data set; rank r
         * takes the r-th contiguous slice of it. */
        gather(x, y, opt.samples, (step - 1) * opt.batch + rank * local, local,
               xb, yb);
        forward(l, xb, local);
        /* Each rank's loss is the mean over its `local` samples, so its
         * gradient is (1/local) * sum. HVD_AVERAGE then divides the sum
         * over ranks by size: (1/size)(1/local) * sum over all ranks =
         * (1/batch) * sum over the global batch, the gradient of the mean
         * loss over the global batch, exactly what one rank would compute
         * on the whole batch. */
        loss = softmax_xent(&l[NLAYERS - 1], yb, local, 1.0f / (float)local,
                            &correct) /
               (float)local;
        backward(l, xb, local, handles);
        for (int h = 0; h < 2 * NLAYERS; h++)
            check(hvd_wait(handles[h]), "hvd_wait(gradient)");
        sgd(l, opt.lr);

        if (step == 1 || step % opt.print_every == 0 || step == opt.steps) {
            /* Equal shards: the average of the ranks' means is the mean
             * over the global batch. */
            float m[2] = {loss, (float)correct / (float)local};
            double t = now_seconds();
            double rate = (double)((step - s_last) * opt.batch) / (t - t_last);
            check(hvd_allreduce("metrics", m, m, 2, HVD_FLOAT32, HVD_AVERAGE),
                  "hvd_allreduce(metrics)");
            if (rank == 0)
                printf("step %ld loss %.6f accuracy %.1f%% samples/s %.0f "
                       "(per rank %.0f)\n",
                       step, (double)m[0], 100.0 * (double)m[1], rate,
                       rate / size);
            fflush(stdout);
            s_last = step;
            t_last = now_seconds();
        }
    }

    /* Final loss over the whole data set, each rank taking one contiguous
     * range of it. The ranges need not be equal, so the ranks' sums and
     * counts are added, not their means averaged. */
    {
        long lo = opt.samples * rank / size,
             hi = opt.samples * (rank + 1) / size;
        long correct = 0;
        float m[3] = {0.0f, 0.0f, (float)(hi - lo)};
        for (long i = lo; i < hi; i += local) {
            long n = hi - i < local ? hi - i : local;
            gather(x, y, opt.samples, i, n, xb, yb);
            forward(l, xb, n);
            m[0] += softmax_xent(&l[NLAYERS - 1], yb, n, 0.0f, &correct);
        }
        m[1] = (float)correct;
        check(hvd_allreduce("final", m, m, 3, HVD_FLOAT32, HVD_SUM),
              "hvd_allreduce(final)");
        if (rank == 0)
            printf("final loss %.6f accuracy %.1f%%\n", (double)(m[0] / m[2]),
                   100.0 * (double)(m[1] / m[2]));
    }

    if (rank == 0 && opt.save != NULL)
        save_layers(l, opt.save);
    check(hvd_shutdown(), "hvd_shutdown");
    for (int k = 0; k < NLAYERS; k++) {
        free(l[k].w);
        free(l[k].b);
        free(l[k].gw);
        free(l[k].gb);
        free(l[k].act);
        free(l[k].delta);
    }
    free(x);
    free(y);
    free(xb);
    free(yb);
    return 0;
}
