/*
 * Elastic mode's hosts (elastic.c tells the whole mode): the host list
 * the job may use (from the discovery script, -H/--hostfile or
 * localhost), each host's slots and their cooldowns, blacklisting, and
 * the discovery script itself (run at the start and every
 * --discovery-interval s). It stops workers through elastic_workers.c
 * and calls nothing else of elastic mode.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/log.h"

/* The discovery script is killed after this long. */
#define DISCOVERY_TIMEOUT_S 10
/* More output of the script than this is dropped. */
#define DISCOVERY_MAX_OUTPUT (1024 * 1024)

/* A random cooldown in --blacklist-cooldown-range, in ns; FOREVER without
 * the option. Returns the deadline from now. */
int64_t cooldown_until(const struct options *opt, int64_t now, long *seconds) {
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

/* Makes hl the hosts the job may use now. initial: at the start (no
 * messages). Returns -1 when out of memory (said). */
int apply_hosts(struct job *job, const hvd_hostlist *hl, int initial,
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

int disc_start(struct job *job, int64_t now) {
    struct elastic *el = job->el;
    int p[2];
    sigset_t block, old;
    pid_t self = getpid();
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
        die_with_hvdrun(self);
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
    watchdog_started(pid);
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
void disc_read(struct elastic *el) {
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
int disc_run_now(struct job *job, hvd_hostlist *hl) {
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
void disc_done(struct job *job, int ws, int64_t now) {
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

void blacklist_host(struct job *job, struct ehost *eh, int64_t now) {
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
