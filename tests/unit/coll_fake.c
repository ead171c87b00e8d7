/*
 * The in-memory transport of the collectives' unit tests (coll_fake.h):
 * queues per (source, destination) under one mutex, a send done once the
 * bytes ahead of it fit in BUFFERED or once received, receives matched in
 * the order they were posted, one-sided reads as plain copies.
 */
#include "coll_fake.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reduce.h"
#include "transport/base/dtype.h"

#define BUFFERED 512
#define MAXPOSTED 64

typedef struct msg {
    struct msg *next;
    size_t len;
    hvd_req *sreq;
    int sender_done; /* the sender has completed sreq */
    uint8_t data[];
} msg;

typedef struct world {
    pthread_mutex_t mu;
    pthread_cond_t cv[COLL_FAKE_MAXP]; /* rank r waits on cv[r] */
    int size;
    msg *head[COLL_FAKE_MAXP][COLL_FAKE_MAXP]; /* [src][dst] */
    msg *tail[COLL_FAKE_MAXP][COLL_FAKE_MAXP];
    msg *taken[COLL_FAKE_MAXP][COLL_FAKE_MAXP]; /* received, sender not told */
} world;

typedef struct posted {
    void *buf;
    size_t len;
    hvd_req *req;
} posted;

typedef struct fake {
    hvd_transport base;
    world *w;
    int rank;
    posted recvs[COLL_FAKE_MAXP][MAXPOSTED]; /* per source, FIFO */
    int nrecv[COLL_FAKE_MAXP];
} fake;

struct coll_fake_job {
    world w;
    hvd_comm_config cfg;
    coll_fake_body body;
    void *arg;
    pthread_mutex_t err_mu;
    int errors;
};

/* Completes this rank's sends the "kernel" has taken; the caller holds the
 * lock. Only the sender's thread writes its requests. */
static int complete_sends(fake *f) {
    int n = 0;

    for (int dst = 0; dst < f->w->size; dst++) {
        size_t ahead = 0;
        for (msg *m = f->w->head[f->rank][dst]; m != NULL; m = m->next) {
            ahead += m->len;
            if (ahead > BUFFERED)
                break;
            if (!m->sender_done) {
                m->sender_done = 1;
                m->sreq->done = 1;
                n++;
            }
        }
        msg **pp = &f->w->taken[f->rank][dst];
        while (*pp != NULL) {
            msg *m = *pp;
            *pp = m->next;
            if (!m->sender_done) {
                m->sreq->done = 1;
                n++;
            }
            free(m);
        }
    }
    return n;
}

/* Matches queued messages with posted receives; the caller holds the
 * lock. A length that differs from the receive's fails the receive. */
static int match(fake *f) {
    int matched = 0;

    for (int src = 0; src < f->w->size; src++) {
        while (f->nrecv[src] > 0 && f->w->head[src][f->rank] != NULL) {
            msg *m = f->w->head[src][f->rank];
            posted p = f->recvs[src][0];
            f->w->head[src][f->rank] = m->next;
            if (m->next == NULL)
                f->w->tail[src][f->rank] = NULL;
            memmove(f->recvs[src], f->recvs[src] + 1,
                    (size_t)(--f->nrecv[src]) * sizeof(posted));
            if (m->len != p.len) {
                p.req->status = HVD_ERR_MISMATCH;
            } else {
                if (m->len)
                    memcpy(p.buf, m->data, m->len);
                p.req->status = HVD_OK;
            }
            p.req->done = 1;
            if (m->sender_done) {
                free(m);
            } else {
                m->next = f->w->taken[src][f->rank];
                f->w->taken[src][f->rank] = m;
            }
            pthread_cond_signal(&f->w->cv[src]); /* its send may be done */
            matched++;
        }
    }
    return matched;
}

static hvd_status fake_isend(hvd_transport *t, int peer, int channel,
                             const void *buf, size_t len, hvd_req *req) {
    fake *f = (fake *)t;
    msg *m = malloc(sizeof(*m) + len + 1);

    (void)channel;
    if (m == NULL)
        return HVD_ERR_NO_MEMORY;
    m->next = NULL;
    m->len = len;
    m->sreq = req;
    m->sender_done = 0;
    req->status = HVD_OK;
    req->done = 0;
    if (len)
        memcpy(m->data, buf, len);
    pthread_mutex_lock(&f->w->mu);
    if (f->w->tail[f->rank][peer])
        f->w->tail[f->rank][peer]->next = m;
    else
        f->w->head[f->rank][peer] = m;
    f->w->tail[f->rank][peer] = m;
    complete_sends(f);
    pthread_cond_signal(&f->w->cv[peer]);
    pthread_mutex_unlock(&f->w->mu);
    return HVD_OK;
}

