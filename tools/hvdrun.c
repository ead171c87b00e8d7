/*
 * hvdrun: starts the ranks of an hvd job and serves their rendezvous.
 *
 *     hvdrun -np N [options] [--] program [args...]
 *
 * hvdrun makes a fresh job secret and job id, opens the rendezvous server
 * (transport/rendezvous.h) and starts N copies of the program, each in its
 * own process group and with HVD_RANK, HVD_SIZE, ... in its environment.
 * Then one poll() loop copies every rank's output to hvdrun's own, one
 * "[rank] line" per write(), serves the rendezvous and reaps the ranks. The
 * first rank that fails takes the job down: the others get SIGTERM, SIGKILL
 * after the grace period, and hvdrun exits with the failed rank's status.
 * The job ends when the ranks end; the rendezvous never holds it up.
 *
 * Ranks run on this machine only, for now. Placement (which rank runs where,
 * with which local and cross rank) is decided in place_ranks(), and a rank's
 * environment is a list of NAME=VALUE assignments built before it starts, so
 * a remote launch (ssh host env NAME=VALUE... program) is one more branch in
 * spawn_rank() beside launch_local().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/rand.h>

#include "hvd/hvd.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/net.h"
#include "transport/rendezvous.h"

#define MAX_RANKS 4096
#define DEFAULT_GRACE_S 3
#define MAX_SECONDS (7L * 24 * 3600) /* as the library accepts */
#define SECRET_BYTES 32
/* Longest line copied in one piece; a longer one is cut, each piece
 * prefixed. */
#define LINE_MAX_BYTES (64 * 1024)
#define LINE_INITIAL_CAP 256
/* At the end, at most this much more is read from a pipe that a leftover
 * descendant of a rank still holds open. */
#define FINAL_DRAIN_BYTES (1024 * 1024)
/* After the rendezvous server reports an error, its descriptor is left out
 * of poll() this long, so a broken server cannot spin the loop. */
#define RDV_BACKOFF_NS (100 * 1000000LL)
#define READ_CHUNK (64 * 1024)
#define NS_PER_S 1000000000LL
#define NS_PER_MS 1000000LL

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define EXIT_SETUP 1
#define EXIT_USAGE 2
#define EXIT_TIMEOUT 124
#define EXIT_NOT_RUN 127

struct options {
    int np;
    int prefix; /* 0 with --no-prefix */
    int grace_s;
    long start_timeout_s; /* 0: not given */
    long timeout_s;       /* 0: no job timeout */
    const char *iface;    /* --network-interface, or NULL */
    int verbose;
    const char **exports; /* the -x arguments, pointing into argv */
    int nexports;
    char **prog_argv; /* the program and its arguments, from argv */
};

/* An environment under construction: "NAME=VALUE" strings, owned, and a
 * NULL after the last, so vars can become a child's environ. */
struct env {
    char **vars;
    size_t n;
    size_t cap;
};

/* One output stream (stdout or stderr) of a rank. */
struct stream {
    int fd;     /* read end of the rank's pipe; -1 when closed or unused */
    int out_fd; /* where its lines go: STDOUT_FILENO or STDERR_FILENO */
    char *buf;  /* "[rank] " followed by the pending part of a line */
    size_t prefix_len;
    size_t len; /* bytes pending after the prefix */
    size_t cap; /* bytes allocated for buf */
};

enum rank_state { RANK_UNSTARTED, RANK_RUNNING, RANK_EXITED };

struct rank {
    int index;
    int local_rank, local_size; /* among the ranks of its host */
    int cross_rank, cross_size; /* its host among the job's hosts */
    pid_t pid;                  /* also its process group id */
    enum rank_state state;
    int wstatus; /* from waitpid(), once exited */
    struct stream out;
    struct stream err;
};

enum job_phase {
    JOB_RUNNING,
    JOB_STOPPING, /* ranks got SIGTERM (or hvdrun's signal); kill_at_ns set */
    JOB_KILLED    /* ranks got SIGKILL */
};

