/*
 * Logging (transport/base/log.c): the rate limiter of lines about
 * strangers (the burst of lines of their own, the refill, the summary per
 * interval with its counts per address, the flush), HVD_LOG_LEVEL and
 * HOROVOD_LOG_LEVEL (a bad value fails with the valid values and leaves
 * the level as it was), and the rank hvd_init's failures name before
 * discovery knows it. Lines written to stderr are caught in a file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "hvd/hvd.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

#define S 1000000000LL

/* Stderr goes to a temporary file between catch_start and catch_end. */
static int saved_fd = -1;
static char caught[65536];

static void catch_start(void) {
    char path[] = "/tmp/hvd_test_log.XXXXXX";
    int fd = mkstemp(path);

    assert_true(fd >= 0);
    unlink(path);
    saved_fd = dup(STDERR_FILENO);
    assert_true(saved_fd >= 0);
    dup2(fd, STDERR_FILENO);
    close(fd);
}

/* Returns what was written, and how many lines. */
static int catch_end(void) {
    int lines = 0;
    ssize_t n;

    lseek(STDERR_FILENO, 0, SEEK_SET);
    n = read(STDERR_FILENO, caught, sizeof(caught) - 1);
    caught[n > 0 ? n : 0] = '\0';
    dup2(saved_fd, STDERR_FILENO);
    close(saved_fd);
    for (char *p = caught; *p; p++)
        lines += *p == '\n';
    return lines;
}

static void burst_then_refill(void **state) {
    hvd_log_limiter l;
    int64_t t = 100 * S;
    int own = 0;

    (void)state;
    hvd_log_limiter_init(&l, "test", "refused", "not authenticated");
    for (int i = 0; i < 1000; i++)
        own += hvd_log_limit_note_at(&l, "127.0.0.1:1000", t);
    assert_int_equal(own, HVD_LOG_LIMIT_BURST);
    /* One line's worth of credit per HVD_LOG_LIMIT_LINE_NS. */
    assert_int_equal(hvd_log_limit_note_at(&l, "127.0.0.1:1", t + S / 2), 0);
    assert_int_equal(hvd_log_limit_note_at(&l, "127.0.0.1:1", t + S), 1);
    assert_int_equal(hvd_log_limit_note_at(&l, "127.0.0.1:1", t + S), 0);
    /* A long quiet fills the bucket up to the burst, no more. */
    own = 0;
    for (int i = 0; i < 1000; i++)
        own += hvd_log_limit_note_at(&l, "127.0.0.1:1", t + 9 * S);
    assert_int_equal(own, 8);
    assert_int_equal(hvd_log_limit_total(&l), 2003);
    hvd_log_limiter_destroy(&l);
}

static void summary_per_interval(void **state) {
    hvd_log_limiter l = HVD_LOG_LIMITER_INIT("test", "refused", "why");
    int64_t t = 100 * S;
    hvd_log_level saved = hvd_log_current;

    (void)state;
    hvd_log_current = HVD_LOG_WARN;
    catch_start();
    for (int i = 0; i < 90; i++)
        hvd_log_limit_note_at(&l, "127.0.0.1:4000", t);
    for (int i = 0; i < 10; i++)
        hvd_log_limit_note_at(&l, "[::1]:4001", t);
    /* Not over yet: no summary. */
    hvd_log_limit_flush_at(&l, t + 9 * S, 0);
    assert_int_equal(catch_end(), 0);
    catch_start();
    hvd_log_limit_note_at(&l, "10.0.0.1", t + 10 * S);
    assert_int_equal(catch_end(), 1);
    assert_non_null(strstr(caught, "refused 100 connections from 2 addresses "
                                   "in the last 10 s (127.0.0.1: 90, [::1]: "
                                   "10; 64 of them logged above): why"));
    /* The event after the interval opened the next one; forced out. */
    catch_start();
    hvd_log_limit_flush_at(&l, t + 11 * S, 1);
    assert_int_equal(catch_end(), 0); /* it had its own line: nothing */
    hvd_log_current = saved;
}

