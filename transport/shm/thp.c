/*
 * Huge pages for the memory the peers read (ops->expose; see
 * shm_internal.h, hvd_shm_thp). process_vm_readv pins every page it
 * reads: a buffer backed by 2 MiB pages is pinned 512 times less often,
 * and a large direct allreduce ran 13-27 % faster (docs/benchmarks.md,
 * "Issue 35: large messages on an idle host, and huge pages").
 * madvise(MADV_COLLAPSE) makes huge pages of memory already in use, which
 * costs about as much as copying it: worth it for a buffer the trainer
 * reuses (a framework's allocator, hvd's fusion buffer), a loss for one
 * that is a fresh mapping each time. So a range is collapsed only the
 * second time it is exposed, and the collapses stop for good once three
 * ranges that had been collapsed cost a collapse again (their memory was
 * mapped anew).
 */
#include "transport/shm/shm_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "transport/base/clock.h"
#include "transport/base/log.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

#define HUGE_PAGE ((uintptr_t)2 << 20)

/* A collapse of a range that is still made of huge pages takes a few
 * microseconds, whatever its length (4 MiB: 1-3 us, 64 MiB: 7 us); one
 * that copies, about 0.6 ms per 2 MiB page (64 MiB: 21.7 ms). Over this
 * per huge page, the range had been mapped anew; a preemption during the
 * call may pass it too, hence several before it stops. */
#define REDONE_NS_PER_PAGE (100 * 1000)

static int collapse_range(void *addr, size_t len) {
    return madvise(addr, len, MADV_COLLAPSE) == 0 ? 0 : -errno;
}

void hvd_shm_thp_init(hvd_shm_thp *t, int on, size_t min_bytes) {
    memset(t, 0, sizeof(*t));
    t->on = on;
    t->min_bytes = min_bytes;
    t->collapse = collapse_range;
    t->now = hvd_now_ns;
}

/* The entry of [start, end), or NULL. */
static hvd_shm_thp_range *find(hvd_shm_thp *t, uintptr_t start, uintptr_t end) {
    for (int i = 0; i < HVD_SHM_THP_RANGES; i++)
        if (t->seen[i].start == start && t->seen[i].end == end)
            return &t->seen[i];
    return NULL;
}

void hvd_shm_thp_expose(hvd_shm_thp *t, const void *buf, size_t len) {
    uintptr_t start, end;
    hvd_shm_thp_range *r;

    if (!t->on || len < t->min_bytes)
        return;
    /* Only whole huge pages inside the buffer: memory around it is not
     * the caller's to change. */
    start = ((uintptr_t)buf + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    end = ((uintptr_t)buf + len) & ~(HUGE_PAGE - 1);
    if (end <= start)
        return;
    r = find(t, start, end);
    if (r == NULL) {
        /* First seen: remembered in place of the oldest. */
        r = &t->seen[t->next];
        t->next = (t->next + 1) % HVD_SHM_THP_RANGES;
        *r = (hvd_shm_thp_range){.start = start, .end = end};
        return;
    }
    int64_t t0 = t->now();
    int rc = t->collapse((void *)start, end - start);
    int64_t took = t->now() - t0;
    if (rc == -EINVAL || rc == -ENOSYS || rc == -EPERM) {
        /* A kernel without MADV_COLLAPSE (before 6.1), or huge pages off
         * (THP "never"): never again. Memory it cannot collapse (not
         * anonymous, locked) says EINVAL too, a case no hint helps. */
        t->on = 0;
        HVD_DEBUG("shm",
                  "huge pages for exposed buffers off: madvise(MADV_COLLAPSE) "
                  "says %s",
                  strerror(-rc));
        return;
    }
    if (rc != 0)
        return; /* EAGAIN, ENOMEM: maybe next time */
    if (r->collapsed &&
        took > (int64_t)((end - start) / HUGE_PAGE) * REDONE_NS_PER_PAGE) {
        if (++t->redone >= HVD_SHM_THP_REDONE_MAX) {
            t->on = 0;
            HVD_DEBUG("shm",
                      "huge pages for exposed buffers off: %d buffers were "
                      "mapped anew after their collapse",
                      t->redone);
        }
    }
    r->collapsed = 1;
}

void hvd_shm_expose(hvd_transport *t, const void *buf, size_t len) {
    shm *tp = (shm *)t;

    hvd_shm_thp_expose(&tp->thp, buf, len);
}
