/*
 * hvd-tune: measures every path the selector could take for each
 * collective and size on this job's ranks, hosts and network, keeps the
 * fastest, and writes them as a tuning file for HVD_TUNING_FILE.
 *
 *     hvdrun -np 4 hvd-tune --out hvd-tuning.txt
 *     HVD_TUNING_FILE=hvd-tuning.txt hvdrun -np 4 ./train
 *
 * The candidates are what the cost model would consider here: every
 * algorithm over every transport that can run it (shared memory only
 * where ranks share a host, hier only across hosts, native only over
 * MPI), and for pipelined algorithms on large sizes a few chunk sizes.
 * Each is timed on the engine thread (hvd_internal_call) as the slowest
 * rank sees it, after a warm-up; rank 0 picks and every rank agrees. A
 * tuning file describes one shape of job (ranks a host, hosts): tune for
 * the shape you train with.
 */
#include <hvd/hvd.h>

#include "api/hvd_internal.h"
#include "collectives/coll.h"
#include "collectives/select.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct options {
    int run[HVD_COLL_NKINDS];
    size_t maxbytes;
    const char *out;
};

struct tune_arg {
    const struct options *o;
    hvd_status status;
    char error[512];
    int changed; /* entries where a measurement beat the model */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Timed iterations for a size: enough to see, bounded for large ones.
 * Every rank computes the same. */
static int iters_for(size_t bytes) {
    return bytes <= 65536 ? 20 : bytes <= (4u << 20) ? 5 : 2;
}

static hvd_status run_once(hvd_comm *comm, hvd_coll_kind kind, float *send,
                           float *recv, size_t bytes) {
    size_t count = bytes / sizeof(float);
    switch (kind) {
    case HVD_COLL_ALLREDUCE:
        return hvd_coll_allreduce(comm, send, recv, count, HVD_FLOAT32,
                                  HVD_SUM);
    case HVD_COLL_ALLGATHER:
        return hvd_coll_allgather(comm, send, recv, count / (size_t)comm->size,
                                  HVD_FLOAT32);
    default:
        return hvd_coll_broadcast(comm, recv, count, HVD_FLOAT32, 0);
    }
}

/* Seconds one call of the entry's current path takes, slowest rank; -1 and
 * the status on failure. */
static hvd_status time_path(hvd_comm *comm, hvd_coll_kind kind, float *send,
                            float *recv, size_t bytes, double *out) {
    int iters = iters_for(bytes);
    hvd_status st = run_once(comm, kind, send, recv, bytes);
    double t0 = now_s(), mine, slowest;

    for (int i = 0; st == HVD_OK && i < iters; i++)
        st = run_once(comm, kind, send, recv, bytes);
    mine = (now_s() - t0) / iters;
    if (st != HVD_OK)
        return st;
    /* Over the primary, whatever the table says. */
    st = hvd_rd_allreduce(comm, &mine, &slowest, 1, HVD_FLOAT64, HVD_MAX);
    *out = slowest;
    return st;
}

static const hvd_algo algos[] = {
    HVD_ALGO_RING, HVD_ALGO_RD,     HVD_ALGO_RABENSEIFNER, HVD_ALGO_DIRECT,
    HVD_ALGO_HIER, HVD_ALGO_NATIVE, HVD_ALGO_TREE,         HVD_ALGO_PIPELINE};

static int chunked(hvd_algo a) {
    return a == HVD_ALGO_RING || a == HVD_ALGO_DIRECT || a == HVD_ALGO_PIPELINE;
}

/* Times every candidate path of entry b (bytes) of collective k for class
 * cls, keeps the fastest, which every rank takes from rank 0, and prints
 * it on rank 0. */
static hvd_status tune_entry(struct tune_arg *a, hvd_comm *comm, int k,
                             hvd_peer_class cls, int b, float *send,
                             float *recv) {
    hvd_paths *paths = comm->paths;
    size_t bytes = (size_t)1 << b;
    hvd_choice *e = &paths->sel.t[k][cls][b];
    hvd_choice model = *e, best = *e;
    double best_t = -1;
    hvd_status st = HVD_OK;

    for (int tp = 0; tp < HVD_NTPS && st == HVD_OK; tp++) {
        for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
            if (hvd_model_cost(&paths->model, (hvd_coll_kind)k, cls, tp,
                               algos[i], bytes) < 0)
                continue;
            uint32_t chunks[3] = {paths->model.chunk[tp], 0, 0};
            if (chunked(algos[i]) && bytes >= (1u << 20)) {
                chunks[1] = chunks[0] / 4;
                chunks[2] = chunks[0] * 4;
            }
            for (int c = 0; c < 3 && chunks[c] != 0; c++) {
                double t;
                e->tp = (uint8_t)tp;
                e->algo = (uint8_t)algos[i];
                e->chunk = chunks[c];
                st = time_path(comm, (hvd_coll_kind)k, send, recv, bytes, &t);
                if (st != HVD_OK)
                    break;
                if (best_t < 0 || t < best_t) {
                    best_t = t;
                    best = *e;
                }
            }
        }
    }
    if (st != HVD_OK)
        return st;
    /* Every rank takes rank 0's verdict. */
    st = hvd_tree_broadcast(comm, &best, sizeof(best), 0);
    best.tuned = 1;
    *e = best;
    if (best.tp != model.tp || best.algo != model.algo ||
        best.chunk != model.chunk)
        a->changed++;
    if (comm->rank == 0)
        printf("%13zu  %10.1f  %-3s/%-13s %8u   %s/%s %u\n", bytes,
               best_t * 1e6, best.tp == HVD_TP_SHM ? "shm" : "net",
               hvd_algo_name((hvd_algo)best.algo), best.chunk,
               model.tp == HVD_TP_SHM ? "shm" : "net",
               hvd_algo_name((hvd_algo)model.algo), model.chunk);
    return st;
}

