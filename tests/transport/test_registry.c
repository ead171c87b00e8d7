/*
 * The registry's hooks and the transports' settings tables, without
 * starting a job: which built-in transports provide which hooks, the
 * launcher's cleanup of a dead job's shared-memory segments through the
 * registry, the sentence for a job started by a launcher this build cannot
 * bootstrap through (in a build without that transport), and the shared
 * memory transport's settings (HVD_SHM_CMA, HVD_SHM_SPIN_US).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/shm/shm_internal.h"
#include "transport/tcp/tcp.h"
#include "transport/transport.h"

/* Every hook a transport provides is reachable through the registry's
 * table, and a bootstrap_open always comes with its bootstrap_close. */
static void test_hooks(void **state) {
    (void)state;
    for (size_t i = 0; i < hvd_transport_count(); i++) {
        const hvd_transport_ops *ops = hvd_transport_at(i);
        assert_non_null(ops);
        assert_int_equal(ops->bootstrap_open != NULL,
                         ops->bootstrap_close != NULL);
    }
    const hvd_transport_ops *shm_ops = hvd_transport_find("shm");
    const hvd_transport_ops *tcp = hvd_transport_find("tcp");
    const hvd_transport_ops *mpi = hvd_transport_find("mpi");
    assert_non_null(shm_ops);
    assert_non_null(tcp);
    assert_non_null(shm_ops->cleanup_job);
    assert_null(tcp->bootstrap_open);
    assert_null(tcp->at_shutdown);
    assert_null(tcp->cleanup_job);
    if (mpi != NULL) {
        assert_non_null(mpi->bootstrap_open);
        assert_non_null(mpi->at_shutdown);
    }
    assert_string_equal(hvd_transport_always(), "tcp");
}

/* 1 if a segment of that name exists. */
static int segment_exists(const char *name) {
    int fd = shm_open(name, O_RDONLY, 0);

    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

static int make(const char *name) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);

    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* hvdrun's cleanup at the end of a job removes that job's segments, and
 * only those. */
static void test_cleanup_job(void **state) {
    uint8_t job[HVD_JOB_ID_LEN], other[HVD_JOB_ID_LEN];
    char a[96], b[96], c[96];

    (void)state;
    if (access("/dev/shm", W_OK) != 0)
        skip();
    memset(job, 0, sizeof(job));
    memcpy(job, "registry", 8);
    memcpy(job + 8, &(int32_t){(int32_t)getpid()}, 4);
    memcpy(other, job, sizeof(other));
    other[15] = 1;
    assert_int_equal(hvd_shm_segment_name("s", job, 0, a, sizeof(a)), 0);
    assert_int_equal(hvd_shm_segment_name("s", job, 1, b, sizeof(b)), 0);
    assert_int_equal(hvd_shm_segment_name("s", other, 0, c, sizeof(c)), 0);
    assert_int_equal(make(a), 0);
    assert_int_equal(make(b), 0);
    assert_int_equal(make(c), 0);
    assert_int_equal(hvd_transport_cleanup_job(job, "s"), 2);
    assert_false(segment_exists(a));
    assert_false(segment_exists(b));
    assert_true(segment_exists(c));
    assert_int_equal(hvd_transport_cleanup_job(job, "s"), 0);
    /* The same job id with another secret names other segments. */
    assert_int_equal(hvd_transport_cleanup_job(other, "t"), 0);
    assert_int_equal(hvd_transport_cleanup_job(other, "s"), 1);
    assert_false(segment_exists(c));
}

/* A job that no rendezvous was given for, in a build without MPI: the
 * sentence says what to do. With MPI built in, opening would initialize
 * MPI, which is the MPI tests' business. */
