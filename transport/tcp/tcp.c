/*
 * The TCP transport's ops table (transport/tcp/tcp.h); its files are listed
 * in tcp_internal.h.
 */
#include "transport/tcp/tcp_internal.h"

const hvd_transport_ops hvd_tcp_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "tcp",
    .title = "TCP",
    .settings = hvd_tcp_settings_table,
    .nsettings = HVD_TCP_NSETTINGS,
    .settings_size = sizeof(hvd_tcp_settings),
    .probe = hvd_tcp_probe,
    .open = hvd_tcp_open,
    .isend = hvd_tcp_isend,
    .irecv = hvd_tcp_irecv,
    .irecv_upto = hvd_tcp_irecv_upto,
    .isendv = hvd_tcp_isendv,
    .progress = hvd_tcp_progress,
    .wake = hvd_tcp_wake,
    .shutdown = hvd_tcp_shutdown,
    .close = hvd_tcp_close,
};