/* On rank 0: sizes larger than measured take the largest one's path, and
 * the table goes to --out. */
static void write_tuning(struct tune_arg *a, hvd_comm *comm,
                         hvd_peer_class cls) {
    const struct options *o = a->o;
    hvd_paths *paths = comm->paths;

    for (int k = 0; k < HVD_COLL_NKINDS; k++) {
        int last = 3;
        while (last + 1 < HVD_SEL_BUCKETS &&
               ((size_t)1 << (last + 1)) <= o->maxbytes)
            last++;
        if (!o->run[k])
            continue;
        for (int b = last + 1; b < HVD_SEL_BUCKETS; b++)
            paths->sel.t[k][cls][b] = paths->sel.t[k][cls][last];
    }
    size_t cap = 64 * 1024;
    char *text = malloc(cap);
    FILE *f = text != NULL ? fopen(o->out, "w") : NULL;
    if (f == NULL) {
        snprintf(a->error, sizeof(a->error), "cannot write %s: %s", o->out,
                 strerror(errno));
        a->status = HVD_ERR_INVALID_ARG;
    } else {
        hvd_select_format(&paths->sel, text, cap);
        fprintf(f,
                "# hvd-tune: %d ranks, %d a host, %d hosts; measured "
                "entries: class %s\n%s",
                comm->size, paths->model.local_size, paths->model.cross_size,
                hvd_peer_class_name(cls), text);
        fclose(f);
    }
    free(text);
}

