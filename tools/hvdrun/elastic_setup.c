/*
 * Elastic mode's setup and teardown (elastic.c tells the whole mode): the
 * workers' environment, the first host list, the counts (-np, --min-np,
 * --max-np, how many worker ids), and the elastic rendezvous server.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* Worker ids of a job without --reset-limit (or --max-np). */
#define UNLIMITED_WORKER_IDS 4096
#define MAX_WORKER_IDS 16384 /* the server keeps a record per id */

/* Variables hvdrun sets for each elastic worker. */
const char *const elastic_vars[] = {"HVD_ELASTIC", "HVD_ELASTIC_WORKER",
                                    "HVD_ELASTIC_TIMEOUT_SECONDS",
                                    "HVD_HOSTNAME"};

/* The elastic state, /dev/null for the discovery script's stdin, and the
 * working directory remote workers run in. */
static int setup_state(struct job *job) {
    struct elastic *el = calloc(1, sizeof(*el));

    if (el == NULL) {
        say("out of memory");
        return -1;
    }
    job->el = el;
    el->disc_fd = -1;
    el->finish_code = -1;
    srandom((unsigned)time(NULL) ^ (unsigned)getpid());
    job->stdin_to_rank0 = 0;
    job->null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (job->null_fd < 0) {
        say("open(/dev/null) failed: %s", strerror(errno));
        return -1;
    }
    if (getcwd(job->cwd, sizeof(job->cwd)) == NULL)
        job->cwd[0] = '\0'; /* said when a remote worker needs it */
    return 0;
}

/* The workers' environment, less what the rendezvous adds later. */
static int setup_env(struct job *job) {
    const struct options *opt = job->opt;

    switch (env_build(&job->env, opt)) {
    case 0:
        break;
    case -2:
        return -1;
    default:
        say("out of memory");
        return -1;
    }
    /* The rendezvous assigns ranks per generation: an outer value of these
     * would be wrong. */
    for (size_t k = 0; k < ARRAY_LEN(job_vars); k++)
        env_unset(&job->env, job_vars[k]);
    /* A worker waits to be placed longer than hvdrun waits before it
     * acts (stops the workers that do not rejoin, or ends the job), so
     * the decision is hvdrun's, not a race between the two clocks. */
    if (env_set(&job->env, "HVD_ELASTIC", "1") != 0 ||
        env_set_int(&job->env, "HVD_ELASTIC_TIMEOUT_SECONDS",
                    2 * opt->elastic_timeout_s + 10) != 0) {
        say("out of memory");
        return -1;
    }
    return binding_setup(job);
}

/* The first host list: the discovery script's, else -H/--hostfile's, else
 * localhost with --slots slots (default: -np, else --max-np, else
 * --min-np). */
static int first_hosts(struct job *job, hvd_hostlist *hl) {
    const struct options *opt = job->opt;

    if (opt->discovery_script != NULL) {
        if (disc_run_now(job, hl) != 0)
            return -1;
    } else if (opt->nhosts > 0) {
        for (int h = 0; h < opt->nhosts; h++) {
            char spec[1100];
            char err[512];
            snprintf(spec, sizeof(spec),
                     strchr(opt->hosts[h].name, ':') != NULL ? "[%s]:%d"
                                                             : "%s:%d",
                     opt->hosts[h].name, opt->hosts[h].slots);
            if (hvd_hostlist_parse_list(hl, spec, err, sizeof(err)) != 0) {
                say("%s", err);
                return -1;
            }
        }
    } else {
        int slots = opt->slots > 0    ? opt->slots
                    : opt->np > 0     ? opt->np
                    : opt->max_np > 0 ? opt->max_np
                    : opt->min_np > 0 ? opt->min_np
                                      : 1;
        char spec[32];
        char err[512];
        snprintf(spec, sizeof(spec), "localhost:%d", slots);
        if (hvd_hostlist_parse_list(hl, spec, err, sizeof(err)) != 0) {
            say("%s", err);
            return -1;
        }
    }
    return 0;
}

/* The counts, now that the slots are known: -np, --min-np, --max-np and
 * how many worker ids the job may use. Returns the slots of all hosts. */