struct job {
    const struct options *opt;
    struct rank *ranks;
    int live; /* ranks started and not yet reaped */
    struct env env;
    hvd_rdv_server *srv;
    char bind_addr[INET_ADDRSTRLEN];
    int joined;
    int null_fd; /* /dev/null, the stdin of ranks that get none */
    int stdin_to_rank0;
    enum job_phase phase;
    int exit_code; /* -1 until the job's outcome is decided */
    int64_t kill_at_ns;
    int64_t timeout_at_ns; /* 0: none */
    int64_t rdv_quiet_until_ns;
    struct pollfd *pfds;
    struct stream **pfd_streams; /* the stream of each pfds entry, or NULL */
};

/* What hvdrun changed for itself, restored in each rank before exec. */
static sigset_t orig_sigmask;
static struct rlimit orig_nofile;
static const int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

/* The self-pipe: signal handlers write the signal number into it. */
static int sig_pipe[2] = {-1, -1};

/* Variables hvdrun sets for each rank; -x cannot override them. */
static const char *const job_vars[] = {"HVD_RANK",
                                       "HVD_SIZE",
                                       "HVD_LOCAL_RANK",
                                       "HVD_LOCAL_SIZE",
                                       "HVD_CROSS_RANK",
                                       "HVD_CROSS_SIZE",
                                       "HVD_RENDEZVOUS_ADDR",
                                       "HVD_RENDEZVOUS_PORT",
                                       "HVD_SECRET",
                                       "HVD_JOB_ID"};

/* Variables of other launchers that the library would otherwise read. */
static const char *const foreign_vars[] = {
    "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
static const char foreign_prefix[] = "OMPI_COMM_WORLD_";

static const char usage_text[] =
    "usage: hvdrun -np N [options] [--] program [args...]\n"
    "\n"
    "Starts N ranks of an hvd job on this machine and serves their\n"
    "rendezvous. Options come before the program (or before --).\n"
    "\n"
    "options:\n"
    "  -np N, -n N, --num-proc N\n"
    "                     number of ranks, 1 to 4096 (required)\n"
    "  -x NAME=VALUE      set NAME=VALUE for every rank (repeatable)\n"
    "  -x NAME            pass hvdrun's value of NAME to every rank\n"
    "  --network-interface IFACE\n"
    "                     serve the rendezvous on the IPv4 address of IFACE\n"
    "                     and set HVD_IFACE=IFACE for the ranks (default:\n"
    "                     HVD_IFACE from the environment, else 127.0.0.1)\n"
    "  --start-timeout S  set HVD_START_TIMEOUT_SECONDS=S (how long hvd_init\n"
    "                     waits for the other ranks) unless already set\n"
    "  --timeout S        stop the job after S seconds (exit status 124)\n"
    "  --grace-seconds S  seconds between SIGTERM and SIGKILL when the job\n"
    "                     is stopped (default 3; 0: SIGKILL at once)\n"
    "  --no-prefix        pass the ranks' output through untouched instead\n"
    "                     of as \"[rank] line\"\n"
    "  -v, --verbose      log what hvdrun does (info level)\n"
    "  --help             print this text\n"
    "  --version          print hvdrun's version\n"
    "\n"
    "Every rank gets HVD_RANK, HVD_SIZE, HVD_LOCAL_RANK, HVD_LOCAL_SIZE,\n"
    "HVD_CROSS_RANK, HVD_CROSS_SIZE, HVD_RENDEZVOUS_ADDR, "
    "HVD_RENDEZVOUS_PORT,\n"
    "HVD_SECRET and HVD_JOB_ID (fresh for each job), plus HVD_IFACE and\n"
    "HVD_START_TIMEOUT_SECONDS from the options above. OMPI_COMM_WORLD_*,\n"
    "PMI_RANK, PMI_SIZE, SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID are\n"
    "removed, so that an outer launcher's values do not count. HVD_LOG_LEVEL\n"
    "sets the log level of hvdrun and of the ranks.\n"
    "\n"
    "When a rank fails (non-zero exit or a signal), the other ranks get\n"
    "SIGTERM and, after the grace period, SIGKILL. SIGINT, SIGTERM and SIGHUP\n"
    "sent to hvdrun are passed on to the ranks the same way; a second one\n"
    "kills them at once.\n"
    "\n"
    "exit status: 0 when every rank exits 0; else the first failed rank's\n"
    "status (128+N for signal N); 128+N when hvdrun got signal N; 124 after\n"
    "--timeout; 127 when the program cannot be run; 2 for a usage error;\n"
    "1 when hvdrun itself cannot start the job.\n";

/* ---- output helpers ---- */

/* Writes all of buf; gives up quietly on errors (EPIPE: nobody reads). */
static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* Prints "hvdrun: <message>\n" on stderr in one write(). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char line[1024];
    int len = snprintf(line, sizeof(line), "hvdrun: ");
    va_list ap;

    va_start(ap, fmt);
    int more = vsnprintf(line + len, sizeof(line) - (size_t)len, fmt, ap);
    va_end(ap);
    if (more > 0)
        len += more;
    if ((size_t)len > sizeof(line) - 2)
        len = (int)sizeof(line) - 2;
    line[len++] = '\n';
    write_all(STDERR_FILENO, line, (size_t)len);
}

