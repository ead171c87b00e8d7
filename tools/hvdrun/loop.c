/*
 * The event loop of a running job: one poll() over the signal self-pipe,
 * the rendezvous server and every rank's output pipes, until every
 * started rank is reaped. Ranks not started yet (remote ones wait for a
 * free ssh login slot) are started from here, and deadlines (--timeout,
 * the grace period) are kept here. job_run() and job_destroy() wrap it.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

/* ---- the event loop ---- */

static void serve_rendezvous(struct job *job, int64_t now) {
    hvd_status st = hvd_rdv_server_progress(job->srv, 0);

    if (st != HVD_OK) {
        HVD_ERROR("hvdrun", "rendezvous server: %s", hvd_error_get());
        job->rdv_quiet_until_ns = now + RDV_BACKOFF_NS;
    }
    int joined = hvd_rdv_server_joined(job->srv);
    if (joined != job->joined) {
        job->joined = joined;
        HVD_INFO("hvdrun", "%d of %d ranks joined the rendezvous", joined,
                 job->opt->np);
    }
}

/* Milliseconds until the next deadline, rounded up; -1: none. */
static int poll_timeout(const struct job *job, int64_t now) {
    int64_t next = INT64_MAX;

    if (job->phase == JOB_STOPPING)
        next = job->kill_at_ns;
    if (job->phase == JOB_RUNNING && job->timeout_at_ns != 0)
        next = job->timeout_at_ns;
    if (job->rdv_quiet_until_ns > now && job->rdv_quiet_until_ns < next)
        next = job->rdv_quiet_until_ns;
    if (next == INT64_MAX)
        return -1;
    if (next <= now)
        return 0;
    int64_t ms = (next - now + NS_PER_MS - 1) / NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void add_pfd(struct job *job, nfds_t *n, int fd, struct stream *s) {
    job->pfds[*n].fd = fd;
    job->pfds[*n].events = POLLIN;
    job->pfds[*n].revents = 0;
    job->pfd_streams[*n] = s;
    (*n)++;
}

/*
 * Starts the ranks not started yet: local ones at once, remote ones while
 * fewer than SSH_MAX_LOGINS ssh processes to their host have not reported
 * the program's start. Called again as logins finish.
 */
static int start_pending(struct job *job) {
    int np = job->opt->np;

    for (int r = 0; r < np; r++) {
        struct rank *rk = &job->ranks[r];
        if (rk->host != NULL)
            rk->host->logging_in = 0;
    }
    for (int r = 0; r < np; r++) {
        struct rank *rk = &job->ranks[r];
        if (rk->remote && rk->state == RANK_RUNNING && rk->err.awaiting_start)
            rk->host->logging_in++;
    }
    for (int r = 0; r < np && job->pending > 0; r++) {
        struct rank *rk = &job->ranks[r];
        if (rk->state != RANK_UNSTARTED ||
            (rk->remote && rk->host->logging_in >= SSH_MAX_LOGINS))
            continue;
        if (spawn_rank(job, rk) != 0)
            return -1;
        job->pending--;
        if (rk->remote)
            rk->host->logging_in++;
    }
    return 0;
}

/* Runs until every started rank is reaped. Returns -1 if poll() fails. */
static int event_loop(struct job *job) {
    while (job->live > 0 || (job->pending > 0 && job->phase == JOB_RUNNING)) {
        int64_t now = hvd_now_ns();
        nfds_t n = 0;

        if (job->pending > 0 && job->phase == JOB_RUNNING &&
            start_pending(job) != 0) {
            job->exit_code = EXIT_SETUP;
            stop_job(job, SIGTERM);
            continue;
        }

        add_pfd(job, &n, sig_pipe[0], NULL);
        if (now >= job->rdv_quiet_until_ns)
            add_pfd(job, &n, hvd_rdv_server_fd(job->srv), NULL);
        for (int r = 0; r < job->opt->np; r++) {
            struct rank *rk = &job->ranks[r];
            if (rk->out.fd >= 0)
                add_pfd(job, &n, rk->out.fd, &rk->out);
            if (rk->err.fd >= 0)
                add_pfd(job, &n, rk->err.fd, &rk->err);
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
            else
                serve_rendezvous(job, now);
        }
        /* Signals last: a rank reaped now has its output read above. */
        if (job->pfds[0].revents != 0)
            read_signals(job);

        if (job->phase == JOB_RUNNING && job->timeout_at_ns != 0 &&
            now >= job->timeout_at_ns) {
            say("job exceeded --timeout %ld", job->opt->timeout_s);
            job->exit_code = EXIT_TIMEOUT;
            stop_job(job, SIGTERM);
        }
        if (job->phase == JOB_STOPPING && now >= job->kill_at_ns) {
            HVD_INFO("hvdrun", "grace period over; sending SIGKILL");
            kill_ranks(job);
        }
    }
    return 0;
}

/* Prints the ranks' last output. A pipe still open now is held by a
 * descendant a rank left behind; the job is over, so its group is told. */
static void finish_output(struct job *job) {
    for (int r = 0; r < job->opt->np; r++) {
        struct rank *rk = &job->ranks[r];
        stream_read(&rk->out, FINAL_DRAIN_BYTES);
        stream_read(&rk->err, FINAL_DRAIN_BYTES);
        if (rk->out.fd >= 0 || rk->err.fd >= 0) {
            HVD_INFO("hvdrun", "rank %d left processes behind: SIGTERM", r);
            kill(-rk->pid, SIGTERM);
            kill(-rk->pid, SIGCONT);
        }
        if (rk->out.fd >= 0)
            stream_close(&rk->out);
        if (rk->err.fd >= 0)
            stream_close(&rk->err);
    }
}

/* When hvdrun cannot go on: no rank may outlive it unreaped. */
static void kill_and_wait(struct job *job) {
    kill_ranks(job);
    for (int r = 0; r < job->opt->np; r++) {
        struct rank *rk = &job->ranks[r];
        int ws;
        if (rk->state != RANK_RUNNING)
            continue;
        while (waitpid(rk->pid, &ws, 0) < 0 && errno == EINTR)
            ;
        rk->state = RANK_EXITED;
        job->live--;
    }
}

int job_run(struct job *job) {
    if (job->opt->timeout_s > 0)
        job->timeout_at_ns = hvd_now_ns() + job->opt->timeout_s * NS_PER_S;
    job->pending = job->opt->np;
    if (event_loop(job) != 0) {
        if (job->exit_code < 0)
            job->exit_code = EXIT_SETUP;
        kill_and_wait(job);
    }
    finish_output(job);
    return job->exit_code < 0 ? 0 : job->exit_code;
}

void job_destroy(struct job *job) {
    if (job->ranks != NULL) {
        for (int r = 0; r < job->opt->np; r++) {
            close_fd(&job->ranks[r].out.fd);
            close_fd(&job->ranks[r].err.fd);
            if (job->ranks[r].remote)
                close_fd(&job->ranks[r].stdin_fd);
            free(job->ranks[r].out.buf);
            free(job->ranks[r].err.buf);
        }
    }
    hvd_rdv_server_destroy(job->srv);
    close_fd(&job->null_fd);
    env_free(&job->env);
    binding_free(&job->bind);
    free(job->ranks);
    free(job->pfds);
    free(job->pfd_streams);
}
