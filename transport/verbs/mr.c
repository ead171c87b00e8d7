#include "transport/verbs/mr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

struct hvd_mr_cache {
    const hvd_ibv_seam *seam;
    struct ibv_pd *pd;
    int access;
    int odp;
    int max_entries;
    size_t max_bytes;
    uintptr_t page;
    hvd_mr_entry *head; /* live regions, most recently used first */
    hvd_mr_entry *tail;
    hvd_mr_entry *dead; /* dropped regions that operations still hold */
    hvd_mr_stats st;
};

hvd_status hvd_mr_cache_create(const hvd_ibv_seam *seam, struct ibv_pd *pd,
                               int access, int odp, int max_entries,
                               size_t max_bytes, hvd_mr_cache **out) {
    hvd_mr_cache *c = calloc(1, sizeof(*c));
    long page = sysconf(_SC_PAGESIZE);

    if (c == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    c->seam = seam;
    c->pd = pd;
    c->access = access;
    c->odp = odp;
    c->max_entries = max_entries < 1 ? 1 : max_entries;
    c->max_bytes = max_bytes;
    c->page = page > 0 ? (uintptr_t)page : 4096;
    *out = c;
    return HVD_OK;
}

static void dereg(hvd_mr_cache *c, hvd_mr_entry *e) {
    int err = c->seam->dereg_mr(e->mr);

    if (err != 0)
        HVD_WARN("verbs", "ibv_dereg_mr(%#lx, %zu bytes) failed: %s",
                 (unsigned long)e->start, (size_t)(e->end - e->start),
                 strerror(err));
    c->st.deregs++;
    free(e);
}

static void unlink_live(hvd_mr_cache *c, hvd_mr_entry *e) {
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
    c->st.live--;
    c->st.live_bytes -= (size_t)(e->end - e->start);
}

static void push_front(hvd_mr_cache *c, hvd_mr_entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head != NULL)
        c->head->prev = e;
    c->head = e;
    if (c->tail == NULL)
        c->tail = e;
}

/* Takes a live region out of the lookup: deregistered now if nobody holds
 * it, else when the last hold goes. */
static void drop(hvd_mr_cache *c, hvd_mr_entry *e) {
    unlink_live(c, e);
    e->live = 0;
    if (e->refs == 0) {
        dereg(c, e);
        return;
    }
    e->next = c->dead;
    if (c->dead != NULL)
        c->dead->prev = e;
    c->dead = e;
    c->st.held_dead++;
}

/* Deregisters the least recently used free regions while over a bound. */
static void evict(hvd_mr_cache *c) {
    hvd_mr_entry *e = c->tail;

    while (e != NULL &&
           (c->st.live > c->max_entries || c->st.live_bytes > c->max_bytes)) {
        hvd_mr_entry *prev = e->prev;
        if (e->refs == 0) {
            drop(c, e);
            c->st.evictions++;
        }
        e = prev;
    }
}

static int overlaps(const hvd_mr_entry *e, uintptr_t start, uintptr_t end) {
    return e->start < end && start < e->end;
}

/* The live region of type and buffer id covering [a, a + len) (with
 * held_any, also one of any type that is held now), made the most
 * recently used and held; NULL on a miss. */
static hvd_mr_entry *lookup(hvd_mr_cache *c, uintptr_t a, size_t len,
                            hvd_mem_type type, uint64_t id, int held_any) {
    for (hvd_mr_entry *e = c->head; e != NULL; e = e->next) {
        if (((e->type == type && e->buffer_id == id) ||
             (held_any && e->refs > 0)) &&
            e->start <= a && a + len <= e->end) {
            if (e != c->head) {
                unlink_live(c, e);
                push_front(c, e);
                c->st.live++;
                c->st.live_bytes += (size_t)(e->end - e->start);
            }
            e->refs++;
            c->st.hits++;
            return e;
        }
    }
    return NULL;
}

