#include "api/runtime/config.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "transport/base/error.h"
#include "transport/tcp/tcp.h"

#define NS_PER_S 1000000000LL

static hvd_status seconds(hvd_env_get_fn get, void *ctx, const char *name,
                          int64_t *ns) {
    const char *text = hvd_env_lookup(get, ctx, &name);
    long v;

    if (text == NULL)
        return HVD_OK;
    hvd_status st = hvd_env_parse_long(name, text, 1, 7L * 24 * 3600, &v);
    if (st == HVD_OK)
        *ns = (int64_t)v * NS_PER_S;
    return st;
}

static hvd_status bytes(hvd_env_get_fn get, void *ctx, const char *name,
                        uint64_t min, size_t *out) {
    const char *text = hvd_env_lookup(get, ctx, &name);
    uint64_t v;

    if (text == NULL)
        return HVD_OK;
    hvd_status st = hvd_env_parse_bytes(name, text, &v);
    if (st != HVD_OK)
        return st;
    if (v < min || v > ((uint64_t)1 << 40))
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is out of range (%llu bytes to 1T)", name,
                             text, (unsigned long long)min);
    *out = (size_t)v;
    return HVD_OK;
}

static hvd_status integer(hvd_env_get_fn get, void *ctx, const char *name,
                          long min, long max, int *out) {
    const char *text = hvd_env_lookup(get, ctx, &name);
    long v;

    if (text == NULL)
        return HVD_OK;
    hvd_status st = hvd_env_parse_long(name, text, min, max, &v);
    if (st == HVD_OK)
        *out = (int)v;
    return st;
}

/* Parses an algorithm variable; allowed lists the values it takes besides
 * auto, ending with HVD_ALGO_AUTO. */
static hvd_status algorithm(hvd_env_get_fn get, void *ctx, const char *name,
                            const hvd_algo *allowed, hvd_algo *out) {
    const char *text = hvd_env_lookup(get, ctx, &name);
    char names[160] = "auto";
    hvd_algo v;
    int ok = 0;

    if (text == NULL || *text == '\0')
        return HVD_OK;
    for (const hvd_algo *a = allowed; *a != HVD_ALGO_AUTO; a++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof(names) - len, ", %s", hvd_algo_name(*a));
    }
    if (hvd_algo_parse(text, &v) == 0) {
        ok = v == HVD_ALGO_AUTO;
        for (const hvd_algo *a = allowed; *a != HVD_ALGO_AUTO; a++)
            ok |= v == *a;
    }
    if (!ok)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "%s=%s is not one of %s",
                             name, text, names);
    *out = v;
    return HVD_OK;
}

static hvd_status text(hvd_env_get_fn get, void *ctx, const char *name,
                       char *out, size_t outlen) {
    const char *v = hvd_env_lookup(get, ctx, &name);

    if (v == NULL)
        return HVD_OK;
    if (strlen(v) >= outlen)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s is too long (%zu "
                             "characters at most)",
                             name, outlen - 1);
    snprintf(out, outlen, "%s", v);
    return HVD_OK;
}

static const hvd_algo allreduce_algos[] = {
    HVD_ALGO_RING, HVD_ALGO_RD,     HVD_ALGO_RABENSEIFNER, HVD_ALGO_DIRECT,
    HVD_ALGO_HIER, HVD_ALGO_NATIVE, HVD_ALGO_AUTO};
static const hvd_algo bcast_algos[] = {HVD_ALGO_TREE, HVD_ALGO_PIPELINE,
                                       HVD_ALGO_DIRECT, HVD_ALGO_NATIVE,
                                       HVD_ALGO_AUTO};

/* HVD_IB_MR_CACHE: off, on or auto. */
/* A variable of auto (2), on (1) or off (0). */
static hvd_status auto_on_off(hvd_env_get_fn get, void *ctx, const char *name,
                              int *out) {
    const char *v = hvd_env_lookup(get, ctx, &name);
    int b;

    if (v == NULL || *v == '\0')
        return HVD_OK;
    if (strcasecmp(v, "auto") == 0) {
        *out = 2;
        return HVD_OK;
    }
    if (hvd_env_parse_bool(name, v, &b) != HVD_OK)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "%s=%s is not one of auto, on, off", name, v);
    *out = b;
    return HVD_OK;
}