static void usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static void usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    say("%s (see hvdrun --help)", msg);
}

static const char *signal_name(int sig) {
    const char *abbrev = sigabbrev_np(sig);
    static char name[32];

    snprintf(name, sizeof(name), "SIG%s", abbrev != NULL ? abbrev : "?");
    return name;
}

/* ---- options ---- */

/* Is arg option name, as "name value" or "name=value"? Then *value_out
 * gets the value (and *i moves past it). Returns 1 on a match, 0 if arg is
 * another option, -1 (after a message) if the value is missing. */
static int value_option(int argc, char **argv, int *i, const char *name,
                        const char **value_out) {
    const char *arg = argv[*i];
    size_t len = strlen(name);

    if (strncmp(arg, name, len) != 0)
        return 0;
    if (arg[len] == '=') {
        *value_out = arg + len + 1;
        return 1;
    }
    if (arg[len] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        usage_error("%s needs a value", name);
        return -1;
    }
    *value_out = argv[++*i];
    return 1;
}

static int parse_long(const char *name, const char *text, long min, long max,
                      long *value_out) {
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        usage_error("%s %s: expected a whole number from %ld to %ld", name,
                    text, min, max);
        return -1;
    }
    *value_out = v;
    return 0;
}

static int is_job_var(const char *name, size_t len) {
    for (size_t k = 0; k < ARRAY_LEN(job_vars); k++) {
        if (strlen(job_vars[k]) == len && memcmp(job_vars[k], name, len) == 0)
            return 1;
    }
    return 0;
}

