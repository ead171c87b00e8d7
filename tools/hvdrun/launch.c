/*
 * Starting the ranks. A rank of this machine is forked and becomes the
 * program (exec_rank()); a rank of another host is a local ssh process
 * that runs remote_script() there, a small sh wrapper that takes the job
 * secret from ssh's stdin and stops the program when that pipe closes.
 * Both are started by launch(), in their own process groups and with
 * their output on pipes that loop.c reads.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport/base/log.h"

/* The line a remote rank's wrapper writes on stderr once it has started
 * the program: "hvdrun-started <job id>". */
char start_marker[64];

/* ---- starting ranks ---- */

/* "rank N", or in an elastic job "worker N", for messages. */
static const char *rank_label(const struct job *job, const struct rank *r) {
    static char label[32];

    snprintf(label, sizeof(label), "%s %d",
             job->opt->elastic ? "worker" : "rank", r->index);
    return label;
}

/* In the child: undoes what hvdrun changed for itself, and goes when
 * hvdrun (hvdrun_pid) dies. */
static void child_reset(pid_t hvdrun_pid) {
    setpgid(0, 0);
    die_with_hvdrun(hvdrun_pid);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        signal(handled_signals[k], SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &orig_sigmask, NULL);
    setrlimit(RLIMIT_NOFILE, &orig_nofile);
}

/* In the child, after a failed exec: says so and exits 127. */
static void exec_failed(const char *prog) __attribute__((noreturn));
static void exec_failed(const char *prog) {
    char msg[512];
    int len = snprintf(msg, sizeof(msg), "hvdrun: cannot run %s: %s\n", prog,
                       strerror(errno));

    if (len > 0)
        write_all(STDERR_FILENO, msg,
                  (size_t)len < sizeof(msg) ? (size_t)len : sizeof(msg) - 1);
    _exit(EXIT_NOT_RUN);
}

/* In the child: becomes rank r's program, or exits 127. */
static void exec_rank(const struct job *job, const struct rank *r, int out_w,
                      int err_w, pid_t hvdrun_pid) __attribute__((noreturn));
static void exec_rank(const struct job *job, const struct rank *r, int out_w,
                      int err_w, pid_t hvdrun_pid) {
    const char *prog = job->opt->prog_argv[0];

    child_reset(hvdrun_pid);
    binding_apply(&job->bind);
    if (r->index != 0 || !job->stdin_to_rank0)
        dup2(job->null_fd, STDIN_FILENO);
    if (out_w >= 0) {
        dup2(out_w, STDOUT_FILENO);
        dup2(err_w, STDERR_FILENO);
    }
    /* Every other descriptor of hvdrun is close-on-exec. Setting environ
     * (rather than execvpe) makes the rank's PATH the one searched. */
    environ = job->env.vars;
    execvp(prog, job->opt->prog_argv);
    exec_failed(prog);
}

/* In the child: becomes the ssh of a remote rank, with hvdrun's own
 * environment (the rank's is in the command ssh runs). */
static void exec_ssh(char **argv, int in_r, int out_w, int err_w,
                     pid_t hvdrun_pid) __attribute__((noreturn));
static void exec_ssh(char **argv, int in_r, int out_w, int err_w,
                     pid_t hvdrun_pid) {
    child_reset(hvdrun_pid);
    dup2(in_r, STDIN_FILENO);
    dup2(out_w, STDOUT_FILENO);
    dup2(err_w, STDERR_FILENO);
    execvp(argv[0], argv);
    exec_failed(argv[0]);
}

/* printf '%s\n' 'message' >&2 */
static void sbuf_say(struct sbuf *b, const char *message) {
    sbuf_add(b, "printf '%s\\n' ");
    sbuf_quote(b, message);
    sbuf_add(b, " >&2");
}

