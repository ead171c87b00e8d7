/*
 * The bootstrap of a job whose launcher gives no rendezvous (torchrun,
 * Slurm's srun without MPI: hvd_procinfo.hosted): its identity (job id
 * and secret: HVD_SECRET, munge under srun, or one derived from the
 * launcher's job key) and the rendezvous rank 0 hosts, which every rank
 * joins (transport/bootstrap/rendezvous.h). setup.c's open_bootstrap
 * calls it.
 */
#ifndef HVD_API_RUNTIME_HOSTED_H
#define HVD_API_RUNTIME_HOSTED_H

#include "api/runtime/setup.h"

/*
 * Rank 0 starts the rendezvous (s->rdv_host, stopped by
 * hvd_setup_close); every rank joins it. Sets s->info's job id and
 * secret; *bs_out and local_addr_out as the other bootstraps. Bounded by
 * the start timeout.
 */
hvd_status hvd_setup_open_hosted(hvd_setup *s, hvd_bootstrap **bs_out,
                                 char local_addr_out[64]);

#endif