static int check_export(const char *arg) {
    size_t len = strcspn(arg, "=");

    if (len == 0 ||
        !(arg[0] == '_' || (arg[0] >= 'A' && arg[0] <= 'Z') ||
          (arg[0] >= 'a' && arg[0] <= 'z')) ||
        strspn(arg, "_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                    "0123456789") != len) {
        usage_error("-x %s: expected NAME=VALUE or NAME", arg);
        return -1;
    }
    if (is_job_var(arg, len)) {
        usage_error("-x %s: hvdrun sets %.*s itself", arg, (int)len, arg);
        return -1;
    }
    return 0;
}

/* Returns -1 to go on and run the job, else the exit status. */
static int parse_options(int argc, char **argv, struct options *opt) {
    int i;

    memset(opt, 0, sizeof(*opt));
    opt->prefix = 1;
    opt->grace_s = DEFAULT_GRACE_S;
    opt->exports = malloc((size_t)argc * sizeof(*opt->exports));
    if (opt->exports == NULL) {
        say("out of memory");
        return EXIT_SETUP;
    }

    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = NULL;
        long v;
        int m;

        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            break; /* the program */
        if (strcmp(arg, "--help") == 0) {
            write_all(STDOUT_FILENO, usage_text, sizeof(usage_text) - 1);
            return 0;
        }
        if (strcmp(arg, "--version") == 0) {
            printf("hvdrun (hvd) %s\n", HVD_VERSION_STRING);
            return 0;
        }
        if (strcmp(arg, "--no-prefix") == 0) {
            opt->prefix = 0;
            continue;
        }
        if (strcmp(arg, "-v") == 0 || strcmp(arg, "--verbose") == 0) {
            opt->verbose = 1;
            continue;
        }
        if ((m = value_option(argc, argv, &i, "-np", &val)) != 0 ||
            (m = value_option(argc, argv, &i, "-n", &val)) != 0 ||
            (m = value_option(argc, argv, &i, "--num-proc", &val)) != 0) {
            if (m < 0 || parse_long("-np", val, 1, MAX_RANKS, &v) != 0)
                return EXIT_USAGE;
            opt->np = (int)v;
        } else if ((m = value_option(argc, argv, &i, "--grace-seconds",
                                     &val)) != 0) {
            if (m < 0 || parse_long("--grace-seconds", val, 0, 3600, &v) != 0)
                return EXIT_USAGE;
            opt->grace_s = (int)v;
        } else if ((m = value_option(argc, argv, &i, "--start-timeout",
                                     &val)) != 0) {
            if (m < 0 || parse_long("--start-timeout", val, 1, MAX_SECONDS,
                                    &opt->start_timeout_s) != 0)
                return EXIT_USAGE;
        } else if ((m = value_option(argc, argv, &i, "--timeout", &val)) != 0) {
            if (m < 0 || parse_long("--timeout", val, 1, MAX_SECONDS,
                                    &opt->timeout_s) != 0)
                return EXIT_USAGE;
        } else if ((m = value_option(argc, argv, &i, "--network-interface",
                                     &val)) != 0) {
            if (m < 0)
                return EXIT_USAGE;
            if (*val == '\0') {
                usage_error("--network-interface needs an interface name");
                return EXIT_USAGE;
            }
            opt->iface = val;
        } else if ((m = value_option(argc, argv, &i, "-x", &val)) != 0) {
            if (m < 0 || check_export(val) != 0)
                return EXIT_USAGE;
            opt->exports[opt->nexports++] = val;
        } else {
            usage_error("unknown option %s", arg);
            return EXIT_USAGE;
        }
    }

    if (i >= argc) {
        usage_error("no program to run");
        return EXIT_USAGE;
    }
    if (opt->np == 0) {
        usage_error("-np N is required");
        return EXIT_USAGE;
    }
    opt->prog_argv = argv + i;
    return -1;
}

/* ---- environment ---- */

static ssize_t env_find(const struct env *e, const char *name, size_t len) {
    for (size_t k = 0; k < e->n; k++) {
        if (strncmp(e->vars[k], name, len) == 0 && e->vars[k][len] == '=')
            return (ssize_t)k;
    }
    return -1;
}

static const char *env_get(const struct env *e, const char *name) {
    size_t len = strlen(name);
    ssize_t k = env_find(e, name, len);

    return k < 0 ? NULL : e->vars[k] + len + 1;
}

/* Adds var ("NAME=VALUE", now owned by e), replacing NAME's old value. */
static int env_put(struct env *e, char *var) {
    ssize_t k = env_find(e, var, strcspn(var, "="));

    if (k >= 0) {
        free(e->vars[k]);
        e->vars[k] = var;
        return 0;
    }
    if (e->n + 1 >= e->cap) {
        size_t cap = e->cap == 0 ? 64 : 2 * e->cap;
        char **vars = realloc(e->vars, cap * sizeof(*vars));
        if (vars == NULL) {
            free(var);
            return -1;
        }
        e->vars = vars;
        e->cap = cap;
    }
    e->vars[e->n++] = var;
    e->vars[e->n] = NULL;
    return 0;
}

static int env_set(struct env *e, const char *name, const char *value) {
    char *var;

    if (asprintf(&var, "%s=%s", name, value) < 0)
        return -1;
    return env_put(e, var);
}

static int env_set_int(struct env *e, const char *name, long value) {
    char text[24];

    snprintf(text, sizeof(text), "%ld", value);
    return env_set(e, name, text);
}

/* Removes every variable whose "NAME=VALUE" starts with prefix. */
static void env_unset_prefix(struct env *e, const char *prefix) {
    size_t len = strlen(prefix);
    size_t kept = 0;

    for (size_t k = 0; k < e->n; k++) {
        if (strncmp(e->vars[k], prefix, len) == 0)
            free(e->vars[k]);
        else
            e->vars[kept++] = e->vars[k];
    }
    e->n = kept;
    if (e->vars != NULL)
        e->vars[kept] = NULL;
}

