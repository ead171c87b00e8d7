/*
 * Huge pages for the memory the peers read (transport/shm/thp.c,
 * hvd_shm_thp_expose): with a fake collapse and a fake clock, what is
 * collapsed and when: nothing the first time a range comes, its whole
 * huge pages only the second time and after, nothing under the minimum
 * or without a whole huge page inside, the oldest range forgotten when
 * the table is full, off for good when the kernel has no MADV_COLLAPSE
 * (EINVAL) and after three collapsed ranges had to be collapsed again
 * (fresh mappings at the same address), on after a transient failure
 * (EAGAIN), off when HVD_SHM_HUGEPAGES=0. And the real call: an 8 MiB
 * buffer exposed twice ends up in huge pages where the kernel has
 * MADV_COLLAPSE and transparent huge pages are not "never" (skipped
 * otherwise), its contents unchanged.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "transport/shm/shm_internal.h"

#define MIB ((uintptr_t)1 << 20)
#define HP (2 * MIB)

/* The fake kernel: the calls made, what the next returns and how long it
 * takes on the fake clock. */
static struct {
    int calls;
    uintptr_t addr;
    size_t len;
    int rc;
    int64_t cost_ns;
    int64_t clock;
} k;

static int fake_collapse(void *addr, size_t len) {
    k.calls++;
    k.addr = (uintptr_t)addr;
    k.len = len;
    k.clock += k.cost_ns;
    return k.rc;
}

static int64_t fake_now(void) { return k.clock; }

static void fake_setup(hvd_shm_thp *t, int on) {
    memset(&k, 0, sizeof(k));
    hvd_shm_thp_init(t, on, HVD_SHM_THP_MIN);
    t->collapse = fake_collapse;
    t->now = fake_now;
}

/* An address of a buffer: never dereferenced by the fake. */
static const void *at(uintptr_t a) { return (const void *)a; }

static void second_time_collapses_whole_pages(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 1);
    /* 1 MiB into a huge page, 9 MiB long: whole pages [2, 10) MiB. */
    hvd_shm_thp_expose(&t, at(0x40000000 + MIB), 9 * MIB);
    assert_int_equal(k.calls, 0);
    hvd_shm_thp_expose(&t, at(0x40000000 + MIB), 9 * MIB);
    assert_int_equal(k.calls, 1);
    assert_true(k.addr == 0x40000000 + HP);
    assert_true(k.len == 4 * HP);
    /* And every time after (a still-huge range costs microseconds). */
    hvd_shm_thp_expose(&t, at(0x40000000 + MIB), 9 * MIB);
    assert_int_equal(k.calls, 2);
    assert_true(t.on);
}

static void small_or_no_whole_page_left_alone(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 1);
    for (int i = 0; i < 3; i++) {
        /* Under the minimum, though aligned. */
        hvd_shm_thp_expose(&t, at(0x40000000), HVD_SHM_THP_MIN - 1);
        /* Zero bytes. */
        hvd_shm_thp_expose(&t, at(0x40000000), 0);
    }
    assert_int_equal(k.calls, 0);

    /* No whole huge page inside: a minimum of 1 byte for this case. */
    hvd_shm_thp_init(&t, 1, 1);
    t.collapse = fake_collapse;
    t.now = fake_now;
    for (int i = 0; i < 3; i++)
        hvd_shm_thp_expose(&t, at(0x40000000 + 1), HP);
    assert_int_equal(k.calls, 0);
}

static void off_means_off(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 0);
    for (int i = 0; i < 4; i++)
        hvd_shm_thp_expose(&t, at(0x40000000), 16 * MIB);
    assert_int_equal(k.calls, 0);
}

static void oldest_range_forgotten(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 1);
    /* One more range than the table holds, each seen once. */
    for (int i = 0; i <= HVD_SHM_THP_RANGES; i++)
        hvd_shm_thp_expose(&t, at(0x40000000 + (uintptr_t)i * 64 * MIB),
                           8 * MIB);
    assert_int_equal(k.calls, 0);
    /* The first was forgotten: seen once more, still no collapse. */
    hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    assert_int_equal(k.calls, 0);
    /* The last one is remembered. */
    hvd_shm_thp_expose(
        &t, at(0x40000000 + (uintptr_t)HVD_SHM_THP_RANGES * 64 * MIB), 8 * MIB);
    assert_int_equal(k.calls, 1);
}

static void no_kernel_support_turns_it_off(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 1);
    k.rc = -EINVAL;
    hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    assert_int_equal(k.calls, 1);
    assert_false(t.on);
    k.rc = 0;
    for (int i = 0; i < 3; i++)
        hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    assert_int_equal(k.calls, 1);
}

