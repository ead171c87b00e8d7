/*
 * hvdrun: starts the ranks of an hvd job and serves their rendezvous.
 *
 *     hvdrun [-np N] [-H host:slots,... | --hostfile FILE] [options]
 *            [--] program [args...]
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
 * Placement (which rank runs on which host, with which local and cross
 * rank) is decided in place_ranks(). The ranks of a host that is this
 * machine are forked (launch() with exec_rank()); those of another host
 * are started by a local ssh process that runs a small sh wrapper there
 * (remote_script()). The wrapper reads the job secret from ssh's stdin,
 * so that it is on no command line, and keeps reading: when hvdrun closes
 * that pipe (teardown) or dies, the wrapper sees EOF and kills the
 * program. To hvdrun a remote rank is its ssh process, with the same
 * pipes, prefixes and exit status handling as a local rank; only stopping
 * differs (close the pipe, SIGKILL ssh after the grace period).
 *
 * With --mpi hvdrun starts nothing itself: it execs mpirun with the same
 * placement, and hvd bootstraps through MPI.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/rand.h>

#include "hvd/hvd.h"
#include "tools/check_build.h"
#include "tools/config_file.h"
#include "tools/hostfile.h"
#include "transport/base/clock.h"
#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/net.h"
#include "transport/rendezvous.h"
#include "transport/shm/shm.h"

#define MAX_RANKS HVD_HOST_MAX_SLOTS
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
/* ssh's own status when it cannot connect or log in. */
#define SSH_FAILED 255
#define LAST_LINE_MAX 256
/* At most this many ssh logins run at a time to one host: sshd drops
 * connections beyond MaxStartups (10 by default) before they log in. */
#define SSH_MAX_LOGINS 8

/* A host of -H or --hostfile. */
struct host {
    char *name;     /* as ssh is given it ("user@" allowed), owned */
    int slots;      /* from -H or the hostfile */
    int nranks;     /* ranks placed on it */
    int cross_rank; /* its index among the hosts used; -1: unused */
    int local;      /* this machine: its ranks are forked, not ssh'd */
    int logging_in; /* its ssh processes not yet past the login */
};

struct options {
    int np;     /* 0 until given or taken from the slots */
    int prefix; /* 0 with --no-prefix */
    int grace_s;
    long start_timeout_s;    /* 0: not given */
    long timeout_s;          /* 0: no job timeout */
    const char *iface;       /* --network-interface, or NULL */
    const char *config_file; /* --config-file, or NULL */
    int verbose;
    const char **exports; /* the -x arguments, pointing into argv */
    int nexports;
    char **prog_argv;   /* the program and its arguments, from argv */
    struct host *hosts; /* -H or --hostfile, owned; NULL: all local */
    int nhosts;
    int oversubscribe;
    int mpi;                  /* --mpi: exec mpirun instead */
    const char *ssh_port;     /* -p, or NULL */
    const char *ssh_identity; /* -i, or NULL */
    const char **ssh_opts;    /* the --ssh-opt arguments, pointing into argv */
    int nssh_opts;
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
    /* The stderr of a remote rank until its wrapper reports that the
     * program started: the line saying so is dropped, and the last other
     * line (ssh's reason, when ssh fails) is kept. */
    int awaiting_start;
    char last_line[LAST_LINE_MAX];
};

enum rank_state { RANK_UNSTARTED, RANK_RUNNING, RANK_EXITED };

