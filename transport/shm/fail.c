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

#include "transport/base/clock.h"
#include "transport/base/log.h"

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
 * global expedited barrier, this process registered for it (registered)
 * and the owner sleeps after one (its membar flag), Y is that barrier
 * instead (hvd_shm_sleep_fence: every core running a registered process
 * executes a full barrier before it returns, which orders this rank's
 * store and load as X would), and X is only a compiler barrier: the
 * owner, about to sleep anyway, pays a system call so that every
 * publication is free.
 *
 * The owner may give its barriers up (membar_give_up), after which it
 * sleeps after a fence only. A publication that read the flag as 1 before
 * that, and skipped X, reads the flag again after its load of sleeping:
 * still 1, then this rank's store and both loads came before the point
 * where the owner's last barrier (after it cleared the flag) stopped this
 * core (or before this process was last switched out), so the owner's
 * looks after that barrier see what was published; 0, then X is made
 * now and sleeping read again, as without the barrier.
 */
void hvd_shm_notify(uint8_t *seg, int registered) {
    seg_hdr *h = hdr_of(seg);
    uint32_t sleeping;

    if (registered && atomic_load_explicit(&h->membar, memory_order_relaxed)) {
        atomic_signal_fence(memory_order_seq_cst);
        sleeping = atomic_load_explicit(&h->sleeping, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
        if (!atomic_load_explicit(&h->membar, memory_order_relaxed)) {
            atomic_thread_fence(memory_order_seq_cst);
            sleeping = atomic_load_explicit(&h->sleeping, memory_order_relaxed);
        }
    } else {
        atomic_thread_fence(memory_order_seq_cst);
        sleeping = atomic_load_explicit(&h->sleeping, memory_order_relaxed);
    }
    if (sleeping)
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

static int membar_now(void) {
    return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

/*
 * This rank's barriers are slow: it sleeps after a fence from now on, and
 * its publishers fence again. The barrier interrupts every core that runs
 * a registered process, and in a virtual machine each such interrupt is
 * an exit to the hypervisor on both sides: 13 us a barrier on this
 * project's 2-core VM while the peer ran, against 0.3 us without a running
 * peer, which made every sleep and wake-up of an asynchronous call's
 * engine thread slower than the fences it saves (docs/benchmarks.md).
 * The last barrier, after the flag is cleared, covers a publication that
 * read the flag before (hvd_shm_notify).
 */
static void membar_give_up(shm *tp, seg_hdr *me) {
    atomic_store(&me->membar, 0);
    if (!membar_now())
        tp->membar_failed = 1;
    HVD_DEBUG("shm",
              "membarrier took %.1f us on average: sleeping after a fence "
              "from now on",
              (double)tp->membar_ns / tp->membar_n / 1e3);
}

/* Y of hvd_shm_notify: between this rank's sleeping = 1 and its last look
 * at its FIFOs. Should the barrier fail after all, the fence still
 * orders this side, and the sleep is cut to short slices (progress.c)
 * so that a publication that skipped its fence waits 1 ms at most. Every
 * membar_judge barriers, their cost is judged (membar_give_up). */
void hvd_shm_sleep_fence(shm *tp) {
    seg_hdr *me = hdr_of(tp->seg);

    if (tp->membar && atomic_load_explicit(&me->membar, memory_order_relaxed)) {
        int64_t t0 = hvd_now_ns();
        if (membar_now()) {
            tp->membar_ns += hvd_now_ns() - t0;
            if (++tp->membar_n >= tp->membar_judge) {
                if (tp->membar_ns > tp->membar_n * tp->membar_slow_ns)
                    membar_give_up(tp, me);
                tp->membar_ns = 0;
                tp->membar_n = 0;
            }
            return;
        }
        /* Publishers fence from now on too; the slices cover those that
         * read the flag before. */
        atomic_store(&me->membar, 0);
        tp->membar_failed = 1;
    }
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
