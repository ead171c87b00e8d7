/*
 * The job's setup, below the public entry points: the bootstrap (hvdrun's
 * rendezvous or MPI), where every rank runs, the GPU and NCCL choice, the
 * transports (the registry's choice, transport/choose.h), the paths and
 * the selector's table, and the engine's configuration. api/hvd.c calls it
 * from hvd_init and hvd_shutdown, under its lock.
 */
#ifndef HVD_API_RUNTIME_SETUP_H
#define HVD_API_RUNTIME_SETUP_H

#include <stdint.h>

#include "api/runtime/config.h"
#include "api/runtime/devexec.h"
#include "api/runtime/discovery.h"
#include "api/runtime/engine.h"
#include "collectives/select.h"
#include "transport/bootstrap/rendezvous.h"
#include "transport/choose.h"

typedef struct hvd_setup {
    hvd_procinfo info;
    hvd_config cfg;
    hvd_transport_choice tps; /* the open transports (a job of several) */
    hvd_paths paths;
    int have_paths;
    int homogeneous;  /* every host runs as many ranks (hvd_is_homogeneous) */
    int gpu_device;   /* this rank's CUDA device, -1: none */
    int nccl;         /* HVD_NCCL_* (api/runtime/devexec.h) */
    int nccl_have_id; /* nccl_id is rank 0's */
    uint8_t nccl_id[HVD_NCCL_ID_BYTES];
    unsigned tp_mem_types; /* what the primary carries (HVD_MEM_BIT) */
    /* An elastic job (docs/elastic.md): this generation's rendezvous
     * connection, open while it lives (hvdrun's notices come on it), the
     * address it used, hvdrun's job id (info.job_id is the generation's)
     * and the generation. */
    hvd_bootstrap *elastic_bs;
    char elastic_addr[64];
    uint8_t elastic_job_id[HVD_JOB_ID_LEN];
    int have_elastic_job_id;
    uint32_t generation;
    /* Rank 0 of a job whose launcher gives no rendezvous (info.hosted):
     * the one it hosts, until its thread ends and hvd_setup_close joins
     * it. */
    hvd_rdv_host *rdv_host;
} hvd_setup;

/*
 * Before anything else (info and cfg are loaded): what HVD_TRANSPORT says
 * about NCCL, whether this rank can honour it, and its CUDA device.
 */
hvd_status hvd_setup_gpu(hvd_setup *s);

/*
 * A job of several: the bootstrap, the ranks' hosts, NCCL's agreement, the
 * transports and the paths. Collective; bounded by the start timeout. On
 * failure what was opened stays for hvd_setup_close.
 */
hvd_status hvd_setup_job(hvd_setup *s);

/* The engine's configuration from the setup. */
void hvd_setup_engine_config(const hvd_setup *s, hvd_engine_config *ec);

/*
 * An elastic worker (info.elastic): joins the rendezvous's next generation
 * and takes its place there (rank, size, local and cross ranks, the
 * generation's job id). Bounded by HVD_ELASTIC_TIMEOUT_SECONDS.
 */
hvd_status hvd_setup_elastic_join(hvd_setup *s);

/* Notices hvdrun pushed since the join (hvd_rdv_client_updates): 0 or
 * more, -1 if the connection to hvdrun broke; 0 outside an elastic job. */
int hvd_setup_elastic_updates(hvd_setup *s);

/* Orderly goodbye on the transports (collective; after the engine
 * stopped). */
hvd_status hvd_setup_goodbye(hvd_setup *s);

/* Frees the paths, closes every transport (after the engine stopped) and
 * stops the rendezvous rank 0 hosts. */
void hvd_setup_close(hvd_setup *s);

#endif