struct rank {
    int index;
    int local_rank, local_size; /* among the ranks of its host */
    int cross_rank, cross_size; /* its host among the job's hosts */
    struct host *host;          /* NULL without -H or --hostfile */
    int remote;                 /* started over ssh; pid is ssh's */
    int stdin_fd; /* remote: write end of ssh's stdin; -1 once closed */
    pid_t pid;    /* also its process group id */
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
    int live;    /* ranks started and not yet reaped */
    int pending; /* ranks not started yet (remote ones wait for a login) */
    struct env env;
    hvd_rdv_server *srv;
    char bind_addr[HVD_ADDR_MAX];
    char secret[2 * SECRET_BYTES + 1];
    uint8_t job_id[HVD_JOB_ID_LEN];
    char cwd[PATH_MAX]; /* where remote ranks run */
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

/* The line a remote rank's wrapper writes on stderr once it has started
 * the program: "hvdrun-started <job id>". */
static char start_marker[64];

static const char usage_text[] =
    "usage: hvdrun [-np N] [-H HOSTS | --hostfile FILE] [options]\n"
    "              [--] program [args...]\n"
    "\n"
    "Starts N ranks of an hvd job, on this machine or on the hosts given, and\n"
    "serves their rendezvous. Options come before the program (or before --).\n"
    "\n"
    "options:\n"
    "  -np N, -n N, --num-proc N\n"
    "                     number of ranks, 1 to 4096 (required without -H\n"
    "                     or --hostfile; with them, default: all slots)\n"
    "  -H, --hosts HOST[:SLOTS],...\n"
    "                     run on these hosts (SLOTS default 1; [IPv6]:SLOTS);\n"
    "                     ranks fill the hosts in order, SLOTS at a time\n"
    "  --hostfile FILE    the hosts, one a line: HOST, HOST:SLOTS or\n"
    "                     HOST slots=SLOTS; # starts a comment\n"
    "  --oversubscribe    allow -np above the slots (the extra ranks go\n"
    "                     round-robin over the hosts)\n"
    "  -p, --ssh-port PORT\n"
    "                     ssh port of the remote hosts\n"
    "  -i, --ssh-identity FILE\n"
    "                     ssh private key for the remote hosts\n"
    "  --ssh-opt OPT      pass -o OPT to ssh (repeatable)\n"
    "  -x NAME=VALUE      set NAME=VALUE for every rank (repeatable)\n"
    "  -x NAME            pass hvdrun's value of NAME to every rank\n"
    "  --config-file FILE horovodrun's YAML configuration (params, timeline,\n"
    "                     stall_check, logging): its settings become the\n"
    "                     HVD_* variables of the same meaning, unless\n"
    "                     already set or given with -x\n"
    "  --network-interface IFACE\n"
    "                     serve the rendezvous on the IPv4 address of IFACE\n"
    "                     and set HVD_IFACE=IFACE for the ranks (default:\n"
    "                     HVD_IFACE from the environment, else 127.0.0.1,\n"
    "                     or with remote hosts the address this machine\n"
    "                     reaches the first of them from)\n"
    "  --start-timeout S  set HVD_START_TIMEOUT_SECONDS=S (how long hvd_init\n"
    "                     waits for the other ranks) unless already set\n"
    "  --timeout S        stop the job after S seconds (exit status 124)\n"
    "  --grace-seconds S  seconds between SIGTERM and SIGKILL when the job\n"
    "                     is stopped (default 3; 0: SIGKILL at once)\n"
    "  --no-prefix        pass the ranks' output through untouched instead\n"
    "                     of as \"[rank] line\"\n"
    "  --mpi              exec mpirun with these ranks and hosts instead of\n"
    "                     starting them (hvd then bootstraps through MPI)\n"
    "  -v, --verbose      log what hvdrun does (info level)\n"
    "  --help             print this text\n"
    "  --version          print hvdrun's version\n"
    "  --check-build      print the frameworks (with HVD_PYTHON, else\n"
    "                     python3), transports and GPU support of this hvd\n"
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
    "A host is this machine when it is localhost, a 127.x address, this\n"
    "machine's host name or a name or address of one of its interfaces; its\n"
    "ranks are forked, with hvdrun's environment. The ranks of any other host\n"
    "are started with ssh -o BatchMode=yes (keys, no passwords), in the same\n"
    "directory, with the same program path and arguments, hvdrun's HVD_*\n"
    "variables and the -x variables; the job secret goes on ssh's stdin.\n"
    "\n"
    "When a rank fails (non-zero exit or a signal), the other ranks get\n"
    "SIGTERM and, after the grace period, SIGKILL. SIGINT, SIGTERM and SIGHUP\n"
    "sent to hvdrun are passed on to the ranks the same way; a second one\n"
    "kills them at once. A remote rank is stopped by closing its ssh's stdin:\n"
    "the wrapper there sends SIGTERM, SIGKILL after the grace period; hvdrun\n"
    "kills ssh after the grace period.\n"
    "\n"
    "exit status: 0 when every rank exits 0; else the first failed rank's\n"
    "status (128+N for signal N; 255 when ssh fails); 128+N when hvdrun got\n"
    "signal N; 124 after --timeout; 127 when the program cannot be run; 2 for\n"
    "a usage error; 1 when hvdrun itself cannot start the job.\n";

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

/* Takes the hosts of -H (list) or --hostfile (path) into opt->hosts. */
static int parse_hosts(struct options *opt, const char *list,
                       const char *path) {
    hvd_hostlist hl = {0};
    char err[1024];
    int rc = list != NULL
                 ? hvd_hostlist_parse_list(&hl, list, err, sizeof(err))
                 : hvd_hostlist_parse_file(&hl, path, err, sizeof(err));

    if (rc == 0 &&
        (opt->hosts = calloc((size_t)hl.n, sizeof(*opt->hosts))) == NULL) {
        snprintf(err, sizeof(err), "out of memory");
        rc = -1;
    }
    if (rc != 0) {
        say("%s", err);
        hvd_hostlist_free(&hl);
        return -1;
    }
    for (int h = 0; h < hl.n; h++) {
        opt->hosts[h].name = hl.v[h].name; /* moved */
        opt->hosts[h].slots = hl.v[h].slots;
        opt->hosts[h].cross_rank = -1;
    }
    opt->nhosts = hl.n;
    free(hl.v);
    return 0;
}

/* -np from the slots, or checked against them. */
static int check_slots(struct options *opt) {
    long total = 0;

    for (int h = 0; h < opt->nhosts; h++)
        total += opt->hosts[h].slots;
    if (opt->np == 0) {
        if (total > MAX_RANKS) {
            usage_error("the hosts have %ld slots, more than the %d ranks "
                        "hvdrun starts; give -np",
                        total, MAX_RANKS);
            return -1;
        }
        opt->np = (int)total;
    } else if (opt->np > total && !opt->oversubscribe) {
        usage_error("-np %d is more than the %ld slots of the hosts; add "
                    "slots or --oversubscribe",
                    opt->np, total);
        return -1;
    }
    return 0;
}

/* Returns -1 to go on and run the job, else the exit status. */
static int parse_options(int argc, char **argv, struct options *opt) {
    const char *host_list = NULL;
    const char *hostfile = NULL;

    int i;

    memset(opt, 0, sizeof(*opt));
    opt->prefix = 1;
    opt->grace_s = DEFAULT_GRACE_S;
    opt->exports = malloc((size_t)argc * sizeof(*opt->exports));
    opt->ssh_opts = malloc((size_t)argc * sizeof(*opt->ssh_opts));
    if (opt->exports == NULL || opt->ssh_opts == NULL) {
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
        if (strcmp(arg, "--check-build") == 0)
            return hvd_check_build() == 0 ? 0 : 1;
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
        if (strcmp(arg, "--oversubscribe") == 0) {
            opt->oversubscribe = 1;
            continue;
        }
        if (strcmp(arg, "--mpi") == 0) {
            opt->mpi = 1;
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
        } else if ((m = value_option(argc, argv, &i, "--config-file", &val)) !=
                   0) {
            if (m < 0)
                return EXIT_USAGE;
            opt->config_file = val;
        } else if ((m = value_option(argc, argv, &i, "-x", &val)) != 0) {
            if (m < 0 || check_export(val) != 0)
                return EXIT_USAGE;
            opt->exports[opt->nexports++] = val;
        } else if ((m = value_option(argc, argv, &i, "-H", &val)) != 0 ||
                   (m = value_option(argc, argv, &i, "--hosts", &val)) != 0) {
            if (m < 0)
                return EXIT_USAGE;
            host_list = val;
        } else if ((m = value_option(argc, argv, &i, "--hostfile", &val)) !=
                   0) {
            if (m < 0)
                return EXIT_USAGE;
            hostfile = val;
        } else if ((m = value_option(argc, argv, &i, "-p", &val)) != 0 ||
                   (m = value_option(argc, argv, &i, "--ssh-port", &val)) !=
                       0) {
            if (m < 0 || parse_long("--ssh-port", val, 1, 65535, &v) != 0)
                return EXIT_USAGE;
            opt->ssh_port = val;
        } else if ((m = value_option(argc, argv, &i, "-i", &val)) != 0 ||
                   (m = value_option(argc, argv, &i, "--ssh-identity", &val)) !=
                       0) {
            if (m < 0)
                return EXIT_USAGE;
            if (*val == '\0') {
                usage_error("--ssh-identity needs a key file");
                return EXIT_USAGE;
            }
            opt->ssh_identity = val;
        } else if ((m = value_option(argc, argv, &i, "--ssh-opt", &val)) != 0) {
            if (m < 0)
                return EXIT_USAGE;
            if (*val == '\0' || *val == '-') {
                usage_error("--ssh-opt %s: expected an ssh option such as "
                            "Port=2222 (it is passed as -o OPT)",
                            val);
                return EXIT_USAGE;
            }
            opt->ssh_opts[opt->nssh_opts++] = val;
        } else {
            usage_error("unknown option %s", arg);
            return EXIT_USAGE;
        }
    }

    if (i >= argc) {
        usage_error("no program to run");
        return EXIT_USAGE;
    }
    if (host_list != NULL && hostfile != NULL) {
        usage_error("give -H or --hostfile, not both");
        return EXIT_USAGE;
    }
    if (host_list != NULL && *host_list == '\0') {
        usage_error("-H needs a host list");
        return EXIT_USAGE;
    }
    if (((host_list != NULL || hostfile != NULL) &&
         parse_hosts(opt, host_list, hostfile) != 0) ||
        (opt->nhosts > 0 && check_slots(opt) != 0))
        return EXIT_USAGE;
    if (opt->np == 0) {
        usage_error("-np N is required");
        return EXIT_USAGE;
    }
    opt->prog_argv = argv + i;
    return -1;
}

static void free_options(struct options *opt) {
    for (int h = 0; h < opt->nhosts; h++)
        free(opt->hosts[h].name);
    free(opt->hosts);
    free(opt->exports);
    free(opt->ssh_opts);
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

/* Reads --config-file into *cv and warns of its notes; says why not. */
static int config_read(const struct options *opt, hvd_config_vars *cv) {
    char err[512];

    if (hvd_config_file_read(opt->config_file, cv, err, sizeof(err)) != 0) {
        say("--config-file %s: %s", opt->config_file, err);
        return -1;
    }
    for (size_t k = 0; k < cv->nnotes; k++)
        HVD_WARN("hvdrun", "--config-file %s: %s", opt->config_file,
                 cv->notes[k]);
    return 0;
}

/* 1 if the configuration file's var ("HVD_NAME=value") is set neither in
 * its HVD_ nor in its HOROVOD_ form where get looks. */
static int config_var_unset(const char *var,
                            const char *(*get)(void *ctx, const char *name),
                            void *ctx) {
    char name[128];
    const char *alias;

    snprintf(name, sizeof(name), "%.*s", (int)strcspn(var, "="), var);
    alias = hvd_env_horovod_name(name);
    return get(ctx, name) == NULL && (alias == NULL || get(ctx, alias) == NULL);
}

static const char *env_lookup(void *e, const char *name) {
    return env_get(e, name);
}

static const char *environ_lookup(void *unused, const char *name) {
    (void)unused;
    return getenv(name);
}

/* hvdrun's environment, less other launchers' variables, plus the
 * configuration file, -x and the options that set variables. Returns 0, -1
 * out of memory, -2 for a bad configuration file (said why). */
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

    /* The configuration file: below hvdrun's own environment (a variable
     * already set, in its HVD_ or HOROVOD_ form, wins) and below -x. */
    if (opt->config_file != NULL) {
        hvd_config_vars cv;

        if (config_read(opt, &cv) != 0)
            return -2;
        for (size_t k = 0; k < cv.n; k++) {
            if (!config_var_unset(cv.vars[k], env_lookup, e))
                continue;
            if ((var = strdup(cv.vars[k])) == NULL || env_put(e, var) != 0) {
                hvd_config_vars_free(&cv);
                return -1;
            }
        }
        hvd_config_vars_free(&cv);
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

/*
 * Decides where each rank runs. Without hosts, all on this machine. With
 * them, the ranks fill the hosts in order, each up to its slots; ranks
 * beyond all slots (--oversubscribe) go one per host, round-robin. A
 * host's ranks are consecutive, so ring neighbours share a host.
 */
static void place_ranks(struct job *job, struct host *hosts, int nhosts) {
    int np = job->opt->np;
    int left = np;
    int cross_size = 0;
    int r = 0;

    if (nhosts == 0) {
        for (r = 0; r < np; r++) {
            struct rank *rk = &job->ranks[r];
            rk->local_rank = r;
            rk->local_size = np;
            rk->cross_rank = 0;
            rk->cross_size = 1;
        }
        return;
    }
    for (int h = 0; h < nhosts; h++) {
        hosts[h].nranks = hosts[h].slots < left ? hosts[h].slots : left;
        left -= hosts[h].nranks;
    }
    for (int h = 0; left > 0; h = (h + 1) % nhosts, left--)
        hosts[h].nranks++;
    for (int h = 0; h < nhosts; h++)
        hosts[h].cross_rank = hosts[h].nranks > 0 ? cross_size++ : -1;
    for (int h = 0; h < nhosts; h++) {
        for (int k = 0; k < hosts[h].nranks; k++, r++) {
            struct rank *rk = &job->ranks[r];
            rk->host = &hosts[h];
            rk->local_rank = k;
            rk->local_size = hosts[h].nranks;
            rk->cross_rank = hosts[h].cross_rank;
            rk->cross_size = cross_size;
        }
    }
}

/* ---- which hosts are this machine ---- */

/* The part of "user@host" ssh connects to. */
static const char *host_part(const char *name) {
    const char *at = strrchr(name, '@');

    return at != NULL ? at + 1 : name;
}

/* Is sa a loopback address or one of an interface of this machine? */
static int addr_is_local(const struct sockaddr *sa, const struct ifaddrs *ifs) {
    if (sa->sa_family == AF_INET) {
        const struct in_addr *a = &((const struct sockaddr_in *)sa)->sin_addr;
        if ((ntohl(a->s_addr) >> 24) == 127)
            return 1;
        for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
            if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
                ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                    a->s_addr)
                return 1;
        }
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a =
            &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a))
            return 1;
        for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
            if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET6 &&
                memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                       a, sizeof(*a)) == 0)
                return 1;
        }
    }
    return 0;
}

