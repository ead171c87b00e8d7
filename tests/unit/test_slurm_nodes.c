/* Slurm's compressed host lists and task counts per node. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/slurm_nodes.h"
#include "transport/base/error.h"

/* Expands text and compares the names with want, joined by spaces. */
static void expect_nodes(const char *text, const char *want) {
    hvd_slurm_nodes nodes;
    char got[4096] = "";
    size_t len = 0;

    hvd_error_clear();
    assert_int_equal(
        hvd_slurm_nodes_expand("SLURM_STEP_NODELIST", text, &nodes), HVD_OK);
    for (size_t k = 0; k < nodes.n; k++)
        len += (size_t)snprintf(got + len, sizeof(got) - len, "%s%s",
                                k ? " " : "", nodes.names[k]);
    if (strcmp(got, want) != 0)
        fail_msg("%s expanded to '%s', not '%s'", text, got, want);
    hvd_slurm_nodes_free(&nodes);
}

static void expect_bad_nodes(const char *text, const char *needle) {
    hvd_slurm_nodes nodes = {NULL, 0};

    hvd_error_clear();
    assert_int_equal(
        hvd_slurm_nodes_expand("SLURM_STEP_NODELIST", text, &nodes),
        HVD_ERR_INVALID_ARG);
    assert_null(nodes.names);
    if (strstr(hvd_error_get(), "SLURM_STEP_NODELIST=") == NULL ||
        strstr(hvd_error_get(), needle) == NULL)
        fail_msg("message '%s' lacks the variable or '%s'", hvd_error_get(),
                 needle);
}

static void nodelists(void **state) {
    (void)state;
    hvd_slurm_nodes nodes;

    expect_nodes("node1", "node1");
    expect_nodes("node[10-12,20]", "node10 node11 node12 node20");
    expect_nodes("a[01-03]b", "a01b a02b a03b");
    expect_nodes("n1,n[3-4],m", "n1 n3 n4 m");
    expect_nodes("n[001-003]", "n001 n002 n003");
    expect_nodes("n[8-10]", "n8 n9 n10");
    expect_nodes("n[08-10]", "n08 n09 n10");
    expect_nodes("rack[1-2]-n[1-2]", "rack1-n1 rack1-n2 rack2-n1 rack2-n2");
    expect_nodes("[1-2]x,y.example.org", "1x 2x y.example.org");
    expect_nodes("n[5]", "n5");

    /* 65536 names are fine, one more is not. */
    assert_int_equal(hvd_slurm_nodes_expand("V", "n[0-65535]", &nodes), HVD_OK);
    assert_int_equal(nodes.n, 65536);
    assert_string_equal(nodes.names[65535], "n65535");
    assert_int_equal(hvd_slurm_nodes_find(&nodes, "n70"), 70);
    assert_int_equal(hvd_slurm_nodes_find(&nodes, "n070"), -1);
    hvd_slurm_nodes_free(&nodes);
}

static void bad_nodelists(void **state) {
    (void)state;
    char longname[300];

    expect_bad_nodes("n[3-1]", "goes down");
    expect_bad_nodes("n[", "not closed");
    expect_bad_nodes("n[1-2", "not closed");
    expect_bad_nodes("n]", "not opened");
    expect_bad_nodes("n[a-b]", "other than numbers");
    expect_bad_nodes("n[1-]", "lacks a number");
    expect_bad_nodes("n[]", "empty");
    expect_bad_nodes("n[1,]", "ends with a comma");
    expect_bad_nodes("n[[1]]", "inside a bracket");
    expect_bad_nodes("", "empty");
    expect_bad_nodes("a,,b", "empty name");
    expect_bad_nodes("a,", "empty name");
    expect_bad_nodes("a b", "space");
    expect_bad_nodes("n[1234567890]", "9 digits");
    /* Bounded: neither a billion names nor two bracket groups that
     * multiply to one are allocated. */
    expect_bad_nodes("n[0-999999999]", "more than 65536");
    expect_bad_nodes("n[0-99999]m[0-99999]", "more than 65536");
    expect_bad_nodes("n[0-65536]", "more than 65536");
    memset(longname, 'x', 280);
    longname[280] = '\0';
    expect_bad_nodes(longname, "longer than 255");
}

static void tasks(void **state) {
    (void)state;
    int *c;
    size_t n;

    assert_int_equal(hvd_slurm_tasks_expand("V", "2(x3),1", &c, &n), HVD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(c[0], 2);
    assert_int_equal(c[2], 2);
    assert_int_equal(c[3], 1);
    free(c);
    assert_int_equal(hvd_slurm_tasks_expand("V", "4", &c, &n), HVD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(c[0], 4);
    free(c);
    assert_int_equal(hvd_slurm_tasks_expand("V", "1,3(x2),5(x1)", &c, &n),
                     HVD_OK);
    assert_int_equal(n, 4);
    assert_int_equal(c[1], 3);
    assert_int_equal(c[3], 5);
    free(c);

    static const char *const bad[] = {
        "",   "0",  "2(x0)",  "2(3)", "2(x3",      "2x3",        "2,",
        ",2", "-1", "2(x3)1", "a",    "1(x65537)", "1(x65536),1"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        hvd_error_clear();
        assert_int_equal(
            hvd_slurm_tasks_expand("SLURM_STEP_TASKS_PER_NODE", bad[k], &c, &n),
            HVD_ERR_INVALID_ARG);
        if (strstr(hvd_error_get(), "SLURM_STEP_TASKS_PER_NODE=") == NULL)
            fail_msg("'%s': message '%s' lacks the variable", bad[k],
                     hvd_error_get());
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nodelists),
        cmocka_unit_test(bad_nodelists),
        cmocka_unit_test(tasks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
