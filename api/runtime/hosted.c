#include "api/runtime/hosted.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "transport/base/clock.h"
#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/bootstrap/job_id.h"
#include "transport/bootstrap/munge.h"
#include "transport/bootstrap/rendezvous.h"

/* hvd_init calls of this process that hosted or joined a hosted
 * rendezvous: folded into the job id, so that a rank's next hvd_init
 * never joins a server of its last one (hvd_init holds its lock). */
static uint32_t hosted_inits;

/* Rank 0's warning that a hosted job is not authenticated. */
static void warn_unauthenticated(const hvd_procinfo *info, const char *why) {
    if (strcmp(info->source, "slurm") == 0)
        HVD_WARN("api",
                 "this job is not authenticated: srun gives no secret, and "
                 "munge cannot be used (%s); export HVD_SECRET (the same on "
                 "every rank) to authenticate it, or run munged",
                 why);
    else
        HVD_WARN("api",
                 "this job is not authenticated: %s gives no secret, as "
                 "torch's own c10d store is not; export HVD_SECRET (the same "
                 "on every rank, e.g. from a Kubernetes Secret) to "
                 "authenticate it",
                 info->source);
}

/*
 * A hosted job's identity (info->hosted): the job id is the first 16
 * bytes of SHA-256(job_key), so a job its launcher restarts (the restart
 * count is in the key) is a new job, and a rank of the old one is
 * refused. The secret, in this order: HVD_SECRET when the user gives one;
 * under srun where munge works, a random one rank 0 makes and hands the
 * others in munge credentials (*munge on; the others learn it when they
 * join); else one derived from job_key, which anyone who can reach the
 * port may know: rank 0 then warns, once, that the job is not
 * authenticated. why gets why munge is not used (under srun).
 */
static hvd_status hosted_identity(hvd_procinfo *info, hvd_rdv_munge *munge,
                                  char why[200]) {
    uint8_t digest[SHA256_DIGEST_LENGTH];
    char keyed[sizeof(info->job_key) + 32];

    SHA256((const unsigned char *)info->job_key, strlen(info->job_key), digest);
    hvd_job_id_of_generation(digest, hosted_inits++, info->job_id);
    info->have_job_id = 1;
    munge->on = 0;
    munge->socket = hvd_env_getenv("HVD_MUNGE_SOCKET", NULL);
    if (info->secret[0] != '\0')
        return HVD_OK;
    if (strcmp(info->source, "slurm") == 0 &&
        hvd_munge_usable(munge->socket, why, 200)) {
        munge->on = 1;
        if (info->rank != 0)
            return HVD_OK;
        if (RAND_bytes(digest, sizeof(digest)) != 1)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "RAND_bytes failed to make a job secret");
    } else {
        snprintf(keyed, sizeof(keyed), "hvd hosted secret|%s", info->job_key);
        SHA256((const unsigned char *)keyed, strlen(keyed), digest);
        if (info->rank == 0)
            warn_unauthenticated(info, why);
    }
    for (size_t i = 0; i < sizeof(digest); i++)
        snprintf(info->secret + 2 * i, 3, "%02x", digest[i]);
    return HVD_OK;
}

/* Resolves name, again until deadline while it does not: a Kubernetes
 * service's name (MASTER_ADDR of a PyTorchJob) may resolve only once its
 * pod runs, after the other pods started. */
static hvd_status resolve(const char *name, int64_t deadline, char addr[64]) {
    hvd_status st = hvd_rdv_resolve(name, addr);

    while (st == HVD_ERR_INVALID_ARG && hvd_now_ns() < deadline) {
        poll(NULL, 0, 250);
        st = hvd_rdv_resolve(name, addr);
    }
    if (st != HVD_OK) {
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        st = hvd_error_set(st,
                           "%s (until the start timeout, "
                           "HVD_START_TIMEOUT_SECONDS)",
                           text);
    }
    return st;
}

/*
 * The rendezvous of a launcher that gives none (torchrun, srun without
 * MPI): rank 0 hosts it in a thread of its own on the first free port of
 * the range, and every rank, rank 0 too, joins it as a client.
 */
hvd_status hvd_setup_open_hosted(hvd_setup *s, hvd_bootstrap **bs_out,
                                 char local_addr_out[64]) {
    hvd_procinfo *info = &s->info;
    hvd_rdv_munge munge;
    char addr[64], why[200] = "";
    int port = info->rdv_port, span = info->rdv_port_span;
    int64_t deadline = hvd_now_ns() + s->cfg.start_timeout_ns;
    hvd_status st = hosted_identity(info, &munge, why);

    if (st == HVD_OK)
        st = resolve(info->rdv_addr, deadline, addr);
    if (st == HVD_OK && info->rank == 0) {
        st = hvd_rdv_host_start(addr, port, span, info->size, info->job_id,
                                info->secret, &munge, &s->rdv_host);
        if (st == HVD_OK) {
            port = hvd_rdv_host_port(s->rdv_host);
            span = 1;
        }
        munge.on = 0; /* rank 0 made the secret */
    }
    if (st == HVD_OK)
        st = hvd_rdv_client_connect_range(
            addr, port, span, info->rank, info->size, info->job_id,
            info->secret, sizeof(info->secret), &munge, deadline - hvd_now_ns(),
            bs_out, local_addr_out);
    /* Under srun, munge working on rank 0's node and not on this one
     * gives two secrets: say so. */
    if (st == HVD_ERR_AUTH && why[0] != '\0') {
        char text[HVD_ERROR_MAX];
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        st = hvd_error_set(st,
                           "%s (this rank cannot use munge: %s; if rank 0's "
                           "node can, it made another secret)",
                           text, why);
    }
    /* Rank 0's own server failing says more than the client's wait. */
    if (st != HVD_OK && s->rdv_host != NULL &&
        hvd_rdv_host_status(s->rdv_host) != HVD_OK)
        st = hvd_rdv_host_status(s->rdv_host);
    return st;
}