/* Same host name, or same first label ("node1" is "node1.cluster"). */
static int same_host_name(const char *a, const char *b) {
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");

    if (strcasecmp(a, b) == 0)
        return 1;
    if ((a[la] == '\0') == (b[lb] == '\0'))
        return 0; /* both short, or both qualified and different */
    return la == lb && strncasecmp(a, b, la) == 0;
}

/*
 * A host is this machine when it is "localhost", this machine's host
 * name, or a name or address that resolves to a loopback address or to an
 * address of one of its interfaces. A name that does not resolve here
 * (perhaps an alias in ~/.ssh/config) is remote.
 */
static int host_is_local(const char *host, const char *my_name,
                         const struct ifaddrs *ifs) {
    struct addrinfo hints, *res = NULL;
    int local = 0;

    if (strcasecmp(host, "localhost") == 0 ||
        (my_name[0] != '\0' && same_host_name(host, my_name)))
        return 1;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    for (const struct addrinfo *ai = res; ai != NULL && !local;
         ai = ai->ai_next)
        local = addr_is_local(ai->ai_addr, ifs);
    freeaddrinfo(res);
    return local;
}

/* Marks each host that gets ranks as local or not. */
static int classify_hosts(struct host *hosts, int nhosts) {
    struct ifaddrs *ifs = NULL;
    char my_name[256];

    if (getifaddrs(&ifs) != 0) {
        say("getifaddrs() failed: %s", strerror(errno));
        return -1;
    }
    if (gethostname(my_name, sizeof(my_name)) != 0)
        my_name[0] = '\0';
    my_name[sizeof(my_name) - 1] = '\0';
    for (int h = 0; h < nhosts; h++) {
        if (hosts[h].nranks == 0)
            continue;
        hosts[h].local = host_is_local(host_part(hosts[h].name), my_name, ifs);
        HVD_INFO("hvdrun", "host %s: %d rank%s, %s", hosts[h].name,
                 hosts[h].nranks, hosts[h].nranks == 1 ? "" : "s",
                 hosts[h].local ? "this machine (forked)" : "over ssh");
    }
    freeifaddrs(ifs);
    return 0;
}

