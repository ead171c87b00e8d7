/*
 * No rank outlives hvdrun. When hvdrun ends on its own it stops and reaps
 * its ranks (stop.c); this file covers the case where it cannot: SIGKILL,
 * the OOM killer, a crash. Two things stand in for it then:
 *  - every child hvdrun forks (a rank, the ssh of a remote rank, mpirun,
 *    the discovery script) asks the kernel for SIGTERM when hvdrun dies
 *    (PR_SET_PDEATHSIG, die_with_hvdrun()): it needs no process to be
 *    left, and a program that handles SIGTERM (Python, torch) ends
 *    cleanly;
 *  - a watchdog process, forked before the first rank and in a process
 *    group of its own (a signal to hvdrun's group does not reach it),
 *    reads a pipe of which only hvdrun holds the write end. hvdrun writes
 *    a note there for each child it starts and reaps. EOF without the
 *    final note means hvdrun died: the watchdog sends SIGTERM to the
 *    process groups of the children still listed (which reaches the
 *    descendants of a rank too, where the parent-death signal reaches only
 *    the rank), SIGKILL after the grace period to what is left (a
 *    program that ignores SIGTERM), removes the job's shared-memory
 *    segments and exits. At a normal end hvdrun writes the final note,
 *    closes the pipe and reaps the watchdog, which then does nothing.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/log.h"
#include "transport/bootstrap/job_id.h"
#include "transport/transport.h"

/* One note on the pipe; 8 bytes, so each write() is atomic. */
struct wd_note {
    char op; /* 'S' started, 'E' reaped, 'G' generation, 'Q' normal end */
    char pad[3];
    int32_t value; /* the pid (and process group), or the generation */
};

/* How often the watchdog looks whether the groups it signalled are gone. */
#define WD_POLL_NS (20 * NS_PER_MS)

/* How long hvdrun waits at its end for the watchdog to exit. */
#define WD_REAP_NS (2 * NS_PER_S)

static int wd_fd = -1;
static pid_t wd_pid;

/* ---- in the children hvdrun forks ---- */

/* In a child of hvdrun, before exec: SIGTERM when hvdrun dies. The signal
 * is asked for after the fork, so hvdrun may already be gone: then the
 * parent is no longer hvdrun and the child goes at once. */
void die_with_hvdrun(pid_t hvdrun_pid) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != hvdrun_pid)
        _exit(EXIT_NOT_RUN);
}

/* ---- in the watchdog ---- */

struct wd_state {
    pid_t *groups;
    size_t n, cap;
    uint32_t generations;
    int ended; /* the final note came */
};

static void wd_add(struct wd_state *s, pid_t pgid) {
    if (s->n == s->cap) {
        size_t cap = s->cap == 0 ? 64 : 2 * s->cap;
        pid_t *g = realloc(s->groups, cap * sizeof(*g));
        if (g == NULL)
            return; /* that child still has its parent-death signal */
        s->groups = g;
        s->cap = cap;
    }
    s->groups[s->n++] = pgid;
}

static void wd_remove(struct wd_state *s, pid_t pgid) {
    for (size_t k = 0; k < s->n; k++) {
        if (s->groups[k] == pgid) {
            s->groups[k] = s->groups[--s->n];
            return;
        }
    }
}

/* Reads the notes until EOF. */
static void wd_read(int fd, struct wd_state *s) {
    struct wd_note note;

    for (;;) {
        ssize_t got = read(fd, &note, sizeof(note));
        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof(note))
            return;
        if (note.op == 'S')
            wd_add(s, (pid_t)note.value);
        else if (note.op == 'E')
            wd_remove(s, (pid_t)note.value);
        else if (note.op == 'G')
            s->generations = (uint32_t)note.value;
        else if (note.op == 'Q')
            s->ended = 1;
    }
}

/* Sends sig to every listed group; returns how many still exist. */
static size_t wd_signal(struct wd_state *s, int sig) {
    size_t alive = 0;

    for (size_t k = 0; k < s->n; k++)
        if (kill(-s->groups[k], sig) == 0 || errno != ESRCH)
            alive++;
    return alive;
}

/* SIGTERM to every group left, SIGKILL to those still there after the
 * grace period. (A group whose processes have exited but are not yet
 * reaped by their new parent still counts: at worst it gets a SIGKILL
 * it does not need.) */
static void wd_stop_groups(struct wd_state *s, int grace_s) {
    int64_t kill_at = hvd_now_ns() + (int64_t)grace_s * NS_PER_S;
    struct timespec pause = {0, WD_POLL_NS};

    if (grace_s > 0) {
        wd_signal(s, SIGTERM);
        wd_signal(s, SIGCONT);
        while (hvd_now_ns() < kill_at && wd_signal(s, 0) > 0)
            nanosleep(&pause, NULL);
    }
    wd_signal(s, SIGKILL);
}

/* The watchdog's life: wait for hvdrun's end, act if it died. */
static void wd_main(int fd, pid_t hvdrun_pid, int grace_s,
                    const uint8_t job_id[HVD_JOB_ID_LEN], const char *secret)
    __attribute__((noreturn));
