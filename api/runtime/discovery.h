/*
 * Process discovery: who am I in this job, and who started it.
 *
 * Sources, first match wins: hvdrun (HVD_RANK, HVD_SIZE, HVD_LOCAL_RANK,
 * HVD_LOCAL_SIZE, HVD_CROSS_RANK, HVD_CROSS_SIZE, HVD_RENDEZVOUS_ADDR,
 * HVD_RENDEZVOUS_PORT, HVD_SECRET, HVD_JOB_ID), Open MPI
 * (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), torch's env://
 * variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, TORCHELASTIC_RUN_ID,
 * TORCHELASTIC_RESTART_COUNT), Slurm (SLURM_PROCID, SLURM_STEP_NUM_TASKS
 * or SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST, SLURMD_NODENAME,
 * SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_ID, SLURM_STEP_ID; Slurm's batch
 * script, outside any srun step, is a job of one), PMI (PMI_RANK,
 * PMI_SIZE); with none of them, a job of one (but RANK and WORLD_SIZE
 * without MASTER_ADDR/MASTER_PORT are an error, not a job of one). An elastic
 * worker of hvdrun (HVD_ELASTIC=1, HVD_ELASTIC_WORKER) learns its rank and size
 * from the rendezvous. Values a source does not give are -1 and are computed
 * from the host names the ranks exchange at init.
 */
#ifndef HVD_API_DISCOVERY_H
#define HVD_API_DISCOVERY_H

#include <stdint.h>

#include "hvd/types.h"
#include "transport/base/env.h"
#include "transport/transport.h"

typedef struct hvd_procinfo {
    const char *source; /* "hvdrun", "openmpi", "torchrun", "slurm", "pmi",
                           "single" */
    int rank;
    int size;
    int local_rank; /* -1: not given by the launcher */
    int local_size;
    int cross_rank;
    int cross_size;
    /* Rendezvous (hvdrun's variables; also honoured under other
     * launchers). rdv_port is 0 when not given. */
    char rdv_addr[64];
    int rdv_port;
    char secret[256];
    uint8_t job_id[HVD_JOB_ID_LEN];
    int have_job_id;
    /*
     * A launcher that starts the ranks but gives them no channel to meet
     * through (torchrun, Slurm's srun without MPI): rank 0 hosts the
     * rendezvous itself, on rdv_addr (a name or address the other ranks
     * resolve: MASTER_ADDR, the step's first node), on the first free port
     * of [rdv_port, rdv_port + rdv_port_span); the others try the range.
     * job_key names the job for its launcher (run id and restart count,
     * Slurm job and step ids): the job id is derived from it, so a
     * restarted job is a new job. hosted is 0 under every other launcher.
     */
    int hosted;
    int rdv_port_span;
    char job_key[160];
    /* An elastic job's worker (HVD_ELASTIC=1, HVD_ELASTIC_WORKER): rank,
     * size, local and cross ranks are -1 until the rendezvous places it
     * in a generation (hvd_setup_elastic_join). */
    int elastic;
    int worker;
} hvd_procinfo;

/*
 * Fills *info from the variables get() returns. Returns HVD_ERR_INVALID_ARG
 * with a sentence naming the variable for a malformed or inconsistent
 * value (rank >= size, a rank without a size, ...).
 */
hvd_status hvd_discover(hvd_env_get_fn get, void *ctx, hvd_procinfo *info);

#endif