/*
 * The address of this machine that host reaches: the source address the
 * kernel picks for a datagram to it (connect() on a UDP socket sends
 * nothing). On failure why gets the reason.
 */
static int route_addr(const char *host, char *out, size_t outlen, char *why,
                      size_t whylen) {
    struct addrinfo hints, *res = NULL;
    int rc, found = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    rc = getaddrinfo(host, "9", &hints, &res);
    if (rc != 0) {
        snprintf(why, whylen, "getaddrinfo(%s) failed: %s", host,
                 gai_strerror(rc));
        return -1;
    }
    snprintf(why, whylen, "getaddrinfo(%s) returned no address", host);
    for (const struct addrinfo *ai = res; ai != NULL && !found;
         ai = ai->ai_next) {
        struct sockaddr_storage local;
        socklen_t len = sizeof(local);
        char text[HVD_ADDR_MAX];
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);

        hvd_net_format(ai->ai_addr, text, sizeof(text));
        if (fd < 0) {
            snprintf(why, whylen, "socket() failed: %s", strerror(errno));
        } else if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            snprintf(why, whylen, "connect(UDP %s) failed: %s", text,
                     strerror(errno));
        } else if (getsockname(fd, (struct sockaddr *)&local, &len) != 0) {
            snprintf(why, whylen, "getsockname() failed: %s", strerror(errno));
        } else if ((rc = getnameinfo((struct sockaddr *)&local, len, out,
                                     (socklen_t)outlen, NULL, 0,
                                     NI_NUMERICHOST)) != 0) {
            snprintf(why, whylen, "getnameinfo() failed: %s", gai_strerror(rc));
        } else {
            found = 1;
        }
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(res);
    return found ? 0 : -1;
}

