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
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

#define FOREVER INT64_MAX
/* The discovery script is killed after this long. */
#define DISCOVERY_TIMEOUT_S 10
/* More output of the script than this is dropped. */
#define DISCOVERY_MAX_OUTPUT (1024 * 1024)
/* After a worker could not be started, the next try waits this long. */
#define START_RETRY_NS NS_PER_S
/* Worker ids of a job without --reset-limit (or --max-np). */
#define UNLIMITED_WORKER_IDS 4096
#define MAX_WORKER_IDS 16384 /* the server keeps a record per id */

/* Variables hvdrun sets for each elastic worker. */
const char *const elastic_vars[] = {"HVD_ELASTIC", "HVD_ELASTIC_WORKER",
                                    "HVD_ELASTIC_TIMEOUT_SECONDS",
                                    "HVD_HOSTNAME"};

struct worker;

struct ehost {
    struct host h; /* name (owned), slots, local, logging_in */
    int listed;    /* in the latest host list */
    int was_listed;
    int order; /* its place in that list */
    int failures;
    int blacklisted;
    int64_t back_at_ns;  /* end of the blacklisting; FOREVER: never */
    int cap;             /* entries of cool_until and occupant */
    int64_t *cool_until; /* per slot: 0 free, else cooling until (FOREVER) */
    struct worker **occupant;
};

struct worker {
    struct rank r; /* r.index: the worker id */
    struct ehost *host;
    int slot;
    int stopped;        /* hvdrun stopped it */
    int removed;        /* the server was told */
    int64_t kill_at_ns; /* SIGKILL then; 0: none due */
};

struct elastic {
    struct ehost **hosts; /* every host listed so far: listed ones first,
                             in list order */
    int nhosts;
    struct worker **workers; /* started, and process or pipes not done */
    int nworkers;
    int cap_workers;
    int np, min_np, max_np; /* max_np INT_MAX: no limit */
    int target;             /* the fill's aim: np, then max_np */
    int next_id;
    int max_ids;
    int said_id_limit;
    int running; /* processes not reaped */
    int active;  /* of those, not stopped by hvdrun */
    int finishing;
    int finish_code; /* first failure after finishing began; -1: none */
    int ending;
    int64_t below_min_since;
    int64_t partial_since;
    int said_partial;
    int64_t start_retry_at;
    uint32_t generation;
    /* the discovery script */
    pid_t disc_pid; /* 0: not running */
    int disc_fd;
    int disc_timed_out;
    struct sbuf disc_out;
    int64_t disc_kill_at;
    int64_t disc_next_at;
    int pfd_cap;
};

/* ---- small helpers ---- */

/* A random cooldown in --blacklist-cooldown-range, in ns; FOREVER without
 * the option. Returns the deadline from now. */
static int64_t cooldown_until(const struct options *opt, int64_t now,
                              long *seconds) {
    long span, s;

    if (!opt->have_cooldown) {
        *seconds = -1;
        return FOREVER;
    }
    span = opt->cooldown_max_s - opt->cooldown_min_s;
    s = opt->cooldown_min_s + (span > 0 ? random() % (span + 1) : 0);
    *seconds = s;
    return now + s * NS_PER_S;
}

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

static void worker_free(struct worker *w) {
    close_fd(&w->r.out.fd);
    close_fd(&w->r.err.fd);
    close_fd(&w->r.stdin_fd);
    free(w->r.out.buf);
    free(w->r.err.buf);
    free(w);
}

