/*
 * Stopping a job and reaping its ranks. The first rank that fails, a
 * signal to hvdrun or --timeout stops the others: SIGTERM to each rank's
 * process group (for a remote rank, its ssh's stdin is closed instead),
 * SIGKILL after the grace period. Reaping decides hvdrun's exit status
 * and says how a rank ended.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/log.h"

/* ---- stopping ---- */

/* A rank's group may outlive the rank itself: its descendants still hold
 * its pipes. */
static int group_alive(const struct rank *r) {
    return r->state == RANK_RUNNING ||
           (r->state == RANK_EXITED && (r->out.fd >= 0 || r->err.fd >= 0));
}

/* A remote rank is asked to stop by closing its ssh's stdin (the wrapper
 * there then sends SIGTERM); only SIGKILL goes to the ssh itself. */
static void signal_ranks(struct job *job, int sig) {
    for (int r = 0; r < job->opt->np; r++) {
        struct rank *rk = &job->ranks[r];
        if (rk->remote) {
            close_fd(&rk->stdin_fd);
            if (sig != SIGKILL)
                continue;
        }
        if (group_alive(rk) && kill(-rk->pid, sig) != 0 && errno != ESRCH)
            HVD_WARN("hvdrun", "kill(-%d, %s) failed: %s", (int)rk->pid,
                     signal_name(sig), strerror(errno));
    }
}

void kill_ranks(struct job *job) {
    signal_ranks(job, SIGKILL);
    job->phase = JOB_KILLED;
}

/* Sends sig (and SIGCONT, for stopped ranks) to every rank; SIGKILL follows
 * after the grace period. Called again while stopping: SIGKILL now. */
void stop_job(struct job *job, int sig) {
    if (job->phase == JOB_RUNNING && job->opt->grace_s > 0) {
        HVD_INFO("hvdrun", "sending %s to the ranks; SIGKILL in %d s",
                 signal_name(sig), job->opt->grace_s);
        signal_ranks(job, sig);
        signal_ranks(job, SIGCONT);
        job->phase = JOB_STOPPING;
        job->kill_at_ns = hvd_now_ns() + job->opt->grace_s * NS_PER_S;
    } else if (job->phase != JOB_KILLED) {
        HVD_INFO("hvdrun", "sending SIGKILL to the ranks");
        kill_ranks(job);
    }
}

/* Says how remote rank r failed with status code (its ssh's). */
static void remote_failed(const struct rank *r, int code) {
    int ws = r->wstatus;
    const char *host = r->host->name;

    if (!WIFEXITED(ws))
        say("rank %d on %s: its ssh (pid %d) was killed by signal %d (%s)",
            r->index, host, (int)r->pid, WTERMSIG(ws),
            signal_name(WTERMSIG(ws)));
    else if (code == SSH_FAILED && r->err.awaiting_start)
        say("cannot start rank %d on %s: ssh exited with status %d (%s)",
            r->index, host, code,
            r->err.last_line[0] != '\0' ? r->err.last_line
                                        : "it printed no reason");
    else if (code == SSH_FAILED)
        say("rank %d on %s: ssh exited with status %d: the connection was "
            "lost, or the program exited with %d",
            r->index, host, code, code);
    else if (code > 128 && code < 128 + NSIG)
        say("rank %d on %s exited with status %d (as when killed by signal %d, "
            "%s)",
            r->index, host, code, code - 128, signal_name(code - 128));
    else
        say("rank %d on %s exited with status %d", r->index, host, code);
}

static void rank_exited(struct job *job, struct rank *r) {
    int ws = r->wstatus;
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);

    if (r->remote) {
        /* ssh is gone: what it wrote is in the pipe, its reason included. */
        close_fd(&r->stdin_fd);
        stream_read(&r->err, FINAL_DRAIN_BYTES);
    }
    if (code == 0) {
        HVD_INFO("hvdrun", "rank %d (pid %d) exited with status 0", r->index,
                 (int)r->pid);
        return;
    }
    if (job->phase != JOB_RUNNING) {
        /* Most likely hvdrun's own SIGTERM or SIGKILL. */
        HVD_INFO("hvdrun", "rank %d (pid %d) ended with status %d", r->index,
                 (int)r->pid, code);
        return;
    }
    if (r->remote)
        remote_failed(r, code);
    else if (WIFEXITED(ws))
        say("rank %d (pid %d) exited with status %d", r->index, (int)r->pid,
            code);
    else
        say("rank %d (pid %d) was killed by signal %d (%s)", r->index,
            (int)r->pid, WTERMSIG(ws), signal_name(WTERMSIG(ws)));
    job->exit_code = code;
    stop_job(job, SIGTERM);
}

static void reap(struct job *job) {
    for (;;) {
        int ws;
        pid_t pid = waitpid(-1, &ws, WNOHANG);

        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        watchdog_reaped(pid);
        for (int r = 0; r < job->opt->np; r++) {
            struct rank *rk = &job->ranks[r];
            if (rk->state == RANK_RUNNING && rk->pid == pid) {
                rk->state = RANK_EXITED;
                rk->wstatus = ws;
                job->live--;
                rank_exited(job, rk);
                break;
            }
        }
    }
}

static void got_signal(struct job *job, int sig) {
    if (job->phase == JOB_RUNNING) {
        say("got %s; passing it on to the ranks (again to kill them now)",
            signal_name(sig));
        job->exit_code = 128 + sig;
        stop_job(job, sig);
    } else if (job->phase == JOB_STOPPING) {
        say("got %s again; killing the ranks", signal_name(sig));
        kill_ranks(job);
    }
}

void read_signals(struct job *job) {
    unsigned char sigs[64];
    ssize_t n;

    while ((n = read(sig_pipe[0], sigs, sizeof(sigs))) > 0) {
        for (ssize_t k = 0; k < n; k++) {
            if (sigs[k] == SIGCHLD)
                reap(job);
            else
                got_signal(job, sigs[k]);
        }
    }
}
