/*
 * Elastic mode (docs/elastic.md), on with --min-np, --max-np or
 * --host-discovery-script. Instead of N fixed ranks, hvdrun starts
 * *workers*: each process gets a worker id (0, 1, 2, ..., never reused in
 * the job) in HVD_ELASTIC_WORKER, with HVD_ELASTIC=1,
 * HVD_ELASTIC_TIMEOUT_SECONDS, HVD_HOSTNAME (the host as listed) and the
 * rendezvous variables, but no HVD_RANK, HVD_SIZE, HVD_LOCAL_* or
 * HVD_CROSS_* (nor their HOROVOD_ forms): the rendezvous server, created
 * in elastic mode, places the workers into numbered generations and
 * assigns ranks there. hvdrun tells the server about each worker before
 * it starts (add_worker) and when it is reaped or stopped (remove_worker).
 * A worker's output lines are prefixed "[w<id>] ".
 *
 * Hosts: --host-discovery-script (run with sh -c at the start, where it
 * must succeed, then every --discovery-interval s, killed after
 * DISCOVERY_TIMEOUT_S; lines "host" or "host:slots", # comments and blank
 * lines ignored; a later failure is reported and the last hosts are kept),
 * else -H/--hostfile, else "localhost" with --slots slots (default: -np,
 * else --max-np, else --min-np). Names that are this machine are forked,
 * others started over ssh as in a fixed job; two names of this machine
 * are two hosts (slots, failures and blacklist are per name).
 *
 * Each host has slots; a slot is free, taken by a worker, or cooling down
 * (until a time, or forever). The fill starts workers on the free slots
 * of hosts that are listed and not blacklisted, hosts in list order and
 * slots in order, while the workers running (not stopped by hvdrun) are
 * fewer than --max-np (default: no limit), as horovodrun's driver assigns
 * every available slot up to its max; -np is the number of workers the
 * job is meant to start with (the default of --min-np). The fill runs on
 * every turn of the loop.
 *
 * A worker that exits non-zero or by a signal (and was not stopped by
 * hvdrun): removed from the server, its host's failure count goes up, and
 * its slot cools down for a random time in --blacklist-cooldown-range
 * (forever without it; "0 0" frees it at once). At --host-failures
 * failures the host is blacklisted: its workers are stopped (SIGTERM, and
 * SIGKILL after --grace-seconds; a remote one by closing its ssh's stdin),
 * and it comes back, with its failures and cooling slots cleared, after a
 * random time in the range (never without it). A host that leaves the
 * discovery output has its workers stopped likewise; one that shrinks has
 * the workers of its slots beyond the new count stopped.
 *
 * The end of the job:
 *  - a worker exits 0: the job is finishing (as Horovod: a worker that
 *    succeeds means training is done). No more workers start, the server
 *    is ended (joins get HVD_ERR_SHUTDOWN), and hvdrun waits for the
 *    others. Exit status: 0 if every worker that ended after that one
 *    exited 0, else the status of the first that did not (failures before
 *    the first success were handled elastically and do not count);
 *  - fewer running workers than --min-np for --elastic-timeout, or at
 *    once when no slot can ever come back (no discovery script, and every
 *    other slot cools down or is blacklisted forever): exit status 1;
 *  - a generation above 1 + --reset-limit: exit status 1;
 *  - some workers wait to join a generation that the others do not join:
 *    after --elastic-timeout hvdrun stops the others (hung, or stuck
 *    outside hvd), so the generation forms without them; if that still
 *    does not happen, after twice that it ends the job, exit status 1.
 *    Members of a generation that lost no member are not waited for
 *    this way: they train on and reset at their next commit;
 *    Workers wait to be placed for 2 x --elastic-timeout + 10 s
 *    (HVD_ELASTIC_TIMEOUT_SECONDS), longer than hvdrun takes to decide;
 *  - --timeout: 124; a signal to hvdrun: 128+N (passed on to the workers,
 *    a second one kills them).
 * Ending the job ends the server with the sentence said, stops every
 * worker and waits until all are reaped. Every wait has a deadline: the
 * poll() timeout is the nearest of them.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* After a worker could not be started, the next try waits this long. */
#define START_RETRY_NS NS_PER_S

/* ---- workers that end ---- */