/* Where the rendezvous listens: HVD_IFACE's address; else, with remote
 * ranks, this machine's address towards the first remote host that
 * resolves; else loopback. */
static int choose_bind_addr(struct job *job, const char *iface) {
    char why[256] = "";
    const char *first = NULL;

    if (iface != NULL && *iface != '\0') {
        if (hvd_net_iface_addr(iface, job->bind_addr, sizeof(job->bind_addr)) !=
            HVD_OK) {
            say("%s", hvd_error_get());
            return -1;
        }
        return 0;
    }
    for (int r = 0; r < job->opt->np; r++) {
        const struct rank *rk = &job->ranks[r];
        if (!rk->remote || (r > 0 && rk->host == job->ranks[r - 1].host))
            continue;
        if (first == NULL)
            first = rk->host->name;
        if (route_addr(host_part(rk->host->name), job->bind_addr,
                       sizeof(job->bind_addr), why, sizeof(why)) == 0) {
            HVD_INFO("hvdrun",
                     "serving the rendezvous on %s, the address "
                     "that reaches %s",
                     job->bind_addr, rk->host->name);
            return 0;
        }
        HVD_INFO("hvdrun", "no route to %s: %s", rk->host->name, why);
    }
    if (first != NULL) {
        say("cannot tell which address of this machine the remote hosts "
            "reach (%s: %s); name the interface with --network-interface",
            first, why);
        return -1;
    }
    snprintf(job->bind_addr, sizeof(job->bind_addr), "127.0.0.1");
    return 0;
}

/* prefix: "[rank] " before each line, else nothing (--no-prefix). */
static int stream_init(struct stream *s, int rank, int out_fd, int prefix) {
    s->fd = -1;
    s->out_fd = out_fd;
    s->cap = LINE_INITIAL_CAP;
    s->buf = malloc(s->cap);
    if (s->buf == NULL)
        return -1;
    s->prefix_len =
        prefix ? (size_t)snprintf(s->buf, s->cap, "[%d] ", rank) : 0;
    s->len = 0;
    return 0;
}

/* Raises the soft descriptor limit, as hvdrun holds two pipes per rank
 * (three for a remote one). */
