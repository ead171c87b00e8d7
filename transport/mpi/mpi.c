#include "transport/mpi/mpi.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/bootstrap/failure.h"

/* MPI counts are int: hvd messages are cut into parts of at most this. */
#define PART_MAX ((size_t)1 << 30)
/* Tags: the channel of a message, or a heartbeat. */
#define TAG_HEARTBEAT 7
#define TAG_ABORT 8
#define HEARTBEAT_NS (1000 * 1000000LL)
#define CHECK_NS (100 * 1000000LL)
/* Idle polling: spin this long, then sleep in steps growing to 1 ms. */
#define SPIN_NS (50 * 1000LL)
#define SLEEP_MAX_NS (1000 * 1000LL)

static int we_initialized;

/* One wrapper turns MPI's errors into ours, with MPI's text. */
static hvd_status mpi_fail(hvd_status status, int err, const char *call) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;

    MPI_Error_string(err, text, &len);
    return hvd_error_set(status, "%s failed: %s", call, text);
}

int hvd_mpi_initialized(void) {
    int flag = 0;

    MPI_Initialized(&flag);
    if (flag) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        flag = !finalized;
    }
    return flag;
}

hvd_status hvd_mpi_env_init(int *rank_out, int *size_out) {
    int provided = 0, err;

    if (!hvd_mpi_initialized()) {
        err = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (err != MPI_SUCCESS)
            return mpi_fail(HVD_ERR_TRANSPORT, err, "MPI_Init_thread");
        we_initialized = 1;
        HVD_DEBUG("mpi", "initialized MPI (thread level %d)", provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank_out);
    MPI_Comm_size(MPI_COMM_WORLD, size_out);
    return HVD_OK;
}

hvd_status hvd_mpi_check_threads(void) {
    int level = MPI_THREAD_SINGLE;

    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "the application initialized MPI with thread "
                             "level %d, and hvd's engine thread needs "
                             "MPI_THREAD_SERIALIZED to use MPI: call "
                             "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, "
                             "...) (or MULTIPLE), or use HVD_TRANSPORT=tcp",
                             level);
    return HVD_OK;
}

void hvd_mpi_env_finalize(void) {
    if (we_initialized && hvd_mpi_initialized())
        MPI_Finalize();
    we_initialized = 0;
}

/* ------------------------------------------------------------------ */
/* Bootstrap and agreement                                             */

typedef struct mpi_bootstrap {
    hvd_bootstrap bs;
    MPI_Comm comm;
} mpi_bootstrap;

static hvd_status bs_allgather(hvd_bootstrap *bs, const void *mine, size_t len,
                               void *all_out) {
    mpi_bootstrap *m = bs->ctx;
    int err;

    if (len > INT_MAX)
        return hvd_error_set(HVD_ERR_INTERNAL, "bootstrap blob of %zu bytes",
                             len);
    err = MPI_Allgather(mine, (int)len, MPI_BYTE, all_out, (int)len, MPI_BYTE,
                        m->comm);
    return err == MPI_SUCCESS
               ? HVD_OK
               : mpi_fail(HVD_ERR_TRANSPORT, err, "MPI_Allgather");
}

