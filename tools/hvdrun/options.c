/*
 * hvdrun's command line: the --help text, parse_options() with its checks
 * of each value, and -H/--hostfile taken into the list of hosts (through
 * tools/hostfile.c). Everything here runs before a job exists; a mistake
 * is reported as a usage error (exit status 2) and nothing is started.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd/hvd.h"
#include "tools/check_build.h"

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
    "  --bind-to none|core|socket\n"
    "                     bind each rank to CPUs: core: the cores of its\n"
    "                     host divided among its ranks, consecutive, in\n"
    "                     local rank order; socket: one socket's cores,\n"
    "                     round-robin; none: no binding (the default)\n"
    "  --binding-args ARGS\n"
    "                     horovodrun's spelling: only \"--bind-to X\"\n"
    "  --mpi              run mpirun with these ranks and hosts instead of\n"
    "                     starting them (hvd then bootstraps through MPI)\n"
    "  -v, --verbose      log what hvdrun does (info level)\n"
    "\n"
    "elastic jobs (any of --min-np, --max-np, --host-discovery-script; see\n"
    "docs/elastic.md):\n"
    "  --min-np N         fewer live workers than N for --elastic-timeout\n"
    "                     ends the job (default: -np)\n"
    "  --max-np N         never more workers than N (default: every slot)\n"
    "  -np N              the job's intended size: default of --min-np\n"
    "                     (workers fill every free slot up to --max-np)\n"
    "  --host-discovery-script P\n"
    "                     run P (with sh -c) every --discovery-interval s;\n"
    "                     it prints the hosts to use now, HOST or HOST:SLOTS\n"
    "                     a line (default: -H/--hostfile, else this machine)\n"
    "  --slots N          slots of a host the script lists without :SLOTS,\n"
    "                     and of this machine without hosts (default: 1;\n"
    "                     this machine alone: -np, else --max-np, --min-np)\n"
    "  --discovery-interval S\n"
    "                     seconds between runs of the script (default 1)\n"
    "  --elastic-timeout S\n"
    "                     seconds the job may stay below --min-np, and\n"
    "                     workers may take to rejoin (default 600)\n"
    "  --reset-limit N    re-formations allowed; one more ends the job\n"
    "                     (default: no limit)\n"
    "  --blacklist-cooldown-range MIN MAX\n"
    "                     a failed slot, or a blacklisted host, comes back\n"
    "                     after a random MIN to MAX seconds (default: never)\n"
    "  --host-failures N  failed workers that blacklist their host (default "
    "3)\n"
    "  --help             print this text\n"
    "  --version          print hvdrun's version\n"
    "  --check-build      print the frameworks (with HVD_PYTHON, else the\n"
    "                     python3 beside hvdrun, else python3 on PATH),\n"
    "                     transports and GPU support of this hvd\n"
    "\n"
    "Every rank gets HVD_RANK, HVD_SIZE, HVD_LOCAL_RANK, HVD_LOCAL_SIZE,\n"
    "HVD_CROSS_RANK, HVD_CROSS_SIZE, HVD_RENDEZVOUS_ADDR, "
    "HVD_RENDEZVOUS_PORT,\n"
    "HVD_SECRET and HVD_JOB_ID (fresh for each job), HOROVOD_RANK,\n"
    "HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK\n"
    "and HOROVOD_CROSS_SIZE (as horovodrun sets them), plus HVD_IFACE and\n"
    "HVD_START_TIMEOUT_SECONDS from the options above, and OMP_NUM_THREADS,\n"
    "MKL_NUM_THREADS and OPENBLAS_NUM_THREADS (each unless set, in hvdrun's\n"
    "environment or with -x) = the cores of its host (the affinity mask\n"
    "there, capped by a cgroup CPU quota) divided by the ranks there, at\n"
    "least 1, or with --bind-to the cores it is bound to. OMPI_COMM_WORLD_*,\n"
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

/* --binding-args ARGS: horovodrun passes them to mpirun; hvdrun takes
 * only "--bind-to X" (or -bind-to, --bind-to=X) from them. */
