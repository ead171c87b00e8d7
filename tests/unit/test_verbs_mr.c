/* The verbs transport's registration cache against a fake ibv_reg_mr and
 * ibv_dereg_mr: hits, LRU eviction within the bounds, overlapping ranges
 * merged, invalidation that waits for the operations holding a region,
 * failures with their sentences, and the memory type (CUDA needs
 * nvidia-peermem). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/error.h"
#include "transport/verbs/mr.h"
#include "verbs_fake.h"

#define PAGE ((uintptr_t)sysconf(_SC_PAGESIZE))

/* A page-aligned arena the tests carve buffers from (the fake never
 * touches the memory it registers). */
static uint8_t *arena;
static struct ibv_pd pd;

static int setup(void **state) {
    (void)state;
    fake_reset();
    if (posix_memalign((void **)&arena, PAGE, 64 * PAGE) != 0)
        return -1;
    return 0;
}

static int teardown(void **state) {
    fake_stats st;

    (void)state;
    fake_get_stats(&st);
    free(arena);
    /* Every test destroys its cache: nothing stays registered. */
    return st.live_mrs == 0 ? 0 : -1;
}

static hvd_mr_cache *cache(int entries, size_t bytes) {
    hvd_mr_cache *c = NULL;
    assert_int_equal(hvd_mr_cache_create(&fake_seam, &pd,
                                         IBV_ACCESS_LOCAL_WRITE, 0, entries,
                                         bytes, &c),
                     HVD_OK);
    return c;
}

static int regs(void) {
    fake_stats st;
    fake_get_stats(&st);
    return st.regs;
}

static int deregs(void) {
    fake_stats st;
    fake_get_stats(&st);
    return st.deregs;
}

static void hits(void **state) {
    hvd_mr_cache *c = cache(8, SIZE_MAX);
    hvd_mr_entry *a, *b, *d;
    hvd_mr_stats s;

    (void)state;
    assert_int_equal(hvd_mr_get(c, arena + 100, 1000, HVD_MEM_HOST, &a),
                     HVD_OK);
    assert_int_equal(regs(), 1);
    /* Registered page-aligned: a later buffer in the same pages hits. */
    assert_true(a->start == (uintptr_t)arena);
    assert_true(a->end == (uintptr_t)arena + PAGE);
    assert_int_equal(hvd_mr_get(c, arena + 2000, 50, HVD_MEM_HOST, &b), HVD_OK);
    assert_ptr_equal(a, b);
    assert_int_equal(a->refs, 2);
    assert_int_equal(hvd_mr_get(c, arena, 0, HVD_MEM_HOST, &d), HVD_OK);
    assert_ptr_equal(a, d);
    assert_int_equal(regs(), 1);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.misses, 1);
    hvd_mr_put(c, a);
    hvd_mr_put(c, b);
    hvd_mr_put(c, d);
    assert_int_equal(a->refs, 0);
    /* Released regions stay cached. */
    assert_int_equal(deregs(), 0);
    hvd_mr_cache_destroy(c);
    assert_int_equal(deregs(), 1);
}

/* The least recently used free region goes first; held ones never. */
static void eviction(void **state) {
    hvd_mr_cache *c = cache(3, SIZE_MAX);
    hvd_mr_entry *e[6];
    hvd_mr_stats s;

    (void)state;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(hvd_mr_get(c, arena + (size_t)(2 * i) * PAGE, PAGE,
                                    HVD_MEM_HOST, &e[i]),
                         HVD_OK);
        hvd_mr_put(c, e[i]);
    }
    /* Use region 0 again: region 1 is now the least recently used. */
    assert_int_equal(hvd_mr_get(c, arena, 8, HVD_MEM_HOST, &e[0]), HVD_OK);
    hvd_mr_put(c, e[0]);
    assert_int_equal(hvd_mr_get(c, arena + 6 * PAGE, PAGE, HVD_MEM_HOST, &e[3]),
                     HVD_OK);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.live, 3);
    assert_int_equal(deregs(), 1);
    /* Region 1 is gone (a miss), region 0 still there (a hit). */
    int before = regs();
    assert_int_equal(hvd_mr_get(c, arena, 8, HVD_MEM_HOST, &e[0]), HVD_OK);
    assert_int_equal(regs(), before);
    /* Hold 0 and 3; a miss for 1 evicts 2 (the only free one). */
    assert_int_equal(hvd_mr_get(c, arena + 2 * PAGE, 8, HVD_MEM_HOST, &e[1]),
                     HVD_OK);
    assert_int_equal(regs(), before + 1);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.evictions, 2);
    /* All three held: a fourth exceeds the bound rather than evict one in
     * use, and the bound is restored when a hold goes. */
    assert_int_equal(hvd_mr_get(c, arena + 10 * PAGE, 8, HVD_MEM_HOST, &e[4]),
                     HVD_OK);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.live, 4);
    /* Region 3, the least recently used, goes as soon as it is free. */
    hvd_mr_put(c, e[3]);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.live, 3);
    hvd_mr_put(c, e[0]);
    hvd_mr_put(c, e[1]);
    hvd_mr_put(c, e[4]);
    hvd_mr_cache_destroy(c);
}

