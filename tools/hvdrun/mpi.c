/*
 * hvdrun --mpi: instead of starting the ranks itself, hvdrun runs
 * mpirun (as its child, so that mpirun goes when hvdrun dies) with the
 * same placement, options and HVD_* variables, and hvd
 * bootstraps through MPI. A separate file because nothing of the rest of
 * hvdrun (the job, the rendezvous, the event loop) runs in this mode.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/base/log.h"

/* ---- --mpi ---- */

static int is_hvd_name(const char *const *names, size_t n, const char *name,
                       size_t len) {
    for (size_t k = 0; k < n; k++) {
        if (strlen(names[k]) == len && memcmp(names[k], name, len) == 0)
            return 1;
    }
    return 0;
}

/* --mpi with --config-file: the file's variables go into hvdrun's own
 * environment where not set there (in their HVD_ or HOROVOD_ form), so that
 * they are passed on with -x like every HVD_* variable. */
static int config_to_environ(const struct options *opt) {
    hvd_config_vars cv;
    int rc = 0;

    if (opt->config_file == NULL)
        return 0;
    if (config_read(opt, &cv) != 0)
        return -1;
    for (size_t k = 0; k < cv.n && rc == 0; k++) {
        char *name = strndup(cv.vars[k], strcspn(cv.vars[k], "="));

        if (name == NULL ||
            (config_var_unset(cv.vars[k], environ_lookup, NULL) &&
             setenv(name, strchr(cv.vars[k], '=') + 1, 0) != 0)) {
            say("--config-file %s: out of memory", opt->config_file);
            rc = -1;
        }
        free(name);
    }
    hvd_config_vars_free(&cv);
    return rc;
}

/* -H host:slots,... from -H/--hostfile; -1 for an IPv6 address (said),
 * which mpirun's -H cannot take. */
static int push_hosts(struct strv *a, const struct options *opt) {
    struct sbuf hosts = {0};
    char num[32];

    for (int h = 0; h < opt->nhosts; h++) {
        if (strchr(opt->hosts[h].name, ':') != NULL) {
            say("--mpi: mpirun's -H takes no IPv6 address (%s); name "
                "the host",
                opt->hosts[h].name);
            free(hosts.p);
            return -1;
        }
        snprintf(num, sizeof(num), ":%d", opt->hosts[h].slots);
        if (h > 0)
            sbuf_add(&hosts, ",");
        sbuf_add(&hosts, opt->hosts[h].name);
        sbuf_add(&hosts, num);
    }
    strv_push(a, "-H");
    strv_push(a, hosts.failed ? "" : hosts.p);
    a->failed |= hosts.failed;
    free(hosts.p);
    return 0;
}

/* --mca plm_rsh_args from --ssh-port, --ssh-identity and --ssh-opt, when
 * any is given. */
static void push_ssh_args(struct strv *a, const struct options *opt) {
    struct sbuf rsh = {0};

    if (opt->ssh_port == NULL && opt->ssh_identity == NULL &&
        opt->nssh_opts == 0)
        return;
    if (opt->ssh_port != NULL) {
        sbuf_add(&rsh, " -p ");
        sbuf_add(&rsh, opt->ssh_port);
    }
    if (opt->ssh_identity != NULL) {
        sbuf_add(&rsh, " -i ");
        sbuf_add(&rsh, opt->ssh_identity);
    }
    for (int k = 0; k < opt->nssh_opts; k++) {
        sbuf_add(&rsh, " -o ");
        sbuf_add(&rsh, opt->ssh_opts[k]);
    }
    strv_push(a, "--mca");
    strv_push(a, "plm_rsh_args");
    strv_push(a, rsh.failed ? "" : rsh.p + 1);
    a->failed |= rsh.failed;
    free(rsh.p);
}

/* mpirun's own options: binding, oversubscription, root, --timeout, the
 * interface of Open MPI's traffic and ssh's arguments. */
static void push_mpirun_options(struct strv *a, const struct options *opt,
                                const char *iface) {
    char num[32];

    strv_push(a, "--bind-to");
    strv_push(a, bind_name(opt->bind_to));
    if (opt->oversubscribe)
        strv_push(a, "--oversubscribe");
    if (geteuid() == 0)
        strv_push(a, "--allow-run-as-root");
    if (opt->timeout_s > 0) {
        snprintf(num, sizeof(num), "%ld", opt->timeout_s);
        strv_push(a, "--timeout");
        strv_push(a, num);
    }
    if (iface != NULL && *iface != '\0') {
        /* Open MPI's own traffic over the same interface. */
        strv_push(a, "--mca");
        strv_push(a, "btl_tcp_if_include");
        strv_push(a, iface);
        strv_push(a, "--mca");
        strv_push(a, "oob_tcp_if_include");
        strv_push(a, iface);
    }
    push_ssh_args(a, opt);
}

