/*
 * The internal header of hvdrun, the launcher (tools/hvdrun/). It holds
 * what the files of that folder share: the limits and exit statuses, the
 * options, the job with its ranks and their output streams, the
 * environment being built for the ranks, the string builders, and the few
 * process-wide variables (the signal self-pipe, what hvdrun changed for
 * itself). Each group of declarations below names the file that defines
 * it; main.c tells how hvdrun works as a whole. The header is part of the
 * tool only, neither of libhvd nor installed.
 */
#ifndef HVD_TOOLS_HVDRUN_HVDRUN_H
#define HVD_TOOLS_HVDRUN_HVDRUN_H

#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "tools/config_file.h"
#include "tools/hostfile.h"
#include "transport/bootstrap/net.h"
#include "transport/bootstrap/rendezvous.h"

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

/* --bind-to: how each rank is bound to CPUs (binding.c). */
enum bind_to { BIND_NONE, BIND_CORE, BIND_SOCKET };

/* The default of --bind-to: none measured fastest with the thread
 * defaults (docs/benchmarks.md, "Issue 32"). */
#define DEFAULT_BIND_TO BIND_NONE

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
    /* Elastic mode (elastic.c): on with --min-np, --max-np or
     * --host-discovery-script. 0 in a count: not given. */
    int elastic;
    int min_np;
    int max_np;
    int slots;                    /* --slots */
    const char *discovery_script; /* --host-discovery-script, or NULL */
    long discovery_interval_s;    /* default 1 */
    long elastic_timeout_s;       /* default 600 */
    long reset_limit;             /* -1: unlimited */
    int have_cooldown;            /* --blacklist-cooldown-range given */
    long cooldown_min_s, cooldown_max_s;
    int host_failures;    /* default 3 */
    enum bind_to bind_to; /* --bind-to, default DEFAULT_BIND_TO */
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
    /* Its place for threads and binding: the local rank and size, or an
     * elastic worker's slot and its host's slots. */
    int slot, nslots;
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

/* This machine's CPUs and the thread variables the user set (binding.c). */
struct binding {
    int *cpus;    /* hvdrun's affinity mask, ascending */
    int *sockets; /* the socket of each */
    int ncpus;
    int quota;         /* its cgroup's CPU quota in CPUs; 0: none */
    unsigned user_set; /* bit k: thread_vars[k] set by the user */
    int said_shared;   /* warned of more ranks than cores */
    /* The CPUs of the rank about to be forked, when bound. */
    cpu_set_t *set;
    int bound;
};

enum job_phase {
    JOB_RUNNING,
    JOB_STOPPING, /* ranks got SIGTERM (or hvdrun's signal); kill_at_ns set */
    JOB_KILLED    /* ranks got SIGKILL */
};

struct elastic;