static void byte_bound(void **state) {
    hvd_mr_cache *c = cache(100, 4 * PAGE);
    hvd_mr_entry *a, *b;
    hvd_mr_stats s;

    (void)state;
    assert_int_equal(hvd_mr_get(c, arena, 3 * PAGE, HVD_MEM_HOST, &a), HVD_OK);
    hvd_mr_put(c, a);
    assert_int_equal(
        hvd_mr_get(c, arena + 8 * PAGE, 2 * PAGE, HVD_MEM_HOST, &b), HVD_OK);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.live, 1);
    assert_true(s.live_bytes == 2 * PAGE);
    assert_int_equal(s.evictions, 1);
    hvd_mr_put(c, b);
    hvd_mr_cache_destroy(c);
}

/* A buffer overlapping cached regions gets one region covering all of
 * them; the old ones leave the lookup, and a held one is deregistered only
 * when its hold goes. */
static void overlapping(void **state) {
    hvd_mr_cache *c = cache(8, SIZE_MAX);
    hvd_mr_entry *a, *b, *m, *h;
    hvd_mr_stats s;

    (void)state;
    assert_int_equal(hvd_mr_get(c, arena, 2 * PAGE, HVD_MEM_HOST, &a), HVD_OK);
    assert_int_equal(
        hvd_mr_get(c, arena + 4 * PAGE, 2 * PAGE, HVD_MEM_HOST, &b), HVD_OK);
    hvd_mr_put(c, b); /* a stays held */
    /* Pages 1..4 overlap both. */
    assert_int_equal(
        hvd_mr_get(c, arena + PAGE + 10, 3 * PAGE, HVD_MEM_HOST, &m), HVD_OK);
    assert_true(m->start == (uintptr_t)arena);
    assert_true(m->end == (uintptr_t)arena + 6 * PAGE);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.live, 1);
    assert_int_equal(s.invalidations, 2);
    assert_int_equal(s.held_dead, 1);
    assert_int_equal(deregs(), 1); /* b; a is held */
    assert_int_equal(a->live, 0);
    /* Either old range now hits the merged region. */
    assert_int_equal(hvd_mr_get(c, arena + 5 * PAGE, 8, HVD_MEM_HOST, &h),
                     HVD_OK);
    assert_ptr_equal(h, m);
    hvd_mr_put(c, h);
    /* The held region keeps its MR until released. */
    hvd_mr_put(c, a);
    assert_int_equal(deregs(), 2);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.held_dead, 0);
    /* Adjacent but not overlapping: no merge. */
    assert_int_equal(hvd_mr_get(c, arena + 6 * PAGE, PAGE, HVD_MEM_HOST, &h),
                     HVD_OK);
    assert_ptr_not_equal(h, m);
    hvd_mr_put(c, h);
    hvd_mr_put(c, m);
    hvd_mr_cache_destroy(c);
}

/* Invalidation while an operation holds the region: the lookup misses at
 * once, ibv_dereg_mr waits for the hold. */
static void invalidate_in_use(void **state) {
    hvd_mr_cache *c = cache(8, SIZE_MAX);
    hvd_mr_entry *a, *b, *x;
    hvd_mr_stats s;

    (void)state;
    assert_int_equal(hvd_mr_get(c, arena, PAGE, HVD_MEM_HOST, &a), HVD_OK);
    assert_int_equal(hvd_mr_get(c, arena + 3 * PAGE, PAGE, HVD_MEM_HOST, &b),
                     HVD_OK);
    hvd_mr_put(c, b);
    hvd_mr_invalidate(c, arena, 8 * PAGE);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.held_dead, 1);
    assert_int_equal(deregs(), 1); /* b at once, a not yet */
    assert_int_equal(a->refs, 1);
    /* The same buffer again is a miss: a new region. */
    int before = regs();
    assert_int_equal(hvd_mr_get(c, arena, PAGE, HVD_MEM_HOST, &x), HVD_OK);
    assert_ptr_not_equal(x, a);
    assert_int_equal(regs(), before + 1);
    hvd_mr_put(c, a);
    assert_int_equal(deregs(), 2);
    /* Invalidating what is not cached changes nothing. */
    hvd_mr_invalidate(c, arena + 40 * PAGE, PAGE);
    hvd_mr_cache_stats(c, &s);
    assert_int_equal(s.live, 1);
    hvd_mr_put(c, x);
    hvd_mr_cache_destroy(c);
}