hvd_status hvd_config_load(hvd_env_get_fn get, void *ctx, hvd_config *cfg) {
    hvd_config c;
    hvd_status st;

    memset(&c, 0, sizeof(c));
    snprintf(c.transport, sizeof(c.transport), "auto");
    c.timeout_ns = 300 * NS_PER_S;
    c.start_timeout_ns = 120 * NS_PER_S;
    c.tcp_setup_timeout_ns = 30 * NS_PER_S;
    c.tcp_nsocks = 1;
    c.tcp_stripe_min = 256 * 1024;
    c.ib_gid_index = -1;
    c.ib_chunk_bytes = 128 * 1024;
    c.ib_ring_chunks = 8;
    c.ib_mr_cache = 2;
    c.ib_gpudirect = 2;
    hvd_comm_config_default(&c.comm);
    c.fusion_threshold = 64 * 1024 * 1024;
    c.fusion_tensor_max = 256 * 1024;
    c.cache_capacity = 1024;
    c.cycle_time_ms = 0;
    c.gpu_device = -1;
    c.gpu_stage_bytes = 1024 * 1024;
    c.gpu_stage_depth = 4;
    int stall_check = 60, stall_shutdown = 0;

    st = text(get, ctx, "HVD_TRANSPORT", c.transport, sizeof(c.transport));
    if (st == HVD_OK)
        st = text(get, ctx, "HVD_IFACE", c.iface, sizeof(c.iface));
    if (st == HVD_OK)
        st = text(get, ctx, "HVD_HOSTNAME", c.hostname, sizeof(c.hostname));
    if (st == HVD_OK)
        st = seconds(get, ctx, "HVD_TIMEOUT_SECONDS", &c.timeout_ns);
    if (st == HVD_OK)
        st =
            seconds(get, ctx, "HVD_START_TIMEOUT_SECONDS", &c.start_timeout_ns);
    if (st == HVD_OK)
        st =
            seconds(get, ctx, "HVD_TCP_SETUP_SECONDS", &c.tcp_setup_timeout_ns);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_TCP_NSOCKS", 1, HVD_TCP_MAX_SOCKS,
                     &c.tcp_nsocks);
    if (st == HVD_OK)
        st = bytes(get, ctx, "HVD_TCP_STRIPE_MIN", 64, &c.tcp_stripe_min);
    if (st == HVD_OK)
        st = text(get, ctx, "HVD_IB_DEVICE", c.ib_device, sizeof(c.ib_device));
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_IB_PORT", 1, 255, &c.ib_port);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_IB_GID_INDEX", 0, 65534, &c.ib_gid_index);
    if (st == HVD_OK)
        st = bytes(get, ctx, "HVD_IB_CHUNK_BYTES", 4096, &c.ib_chunk_bytes);
    if (st == HVD_OK && c.ib_chunk_bytes > ((size_t)1 << 30))
        st = hvd_error_set(HVD_ERR_INVALID_ARG,
                           "HVD_IB_CHUNK_BYTES=%zu is out of range (4K to 1G)",
                           c.ib_chunk_bytes);
    if (st == HVD_OK)
        st =
            integer(get, ctx, "HVD_IB_RING_CHUNKS", 1, 1024, &c.ib_ring_chunks);
    if (st == HVD_OK)
        st = auto_on_off(get, ctx, "HVD_IB_MR_CACHE", &c.ib_mr_cache);
    if (st == HVD_OK)
        st = auto_on_off(get, ctx, "HVD_IB_GPUDIRECT", &c.ib_gpudirect);
    if (st == HVD_OK && get("HVD_CHUNK_BYTES", ctx) != NULL) {
        st = bytes(get, ctx, "HVD_CHUNK_BYTES", 64, &c.comm.chunk_bytes);
        c.chunk_forced = 1;
    }
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_PIPELINE_DEPTH", 1, 16, &c.comm.depth);
    if (st == HVD_OK)
        st = algorithm(get, ctx, "HVD_ALGORITHM", allreduce_algos,
                       &c.comm.allreduce_algo);
    if (st == HVD_OK)
        st = algorithm(get, ctx, "HVD_BCAST_ALGORITHM", bcast_algos,
                       &c.comm.bcast_algo);
    if (st == HVD_OK)
        st = text(get, ctx, "HVD_TUNING_FILE", c.tuning_file,
                  sizeof(c.tuning_file));
    if (st == HVD_OK)
        st = bytes(get, ctx, "HVD_FUSION_THRESHOLD", 0, &c.fusion_threshold);
    if (st == HVD_OK)
        st = bytes(get, ctx, "HVD_FUSION_TENSOR_MAX", 0, &c.fusion_tensor_max);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_CACHE_CAPACITY", 0, 1 << 20,
                     &c.cache_capacity);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_CYCLE_TIME_MS", 0, 1000, &c.cycle_time_ms);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_STALL_CHECK_SECONDS", 0, 7 * 24 * 3600,
                     &stall_check);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_STALL_SHUTDOWN_SECONDS", 0, 7 * 24 * 3600,
                     &stall_shutdown);
    if (st == HVD_OK)
        st = text(get, ctx, "HVD_TIMELINE", c.timeline, sizeof(c.timeline));
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_TIMELINE_MARK_CYCLES", 0, 1,
                     &c.timeline_mark_cycles);
    if (st == HVD_OK)
        st = integer(get, ctx, "HVD_GPU_DEVICE", 0, 1023, &c.gpu_device);
    if (st == HVD_OK)
        st = bytes(get, ctx, "HVD_GPU_STAGE_BYTES", 4096, &c.gpu_stage_bytes);
    if (st == HVD_OK)
        st =
            integer(get, ctx, "HVD_GPU_STAGE_DEPTH", 2, 64, &c.gpu_stage_depth);
    c.stall_check_s = stall_check;
    c.stall_shutdown_s = stall_shutdown;
    if (st != HVD_OK)
        return st;
    *cfg = c;
    return HVD_OK;
}
