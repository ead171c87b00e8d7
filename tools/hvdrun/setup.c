/*
 * Setting up a job before any rank starts: where each rank runs
 * (place_ranks()), which hosts are this machine (their ranks are forked,
 * the others' started over ssh), which address the rendezvous server
 * listens on, and job_setup(), which makes the job secret and id, opens
 * the rendezvous server and fills in the environment every rank shares.
 */
#include "tools/hvdrun/hvdrun.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/rand.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

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

/* Is host (as ssh is given it) this machine? -1: cannot tell. */
int host_is_this_machine(const char *host) {
    struct ifaddrs *ifs = NULL;
    char my_name[256];
    int local;

    if (getifaddrs(&ifs) != 0) {
        say("getifaddrs() failed: %s", strerror(errno));
        return -1;
    }
    if (gethostname(my_name, sizeof(my_name)) != 0)
        my_name[0] = '\0';
    my_name[sizeof(my_name) - 1] = '\0';
    local = host_is_local(host_part(host), my_name, ifs);
    freeifaddrs(ifs);
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

/* Where the rendezvous listens: iface's address; else this machine's
 * address towards the first of the remote hosts (names) that resolves;
 * else loopback. */
int bind_addr_choose(struct job *job, const char *iface,
                     const char *const *remote, int nremote) {
    char why[256] = "";

    if (iface != NULL && *iface != '\0') {
        if (hvd_net_iface_addr(iface, job->bind_addr, sizeof(job->bind_addr)) !=
            HVD_OK) {
            say("%s", hvd_error_get());
            return -1;
        }
        return 0;
    }
    for (int k = 0; k < nremote; k++) {
        if (route_addr(host_part(remote[k]), job->bind_addr,
                       sizeof(job->bind_addr), why, sizeof(why)) == 0) {
            HVD_INFO("hvdrun",
                     "serving the rendezvous on %s, the address "
                     "that reaches %s",
                     job->bind_addr, remote[k]);
            return 0;
        }
        HVD_INFO("hvdrun", "no route to %s: %s", remote[k], why);
    }
    if (nremote > 0) {
        say("cannot tell which address of this machine the remote hosts "
            "reach (%s: %s); name the interface with --network-interface",
            remote[0], why);
        return -1;
    }
    snprintf(job->bind_addr, sizeof(job->bind_addr), "127.0.0.1");
    return 0;
}

/* Where the rendezvous listens: HVD_IFACE's address; else, with remote
 * ranks, this machine's address towards the first remote host that
 * resolves; else loopback. */
static int choose_bind_addr(struct job *job, const char *iface) {
    const char **remote = calloc((size_t)job->opt->np, sizeof(*remote));
    int nremote = 0;
    int rc;

    if (remote == NULL) {
        say("out of memory");
        return -1;
    }
    for (int r = 0; r < job->opt->np; r++) {
        const struct rank *rk = &job->ranks[r];
        if (!rk->remote || (r > 0 && rk->host == job->ranks[r - 1].host))
            continue;
        remote[nremote++] = rk->host->name;
    }
    rc = bind_addr_choose(job, iface, remote, nremote);
    free(remote);
    return rc;
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
int raise_nofile(int np, rlim_t fds) {
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

/* A fresh job secret and job id. The ranks get the secret as text
 * (HVD_SECRET): its 64 hex digits are the secret. The job id is formatted
 * by the library that parses it. */
int job_identity(struct job *job, char job_hex[2 * HVD_JOB_ID_LEN + 1]) {
    uint8_t secret_bytes[SECRET_BYTES];

    if (random_bytes(secret_bytes, sizeof(secret_bytes)) != 0 ||
        random_bytes(job->job_id, sizeof(job->job_id)) != 0)
        return -1;
    for (size_t k = 0; k < sizeof(secret_bytes); k++)
        snprintf(job->secret + 2 * k, 3, "%02x", secret_bytes[k]);
    hvd_job_id_format(job->job_id, job_hex);
    snprintf(start_marker, sizeof(start_marker), "hvdrun-started %s", job_hex);
    return 0;
}

/* --verbose: each host's ranks, cores and thread variables. */
static void report_threads(struct job *job, const struct host *hosts,
                           int nhosts) {
    if (nhosts == 0)
        binding_report(job, "localhost", 0, job->opt->np);
    for (int h = 0; h < nhosts; h++)
        if (hosts[h].nranks > 0)
            binding_report(job, hosts[h].name, !hosts[h].local,
                           hosts[h].nranks);
}

int job_setup(struct job *job, struct host *hosts, int nhosts) {
    const struct options *opt = job->opt;
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
    if (binding_setup(job) != 0)
        return -1;
    report_threads(job, hosts, nhosts);
    if (choose_bind_addr(job, env_get(&job->env, "HVD_IFACE")) != 0)
        return -1;

    if (job_identity(job, job_hex) != 0)
        return -1;

    hvd_status st = hvd_rdv_server_create(job->bind_addr, 0, np, job->job_id,
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
        env_set_int(&job->env, "HOROVOD_SIZE", np) != 0 ||
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