static void test_bootstrap_without_mpi(void **state) {
    hvd_bootstrap *bs = NULL;
    const hvd_transport_ops *by = NULL;

    (void)state;
    if (hvd_transport_find("mpi") != NULL)
        skip();
    assert_int_equal(hvd_transport_bootstrap_open("slurm", 1, 4, &bs, &by),
                     HVD_ERR_UNSUPPORTED);
    assert_null(bs);
    assert_null(by);
    assert_string_equal(
        hvd_error_get(),
        "started by slurm as rank 1 of 4, but no rendezvous is given "
        "(HVD_RENDEZVOUS_ADDR/PORT) and this hvd was built without MPI to "
        "bootstrap through: start the job with `hvdrun -np 4 ...`, or build "
        "hvd with Open MPI's development files");
}

/* The shared-memory transport's settings: defaults, values, and a
 * malformed one failing at the registry's check (as at hvd_init). */
static void test_shm_settings(void **state) {
    const hvd_transport_ops *shm_ops = hvd_transport_find("shm");
    hvd_env_var none[] = {{NULL, NULL}};
    hvd_env_var set[] = {
        {"HVD_SHM_CMA", "0"}, {"HVD_SHM_SPIN_US", "0"}, {NULL, NULL}};
    hvd_env_var bad_spin[] = {{"HVD_SHM_SPIN_US", "abc"}, {NULL, NULL}};
    hvd_env_var bad_cma[] = {{"HVD_SHM_CMA", "2"}, {NULL, NULL}};
    hvd_transport_params params;
    hvd_shm_settings got;

    (void)state;
    assert_non_null(shm_ops);
    assert_int_equal(shm_ops->settings_size, sizeof(hvd_shm_settings));
    memset(&params, 0, sizeof(params));
    params.env = hvd_env_vars_get;
    params.env_ctx = none;
    assert_int_equal(hvd_transport_read_settings(shm_ops, &params, &got),
                     HVD_OK);
    assert_int_equal(got.cma, 1);
    assert_int_equal(got.spin_us, 200);
    params.env_ctx = set;
    assert_int_equal(hvd_transport_read_settings(shm_ops, &params, &got),
                     HVD_OK);
    assert_int_equal(got.cma, 0);
    assert_int_equal(got.spin_us, 0);
    assert_int_equal(hvd_transport_check_settings(hvd_env_vars_get, set),
                     HVD_OK);
    assert_int_equal(hvd_transport_check_settings(hvd_env_vars_get, bad_spin),
                     HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_SHM_SPIN_US"));
    assert_int_equal(hvd_transport_check_settings(hvd_env_vars_get, bad_cma),
                     HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_SHM_CMA"));
}

/* HVD_TCP_PROTECT, a choice: any case is taken and kept as the table
 * writes it; another value fails the registry's check, which hvd_init
 * makes whichever transports the job opens. */
static void test_tcp_protect_setting(void **state) {
    const hvd_transport_ops *tcp_ops = hvd_transport_find("tcp");
    hvd_env_var upper[] = {{"HVD_TCP_PROTECT", "ENCRYPT"}, {NULL, NULL}};
    hvd_env_var bad[] = {{"HVD_TCP_PROTECT", "tls"}, {NULL, NULL}};
    hvd_transport_params params;
    hvd_tcp_settings got;

    (void)state;
    assert_non_null(tcp_ops);
    memset(&params, 0, sizeof(params));
    params.env = hvd_env_vars_get;
    params.env_ctx = upper;
    assert_int_equal(hvd_transport_read_settings(tcp_ops, &params, &got),
                     HVD_OK);
    assert_string_equal(got.protect, "encrypt");
    assert_int_equal(hvd_transport_check_settings(hvd_env_vars_get, bad),
                     HVD_ERR_INVALID_ARG);
    assert_string_equal(hvd_error_get(), "HVD_TCP_PROTECT=tls is not one of "
                                         "none, integrity, encrypt");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks),
        cmocka_unit_test(test_cleanup_job),
        cmocka_unit_test(test_bootstrap_without_mpi),
        cmocka_unit_test(test_shm_settings),
        cmocka_unit_test(test_tcp_protect_setting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