/* What ended worker w, for messages and the server's log. */
static void exit_text(const struct worker *w, int code, char *why, size_t len) {
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

/* ---- hosts ---- */

static struct ehost *find_host(struct elastic *el, const char *name) {
    for (int k = 0; k < el->nhosts; k++) {
        if (strcmp(el->hosts[k]->h.name, name) == 0)
            return el->hosts[k];
    }
    return NULL;
}

static struct ehost *add_host(struct elastic *el, const char *name) {
    struct ehost **hosts =
        realloc(el->hosts, (size_t)(el->nhosts + 1) * sizeof(*hosts));
    struct ehost *eh;
    int local;

    if (hosts == NULL)
        return NULL;
    el->hosts = hosts;
    local = host_is_this_machine(name);
    if (local < 0)
        return NULL;
    eh = calloc(1, sizeof(*eh));
    if (eh == NULL || (eh->h.name = strdup(name)) == NULL) {
        free(eh);
        return NULL;
    }
    eh->h.local = local;
    eh->h.cross_rank = -1;
    el->hosts[el->nhosts++] = eh;
    HVD_INFO("hvdrun", "host %s: %s", name,
             local ? "this machine (forked)" : "over ssh");
    return eh;
}

static int host_grow(struct ehost *eh, int slots) {
    if (slots > eh->cap) {
        int64_t *cool = realloc(eh->cool_until, (size_t)slots * sizeof(*cool));
        if (cool == NULL)
            return -1;
        eh->cool_until = cool;
        struct worker **occ =
            realloc(eh->occupant, (size_t)slots * sizeof(*occ));
        if (occ == NULL)
            return -1;
        eh->occupant = occ;
        for (int s = eh->cap; s < slots; s++) {
            eh->cool_until[s] = 0;
            eh->occupant[s] = NULL;
        }
        eh->cap = slots;
    }
    eh->h.slots = slots;
    return 0;
}

static int host_order(const void *a, const void *b) {
    const struct ehost *x = *(const struct ehost *const *)a;
    const struct ehost *y = *(const struct ehost *const *)b;

    if (x->listed != y->listed)
        return y->listed - x->listed;
    return x->order - y->order;
}

static void stop_worker(struct job *job, struct worker *w, int sig,
                        const char *why, int64_t now);

/* Stops the workers of eh on slots from first on; returns how many. */
static int stop_host_workers(struct job *job, struct ehost *eh, int first,
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

/* Makes hl the hosts the job may use now. initial: at the start (no
 * messages). Returns -1 when out of memory (said). */
static int apply_hosts(struct job *job, const hvd_hostlist *hl, int initial,
                       int64_t now) {
    struct elastic *el = job->el;
    int changed = 0;
    char why[512];

    for (int k = 0; k < el->nhosts; k++) {
        el->hosts[k]->was_listed = el->hosts[k]->listed;
        el->hosts[k]->listed = 0;
    }
    for (int k = 0; k < hl->n; k++) {
        const char *name = hl->v[k].name;
        int slots = hl->v[k].slots;
        struct ehost *eh = find_host(el, name);
        int is_new = eh == NULL;
        int old_slots = is_new ? 0 : eh->h.slots;

        if (eh != NULL && eh->listed)
            continue; /* named twice: the first counts */
        if (is_new && (eh = add_host(el, name)) == NULL) {
            say("host %s: cannot be added (out of memory, or see above)", name);
            return -1;
        }
        if (host_grow(eh, slots) != 0) {
            say("out of memory");
            return -1;
        }
        eh->listed = 1;
        eh->order = k;
        if (initial)
            continue;
        if (is_new || !eh->was_listed) {
            say("host %s (%d slot%s) %s the discovery output", name, slots,
                slots == 1 ? "" : "s", is_new ? "joined" : "is back in");
            changed = 1;
            if (!eh->h.local && strncmp(job->bind_addr, "127.", 4) == 0)
                say("host %s is not this machine, but the rendezvous "
                    "listens on %s: its workers cannot reach it (give "
                    "--network-interface)",
                    name, job->bind_addr);
        } else if (slots != old_slots) {
            say("host %s now has %d slot%s instead of %d", name, slots,
                slots == 1 ? "" : "s", old_slots);
            changed = 1;
            snprintf(why, sizeof(why), "host %s now has %d slots", name, slots);
            stop_host_workers(job, eh, slots, why, now);
        }
    }
    for (int k = 0; k < el->nhosts; k++) {
        struct ehost *eh = el->hosts[k];
        if (!eh->was_listed || eh->listed || initial)
            continue;
        snprintf(why, sizeof(why), "host %s left the discovery output",
                 eh->h.name);
        int n = stop_host_workers(job, eh, 0, why, now);
        if (n > 0)
            say("%s: stopping its %d worker%s", why, n, n == 1 ? "" : "s");
        else
            say("%s", why);
        changed = 1;
    }
    qsort(el->hosts, (size_t)el->nhosts, sizeof(*el->hosts), host_order);
    if (changed)
        el->target = el->max_np;
    return 0;
}

/*
 * The discovery script's output as a host list: a line is "host" or
 * "host:slots" ("[v6]:slots"), # starts a comment, blank lines are
 * skipped; a host without slots gets default_slots.
 */
static int parse_discovery(const char *text, size_t len, int default_slots,
                           hvd_hostlist *hl, char *err, size_t errlen) {
    size_t pos = 0;
    int lineno = 0;

    while (pos < len) {
        size_t end = pos;
        char line[512], spec[600], e[256];
        size_t n;

        while (end < len && text[end] != '\n')
            end++;
        lineno++;
        n = end - pos;
        for (size_t k = 0; k < n; k++) {
            if (text[pos + k] == '#') {
                n = k;
                break;
            }
        }
        while (n > 0 && strchr(" \t\r", text[pos]) != NULL && text[pos]) {
            pos++;
            n--;
        }
        while (n > 0 && strchr(" \t\r", text[pos + n - 1]) != NULL)
            n--;
        if (n >= sizeof(line)) {
            snprintf(err, errlen, "line %d is too long", lineno);
            return -1;
        }
        memcpy(line, text + pos, n);
        line[n] = '\0';
        pos = end + 1;
        if (n == 0)
            continue;
        if (memchr(line, '\0', n) != NULL || strchr(line, ',') != NULL) {
            snprintf(err, errlen, "line %d: \"%s\" is not a host", lineno,
                     line);
            return -1;
        }
        int colons = 0;
        for (const char *c = line; *c != '\0'; c++)
            colons += *c == ':';
        int has_slots =
            line[0] == '[' ? strstr(line, "]:") != NULL : colons == 1;
        if (has_slots)
            snprintf(spec, sizeof(spec), "%s", line);
        else if (colons > 1 && line[0] != '[')
            snprintf(spec, sizeof(spec), "[%s]:%d", line, default_slots);
        else
            snprintf(spec, sizeof(spec), "%s:%d", line, default_slots);
        if (hvd_hostlist_parse_list(hl, spec, e, sizeof(e)) != 0) {
            snprintf(err, errlen, "line %d: %s", lineno, e);
            return -1;
        }
    }
    return 0;
}

/* ---- the discovery script ---- */

static int disc_start(struct job *job, int64_t now) {
    struct elastic *el = job->el;
    int p[2];
    sigset_t block, old;
    pid_t pid;

    if (pipe2(p, O_CLOEXEC) != 0) {
        say("cannot run --host-discovery-script: pipe2() failed: %s",
            strerror(errno));
        return -1;
    }
    sigemptyset(&block);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        sigaddset(&block, handled_signals[k]);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
            signal(handled_signals[k], SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, &orig_sigmask, NULL);
        dup2(job->null_fd, STDIN_FILENO);
        dup2(p[1], STDOUT_FILENO);
        execl("/bin/sh", "sh", "-c", job->opt->discovery_script, (char *)NULL);
        _exit(EXIT_NOT_RUN);
    }
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        say("cannot run --host-discovery-script: fork() failed: %s",
            strerror(fork_errno));
        return -1;
    }
    setpgid(pid, pid);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    el->disc_pid = pid;
    el->disc_fd = p[0];
    el->disc_timed_out = 0;
    el->disc_out.len = 0;
    el->disc_out.failed = 0;
    el->disc_kill_at = now + DISCOVERY_TIMEOUT_S * NS_PER_S;
    return 0;
}