static hvd_status fake_irecv(hvd_transport *t, int peer, int channel, void *buf,
                             size_t len, hvd_req *req) {
    fake *f = (fake *)t;

    (void)channel;
    if (f->nrecv[peer] == MAXPOSTED)
        return HVD_ERR_INTERNAL;
    req->done = 0;
    pthread_mutex_lock(&f->w->mu);
    f->recvs[peer][f->nrecv[peer]++] = (posted){buf, len, req};
    match(f);
    pthread_mutex_unlock(&f->w->mu);
    return HVD_OK;
}

/* Waits for a change (bounded, 20 ms) only when nothing moved. */
static hvd_status fake_progress(hvd_transport *t, int timeout_ms) {
    fake *f = (fake *)t;

    pthread_mutex_lock(&f->w->mu);
    if (match(f) + complete_sends(f) == 0 && timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&f->w->cv[f->rank], &f->w->mu, &ts);
        match(f);
        complete_sends(f);
    }
    pthread_mutex_unlock(&f->w->mu);
    return HVD_OK;
}

/* One-sided reads, for the direct algorithms: the ranks are threads of one
 * process, so a peer's address is readable as it is; the direct
 * algorithms' rounds of messages order the reads against the owner's
 * writes and frees, as they must over the shm transport. An aligned
 * 8-byte read is an atomic load (acquire): that is how the pipelined
 * allreduce reads a peer's progress counter, which its owner stores
 * atomically while the peer reads it, and what orders the reads of the
 * chunks it counts after the owner's writes (here, between threads, the
 * C memory model is the one that must hold). */
static hvd_status fake_get(hvd_transport *t, int peer, void *buf,
                           uint64_t remote, size_t len) {
    (void)t, (void)peer;
    if (len == sizeof(uint64_t) && remote % sizeof(uint64_t) == 0) {
        uint64_t v = __atomic_load_n((const uint64_t *)(uintptr_t)remote,
                                     __ATOMIC_ACQUIRE);
        memcpy(buf, &v, sizeof(v));
    } else if (len) {
        memcpy(buf, (const void *)(uintptr_t)remote, len);
    }
    return HVD_OK;
}

static int fake_can_get(hvd_transport *t, int peer) {
    (void)t, (void)peer;
    return 1;
}

static const hvd_transport_ops fake_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "coll_fake",
    .isend = fake_isend,
    .irecv = fake_irecv,
    .progress = fake_progress,
    .get = fake_get,
    .can_get = fake_can_get,
};

