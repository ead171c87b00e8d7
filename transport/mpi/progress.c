/*
 * The MPI transport's data movement (see mpi_internal.h): hvd's messages
 * as MPI messages, cut into parts MPI's int counts can hold; heartbeats
 * and a peer's abort while waiting; polling, since MPI has no descriptor
 * to sleep on.
 */
#include "transport/mpi/mpi_internal.h"

#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"

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

/* Posts a send or a receive of len bytes (upto: at most len, one part). */
static hvd_status post(hvd_transport *tp, int peer, int channel, void *buf,
                       size_t len, hvd_req *req, int send, int upto) {
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
            return hvd_mpi_fail_call(t, err, send ? "MPI_Isend" : "MPI_Irecv");
        t->entries[t->n] = (entry){
            .req = req, .len = n, .send = send, .upto = upto, .posted = now};
        t->n++;
    }
    return HVD_OK;
}

hvd_status hvd_mpi_isend(hvd_transport *tp, int peer, int channel,
                         const void *buf, size_t len, hvd_req *req) {
    return post(tp, peer, channel, (void *)(uintptr_t)buf, len, req, 1, 0);
}

hvd_status hvd_mpi_irecv(hvd_transport *tp, int peer, int channel, void *buf,
                         size_t len, hvd_req *req) {
    return post(tp, peer, channel, buf, len, req, 0, 0);
}

/* One MPI receive of cap bytes at most; MPI_Get_count says how many came
 * (a longer message fails MPI_Testsome with MPI's truncation error). */
hvd_status hvd_mpi_irecv_upto(hvd_transport *tp, int peer, int channel,
                              void *buf, size_t cap, hvd_req *req) {
    if (cap > HVD_UPTO_MAX)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "mpi: irecv_upto of %zu bytes (at most %d)", cap,
                             HVD_UPTO_MAX);
    return post(tp, peer, channel, buf, cap, req, 0, 1);
}

/* Completes what MPI has finished; returns how many requests moved. */
static int reap(mpi_tp *t, hvd_status *st) {
    int outcount = 0, moved = 0;

    *st = HVD_OK;
    if (t->n == 0)
        return 0;
    int err = MPI_Testsome(t->n, t->mreqs, &outcount, t->idx, t->sts);
    if (err == MPI_ERR_IN_STATUS)
        for (int k = 0; k < outcount && k < t->n; k++) {
            entry *e = &t->entries[t->idx[k]];
            int cls = MPI_SUCCESS;
            MPI_Error_class(t->sts[k].MPI_ERROR, &cls);
            if (!e->send && cls == MPI_ERR_TRUNCATE) {
                char text[256];
                snprintf(text, sizeof(text),
                         "rank %d sent a message of more than %zu bytes "
                         "where this rank expected %s%zu: ranks called "
                         "collectives in different orders or with different "
                         "counts",
                         e->req->peer, e->len, e->upto ? "at most " : "",
                         e->len);
                *st = hvd_mpi_fail(t, HVD_ERR_MISMATCH, text);
                return 0;
            }
        }
    if (err != MPI_SUCCESS) {
        *st = hvd_mpi_fail_call(t, err, "MPI_Testsome");
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
        if (e->upto ? got < 0 || (size_t)got > e->len : (size_t)got != e->len) {
            char text[256];
            snprintf(text, sizeof(text),
                     "rank %d sent a message of %d bytes where this rank "
                     "expected %s%zu: ranks called collectives in different "
                     "orders or with different counts",
                     e->req->peer, got, e->upto ? "at most " : "", e->len);
            *st = hvd_mpi_fail(t, HVD_ERR_MISMATCH, text);
            return 0;
        }
        if (e->upto)
            e->req->got = (size_t)got;
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

hvd_status hvd_mpi_heartbeats(mpi_tp *t, int64_t now) {
    int flag = 0, err;
    MPI_Status status;

    /* A peer that failed and says why. */
    err = MPI_Test(&t->abort_recv, &flag, &status);
    if (err != MPI_SUCCESS)
        return hvd_mpi_fail_call(t, err, "MPI_Test");
    if (flag) {
        t->abort_in.text[sizeof(t->abort_in.text) - 1] = '\0';
        return hvd_mpi_fail_with(t, (hvd_status)t->abort_in.status,
                                 status.MPI_SOURCE, status.MPI_SOURCE,
                                 t->abort_in.text);
    }
    /* Heartbeats that came in. */
    for (;;) {
        err = MPI_Test(&t->hb_recv, &flag, &status);
        if (err != MPI_SUCCESS)
            return hvd_mpi_fail_call(t, err, "MPI_Test");
        if (!flag)
            break;
        if (status.MPI_SOURCE >= 0 && status.MPI_SOURCE < t->size)
            t->last_rx[status.MPI_SOURCE] = now;
        err = MPI_Irecv(&t->hb_in, 1, MPI_BYTE, MPI_ANY_SOURCE, TAG_HEARTBEAT,
                        t->comm, &t->hb_recv);
        if (err != MPI_SUCCESS)
            return hvd_mpi_fail_call(t, err, "MPI_Irecv");
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
            return hvd_tp_fail_stalled(hvd_mpi_fail_with, t, t->rank, p, who,
                                       t->timeout_ns);
        }
    }
    return HVD_OK;
}

void hvd_mpi_nap(int64_t ns) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};
    nanosleep(&ts, NULL);
}

hvd_status hvd_mpi_progress(hvd_transport *tp, int timeout_ms) {
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
            st = hvd_mpi_heartbeats(t, now);
        if (st != HVD_OK)
            return st;
        if (moved > 0 || __atomic_exchange_n(&t->wake, 0, __ATOMIC_ACQ_REL) ||
            now >= end)
            return HVD_OK;
        /* MPI gives no descriptor to sleep on: poll, backing off. */
        if (now - start < SPIN_NS) {
            sched_yield();
        } else {
            hvd_mpi_nap(step < end - now ? step : end - now);
            if (step < SLEEP_MAX_NS)
                step *= 2;
        }
    }
}

void hvd_mpi_wake(hvd_transport *tp) {
    __atomic_store_n(&((mpi_tp *)tp)->wake, 1, __ATOMIC_RELEASE);
}