static int is_name(const char *name, size_t len) {
    if (len == 0 || (name[0] >= '0' && name[0] <= '9'))
        return 0;
    for (size_t k = 0; k < len; k++) {
        char c = name[k];
        if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

/* " export NAME='VALUE';" for var "NAME=VALUE" of the rank's environment. */
static void export_var(struct sbuf *b, const char *var) {
    size_t len = strcspn(var, "=");

    if (!is_name(var, len)) {
        HVD_WARN("hvdrun",
                 "%.*s is not a shell variable name; not passed to "
                 "the remote ranks",
                 (int)len, var);
        return;
    }
    sbuf_add(b, " export ");
    sbuf_addn(b, var, len + 1);
    sbuf_quote(b, var + len + 1);
    sbuf_add(b, ";");
}

/*
 * The sh script a remote rank's ssh runs there, on one line (so that any
 * login shell passes it to sh intact). It
 *  - reads the job secret, the first line of its stdin, into HVD_SECRET;
 *  - goes to hvdrun's working directory and exports the rank's HVD_*
 *    variables (the secret excepted) and the -x variables;
 *  - counts the cores there and exports the thread variables, and with
 *    --bind-to picks the CPUs taskset binds the program to (binding.c);
 *  - checks that the program is there, then writes start_marker on
 *    stderr: ssh's status 255 before that line means ssh failed;
 *  - starts the program in the background, in its own session when
 *    setsid(1) is there (so its descendants go with it), with stdin from
 *    /dev/null;
 *  - in a watcher, reads its stdin to EOF: hvdrun closes the pipe to stop
 *    the rank, and the pipe closes when hvdrun or ssh dies; then it sends
 *    SIGTERM, SIGKILL after the grace period;
 *  - waits for the program and exits with its status (128+N when signal N
 *    killed it), which ssh returns.
 * A shell without job control makes a background command ignore SIGINT
 * and SIGQUIT; "trap -" undoes that where the shell allows (bash; dash
 * does not), and the watcher only sends TERM and KILL.
 */
static char *remote_script(const struct job *job, const struct rank *r) {
    const struct options *opt = job->opt;
    const char *host = r->host->name;
    struct sbuf b = {0};
    char msg[PATH_MAX + 512];
    char num[16];

    snprintf(msg, sizeof(msg), "hvdrun: %s on %s: no job secret on stdin",
             rank_label(job, r), host);
    sbuf_add(&b, "IFS= read -r HVD_SECRET || { ");
    sbuf_say(&b, msg);
    sbuf_add(&b, "; exit 1; }; export HVD_SECRET; cd ");
    sbuf_quote(&b, job->cwd);
    sbuf_add(&b, " 2>/dev/null || { if test -d ");
    sbuf_quote(&b, job->cwd);
    sbuf_add(&b, "; then ");
    snprintf(msg, sizeof(msg),
             "hvdrun: cannot start %s on %s: cannot cd to %s there "
             "(ranks run in the directory hvdrun runs in)",
             rank_label(job, r), host, job->cwd);
    sbuf_say(&b, msg);
    sbuf_add(&b, "; else ");
    snprintf(msg, sizeof(msg),
             "hvdrun: cannot start %s on %s: there is no directory %s "
             "there (ranks run in the directory hvdrun runs in)",
             rank_label(job, r), host, job->cwd);
    sbuf_say(&b, msg);
    sbuf_add(&b, "; fi; exit 127; };");

    for (size_t k = 0; k < job->env.n; k++) {
        const char *var = job->env.vars[k];
        if (strncmp(var, "HVD_", 4) == 0 &&
            strncmp(var, "HVD_SECRET=", 11) != 0)
            export_var(&b, var);
    }
    for (int k = 0; k < opt->nexports; k++) {
        size_t len = strcspn(opt->exports[k], "=");
        ssize_t e = env_find(&job->env, opt->exports[k], len);
        if (e >= 0 && strncmp(opt->exports[k], "HVD_", 4) != 0)
            export_var(&b, job->env.vars[e]);
    }
    sbuf_add(&b, " unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE "
                 "OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE");
    for (size_t k = 0; k < ARRAY_LEN(foreign_vars); k++) {
        sbuf_add(&b, " ");
        sbuf_add(&b, foreign_vars[k]);
    }
    sbuf_add(&b, ";");
    binding_remote(&b, job, r, r->slot, r->nslots);

    sbuf_add(&b, " hvd_p=");
    sbuf_quote(&b, opt->prog_argv[0]);
    sbuf_add(&b,
             "; case $hvd_p in */*) test -f \"$hvd_p\" && test -x \"$hvd_p\";; "
             "*) command -v \"$hvd_p\" >/dev/null 2>&1;; esac || { ");
    snprintf(msg, sizeof(msg),
             "hvdrun: cannot run %s on %s: not found or not executable there",
             opt->prog_argv[0], host);
    sbuf_say(&b, msg);
    sbuf_add(&b, "; exit 127; }; exec 3<&0 </dev/null; ");
    sbuf_say(&b, start_marker);
    sbuf_add(&b, "; hvd_s=; command -v setsid >/dev/null 2>&1 && hvd_s=setsid; "
                 "( trap - INT QUIT; exec $hvd_s $hvd_b");
    for (char **a = opt->prog_argv; *a != NULL; a++) {
        sbuf_add(&b, " ");
        sbuf_quote(&b, *a);
    }
    /* The watcher kills its sleep when it is told to go. */
    sbuf_add(&b, " ) 3<&- & hvd_p=$!; hvd_g=$hvd_p; test -n \"$hvd_s\" && "
                 "hvd_g=-$hvd_p; { hvd_t=; trap "
                 "'kill $hvd_t 2>/dev/null; exit 0' TERM; while IFS= read -r "
                 "hvd_l; do :; done; ");
    if (opt->grace_s > 0) {
        snprintf(num, sizeof(num), "%d", opt->grace_s);
        sbuf_add(&b, "kill -s TERM -- $hvd_g; kill -s CONT -- $hvd_g; sleep ");
        sbuf_add(&b, num);
        sbuf_add(&b, " & hvd_t=$!; wait $hvd_t; ");
    }
    /* wait's stderr is dropped: dash reports "Terminated" there. */
    sbuf_add(&b, "kill -s KILL -- $hvd_g; } <&3 >/dev/null 2>&1 & hvd_w=$!; "
                 "exec 3<&-; wait $hvd_p 2>/dev/null; hvd_st=$?; "
                 "kill $hvd_w 2>/dev/null; test -n \"$hvd_s\" && "
                 "kill -s TERM -- $hvd_g 2>/dev/null; exit $hvd_st");
    return b.failed ? NULL : b.p;
}

/* ssh -T -o BatchMode=yes [-p PORT] [-i KEY] [-o OPT]... host 'exec sh -c
 * SCRIPT'. -T: no terminal even where the user's ssh_config asks for one,
 * which would echo the secret and mangle the stream. */
static int ssh_argv(const struct job *job, const struct rank *r,
                    struct strv *a) {
    const struct options *opt = job->opt;
    struct sbuf cmd = {0};
    char *script = remote_script(job, r);

    if (script == NULL)
        return -1;
    strv_push(a, "ssh");
    strv_push(a, "-T");
    strv_push(a, "-o");
    strv_push(a, "BatchMode=yes");
    if (opt->ssh_port != NULL) {
        strv_push(a, "-p");
        strv_push(a, opt->ssh_port);
    }
    if (opt->ssh_identity != NULL) {
        strv_push(a, "-i");
        strv_push(a, opt->ssh_identity);
    }
    for (int k = 0; k < opt->nssh_opts; k++) {
        strv_push(a, "-o");
        strv_push(a, opt->ssh_opts[k]);
    }
    strv_push(a, r->host->name);
    sbuf_add(&cmd, "exec sh -c ");
    sbuf_quote(&cmd, script);
    free(script);
    if (cmd.failed)
        return -1;
    strv_push(a, cmd.p);
    free(cmd.p);
    return a->failed ? -1 : 0;
}

/* Starts rank r as a child of hvdrun: the program itself, or for a remote
 * rank ssh with ssh_args. */
static int launch(struct job *job, struct rank *r, char **ssh_args) {
    int in[2] = {-1, -1};
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    sigset_t block, old;
    pid_t self = getpid();
    pid_t pid;

    if (r->remote && pipe2(in, O_CLOEXEC) != 0) {
        say("cannot start %s: pipe2() failed: %s", rank_label(job, r),
            strerror(errno));
        goto close_pipes;
    }
    if (r->out.buf != NULL) {
        if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
            say("cannot start %s: pipe2() failed: %s", rank_label(job, r),
                strerror(errno));
            goto close_pipes;
        }
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
    }

    /* Until the child has reset its handlers, a signal would run hvdrun's
     * handler in it and write into hvdrun's self-pipe. */
    sigemptyset(&block);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        sigaddset(&block, handled_signals[k]);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid = fork();
    if (pid == 0) {
        if (r->remote)
            exec_ssh(ssh_args, in[0], out[1], err[1], self);
        exec_rank(job, r, out[1], err[1], self);
    }
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        say("cannot start %s: fork() failed: %s", rank_label(job, r),
            strerror(fork_errno));
        goto close_pipes;
    }

    /* Also done in the child; whichever runs first makes the group, so it
     * exists before hvdrun can signal it. */
    setpgid(pid, pid);
    watchdog_started(pid);
    close_fd(&in[0]);
    close_fd(&out[1]);
    close_fd(&err[1]);
    r->out.fd = out[0];
    r->err.fd = err[0];
    r->pid = pid;
    r->state = RANK_RUNNING;
    job->live++;
    if (r->remote) {
        /* The secret line fits the empty pipe; the write end stays open
         * (the wrapper's EOF is the rank's end). A dead ssh is reaped
         * and reported as usual. */
        r->stdin_fd = in[1];
        write_all(r->stdin_fd, job->secret, strlen(job->secret));
        write_all(r->stdin_fd, "\n", 1);
        HVD_INFO("hvdrun", "%s: ssh to %s, pid %d", rank_label(job, r),
                 r->host->name, (int)pid);
    } else {
        HVD_INFO("hvdrun", "%s: pid %d", rank_label(job, r), (int)pid);
    }
    return 0;

close_pipes:
    close_fd(&in[0]);
    close_fd(&in[1]);
    close_fd(&out[0]);
    close_fd(&out[1]);
    close_fd(&err[0]);
    close_fd(&err[1]);
    return -1;
}