static void transient_failure_tries_again(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 1);
    k.rc = -EAGAIN;
    hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    assert_int_equal(k.calls, 1);
    assert_true(t.on);
    /* It had not been collapsed: a slow collapse now is no remapping. */
    k.rc = 0;
    k.cost_ns = 10 * 1000 * 1000;
    for (int i = 0; i < 2 * HVD_SHM_THP_REDONE_MAX; i++)
        hvd_shm_thp_expose(&t, at(0x40000000), 8 * MIB);
    /* The first of these collapsed it; each later slow one counts, up
     * to the limit, and then none is made. */
    assert_int_equal(t.redone, HVD_SHM_THP_REDONE_MAX);
    assert_int_equal(k.calls, 2 + HVD_SHM_THP_REDONE_MAX);
    assert_false(t.on);
}

static void fresh_mappings_turn_it_off(void **state) {
    hvd_shm_thp t;
    (void)state;

    fake_setup(&t, 1);
    /* Seen, then collapsed (slow: it copied). */
    k.cost_ns = 40 * 1000 * 1000;
    hvd_shm_thp_expose(&t, at(0x40000000), 64 * MIB);
    hvd_shm_thp_expose(&t, at(0x40000000), 64 * MIB);
    assert_int_equal(k.calls, 1);
    /* Still huge: a few microseconds, as often as it comes. */
    k.cost_ns = 7 * 1000;
    for (int i = 0; i < 10; i++)
        hvd_shm_thp_expose(&t, at(0x40000000), 64 * MIB);
    assert_int_equal(t.redone, 0);
    assert_true(t.on);
    /* Mapped anew each time: slow again; off after the limit. */
    k.cost_ns = 40 * 1000 * 1000;
    for (int i = 0; i < HVD_SHM_THP_REDONE_MAX - 1; i++)
        hvd_shm_thp_expose(&t, at(0x40000000), 64 * MIB);
    assert_true(t.on);
    hvd_shm_thp_expose(&t, at(0x40000000), 64 * MIB);
    assert_false(t.on);
    int calls = k.calls;
    hvd_shm_thp_expose(&t, at(0x40000000), 64 * MIB);
    assert_int_equal(k.calls, calls);
}

/* AnonHugePages of the mapping that holds addr (/proc/self/smaps), in
 * KiB; -1 if not found. */
static long anon_huge_kib(const void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int inside = 0;
    long kib = -1;

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') &&
            line[0] != ' ') {
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
            continue;
        }
        if (inside && sscanf(line, "AnonHugePages: %ld kB", &kib) == 1)
            break;
    }
    fclose(f);
    return kib;
}

static void real_collapse(void **state) {
    hvd_shm_thp t;
    size_t len = 8 * MIB;
    char mode[64] = "";
    (void)state;

    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f == NULL) {
        skip();
        return;
    }
    if (fgets(mode, sizeof(mode), f) == NULL)
        mode[0] = '\0';
    fclose(f);
    if (strstr(mode, "[never]") != NULL) {
        skip();
        return;
    }
    /* A mapping of its own, filled (in small pages where THP is
     * "madvise", as a trainer's buffers are). */
    uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 7 + 3);

    hvd_shm_thp_init(&t, 1, HVD_SHM_THP_MIN);
    hvd_shm_thp_expose(&t, buf, len);
    hvd_shm_thp_expose(&t, buf, len);
    if (!t.on) {
        /* No MADV_COLLAPSE in this kernel. */
        munmap(buf, len);
        skip();
        return;
    }
    long kib = anon_huge_kib(buf + len / 2);
    print_message("the buffer's mapping: %ld KiB in huge pages\n", kib);
    if (kib < 0) {
        print_message("no AnonHugePages line in /proc/self/smaps\n");
    } else if (kib == 0) {
        /* Not collapsed (no free huge page just now, EAGAIN): allowed,
         * nothing to check but the contents. */
        print_message("no huge page was made (the kernel had none free)\n");
    } else {
        /* Every whole huge page inside the buffer: at least 3 of the 4
         * (the mapping need not be 2 MiB-aligned). */
        assert_true(kib >= 3 * 2048);
    }
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (uint8_t)(i * 7 + 3))
            fail_msg("byte %zu changed", i);
    munmap(buf, len);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(second_time_collapses_whole_pages),
        cmocka_unit_test(small_or_no_whole_page_left_alone),
        cmocka_unit_test(off_means_off),
        cmocka_unit_test(oldest_range_forgotten),
        cmocka_unit_test(no_kernel_support_turns_it_off),
        cmocka_unit_test(transient_failure_tries_again),
        cmocka_unit_test(fresh_mappings_turn_it_off),
        cmocka_unit_test(real_collapse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