struct job {
    const struct options *opt;
    struct elastic *el; /* elastic mode's state (elastic.c), else NULL */
    struct rank *ranks;
    int live;    /* ranks started and not yet reaped */
    int pending; /* ranks not started yet (remote ones wait for a login) */
    struct env env;
    struct binding bind;
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

/* A growing string; failed is set (and the text dropped) when out of
 * memory, so a builder checks once at the end. */
struct sbuf {
    char *p;
    size_t len;
    size_t cap;
    int failed;
};

/* A NULL-terminated argument vector of owned strings. */
struct strv {
    char **v;
    size_t n;
    size_t cap;
    int failed;
};

/* ---- main.c: process-wide state, signals, main() ---- */

/* What hvdrun changed for itself, restored in each rank before exec. */
extern sigset_t orig_sigmask;
extern struct rlimit orig_nofile;
extern const int handled_signals[4];

/* The self-pipe: signal handlers write the signal number into it. */
extern int sig_pipe[2];

/* ---- options.c: the command line ---- */

/* Returns -1 to go on and run the job, else the exit status. */
int parse_options(int argc, char **argv, struct options *opt);
void free_options(struct options *opt);

/* ---- env.c: the ranks' environment and --config-file ---- */

/* Variables hvdrun sets for each rank; -x cannot override them. */
extern const char *const job_vars[16];

/* Variables of other launchers that the library would otherwise read. */
extern const char *const foreign_vars[11];
extern const char foreign_prefix[];

ssize_t env_find(const struct env *e, const char *name, size_t len);
const char *env_get(const struct env *e, const char *name);
int env_set(struct env *e, const char *name, const char *value);
int env_set_int(struct env *e, const char *name, long value);
void env_unset(struct env *e, const char *name);
void env_free(struct env *e);
/* Reads --config-file into *cv and warns of its notes; says why not. */
int config_read(const struct options *opt, hvd_config_vars *cv);
/* 1 if the configuration file's var ("HVD_NAME=value") is set neither in
 * its HVD_ nor in its HOROVOD_ form where get looks. */
int config_var_unset(const char *var,
                     const char *(*get)(void *ctx, const char *name),
                     void *ctx);
const char *environ_lookup(void *unused, const char *name);
/* hvdrun's environment, less other launchers' variables, plus the
 * configuration file, -x and the options that set variables. Returns 0, -1
 * out of memory, -2 for a bad configuration file (said why). */
int env_build(struct env *e, const struct options *opt);

/* ---- setup.c: placement, which hosts are this machine, job setup ---- */

int job_setup(struct job *job, struct host *hosts, int nhosts);
/* Is host (as ssh is given it, "user@" allowed) this machine? -1: cannot
 * tell (said why). */
int host_is_this_machine(const char *host);
/* Where the rendezvous listens: iface's address; else this machine's
 * address towards the first of the remote hosts (names) that resolves;
 * else loopback. Fills job->bind_addr; said why not. */
int bind_addr_choose(struct job *job, const char *iface,
                     const char *const *remote, int nremote);
/* A fresh job secret and job id (job->secret, job->job_id, start_marker);
 * job_hex gets the id as text. */
int job_identity(struct job *job, char job_hex[2 * HVD_JOB_ID_LEN + 1]);
/* Raises the soft limit of open files towards fds (np for the message). */
int raise_nofile(int np, rlim_t fds);

/* ---- launch.c: starting ranks, here or over ssh ---- */

/* The line a remote rank's wrapper writes on stderr once it has started
 * the program: "hvdrun-started <job id>". Set by job_setup(). */
extern char start_marker[64];

int spawn_rank(struct job *job, struct rank *r);
/* Elastic: starts worker r (r->index is its worker id) on r->host, with
 * HVD_ELASTIC_WORKER and HVD_HOSTNAME (hostname) set. */
int spawn_worker(struct job *job, struct rank *r, const char *hostname,
                 int expected_rank);

/* ---- strbuf.c: the string builders of the ssh and mpirun commands ---- */

void sbuf_addn(struct sbuf *b, const char *text, size_t n);
void sbuf_add(struct sbuf *b, const char *text);
/* text as one word of POSIX sh: in single quotes, each ' as '\''. */
void sbuf_quote(struct sbuf *b, const char *text);
void strv_push(struct strv *a, const char *arg);
void strv_free(struct strv *a);
/* The arguments as one line for messages, each quoted for sh if needed. */
char *strv_text(char *const *argv);

/* ---- output.c: hvdrun's messages and the ranks' output ---- */

/* Writes all of buf; gives up quietly on errors (EPIPE: nobody reads). */
void write_all(int fd, const char *buf, size_t len);
/* Prints "hvdrun: <message>\n" on stderr in one write(). */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *signal_name(int sig);
void close_fd(int *fd);
void stream_close(struct stream *s);
/* Reads what the pipe has, at most max_bytes; closes it at EOF. */
void stream_read(struct stream *s, size_t max_bytes);

/* ---- stop.c: stopping the ranks and reaping them ---- */

void kill_ranks(struct job *job);
/* Sends sig (and SIGCONT, for stopped ranks) to every rank; SIGKILL follows
 * after the grace period. Called again while stopping: SIGKILL now. */
void stop_job(struct job *job, int sig);
void read_signals(struct job *job);

/* ---- binding.c: the ranks' thread variables and CPU binding ---- */

/* OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS. */
extern const char *const thread_vars[3];

const char *bind_name(enum bind_to b);
/* "none", "core" or "socket"; -1 for anything else. */
int bind_parse(const char *text, enum bind_to *out);
/* After env_build(): notes the thread variables the user set and reads
 * this machine's CPUs. Says why not. */
int binding_setup(struct job *job);
void binding_free(struct binding *b);
/* The CPUs of slot of nslots of this machine into b->set (b->bound: not
 * none); returns its cores, the thread count (at least 1). */
int binding_place(struct binding *b, enum bind_to how, int slot, int nslots);
/* Sets the thread variables the user did not set to threads. */
int binding_thread_env(struct job *job, int threads);
/* In the child before exec: binds it to b->set when bound. */
void binding_apply(const struct binding *b);
/* --verbose: "host X: N ranks, C cores, --bind-to B: OMP_NUM_THREADS=T...". */
void binding_report(struct job *job, const char *host, int remote, int nranks);
/* A remote wrapper's sh: computes the cores there, exports the thread
 * variables and leaves in $hvd_b the taskset command that binds it. */
void binding_remote(struct sbuf *s, const struct job *job, const struct rank *r,
                    int slot, int nslots);

/* ---- loop.c: the event loop ---- */

int job_run(struct job *job);
void job_destroy(struct job *job);

/* ---- elastic mode (docs/elastic.md; elastic.c tells how it works) ---- */

/* A deadline that never comes: a slot that never cools down, a host
 * blacklisted for good. */
#define FOREVER INT64_MAX

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

/* elastic_setup.c: setup and teardown. */

/* Variables hvdrun sets for each elastic worker; -x cannot set them in an
 * elastic job. */
extern const char *const elastic_vars[4];

/* Setup of an elastic job instead of job_setup(): hosts, the first run of
 * the discovery script, the elastic rendezvous server, the environment. */
int elastic_setup(struct job *job);
/* Frees the elastic state (job_destroy() frees the rest); accepts none. */
void elastic_destroy(struct job *job);

/* elastic.c: the loop and the policy. */

/* The elastic job's loop instead of job_run(); returns the exit status. */
int elastic_run(struct job *job);

/* elastic_hosts.c: the hosts, their slots, the discovery script. */

/* A random cooldown in --blacklist-cooldown-range from now (*seconds its
 * length), or FOREVER without the option (*seconds -1). */
int64_t cooldown_until(const struct options *opt, int64_t now, long *seconds);
/* Makes hl the hosts the job may use now; initial: at the start (no
 * messages). Returns -1 when out of memory (said). */
int apply_hosts(struct job *job, const hvd_hostlist *hl, int initial,
                int64_t now);
/* Blacklists eh after its failures: its workers are stopped. */
void blacklist_host(struct job *job, struct ehost *eh, int64_t now);
/* At the start: runs the discovery script and waits for its hosts. */
int disc_run_now(struct job *job, hvd_hostlist *hl);
/* Starts a later run of the script; its output is read by disc_read() and
 * its end handled by disc_done() with its wait status. */
int disc_start(struct job *job, int64_t now);
void disc_read(struct elastic *el);
void disc_done(struct job *job, int ws, int64_t now);

/* elastic_workers.c: starting and stopping workers. */

/* Starts a worker on slot of eh; -1 when it could not (said). */
int start_worker(struct job *job, struct ehost *eh, int slot);
/* hvdrun stops w with sig (SIGKILL after the grace period); why goes to
 * the server and the log. */
void stop_worker(struct job *job, struct worker *w, int sig, const char *why,
                 int64_t now);
/* Stops the workers of eh on slots from first on; returns how many. */
int stop_host_workers(struct job *job, struct ehost *eh, int first,
                      const char *why, int64_t now);
/* SIGKILL to every worker still running. */
void kill_workers(struct job *job);
/* Ends the job with exit status code: the server tells joins why, and
 * every worker is stopped with sig. */
void end_job(struct job *job, int code, const char *why, int sig, int64_t now);
/* What ended worker w (exit status code), for messages and the log. */
void exit_text(const struct worker *w, int code, char *why, size_t len);
void worker_free(struct worker *w);

/* ---- watchdog.c: no child outlives hvdrun ---- */

/* In a child of hvdrun, after fork() and before exec: asks for SIGTERM
 * when hvdrun (hvdrun_pid) dies; exits 127 if it already has. hvdrun
 * forks only from its main (and only) thread: the signal comes when the
 * thread that forked ends. */
void die_with_hvdrun(pid_t hvdrun_pid);
/* Forks the watchdog, which stops the children hvdrun leaves behind if it
 * dies without stopping them (SIGTERM to their process groups, SIGKILL
 * after the grace period) and removes the job's shared-memory segments. */
int watchdog_start(const struct job *job);
/* hvdrun tells the watchdog of each child it starts (its process group
 * leader) and reaps, and of each elastic generation. */
void watchdog_started(pid_t pgid);
void watchdog_reaped(pid_t pid);
void watchdog_generation(uint32_t generation);
/* At hvdrun's normal end: the watchdog is told and reaped. */
void watchdog_finish(void);

/* ---- mpi.c: --mpi ---- */

int run_mpirun(const struct options *opt);

#endif /* HVD_TOOLS_HVDRUN_HVDRUN_H */