/* Reads what the script wrote; closes the pipe at EOF. */
static void disc_read(struct elastic *el) {
    char chunk[4096];

    while (el->disc_fd >= 0) {
        ssize_t n = read(el->disc_fd, chunk, sizeof(chunk));
        if (n > 0) {
            if (el->disc_out.len + (size_t)n <= DISCOVERY_MAX_OUTPUT)
                sbuf_addn(&el->disc_out, chunk, (size_t)n);
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close_fd(&el->disc_fd);
        } else if (errno == EAGAIN) {
            return;
        }
    }
}

/* The script ended with ws: its hosts, or why not in err. */
static int disc_result(struct job *job, int ws, hvd_hostlist *hl, char *err,
                       size_t errlen) {
    struct elastic *el = job->el;
    const struct options *opt = job->opt;
    int slots = opt->slots > 0 ? opt->slots : 1;

    disc_read(el);
    close_fd(&el->disc_fd);
    el->disc_pid = 0;
    if (el->disc_timed_out) {
        snprintf(err, errlen, "did not finish within %d s (killed)",
                 DISCOVERY_TIMEOUT_S);
        return -1;
    }
    if (!WIFEXITED(ws)) {
        snprintf(err, errlen, "was killed by %s", signal_name(WTERMSIG(ws)));
        return -1;
    }
    if (WEXITSTATUS(ws) != 0) {
        snprintf(err, errlen, "exited with status %d", WEXITSTATUS(ws));
        return -1;
    }
    if (el->disc_out.failed) {
        snprintf(err, errlen, "out of memory for its output");
        return -1;
    }
    return parse_discovery(el->disc_out.p != NULL ? el->disc_out.p : "",
                           el->disc_out.len, slots, hl, err, errlen);
}

