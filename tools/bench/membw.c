/*
 * --memcpy: the memory bandwidth the collectives are measured against.
 *
 * Each thread copies its own buffer of --maxbytes bytes into another with
 * memcpy, --iters times after --warmup untimed copies (the first touches
 * the pages). One thread alone, then two at once (one per core on a
 * two-core machine; each process of an np 2 job is one of them), started
 * together by a barrier before every copy. The figure is bytes copied per
 * second, all threads together, over the slowest thread's time; a copy
 * reads each byte once and writes it once, so the memory moves twice that.
 * Median and best of the iterations; no backend, no job: run it alone.
 */
#include "tools/bench/bench.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 2

struct copier {
    unsigned char *src;
    unsigned char *dst;
    size_t bytes;
    int iters; /* warmup included */
    pthread_barrier_t *start;
    double *secs; /* iters entries */
};

static void *copy_loop(void *arg) {
    struct copier *c = arg;

    for (int i = 0; i < c->iters; i++) {
        pthread_barrier_wait(c->start);
        double t = now_s();
        memcpy(c->dst, c->src, c->bytes);
        c->secs[i] = now_s() - t;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs n copiers at once; GB/s of every iteration after the warmup into
 * gbps (sorted). Returns 0, or -1 after printing why. */
static int run_copiers(struct copier *c, int n, int warmup, double *gbps) {
    pthread_t th[MAX_THREADS];
    pthread_barrier_t start;
    int made = 0, rc = 0;

    if (pthread_barrier_init(&start, NULL, (unsigned)n) != 0) {
        fprintf(stderr, "hvd-bench: cannot create a barrier\n");
        return -1;
    }
    for (int k = 0; k < n; k++)
        c[k].start = &start;
    for (; made < n - 1; made++)
        if (pthread_create(&th[made], NULL, copy_loop, &c[made + 1]) != 0)
            break;
    if (made < n - 1) {
        fprintf(stderr, "hvd-bench: cannot start a thread\n");
        rc = -1;
    } else {
        copy_loop(&c[0]);
    }
    for (int k = 0; k < made; k++)
        pthread_join(th[k], NULL);
    pthread_barrier_destroy(&start);
    for (int i = warmup; rc == 0 && i < c[0].iters; i++) {
        double slowest = 0;
        for (int k = 0; k < n; k++)
            if (c[k].secs[i] > slowest)
                slowest = c[k].secs[i];
        gbps[i - warmup] = (double)c[0].bytes * n / slowest / 1e9;
    }
    if (rc == 0)
        qsort(gbps, (size_t)(c[0].iters - warmup), sizeof(*gbps), cmp_double);
    return rc;
}

int bench_memcpy(const struct options *o) {
    struct copier c[MAX_THREADS];
    int total = o->warmup + o->iters, rc = 0;
    double *gbps = malloc(sizeof(double) * (size_t)o->iters);

    memset(c, 0, sizeof(c));
    for (int k = 0; k < MAX_THREADS && gbps != NULL; k++) {
        c[k].bytes = o->maxbytes;
        c[k].iters = total;
        c[k].src = malloc(o->maxbytes);
        c[k].dst = malloc(o->maxbytes);
        c[k].secs = malloc(sizeof(double) * (size_t)total);
        if (c[k].src == NULL || c[k].dst == NULL || c[k].secs == NULL)
            rc = -1;
        else
            memset(c[k].src, k + 1, o->maxbytes);
    }
    if (gbps == NULL || rc != 0) {
        fprintf(stderr, "hvd-bench: cannot allocate %d x 2 x %zu bytes\n",
                MAX_THREADS, o->maxbytes);
        rc = -1;
    }
    if (rc == 0)
        printf("# hvd-bench %s: memcpy of %zu bytes per thread, %d "
               "iterations, GB/s copied by all threads together\n",
               HVD_VERSION_STRING, o->maxbytes, o->iters);
    for (int n = 1; rc == 0 && n <= MAX_THREADS; n++) {
        rc = run_copiers(c, n, o->warmup, gbps);
        if (rc == 0)
            printf("memcpy threads %d: median %.2f GB/s, best %.2f GB/s\n", n,
                   gbps[o->iters / 2], gbps[o->iters - 1]);
    }
    for (int k = 0; k < MAX_THREADS; k++) {
        free(c[k].src);
        free(c[k].dst);
        free(c[k].secs);
    }
    free(gbps);
    return rc == 0 ? 0 : 1;
}