hvd_status hvd_mpi_bootstrap_open(hvd_bootstrap **out) {
    mpi_bootstrap *m = calloc(1, sizeof(*m));
    int err;

    if (m == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    err = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (err != MPI_SUCCESS) {
        free(m);
        return mpi_fail(HVD_ERR_TRANSPORT, err, "MPI_Comm_dup");
    }
    MPI_Comm_rank(m->comm, &m->bs.rank);
    MPI_Comm_size(m->comm, &m->bs.size);
    m->bs.allgather = bs_allgather;
    m->bs.ctx = m;
    *out = &m->bs;
    return HVD_OK;
}

void hvd_mpi_bootstrap_close(hvd_bootstrap *bs) {
    mpi_bootstrap *m;

    if (bs == NULL)
        return;
    m = bs->ctx;
    MPI_Comm_free(&m->comm);
    free(m);
}

hvd_status hvd_mpi_agree(int ok, int *all_ok_out) {
    int all = 0;
    int err = MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

    if (err != MPI_SUCCESS)
        return mpi_fail(HVD_ERR_TRANSPORT, err, "MPI_Allreduce");
    *all_ok_out = all;
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* The transport                                                       */

/* One MPI message of a request in flight. */
typedef struct entry {
    hvd_req *req;
    size_t len; /* bytes of this MPI message */
    int send;
    int64_t posted;
} entry;

/* What a failing rank tells its peers: its status and its sentence. */
typedef struct abort_msg {
    int32_t status;
    char text[HVD_ERROR_MAX];
} abort_msg;

typedef struct mpi_tp {
    hvd_transport base;
    MPI_Comm comm;
    int rank;
    int size;
    int64_t timeout_ns;
    /* Parallel arrays of what is in flight (MPI_Testsome wants the
     * requests contiguous). */
    MPI_Request *mreqs;
    entry *entries;
    int *idx; /* for MPI_Testsome */
    MPI_Status *sts;
    int n;
    int cap;
    /* Heartbeats: one receive from any source, always posted. */
    MPI_Request hb_recv;
    char hb_in;
    char hb_out;
    MPI_Request *hb_sends; /* one per peer */
    /* Failures: a rank that fails tells every peer why (one message
     * each, tag TAG_ABORT), and one receive from any source is always
     * posted for theirs. */
    MPI_Request abort_recv;
    abort_msg abort_in;
    abort_msg abort_out;
    MPI_Request *abort_sends; /* one per peer */
    int64_t *last_rx;         /* per peer */
    int64_t last_hb;
    int64_t last_check;
    int wake;               /* set by any thread (atomic) */
    hvd_tp_failure failure; /* the first failure, which wins */
} mpi_tp;

/*
 * The transport's fail function (transport/bootstrap/failure.h): the first
 * failure wins; every request in flight completes with it; when this rank found
 * it (origin is this rank), every peer is told, so that none waits for a
 * rank that has stopped.
 */
static hvd_status fail_with(void *arg, hvd_status status, int culprit,
                            int origin, const char *text) {
    mpi_tp *t = arg;

    (void)culprit;
    if (!hvd_tp_failure_set(&t->failure, "mpi", status, t->rank, origin, text))
        return hvd_tp_failure_error(&t->failure);
    for (int i = 0; i < t->n; i++) {
        t->entries[i].req->status = status;
        t->entries[i].req->done = 1;
    }
    if (origin == t->rank && t->abort_sends != NULL) {
        t->abort_out.status = (int32_t)status;
        snprintf(t->abort_out.text, sizeof(t->abort_out.text), "%s", text);
        for (int p = 0; p < t->size; p++)
            if (p != t->rank)
                MPI_Isend(&t->abort_out, (int)sizeof(t->abort_out), MPI_BYTE, p,
                          TAG_ABORT, t->comm, &t->abort_sends[p]);
    }
    return hvd_tp_failure_error(&t->failure);
}

static hvd_status fail(mpi_tp *t, hvd_status status, const char *text) {
    return fail_with(t, status, -1, t->rank, text);
}

static hvd_status fail_mpi(mpi_tp *t, int err, const char *call) {
    mpi_fail(HVD_ERR_TRANSPORT, err, call);
    char text[HVD_ERROR_MAX];
    snprintf(text, sizeof(text), "%s", hvd_error_get());
    return fail(t, HVD_ERR_TRANSPORT, text);
}

static int room(mpi_tp *t, int more) {
    if (t->n + more <= t->cap)
        return 0;
    int cap = t->cap ? t->cap * 2 : 64;
    while (cap < t->n + more)
        cap *= 2;
    MPI_Request *m = realloc(t->mreqs, (size_t)cap * sizeof(*m));
    if (m == NULL)
        return -1;
    t->mreqs = m;
    entry *e = realloc(t->entries, (size_t)cap * sizeof(*e));
    if (e == NULL)
        return -1;
    t->entries = e;
    int *idx = realloc(t->idx, (size_t)cap * sizeof(*idx));
    if (idx == NULL)
        return -1;
    t->idx = idx;
    MPI_Status *sts = realloc(t->sts, (size_t)cap * sizeof(*sts));
    if (sts == NULL)
        return -1;
    t->sts = sts;
    t->cap = cap;
    return 0;
}

static hvd_status post(hvd_transport *tp, int peer, int channel, void *buf,
                       size_t len, hvd_req *req, int send) {
    mpi_tp *t = (mpi_tp *)tp;
    int nparts = len == 0 ? 1 : (int)((len + PART_MAX - 1) / PART_MAX);
    int64_t now = hvd_now_ns();

    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    if (peer < 0 || peer >= t->size || peer == t->rank)
        return hvd_error_set(HVD_ERR_INTERNAL, "mpi message to rank %d", peer);
    if (room(t, nparts) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    req->done = 0;
    req->status = HVD_OK;
    req->peer = peer;
    req->len = len;
    req->parts_left = nparts;
    for (int i = 0; i < nparts; i++) {
        size_t off = (size_t)i * PART_MAX;
        size_t n = len - off < PART_MAX ? len - off : PART_MAX;
        int err = send ? MPI_Isend((char *)buf + off, (int)n, MPI_BYTE, peer,
                                   channel, t->comm, &t->mreqs[t->n])
                       : MPI_Irecv((char *)buf + off, (int)n, MPI_BYTE, peer,
                                   channel, t->comm, &t->mreqs[t->n]);
        if (err != MPI_SUCCESS)
            return fail_mpi(t, err, send ? "MPI_Isend" : "MPI_Irecv");
        t->entries[t->n] =
            (entry){.req = req, .len = n, .send = send, .posted = now};
        t->n++;
    }
    return HVD_OK;
}

static hvd_status mpi_isend(hvd_transport *tp, int peer, int channel,
                            const void *buf, size_t len, hvd_req *req) {
    return post(tp, peer, channel, (void *)(uintptr_t)buf, len, req, 1);
}

static hvd_status mpi_irecv(hvd_transport *tp, int peer, int channel, void *buf,
                            size_t len, hvd_req *req) {
    return post(tp, peer, channel, buf, len, req, 0);
}

/* Completes what MPI has finished; returns how many requests moved. */
static int reap(mpi_tp *t, hvd_status *st) {
    int outcount = 0, moved = 0;

    *st = HVD_OK;
    if (t->n == 0)
        return 0;
    int err = MPI_Testsome(t->n, t->mreqs, &outcount, t->idx, t->sts);
    if (err != MPI_SUCCESS) {
        *st = fail_mpi(t, err, "MPI_Testsome");
        return 0;
    }
    if (outcount == MPI_UNDEFINED)
        outcount = 0;
    /* Check everything first, then compact from the highest index down
     * so that the indices stay valid. */
    for (int k = 0; k < outcount; k++) {
        entry *e = &t->entries[t->idx[k]];
        int got = 0;
        if (e->send)
            continue;
        MPI_Get_count(&t->sts[k], MPI_BYTE, &got);
        t->last_rx[e->req->peer] = hvd_now_ns();
        if ((size_t)got != e->len) {
            char text[256];
            snprintf(text, sizeof(text),
                     "rank %d sent a message of %d bytes where this rank "
                     "expected %zu: ranks called collectives in different "
                     "orders or with different counts",
                     e->req->peer, got, e->len);
            *st = fail(t, HVD_ERR_MISMATCH, text);
            return 0;
        }
    }
    /* Testsome returns indices in increasing order. */
    for (int k = outcount - 1; k >= 0; k--) {
        int i = t->idx[k];
        hvd_req *req = t->entries[i].req;
        if (--req->parts_left == 0)
            req->done = 1;
        t->n--;
        t->mreqs[i] = t->mreqs[t->n];
        t->entries[i] = t->entries[t->n];
        moved++;
    }
    return moved;
}

static hvd_status heartbeats(mpi_tp *t, int64_t now) {
    int flag = 0, err;
    MPI_Status status;

    /* A peer that failed and says why. */
    err = MPI_Test(&t->abort_recv, &flag, &status);
    if (err != MPI_SUCCESS)
        return fail_mpi(t, err, "MPI_Test");
    if (flag) {
        t->abort_in.text[sizeof(t->abort_in.text) - 1] = '\0';
        return fail_with(t, (hvd_status)t->abort_in.status, status.MPI_SOURCE,
                         status.MPI_SOURCE, t->abort_in.text);
    }
    /* Heartbeats that came in. */
    for (;;) {
        err = MPI_Test(&t->hb_recv, &flag, &status);
        if (err != MPI_SUCCESS)
            return fail_mpi(t, err, "MPI_Test");
        if (!flag)
            break;
        if (status.MPI_SOURCE >= 0 && status.MPI_SOURCE < t->size)
            t->last_rx[status.MPI_SOURCE] = now;
        err = MPI_Irecv(&t->hb_in, 1, MPI_BYTE, MPI_ANY_SOURCE, TAG_HEARTBEAT,
                        t->comm, &t->hb_recv);
        if (err != MPI_SUCCESS)
            return fail_mpi(t, err, "MPI_Irecv");
    }
    if (now - t->last_check < CHECK_NS)
        return HVD_OK;
    t->last_check = now;
    /* While this rank waits, it tells the others it is alive. */
    if (t->n > 0 && now - t->last_hb >= HEARTBEAT_NS) {
        t->last_hb = now;
        for (int p = 0; p < t->size; p++) {
            if (p == t->rank)
                continue;
            flag = 1;
            if (t->hb_sends[p] != MPI_REQUEST_NULL)
                MPI_Test(&t->hb_sends[p], &flag, MPI_STATUS_IGNORE);
            if (flag)
                MPI_Isend(&t->hb_out, 1, MPI_BYTE, p, TAG_HEARTBEAT, t->comm,
                          &t->hb_sends[p]);
        }
    }
    /* A peer this rank waits on that sent nothing for the timeout. */
    for (int i = 0; i < t->n; i++) {
        int p = t->entries[i].req->peer;
        int64_t since = t->last_rx[p] > t->entries[i].posted
                            ? t->last_rx[p]
                            : t->entries[i].posted;
        if (now - since > t->timeout_ns) {
            char who[32];
            snprintf(who, sizeof(who), "rank %d", p);
            return hvd_tp_fail_stalled(fail_with, t, t->rank, p, who,
                                       t->timeout_ns);
        }
    }
    return HVD_OK;
}

static void nap(int64_t ns) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};
    nanosleep(&ts, NULL);
}

static hvd_status mpi_progress(hvd_transport *tp, int timeout_ms) {
    mpi_tp *t = (mpi_tp *)tp;
    int64_t start = hvd_now_ns();
    int64_t end =
        timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
    int64_t step = 1000;
    hvd_status st;

    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    for (;;) {
        int64_t now = hvd_now_ns();
        int moved = reap(t, &st);
        if (st == HVD_OK)
            st = heartbeats(t, now);
        if (st != HVD_OK)
            return st;
        if (moved > 0 || __atomic_exchange_n(&t->wake, 0, __ATOMIC_ACQ_REL) ||
            now >= end)
            return HVD_OK;
        /* MPI gives no descriptor to sleep on: poll, backing off. */
        if (now - start < SPIN_NS) {
            sched_yield();
        } else {
            nap(step < end - now ? step : end - now);
            if (step < SLEEP_MAX_NS)
                step *= 2;
        }
    }
}

static void mpi_wake(hvd_transport *tp) {
    __atomic_store_n(&((mpi_tp *)tp)->wake, 1, __ATOMIC_RELEASE);
}

static hvd_status mpi_probe(const hvd_transport_params *params,
                            hvd_caps *caps) {
    int size = 0;

    memset(caps, 0, sizeof(*caps));
    caps->native_collectives = 1;
    /* Between any ranks, but last: auto takes MPI only where nothing of
     * ours can connect the job. */
    caps->reach = HVD_REACH_SAME_HOST | HVD_REACH_OTHER_HOSTS;
    caps->priority = 0;
    caps->usable = hvd_mpi_initialized();
    if (!caps->usable) {
        snprintf(caps->reason, sizeof(caps->reason),
                 "MPI is not initialized (start the job with mpirun)");
        return HVD_OK;
    }
    /* MPI initialized by the trainer itself, as a singleton under hvdrun,
     * is not this job's world. */
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != params->size) {
        caps->usable = 0;
        snprintf(caps->reason, sizeof(caps->reason),
                 "MPI's world has %d ranks and this job %d (start the job "
                 "with mpirun to use MPI)",
                 size, params->size);
    }
    return HVD_OK;
}

