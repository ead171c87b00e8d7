#include "api/runtime/config.h"

#include <stdio.h>
#include <string.h>

#include "transport/base/error.h"
#include "transport/transport.h"

#define DAY_S (7LL * 24 * 3600)
#define TERA (1LL << 40)

/* The runtime's variables (the algorithms are read by hand below). Those
 * without a default keep hvd_comm_config_default's. */
static const hvd_setting settings[] = {
    {"HVD_CHUNK_BYTES", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_config, comm.chunk_bytes), NULL, 64, TERA,
     "pipeline chunk; set, it also fixes shared memory's"},
    {"HVD_TRANSPORT", HVD_SETTING_TEXT, HVD_SETTING_AT(hvd_config, transport),
     "auto", 0, 0, "auto, tcp, shm, mpi, verbs or nccl"},
    {"HVD_HOSTNAME", HVD_SETTING_TEXT, HVD_SETTING_AT(hvd_config, hostname), "",
     0, 0, "the host this rank counts as"},
    {"HVD_TIMEOUT_SECONDS", HVD_SETTING_SECONDS,
     HVD_SETTING_AT(hvd_config, timeout_ns), "300", 1, DAY_S,
     "a peer may stall this long mid-operation"},
    {"HVD_START_TIMEOUT_SECONDS", HVD_SETTING_SECONDS,
     HVD_SETTING_AT(hvd_config, start_timeout_ns), "120", 1, DAY_S,
     "bound on hvd_init"},
    {"HVD_ELASTIC_TIMEOUT_SECONDS", HVD_SETTING_SECONDS,
     HVD_SETTING_AT(hvd_config, elastic_timeout_ns), "600", 1, DAY_S,
     "elastic: bound on joining a generation"},
    {"HVD_PIPELINE_DEPTH", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, comm.depth), NULL, 1, 16,
     "chunks in flight per peer"},
    {"HVD_TUNING_FILE", HVD_SETTING_TEXT,
     HVD_SETTING_AT(hvd_config, tuning_file), "", 0, 0,
     "the selector's table, from hvd-tune"},
    {"HVD_FUSION_THRESHOLD", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_config, fusion_threshold), "64M", 0, TERA,
     "fusion buffer size"},
    {"HVD_FUSION_TENSOR_MAX", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_config, fusion_tensor_max), "256K", 0, TERA,
     "largest tensor fused"},
    {"HVD_STEP_CARRY_BYTES", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_config, step_carry_bytes), "64K", 0, TERA,
     "cached allreduce bytes a rank sends in its step message"},
    {"HVD_CALLER_PROGRESS", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, caller_progress), "1", 0, 1,
     "a thread that waits runs the engine itself"},
    {"HVD_SPIN_US", HVD_SETTING_INT, HVD_SETTING_AT(hvd_config, spin_us), "-1",
     -1, 1000000, "a waiting thread polls this long before it blocks"},
    {"HVD_CACHE_CAPACITY", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, cache_capacity), "1024", 0, 1 << 20,
     "response cache entries"},
    {"HVD_CYCLE_TIME_MS", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, cycle_time_ms), "0", 0, 1000,
     "engine cycle time"},
    {"HVD_STALL_CHECK_SECONDS", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, stall_check_s), "60", 0, DAY_S,
     "warn about stalled tensors after this long"},
    {"HVD_STALL_SHUTDOWN_SECONDS", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, stall_shutdown_s), "0", 0, DAY_S,
     "fail stalled tensors after this long"},
    {"HVD_TIMELINE", HVD_SETTING_TEXT, HVD_SETTING_AT(hvd_config, timeline), "",
     0, 0, "timeline file"},
    {"HVD_TIMELINE_MARK_CYCLES", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, timeline_mark_cycles), "0", 0, 1,
     "mark engine cycles in the timeline"},
    {"HVD_GPU_DEVICE", HVD_SETTING_INT, HVD_SETTING_AT(hvd_config, gpu_device),
     "-1", 0, 1023, "this rank's CUDA device"},
    {"HVD_GPU_STAGE_BYTES", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_config, gpu_stage_bytes), "1M", 4096, TERA,
     "staging buffer size"},
    {"HVD_GPU_STAGE_DEPTH", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_config, gpu_stage_depth), "4", 2, 64,
     "staging buffers in flight"},
};

/* Parses an algorithm variable; allowed lists the values it takes besides
 * auto (HVD_ALGO_UNFORCED), ending with HVD_ALGO_UNFORCED. */
static hvd_status algorithm(hvd_env_get_fn get, void *ctx, const char *name,
                            const hvd_algo *allowed, hvd_algo *out) {
    const char *text = hvd_env_lookup(get, ctx, &name);
    char names[160] = "auto";
    hvd_algo v;
    int ok = 0;

    if (text == NULL || *text == '\0')
        return HVD_OK;
    for (const hvd_algo *a = allowed; *a != HVD_ALGO_UNFORCED; a++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof(names) - len, ", %s", hvd_algo_name(*a));
    }
    if (hvd_algo_parse(text, &v) == 0) {
        ok = v == HVD_ALGO_UNFORCED;
        for (const hvd_algo *a = allowed; *a != HVD_ALGO_UNFORCED; a++)
            ok |= v == *a;
    }
    if (!ok)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s=%s is not one of %s",
                             name, text, names);
    *out = v;
    return HVD_OK;
}

static const hvd_algo allreduce_algos[] = {
    HVD_ALGO_RING, HVD_ALGO_RD,     HVD_ALGO_RABENSEIFNER, HVD_ALGO_DIRECT,
    HVD_ALGO_HIER, HVD_ALGO_NATIVE, HVD_ALGO_UNFORCED};
static const hvd_algo bcast_algos[] = {HVD_ALGO_TREE, HVD_ALGO_PIPELINE,
                                       HVD_ALGO_DIRECT, HVD_ALGO_NATIVE,
                                       HVD_ALGO_UNFORCED};

hvd_status hvd_config_load(hvd_env_get_fn get, void *ctx, hvd_config *cfg) {
    hvd_config c;
    hvd_status st;

    memset(&c, 0, sizeof(c));
    hvd_comm_config_default(&c.comm);
    c.chunk_forced = get("HVD_CHUNK_BYTES", ctx) != NULL;
    st = hvd_env_read_settings(settings, sizeof(settings) / sizeof(settings[0]),
                               get, ctx, &c);
    if (st == HVD_OK)
        st = algorithm(get, ctx, "HVD_ALGORITHM", allreduce_algos,
                       &c.comm.allreduce_algo);
    if (st == HVD_OK)
        st = algorithm(get, ctx, "HVD_BCAST_ALGORITHM", bcast_algos,
                       &c.comm.bcast_algo);
    if (st == HVD_OK)
        st = hvd_transport_check_settings(get, ctx);
    if (st != HVD_OK)
        return st;
    /* Horovod's HOROVOD_TIMELINE=DYNAMIC means "no timeline until
     * start_timeline() names a file" (its own tests set it), not a file
     * named DYNAMIC. */
    if (strcmp(c.timeline, "DYNAMIC") == 0)
        c.timeline[0] = '\0';
    *cfg = c;
    return HVD_OK;
}
