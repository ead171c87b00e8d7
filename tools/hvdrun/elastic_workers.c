/*
 * Elastic mode's workers (elastic.c tells the whole mode): starting one on
 * a host's slot, stopping one (the server forgets it at once; SIGTERM,
 * then SIGKILL after --grace-seconds), and ending the job. The calls go
 * one way: elastic.c and elastic_hosts.c call these, which call neither.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

static int stream_setup(struct stream *s, int id, int out_fd, int prefix) {
    s->fd = -1;
    s->out_fd = out_fd;
    s->cap = LINE_INITIAL_CAP;
    s->buf = malloc(s->cap);
    if (s->buf == NULL)
        return -1;
    s->prefix_len = prefix ? (size_t)snprintf(s->buf, s->cap, "[w%d] ", id) : 0;
    s->len = 0;
    return 0;
}

void worker_free(struct worker *w) {
    close_fd(&w->r.out.fd);
    close_fd(&w->r.err.fd);
    close_fd(&w->r.stdin_fd);
    free(w->r.out.buf);
    free(w->r.err.buf);
    free(w);
}

/* What ended worker w, for messages and the server's log. */
void exit_text(const struct worker *w, int code, char *why, size_t len) {
    int ws = w->r.wstatus;

    if (w->r.remote && WIFEXITED(ws) && code == SSH_FAILED &&
        w->r.err.awaiting_start)
        snprintf(why, len,
                 "could not be started: ssh exited with status %d (%s)", code,
                 w->r.err.last_line[0] != '\0' ? w->r.err.last_line
                                               : "it printed no reason");
    else if (!WIFEXITED(ws))
        snprintf(why, len, "killed by %s", signal_name(WTERMSIG(ws)));
    else
        snprintf(why, len, "exited with status %d", code);
}

int start_worker(struct job *job, struct ehost *eh, int slot) {
    struct elastic *el = job->el;
    struct worker *w;
    int id = el->next_id;
    hvd_status st;

    if (el->nworkers == el->cap_workers) {
        int cap = el->cap_workers == 0 ? 16 : 2 * el->cap_workers;
        struct worker **v = realloc(el->workers, (size_t)cap * sizeof(*v));
        if (v == NULL)
            goto no_memory;
        el->workers = v;
        el->cap_workers = cap;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        goto no_memory;
    w->host = eh;
    w->slot = slot;
    w->r.index = id;
    w->r.host = &eh->h;
    w->r.remote = !eh->h.local;
    w->r.stdin_fd = -1;
    w->r.out.fd = w->r.err.fd = -1;
    w->r.local_rank = w->r.cross_rank = -1;
    w->r.slot = slot;
    w->r.nslots = eh->h.slots;
    if (job->opt->prefix || w->r.remote) {
        if (stream_setup(&w->r.out, id, STDOUT_FILENO, job->opt->prefix) != 0 ||
            stream_setup(&w->r.err, id, STDERR_FILENO, job->opt->prefix) != 0) {
            worker_free(w);
            goto no_memory;
        }
        w->r.err.awaiting_start = w->r.remote;
    }
    st = hvd_rdv_server_add_worker(job->srv, id, eh->h.name);
    if (st != HVD_OK) {
        say("cannot add worker %d to the rendezvous: %s", id, hvd_error_get());
        worker_free(w);
        return -1;
    }
    el->next_id++;
    if (spawn_worker(job, &w->r, eh->h.name, el->active) != 0) {
        hvd_rdv_server_remove_worker(job->srv, id, "could not be started");
        worker_free(w);
        return -1;
    }
    el->workers[el->nworkers++] = w;
    eh->occupant[slot] = w;
    el->running++;
    el->active++;
    if (w->r.remote)
        eh->h.logging_in++;
    HVD_INFO("hvdrun", "worker %d started on %s (slot %d)", id, eh->h.name,
             slot);
    return 0;

no_memory:
    say("cannot start worker %d: out of memory", id);
    return -1;
}

/* hvdrun stops w: the server forgets it now; SIGTERM (sig), SIGKILL after
 * the grace period. A remote worker's ssh gets its stdin closed. */
void stop_worker(struct job *job, struct worker *w, int sig, const char *why,
                 int64_t now) {
    struct elastic *el = job->el;
    pid_t pid = w->r.pid;

    if (w->r.state != RANK_RUNNING)
        return;
    if (!w->stopped) {
        w->stopped = 1;
        el->active--;
    }
    if (!w->removed) {
        hvd_rdv_server_remove_worker(job->srv, w->r.index, why);
        w->removed = 1;
    }
    HVD_INFO("hvdrun", "stopping worker %d: %s", w->r.index, why);
    if (job->opt->grace_s == 0)
        sig = SIGKILL;
    if (w->r.remote)
        close_fd(&w->r.stdin_fd);
    if (!w->r.remote || sig == SIGKILL) {
        if (kill(-pid, sig) != 0 && errno != ESRCH)
            HVD_WARN("hvdrun", "kill(-%d, %s) failed: %s", (int)pid,
                     signal_name(sig), strerror(errno));
        if (sig != SIGKILL)
            kill(-pid, SIGCONT);
    }
    w->kill_at_ns = sig == SIGKILL ? 0 : now + job->opt->grace_s * NS_PER_S;
}

void kill_workers(struct job *job) {
    struct elastic *el = job->el;

    for (int k = 0; k < el->nworkers; k++) {
        struct worker *w = el->workers[k];
        if (w->r.state == RANK_RUNNING) {
            kill(-w->r.pid, SIGKILL);
            w->kill_at_ns = 0;
        }
    }
}

/* Ends the job with exit status code: the server tells joins why, and
 * every worker is stopped with sig. */
void end_job(struct job *job, int code, const char *why, int sig, int64_t now) {
    struct elastic *el = job->el;

    if (el->ending)
        return;
    el->ending = 1;
    job->exit_code = code;
    hvd_rdv_server_end(job->srv, why);
    for (int k = 0; k < el->nworkers; k++)
        stop_worker(job, el->workers[k], sig, why, now);
}

/* Stops the workers of eh on slots from first on; returns how many. */
int stop_host_workers(struct job *job, struct ehost *eh, int first,
                      const char *why, int64_t now) {
    int n = 0;

    for (int s = first; s < eh->cap; s++) {
        struct worker *w = eh->occupant[s];
        if (w != NULL && w->r.state == RANK_RUNNING && !w->stopped) {
            stop_worker(job, w, SIGTERM, why, now);
            n++;
        }
    }
    return n;
}
