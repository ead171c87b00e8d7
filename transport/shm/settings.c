/*
 * The shared-memory transport's own settings: the HVD_* variables it reads,
 * parsed by the shared env code from this table (transport/base/env.h).
 */
#include <stddef.h>

#include "transport/shm/shm_internal.h"

const hvd_setting hvd_shm_settings_table[HVD_SHM_NSETTINGS] = {
    {"HVD_SHM_CMA", HVD_SETTING_INT, HVD_SETTING_AT(hvd_shm_settings, cma), "1",
     0, 1,
     "0: large messages stream through the segments, never by "
     "process_vm_readv"},
    /* The spin yields the core at every look, so it costs the peers
     * nothing even when the host has fewer cores than ranks: there it
     * saves the futex wake-up of every message (np 4 on 2 cores: a 512 KiB
     * allreduce 1.6x faster). 200 us is long enough for the peer's reply
     * to come while this rank still spins once both are running; a futex
     * wake-up alone costs about 10 us, and far more on a loaded host. */
    {"HVD_SHM_SPIN_US", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_shm_settings, spin_us), "200", 0, 1000000,
     "microseconds a waiting rank spins before it sleeps on its futex"},
    {"HVD_SHM_HUGEPAGES", HVD_SETTING_INT,
     HVD_SETTING_AT(hvd_shm_settings, hugepages), "1", 0, 1,
     "0: buffers of 4 MiB or more that the peers read (large allreduces) "
     "are not collapsed into huge pages"},
};
