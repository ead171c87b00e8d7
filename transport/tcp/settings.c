/*
 * The TCP transport's own settings: the HVD_* variables it reads, parsed by
 * the shared env code from this table (transport/base/env.h).
 */
#include <stddef.h>

#include "transport/tcp/tcp.h"

const hvd_setting hvd_tcp_settings_table[HVD_TCP_NSETTINGS] = {
    {"HVD_TCP_NSOCKS", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_tcp_settings, nsocks), "1", 1, HVD_TCP_MAX_SOCKS,
     "TCP connections per pair of ranks"},
    {"HVD_TCP_STRIPE_MIN", HVD_SETTING_BYTES,
     HVD_SETTING_AT(hvd_tcp_settings, stripe_min), "256K", 64, 1LL << 40,
     "messages from this size are striped across the sockets"},
    {"HVD_TCP_SETUP_SECONDS", HVD_SETTING_SECONDS,
     HVD_SETTING_AT(hvd_tcp_settings, setup_ns), "30", 1, 7LL * 24 * 3600,
     "how long the mesh may take to set up while another transport can "
     "take over"},
    {"HVD_IFACE", HVD_SETTING_TEXT, HVD_SETTING_AT(hvd_tcp_settings, iface), "",
     0, 0, "the network interface to listen on"},
    {"HVD_TCP_PROTECT", HVD_SETTING_CHOICE,
     HVD_SETTING_AT(hvd_tcp_settings, protect), HVD_TCP_PROTECT_DEFAULT, 0, 0,
     "protection of frames after the handshake: none, integrity (every "
     "frame authenticated) or encrypt (encrypted and authenticated)",
     "none|integrity|encrypt"},
    /* A waiting rank that sleeps in epoll_wait is woken by the peer's
     * segment through the scheduler: a wait on the data socket cost 2-3
     * times an engine step, which polls. Polling the sockets for a while
     * first takes the reply as it lands; it is skipped on a busy host,
     * where it would hold off the peer's wake-up (progress.c). */
    {"HVD_TCP_SPIN_US", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_tcp_settings, spin_us), "100", 0, 1000000,
     "microseconds a waiting rank polls its sockets before it sleeps in "
     "epoll_wait"},
};