/* Starts rank r on this machine, with its thread variables and, with
 * --bind-to, its CPUs (binding.c). */
static int launch_here(struct job *job, struct rank *r) {
    int threads =
        binding_place(&job->bind, job->opt->bind_to, r->slot, r->nslots);
    int rc;

    if (binding_thread_env(job, threads) != 0) {
        say("cannot start %s: out of memory", rank_label(job, r));
        return -1;
    }
    HVD_DEBUG("hvdrun", "%s: %d thread%s, --bind-to %s", rank_label(job, r),
              threads, threads == 1 ? "" : "s", bind_name(job->opt->bind_to));
    rc = launch(job, r, NULL);
    job->bind.bound = 0;
    return rc;
}

int spawn_rank(struct job *job, struct rank *r) {
    struct strv args = {0};
    int rc;

    if (env_set_int(&job->env, "HVD_RANK", r->index) != 0 ||
        env_set_int(&job->env, "HVD_LOCAL_RANK", r->local_rank) != 0 ||
        env_set_int(&job->env, "HVD_LOCAL_SIZE", r->local_size) != 0 ||
        env_set_int(&job->env, "HVD_CROSS_RANK", r->cross_rank) != 0 ||
        env_set_int(&job->env, "HVD_CROSS_SIZE", r->cross_size) != 0 ||
        env_set_int(&job->env, "HOROVOD_RANK", r->index) != 0 ||
        env_set_int(&job->env, "HOROVOD_LOCAL_RANK", r->local_rank) != 0 ||
        env_set_int(&job->env, "HOROVOD_LOCAL_SIZE", r->local_size) != 0 ||
        env_set_int(&job->env, "HOROVOD_CROSS_RANK", r->cross_rank) != 0 ||
        env_set_int(&job->env, "HOROVOD_CROSS_SIZE", r->cross_size) != 0) {
        say("cannot start rank %d: out of memory", r->index);
        return -1;
    }
    r->slot = r->local_rank;
    r->nslots = r->local_size;
    if (!r->remote)
        return launch_here(job, r);
    if (ssh_argv(job, r, &args) != 0) {
        say("cannot start rank %d: out of memory", r->index);
        strv_free(&args);
        return -1;
    }
    if (hvd_log_current >= HVD_LOG_DEBUG) {
        char *text = strv_text(args.v);
        HVD_DEBUG("hvdrun", "rank %d: %s", r->index,
                  text != NULL ? text : "(out of memory)");
        free(text);
    }
    rc = launch(job, r, args.v);
    strv_free(&args);
    return rc;
}