static void mpi_close(hvd_transport *tp) {
    mpi_tp *t = (mpi_tp *)tp;

    if (t == NULL)
        return;
    if (hvd_mpi_initialized()) {
        /* A failure can leave requests MPI has completed already (their
         * handles are null): only the others are cancelled. */
        for (int i = 0; i < t->n; i++) {
            if (t->mreqs[i] == MPI_REQUEST_NULL)
                continue;
            MPI_Cancel(&t->mreqs[i]);
            MPI_Request_free(&t->mreqs[i]);
        }
        if (t->hb_recv != MPI_REQUEST_NULL) {
            MPI_Cancel(&t->hb_recv);
            MPI_Wait(&t->hb_recv, MPI_STATUS_IGNORE);
        }
        if (t->abort_recv != MPI_REQUEST_NULL) {
            MPI_Cancel(&t->abort_recv);
            MPI_Wait(&t->abort_recv, MPI_STATUS_IGNORE);
        }
        for (int p = 0; t->hb_sends != NULL && p < t->size; p++)
            if (t->hb_sends[p] != MPI_REQUEST_NULL)
                MPI_Request_free(&t->hb_sends[p]);
        for (int p = 0; t->abort_sends != NULL && p < t->size; p++)
            if (t->abort_sends[p] != MPI_REQUEST_NULL)
                MPI_Request_free(&t->abort_sends[p]);
        if (t->comm != MPI_COMM_NULL)
            MPI_Comm_free(&t->comm);
    }
    free(t->hb_sends);
    free(t->abort_sends);
    free(t->last_rx);
    free(t->mreqs);
    free(t->entries);
    free(t->idx);
    free(t->sts);
    free(t);
}