static int parse_binding_args(const char *text, enum bind_to *out) {
    char buf[128];
    char *save = NULL, *word = NULL, *value = NULL;

    if (strlen(text) < sizeof(buf)) {
        snprintf(buf, sizeof(buf), "%s", text);
        word = strtok_r(buf, " \t", &save);
    }
    if (word != NULL && (strncmp(word, "--bind-to=", 10) == 0 ||
                         strncmp(word, "-bind-to=", 9) == 0))
        value = strchr(word, '=') + 1;
    else if (word != NULL &&
             (strcmp(word, "--bind-to") == 0 || strcmp(word, "-bind-to") == 0))
        value = strtok_r(NULL, " \t", &save);
    if (value != NULL && strtok_r(NULL, " \t", &save) == NULL &&
        bind_parse(value, out) == 0)
        return 0;
    usage_error("--binding-args \"%s\": hvdrun takes only \"--bind-to "
                "none|core|socket\" there; for other mpirun binding options "
                "run mpirun yourself",
                text);
    return -1;
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

static int is_elastic_var(const char *name, size_t len) {
    for (size_t k = 0; k < ARRAY_LEN(elastic_vars); k++) {
        if (strlen(elastic_vars[k]) == len &&
            memcmp(elastic_vars[k], name, len) == 0)
            return 1;
    }
    return 0;
}

/* The elastic options, checked together; np, min_np and max_np may still
 * be 0 (decided from the slots at the start). */
static int check_elastic(struct options *opt, int given_elastic_only,
                         const char *first_elastic_only) {
    if (!opt->elastic) {
        if (given_elastic_only) {
            usage_error("%s is for elastic jobs (add --min-np, --max-np or "
                        "--host-discovery-script)",
                        first_elastic_only);
            return -1;
        }
        return 0;
    }
    if (opt->mpi) {
        usage_error("--mpi cannot run an elastic job");
        return -1;
    }
    if (opt->discovery_script != NULL && opt->nhosts > 0) {
        usage_error("give --host-discovery-script or -H/--hostfile, not both");
        return -1;
    }
    if (opt->min_np > 0 && opt->max_np > 0 && opt->min_np > opt->max_np) {
        usage_error("--min-np %d is more than --max-np %d", opt->min_np,
                    opt->max_np);
        return -1;
    }
    if (opt->np > 0 && opt->min_np > 0 && opt->np < opt->min_np) {
        usage_error("-np %d is less than --min-np %d", opt->np, opt->min_np);
        return -1;
    }
    if (opt->np > 0 && opt->max_np > 0 && opt->np > opt->max_np) {
        usage_error("-np %d is more than --max-np %d", opt->np, opt->max_np);
        return -1;
    }
    if (opt->have_cooldown && opt->cooldown_min_s > opt->cooldown_max_s) {
        usage_error("--blacklist-cooldown-range %ld %ld: MIN is more than MAX",
                    opt->cooldown_min_s, opt->cooldown_max_s);
        return -1;
    }
    for (int k = 0; k < opt->nexports; k++) {
        size_t len = strcspn(opt->exports[k], "=");
        if (is_elastic_var(opt->exports[k], len)) {
            usage_error("-x %s: hvdrun sets %.*s itself in an elastic job",
                        opt->exports[k], (int)len, opt->exports[k]);
            return -1;
        }
    }
    return 0;
}

/* Returns -1 to go on and run the job, else the exit status. */
int parse_options(int argc, char **argv, struct options *opt) {
    const char *host_list = NULL;
    const char *hostfile = NULL;
    const char *elastic_only = NULL; /* the first one given */
    int i;

    memset(opt, 0, sizeof(*opt));
    opt->prefix = 1;
    opt->grace_s = DEFAULT_GRACE_S;
    opt->discovery_interval_s = 1;
    opt->elastic_timeout_s = 600;
    opt->reset_limit = -1;
    opt->host_failures = 3;
    opt->bind_to = DEFAULT_BIND_TO;
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
        } else if ((m = value_option(argc, argv, &i, "--min-np", &val)) != 0) {
            if (m < 0 || parse_long("--min-np", val, 1, MAX_RANKS, &v) != 0)
                return EXIT_USAGE;
            opt->min_np = (int)v;
            opt->elastic = 1;
        } else if ((m = value_option(argc, argv, &i, "--max-np", &val)) != 0) {
            if (m < 0 || parse_long("--max-np", val, 1, MAX_RANKS, &v) != 0)
                return EXIT_USAGE;
            opt->max_np = (int)v;
            opt->elastic = 1;
        } else if ((m = value_option(argc, argv, &i, "--host-discovery-script",
                                     &val)) != 0) {
            if (m < 0)
                return EXIT_USAGE;
            if (*val == '\0') {
                usage_error("--host-discovery-script needs a program");
                return EXIT_USAGE;
            }
            opt->discovery_script = val;
            opt->elastic = 1;
        } else if ((m = value_option(argc, argv, &i, "--slots", &val)) != 0) {
            if (m < 0 || parse_long("--slots", val, 1, MAX_RANKS, &v) != 0)
                return EXIT_USAGE;
            opt->slots = (int)v;
            elastic_only = elastic_only != NULL ? elastic_only : "--slots";
        } else if ((m = value_option(argc, argv, &i, "--discovery-interval",
                                     &val)) != 0) {
            if (m < 0 || parse_long("--discovery-interval", val, 1, 3600,
                                    &opt->discovery_interval_s) != 0)
                return EXIT_USAGE;
            elastic_only =
                elastic_only != NULL ? elastic_only : "--discovery-interval";
        } else if ((m = value_option(argc, argv, &i, "--elastic-timeout",
                                     &val)) != 0) {
            if (m < 0 || parse_long("--elastic-timeout", val, 1, MAX_SECONDS,
                                    &opt->elastic_timeout_s) != 0)
                return EXIT_USAGE;
            elastic_only =
                elastic_only != NULL ? elastic_only : "--elastic-timeout";
        } else if ((m = value_option(argc, argv, &i, "--reset-limit", &val)) !=
                   0) {
            if (m < 0 || parse_long("--reset-limit", val, 0, 1000000,
                                    &opt->reset_limit) != 0)
                return EXIT_USAGE;
            elastic_only =
                elastic_only != NULL ? elastic_only : "--reset-limit";
        } else if ((m = value_option(argc, argv, &i,
                                     "--blacklist-cooldown-range", &val)) !=
                   0) {
            if (m < 0)
                return EXIT_USAGE;
            if (i + 1 >= argc) {
                usage_error("--blacklist-cooldown-range needs MIN and MAX");
                return EXIT_USAGE;
            }
            if (parse_long("--blacklist-cooldown-range MIN", val, 0,
                           MAX_SECONDS, &opt->cooldown_min_s) != 0 ||
                parse_long("--blacklist-cooldown-range MAX", argv[++i], 0,
                           MAX_SECONDS, &opt->cooldown_max_s) != 0)
                return EXIT_USAGE;
            opt->have_cooldown = 1;
            elastic_only = elastic_only != NULL ? elastic_only
                                                : "--blacklist-cooldown-range";
        } else if ((m = value_option(argc, argv, &i, "--host-failures",
                                     &val)) != 0) {
            if (m < 0 ||
                parse_long("--host-failures", val, 1, 1000000, &v) != 0)
                return EXIT_USAGE;
            opt->host_failures = (int)v;
            elastic_only =
                elastic_only != NULL ? elastic_only : "--host-failures";
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
        } else if ((m = value_option(argc, argv, &i, "--bind-to", &val)) != 0) {
            if (m < 0)
                return EXIT_USAGE;
            if (bind_parse(val, &opt->bind_to) != 0) {
                usage_error("--bind-to %s: expected none, core or socket", val);
                return EXIT_USAGE;
            }
        } else if ((m = value_option(argc, argv, &i, "--binding-args", &val)) !=
                   0) {
            if (m < 0 || parse_binding_args(val, &opt->bind_to) != 0)
                return EXIT_USAGE;
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
        check_elastic(opt, elastic_only != NULL, elastic_only) != 0)
        return EXIT_USAGE;
    if (opt->elastic) {
        /* -np, --min-np and --max-np are settled against the slots at the
         * start (elastic.c). */
        opt->prog_argv = argv + i;
        return -1;
    }
    if (opt->nhosts > 0 && check_slots(opt) != 0)
        return EXIT_USAGE;
    if (opt->np == 0) {
        usage_error("-np N is required");
        return EXIT_USAGE;
    }
    opt->prog_argv = argv + i;
    return -1;
}

void free_options(struct options *opt) {
    for (int h = 0; h < opt->nhosts; h++)
        free(opt->hosts[h].name);
    free(opt->hosts);
    free(opt->exports);
    free(opt->ssh_opts);
}