static void env_free(struct env *e) {
    for (size_t k = 0; k < e->n; k++)
        free(e->vars[k]);
    free(e->vars);
    memset(e, 0, sizeof(*e));
}

/* hvdrun's environment, less other launchers' variables, plus -x and the
 * options that set variables. */
static int env_build(struct env *e, const struct options *opt) {
    char *var;

    for (char **v = environ; *v != NULL; v++) {
        if (strchr(*v, '=') == NULL)
            continue;
        if ((var = strdup(*v)) == NULL || env_put(e, var) != 0)
            return -1;
    }
    env_unset_prefix(e, foreign_prefix);
    for (size_t k = 0; k < ARRAY_LEN(foreign_vars); k++) {
        if (asprintf(&var, "%s=", foreign_vars[k]) < 0)
            return -1;
        env_unset_prefix(e, var);
        free(var);
    }

    for (int k = 0; k < opt->nexports; k++) {
        const char *arg = opt->exports[k];

        if (strchr(arg, '=') != NULL) {
            var = strdup(arg);
        } else {
            const char *value = getenv(arg);
            if (value == NULL) {
                HVD_WARN("hvdrun", "-x %s: %s is not set; not passed on", arg,
                         arg);
                continue;
            }
            if (asprintf(&var, "%s=%s", arg, value) < 0)
                var = NULL;
        }
        if (var == NULL || env_put(e, var) != 0)
            return -1;
    }

    if (opt->iface != NULL && env_set(e, "HVD_IFACE", opt->iface) != 0)
        return -1;
    if (opt->start_timeout_s > 0 &&
        env_get(e, "HVD_START_TIMEOUT_SECONDS") == NULL &&
        env_set_int(e, "HVD_START_TIMEOUT_SECONDS", opt->start_timeout_s) != 0)
        return -1;
    return 0;
}

/* ---- job setup ---- */

/* RAND_bytes() with OpenSSL's reason on failure. */
static int random_bytes(uint8_t *out, size_t n) {
    if (RAND_bytes(out, (int)n) != 1) {
        say("RAND_bytes() failed: %s", ERR_error_string(ERR_get_error(), NULL));
        return -1;
    }
    return 0;
}

/* Decides where each rank runs. One host for now: every rank is local. */
static void place_ranks(struct job *job) {
    for (int r = 0; r < job->opt->np; r++) {
        struct rank *rk = &job->ranks[r];
        rk->local_rank = r;
        rk->local_size = job->opt->np;
        rk->cross_rank = 0;
        rk->cross_size = 1;
    }
}

static int stream_init(struct stream *s, int rank, int out_fd) {
    s->fd = -1;
    s->out_fd = out_fd;
    s->cap = LINE_INITIAL_CAP;
    s->buf = malloc(s->cap);
    if (s->buf == NULL)
        return -1;
    s->prefix_len = (size_t)snprintf(s->buf, s->cap, "[%d] ", rank);
    s->len = 0;
    return 0;
}

/* Raises the soft descriptor limit, as hvdrun holds two pipes per rank. */
static int raise_nofile(int np) {
    struct rlimit lim = orig_nofile;
    rlim_t want = (rlim_t)np * 2 + 64;

    if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want)
        return 0;
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want) {
        say("-np %d needs about %llu open files, but the limit is %llu; "
            "raise it (ulimit -n) or use --no-prefix",
            np, (unsigned long long)want, (unsigned long long)lim.rlim_max);
        return -1;
    }
    lim.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
        say("setrlimit(RLIMIT_NOFILE, %llu) failed: %s",
            (unsigned long long)want, strerror(errno));
        return -1;
    }
    return 0;
}