/* Runs on the engine thread of every rank, in step. */
static void tune(void *argp, hvd_comm *comm) {
    struct tune_arg *a = argp;
    const struct options *o = a->o;
    hvd_paths *paths = comm->paths;
    hvd_peer_class cls;
    float *send = NULL, *recv = NULL;
    hvd_status st = HVD_OK;

    a->status = HVD_OK;
    if (paths == NULL) {
        snprintf(a->error, sizeof(a->error),
                 "a job of one rank has nothing to tune");
        a->status = HVD_ERR_INVALID_ARG;
        return;
    }
    cls = paths->single_host ? HVD_CLASS_SAME_HOST : HVD_CLASS_OTHER_HOST;
    send = malloc(o->maxbytes);
    recv = malloc(o->maxbytes);
    if (send == NULL || recv == NULL) {
        free(send);
        free(recv);
        snprintf(a->error, sizeof(a->error), "out of memory for %zu bytes",
                 o->maxbytes);
        a->status = HVD_ERR_NO_MEMORY;
        return;
    }
    for (size_t i = 0; i < o->maxbytes / sizeof(float); i++)
        send[i] = recv[i] = 1.0f;

    for (int k = 0; k < HVD_COLL_NKINDS && st == HVD_OK; k++) {
        if (!o->run[k])
            continue;
        if (comm->rank == 0)
            printf("# %s (%s)\n#%12s  %10s  %-28s %s\n",
                   hvd_coll_kind_name((hvd_coll_kind)k),
                   hvd_peer_class_name(cls), "bytes", "time (us)", "fastest",
                   "model's choice");
        for (int b = 3; b < HVD_SEL_BUCKETS && st == HVD_OK; b++) {
            size_t bytes = (size_t)1 << b;
            if (bytes > o->maxbytes)
                break;
            if (k == HVD_COLL_ALLGATHER &&
                bytes / sizeof(float) < (size_t)comm->size)
                continue;
            st = tune_entry(a, comm, k, cls, b, send, recv);
        }
    }
    if (st != HVD_OK) {
        a->status = st;
        snprintf(a->error, sizeof(a->error), "%s", hvd_last_error());
    } else if (comm->rank == 0) {
        write_tuning(a, comm, cls);
    }
    free(send);
    free(recv);
}

static void usage(FILE *f) {
    fprintf(f, "usage: hvdrun -np N hvd-tune [options]\n"
               "  --op allreduce|allgather|broadcast|all   (all)\n"
               "  --maxbytes N   largest size measured, K/M/G  (64M)\n"
               "  --out FILE     tuning file to write          "
               "(hvd-tuning.txt)\n"
               "Then: HVD_TUNING_FILE=FILE hvdrun -np N ./train\n");
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    unsigned long long v;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (end == s || errno != 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    else if (*end == 'G' || *end == 'g')
        v <<= 30, end++;
    if (*end != '\0' || v < 64)
        return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char **argv) {
    struct options o = {.run = {1, 1, 1},
                        .maxbytes = (size_t)64 << 20,
                        .out = "hvd-tuning.txt"};
    struct tune_arg a;
    hvd_status st;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--op") == 0 && val != NULL) {
            int any = 0;
            for (int k = 0; k < HVD_COLL_NKINDS; k++) {
                o.run[k] =
                    strcmp(val, "all") == 0 ||
                    strcmp(val, hvd_coll_kind_name((hvd_coll_kind)k)) == 0;
                any |= o.run[k];
            }
            if (!any)
                goto bad;
            i++;
        } else if (strcmp(argv[i], "--maxbytes") == 0 && val != NULL) {
            if (parse_size(val, &o.maxbytes) != 0)
                goto bad;
            i++;
        } else if (strcmp(argv[i], "--out") == 0 && val != NULL) {
            o.out = val;
            i++;
        } else {
            goto bad;
        }
    }
    st = hvd_init();
    if (st != HVD_OK) {
        fprintf(stderr, "hvd-tune: hvd_init: %s: %s\n", hvd_strerror(st),
                hvd_last_error());
        return 1;
    }
    memset(&a, 0, sizeof(a));
    a.o = &o;
    a.status = HVD_ERR_INTERNAL;
    snprintf(a.error, sizeof(a.error), "the measurement never ran");
    st = hvd_internal_call("hvd-tune", tune, &a);
    if (st == HVD_OK)
        st = a.status;
    if (st != HVD_OK) {
        fprintf(stderr, "hvd-tune: rank %d: %s: %s\n", hvd_rank(),
                hvd_strerror(st),
                a.status != HVD_OK ? a.error : hvd_last_error());
        hvd_shutdown();
        return 1;
    }
    if (hvd_rank() == 0)
        printf("# wrote %s (%d entries differ from the model's)\n", o.out,
               a.changed);
    hvd_shutdown();
    return 0;
bad:
    usage(stderr);
    return 2;
}
