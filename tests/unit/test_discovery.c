/* Process discovery and configuration parsing, from a table of variables
 * instead of the real environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "api/runtime/config.h"
#include "api/runtime/discovery.h"
#include "transport/base/error.h"
#include "transport/tcp/tcp.h"
#include "transport/transport.h"

typedef struct var {
    const char *name;
    const char *value;
} var;

/* A NULL-terminated table of variables. */
static const char *table_get(const char *name, void *ctx) {
    for (const var *v = ctx; v->name != NULL; v++)
        if (strcmp(v->name, name) == 0)
            return v->value;
    return NULL;
}

static hvd_status discover(const var *vars, hvd_procinfo *info) {
    hvd_error_clear();
    return hvd_discover(table_get, (void *)vars, info);
}

static void single(void **state) {
    (void)state;
    var none[] = {{NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(none, &pi), HVD_OK);
    assert_string_equal(pi.source, "single");
    assert_int_equal(pi.rank, 0);
    assert_int_equal(pi.size, 1);
    assert_int_equal(pi.local_rank, 0);
    assert_int_equal(pi.local_size, 1);
    assert_int_equal(pi.cross_rank, 0);
    assert_int_equal(pi.cross_size, 1);
    assert_int_equal(pi.rdv_port, 0);
}

static void hvdrun(void **state) {
    (void)state;
    var v[] = {{"HVD_RANK", "2"},
               {"HVD_SIZE", "4"},
               {"HVD_LOCAL_RANK", "0"},
               {"HVD_LOCAL_SIZE", "2"},
               {"HVD_CROSS_RANK", "1"},
               {"HVD_CROSS_SIZE", "2"},
               {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
               {"HVD_RENDEZVOUS_PORT", "4711"},
               {"HVD_SECRET", "abc"},
               {"HVD_JOB_ID", "00112233445566778899aabbccddeeff"},
               /* Lower-priority sources are ignored. */
               {"OMPI_COMM_WORLD_RANK", "0"},
               {"OMPI_COMM_WORLD_SIZE", "9"},
               {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "hvdrun");
    assert_int_equal(pi.rank, 2);
    assert_int_equal(pi.size, 4);
    assert_int_equal(pi.local_rank, 0);
    assert_int_equal(pi.local_size, 2);
    assert_int_equal(pi.cross_rank, 1);
    assert_int_equal(pi.cross_size, 2);
    assert_string_equal(pi.rdv_addr, "127.0.0.1");
    assert_int_equal(pi.rdv_port, 4711);
    assert_string_equal(pi.secret, "abc");
    assert_true(pi.have_job_id);
    assert_int_equal(pi.job_id[0], 0x00);
    assert_int_equal(pi.job_id[15], 0xff);
}

static void openmpi(void **state) {
    (void)state;
    var v[] = {{"OMPI_COMM_WORLD_RANK", "3"},
               {"OMPI_COMM_WORLD_SIZE", "4"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
               {"SLURM_PROCID", "0"},
               {"SLURM_NTASKS", "1"},
               {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "openmpi");
    assert_int_equal(pi.rank, 3);
    assert_int_equal(pi.size, 4);
    assert_int_equal(pi.local_rank, 1);
    assert_int_equal(pi.local_size, 2);
    assert_int_equal(pi.cross_rank, -1); /* computed at init */
}

static void slurm_and_pmi(void **state) {
    (void)state;
    /* srun --mpi=pmi2: PMI_RANK is SLURM_PROCID. */
    var s[] = {{"SLURM_PROCID", "5"},  {"SLURM_NTASKS", "8"},
               {"SLURM_LOCALID", "1"}, {"PMI_RANK", "5"},
               {"PMI_SIZE", "8"},      {NULL, NULL}};
    var p[] = {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(s, &pi), HVD_OK);
    assert_string_equal(pi.source, "slurm");
    assert_int_equal(pi.rank, 5);
    assert_int_equal(pi.size, 8);
    assert_int_equal(pi.local_rank, 1);
    assert_int_equal(pi.local_size, -1);
    assert_int_equal(discover(p, &pi), HVD_OK);
    assert_string_equal(pi.source, "pmi");
    assert_int_equal(pi.rank, 1);
    assert_int_equal(pi.size, 2);
    assert_int_equal(pi.local_rank, -1);
}

static void expect_invalid(const var *v, const char *needle) {
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_ERR_INVALID_ARG);
    if (strstr(hvd_error_get(), needle) == NULL)
        fail_msg("message '%s' lacks '%s'", hvd_error_get(), needle);
}

static void malformed(void **state) {
    (void)state;
    var a[] = {{"HVD_RANK", "4"}, {"HVD_SIZE", "4"}, {NULL, NULL}};
    var b[] = {{"HVD_RANK", "1"}, {NULL, NULL}};
    var c[] = {{"HVD_RANK", "x"}, {"HVD_SIZE", "4"}, {NULL, NULL}};
    var d[] = {{"HVD_RANK", "-1"}, {"HVD_SIZE", "4"}, {NULL, NULL}};
    var e[] = {{"HVD_RANK", "0"}, {"HVD_SIZE", "0"}, {NULL, NULL}};
    var f[] = {{"OMPI_COMM_WORLD_SIZE", "4"}, {NULL, NULL}};
    var g[] = {{"HVD_RANK", "0"},
               {"HVD_SIZE", "2"},
               {"HVD_LOCAL_RANK", "2"},
               {"HVD_LOCAL_SIZE", "2"},
               {NULL, NULL}};
    var h[] = {{"HVD_RANK", "0"},
               {"HVD_SIZE", "2"},
               {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
               {NULL, NULL}};
    var i[] = {{"HVD_RANK", "0"},
               {"HVD_SIZE", "2"},
               {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
               {"HVD_RENDEZVOUS_PORT", "70000"},
               {NULL, NULL}};
    var j[] = {{"HVD_JOB_ID", "0011"}, {NULL, NULL}};
    var k[] = {{"HVD_RANK", "1 "}, {"HVD_SIZE", "4"}, {NULL, NULL}};
    var l[] = {{"PMI_RANK", "3"}, {"PMI_SIZE", "3"}, {NULL, NULL}};
    var m[] = {{"HVD_RANK", "0"},
               {"HVD_SIZE", "2"},
               {"HVD_LOCAL_SIZE", "3"},
               {NULL, NULL}};

    expect_invalid(a, "HVD_RANK=4 is not below HVD_SIZE=4");
    expect_invalid(b, "HVD_SIZE");
    expect_invalid(c, "HVD_RANK=x");
    expect_invalid(d, "HVD_RANK=-1");
    expect_invalid(e, "HVD_SIZE=0");
    expect_invalid(f, "OMPI_COMM_WORLD_RANK");
    expect_invalid(g, "HVD_LOCAL_RANK=2");
    expect_invalid(h, "HVD_RENDEZVOUS_PORT");
    expect_invalid(i, "HVD_RENDEZVOUS_PORT=70000");
    expect_invalid(j, "HVD_JOB_ID");
    expect_invalid(k, "HVD_RANK=1 ");
    expect_invalid(l, "PMI_RANK=3");
    expect_invalid(m, "HVD_LOCAL_SIZE=3");

    /* Found by fuzz_config: launcher values beyond the job's size. */
    var n[] = {{"HVD_RANK", "1"},
               {"HVD_SIZE", "4"},
               {"HVD_CROSS_RANK", "5"},
               {NULL, NULL}};
    var o[] = {{"HVD_RANK", "0"},
               {"HVD_SIZE", "2"},
               {"HVD_LOCAL_RANK", "3"},
               {NULL, NULL}};
    var p[] = {{"SLURM_PROCID", "0"},
               {"SLURM_NTASKS", "2"},
               {"SLURM_STEP_ID", "0"},
               {"SLURM_LOCALID", "2"},
               {NULL, NULL}};
    expect_invalid(n, "HVD_CROSS_RANK=5");
    expect_invalid(o, "HVD_LOCAL_RANK=3");
    expect_invalid(p, "SLURM_LOCALID=2");
}

/* torchrun on one node: ranks, the hosted rendezvous above torch's store
 * and the job's key; GROUP_* are the node's. */
static void torchrun_one_node(void **state) {
    (void)state;
    var v[] = {{"RANK", "1"},
               {"WORLD_SIZE", "4"},
               {"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "4"},
               {"GROUP_RANK", "0"},
               {"GROUP_WORLD_SIZE", "1"},
               {"ROLE_RANK", "1"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"},
               {"TORCHELASTIC_RUN_ID", "none"},
               {"TORCHELASTIC_RESTART_COUNT", "0"},
               /* The srun that started torchrun does not count. */
               {"SLURM_PROCID", "0"},
               {"SLURM_NTASKS", "1"},
               {"SLURM_STEP_ID", "0"},
               {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "torchrun");
    assert_int_equal(pi.rank, 1);
    assert_int_equal(pi.size, 4);
    assert_int_equal(pi.local_rank, 1);
    assert_int_equal(pi.local_size, 4);
    assert_int_equal(pi.cross_rank, 0);
    assert_int_equal(pi.cross_size, 1);
    assert_true(pi.hosted);
    assert_string_equal(pi.rdv_addr, "127.0.0.1");
    assert_int_equal(pi.rdv_port, 29501);
    assert_int_equal(pi.rdv_port_span, 32);
    assert_string_equal(pi.job_key, "torchrun:none:0:127.0.0.1:29500");
}

/* torchrun on two nodes after a restart; a port near the top of the range
 * shortens the span; HVD_RENDEZVOUS_* replace the address and first port;
 * without LOCAL_*, GROUP_* the values are left to the host names. */
static void torchrun_two_nodes(void **state) {
    (void)state;
    var v[] = {{"RANK", "5"},
               {"WORLD_SIZE", "8"},
               {"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "4"},
               {"GROUP_RANK", "1"},
               {"GROUP_WORLD_SIZE", "2"},
               {"MASTER_ADDR", "node-a.example"},
               {"MASTER_PORT", "65520"},
               {"TORCHELASTIC_RUN_ID", "job42"},
               {"TORCHELASTIC_RESTART_COUNT", "3"},
               {NULL, NULL}};
    var bare[] = {{"RANK", "0"},
                  {"WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "10.0.0.1"},
                  {"MASTER_PORT", "1234"},
                  {"HVD_RENDEZVOUS_ADDR", "10.1.0.1"},
                  {"HVD_RENDEZVOUS_PORT", "4000"},
                  {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "torchrun");
    assert_int_equal(pi.rank, 5);
    assert_int_equal(pi.size, 8);
    assert_int_equal(pi.cross_rank, 1);
    assert_int_equal(pi.cross_size, 2);
    assert_string_equal(pi.rdv_addr, "node-a.example");
    assert_int_equal(pi.rdv_port, 65521);
    assert_int_equal(pi.rdv_port_span, 15);
    assert_string_equal(pi.job_key, "torchrun:job42:3:node-a.example:65520");

    assert_int_equal(discover(bare, &pi), HVD_OK);
    assert_string_equal(pi.source, "torchrun");
    assert_int_equal(pi.local_rank, -1);
    assert_int_equal(pi.local_size, -1);
    assert_int_equal(pi.cross_rank, -1);
    assert_int_equal(pi.cross_size, -1);
    assert_true(pi.hosted);
    assert_string_equal(pi.rdv_addr, "10.1.0.1");
    assert_int_equal(pi.rdv_port, 4000);
    assert_int_equal(pi.rdv_port_span, 32);
    assert_string_equal(pi.job_key, "torchrun:none:0:10.0.0.1:1234");
}

/* hvdrun started inside a torchrun job: its own variables win, and the job
 * is not hosted. */
static void hvdrun_inside_torchrun(void **state) {
    (void)state;
    var v[] = {{"HVD_RANK", "1"},
               {"HVD_SIZE", "2"},
               {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
               {"HVD_RENDEZVOUS_PORT", "4711"},
               {"RANK", "0"},
               {"WORLD_SIZE", "4"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"},
               {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "hvdrun");
    assert_int_equal(pi.rank, 1);
    assert_int_equal(pi.size, 2);
    assert_false(pi.hosted);
    assert_int_equal(pi.rdv_port, 4711);
    assert_string_equal(pi.job_key, "");
}

/* torch's variables that do not fit together, each named. */
static void torchrun_malformed(void **state) {
    (void)state;
#define TORCH(extra_rank, extra_size)                                          \
    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},                    \
        {"RANK", extra_rank}, {"WORLD_SIZE", extra_size}
    var a[] = {TORCH("3", "2"), {NULL, NULL}};
    var b[] = {{"MASTER_ADDR", "h"},
               {"MASTER_PORT", "1"},
               {"RANK", "0"},
               {NULL, NULL}};
    var c[] = {TORCH("0", "2"),
               {"LOCAL_RANK", "2"},
               {"LOCAL_WORLD_SIZE", "2"},
               {NULL, NULL}};
    var d[] = {TORCH("0", "4"),
               {"GROUP_RANK", "2"},
               {"GROUP_WORLD_SIZE", "2"},
               {NULL, NULL}};
    var e[] = {TORCH("0", "6"),
               {"LOCAL_WORLD_SIZE", "2"},
               {"GROUP_WORLD_SIZE", "2"},
               {NULL, NULL}};
    var f[] = {{"MASTER_ADDR", "h"},
               {"MASTER_PORT", "http"},
               {"RANK", "0"},
               {"WORLD_SIZE", "2"},
               {NULL, NULL}};
    var g[] = {{"MASTER_ADDR", "h"},
               {"MASTER_PORT", "65535"},
               {"RANK", "0"},
               {"WORLD_SIZE", "2"},
               {NULL, NULL}};
    var h[] = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {NULL, NULL}};
    var i[] = {
        {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {NULL, NULL}};
    var j[] = {TORCH("0", "2"), {"GROUP_WORLD_SIZE", "3"}, {NULL, NULL}};
    var k[] = {{"MASTER_ADDR", ""},
               {"MASTER_PORT", "1"},
               {"RANK", "0"},
               {"WORLD_SIZE", "2"},
               {NULL, NULL}};
#undef TORCH
    /* RANK alone is too common a name to mean torch. */
    var alone[] = {{"RANK", "3"}, {NULL, NULL}};
    hvd_procinfo pi;

    expect_invalid(a, "RANK=3 is not below WORLD_SIZE=2");
    expect_invalid(b, "RANK is set but WORLD_SIZE is not");
    expect_invalid(c, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
    expect_invalid(d, "GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2");
    expect_invalid(
        e, "WORLD_SIZE=6 is not LOCAL_WORLD_SIZE=2 times GROUP_WORLD_SIZE=2");
    expect_invalid(f, "MASTER_PORT=http");
    expect_invalid(g, "MASTER_PORT=65535 leaves no port");
    expect_invalid(h, "MASTER_ADDR and MASTER_PORT are not");
    expect_invalid(i, "MASTER_PORT is not");
    expect_invalid(j, "GROUP_WORLD_SIZE=3");
    expect_invalid(k, "MASTER_ADDR=");
    assert_int_equal(discover(alone, &pi), HVD_OK);
    assert_string_equal(pi.source, "single");
}

/* The variables srun gives task 3 of a step of 4 tasks on two nodes, in a
 * job of three nodes. */
#define SRUN_STEP                                                              \
    {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},                              \
        {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "1"},                 \
        {"SLURM_STEP_ID", "0"}, {"SLURM_STEPID", "0"},                         \
        {"SLURM_JOB_ID", "1234"}, {"SLURM_JOBID", "1234"},                     \
        {"SLURM_STEP_NODELIST", "node[1-2]"},                                  \
        {"SLURM_JOB_NODELIST", "node[1-3]"}, {"SLURM_NODELIST", "node[1-3]"},  \
        {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},                                \
        {"SLURM_TASKS_PER_NODE", "2(x3)"}, {"SLURMD_NODENAME", "node2"},       \
        {"SLURM_NODEID", "1"}, {                                               \
        "SLURM_CLUSTER_NAME", "hpc"                                            \
    }

/* srun without MPI on two nodes: rank 0 hosts the rendezvous on the
 * step's first node, on ports from the job and step ids. */
static void srun_two_nodes(void **state) {
    (void)state;
    var v[] = {SRUN_STEP, {NULL, NULL}};
    /* Two nodes of 2 and 1 tasks; only SLURM_NODEID and the allocation's
     * lists, as an older srun gives them. */
    var uneven[] = {{"SLURM_PROCID", "2"},
                    {"SLURM_NTASKS", "3"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_STEPID", "3"},
                    {"SLURM_JOBID", "7"},
                    {"SLURM_NODELIST", "n[08-09]"},
                    {"SLURM_TASKS_PER_NODE", "2,1"},
                    {"SLURM_NODEID", "1"},
                    {"HVD_RENDEZVOUS_PORT", "5000"},
                    {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "slurm");
    assert_int_equal(pi.rank, 3);
    assert_int_equal(pi.size, 4);
    assert_int_equal(pi.local_rank, 1);
    assert_int_equal(pi.local_size, 2);
    assert_int_equal(pi.cross_rank, 1);
    assert_int_equal(pi.cross_size, 2);
    assert_true(pi.hosted);
    assert_string_equal(pi.rdv_addr, "node1");
    /* 10000 + (1234 * 131 + 0 * 17) % 22000 */
    assert_int_equal(pi.rdv_port, 17654);
    assert_int_equal(pi.rdv_port_span, 32);
    assert_string_equal(pi.job_key, "slurm:hpc:1234:0");

    assert_int_equal(discover(uneven, &pi), HVD_OK);
    assert_string_equal(pi.source, "slurm");
    assert_int_equal(pi.rank, 2);
    assert_int_equal(pi.size, 3);
    assert_int_equal(pi.local_size, 1);
    assert_int_equal(pi.cross_rank, 1);
    assert_int_equal(pi.cross_size, 2);
    assert_string_equal(pi.rdv_addr, "n08");
    assert_int_equal(pi.rdv_port, 5000);
    assert_string_equal(pi.job_key, "slurm::7:3");
}

/* srun --mpi=pmix: MPI bootstraps the job; Slurm's values still count. */
static void srun_pmix(void **state) {
    (void)state;
    var v[] = {SRUN_STEP, {"PMIX_RANK", "3"}, {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "slurm");
    assert_int_equal(pi.rank, 3);
    assert_int_equal(pi.size, 4);
    assert_int_equal(pi.local_size, 2);
    assert_int_equal(pi.cross_rank, 1);
    assert_false(pi.hosted);
    assert_int_equal(pi.rdv_port, 0);
}

/* The batch script: SLURM_PROCID=0 and the allocation's task count, but
 * no srun step; a job of one, not one waiting for three more ranks. */
static void slurm_batch_step(void **state) {
    (void)state;
#define BATCH                                                                  \
    {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},      \
        {"SLURM_NODEID", "0"}, {"SLURM_JOB_ID", "55"},                         \
        {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},   \
        {"SLURMD_NODENAME", "n1"}
    var none[] = {BATCH, {NULL, NULL}};
    var batch_id[] = {BATCH,
                      {"SLURM_STEP_ID", "4294967291"},
                      {"SLURM_STEPID", "4294967291"},
                      {NULL, NULL}};
    var named[] = {BATCH, {"SLURM_STEP_ID", "batch"}, {NULL, NULL}};
    var ext[] = {BATCH, {"SLURM_STEP_ID", "4294967292"}, {NULL, NULL}};
    /* Newer Slurm prints the batch step's id with %d. */
    var signed_id[] = {BATCH, {"SLURM_STEP_ID", "-5"}, {NULL, NULL}};
#undef BATCH
    const var *cases[] = {none, batch_id, named, ext, signed_id};
    hvd_procinfo pi;

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        assert_int_equal(discover(cases[k], &pi), HVD_OK);
        assert_string_equal(pi.source, "slurm");
        assert_int_equal(pi.rank, 0);
        assert_int_equal(pi.size, 1);
        assert_int_equal(pi.local_size, 1);
        assert_false(pi.hosted);
    }
}

/* Hydra's mpiexec runs its proxies in a Slurm step: the ranks' PMI values
 * differ from the proxy's SLURM_PROCID, and PMI names the job. */
static void pmi_proxies_in_a_step(void **state) {
    (void)state;
    var v[] = {{"SLURM_PROCID", "1"},  {"SLURM_STEP_NUM_TASKS", "2"},
               {"SLURM_STEP_ID", "0"}, {"PMI_RANK", "5"},
               {"PMI_SIZE", "8"},      {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_string_equal(pi.source, "pmi");
    assert_int_equal(pi.rank, 5);
    assert_int_equal(pi.size, 8);
    assert_false(pi.hosted);
}

/* Slurm's variables that do not fit together, each named. */
static void slurm_malformed(void **state) {
    (void)state;
    var a[] = {{"SLURMD_NODENAME", "node7"}, SRUN_STEP, {NULL, NULL}};
    var b[] = {{"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}, SRUN_STEP, {NULL, NULL}};
    var c[] = {{"SLURM_STEP_TASKS_PER_NODE", "3,2"}, SRUN_STEP, {NULL, NULL}};
    var d[] = {{"SLURM_LOCALID", "2"}, SRUN_STEP, {NULL, NULL}};
    var e[] = {{"SLURM_STEP_NODELIST", "node[3-1]"}, SRUN_STEP, {NULL, NULL}};
    var f[] = {{"SLURM_STEP_ID", "abc"}, SRUN_STEP, {NULL, NULL}};
    var g[] = {{"SLURM_PROCID", "4"}, SRUN_STEP, {NULL, NULL}};
    var h[] = {{"SLURM_STEP_TASKS_PER_NODE", "2(x"}, SRUN_STEP, {NULL, NULL}};
    var i[] = {{"SLURM_PROCID", "0"},
               {"SLURM_STEP_NUM_TASKS", "2"},
               {"SLURM_STEP_ID", "1"},
               {"SLURM_STEP_NODELIST", "n[1-2]"},
               {NULL, NULL}};
    var j[] = {{"SLURM_PROCID", "0"},
               {"SLURM_STEP_NUM_TASKS", "2"},
               {"SLURM_STEP_ID", "1"},
               {"SLURM_JOB_ID", "9"},
               {NULL, NULL}};
    var k[] = {{"SLURM_STEP_NODELIST", "node[1-2]"},
               {"SLURMD_NODENAME", "node1"},
               {"SLURM_NODEID", "5"},
               SRUN_STEP,
               {NULL, NULL}};

    /* The table's first entry wins: each case puts its bad value first. */
    expect_invalid(a, "SLURMD_NODENAME=node7 is not in SLURM_STEP_NODELIST");
    expect_invalid(b, "SLURM_STEP_TASKS_PER_NODE=2(x3) counts 3 nodes but "
                      "SLURM_STEP_NODELIST=node[1-2] names 2");
    expect_invalid(c, "SLURM_STEP_TASKS_PER_NODE=3,2 adds up to 5 tasks");
    expect_invalid(d, "SLURM_LOCALID=2 is not below this node's count");
    expect_invalid(e, "SLURM_STEP_NODELIST=node[3-1]");
    expect_invalid(f, "SLURM_STEP_ID=abc");
    expect_invalid(g, "SLURM_PROCID=4 is not below SLURM_STEP_NUM_TASKS=4");
    expect_invalid(h, "SLURM_STEP_TASKS_PER_NODE=2(x");
    expect_invalid(i, "SLURM_JOB_ID");
    expect_invalid(j, "SLURM_STEP_NODELIST");
    /* SLURMD_NODENAME, when set, is what places the node. */
    hvd_procinfo pi;
    assert_int_equal(discover(k, &pi), HVD_OK);
    assert_int_equal(pi.cross_rank, 0);
}

static void config_defaults_and_values(void **state) {
    (void)state;
    var none[] = {{NULL, NULL}};
    var v[] = {{"HVD_TIMEOUT_SECONDS", "5"},
               {"HVD_START_TIMEOUT_SECONDS", "9"},
               {"HVD_TCP_NSOCKS", "4"},
               {"HVD_TCP_STRIPE_MIN", "1M"},
               {"HVD_CHUNK_BYTES", "64k"},
               {"HVD_PIPELINE_DEPTH", "8"},
               {"HVD_ALGORITHM", "rabenseifner"},
               {"HVD_BCAST_ALGORITHM", "pipeline"},
               {"HVD_TUNING_FILE", "/tmp/t"},
               {"HVD_TRANSPORT", "tcp"},
               {"HVD_IFACE", "lo"},
               {"HVD_IB_GPUDIRECT", "off"},
               {NULL, NULL}};
    hvd_config c;
    hvd_tcp_settings tcp;
    hvd_transport_params params;

    assert_int_equal(hvd_config_load(table_get, none, &c), HVD_OK);
    assert_string_equal(c.transport, "auto");
    assert_true(c.timeout_ns == 300LL * 1000000000LL);
    assert_int_equal(c.comm.allreduce_algo, HVD_ALGO_UNFORCED);
    assert_int_equal(c.chunk_forced, 0);

    assert_int_equal(hvd_config_load(table_get, v, &c), HVD_OK);
    assert_true(c.timeout_ns == 5LL * 1000000000LL);
    assert_true(c.start_timeout_ns == 9LL * 1000000000LL);
    assert_int_equal(c.comm.chunk_bytes, 64 << 10);
    assert_int_equal(c.comm.depth, 8);
    assert_int_equal(c.chunk_forced, 1);
    assert_int_equal(c.comm.allreduce_algo, HVD_ALGO_RABENSEIFNER);
    assert_int_equal(c.comm.bcast_algo, HVD_ALGO_PIPELINE);
    assert_string_equal(c.tuning_file, "/tmp/t");
    assert_string_equal(c.transport, "tcp");

    /* The TCP transport's own settings, from its table. */
    memset(&params, 0, sizeof(params));
    params.env = table_get;
    params.env_ctx = none;
    assert_int_equal(hvd_transport_read_settings(&hvd_tcp_ops, &params, &tcp),
                     HVD_OK);
    assert_int_equal(tcp.nsocks, 1);
    assert_int_equal(tcp.stripe_min, 256 << 10);
    assert_true(tcp.setup_ns == 30LL * 1000000000LL);
    assert_string_equal(tcp.iface, "");
    params.env_ctx = v;
    assert_int_equal(hvd_transport_read_settings(&hvd_tcp_ops, &params, &tcp),
                     HVD_OK);
    assert_int_equal(tcp.nsocks, 4);
    assert_int_equal(tcp.stripe_min, 1 << 20);
    assert_string_equal(tcp.iface, "lo");
}

static void config_malformed(void **state) {
    (void)state;
    static const var bad[][2] = {
        {{"HVD_TIMEOUT_SECONDS", "0"}, {NULL, NULL}},
        {{"HVD_TIMEOUT_SECONDS", "ten"}, {NULL, NULL}},
        {{"HVD_TCP_NSOCKS", "0"}, {NULL, NULL}},
        {{"HVD_TCP_NSOCKS", "99"}, {NULL, NULL}},
        {{"HVD_CHUNK_BYTES", "12Q"}, {NULL, NULL}},
        {{"HVD_CHUNK_BYTES", "-5"}, {NULL, NULL}},
        {{"HVD_CHUNK_BYTES", "99999999999G"}, {NULL, NULL}},
        {{"HVD_ALGORITHM", "tree"}, {NULL, NULL}},
        {{"HVD_ALGORITHM", "fastest"}, {NULL, NULL}},
        {{"HVD_BCAST_ALGORITHM", "ring"}, {NULL, NULL}},
        {{"HVD_BCAST_ALGORITHM", "hier"}, {NULL, NULL}},
        {{"HVD_PIPELINE_DEPTH", "17"}, {NULL, NULL}},
        {{"HVD_IB_GPUDIRECT", "maybe"}, {NULL, NULL}},
    };
    hvd_config c;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        hvd_error_clear();
        assert_int_equal(hvd_config_load(table_get, (void *)bad[i], &c),
                         HVD_ERR_INVALID_ARG);
        if (strstr(hvd_error_get(), bad[i][0].name) == NULL)
            fail_msg("message '%s' does not name %s", hvd_error_get(),
                     bad[i][0].name);
    }
}

/* Horovod's names are honoured where hvd's are unset; hvd's win; a bad
 * value fails with a sentence naming the variable that was set. */
static void horovod_aliases(void **state) {
    (void)state;
    var horovod[] = {{"HOROVOD_FUSION_THRESHOLD", "33554432"},
                     {"HOROVOD_CACHE_CAPACITY", "7"},
                     {"HOROVOD_TIMELINE", "/tmp/tl.json"},
                     {"HOROVOD_STALL_CHECK_TIME_SECONDS", "11"},
                     {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "12"},
                     {NULL, NULL}};
    var both[] = {{"HOROVOD_FUSION_THRESHOLD", "1M"},
                  {"HVD_FUSION_THRESHOLD", "2M"},
                  {"HOROVOD_CACHE_CAPACITY", "9"},
                  {NULL, NULL}};
    var bad[] = {{"HOROVOD_CACHE_CAPACITY", "many"}, {NULL, NULL}};
    hvd_config c;
    const char *name = "HVD_TIMELINE";

    assert_int_equal(hvd_config_load(table_get, horovod, &c), HVD_OK);
    assert_int_equal(c.fusion_threshold, 32 << 20);
    assert_int_equal(c.cache_capacity, 7);
    assert_string_equal(c.timeline, "/tmp/tl.json");
    assert_int_equal(c.stall_check_s, 11);
    assert_int_equal(c.stall_shutdown_s, 12);

    assert_int_equal(hvd_config_load(table_get, both, &c), HVD_OK);
    assert_int_equal(c.fusion_threshold, 2 << 20);
    assert_int_equal(c.cache_capacity, 9);

    hvd_error_clear();
    assert_int_equal(hvd_config_load(table_get, bad, &c), HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HOROVOD_CACHE_CAPACITY=many"));

    assert_string_equal(hvd_env_horovod_name("HVD_LOG_LEVEL"),
                        "HOROVOD_LOG_LEVEL");
    assert_null(hvd_env_horovod_name("HVD_TRANSPORT"));
    assert_string_equal(hvd_env_lookup(table_get, horovod, &name),
                        "/tmp/tl.json");
    assert_string_equal(name, "HOROVOD_TIMELINE");
}

/* hvdrun's elastic worker: the rendezvous will place it; its id and the
 * rendezvous are required, and a stale HVD_RANK does not count. */
static void elastic(void **state) {
    (void)state;
    var v[] = {{"HVD_ELASTIC", "1"},
               {"HVD_ELASTIC_WORKER", "7"},
               {"HVD_RANK", "0"},
               {"HVD_SIZE", "2"},
               {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
               {"HVD_RENDEZVOUS_PORT", "4711"},
               {"HVD_SECRET", "abc"},
               {"HVD_JOB_ID", "00112233445566778899aabbccddeeff"},
               {NULL, NULL}};
    var no_worker[] = {{"HVD_ELASTIC", "1"},
                       {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
                       {"HVD_RENDEZVOUS_PORT", "4711"},
                       {NULL, NULL}};
    var no_rdv[] = {
        {"HVD_ELASTIC", "1"}, {"HVD_ELASTIC_WORKER", "0"}, {NULL, NULL}};
    var off[] = {
        {"HVD_ELASTIC", "0"}, {"HVD_ELASTIC_WORKER", "3"}, {NULL, NULL}};
    hvd_procinfo pi;

    assert_int_equal(discover(v, &pi), HVD_OK);
    assert_true(pi.elastic);
    assert_int_equal(pi.worker, 7);
    assert_int_equal(pi.rank, -1);
    assert_int_equal(pi.size, -1);
    assert_int_equal(pi.local_rank, -1);
    assert_int_equal(pi.rdv_port, 4711);
    assert_true(pi.have_job_id);
    assert_int_equal(discover(no_worker, &pi), HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_ELASTIC_WORKER"));
    assert_int_equal(discover(no_rdv, &pi), HVD_ERR_INVALID_ARG);
    assert_non_null(strstr(hvd_error_get(), "HVD_RENDEZVOUS_ADDR"));
    assert_int_equal(discover(off, &pi), HVD_OK);
    assert_false(pi.elastic);
    assert_string_equal(pi.source, "single");
}

static void env_parsers(void **state) {
    (void)state;
    uint64_t b;
    int v;

    assert_int_equal(hvd_env_parse_bytes("X", "0", &b), HVD_OK);
    assert_true(b == 0);
    assert_int_equal(hvd_env_parse_bytes("X", "3K", &b), HVD_OK);
    assert_true(b == 3072);
    assert_int_equal(hvd_env_parse_bytes("X", "2GB", &b), HVD_OK);
    assert_true(b == 2ull << 30);
    assert_int_equal(hvd_env_parse_bytes("X", "", &b), HVD_ERR_INVALID_ARG);
    assert_int_equal(hvd_env_parse_bytes("X", "1KK", &b), HVD_ERR_INVALID_ARG);
    assert_int_equal(hvd_env_parse_bool("X", "Yes", &v), HVD_OK);
    assert_int_equal(v, 1);
    assert_int_equal(hvd_env_parse_bool("X", "off", &v), HVD_OK);
    assert_int_equal(v, 0);
    assert_int_equal(hvd_env_parse_bool("X", "maybe", &v), HVD_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(single),
        cmocka_unit_test(hvdrun),
        cmocka_unit_test(openmpi),
        cmocka_unit_test(slurm_and_pmi),
        cmocka_unit_test(malformed),
        cmocka_unit_test(torchrun_one_node),
        cmocka_unit_test(torchrun_two_nodes),
        cmocka_unit_test(hvdrun_inside_torchrun),
        cmocka_unit_test(torchrun_malformed),
        cmocka_unit_test(srun_two_nodes),
        cmocka_unit_test(srun_pmix),
        cmocka_unit_test(slurm_batch_step),
        cmocka_unit_test(pmi_proxies_in_a_step),
        cmocka_unit_test(slurm_malformed),
        cmocka_unit_test(config_defaults_and_values),
        cmocka_unit_test(config_malformed),
        cmocka_unit_test(horovod_aliases),
        cmocka_unit_test(elastic),
        cmocka_unit_test(env_parsers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