/*
 * Worker done exited with status 0: the job is finishing. A worker that
 * waits to join the next generation (one that was added while the others
 * trained on) has no part in the end: it is stopped, so that the server's
 * refusal of its join (HVD_ERR_SHUTDOWN) does not turn a finished job into
 * a failed one.
 */
static void finishing_begins(struct job *job, struct worker *done,
                             int64_t now) {
    struct elastic *el = job->el;
    char why[256];

    el->finishing = 1;
    say("worker %d on %s exited with status 0: the job is finishing "
        "(no more workers start)",
        done->r.index, done->host->h.name);
    snprintf(why, sizeof(why),
             "the job is finishing (worker %d succeeded) while it waited "
             "to join",
             done->r.index);
    for (int k = 0; k < el->nworkers; k++) {
        struct worker *w = el->workers[k];
        if (w != done && w->r.state == RANK_RUNNING && !w->stopped &&
            hvd_rdv_server_worker_waiting(job->srv, w->r.index)) {
            say("stopping worker %d on %s: %s", w->r.index, w->host->h.name,
                why);
            stop_worker(job, w, SIGTERM, why, now);
        }
    }
    hvd_rdv_server_end(job->srv, "a worker finished: the job is ending");
}

static void worker_exited(struct job *job, struct worker *w, int ws,
                          int64_t now) {
    struct elastic *el = job->el;
    struct ehost *eh = w->host;
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    char why[512];
    long secs;

    w->r.state = RANK_EXITED;
    w->r.wstatus = ws;
    w->kill_at_ns = 0;
    el->running--;
    if (w->r.remote) {
        close_fd(&w->r.stdin_fd);
        stream_read(&w->r.err, FINAL_DRAIN_BYTES);
    }
    if (w->slot < eh->cap && eh->occupant[w->slot] == w)
        eh->occupant[w->slot] = NULL;
    exit_text(w, code, why, sizeof(why));
    if (w->stopped) {
        HVD_INFO("hvdrun", "worker %d (pid %d) ended: %s", w->r.index,
                 (int)w->r.pid, why);
        return;
    }
    el->active--;
    if (code == 0 && !el->ending && !el->finishing)
        finishing_begins(job, w, now);
    hvd_rdv_server_remove_worker(job->srv, w->r.index, why);
    w->removed = 1;
    el->target = el->max_np;
    if (el->ending || code == 0)
        return;
    if (el->finishing) {
        say("worker %d on %s %s", w->r.index, eh->h.name, why);
        if (el->finish_code < 0)
            el->finish_code = code;
        return;
    }
    eh->failures++;
    eh->cool_until[w->slot] = cooldown_until(job->opt, now, &secs);
    if (secs < 0)
        say("worker %d on %s %s; its slot is not used again", w->r.index,
            eh->h.name, why);
    else
        say("worker %d on %s %s; its slot is free again in %ld s", w->r.index,
            eh->h.name, why, secs);
    if (!eh->blacklisted && eh->failures >= job->opt->host_failures)
        blacklist_host(job, eh, now);
}

static void got_signal(struct job *job, int sig, int64_t now) {
    struct elastic *el = job->el;
    char why[64];

    if (!el->ending) {
        say("got %s; passing it on to the workers (again to kill them now)",
            signal_name(sig));
        snprintf(why, sizeof(why), "hvdrun got %s", signal_name(sig));
        end_job(job, 128 + sig, why, sig, now);
    } else {
        say("got %s again; killing the workers", signal_name(sig));
        kill_workers(job);
    }
}

static void reap(struct job *job, int64_t now) {
    struct elastic *el = job->el;

    for (;;) {
        int ws;
        pid_t pid = waitpid(-1, &ws, WNOHANG);

        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        watchdog_reaped(pid);
        if (el->disc_pid != 0 && pid == el->disc_pid) {
            disc_done(job, ws, now);
            continue;
        }
        for (int k = 0; k < el->nworkers; k++) {
            struct worker *w = el->workers[k];
            if (w->r.state == RANK_RUNNING && w->r.pid == pid) {
                worker_exited(job, w, ws, now);
                break;
            }
        }
    }
}