static hvd_status mpi_open(const hvd_transport_params *params,
                           hvd_transport **out) {
    mpi_tp *t;
    int err, rank, size;
    hvd_status st;

    if (!hvd_mpi_initialized())
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=mpi: MPI is not initialized; "
                             "start the job with mpirun (or hvdrun --mpi)");
    st = hvd_mpi_check_threads();
    if (st != HVD_OK)
        return st;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != params->rank || size != params->size)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "HVD_TRANSPORT=mpi: MPI says rank %d of %d but "
                             "the job is rank %d of %d: the ranks were not "
                             "started by one mpirun (use mpirun, or hvdrun "
                             "--mpi)",
                             rank, size, params->rank, params->size);
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    t->base.ops = &hvd_mpi_ops;
    t->comm = MPI_COMM_NULL;
    t->hb_recv = MPI_REQUEST_NULL;
    t->abort_recv = MPI_REQUEST_NULL;
    t->rank = rank;
    t->size = size;
    t->timeout_ns = params->timeout_ns;
    t->hb_sends = malloc((size_t)size * sizeof(*t->hb_sends));
    t->abort_sends = malloc((size_t)size * sizeof(*t->abort_sends));
    t->last_rx = calloc((size_t)size, sizeof(*t->last_rx));
    if (t->hb_sends == NULL || t->abort_sends == NULL || t->last_rx == NULL) {
        mpi_close(&t->base);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    for (int p = 0; p < size; p++)
        t->hb_sends[p] = t->abort_sends[p] = MPI_REQUEST_NULL;
    err = MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    if (err == MPI_SUCCESS)
        err = MPI_Irecv(&t->hb_in, 1, MPI_BYTE, MPI_ANY_SOURCE, TAG_HEARTBEAT,
                        t->comm, &t->hb_recv);
    if (err == MPI_SUCCESS)
        err = MPI_Irecv(&t->abort_in, (int)sizeof(t->abort_in), MPI_BYTE,
                        MPI_ANY_SOURCE, TAG_ABORT, t->comm, &t->abort_recv);
    if (err != MPI_SUCCESS) {
        st = mpi_fail(HVD_ERR_TRANSPORT, err, "MPI_Comm_dup");
        mpi_close(&t->base);
        return st;
    }
    HVD_DEBUG("mpi", "MPI transport open: rank %d of %d", rank, size);
    *out = &t->base;
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* Native collectives                                                  */

static int mpi_type(hvd_dtype dtype, MPI_Datatype *out) {
    switch (dtype) {
    case HVD_UINT8:
        *out = MPI_UINT8_T;
        return 0;
    case HVD_INT8:
        *out = MPI_INT8_T;
        return 0;
    case HVD_INT32:
        *out = MPI_INT32_T;
        return 0;
    case HVD_INT64:
        *out = MPI_INT64_T;
        return 0;
    case HVD_FLOAT32:
        *out = MPI_FLOAT;
        return 0;
    case HVD_FLOAT64:
        *out = MPI_DOUBLE;
        return 0;
    default:
        return -1; /* MPI has no float16/bfloat16 */
    }
}

static int mpi_op(hvd_op op, MPI_Op *out) {
    switch (op) {
    case HVD_SUM:
        *out = MPI_SUM;
        return 0;
    case HVD_MIN:
        *out = MPI_MIN;
        return 0;
    case HVD_MAX:
        *out = MPI_MAX;
        return 0;
    case HVD_PRODUCT:
        *out = MPI_PROD;
        return 0;
    default:
        return -1; /* average: the caller sums and divides */
    }
}

/* Waits for a non-blocking collective, bounded by the timeout. */
static hvd_status wait_collective(mpi_tp *t, MPI_Request *r, const char *call) {
    int64_t start = hvd_now_ns(), step = 1000;

    for (;;) {
        int flag = 0;
        int err = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS)
            return fail_mpi(t, err, call);
        if (flag)
            return HVD_OK;
        int64_t now = hvd_now_ns();
        hvd_status st = heartbeats(t, now);
        if (st != HVD_OK)
            return st;
        if (now - start > t->timeout_ns) {
            char text[256];
            snprintf(text, sizeof(text),
                     "%s did not complete within %.0f s: a rank is stopped "
                     "or far behind (HVD_TIMEOUT_SECONDS)",
                     call, (double)t->timeout_ns / 1e9);
            return fail(t, HVD_ERR_TIMEOUT, text);
        }
        if (now - start < SPIN_NS) {
            sched_yield();
        } else {
            nap(step);
            if (step < SLEEP_MAX_NS)
                step *= 2;
        }
    }
}

