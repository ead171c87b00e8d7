/* hvdrun's host lists (tools/hostfile.c): -H lists and hostfiles, good and
 * bad. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tools/hostfile.h"

static char err[1024];

static void expect_hosts(const hvd_hostlist *l, int n, const char *names[],
                         const int slots[]) {
    assert_int_equal(l->n, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(l->v[i].name, names[i]);
        assert_int_equal(l->v[i].slots, slots[i]);
    }
}

static void host_list(void **state) {
    (void)state;
    hvd_hostlist l = {0};
    const char *names[] = {"a", "b", "::1", "fe80::1", "c"};
    const int slots[] = {5, 1, 2, 1, 4096};

    assert_int_equal(hvd_hostlist_parse_list(&l,
                                             "a:2,b,[::1]:2,fe80::1,a:3,"
                                             "c:4096",
                                             err, sizeof(err)),
                     0);
    expect_hosts(&l, 5, names, slots);
    hvd_hostlist_free(&l);
    assert_int_equal(l.n, 0);
}

static void host_list_errors(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",       "a:0",        "a:4097",     "a:x",  "a:",   ",a",
        "a,",     "-a",         "a b",        "a'b",  "[::1", "[::1]x",
        "[::1]:", "a:1,a:4096", "a:99999999", "a:-1", "[]",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hvd_hostlist l = {0};
        err[0] = '\0';
        assert_int_equal(hvd_hostlist_parse_list(&l, bad[i], err, sizeof(err)),
                         -1);
        assert_true(err[0] != '\0');
        hvd_hostlist_free(&l);
    }
}

static void hostfile_text(void **state) {
    (void)state;
    hvd_hostlist l = {0};
    const char text[] = "# the cluster\n"
                        "node1 slots=4\n"
                        "\n"
                        "  node2:2   # two\r\n"
                        "node3\tslots=1 slots=3\n"
                        "[fe80::2]\n"
                        "node1";
    const char *names[] = {"node1", "node2", "node3", "fe80::2"};
    const int slots[] = {5, 2, 3, 1};

    assert_int_equal(hvd_hostlist_parse_text(&l, text, sizeof(text) - 1, "hf",
                                             err, sizeof(err)),
                     0);
    expect_hosts(&l, 4, names, slots);
    hvd_hostlist_free(&l);
}

/* Every form Kubeflow's MPI Operator and people write: Open MPI's "host
 * slots=N" (with max_slots), MPICH's and Intel MPI's "host:N", a bare
 * host, tabs, trailing blanks, CRLF, comments after entries. */
static void hostfile_kubeflow(void **state) {
    (void)state;
    hvd_hostlist l = {0};
    const char text[] =
        "job-worker-0.job-worker.ns.svc slots=2\r\n"
        "job-worker-1.job-worker.ns.svc slots=2 max_slots=4 # a comment\r\n"
        "job-worker-2.job-worker.ns.svc:3   \r\n"
        "\tjob-worker-3.job-worker.ns.svc\tslots=1\tmax-slots=1\t\n"
        "job-worker-4.job-worker.ns.svc#bare\n"
        "   \r\n"
        "localhost max_slots=8\n";
    const char *names[] = {
        "job-worker-0.job-worker.ns.svc", "job-worker-1.job-worker.ns.svc",
        "job-worker-2.job-worker.ns.svc", "job-worker-3.job-worker.ns.svc",
        "job-worker-4.job-worker.ns.svc", "localhost"};
    const int slots[] = {2, 2, 3, 1, 1, 1};

    assert_int_equal(hvd_hostlist_parse_text(&l, text, sizeof(text) - 1, "hf",
                                             err, sizeof(err)),
                     0);
    expect_hosts(&l, 6, names, slots);
    hvd_hostlist_free(&l);
}

static void hostfile_errors(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        "# nothing\n\n",
        "a foo\n",
        "a slots=\n",
        "a:2 slots=2",
        "a slots=0",
        "a\nb:x\n",
        "a slots=2x",
        "a slots=4 max_slots=2",
        "a max_slots=0",
        "a max_slots=",
        "a:2 max_slots=1",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hvd_hostlist l = {0};
        err[0] = '\0';
        assert_int_equal(hvd_hostlist_parse_text(&l, bad[i], strlen(bad[i]),
                                                 "hf", err, sizeof(err)),
                         -1);
        assert_true(err[0] != '\0');
        hvd_hostlist_free(&l);
    }
    /* The line of the error is named. */
    hvd_hostlist l = {0};
    assert_int_equal(
        hvd_hostlist_parse_text(&l, "a\nb c\n", 6, "hf", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "hf:2:"));
    hvd_hostlist_free(&l);
}

/* A NUL byte ends its line; the next line still counts. */
static void embedded_nul(void **state) {
    (void)state;
    hvd_hostlist l = {0};
    const char text[] = {'a', '\0', 'x', ' ', 'y', '\n', 'b', ':', '2'};
    const char *names[] = {"a", "b"};
    const int slots[] = {1, 2};

    assert_int_equal(
        hvd_hostlist_parse_text(&l, text, sizeof(text), "hf", err, sizeof(err)),
        0);
    expect_hosts(&l, 2, names, slots);
    hvd_hostlist_free(&l);
}

static void hostfile_from_disk(void **state) {
    (void)state;
    char path[] = "/tmp/hvd_hostfile_XXXXXX";
    int fd = mkstemp(path);
    hvd_hostlist l = {0};
    const char *names[] = {"h1", "h2"};
    const int slots[] = {2, 1};

    assert_true(fd >= 0);
    assert_int_equal(write(fd, "h1:2\nh2\n", 8), 8);
    close(fd);
    assert_int_equal(hvd_hostlist_parse_file(&l, path, err, sizeof(err)), 0);
    expect_hosts(&l, 2, names, slots);
    hvd_hostlist_free(&l);
    unlink(path);
    assert_int_equal(hvd_hostlist_parse_file(&l, path, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cannot open"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(host_list),
        cmocka_unit_test(host_list_errors),
        cmocka_unit_test(hostfile_text),
        cmocka_unit_test(hostfile_errors),
        cmocka_unit_test(embedded_nul),
        cmocka_unit_test(hostfile_from_disk),
        cmocka_unit_test(hostfile_kubeflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