/* Destroying the cache deregisters held regions too (the queue pairs are
 * gone by then). */
static void destroy_held(void **state) {
    hvd_mr_cache *c = cache(8, SIZE_MAX);
    hvd_mr_entry *a, *b;

    (void)state;
    assert_int_equal(hvd_mr_get(c, arena, PAGE, HVD_MEM_HOST, &a), HVD_OK);
    assert_int_equal(hvd_mr_get(c, arena + 2 * PAGE, PAGE, HVD_MEM_HOST, &b),
                     HVD_OK);
    hvd_mr_invalidate(c, arena, PAGE);
    hvd_mr_cache_destroy(c);
    assert_int_equal(deregs(), 2);
    hvd_mr_cache_destroy(NULL);
}

static void failures(void **state) {
    hvd_mr_cache *c = cache(8, SIZE_MAX);
    hvd_mr_entry *a, *b, *m;

    (void)state;
    fake_cfg()->reg_fail_after = 1;
    assert_int_equal(hvd_mr_get(c, arena, PAGE, HVD_MEM_HOST, &a),
                     HVD_ERR_TRANSPORT);
    assert_non_null(strstr(hvd_error_get(), "ibv_reg_mr"));
    assert_non_null(strstr(hvd_error_get(), "ulimit -l"));
    /* A union that cannot be registered falls back to the buffer alone
     * and leaves the others cached. */
    assert_int_equal(hvd_mr_get(c, arena, 2 * PAGE, HVD_MEM_HOST, &a), HVD_OK);
    assert_int_equal(
        hvd_mr_get(c, arena + 3 * PAGE, 2 * PAGE, HVD_MEM_HOST, &b), HVD_OK);
    fake_cfg()->reg_fail_over = (int)(4 * PAGE);
    assert_int_equal(hvd_mr_get(c, arena + PAGE, 3 * PAGE, HVD_MEM_HOST, &m),
                     HVD_OK);
    assert_true(m->start == (uintptr_t)arena + PAGE);
    assert_true(m->end == (uintptr_t)arena + 4 * PAGE);
    assert_int_equal(a->live, 1);
    assert_int_equal(b->live, 1);
    fake_cfg()->reg_fail_over = 0;
    hvd_mr_put(c, a);
    hvd_mr_put(c, b);
    hvd_mr_put(c, m);
    hvd_mr_cache_destroy(c);
}

/* GPUDirect: CUDA memory needs nvidia-peermem, is registered exactly as
 * given, and never matches host regions. On-demand paging is for host
 * memory only. */
static void memory_types(void **state) {
    hvd_mr_cache *c = NULL;
    hvd_mr_entry *h, *d, *x;
    fake_stats st;
    void *dev = arena + 8 * PAGE + 100; /* stands in for a device pointer */

    (void)state;
    assert_int_equal(hvd_mr_cache_create(&fake_seam, &pd,
                                         IBV_ACCESS_LOCAL_WRITE, 1, 8, SIZE_MAX,
                                         &c),
                     HVD_OK);
    assert_int_equal(hvd_mr_get(c, dev, 1000, HVD_MEM_DEVICE, &d),
                     HVD_ERR_UNSUPPORTED);
    assert_non_null(strstr(hvd_error_get(), "nvidia-peermem"));
    assert_int_equal(regs(), 0);
    fake_cfg()->peermem = 1;
    assert_int_equal(hvd_mr_get(c, dev, 1000, HVD_MEM_DEVICE, &d), HVD_OK);
    fake_get_stats(&st);
    assert_true(st.last_addr == (uintptr_t)dev);
    assert_int_equal(st.last_len, 1000);
    assert_int_equal(st.last_access & IBV_ACCESS_ON_DEMAND, 0);
    /* Synchronous CUDA copies into it complete before they return. */
    assert_int_equal(st.sync_memops, 1);
    /* Held (as hvd_verbs_register holds it), a host send inside it finds
     * it; once no one holds it, not: the device allocation may be gone
     * and the address be host memory now (the GPUDirect test saw a host
     * send take a freed device buffer's registration). */
    assert_int_equal(hvd_mr_find_host(c, dev, 10, &x), 1);
    assert_ptr_equal(x, d);
    hvd_mr_put(c, x);
    hvd_mr_put(c, d);
    assert_int_equal(hvd_mr_find_host(c, dev, 10, &h), 0);
    /* A host buffer at an address inside it is another region, and the
     * one a host send finds. */
    assert_int_equal(hvd_mr_get(c, dev, 10, HVD_MEM_HOST, &h), HVD_OK);
    assert_ptr_not_equal(h, d);
    assert_int_equal(hvd_mr_find_host(c, dev, 10, &x), 1);
    assert_ptr_equal(x, h);
    hvd_mr_put(c, x);
    fake_get_stats(&st);
    assert_int_equal(st.last_access & IBV_ACCESS_ON_DEMAND,
                     IBV_ACCESS_ON_DEMAND);
    hvd_mr_put(c, h);
    hvd_mr_cache_destroy(c);
}