static int raise_nofile(int np, rlim_t fds) {
    struct rlimit lim = orig_nofile;
    rlim_t want = fds + 64;

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

static int job_setup(struct job *job, struct host *hosts, int nhosts) {
    const struct options *opt = job->opt;
    uint8_t job_id[HVD_JOB_ID_LEN];
    uint8_t secret_bytes[SECRET_BYTES];
    char job_hex[2 * HVD_JOB_ID_LEN + 1];
    int np = opt->np;
    rlim_t fds = 0;

    job->ranks = calloc((size_t)np, sizeof(*job->ranks));
    job->pfds = calloc(2 * (size_t)np + 2, sizeof(*job->pfds));
    job->pfd_streams = calloc(2 * (size_t)np + 2, sizeof(*job->pfd_streams));
    if (job->ranks == NULL || job->pfds == NULL || job->pfd_streams == NULL)
        goto no_memory;
    for (int r = 0; r < np; r++)
        job->ranks[r].out.fd = job->ranks[r].err.fd = -1;
    place_ranks(job, hosts, nhosts);
    if (nhosts > 0 && classify_hosts(hosts, nhosts) != 0)
        return -1;
    for (int r = 0; r < np; r++) {
        struct rank *rk = &job->ranks[r];
        rk->index = r;
        rk->stdin_fd = -1;
        rk->remote = rk->host != NULL && !rk->host->local;
        /* A remote rank's output is always read, to catch its start. */
        if (opt->prefix || rk->remote) {
            if (stream_init(&rk->out, r, STDOUT_FILENO, opt->prefix) != 0 ||
                stream_init(&rk->err, r, STDERR_FILENO, opt->prefix) != 0)
                goto no_memory;
            rk->err.awaiting_start = rk->remote;
            fds += rk->remote ? 3 : 2;
        }
    }
    for (int r = 0; r < np; r++) {
        if (job->ranks[r].remote) {
            if (getcwd(job->cwd, sizeof(job->cwd)) == NULL) {
                say("getcwd() failed: %s (remote ranks run in hvdrun's "
                    "working directory)",
                    strerror(errno));
                return -1;
            }
            break;
        }
    }

    switch (env_build(&job->env, opt)) {
    case 0:
        break;
    case -2: /* a bad configuration file: said why */
        return -1;
    default:
        goto no_memory;
    }
    if (choose_bind_addr(job, env_get(&job->env, "HVD_IFACE")) != 0)
        return -1;

    /* The ranks get the secret as text (HVD_SECRET): its 64 hex digits are
     * the secret. The job id is formatted by the library that parses it. */
    if (random_bytes(secret_bytes, sizeof(secret_bytes)) != 0 ||
        random_bytes(job_id, sizeof(job_id)) != 0)
        return -1;
    for (size_t k = 0; k < sizeof(secret_bytes); k++)
        snprintf(job->secret + 2 * k, 3, "%02x", secret_bytes[k]);
    hvd_job_id_format(job_id, job_hex);
    memcpy(job->job_id, job_id, sizeof(job_id));
    snprintf(start_marker, sizeof(start_marker), "hvdrun-started %s", job_hex);

    hvd_status st = hvd_rdv_server_create(job->bind_addr, 0, np, job_id,
                                          job->secret, &job->srv);
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
        env_set(&job->env, "HVD_SECRET", job->secret) != 0 ||
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
    if (fds > 0 && raise_nofile(np, fds) != 0)
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

/* In the child: undoes what hvdrun changed for itself. */
static void child_reset(void) {
    setpgid(0, 0);
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
                      int err_w) __attribute__((noreturn));
static void exec_rank(const struct job *job, const struct rank *r, int out_w,
                      int err_w) {
    const char *prog = job->opt->prog_argv[0];

    child_reset();
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
static void exec_ssh(char **argv, int in_r, int out_w, int err_w)
    __attribute__((noreturn));
static void exec_ssh(char **argv, int in_r, int out_w, int err_w) {
    child_reset();
    dup2(in_r, STDIN_FILENO);
    dup2(out_w, STDOUT_FILENO);
    dup2(err_w, STDERR_FILENO);
    execvp(argv[0], argv);
    exec_failed(argv[0]);
}

static void close_fd(int *fd) {
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* A growing string; failed is set (and the text dropped) when out of
 * memory, so a builder checks once at the end. */
struct sbuf {
    char *p;
    size_t len;
    size_t cap;
    int failed;
};

static void sbuf_addn(struct sbuf *b, const char *text, size_t n) {
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap == 0 ? 1024 : b->cap;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            free(b->p);
            memset(b, 0, sizeof(*b));
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, text, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sbuf_add(struct sbuf *b, const char *text) {
    sbuf_addn(b, text, strlen(text));
}

/* text as one word of POSIX sh: in single quotes, each ' as '\''. */
static void sbuf_quote(struct sbuf *b, const char *text) {
    sbuf_add(b, "'");
    for (const char *q; (q = strchr(text, '\'')) != NULL; text = q + 1) {
        sbuf_addn(b, text, (size_t)(q - text));
        sbuf_add(b, "'\\''");
    }
    sbuf_add(b, text);
    sbuf_add(b, "'");
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

    snprintf(msg, sizeof(msg), "hvdrun: rank %d on %s: no job secret on stdin",
             r->index, host);
    sbuf_add(&b, "IFS= read -r HVD_SECRET || { ");
    sbuf_say(&b, msg);
    sbuf_add(&b, "; exit 1; }; export HVD_SECRET; cd ");
    sbuf_quote(&b, job->cwd);
    sbuf_add(&b, " 2>/dev/null || { if test -d ");
    sbuf_quote(&b, job->cwd);
    sbuf_add(&b, "; then ");
    snprintf(msg, sizeof(msg),
             "hvdrun: cannot start rank %d on %s: cannot cd to %s there "
             "(ranks run in the directory hvdrun runs in)",
             r->index, host, job->cwd);
    sbuf_say(&b, msg);
    sbuf_add(&b, "; else ");
    snprintf(msg, sizeof(msg),
             "hvdrun: cannot start rank %d on %s: there is no directory %s "
             "there (ranks run in the directory hvdrun runs in)",
             r->index, host, job->cwd);
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

    sbuf_add(&b, "; hvd_p=");
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
                 "( trap - INT QUIT; exec $hvd_s");
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

/* A NULL-terminated argument vector of owned strings. */
struct strv {
    char **v;
    size_t n;
    size_t cap;
    int failed;
};

static void strv_push(struct strv *a, const char *arg) {
    char *copy = a->failed ? NULL : strdup(arg);

    if (copy != NULL && a->n + 2 > a->cap) {
        size_t cap = a->cap == 0 ? 32 : 2 * a->cap;
        char **v = realloc(a->v, cap * sizeof(*v));
        if (v == NULL) {
            free(copy);
            copy = NULL;
        } else {
            a->v = v;
            a->cap = cap;
        }
    }
    if (copy == NULL) {
        a->failed = 1;
        return;
    }
    a->v[a->n++] = copy;
    a->v[a->n] = NULL;
}

static void strv_free(struct strv *a) {
    for (size_t k = 0; k < a->n; k++)
        free(a->v[k]);
    free(a->v);
    memset(a, 0, sizeof(*a));
}

/* The arguments as one line for messages, each quoted for sh if needed. */
static char *strv_text(char *const *argv) {
    struct sbuf b = {0};

    for (char *const *a = argv; *a != NULL; a++) {
        if (a != argv)
            sbuf_add(&b, " ");
        if (**a != '\0' &&
            strspn(*a, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkl"
                       "mnopqrstuvwxyz0123456789_-+=/.,:@%") == strlen(*a))
            sbuf_add(&b, *a);
        else
            sbuf_quote(&b, *a);
    }
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
    pid_t pid;

    if (r->remote && pipe2(in, O_CLOEXEC) != 0) {
        say("cannot start rank %d: pipe2() failed: %s", r->index,
            strerror(errno));
        goto close_pipes;
    }
    if (r->out.buf != NULL) {
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
    if (pid == 0) {
        if (r->remote)
            exec_ssh(ssh_args, in[0], out[1], err[1]);
        exec_rank(job, r, out[1], err[1]);
    }
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
        HVD_INFO("hvdrun", "rank %d: ssh to %s, pid %d", r->index,
                 r->host->name, (int)pid);
    } else {
        HVD_INFO("hvdrun", "rank %d: pid %d", r->index, (int)pid);
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

static int spawn_rank(struct job *job, struct rank *r) {
    struct strv args = {0};
    int rc;

    if (env_set_int(&job->env, "HVD_RANK", r->index) != 0 ||
        env_set_int(&job->env, "HVD_LOCAL_RANK", r->local_rank) != 0 ||
        env_set_int(&job->env, "HVD_LOCAL_SIZE", r->local_size) != 0 ||
        env_set_int(&job->env, "HVD_CROSS_RANK", r->cross_rank) != 0 ||
        env_set_int(&job->env, "HVD_CROSS_SIZE", r->cross_size) != 0) {
        say("cannot start rank %d: out of memory", r->index);
        return -1;
    }
    if (!r->remote)
        return launch(job, r, NULL);
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

/* ---- output ---- */

/* Until the start marker: drops it, or keeps the line as the last one. */
static int stream_check_start(struct stream *s) {
    const char *line = s->buf + s->prefix_len;
    size_t n = s->len;

    if (n == strlen(start_marker) && memcmp(line, start_marker, n) == 0) {
        s->awaiting_start = 0;
        s->len = 0;
        return 1;
    }
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
        n--; /* ssh ends its messages with \r\n */
    if (n > 0) {
        if (n >= sizeof(s->last_line))
            n = sizeof(s->last_line) - 1;
        memcpy(s->last_line, line, n);
        s->last_line[n] = '\0';
    }
    return 0;
}

static void stream_flush(struct stream *s) {
    if (s->awaiting_start && stream_check_start(s))
        return;
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

static int job_run(struct job *job) {
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

static void job_destroy(struct job *job) {
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
    free(job->ranks);
    free(job->pfds);
    free(job->pfd_streams);
}

/* ---- --mpi ---- */

static int is_hvd_name(const char *const *names, size_t n, const char *name,
                       size_t len) {
    for (size_t k = 0; k < n; k++) {
        if (strlen(names[k]) == len && memcmp(names[k], name, len) == 0)
            return 1;
    }
    return 0;
}

/*
 * --mpi: execs mpirun -np N [-H host:slots,...] --bind-to none
 * [--oversubscribe] [--allow-run-as-root] [-x ...] program args. The ranks
 * bootstrap through MPI, so none of hvdrun's job variables is set (and any
 * in hvdrun's environment are removed); the -x variables and the HVD_*
 * variables of hvdrun's environment are passed with -x. Returns only on
 * failure, with hvdrun's exit status.
 */
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

static int run_mpirun(const struct options *opt) {
    const char *iface = opt->iface != NULL ? opt->iface : getenv("HVD_IFACE");
    struct strv a = {0};
    struct sbuf hosts = {0};
    char num[32];

    if (config_to_environ(opt) != 0)
        return EXIT_USAGE;
    strv_push(&a, "mpirun");
    strv_push(&a, "-np");
    snprintf(num, sizeof(num), "%d", opt->np);
    strv_push(&a, num);
    if (opt->nhosts > 0) {
        for (int h = 0; h < opt->nhosts; h++) {
            if (strchr(opt->hosts[h].name, ':') != NULL) {
                say("--mpi: mpirun's -H takes no IPv6 address (%s); name "
                    "the host",
                    opt->hosts[h].name);
                strv_free(&a);
                free(hosts.p);
                return EXIT_USAGE;
            }
            snprintf(num, sizeof(num), ":%d", opt->hosts[h].slots);
            if (h > 0)
                sbuf_add(&hosts, ",");
            sbuf_add(&hosts, opt->hosts[h].name);
            sbuf_add(&hosts, num);
        }
        strv_push(&a, "-H");
        strv_push(&a, hosts.failed ? "" : hosts.p);
        a.failed |= hosts.failed;
        free(hosts.p);
    }
    strv_push(&a, "--bind-to");
    strv_push(&a, "none");
    if (opt->oversubscribe)
        strv_push(&a, "--oversubscribe");
    if (geteuid() == 0)
        strv_push(&a, "--allow-run-as-root");
    if (opt->timeout_s > 0) {
        snprintf(num, sizeof(num), "%ld", opt->timeout_s);
        strv_push(&a, "--timeout");
        strv_push(&a, num);
    }
    if (iface != NULL && *iface != '\0') {
        /* Open MPI's own traffic over the same interface. */
        strv_push(&a, "--mca");
        strv_push(&a, "btl_tcp_if_include");
        strv_push(&a, iface);
        strv_push(&a, "--mca");
        strv_push(&a, "oob_tcp_if_include");
        strv_push(&a, iface);
    }
    if (opt->ssh_port != NULL || opt->ssh_identity != NULL ||
        opt->nssh_opts > 0) {
        struct sbuf rsh = {0};
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
        strv_push(&a, "--mca");
        strv_push(&a, "plm_rsh_args");
        strv_push(&a, rsh.failed ? "" : rsh.p + 1);
        a.failed |= rsh.failed;
        free(rsh.p);
    }
    for (int k = 0; k < opt->nexports; k++) {
        strv_push(&a, "-x");
        strv_push(&a, opt->exports[k]);
    }
    if (opt->iface != NULL) {
        char *var;
        if (asprintf(&var, "HVD_IFACE=%s", opt->iface) < 0) {
            a.failed = 1;
        } else {
            strv_push(&a, "-x");
            strv_push(&a, var);
            free(var);
        }
    }
    if (opt->start_timeout_s > 0 &&
        getenv("HVD_START_TIMEOUT_SECONDS") == NULL) {
        snprintf(num, sizeof(num), "%ld", opt->start_timeout_s);
        if (setenv("HVD_START_TIMEOUT_SECONDS", num, 1) != 0)
            a.failed = 1;
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
            a.failed = 1;
            break;
        }
        strv_push(&a, "-x");
        strv_push(&a, name);
        free(name);
    }
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
    execvp(a.v[0], a.v);
    say("cannot run mpirun: %s (it comes with Open MPI; without --mpi "
        "hvdrun starts the ranks itself)",
        strerror(errno));
    strv_free(&a);
    return EXIT_NOT_RUN;
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
    if (opt.mpi) {
        code = run_mpirun(&opt);
        goto free_options;
    }

    sigprocmask(SIG_SETMASK, NULL, &orig_sigmask);
    getrlimit(RLIMIT_NOFILE, &orig_nofile);
    memset(&job, 0, sizeof(job));
    job.opt = &opt;
    job.null_fd = -1;
    job.exit_code = -1;
    code = EXIT_SETUP;
    if (job_setup(&job, opt.hosts, opt.nhosts) != 0 || install_signals() != 0)
        goto destroy_job;
    code = job_run(&job);
    /* A rank killed while hvd_init set up shared memory leaves its segment
     * behind (ranks unlink them as soon as all have mapped them). */
    {
        int removed = hvd_shm_cleanup_job(job.job_id);
        if (removed > 0)
            HVD_INFO("hvdrun",
                     "removed %d shared-memory segments a failed "
                     "rank left in /dev/shm",
                     removed);
    }

destroy_job:
    job_destroy(&job);
    close_fd(&sig_pipe[0]);
    close_fd(&sig_pipe[1]);
free_options:
    free_options(&opt);
    return code;
}