/* 1 if -x names the variable name. */
static int exported(const struct job *job, const char *name) {
    size_t len = strlen(name);

    for (int k = 0; k < job->opt->nexports; k++)
        if (strncmp(job->opt->exports[k], name, len) == 0 &&
            (job->opt->exports[k][len] == '\0' ||
             job->opt->exports[k][len] == '='))
            return 1;
    return 0;
}

/* Elastic: starts worker r (r->index is its worker id) on r->host, with
 * HVD_ELASTIC_WORKER and HVD_HOSTNAME (hostname) set, and for trainers
 * written for horovodrun's elastic driver HOROVOD_HOSTNAME and
 * HOROVOD_RANK: the rank it is expected to get in its first generation
 * (the workers before it in id order; hvd_rank() is what counts).
 * --network-interface names this machine's interface: hosts the discovery
 * script adds later may name theirs otherwise, so a remote worker gets no
 * HVD_IFACE from it and listens where it reached the rendezvous from (-x
 * HVD_IFACE=... sets one for every worker). */
int spawn_worker(struct job *job, struct rank *r, const char *hostname,
                 int expected_rank) {
    struct strv args = {0};
    int rc;

    if (env_set_int(&job->env, "HVD_ELASTIC_WORKER", r->index) != 0 ||
        env_set(&job->env, "HVD_HOSTNAME", hostname) != 0 ||
        env_set(&job->env, "HOROVOD_HOSTNAME", hostname) != 0 ||
        env_set_int(&job->env, "HOROVOD_RANK", expected_rank) != 0) {
        say("cannot start worker %d: out of memory", r->index);
        return -1;
    }
    if (!r->remote)
        return launch_here(job, r);
    int drop_iface = job->opt->iface != NULL && !exported(job, "HVD_IFACE");
    if (drop_iface)
        env_unset(&job->env, "HVD_IFACE");
    rc = ssh_argv(job, r, &args);
    if (drop_iface && env_set(&job->env, "HVD_IFACE", job->opt->iface) != 0)
        rc = -1;
    if (rc != 0) {
        say("cannot start worker %d: out of memory", r->index);
        strv_free(&args);
        return -1;
    }
    rc = launch(job, r, args.v);
    strv_free(&args);
    return rc;
}