static hvd_status unsupported(hvd_dtype dtype, const char *what) {
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "MPI's native %s does not take dtype %d", what,
                         (int)dtype);
}

static hvd_status mpi_allreduce(hvd_transport *tp, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype,
                                hvd_op op) {
    mpi_tp *t = (mpi_tp *)tp;
    MPI_Datatype type;
    MPI_Op mop;
    size_t esize = hvd_dtype_size(dtype);

    if (mpi_type(dtype, &type) != 0 || mpi_op(op, &mop) != 0)
        return unsupported(dtype, "allreduce");
    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    for (size_t off = 0; off < count || count == 0;) {
        size_t n = count - off < (size_t)INT_MAX ? count - off : INT_MAX;
        MPI_Request r;
        const void *src = sendbuf == recvbuf
                              ? MPI_IN_PLACE
                              : (const char *)sendbuf + off * esize;
        int err = MPI_Iallreduce(src, (char *)recvbuf + off * esize, (int)n,
                                 type, mop, t->comm, &r);
        if (err != MPI_SUCCESS)
            return fail_mpi(t, err, "MPI_Iallreduce");
        hvd_status st = wait_collective(t, &r, "MPI_Iallreduce");
        if (st != HVD_OK || count == 0)
            return st;
        off += n;
    }
    return HVD_OK;
}