static void read_signals_elastic(struct job *job, int64_t now) {
    unsigned char sigs[64];
    ssize_t n;

    while ((n = read(sig_pipe[0], sigs, sizeof(sigs))) > 0) {
        for (ssize_t k = 0; k < n; k++) {
            if (sigs[k] == SIGCHLD)
                reap(job, now);
            else
                got_signal(job, sigs[k], now);
        }
    }
}

/* ---- the policy ---- */

/* Could the slots ever hold min_np workers again? Not when no script can
 * add hosts and every other slot cools down or is blacklisted forever. */
static int hopeless(const struct job *job) {
    const struct elastic *el = job->el;
    int possible = 0;

    if (job->opt->discovery_script != NULL)
        return 0;
    for (int k = 0; k < el->nhosts; k++) {
        const struct ehost *eh = el->hosts[k];
        if (!eh->listed || (eh->blacklisted && eh->back_at_ns == FOREVER))
            continue;
        for (int s = 0; s < eh->h.slots; s++)
            possible += eh->cool_until[s] != FOREVER;
    }
    return possible < el->min_np;
}

/* Cooldowns and blacklistings that ended, SIGKILLs due, the discovery
 * script's schedule, --timeout. */
static void expire(struct job *job, int64_t now) {
    struct elastic *el = job->el;
    const struct options *opt = job->opt;

    for (int k = 0; k < el->nhosts; k++) {
        struct ehost *eh = el->hosts[k];
        if (eh->blacklisted && now >= eh->back_at_ns) {
            eh->blacklisted = 0;
            eh->failures = 0;
            for (int s = 0; s < eh->cap; s++)
                eh->cool_until[s] = 0;
            say("host %s is back after its blacklist cooldown", eh->h.name);
            el->target = el->max_np;
        }
        for (int s = 0; s < eh->cap; s++) {
            if (eh->cool_until[s] != 0 && now >= eh->cool_until[s]) {
                eh->cool_until[s] = 0;
                el->target = el->max_np;
            }
        }
    }
    for (int k = 0; k < el->nworkers; k++) {
        struct worker *w = el->workers[k];
        if (w->r.state == RANK_RUNNING && w->kill_at_ns != 0 &&
            now >= w->kill_at_ns) {
            HVD_INFO("hvdrun", "worker %d: grace period over; SIGKILL",
                     w->r.index);
            kill(-w->r.pid, SIGKILL);
            w->kill_at_ns = 0;
        }
    }
    if (opt->discovery_script != NULL) {
        if (el->disc_pid != 0 && now >= el->disc_kill_at &&
            !el->disc_timed_out) {
            kill(-el->disc_pid, SIGKILL);
            el->disc_timed_out = 1;
        }
        if (el->disc_pid == 0 && !el->ending && !el->finishing &&
            now >= el->disc_next_at && disc_start(job, now) != 0)
            el->disc_next_at = now + opt->discovery_interval_s * NS_PER_S;
    }
    if (!el->ending && job->timeout_at_ns != 0 && now >= job->timeout_at_ns) {
        say("job exceeded --timeout %ld", opt->timeout_s);
        end_job(job, EXIT_TIMEOUT, "the job exceeded hvdrun's --timeout",
                SIGTERM, now);
    }
}

/* Starts workers on free slots while fewer than the target run. */
static void fill(struct job *job, int64_t now) {
    struct elastic *el = job->el;

    if (el->ending || el->finishing || now < el->start_retry_at)
        return;
    for (int k = 0; k < el->nhosts; k++)
        el->hosts[k]->h.logging_in = 0;
    for (int k = 0; k < el->nworkers; k++) {
        struct worker *w = el->workers[k];
        if (w->r.remote && w->r.state == RANK_RUNNING &&
            w->r.err.awaiting_start)
            w->host->h.logging_in++;
    }
    while (el->active < el->target) {
        struct ehost *eh = NULL;
        int slot = -1;

        for (int k = 0; k < el->nhosts && slot < 0; k++) {
            eh = el->hosts[k];
            if (!eh->listed || eh->blacklisted ||
                (!eh->h.local && eh->h.logging_in >= SSH_MAX_LOGINS))
                continue;
            for (int s = 0; s < eh->h.slots && slot < 0; s++) {
                if (eh->occupant[s] == NULL && eh->cool_until[s] == 0)
                    slot = s;
            }
        }
        if (slot < 0)
            return;
        if (el->next_id >= el->max_ids) {
            if (!el->said_id_limit)
                say("this job has started %d workers, as many as it may "
                    "(--max-np times --reset-limit + 1, plus 64; 4096 "
                    "without them): no more start",
                    el->max_ids);
            el->said_id_limit = 1;
            return;
        }
        if (start_worker(job, eh, slot) != 0) {
            el->start_retry_at = now + START_RETRY_NS;
            return;
        }
    }
}