static int job_setup(struct job *job) {
    const struct options *opt = job->opt;
    uint8_t job_id[HVD_JOB_ID_LEN];
    uint8_t secret_bytes[SECRET_BYTES];
    char secret[2 * SECRET_BYTES + 1];
    char job_hex[2 * HVD_JOB_ID_LEN + 1];
    int np = opt->np;

    job->ranks = calloc((size_t)np, sizeof(*job->ranks));
    job->pfds = calloc(2 * (size_t)np + 2, sizeof(*job->pfds));
    job->pfd_streams = calloc(2 * (size_t)np + 2, sizeof(*job->pfd_streams));
    if (job->ranks == NULL || job->pfds == NULL || job->pfd_streams == NULL)
        goto no_memory;
    for (int r = 0; r < np; r++) {
        job->ranks[r].index = r;
        job->ranks[r].out.fd = job->ranks[r].err.fd = -1;
        if (opt->prefix &&
            (stream_init(&job->ranks[r].out, r, STDOUT_FILENO) != 0 ||
             stream_init(&job->ranks[r].err, r, STDERR_FILENO) != 0))
            goto no_memory;
    }
    place_ranks(job);

    if (env_build(&job->env, opt) != 0)
        goto no_memory;
    const char *iface = env_get(&job->env, "HVD_IFACE");
    if (iface != NULL && *iface != '\0') {
        if (hvd_net_iface_addr(iface, job->bind_addr, sizeof(job->bind_addr)) !=
            HVD_OK) {
            say("%s", hvd_error_get());
            return -1;
        }
    } else {
        snprintf(job->bind_addr, sizeof(job->bind_addr), "127.0.0.1");
    }

    /* The ranks get the secret as text (HVD_SECRET): its 64 hex digits are
     * the secret. The job id is formatted by the library that parses it. */
    if (random_bytes(secret_bytes, sizeof(secret_bytes)) != 0 ||
        random_bytes(job_id, sizeof(job_id)) != 0)
        return -1;
    for (size_t k = 0; k < sizeof(secret_bytes); k++)
        snprintf(secret + 2 * k, 3, "%02x", secret_bytes[k]);
    hvd_job_id_format(job_id, job_hex);

    hvd_status st =
        hvd_rdv_server_create(job->bind_addr, 0, np, job_id, secret, &job->srv);
    if (st != HVD_OK) {
        say("cannot start the rendezvous server on %s: %s", job->bind_addr,
            hvd_error_get());
        return -1;
    }
    int port = hvd_rdv_server_port(job->srv);
    HVD_INFO("hvdrun", "rendezvous server on %s:%d for %d ranks, job %s",
             job->bind_addr, port, np, job_hex);

    if (env_set_int(&job->env, "HVD_SIZE", np) != 0 ||
        env_set(&job->env, "HVD_RENDEZVOUS_ADDR", job->bind_addr) != 0 ||
        env_set_int(&job->env, "HVD_RENDEZVOUS_PORT", port) != 0 ||
        env_set(&job->env, "HVD_SECRET", secret) != 0 ||
        env_set(&job->env, "HVD_JOB_ID", job_hex) != 0)
        goto no_memory;

    /* Ranks run in their own process groups, which a terminal treats as
     * background: one reading the terminal would stop. So only rank 0
     * gets hvdrun's stdin, and only when it is not a terminal. */
    job->null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (job->null_fd < 0) {
        say("open(/dev/null) failed: %s", strerror(errno));
        return -1;
    }
    job->stdin_to_rank0 = !isatty(STDIN_FILENO);
    if (opt->prefix && raise_nofile(np) != 0)
        return -1;
    return 0;

no_memory:
    say("out of memory");
    return -1;
}

/* ---- signals ---- */

static void on_signal(int sig) {
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    ssize_t ignored = write(sig_pipe[1], &byte, 1);

    (void)ignored; /* a full pipe already holds a wake-up */
    errno = saved;
}

