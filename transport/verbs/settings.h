/*
 * The verbs transport's own settings (HVD_IB_*, docs/environment.md), read
 * from params->env at probe and open by the shared env code from the table
 * in transport/verbs/settings.c.
 */
#ifndef HVD_TRANSPORT_VERBS_SETTINGS_H
#define HVD_TRANSPORT_VERBS_SETTINGS_H

#include <stddef.h>

#include "transport/base/env.h"

typedef struct hvd_verbs_settings {
    char device[64];    /* HVD_IB_DEVICE; "": the first with an active port */
    int port;           /* HVD_IB_PORT; 0: the first active port */
    int gid_index;      /* HVD_IB_GID_INDEX; -1: chosen (RoCE v2, IPv4) */
    size_t chunk_bytes; /* HVD_IB_CHUNK_BYTES: receive ring slot */
    int ring_chunks;    /* HVD_IB_RING_CHUNKS: slots of the data ring */
    int mr_cache;       /* HVD_IB_MR_CACHE: register user buffers: 0 never,
                           1 always, 2 where the device pages on demand */
    int gpudirect;      /* HVD_IB_GPUDIRECT: device memory over RDMA: 0
                           never, 1 required, 2 where every rank can */
} hvd_verbs_settings;

#define HVD_VERBS_NSETTINGS 7
extern const hvd_setting hvd_verbs_settings_table[HVD_VERBS_NSETTINGS];

#endif