/* --min-np, --reset-limit and the workers that do not rejoin. */
static void check_policy(struct job *job, int64_t now) {
    struct elastic *el = job->el;
    const struct options *opt = job->opt;
    int64_t t = opt->elastic_timeout_s * NS_PER_S;
    char why[512];

    if (el->ending)
        return;
    uint32_t gen = hvd_rdv_server_generation(job->srv);
    if (gen != el->generation) {
        el->generation = gen;
        watchdog_generation(gen);
        HVD_INFO("hvdrun", "generation %u formed", gen);
    }
    if (opt->reset_limit >= 0 && gen > 1 + (uint32_t)opt->reset_limit) {
        snprintf(why, sizeof(why),
                 "reached --reset-limit %ld after %u re-formations: ending "
                 "the job",
                 opt->reset_limit, gen - 1);
        say("%s", why);
        end_job(job, EXIT_SETUP, why, SIGTERM, now);
        return;
    }

    if (!el->finishing && hvd_rdv_server_state_lost(job->srv)) {
        snprintf(why, sizeof(why),
                 "no worker that took part in a generation is left (the "
                 "last generation was %u): nobody holds the training state "
                 "to go on from, ending the job",
                 gen);
        say("%s", why);
        end_job(job, EXIT_SETUP, why, SIGTERM, now);
        return;
    }
    if (!el->finishing && el->active < el->min_np) {
        if (el->below_min_since == 0)
            el->below_min_since = now;
        if (hopeless(job)) {
            snprintf(why, sizeof(why),
                     "only %d worker%s left, fewer than --min-np %d, and no "
                     "slot can come back: ending the job",
                     el->active, el->active == 1 ? "" : "s", el->min_np);
            say("%s", why);
            end_job(job, EXIT_SETUP, why, SIGTERM, now);
            return;
        }
        if (now >= el->below_min_since + t) {
            snprintf(why, sizeof(why),
                     "only %d worker%s left, fewer than --min-np %d, for %ld "
                     "s (--elastic-timeout): ending the job",
                     el->active, el->active == 1 ? "" : "s", el->min_np,
                     opt->elastic_timeout_s);
            say("%s", why);
            end_job(job, EXIT_SETUP, why, SIGTERM, now);
            return;
        }
    } else {
        el->below_min_since = 0;
    }

    /* Laggards: workers that neither wait to join nor belong to a
     * generation that lost no member. Members of such a generation are
     * training: told of a new worker, they reset at their next commit,
     * however far off (stopping them would lose the state only they
     * hold). Once a member left or rejoined, the others must come. */
    int workers = hvd_rdv_server_workers(job->srv);
    int waiting = hvd_rdv_server_waiting(job->srv);
    int lagging = 0;
    for (int i = 0; i < el->nworkers; i++) {
        const struct worker *w = el->workers[i];
        lagging += w->r.state == RANK_RUNNING && !w->stopped &&
                   !hvd_rdv_server_worker_waiting(job->srv, w->r.index) &&
                   !hvd_rdv_server_worker_member(job->srv, w->r.index);
    }
    if (waiting > 0 && lagging > 0) {
        if (el->partial_since == 0)
            el->partial_since = now;
        if (!el->said_partial && now >= el->partial_since + t) {
            /* The others may be hung: they are stopped, and the
             * generation forms without them (if --min-np allows). */
            snprintf(why, sizeof(why),
                     "did not rejoin within --elastic-timeout (%ld s) while "
                     "%d of %d workers waited for it",
                     opt->elastic_timeout_s, waiting, workers);
            for (int i = 0; i < el->nworkers; i++) {
                struct worker *w = el->workers[i];
                if (w->r.state == RANK_RUNNING && !w->stopped &&
                    !hvd_rdv_server_worker_waiting(job->srv, w->r.index) &&
                    !hvd_rdv_server_worker_member(job->srv, w->r.index)) {
                    say("worker %d on %s %s", w->r.index, w->host->h.name, why);
                    stop_worker(job, w, SIGTERM, why, now);
                }
            }
            el->said_partial = 1;
        }
        if (now >= el->partial_since + 2 * t) {
            snprintf(why, sizeof(why),
                     "%d of %d workers did not rejoin within twice "
                     "--elastic-timeout (%ld s): ending the job",
                     lagging, workers, 2 * opt->elastic_timeout_s);
            say("%s", why);
            end_job(job, EXIT_SETUP, why, SIGTERM, now);
        }
    } else {
        el->partial_since = 0;
        el->said_partial = 0;
    }
}