int hvd_mr_find_host(hvd_mr_cache *c, const void *addr, size_t len,
                     hvd_mr_entry **out) {
    uintptr_t a = (uintptr_t)addr;
    hvd_mr_entry *e;

    if (len == 0)
        len = 1;
    if (a + len < a || (e = lookup(c, a, len, HVD_MEM_HOST, 0, 1)) == NULL)
        return 0;
    *out = e;
    return 1;
}

hvd_status hvd_mr_get(hvd_mr_cache *c, const void *addr, size_t len,
                      hvd_mem_type type, hvd_mr_entry **out) {
    return hvd_mr_get_id(c, addr, len, type, 0, out);
}

/* Before device memory is registered: checks that it can be, and drops
 * the regions of its address range with another buffer id, which belong
 * to allocations that are gone. */
static hvd_status prepare_device(hvd_mr_cache *c, uintptr_t a, size_t len,
                                 uint64_t buffer_id) {
    hvd_mr_entry *e, *next;

    if (!c->seam->peermem_loaded())
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "registering CUDA device memory for RDMA "
                             "needs the nvidia-peermem kernel module "
                             "(`modprobe nvidia-peermem`); without it "
                             "GPU buffers go through host memory");
    for (e = c->head; e != NULL; e = next) {
        next = e->next;
        if (e->type == HVD_MEM_DEVICE && e->buffer_id != buffer_id &&
            overlaps(e, a, a + len)) {
            drop(c, e);
            c->st.invalidations++;
            c->st.reused++;
        }
    }
    return HVD_OK;
}

/* Grows [*ustart, *uend) to the union with every region of the same
 * allocation it overlaps (repeating: a union may reach a further region).
 * Returns 1 if it overlaps any. */
static int grow_union(hvd_mr_cache *c, hvd_mem_type type, uint64_t buffer_id,
                      uintptr_t *ustart, uintptr_t *uend) {
    int grew = 1, merged = 0;

    for (int round = 0; grew && round <= c->st.live; round++) {
        grew = 0;
        for (hvd_mr_entry *e = c->head; e != NULL; e = e->next) {
            if (e->type != type || e->buffer_id != buffer_id ||
                !overlaps(e, *ustart, *uend))
                continue;
            if (e->start < *ustart || e->end > *uend) {
                *ustart = e->start < *ustart ? e->start : *ustart;
                *uend = e->end > *uend ? e->end : *uend;
                grew = 1;
            }
            merged = 1;
        }
    }
    return merged;
}

/* Registers the union [*ustart, *uend) into *out, or where that fails
 * and *merged, the buffer's own span [start, end) alone (then *merged is 0
 * and the union is that span). */
static hvd_status register_span(hvd_mr_cache *c, hvd_mem_type type, int access,
                                uintptr_t start, uintptr_t end,
                                uintptr_t *ustart, uintptr_t *uend, int *merged,
                                struct ibv_mr **out) {
    struct ibv_mr *mr;
    int err;

    errno = 0;
    mr = c->seam->reg_mr(c->pd, (void *)*ustart, (size_t)(*uend - *ustart),
                         access);
    if (mr == NULL && *merged) {
        /* The union could not be registered: take the buffer alone and
         * leave the others be. */
        *merged = 0;
        *ustart = start;
        *uend = end;
        errno = 0;
        mr = c->seam->reg_mr(c->pd, (void *)*ustart, (size_t)(*uend - *ustart),
                             access);
    }
    if (mr != NULL) {
        *out = mr;
        return HVD_OK;
    }
    err = errno ? errno : EINVAL;
    return hvd_error_set(
        HVD_ERR_TRANSPORT, "ibv_reg_mr(%p, %zu bytes, %s memory) failed: %s%s",
        (void *)*ustart, (size_t)(*uend - *ustart),
        type == HVD_MEM_DEVICE ? "CUDA" : "host", strerror(err),
        err == ENOMEM || err == EPERM
            ? " (raise the locked-memory limit, `ulimit -l "
              "unlimited`)"
            : "");
}

/* Drops the regions of the same allocation inside a new union
 * [ustart, uend): it replaces them. */