/* Device regions are keyed by the allocation's buffer id: the same id hits
 * and merges; another id at the same address (the allocation was freed
 * and the address reused) drops the old region and registers anew, even
 * while the old one is held. Device regions take remote writes. */
static void device_address_reuse(void **state) {
    hvd_mr_cache *c = NULL;
    hvd_mr_entry *a, *b, *x, *y;
    hvd_mr_stats ms;
    fake_stats st;
    uint8_t *dev = arena + 4 * PAGE;

    (void)state;
    fake_cfg()->peermem = 1;
    assert_int_equal(hvd_mr_cache_create(&fake_seam, &pd,
                                         IBV_ACCESS_LOCAL_WRITE, 0, 8, SIZE_MAX,
                                         &c),
                     HVD_OK);
    assert_int_equal(hvd_mr_get_id(c, dev, 4000, HVD_MEM_DEVICE, 7, &a),
                     HVD_OK);
    fake_get_stats(&st);
    assert_int_equal(st.last_access & IBV_ACCESS_REMOTE_WRITE,
                     IBV_ACCESS_REMOTE_WRITE);
    /* Same allocation, inside: a hit. */
    assert_int_equal(hvd_mr_get_id(c, dev + 100, 100, HVD_MEM_DEVICE, 7, &b),
                     HVD_OK);
    assert_ptr_equal(a, b);
    hvd_mr_put(c, b);
    /* Same allocation, reaching past: merged into one region. */
    assert_int_equal(hvd_mr_get_id(c, dev + 2000, 4000, HVD_MEM_DEVICE, 7, &b),
                     HVD_OK);
    assert_ptr_not_equal(a, b);
    assert_true(b->start == (uintptr_t)dev && b->end == (uintptr_t)dev + 6000);
    hvd_mr_cache_stats(c, &ms);
    assert_int_equal(ms.live, 1);
    assert_int_equal(ms.reused, 0);
    /* The address now belongs to another allocation (id 8): the old
     * region (held twice) leaves the lookup and a new one is made. */
    assert_int_equal(hvd_mr_get_id(c, dev, 4000, HVD_MEM_DEVICE, 8, &x),
                     HVD_OK);
    assert_ptr_not_equal(x, b);
    assert_int_equal(x->buffer_id, 8);
    hvd_mr_cache_stats(c, &ms);
    assert_int_equal(ms.reused, 1);
    assert_int_equal(ms.live, 1);
    assert_int_equal(ms.held_dead, 2);
    /* And it is what a later lookup of id 8 finds; id 7 finds nothing. */
    assert_int_equal(hvd_mr_get_id(c, dev, 10, HVD_MEM_DEVICE, 8, &y), HVD_OK);
    assert_ptr_equal(x, y);
    hvd_mr_put(c, y);
    hvd_mr_put(c, a);
    hvd_mr_put(c, b);
    hvd_mr_cache_stats(c, &ms);
    assert_int_equal(ms.held_dead, 0);
    /* Unknown allocations (id 0) are never merged. */
    assert_int_equal(hvd_mr_get_id(c, dev + 8000, 100, HVD_MEM_DEVICE, 0, &a),
                     HVD_OK);
    assert_int_equal(hvd_mr_get_id(c, dev + 8050, 100, HVD_MEM_DEVICE, 0, &b),
                     HVD_OK);
    assert_true(b->start == (uintptr_t)dev + 8050);
    hvd_mr_put(c, a);
    hvd_mr_put(c, b);
    hvd_mr_put(c, x);
    hvd_mr_cache_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(hits, setup, teardown),
        cmocka_unit_test_setup_teardown(eviction, setup, teardown),
        cmocka_unit_test_setup_teardown(byte_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(overlapping, setup, teardown),
        cmocka_unit_test_setup_teardown(invalidate_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(destroy_held, setup, teardown),
        cmocka_unit_test_setup_teardown(failures, setup, teardown),
        cmocka_unit_test_setup_teardown(memory_types, setup, teardown),
        cmocka_unit_test_setup_teardown(device_address_reuse, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