/* At the start: runs the script and waits for it (DISCOVERY_TIMEOUT_S). */
static int disc_run_now(struct job *job, hvd_hostlist *hl) {
    struct elastic *el = job->el;
    char err[1024];
    int ws = 0;

    if (disc_start(job, hvd_now_ns()) != 0)
        return -1;
    for (;;) {
        int64_t now = hvd_now_ns();
        pid_t got = waitpid(el->disc_pid, &ws, WNOHANG);

        if (got == el->disc_pid)
            break;
        if (now >= el->disc_kill_at && !el->disc_timed_out) {
            kill(-el->disc_pid, SIGKILL);
            el->disc_timed_out = 1;
        }
        if (el->disc_fd >= 0) {
            struct pollfd pfd = {.fd = el->disc_fd, .events = POLLIN};
            poll(&pfd, 1, 20);
            disc_read(el);
        } else {
            usleep(10000);
        }
    }
    if (disc_result(job, ws, hl, err, sizeof(err)) != 0) {
        say("--host-discovery-script %s %s", job->opt->discovery_script, err);
        return -1;
    }
    return 0;
}

/* Later runs: the script was reaped with ws. */
static void disc_done(struct job *job, int ws, int64_t now) {
    struct elastic *el = job->el;
    hvd_hostlist hl = {0};
    char err[1024];

    el->disc_next_at = now + job->opt->discovery_interval_s * NS_PER_S;
    if (disc_result(job, ws, &hl, err, sizeof(err)) != 0) {
        say("--host-discovery-script %s %s; keeping the last hosts",
            job->opt->discovery_script, err);
    } else if (!el->ending && !el->finishing &&
               apply_hosts(job, &hl, 0, now) != 0) {
        say("cannot take in the discovered hosts; keeping the last ones");
    }
    hvd_hostlist_free(&hl);
}

/* ---- workers ---- */

