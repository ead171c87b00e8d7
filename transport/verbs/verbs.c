/* The verbs transport (verbs.h): its ops table, and nothing else, as every
 * transport's <t>.c. The entries it names are in setup.c, progress.c and
 * entries.c; the files of the transport and the one way their calls go:
 * verbs_internal.h. */

#include "transport/verbs/verbs_internal.h"

const hvd_transport_ops hvd_verbs_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "verbs",
    .title = "RDMA",
    .settings = hvd_verbs_settings_table,
    .nsettings = HVD_VERBS_NSETTINGS,
    .settings_size = sizeof(hvd_verbs_settings),
    .probe = hvd_vb_entry_probe,
    .open = hvd_vb_entry_open,
    .isend = hvd_vb_isend,
    .irecv = hvd_vb_irecv,
    .irecv_upto = hvd_vb_irecv_upto,
    .progress = hvd_vb_progress,
    .wake = hvd_vb_wake,
    .shutdown = hvd_vb_shutdown,
    .close = hvd_vb_close,
    .mem_types = hvd_vb_mem_types,
};
