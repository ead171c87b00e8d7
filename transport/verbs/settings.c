/*
 * The verbs transport's settings table (transport/verbs/settings.h).
 */
#include "transport/verbs/settings.h"

const hvd_setting hvd_verbs_settings_table[HVD_VERBS_NSETTINGS] = {
    {"HVD_IB_DEVICE", HVD_SETTING_TEXT,
     HVD_SETTING_AT(hvd_verbs_settings, device), "", 0, 0,
     "the RDMA device, as ibv_devices names it"},
    {"HVD_IB_PORT", HVD_SETTING_INT, HVD_SETTING_AT(hvd_verbs_settings, port),
     "0", 1, 255, "the port of that device"},
    {"HVD_IB_GID_INDEX", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_verbs_settings, gid_index), "-1", 0, 65534,
     "the GID table index on a RoCE port"},
    {"HVD_IB_CHUNK_BYTES", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_verbs_settings, chunk_bytes), "128K", 4096, 1LL << 30,
     "one slot of the receive ring per peer"},
    {"HVD_IB_RING_CHUNKS", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_verbs_settings, ring_chunks), "8", 1, 1024,
     "slots of that ring"},
    {"HVD_IB_MR_CACHE", HVD_SETTING_AUTO_ON_OFF,
     HVD_SETTING_AT(hvd_verbs_settings, mr_cache), "auto", 0, 0,
     "register the caller's buffers: auto, on or off"},
    {"HVD_IB_GPUDIRECT", HVD_SETTING_AUTO_ON_OFF,
     HVD_SETTING_AT(hvd_verbs_settings, gpudirect), "auto", 0, 0,
     "CUDA device memory over RDMA: auto, on or off"},
};