static void many_addresses(void **state) {
    hvd_log_limiter l = HVD_LOG_LIMITER_INIT("test", "dropped", "why");
    char addr[32];
    hvd_log_level saved = hvd_log_current;

    (void)state;
    hvd_log_current = HVD_LOG_WARN;
    for (int i = 0; i < HVD_LOG_LIMIT_BURST; i++)
        hvd_log_limit_note_at(&l, "127.0.0.9:1", S);
    for (int i = 0; i < 20; i++) {
        snprintf(addr, sizeof(addr), "127.0.1.%d:80", i);
        hvd_log_limit_note_at(&l, addr, S);
    }
    hvd_log_limit_note_at(&l, "fe80::1", S); /* a bare IPv6 address */
    catch_start();
    hvd_log_limit_flush_at(&l, 2 * S, 1);
    assert_int_equal(catch_end(), 1);
    assert_non_null(strstr(caught, "dropped 85 connections from more than 8 "
                                   "addresses in the last 1 s (127.0.0.9: 64, "
                                   "127.0.1.0: 1"));
    assert_non_null(strstr(caught, ", others; 64 of them logged above): why"));
    hvd_log_current = saved;
}

static void level_setting(void **state) {
    hvd_log_level saved = hvd_log_current;

    (void)state;
    unsetenv("HOROVOD_LOG_LEVEL");
    setenv("HVD_LOG_LEVEL", "debug", 1);
    assert_int_equal(hvd_log_init_from_env(), HVD_OK);
    assert_int_equal(hvd_log_current, HVD_LOG_DEBUG);
    setenv("HVD_LOG_LEVEL", "loud", 1);
    assert_int_equal(hvd_log_init_from_env(), HVD_ERR_INVALID_ARG);
    assert_string_equal(hvd_error_get(),
                        "HVD_LOG_LEVEL=loud is not one of error, warn, info, "
                        "debug, trace (or 0-4)");
    assert_int_equal(hvd_log_current, HVD_LOG_DEBUG);
    unsetenv("HVD_LOG_LEVEL");
    setenv("HOROVOD_LOG_LEVEL", "loud", 1);
    assert_int_equal(hvd_log_init_from_env(), HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HOROVOD_LOG_LEVEL=loud"));
    setenv("HOROVOD_LOG_LEVEL", "fatal", 1);
    assert_int_equal(hvd_log_init_from_env(), HVD_OK);
    assert_int_equal(hvd_log_current, HVD_LOG_ERROR);
    unsetenv("HOROVOD_LOG_LEVEL");
    assert_int_equal(hvd_log_init_from_env(), HVD_OK);
    hvd_log_current = saved;
}

/* hvd_init fails on the bad level, before discovery: the sentence names
 * the launcher's rank (HVD_RANK), or "rank ?" without one; and a failure
 * in discovery itself (a bad rendezvous port) names HVD_RANK's rank, not
 * rank 0. */
static void init_label(void **state) {
    (void)state;
    catch_start();
    setenv("HVD_LOG_LEVEL", "loud", 1);
    setenv("HVD_RANK", "1", 1);
    setenv("HVD_SIZE", "2", 1);
    assert_int_equal(hvd_init(), HVD_ERR_INVALID_ARG);
    assert_string_equal(hvd_last_error(),
                        "hvd_init (rank 1): HVD_LOG_LEVEL=loud is not one of "
                        "error, warn, info, debug, trace (or 0-4)");
    unsetenv("HVD_RANK");
    unsetenv("HVD_SIZE");
    assert_int_equal(hvd_init(), HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_last_error(), "hvd_init (rank ?): "));
    unsetenv("HVD_LOG_LEVEL");
    setenv("HVD_RANK", "1", 1);
    setenv("HVD_SIZE", "2", 1);
    setenv("HVD_RENDEZVOUS_ADDR", "127.0.0.1", 1);
    setenv("HVD_RENDEZVOUS_PORT", "nonsense", 1);
    assert_int_not_equal(hvd_init(), HVD_OK);
    assert_non_null(strstr(hvd_last_error(), "hvd_init (rank 1): "));
    unsetenv("HVD_RANK");
    unsetenv("HVD_SIZE");
    unsetenv("HVD_RENDEZVOUS_ADDR");
    unsetenv("HVD_RENDEZVOUS_PORT");
    catch_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(burst_then_refill),
        cmocka_unit_test(summary_per_interval),
        cmocka_unit_test(many_addresses),
        cmocka_unit_test(level_setting),
        cmocka_unit_test(init_label),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