/* ---- the loop ---- */

static void serve(struct job *job, int64_t now) {
    if (hvd_rdv_server_progress(job->srv, 0) != HVD_OK) {
        HVD_ERROR("hvdrun", "rendezvous server: %s", hvd_error_get());
        job->rdv_quiet_until_ns = now + RDV_BACKOFF_NS;
    }
}

static void earliest(int64_t *next, int64_t t) {
    if (t > 0 && t < *next)
        *next = t;
}

/* Milliseconds until the nearest deadline, rounded up; -1: none. */
static int poll_timeout(const struct job *job, int64_t now) {
    const struct elastic *el = job->el;
    const struct options *opt = job->opt;
    int64_t next = INT64_MAX;
    int64_t t = opt->elastic_timeout_s * NS_PER_S;

    if (!el->ending)
        earliest(&next, job->timeout_at_ns);
    if (opt->discovery_script != NULL) {
        if (el->disc_pid != 0 && !el->disc_timed_out)
            earliest(&next, el->disc_kill_at);
        else if (el->disc_pid == 0 && !el->ending && !el->finishing)
            earliest(&next, el->disc_next_at);
    }
    for (int k = 0; k < el->nhosts; k++) {
        const struct ehost *eh = el->hosts[k];
        if (eh->blacklisted && eh->back_at_ns != FOREVER)
            earliest(&next, eh->back_at_ns);
        for (int s = 0; s < eh->cap; s++) {
            if (eh->cool_until[s] != FOREVER)
                earliest(&next, eh->cool_until[s]);
        }
    }
    for (int k = 0; k < el->nworkers; k++) {
        if (el->workers[k]->r.state == RANK_RUNNING)
            earliest(&next, el->workers[k]->kill_at_ns);
    }
    if (!el->ending) {
        if (el->below_min_since != 0)
            earliest(&next, el->below_min_since + t);
        if (el->partial_since != 0)
            earliest(&next, el->partial_since + (el->said_partial ? 2 : 1) * t);
        if (el->start_retry_at > now)
            earliest(&next, el->start_retry_at);
    }
    if (job->rdv_quiet_until_ns > now)
        earliest(&next, job->rdv_quiet_until_ns);
    if (next == INT64_MAX)
        return -1;
    if (next <= now)
        return 0;
    int64_t ms = (next - now + NS_PER_MS - 1) / NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int add_pfd(struct job *job, nfds_t *n, int fd, struct stream *s) {
    struct elastic *el = job->el;

    if ((int)*n == el->pfd_cap) {
        int cap = el->pfd_cap == 0 ? 64 : 2 * el->pfd_cap;
        struct pollfd *p = realloc(job->pfds, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return -1;
        job->pfds = p;
        struct stream **ps =
            realloc(job->pfd_streams, (size_t)cap * sizeof(*ps));
        if (ps == NULL)
            return -1;
        job->pfd_streams = ps;
        el->pfd_cap = cap;
    }
    job->pfds[*n].fd = fd;
    job->pfds[*n].events = POLLIN;
    job->pfds[*n].revents = 0;
    job->pfd_streams[*n] = s;
    (*n)++;
    return 0;
}

/* Frees the workers that are reaped and whose pipes are closed. */
static void sweep(struct elastic *el) {
    int kept = 0;

    for (int k = 0; k < el->nworkers; k++) {
        struct worker *w = el->workers[k];
        if (w->r.state == RANK_EXITED && w->r.out.fd < 0 && w->r.err.fd < 0)
            worker_free(w);
        else
            el->workers[kept++] = w;
    }
    el->nworkers = kept;
}

static int done(const struct elastic *el) {
    return el->running == 0 && (el->ending || el->finishing);
}

static int event_loop(struct job *job) {
    struct elastic *el = job->el;

    for (;;) {
        int64_t now = hvd_now_ns();
        nfds_t n = 0;
        int srv_k = -1, disc_k = -1;

        expire(job, now);
        fill(job, now);
        check_policy(job, now);
        if (done(el))
            return 0;

        if (add_pfd(job, &n, sig_pipe[0], NULL) != 0)
            goto no_memory;
        if (now >= job->rdv_quiet_until_ns) {
            srv_k = (int)n;
            if (add_pfd(job, &n, hvd_rdv_server_fd(job->srv), NULL) != 0)
                goto no_memory;
        }
        if (el->disc_fd >= 0) {
            disc_k = (int)n;
            if (add_pfd(job, &n, el->disc_fd, NULL) != 0)
                goto no_memory;
        }
        for (int k = 0; k < el->nworkers; k++) {
            struct rank *r = &el->workers[k]->r;
            if ((r->out.fd >= 0 && add_pfd(job, &n, r->out.fd, &r->out) != 0) ||
                (r->err.fd >= 0 && add_pfd(job, &n, r->err.fd, &r->err) != 0))
                goto no_memory;
        }

        if (poll(job->pfds, n, poll_timeout(job, now)) < 0) {
            if (errno == EINTR)
                continue;
            say("poll() on %lu descriptors failed: %s", (unsigned long)n,
                strerror(errno));
            return -1;
        }
        now = hvd_now_ns();
        for (nfds_t k = 1; k < n; k++) {
            if (job->pfds[k].revents == 0)
                continue;
            if (job->pfd_streams[k] != NULL)
                stream_read(job->pfd_streams[k], READ_CHUNK);
            else if ((int)k == srv_k)
                serve(job, now);
            else if ((int)k == disc_k)
                disc_read(el);
        }
        /* Signals last: a worker reaped now has its output read above. */
        if (job->pfds[0].revents != 0)
            read_signals_elastic(job, now);
        sweep(el);
    }

no_memory:
    say("out of memory");
    return -1;
}

/* The workers' last output; a pipe still open is held by a descendant a
 * worker left behind, whose group is told to go. */
static void finish_output(struct elastic *el) {
    for (int k = 0; k < el->nworkers; k++) {
        struct rank *r = &el->workers[k]->r;
        stream_read(&r->out, FINAL_DRAIN_BYTES);
        stream_read(&r->err, FINAL_DRAIN_BYTES);
        if (r->out.fd >= 0 || r->err.fd >= 0) {
            HVD_INFO("hvdrun", "worker %d left processes behind: SIGTERM",
                     r->index);
            kill(-r->pid, SIGTERM);
            kill(-r->pid, SIGCONT);
        }
        if (r->out.fd >= 0)
            stream_close(&r->out);
        if (r->err.fd >= 0)
            stream_close(&r->err);
    }
}

int elastic_run(struct job *job) {
    struct elastic *el = job->el;
    int64_t now = hvd_now_ns();

    if (job->opt->timeout_s > 0)
        job->timeout_at_ns = now + job->opt->timeout_s * NS_PER_S;
    el->disc_next_at = now + job->opt->discovery_interval_s * NS_PER_S;
    if (event_loop(job) != 0) {
        if (job->exit_code < 0)
            job->exit_code = EXIT_SETUP;
        kill_workers(job);
        for (int k = 0; k < el->nworkers; k++) {
            struct worker *w = el->workers[k];
            int ws;
            if (w->r.state != RANK_RUNNING)
                continue;
            while (waitpid(w->r.pid, &ws, 0) < 0 && errno == EINTR)
                ;
            w->r.state = RANK_EXITED;
        }
    }
    if (el->disc_pid != 0) {
        int ws;
        kill(-el->disc_pid, SIGKILL);
        while (waitpid(el->disc_pid, &ws, 0) < 0 && errno == EINTR)
            ;
        el->disc_pid = 0;
    }
    close_fd(&el->disc_fd);
    finish_output(el);
    if (job->exit_code >= 0)
        return job->exit_code;
    return el->finish_code >= 0 ? el->finish_code : 0;
}
