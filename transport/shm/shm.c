/*
 * The shared-memory transport's ops table (transport/shm/shm.h); its files
 * are listed in shm_internal.h.
 */
#include "transport/shm/shm_internal.h"

const hvd_transport_ops hvd_shm_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "shm",
    .title = "shared memory",
    .settings = hvd_shm_settings_table,
    .nsettings = HVD_SHM_NSETTINGS,
    .settings_size = sizeof(hvd_shm_settings),
    .probe = hvd_shm_probe,
    .open = hvd_shm_open,
    .isend = hvd_shm_isend,
    .irecv = hvd_shm_irecv,
    .irecv_upto = hvd_shm_irecv_upto,
    .progress = hvd_shm_progress,
    .wake = hvd_shm_wake,
    .shutdown = hvd_shm_shutdown,
    .close = hvd_shm_close,
    .get = hvd_shm_get,
    .can_get = hvd_shm_can_get,
    .expose = hvd_shm_expose,
    .cleanup_job = hvd_shm_cleanup_job,
};
