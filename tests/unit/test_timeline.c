/*
 * The timeline file (api/runtime/timeline.c): a JSON array of Chrome
 * trace events, one row ("process") per tensor name announced once by a
 * metadata event, names escaped as JSON strings, begin/end pairs with
 * their arguments, instant marks across rows, times in microseconds from
 * the opening, and a file that cannot be opened refused with a sentence.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/runtime/timeline.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"

/* The whole file at path (NUL-terminated), or NULL. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    char *buf;
    long n;

    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = calloc(1, (size_t)n + 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* The number after "\"ts\": " in the k-th event (from 0) that has one. */
static double ts_of(const char *text, int k) {
    const char *p = text;

    for (int i = 0; i <= k; i++) {
        p = strstr(p, "\"ts\": ");
        assert_non_null(p);
        p += 6;
    }
    return strtod(p, NULL);
}

/* The same, as whole nanoseconds (printed with three decimals of a
 * microsecond). */
static long long ns_of(const char *text, int k) {
    return llround(ts_of(text, k) * 1000.0);
}

static int count(const char *text, const char *what) {
    int n = 0;

    for (const char *p = strstr(text, what); p != NULL; p = strstr(p + 1, what))
        n++;
    return n;
}

static void events(void **state) {
    char path[] = "/tmp/hvd-test-timeline-XXXXXX";
    int fd = mkstemp(path);
    hvd_timeline *tl = NULL;

    (void)state;
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(hvd_timeline_open(path, &tl), HVD_OK);
    int64_t t = hvd_now_ns();
    hvd_timeline_begin(tl, "grad/w\"1\\\n", "QUEUE", t, NULL);
    hvd_timeline_end(tl, "grad/w\"1\\\n", t + 1500);
    hvd_timeline_begin(tl, "b", "ALLREDUCE", t + 2000, "\"algo\": \"ring\"");
    hvd_timeline_mark(tl, "CYCLE_START", t + 2500);
    hvd_timeline_end(tl, "b", t + 4000);
    hvd_timeline_begin(tl, "grad/w\"1\\\n", "MEMCPY", t + 5000, NULL);
    hvd_timeline_end(tl, "grad/w\"1\\\n", t + 6000);
    hvd_timeline_flush(tl);
    hvd_timeline_close(tl);

    char *text = slurp(path);
    unlink(path);
    assert_non_null(text);
    size_t len = strlen(text);
    /* A JSON array: opened, closed, events separated by commas. */
    assert_memory_equal(text, "[\n", 2);
    assert_string_equal(text + len - 3, "\n]\n");
    assert_int_equal(count(text, ",\n"), 8); /* 9 events */
    /* One row per name, announced once, the name escaped. */
    assert_int_equal(count(text, "\"process_name\""), 2);
    assert_non_null(strstr(text, "\"pid\": 1, \"args\": {\"name\": "
                                 "\"grad/w\\\"1\\\\\\u000a\"}}"));
    assert_non_null(strstr(text, "\"pid\": 2, \"args\": {\"name\": \"b\"}}"));
    /* Begin/end pairs on their rows, with their arguments. */
    assert_int_equal(count(text, "\"ph\": \"B\""), 3);
    assert_int_equal(count(text, "\"ph\": \"E\""), 3);
    assert_non_null(
        strstr(text, "\"name\": \"ALLREDUCE\", \"ph\": \"B\", \"ts\": "));
    assert_non_null(strstr(text, "\"pid\": 2, \"tid\": 0, \"args\": "
                                 "{\"algo\": \"ring\"}}"));
    /* A mark across rows. */
    assert_non_null(strstr(text, "{\"name\": \"CYCLE_START\", \"ph\": \"i\", "
                                 "\"s\": \"g\", \"ts\": "));
    /* Microseconds from the opening, to the nanosecond: exact
     * differences once read back as whole nanoseconds. */
    assert_true(ts_of(text, 0) >= 0);
    assert_int_equal(ns_of(text, 1) - ns_of(text, 0), 1500);
    assert_int_equal(ns_of(text, 2) - ns_of(text, 0), 2000);
    assert_int_equal(ns_of(text, 3) - ns_of(text, 0), 2500);
    assert_int_equal(ns_of(text, 6) - ns_of(text, 0), 6000);
    free(text);
}

/* Every call accepts a timeline that is not there (HVD_TIMELINE unset). */
static void no_timeline(void **state) {
    (void)state;
    hvd_timeline_begin(NULL, "a", "QUEUE", 0, NULL);
    hvd_timeline_end(NULL, "a", 0);
    hvd_timeline_mark(NULL, "CYCLE_START", 0);
    hvd_timeline_flush(NULL);
    hvd_timeline_close(NULL);
    assert_true(1);
}

static void cannot_open(void **state) {
    hvd_timeline *tl = (hvd_timeline *)&tl;

    (void)state;
    assert_int_equal(hvd_timeline_open("/nonexistent-dir/t.json", &tl),
                     HVD_ERR_INVALID_ARG);
    assert_ptr_equal(tl, (hvd_timeline *)&tl); /* untouched */
    assert_non_null(strstr(hvd_error_get(), "/nonexistent-dir/t.json"));
    assert_non_null(strstr(hvd_error_get(), "No such file or directory"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(events),
        cmocka_unit_test(no_timeline),
        cmocka_unit_test(cannot_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
