#include "transport/shm/shm_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport/failure.h"

/* ------------------------------------------------------------------ */
/* Layout                                                              */

void hvd_shm_segment_name(const uint8_t job_id[HVD_JOB_ID_LEN], int rank,
                          char *out, size_t outlen) {
    char hex[2 * HVD_JOB_ID_LEN + 1];
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", job_id[i]);
    snprintf(out, outlen, "/hvd-%s-%d", hex, rank);
}

int hvd_shm_cleanup_job(const uint8_t job_id[HVD_JOB_ID_LEN]) {
    char prefix[96];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int removed = 0;
    size_t plen;

    if (d == NULL)
        return 0;
    hvd_shm_segment_name(job_id, 0, prefix, sizeof(prefix));
    plen = strlen(prefix) - 1; /* "/hvd-<hex>-" */
    while ((e = readdir(d)) != NULL) {
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (strncmp(name, prefix, plen) == 0 && shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

/* ------------------------------------------------------------------ */
/* Waking and failing                                                  */

long hvd_shm_futex(_Atomic uint32_t *addr, int op, uint32_t val,
                   const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)(void *)addr, op, val, ts, NULL, 0);
}

/* Tells the owner of seg that there is something for it. */
void hvd_shm_ring(uint8_t *seg) {
    seg_hdr *h = hdr_of(seg);
    atomic_fetch_add(&h->doorbell, 1);
    if (atomic_load(&h->sleeping))
        hvd_shm_futex(&h->doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

void hvd_shm_describe(const shm *tp, int peer, char *out, size_t outlen) {
    int known = peer >= 0 && peer < tp->size && tp->hosts != NULL;

    hvd_tp_describe(out, outlen, peer, tp->size, known ? tp->hosts[peer] : NULL,
                    known ? (int)tp->peers[peer].pid : -1);
}

void hvd_shm_complete(hvd_req *req, hvd_status status) {
    req->status = status;
    req->done = 1;
}

/*
 * Makes the transport fail for good: every request in flight completes
 * with status, every later call returns it, and the same-host peers read
 * why in this rank's segment.
 */
hvd_status hvd_shm_fail_with(void *arg, hvd_status status, int culprit,
                             int origin, const char *text) {
    shm *tp = arg;

    /* A peer's sentence read from its segment is its own: no relay. */
    (void)origin;
    if (!hvd_tp_failure_set(&tp->failure, "shm", status, tp->rank, tp->rank,
                            text))
        return hvd_tp_failure_error(&tp->failure);
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        for (int ch = 0; ch < NCHANNELS; ch++) {
            msgq *qs[3] = {&pe->sendq[ch], &pe->ackq[ch], &pe->recvq[ch]};
            for (int k = 0; k < 3; k++) {
                for (size_t i = 0; i < qs[k]->count; i++) {
                    msg *m = &qs[k]->v[(qs[k]->head + i) & (qs[k]->cap - 1)];
                    if (m->req != NULL)
                        hvd_shm_complete(m->req, status);
                    if (m->owned)
                        free(m->buf);
                }
                qs[k]->count = 0;
            }
        }
        pe->pending = 0;
    }
    if (tp->seg != NULL) {
        seg_hdr *h = hdr_of(tp->seg);
        snprintf(h->failmsg, sizeof(h->failmsg), "%s", text);
        h->culprit = culprit;
        atomic_store(&h->failed, (int32_t)status);
        for (int p = 0; p < tp->size; p++)
            if (tp->peers[p].seg != NULL)
                hvd_shm_ring(tp->peers[p].seg);
    }
    return hvd_tp_failure_error(&tp->failure);
}

/* 1 if all that is in flight with pe is control messages to it. */
static int only_control_sends(const speer *pe) {
    for (int ch = 0; ch < NCHANNELS; ch++)
        if (pe->recvq[ch].count > 0 || pe->ackq[ch].count > 0 ||
            (ch != HVD_CHANNEL_CONTROL && pe->sendq[ch].count > 0))
            return 0;
    return 1;
}

/* Drops the sends queued to pe on ch (its peer left in order). */
static void drop_sends(speer *pe, int ch) {
    msgq *q = &pe->sendq[ch];
    while (q->count > 0) {
        msg *m = q_front(q);
        if (m->req != NULL)
            hvd_shm_complete(m->req, HVD_OK);
        if (m->owned)
            free(m->buf);
        pe->pending--;
        q_pop(q);
    }
}

int hvd_shm_peer_exited(const speer *pe) {
    if (pe->pidfd >= 0) {
        struct pollfd pfd = {.fd = pe->pidfd, .events = POLLIN};
        return poll(&pfd, 1, 0) > 0;
    }
    return kill(pe->pid, 0) != 0 && errno == ESRCH;
}

/*
 * The slow checks, at most every SLICE_MS while waiting: a peer that
 * failed, died, or has stalled past the timeout while this rank waits on
 * it.
 */
hvd_status hvd_shm_check_peers(shm *tp, int64_t now) {
    if (now - tp->last_check < SLICE_MS * 1000000LL)
        return HVD_OK;
    tp->last_check = now;
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        char who[160];
        if (pe->seg == NULL)
            continue;
        seg_hdr *h = hdr_of(pe->seg);
        int32_t st = atomic_load(&h->failed);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            memcpy(text, h->failmsg, sizeof(text));
            text[sizeof(text) - 1] = '\0';
            return hvd_shm_fail_with(tp, (hvd_status)st, h->culprit, tp->rank,
                                     text);
        }
        hvd_shm_describe(tp, p, who, sizeof(who));
        if ((!atomic_load(&h->bye) || pe->pending > 0) &&
            hvd_shm_peer_exited(pe)) {
            /* What it wrote before it went is still in this rank's FIFOs:
             * take it first, as a socket is read to its end. */
            hvd_shm_pass(tp);
            if (tp->failure.status != HVD_OK)
                return hvd_tp_failure_error(&tp->failure);
            if (atomic_load(&h->bye) && only_control_sends(pe)) {
                /* It left in order: control messages it will never read
                 * (the engine's last ones) are dropped. */
                drop_sends(pe, HVD_CHANNEL_CONTROL);
                continue;
            }
        }
        if ((!atomic_load(&h->bye) || pe->pending > 0) &&
            hvd_shm_peer_exited(pe))
            return hvd_tp_failf(
                hvd_shm_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, p,
                "%s exited or was killed while rank %d %s (its "
                "process is gone)",
                who, tp->rank, pe->pending > 0 ? "waited on it" : "still ran");
        if (pe->pending > 0) {
            int64_t last = atomic_load(&h->heartbeat);
            if (last < pe->last_active)
                last = pe->last_active;
            if (now - last > tp->timeout_ns)
                return hvd_tp_fail_stalled(hvd_shm_fail_with, tp, tp->rank, p,
                                           who, tp->timeout_ns);
        }
    }
    return HVD_OK;
}

const hvd_transport_ops hvd_shm_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "shm",
    .title = "shared memory",
    .probe = hvd_shm_probe,
    .open = hvd_shm_open,
    .isend = hvd_shm_isend,
    .irecv = hvd_shm_irecv,
    .progress = hvd_shm_progress,
    .wake = hvd_shm_wake,
    .shutdown = hvd_shm_shutdown,
    .close = hvd_shm_close,
    .get = hvd_shm_get,
    .can_get = hvd_shm_can_get,
    .cleanup_job = hvd_shm_cleanup_job,
};