static long setup_counts(struct elastic *el, const struct options *opt) {
    long free_slots = 0;

    for (int k = 0; k < el->nhosts; k++)
        free_slots += el->hosts[k]->h.slots;
    el->max_np = opt->max_np > 0 ? opt->max_np : INT_MAX;
    el->np = opt->np > 0               ? opt->np
             : free_slots < el->max_np ? (int)free_slots
                                       : el->max_np;
    el->min_np = opt->min_np > 0 ? opt->min_np : opt->np > 0 ? opt->np : 0;
    if (el->min_np == 0)
        el->min_np = el->np > 0 ? el->np : 1;
    el->target = el->max_np;

    long bound = opt->max_np > 0       ? opt->max_np
                 : free_slots > el->np ? free_slots
                 : el->np > 0          ? el->np
                                       : 1;
    long ids = opt->reset_limit >= 0 ? bound * (opt->reset_limit + 1) + 64
                                     : UNLIMITED_WORKER_IDS;
    if (opt->reset_limit < 0 && 2 * bound + 64 > ids)
        ids = 2 * bound + 64;
    el->max_ids = ids > MAX_WORKER_IDS ? MAX_WORKER_IDS : (int)ids;
    return free_slots;
}

/* Where the rendezvous listens: towards the first remote host. Sets the
 * job's address and identity (job_hex). */
static int choose_address(struct job *job, char *job_hex) {
    struct elastic *el = job->el;
    const char **remote;
    int nremote = 0;
    int rc = -1;

    remote = calloc((size_t)el->nhosts + 1, sizeof(*remote));
    if (remote == NULL) {
        say("out of memory");
        return -1;
    }
    for (int k = 0; k < el->nhosts; k++) {
        if (!el->hosts[k]->h.local)
            remote[nremote++] = el->hosts[k]->h.name;
    }
    if (nremote > 0 && job->cwd[0] == '\0') {
        say("getcwd() failed: %s (remote workers run in hvdrun's working "
            "directory)",
            strerror(errno));
        goto free_remote;
    }
    if (bind_addr_choose(job, env_get(&job->env, "HVD_IFACE"), remote,
                         nremote) != 0 ||
        job_identity(job, job_hex) != 0)
        goto free_remote;
    rc = 0;

free_remote:
    free(remote);
    return rc;
}

/* The elastic rendezvous server, the variables that lead workers to it,
 * and enough descriptors for the most workers the job may run. */
static int start_rendezvous(struct job *job, const char *job_hex,
                            long free_slots) {
    struct elastic *el = job->el;
    hvd_status st = hvd_rdv_server_create_elastic(
        job->bind_addr, 0, el->max_ids, el->min_np, job->job_id, job->secret,
        &job->srv);

    if (st != HVD_OK) {
        say("cannot start the rendezvous server on %s: %s", job->bind_addr,
            hvd_error_get());
        return -1;
    }
    int port = hvd_rdv_server_port(job->srv);
    HVD_INFO("hvdrun",
             "elastic rendezvous server on %s:%d, job %s: %d workers to "
             "start, --min-np %d, --max-np %d, %ld slots on %d hosts",
             job->bind_addr, port, job_hex, el->np, el->min_np,
             el->max_np == INT_MAX ? -1 : el->max_np, free_slots, el->nhosts);
    if (env_set(&job->env, "HVD_RENDEZVOUS_ADDR", job->bind_addr) != 0 ||
        env_set_int(&job->env, "HVD_RENDEZVOUS_PORT", port) != 0 ||
        env_set(&job->env, "HVD_SECRET", job->secret) != 0 ||
        env_set(&job->env, "HVD_JOB_ID", job_hex) != 0) {
        say("out of memory");
        return -1;
    }
    long most = el->max_np != INT_MAX ? el->max_np : free_slots;
    if (most < el->np)
        most = el->np;
    /* Stopped workers may still hold their pipes while new ones run. */
    if (raise_nofile((int)most, (rlim_t)(6 * most + 16)) != 0)
        return -1;
    return 0;
}

int elastic_setup(struct job *job) {
    hvd_hostlist hl = {0};
    char job_hex[2 * HVD_JOB_ID_LEN + 1];
    long free_slots;
    int rc = -1;

    if (setup_state(job) != 0 || setup_env(job) != 0)
        return -1;
    if (first_hosts(job, &hl) != 0 ||
        apply_hosts(job, &hl, 1, hvd_now_ns()) != 0)
        goto free_hosts;
    free_slots = setup_counts(job->el, job->opt);
    if (choose_address(job, job_hex) != 0 ||
        start_rendezvous(job, job_hex, free_slots) != 0)
        goto free_hosts;
    rc = 0;

free_hosts:
    hvd_hostlist_free(&hl);
    return rc;
}

void elastic_destroy(struct job *job) {
    struct elastic *el = job->el;

    if (el == NULL)
        return;
    for (int k = 0; k < el->nworkers; k++)
        worker_free(el->workers[k]);
    free(el->workers);
    for (int k = 0; k < el->nhosts; k++) {
        free(el->hosts[k]->h.name);
        free(el->hosts[k]->cool_until);
        free(el->hosts[k]->occupant);
        free(el->hosts[k]);
    }
    free(el->hosts);
    close_fd(&el->disc_fd);
    free(el->disc_out.p);
    free(el);
    job->el = NULL;
}