static int start_worker(struct job *job, struct ehost *eh, int slot) {
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
static void stop_worker(struct job *job, struct worker *w, int sig,
                        const char *why, int64_t now) {
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

static void kill_all(struct job *job) {
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
static void end_job(struct job *job, int code, const char *why, int sig,
                    int64_t now) {
    struct elastic *el = job->el;

    if (el->ending)
        return;
    el->ending = 1;
    job->exit_code = code;
    hvd_rdv_server_end(job->srv, why);
    for (int k = 0; k < el->nworkers; k++)
        stop_worker(job, el->workers[k], sig, why, now);
}

static void blacklist(struct job *job, struct ehost *eh, int64_t now) {
    const struct options *opt = job->opt;
    char why[512], back[64] = "";
    long secs;
    int n;

    eh->blacklisted = 1;
    eh->back_at_ns = cooldown_until(opt, now, &secs);
    if (secs >= 0)
        snprintf(back, sizeof(back), "; it comes back in %ld s", secs);
    snprintf(why, sizeof(why), "host %s is blacklisted", eh->h.name);
    n = stop_host_workers(job, eh, 0, why, now);
    say("host %s is blacklisted after %d failed workers (--host-failures "
        "%d)%s%s%s",
        eh->h.name, eh->failures, opt->host_failures,
        n > 0 ? "; stopping its other workers" : "", back,
        secs < 0 ? "; it is not used again" : "");
}

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
        blacklist(job, eh, now);
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
        kill_all(job);
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
        kill_all(job);
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

/* ---- setup ---- */

int elastic_setup(struct job *job) {
    const struct options *opt = job->opt;
    struct elastic *el;
    hvd_hostlist hl = {0};
    char job_hex[2 * HVD_JOB_ID_LEN + 1];
    const char **remote = NULL;
    int nremote = 0;
    long free_slots = 0;
    int rc = -1;

    el = calloc(1, sizeof(*el));
    if (el == NULL)
        goto no_memory;
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

    switch (env_build(&job->env, opt)) {
    case 0:
        break;
    case -2:
        return -1;
    default:
        goto no_memory;
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
                    2 * opt->elastic_timeout_s + 10) != 0)
        goto no_memory;

    /* The hosts. */
    if (opt->discovery_script != NULL) {
        if (disc_run_now(job, &hl) != 0)
            goto out;
    } else if (opt->nhosts > 0) {
        for (int h = 0; h < opt->nhosts; h++) {
            char spec[1100];
            char err[512];
            snprintf(spec, sizeof(spec),
                     strchr(opt->hosts[h].name, ':') != NULL ? "[%s]:%d"
                                                             : "%s:%d",
                     opt->hosts[h].name, opt->hosts[h].slots);
            if (hvd_hostlist_parse_list(&hl, spec, err, sizeof(err)) != 0) {
                say("%s", err);
                goto out;
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
        if (hvd_hostlist_parse_list(&hl, spec, err, sizeof(err)) != 0) {
            say("%s", err);
            goto out;
        }
    }
    if (apply_hosts(job, &hl, 1, hvd_now_ns()) != 0)
        goto out;

    /* The counts, now that the slots are known. */
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
    {
        long bound = opt->max_np > 0       ? opt->max_np
                     : free_slots > el->np ? free_slots
                     : el->np > 0          ? el->np
                                           : 1;
        long ids = opt->reset_limit >= 0 ? bound * (opt->reset_limit + 1) + 64
                                         : UNLIMITED_WORKER_IDS;
        if (opt->reset_limit < 0 && 2 * bound + 64 > ids)
            ids = 2 * bound + 64;
        el->max_ids = ids > MAX_WORKER_IDS ? MAX_WORKER_IDS : (int)ids;
    }

    /* Where the rendezvous listens: towards the first remote host. */
    remote = calloc((size_t)el->nhosts + 1, sizeof(*remote));
    if (remote == NULL)
        goto no_memory;
    for (int k = 0; k < el->nhosts; k++) {
        if (!el->hosts[k]->h.local)
            remote[nremote++] = el->hosts[k]->h.name;
    }
    if (nremote > 0 && job->cwd[0] == '\0') {
        say("getcwd() failed: %s (remote workers run in hvdrun's working "
            "directory)",
            strerror(errno));
        goto out;
    }
    if (bind_addr_choose(job, env_get(&job->env, "HVD_IFACE"), remote,
                         nremote) != 0 ||
        job_identity(job, job_hex) != 0)
        goto out;

    hvd_status st = hvd_rdv_server_create_elastic(
        job->bind_addr, 0, el->max_ids, el->min_np, job->job_id, job->secret,
        &job->srv);
    if (st != HVD_OK) {
        say("cannot start the rendezvous server on %s: %s", job->bind_addr,
            hvd_error_get());
        goto out;
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
        env_set(&job->env, "HVD_JOB_ID", job_hex) != 0)
        goto no_memory;
    {
        long most = el->max_np != INT_MAX ? el->max_np : free_slots;
        if (most < el->np)
            most = el->np;
        /* Stopped workers may still hold their pipes while new ones run. */
        if (raise_nofile((int)most, (rlim_t)(6 * most + 16)) != 0)
            goto out;
    }
    rc = 0;
    goto out;

no_memory:
    say("out of memory");
out:
    free(remote);
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