static hvd_status mpi_allgather(hvd_transport *tp, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype) {
    mpi_tp *t = (mpi_tp *)tp;
    size_t bytes = count * hvd_dtype_size(dtype);
    char *mine = (char *)recvbuf + (size_t)t->rank * bytes;
    MPI_Request r;

    if (bytes > INT_MAX)
        return unsupported(dtype, "allgather of more than 2 GiB per rank");
    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    /* Bytes: every dtype travels, and in place is MPI_IN_PLACE. */
    if (sendbuf != mine && bytes > 0)
        memmove(mine, sendbuf, bytes);
    int err = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, recvbuf, (int)bytes,
                             MPI_BYTE, t->comm, &r);
    if (err != MPI_SUCCESS)
        return fail_mpi(t, err, "MPI_Iallgather");
    return wait_collective(t, &r, "MPI_Iallgather");
}

static hvd_status mpi_broadcast(hvd_transport *tp, void *buf, size_t count,
                                hvd_dtype dtype, int root) {
    mpi_tp *t = (mpi_tp *)tp;
    size_t bytes = count * hvd_dtype_size(dtype);

    if (t->failure.status != HVD_OK)
        return hvd_tp_failure_error(&t->failure);
    for (size_t off = 0; off < bytes || bytes == 0;) {
        size_t n = bytes - off < PART_MAX ? bytes - off : PART_MAX;
        MPI_Request r;
        int err =
            MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, t->comm, &r);
        if (err != MPI_SUCCESS)
            return fail_mpi(t, err, "MPI_Ibcast");
        hvd_status st = wait_collective(t, &r, "MPI_Ibcast");
        if (st != HVD_OK || bytes == 0)
            return st;
        off += n;
    }
    return HVD_OK;
}

const hvd_transport_ops hvd_mpi_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "mpi",
    .title = "MPI",
    .probe = mpi_probe,
    .open = mpi_open,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .progress = mpi_progress,
    .wake = mpi_wake,
    .close = mpi_close,
    .allreduce = mpi_allreduce,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
};