static void wd_main(int fd, pid_t hvdrun_pid, int grace_s,
                    const uint8_t job_id[HVD_JOB_ID_LEN], const char *secret) {
    struct wd_state s = {0};

    wd_read(fd, &s);
    if (s.ended || s.n == 0)
        _exit(0);
    wd_stop_groups(&s, grace_s);
    /* The segments of ranks killed while hvd_init set them up. */
    hvd_transport_cleanup_job(job_id, secret);
    for (uint32_t g = 1; g <= s.generations; g++) {
        uint8_t id[HVD_JOB_ID_LEN];
        hvd_job_id_of_generation(job_id, g, id);
        hvd_transport_cleanup_job(id, secret);
    }
    /* Said last: a stderr that nobody reads may block the write. */
    say("hvdrun (pid %d) died without stopping its ranks: its watchdog "
        "sent SIGTERM to their %zu process groups, SIGKILL after %d s",
        (int)hvdrun_pid, s.n, grace_s);
    _exit(0);
}

/* Closes descriptors lo to hi, one by one where the kernel has no
 * close_range (up to the limit of open files). */
static void close_fds(unsigned lo, unsigned hi) {
    struct rlimit rl;

    if (close_range(lo, hi, 0) == 0)
        return;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur > (1U << 20))
        rl.rlim_cur = 1U << 20;
    for (unsigned fd = lo; fd <= hi && fd < rl.rlim_cur; fd++)
        close((int)fd);
}

/* In the forked watchdog: only the pipe and stderr stay open (the
 * rendezvous socket and the ranks' pipes must close with hvdrun), and
 * signals to the session or from a terminal neither end nor stop it. */
static void wd_child(int fd, pid_t hvdrun_pid, int grace_s,
                     const uint8_t job_id[HVD_JOB_ID_LEN], const char *secret) {
    static const int ignored[] = {SIGINT,  SIGQUIT, SIGTERM, SIGHUP,
                                  SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU};
    int null_fd = open("/dev/null", O_RDWR);

    setpgid(0, 0);
    /* Its name tells it from hvdrun in ps and pgrep (its command line is
     * hvdrun's). */
    prctl(PR_SET_NAME, "hvdrun-watchdog");
    for (size_t k = 0; k < ARRAY_LEN(ignored); k++)
        signal(ignored[k], SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_SETMASK, &orig_sigmask, NULL);
    if (null_fd >= 0) {
        dup2(null_fd, STDIN_FILENO);
        dup2(null_fd, STDOUT_FILENO);
    }
    if (fd > 3)
        close_fds(3, (unsigned)fd - 1);
    close_fds((unsigned)fd + 1, ~0U);
    wd_main(fd, hvdrun_pid, grace_s, job_id, secret);
}

/* ---- in hvdrun ---- */

int watchdog_start(const struct job *job) {
    pid_t self = getpid();
    sigset_t block, old;
    int p[2];

    if (pipe2(p, O_CLOEXEC) != 0) {
        say("cannot start the watchdog: pipe2() failed: %s", strerror(errno));
        return -1;
    }
    sigemptyset(&block);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        sigaddset(&block, handled_signals[k]);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        wd_child(p[0], self, job->opt->grace_s, job->job_id, job->secret);
    }
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        say("cannot start the watchdog: fork() failed: %s",
            strerror(fork_errno));
        return -1;
    }
    /* A stopped or slow watchdog must never block hvdrun: a note that does
     * not fit is dropped (that child keeps its parent-death signal). */
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    wd_fd = p[1];
    wd_pid = pid;
    HVD_DEBUG("hvdrun", "watchdog: pid %d", (int)pid);
    return 0;
}

static void wd_note(char op, int32_t value) {
    struct wd_note note = {op, {0, 0, 0}, value};

    if (wd_fd < 0)
        return;
    if (write(wd_fd, &note, sizeof(note)) != (ssize_t)sizeof(note))
        HVD_DEBUG("hvdrun", "watchdog: note %c %d dropped: %s", op, (int)value,
                  strerror(errno));
}

void watchdog_started(pid_t pgid) { wd_note('S', (int32_t)pgid); }

void watchdog_reaped(pid_t pid) {
    if (wd_pid != 0 && pid == wd_pid) {
        /* It died before hvdrun: the parent-death signals remain. */
        HVD_WARN("hvdrun", "the watchdog (pid %d) ended early", (int)pid);
        wd_pid = 0;
        close_fd(&wd_fd);
        return;
    }
    wd_note('E', (int32_t)pid);
}

void watchdog_generation(uint32_t generation) {
    wd_note('G', (int32_t)generation);
}

/* The final note, then the watchdog is reaped; a stopped one is not
 * waited for beyond WD_REAP_NS (it then ends on its own, as an orphan). */
void watchdog_finish(void) {
    struct timespec pause = {0, WD_POLL_NS};
    int64_t give_up = hvd_now_ns() + WD_REAP_NS;
    int ws;

    if (wd_fd < 0)
        return;
    wd_note('Q', 0);
    close_fd(&wd_fd);
    while (waitpid(wd_pid, &ws, WNOHANG) == 0 && hvd_now_ns() < give_up)
        nanosleep(&pause, NULL);
    wd_pid = 0;
}