void coll_fake_fail(coll_fake_job *job, int rank, const char *fmt, ...) {
    va_list ap;

    pthread_mutex_lock(&job->err_mu);
    if (job->errors++ < 10) {
        fprintf(stderr,
                "FAIL size %d chunk %zu depth %d rank %d: ", job->w.size,
                job->cfg.chunk_bytes, job->cfg.depth, rank);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
    pthread_mutex_unlock(&job->err_mu);
}

typedef struct rank_arg {
    coll_fake_job *job;
    int rank;
} rank_arg;

static void *rank_main(void *argp) {
    rank_arg *a = argp;
    coll_fake_job *job = a->job;
    int r = a->rank, p = job->w.size;
    fake *f = calloc(1, sizeof(*f));
    hvd_comm *comm = NULL;

    if (f == NULL) {
        coll_fake_fail(job, r, "out of memory");
        return NULL;
    }
    f->base.ops = &fake_ops;
    f->w = &job->w;
    f->rank = r;
    if (hvd_comm_create(r, p, p > 1 ? &f->base : NULL, HVD_CHANNEL_DATA,
                        &job->cfg, &comm) != HVD_OK) {
        coll_fake_fail(job, r, "hvd_comm_create failed");
        free(f);
        return NULL;
    }
    job->body(job, comm, job->arg);
    hvd_comm_destroy(comm);
    /* Every message sent to this rank was received, every receive met. */
    pthread_mutex_lock(&job->w.mu);
    for (int src = 0; src < p; src++)
        if (job->w.head[src][r] != NULL || f->nrecv[src] != 0)
            coll_fake_fail(job, r, "leftover messages from rank %d", src);
    pthread_mutex_unlock(&job->w.mu);
    free(f);
    return NULL;
}

int coll_fake_run(int size, const hvd_comm_config *cfg, coll_fake_body body,
                  void *arg) {
    coll_fake_job job;
    pthread_t th[COLL_FAKE_MAXP];
    rank_arg args[COLL_FAKE_MAXP];

    if (size < 1 || size > COLL_FAKE_MAXP)
        return 1;
    memset(&job, 0, sizeof(job));
    pthread_mutex_init(&job.w.mu, NULL);
    for (int r = 0; r < COLL_FAKE_MAXP; r++)
        pthread_cond_init(&job.w.cv[r], NULL);
    pthread_mutex_init(&job.err_mu, NULL);
    job.w.size = size;
    job.cfg = *cfg;
    job.body = body;
    job.arg = arg;
    for (int r = 0; r < size; r++) {
        args[r] = (rank_arg){&job, r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    for (int a = 0; a < size; a++) {
        for (int b = 0; b < size; b++) {
            while (job.w.taken[a][b] != NULL) {
                msg *m = job.w.taken[a][b];
                job.w.taken[a][b] = m->next;
                free(m);
            }
        }
    }
    pthread_mutex_destroy(&job.w.mu);
    for (int r = 0; r < COLL_FAKE_MAXP; r++)
        pthread_cond_destroy(&job.w.cv[r]);
    pthread_mutex_destroy(&job.err_mu);
    return job.errors;
}

double coll_fake_load(const void *buf, size_t i, hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
        return ((const uint8_t *)buf)[i];
    case HVD_INT8:
        return ((const int8_t *)buf)[i];
    case HVD_INT32:
        return ((const int32_t *)buf)[i];
    case HVD_INT64:
        return (double)((const int64_t *)buf)[i];
    case HVD_FLOAT16:
        return hvd_half_to_float(((const uint16_t *)buf)[i]);
    case HVD_BFLOAT16:
        return hvd_bfloat16_to_float(((const uint16_t *)buf)[i]);
    case HVD_FLOAT32:
        return ((const float *)buf)[i];
    case HVD_FLOAT64:
        return ((const double *)buf)[i];
    }
    return -1;
}

void coll_fake_store(void *buf, size_t i, hvd_dtype dtype, double v) {
    switch (dtype) {
    case HVD_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case HVD_INT8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case HVD_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case HVD_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case HVD_FLOAT16:
        ((uint16_t *)buf)[i] = hvd_float_to_half((float)v);
        break;
    case HVD_BFLOAT16:
        ((uint16_t *)buf)[i] = hvd_float_to_bfloat16((float)v);
        break;
    case HVD_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case HVD_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    }
}

double coll_fake_value(int r, size_t i, hvd_op op, int p) {
    size_t owner = i % (size_t)p, next = (i + 1) % (size_t)p;

    switch (op) {
    case HVD_SUM:
    case HVD_ADASUM: /* not tested here */
        return (double)((i * 7 + (size_t)r * 3) % 5);
    case HVD_AVERAGE:
        return (size_t)r == owner ? (double)(p * (int)(i % 3)) : 0.0;
    case HVD_MIN:
    case HVD_MAX:
        return (double)((i * 13 + (size_t)r * 7) % 100);
    case HVD_PRODUCT:
        if ((size_t)r == owner)
            return (double)(1 + i % 3);
        return (size_t)r == next ? 2.0 : 1.0;
    }
    return 0;
}

double coll_fake_expected(size_t i, hvd_op op, int p) {
    double acc = coll_fake_value(0, i, op, p);

    for (int r = 1; r < p; r++) {
        double v = coll_fake_value(r, i, op, p);
        switch (op) {
        case HVD_SUM:
        case HVD_ADASUM:
        case HVD_AVERAGE:
        case HVD_PRODUCT:
            acc = op == HVD_PRODUCT ? acc * v : acc + v;
            break;
        case HVD_MIN:
            acc = v < acc ? v : acc;
            break;
        case HVD_MAX:
            acc = v > acc ? v : acc;
            break;
        }
    }
    return op == HVD_AVERAGE ? acc / p : acc;
}