static int install_signals(void) {
    struct sigaction sa;

    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        say("pipe2() failed: %s", strerror(errno));
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        sigaction(handled_signals[k], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* ---- starting ranks ---- */

/* In the child: becomes rank r's program, or exits 127. */
static void exec_rank(const struct job *job, const struct rank *r, int out_w,
                      int err_w) __attribute__((noreturn));
static void exec_rank(const struct job *job, const struct rank *r, int out_w,
                      int err_w) {
    const char *prog = job->opt->prog_argv[0];
    char msg[512];

    setpgid(0, 0);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        signal(handled_signals[k], SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &orig_sigmask, NULL);
    setrlimit(RLIMIT_NOFILE, &orig_nofile);

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

    int len = snprintf(msg, sizeof(msg), "hvdrun: cannot run %s: %s\n", prog,
                       strerror(errno));
    if (len > 0)
        write_all(STDERR_FILENO, msg,
                  (size_t)len < sizeof(msg) ? (size_t)len : sizeof(msg) - 1);
    _exit(EXIT_NOT_RUN);
}

static void close_fd(int *fd) {
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Starts rank r as a child of hvdrun. */
static int launch_local(struct job *job, struct rank *r) {
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    sigset_t block, old;
    pid_t pid;

    if (job->opt->prefix) {
        if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
            say("cannot start rank %d: pipe2() failed: %s", r->index,
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
    if (pid == 0)
        exec_rank(job, r, out[1], err[1]);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        say("cannot start rank %d: fork() failed: %s", r->index,
            strerror(fork_errno));
        goto close_pipes;
    }

    /* Also done in the child; whichever runs first makes the group, so it
     * exists before hvdrun can signal it. */
    setpgid(pid, pid);
    close_fd(&out[1]);
    close_fd(&err[1]);
    r->out.fd = out[0];
    r->err.fd = err[0];
    r->pid = pid;
    r->state = RANK_RUNNING;
    job->live++;
    HVD_INFO("hvdrun", "rank %d: pid %d", r->index, (int)pid);
    return 0;

close_pipes:
    close_fd(&out[0]);
    close_fd(&out[1]);
    close_fd(&err[0]);
    close_fd(&err[1]);
    return -1;
}

static int spawn_rank(struct job *job, struct rank *r) {
    if (env_set_int(&job->env, "HVD_RANK", r->index) != 0 ||
        env_set_int(&job->env, "HVD_LOCAL_RANK", r->local_rank) != 0 ||
        env_set_int(&job->env, "HVD_LOCAL_SIZE", r->local_size) != 0 ||
        env_set_int(&job->env, "HVD_CROSS_RANK", r->cross_rank) != 0 ||
        env_set_int(&job->env, "HVD_CROSS_SIZE", r->cross_size) != 0) {
        say("cannot start rank %d: out of memory", r->index);
        return -1;
    }
    return launch_local(job, r);
}

/* ---- output ---- */

static void stream_flush(struct stream *s) {
    s->buf[s->prefix_len + s->len] = '\n';
    write_all(s->out_fd, s->buf, s->prefix_len + s->len + 1);
    s->len = 0;
}

/* Grows the buffer towards want more bytes, up to the line limit; returns
 * the room there is (0: the pending piece is as long as a piece gets). */
static size_t stream_room(struct stream *s, size_t want) {
    size_t limit = s->prefix_len + LINE_MAX_BYTES + 1;
    size_t need = s->prefix_len + s->len + want + 1;

    if (need > limit)
        need = limit;
    if (need > s->cap) {
        size_t cap = s->cap;
        while (cap < need)
            cap *= 2;
        if (cap > limit)
            cap = limit;
        char *buf = realloc(s->buf, cap);
        if (buf != NULL) { /* else make do with the buffer there is */
            s->buf = buf;
            s->cap = cap;
        }
    }
    return s->cap - 1 - s->prefix_len - s->len;
}

/* Copies out every complete line of data; keeps the rest pending. */
static void stream_feed(struct stream *s, const char *data, size_t n) {
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t seg = nl != NULL ? (size_t)(nl - data) : n;
        size_t room = stream_room(s, seg);

        if (room == 0 && seg > 0) {
            stream_flush(s); /* a piece of a long line */
            continue;
        }
        size_t take = seg < room ? seg : room;
        memcpy(s->buf + s->prefix_len + s->len, data, take);
        s->len += take;
        data += take;
        n -= take;
        if (nl != NULL && take == seg) {
            stream_flush(s);
            data++;
            n--;
        }
    }
}

static void stream_close(struct stream *s) {
    if (s->len > 0)
        stream_flush(s); /* a last line without its newline */
    close_fd(&s->fd);
}

/* Reads what the pipe has, at most max_bytes; closes it at EOF. */
static void stream_read(struct stream *s, size_t max_bytes) {
    static char chunk[READ_CHUNK];
    size_t total = 0;

    while (s->fd >= 0 && total < max_bytes) {
        ssize_t n = read(s->fd, chunk, sizeof(chunk));
        if (n > 0) {
            stream_feed(s, chunk, (size_t)n);
            total += (size_t)n;
        } else if (n == 0) {
            stream_close(s);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
        } else if (errno != EINTR) {
            HVD_ERROR("hvdrun", "read() from a rank's pipe failed: %s",
                      strerror(errno));
            stream_close(s);
        }
    }
}

/* ---- stopping ---- */

/* A rank's group may outlive the rank itself: its descendants still hold
 * its pipes. */
static int group_alive(const struct rank *r) {
    return r->state == RANK_RUNNING ||
           (r->state == RANK_EXITED && (r->out.fd >= 0 || r->err.fd >= 0));
}

static void signal_ranks(struct job *job, int sig) {
    for (int r = 0; r < job->opt->np; r++) {
        if (group_alive(&job->ranks[r]) && kill(-job->ranks[r].pid, sig) != 0 &&
            errno != ESRCH)
            HVD_WARN("hvdrun", "kill(-%d, %s) failed: %s",
                     (int)job->ranks[r].pid, signal_name(sig), strerror(errno));
    }
}

static void kill_ranks(struct job *job) {
    signal_ranks(job, SIGKILL);
    job->phase = JOB_KILLED;
}

/* Sends sig (and SIGCONT, for stopped ranks) to every rank; SIGKILL follows
 * after the grace period. Called again while stopping: SIGKILL now. */
static void stop_job(struct job *job, int sig) {
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

static void rank_exited(struct job *job, struct rank *r) {
    int ws = r->wstatus;
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);

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
    if (WIFEXITED(ws))
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

static void read_signals(struct job *job) {
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

/* Runs until every started rank is reaped. Returns -1 if poll() fails. */
static int event_loop(struct job *job) {
    while (job->live > 0) {
        int64_t now = hvd_now_ns();
        nfds_t n = 0;

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

static int job_run(struct job *job) {
    if (job->opt->timeout_s > 0)
        job->timeout_at_ns = hvd_now_ns() + job->opt->timeout_s * NS_PER_S;
    for (int r = 0; r < job->opt->np; r++) {
        if (spawn_rank(job, &job->ranks[r]) != 0) {
            job->exit_code = EXIT_SETUP;
            stop_job(job, SIGTERM);
            break;
        }
    }
    if (event_loop(job) != 0) {
        if (job->exit_code < 0)
            job->exit_code = EXIT_SETUP;
        kill_and_wait(job);
    }
    finish_output(job);
    return job->exit_code < 0 ? 0 : job->exit_code;
}

static void job_destroy(struct job *job) {
    if (job->ranks != NULL) {
        for (int r = 0; r < job->opt->np; r++) {
            close_fd(&job->ranks[r].out.fd);
            close_fd(&job->ranks[r].err.fd);
            free(job->ranks[r].out.buf);
            free(job->ranks[r].err.buf);
        }
    }
    hvd_rdv_server_destroy(job->srv);
    close_fd(&job->null_fd);
    env_free(&job->env);
    free(job->ranks);
    free(job->pfds);
    free(job->pfd_streams);
}

/* Descriptors 0-2 must be open, or a pipe could land on one of them. */
static void open_std_fds(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int null_fd = open("/dev/null", O_RDWR);
            if (null_fd >= 0 && null_fd != fd)
                close(null_fd); /* unexpected; leave fd closed */
        }
    }
}

int main(int argc, char **argv) {
    struct options opt;
    struct job job;
    int code;

    open_std_fds();
    hvd_log_init_from_env();
    code = parse_options(argc, argv, &opt);
    if (code >= 0)
        goto free_options;
    if (opt.verbose && hvd_log_current < HVD_LOG_INFO)
        hvd_log_current = HVD_LOG_INFO;

    sigprocmask(SIG_SETMASK, NULL, &orig_sigmask);
    getrlimit(RLIMIT_NOFILE, &orig_nofile);
    memset(&job, 0, sizeof(job));
    job.opt = &opt;
    job.null_fd = -1;
    job.exit_code = -1;
    code = EXIT_SETUP;
    if (job_setup(&job) != 0 || install_signals() != 0)
        goto destroy_job;
    code = job_run(&job);

destroy_job:
    job_destroy(&job);
    close_fd(&sig_pipe[0]);
    close_fd(&sig_pipe[1]);
free_options:
    free(opt.exports);
    return code;
}
