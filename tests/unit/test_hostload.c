/* Whether the host has a core for every runnable thread
 * (transport/base/hostload.h), which the transports' and the engine's
 * waits ask before they poll: the running count of a /proc/loadavg line,
 * a file that says the host is busy or idle, the answer kept for
 * HVD_HOSTLOAD_CHECK_NS, and a file that cannot be read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/hostload.h"

static void running_count_of_a_line(void **state) {
    (void)state;
    assert_int_equal(hvd_hostload_running("0.37 1.48 1.74 2/187 4905\n"), 2);
    assert_int_equal(hvd_hostload_running("9.00 8.00 7.00 13/1024 77"), 13);
    assert_int_equal(hvd_hostload_running("0.00 0.00 0.00 /187 1"), -1);
    assert_int_equal(hvd_hostload_running("garbage"), -1);
    assert_int_equal(hvd_hostload_running(""), -1);
}

/* A file of one loadavg line, its path in path. */
static void write_line(char *path, const char *line) {
    FILE *f;

    snprintf(path, 64, "/tmp/hvd-hostload-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(line, f);
    fclose(f);
}

static void rewrite(const char *path, const char *line) {
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    fputs(line, f);
    fclose(f);
}

static void busy_and_idle(void **state) {
    char path[64];
    hvd_hostload h;
    int64_t t = 1000000000LL;

    (void)state;
    write_line(path, "3.10 2.00 1.00 5/300 1234\n");
    hvd_hostload_open(&h, path, 4);
    assert_int_equal(h.ncpu, 4);
    assert_int_equal(hvd_hostload_room(&h, t), 0); /* 5 running, 4 cores */

    /* Kept until HVD_HOSTLOAD_CHECK_NS have passed. */
    rewrite(path, "3.10 2.00 1.00 4/300 1234\n");
    assert_int_equal(hvd_hostload_room(&h, t + HVD_HOSTLOAD_CHECK_NS - 1), 0);
    assert_int_equal(hvd_hostload_room(&h, t + HVD_HOSTLOAD_CHECK_NS), 1);
    rewrite(path, "3.10 2.00 1.00 1/300 1234\n");
    assert_int_equal(hvd_hostload_room(&h, t + 3 * HVD_HOSTLOAD_CHECK_NS), 1);

    /* A line without a running count says nothing: room. */
    rewrite(path, "nonsense\n");
    assert_int_equal(hvd_hostload_room(&h, t + 5 * HVD_HOSTLOAD_CHECK_NS), 1);
    hvd_hostload_close(&h);
    assert_int_equal(h.fd, -1);
    unlink(path);
}

static void unreadable_means_room(void **state) {
    hvd_hostload h;

    (void)state;
    hvd_hostload_open(&h, "/nonexistent/loadavg", 0);
    assert_int_equal(h.fd, -1);
    assert_true(h.ncpu >= 1); /* the cores online */
    assert_int_equal(hvd_hostload_room(&h, 1), 1);
    hvd_hostload_close(&h);
}

/* The real file reads, whatever this host's load. */
static void proc_loadavg(void **state) {
    hvd_hostload h;
    int r;

    (void)state;
    hvd_hostload_open(&h, NULL, 0);
    r = hvd_hostload_room(&h, 1);
    assert_true(r == 0 || r == 1);
    hvd_hostload_close(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(running_count_of_a_line),
        cmocka_unit_test(busy_and_idle),
        cmocka_unit_test(unreadable_means_room),
        cmocka_unit_test(proc_loadavg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
