/*
 * The runtime's configuration from HVD_* environment variables
 * (docs/environment.md lists each one). Read once in hvd_init; every rank
 * must see the same values for the ones that shape messages (algorithms,
 * chunk sizes). Each transport reads its own settings (HVD_TCP_*, HVD_IB_*,
 * HVD_IFACE) from its table (transport/transport.h, settings).
 */
#ifndef HVD_API_CONFIG_H
#define HVD_API_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/comm.h"
#include "hvd/types.h"
#include "transport/base/env.h"

typedef struct hvd_config {
    char transport[16];         /* HVD_TRANSPORT: auto, tcp, ... */
    char hostname[64];          /* HVD_HOSTNAME, "" = gethostname() */
    int64_t timeout_ns;         /* HVD_TIMEOUT_SECONDS */
    int64_t start_timeout_ns;   /* HVD_START_TIMEOUT_SECONDS */
    int64_t elastic_timeout_ns; /* HVD_ELASTIC_TIMEOUT_SECONDS */
    hvd_comm_config comm;       /* HVD_CHUNK_BYTES, HVD_PIPELINE_DEPTH,
                                   HVD_ALGORITHM, HVD_BCAST_ALGORITHM */
    int chunk_forced;           /* HVD_CHUNK_BYTES was set */
    char tuning_file[512];      /* HVD_TUNING_FILE */
    size_t fusion_threshold;    /* HVD_FUSION_THRESHOLD */
    size_t fusion_tensor_max;   /* HVD_FUSION_TENSOR_MAX */
    size_t step_carry_bytes;    /* HVD_STEP_CARRY_BYTES */
    int caller_progress;        /* HVD_CALLER_PROGRESS */
    int spin_us;                /* HVD_SPIN_US; -1: chosen by the job */
    int cache_capacity;         /* HVD_CACHE_CAPACITY */
    int cycle_time_ms;          /* HVD_CYCLE_TIME_MS */
    int stall_check_s;          /* HVD_STALL_CHECK_SECONDS */
    int stall_shutdown_s;       /* HVD_STALL_SHUTDOWN_SECONDS */
    char timeline[512];         /* HVD_TIMELINE */
    int timeline_mark_cycles;   /* HVD_TIMELINE_MARK_CYCLES: 0 or 1 */
    int gpu_device;             /* HVD_GPU_DEVICE, -1: the local rank */
    size_t gpu_stage_bytes;     /* HVD_GPU_STAGE_BYTES (same everywhere) */
    int gpu_stage_depth;        /* HVD_GPU_STAGE_DEPTH */
} hvd_config;

/* Defaults, then the variables get() returns, the runtime's and every
 * built-in transport's (so that a malformed HVD_IB_PORT fails hvd_init even
 * where RDMA is not used); a malformed value is HVD_ERR_INVALID_ARG with a
 * sentence naming it. */
hvd_status hvd_config_load(hvd_env_get_fn get, void *ctx, hvd_config *cfg);

#endif
