/*
 * The shared-memory transport's failures and wake-ups (see
 * shm_internal.h): the futex doorbell, naming a peer, and failing for good
 * (every request completed, the sentence left in this rank's segment for
 * the peers). Calls nothing else of the transport.
 */
#include "transport/shm/shm_internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

long hvd_shm_futex(_Atomic uint32_t *addr, int op, uint32_t val,
                   const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)(void *)addr, op, val, ts, NULL, 0);
}

/* Tells the owner of seg that there is something for it, whatever it
 * does: the doorbell ends its spin as well as its sleep. */
void hvd_shm_ring(uint8_t *seg) {
    seg_hdr *h = hdr_of(seg);
    atomic_fetch_add(&h->doorbell, 1);
    if (atomic_load(&h->sleeping))
        hvd_shm_futex(&h->doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

/*
 * Tells the owner of seg about what this rank has just published in it
 * (a cell's seq, a FIFO's head or acked count, all stores to its
 * segment), ringing only if it sleeps: a polling owner finds it by
 * looking, with no write to a line it reads and no system call.
 *
 * Why no wake-up is lost: the owner, before it sleeps, stores
 * sleeping = 1, then a seq_cst fence (Y), then looks at its FIFOs; this
 * rank stores what it published, then a seq_cst fence (X), then loads
 * sleeping. X and Y are ordered in the single total order of seq_cst
 * fences. If X comes first, the owner's look (after Y) sees what was
 * published before X (C11 7.17.4, fences), and it does not sleep. If Y
 * comes first, this load (after X) sees sleeping = 1 (or a later store:
 * the owner already woke), and this rank rings: the futex wait compares
 * the doorbell in the kernel, so a ring between the owner's look and its
 * wait makes the wait return at once.
 *
 * X costs its publisher the drain of its store buffer, which waits for
 * the published line to come from the owner's core: a tenth of a small
 * message's time (docs/benchmarks.md). Where the kernel has membarrier's
 * global expedited barrier and both processes use it (nofence), Y is
 * that barrier instead (hvd_shm_sleep_fence: every core running a
 * registered process executes a full barrier before it returns, which
 * orders this rank's store and load as X would), and X is only a
 * compiler barrier: the owner, about to sleep anyway, pays a system call
 * so that every publication is free.
 */
void hvd_shm_notify(uint8_t *seg, int nofence) {
    seg_hdr *h = hdr_of(seg);
    if (nofence)
        atomic_signal_fence(memory_order_seq_cst);
    else
        atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&h->sleeping, memory_order_relaxed))
        hvd_shm_ring(seg);
}

/* Registers this process for membarrier's global expedited barrier;
 * 1 if it can sleep after one (hvd_shm_notify). */
int hvd_shm_membar_setup(void) {
    long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

    if (q < 0 || !(q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
        !(q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED))
        return 0;
    return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0,
                   0) == 0;
}

/* Y of hvd_shm_notify: between this rank's sleeping = 1 and its last look
 * at its FIFOs. Should the barrier fail after all, the fence still
 * orders this side, and the sleep is cut to short slices (progress.c)
 * so that a publication that skipped its fence waits 1 ms at most. */
void hvd_shm_sleep_fence(shm *tp) {
    if (tp->membar &&
        syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0)
        return;
    tp->membar_failed = tp->membar;
    atomic_thread_fence(memory_order_seq_cst);
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

int hvd_shm_peer_exited(const speer *pe) {
    if (pe->pidfd >= 0) {
        struct pollfd pfd = {.fd = pe->pidfd, .events = POLLIN};
        return poll(&pfd, 1, 0) > 0;
    }
    return kill(pe->pid, 0) != 0 && errno == ESRCH;
}