static void drop_merged(hvd_mr_cache *c, hvd_mem_type type, uint64_t buffer_id,
                        uintptr_t ustart, uintptr_t uend) {
    hvd_mr_entry *next;

    for (hvd_mr_entry *x = c->head; x != NULL; x = next) {
        next = x->next;
        if (x->type == type && x->buffer_id == buffer_id &&
            overlaps(x, ustart, uend)) {
            drop(c, x);
            c->st.invalidations++;
        }
    }
}

hvd_status hvd_mr_get_id(hvd_mr_cache *c, const void *addr, size_t len,
                         hvd_mem_type type, uint64_t buffer_id,
                         hvd_mr_entry **out) {
    uintptr_t a = (uintptr_t)addr, start, end, ustart, uend;
    struct ibv_mr *mr = NULL;
    hvd_mr_entry *e;
    int access = c->access, merged = 0;
    hvd_status st;

    if (len == 0)
        len = 1;
    if (a + len < a)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "registering %zu bytes at %p wraps around", len,
                             addr);
    if (type != HVD_MEM_DEVICE)
        buffer_id = 0;
    if ((e = lookup(c, a, len, type, buffer_id, 0)) != NULL) {
        *out = e;
        return HVD_OK;
    }

    if (type == HVD_MEM_DEVICE) {
        /* Registered exactly as given: rounding could reach into another
         * allocation. */
        st = prepare_device(c, a, len, buffer_id);
        if (st != HVD_OK)
            return st;
        start = a;
        end = a + len;
        access |= IBV_ACCESS_REMOTE_WRITE;
    } else {
        start = a & ~(c->page - 1);
        end = (a + len + c->page - 1) & ~(c->page - 1);
        if (end < a + len)
            end = a + len;
        if (c->odp)
            access |= IBV_ACCESS_ON_DEMAND;
    }
    ustart = start;
    uend = end;
    /* Device memory of unknown allocation is never merged. */
    if (type == HVD_MEM_HOST || buffer_id != 0)
        merged = grow_union(c, type, buffer_id, &ustart, &uend);
    st = register_span(c, type, access, start, end, &ustart, &uend, &merged,
                       &mr);
    if (st != HVD_OK)
        return st;
    if (type == HVD_MEM_DEVICE)
        c->seam->sync_memops((const void *)start);
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        c->seam->dereg_mr(mr);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    if (merged)
        drop_merged(c, type, buffer_id, ustart, uend);
    e->start = ustart;
    e->end = uend;
    e->type = type;
    e->buffer_id = buffer_id;
    e->mr = mr;
    e->refs = 1;
    e->live = 1;
    push_front(c, e);
    c->st.live++;
    c->st.live_bytes += (size_t)(uend - ustart);
    c->st.misses++;
    evict(c);
    *out = e;
    return HVD_OK;
}

void hvd_mr_put(hvd_mr_cache *c, hvd_mr_entry *e) {
    if (e == NULL || e->refs <= 0)
        return;
    if (--e->refs > 0)
        return;
    if (e->live) {
        evict(c); /* a bound may have been passed while it was held */
        return;
    }
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        c->dead = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    c->st.held_dead--;
    dereg(c, e);
}

void hvd_mr_invalidate(hvd_mr_cache *c, const void *addr, size_t len) {
    uintptr_t a = (uintptr_t)addr;
    uintptr_t end = a + (len ? len : 1);
    hvd_mr_entry *next;

    if (end < a)
        end = UINTPTR_MAX;
    for (hvd_mr_entry *e = c->head; e != NULL; e = next) {
        next = e->next;
        if (overlaps(e, a, end)) {
            drop(c, e);
            c->st.invalidations++;
        }
    }
}

void hvd_mr_cache_stats(const hvd_mr_cache *c, hvd_mr_stats *out) {
    *out = c->st;
}

void hvd_mr_cache_destroy(hvd_mr_cache *c) {
    hvd_mr_entry *next;

    if (c == NULL)
        return;
    for (hvd_mr_entry *e = c->head; e != NULL; e = next) {
        next = e->next;
        dereg(c, e);
    }
    for (hvd_mr_entry *e = c->dead; e != NULL; e = next) {
        next = e->next;
        dereg(c, e);
    }
    free(c);
}