/* The most ranks mpirun puts on one host: the hosts filled in order up to
 * their slots, the rest round-robin (as hvdrun places them). */
static int most_ranks_per_host(const struct options *opt) {
    int left = opt->np, most = 0;

    if (opt->nhosts == 0)
        return opt->np;
    for (int h = 0; h < opt->nhosts && left > 0; h++) {
        int n = opt->hosts[h].slots < left ? opt->hosts[h].slots : left;
        left -= n;
        most = n > most ? n : most;
    }
    if (left > 0) /* --oversubscribe */
        most += (left + opt->nhosts - 1) / opt->nhosts;
    return most;
}

/* -x NAME=T for each thread variable set neither in hvdrun's environment
 * nor with -x: mpirun binds a rank to one core with --bind-to core, so T
 * is 1 there; else this machine's cores (hvdrun's affinity mask) divided
 * by the most ranks on a host, at least 1. mpirun passes one value to
 * every host, so hosts with other core counts need -x. */
static void push_thread_vars(struct strv *a, const struct options *opt) {
    cpu_set_t set;
    int threads = 1;

    if (opt->bind_to != BIND_CORE &&
        sched_getaffinity(0, sizeof(set), &set) == 0)
        threads = CPU_COUNT(&set) / most_ranks_per_host(opt);
    if (threads < 1)
        threads = 1;
    for (size_t k = 0; k < ARRAY_LEN(thread_vars); k++) {
        size_t len = strlen(thread_vars[k]);
        int given = getenv(thread_vars[k]) != NULL;
        for (int x = 0; x < opt->nexports && !given; x++)
            given =
                strncmp(opt->exports[x], thread_vars[k], len) == 0 &&
                (opt->exports[x][len] == '=' || opt->exports[x][len] == '\0');
        if (given)
            continue;
        char *var;
        if (asprintf(&var, "%s=%d", thread_vars[k], threads) < 0) {
            a->failed = 1;
            return;
        }
        strv_push(a, "-x");
        strv_push(a, var);
        free(var);
    }
}

/* The -x variables: those given with -x, HVD_IFACE from
 * --network-interface, and every other HVD_* variable of hvdrun's
 * environment but the job variables (removed from it). */
static void push_exports(struct strv *a, const struct options *opt) {
    char num[32];

    for (int k = 0; k < opt->nexports; k++) {
        strv_push(a, "-x");
        strv_push(a, opt->exports[k]);
    }
    if (opt->iface != NULL) {
        char *var;
        if (asprintf(&var, "HVD_IFACE=%s", opt->iface) < 0) {
            a->failed = 1;
        } else {
            strv_push(a, "-x");
            strv_push(a, var);
            free(var);
        }
    }
    if (opt->start_timeout_s > 0 &&
        getenv("HVD_START_TIMEOUT_SECONDS") == NULL) {
        snprintf(num, sizeof(num), "%ld", opt->start_timeout_s);
        if (setenv("HVD_START_TIMEOUT_SECONDS", num, 1) != 0)
            a->failed = 1;
    }
    for (size_t k = 0; k < ARRAY_LEN(job_vars); k++)
        unsetenv(job_vars[k]);
    for (char **v = environ; *v != NULL; v++) {
        size_t len = strcspn(*v, "=");
        int given = 0;
        if (strncmp(*v, "HVD_", 4) != 0 || (*v)[len] != '=' ||
            (opt->iface != NULL && len == 9 &&
             strncmp(*v, "HVD_IFACE", 9) == 0))
            continue;
        for (int k = 0; k < opt->nexports && !given; k++)
            given = strcspn(opt->exports[k], "=") == len &&
                    strncmp(opt->exports[k], *v, len) == 0;
        if (given || is_hvd_name(job_vars, ARRAY_LEN(job_vars), *v, len))
            continue;
        char *name = strndup(*v, len);
        if (name == NULL) {
            a->failed = 1;
            break;
        }
        strv_push(a, "-x");
        strv_push(a, name);
        free(name);
    }
}

/* The signals hvdrun passes on to mpirun, which passes them on to the
 * ranks (SIGUSR1 and SIGUSR2) or stops the job (the others). */
static const int passed_signals[] = {SIGINT, SIGQUIT, SIGTERM,
                                     SIGHUP, SIGUSR1, SIGUSR2};
static volatile sig_atomic_t mpirun_pid;

/* A signal from a terminal went to its whole foreground process group,
 * mpirun included: only one that was sent to hvdrun is passed on. */
static void pass_on(int sig, siginfo_t *info, void *ctx) {
    int saved = errno;

    (void)ctx;
    if (info->si_code != SI_KERNEL && mpirun_pid > 0)
        kill((pid_t)mpirun_pid, sig);
    errno = saved;
}

/* In the child: mpirun, with the signal handling hvdrun had at its start
 * (sigmask the mask to restore). */
static void exec_mpirun(char **argv, pid_t hvdrun_pid, const sigset_t *sigmask)
    __attribute__((noreturn));
static void exec_mpirun(char **argv, pid_t hvdrun_pid,
                        const sigset_t *sigmask) {
    die_with_hvdrun(hvdrun_pid);
    for (size_t k = 0; k < ARRAY_LEN(passed_signals); k++)
        signal(passed_signals[k], SIG_DFL);
    sigprocmask(SIG_SETMASK, sigmask, NULL);
    execvp(argv[0], argv);
    say("cannot run mpirun: %s (it comes with Open MPI; without --mpi "
        "hvdrun starts the ranks itself)",
        strerror(errno));
    _exit(EXIT_NOT_RUN);
}

/*
 * Runs mpirun (argv) as a child and returns its exit status; ended by a
 * signal, hvdrun ends by the same signal. mpirun stays in hvdrun's
 * process group, so a terminal's Ctrl-C and its reads of the terminal
 * work as if it were hvdrun. It is a child, not exec'd, so that it gets
 * SIGTERM when hvdrun dies (die_with_hvdrun()): on SIGTERM mpirun stops
 * its ranks (SIGKILL after a moment to those that ignore it), here and on
 * the hosts it reached over ssh.
 */
static int run_child(char **argv) {
    struct sigaction sa;
    sigset_t block, old;
    pid_t self = getpid();
    int ws;

    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = pass_on;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigemptyset(&block);
    for (size_t k = 0; k < ARRAY_LEN(passed_signals); k++)
        sigaddset(&block, passed_signals[k]);
    sigprocmask(SIG_BLOCK, &block, &old);
    for (size_t k = 0; k < ARRAY_LEN(passed_signals); k++)
        sigaction(passed_signals[k], &sa, NULL);
    pid_t pid = fork();
    if (pid == 0)
        exec_mpirun(argv, self, &old);
    int fork_errno = errno;
    mpirun_pid = pid > 0 ? pid : 0;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        say("cannot run mpirun: fork() failed: %s", strerror(fork_errno));
        return EXIT_SETUP;
    }
    while (waitpid(pid, &ws, 0) < 0) {
        if (errno != EINTR) {
            say("waitpid() for mpirun failed: %s", strerror(errno));
            return EXIT_SETUP;
        }
    }
    mpirun_pid = 0;
    if (WIFEXITED(ws))
        return WEXITSTATUS(ws);
    /* As exec'd mpirun would have: the same signal ends hvdrun. */
    signal(WTERMSIG(ws), SIG_DFL);
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    raise(WTERMSIG(ws));
    return 128 + WTERMSIG(ws);
}

/*
 * --mpi: runs mpirun -np N [-H host:slots,...] --bind-to B
 * [--oversubscribe] [--allow-run-as-root] [-x ...] program args. The ranks
 * bootstrap through MPI, so none of hvdrun's job variables is set (and any
 * in hvdrun's environment are removed); the -x variables and the HVD_*
 * variables of hvdrun's environment are passed with -x, and so are the
 * thread variables (push_thread_vars()). Returns hvdrun's
 * exit status: mpirun's (run_child()).
 */
int run_mpirun(const struct options *opt) {
    const char *iface = opt->iface != NULL ? opt->iface : getenv("HVD_IFACE");
    struct strv a = {0};
    char num[32];

    if (config_to_environ(opt) != 0)
        return EXIT_USAGE;
    strv_push(&a, "mpirun");
    strv_push(&a, "-np");
    snprintf(num, sizeof(num), "%d", opt->np);
    strv_push(&a, num);
    if (opt->nhosts > 0 && push_hosts(&a, opt) != 0) {
        strv_free(&a);
        return EXIT_USAGE;
    }
    push_mpirun_options(&a, opt, iface);
    push_exports(&a, opt);
    push_thread_vars(&a, opt);
    for (char **arg = opt->prog_argv; *arg != NULL; arg++)
        strv_push(&a, *arg);
    if (a.failed) {
        say("out of memory");
        strv_free(&a);
        return EXIT_SETUP;
    }

    if (opt->verbose || hvd_log_current >= HVD_LOG_INFO) {
        char *text = strv_text(a.v);
        say("running %s", text != NULL ? text : "mpirun (out of memory)");
        free(text);
    }
    fflush(stdout);
    int code = run_child(a.v);
    strv_free(&a);
    return code;
}
