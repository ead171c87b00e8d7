/*
 * The rendezvous hosted by rank 0 (rendezvous.h): the server in a thread
 * of rank 0's process on the first free port of a range, and the client
 * that tries the range. Launchers such as torchrun and Slurm's srun start
 * the ranks but give them no channel to meet through, and no port that
 * is known to be free: rank 0 takes the first free one, and the others
 * find it by asking each port of the range in turn.
 */
#include "transport/bootstrap/rdv_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/base/wire.h"
#include "transport/bootstrap/munge.h"

/* How long one port may take to answer a client: a program there that
 * accepts and then says nothing costs this much per cycle. */
#define TRY_NS (2 * 1000000000LL)
/* The pause between two cycles over the range while rank 0 is not up. */
#define CYCLE_PAUSE_MS 100

struct hvd_rdv_host {
    hvd_rdv_server *srv;
    int port;
    int wake_fd; /* eventfd: hvd_rdv_host_stop wakes the thread */
    pthread_t thread;
    atomic_int stop;
    /* The thread's failure: status last, after the sentence. */
    atomic_int status;
    char why[HVD_ERROR_MAX];
    /* Under srun with munge: what each credential holds, and munged's
     * socket. */
    uint8_t payload[HVD_RDV_CRED_PAYLOAD];
    char munge_socket[256];
};

/* The server's answer to a credential request (hosted thread): a fresh
 * credential, which munge lets only this uid decode. */
static int make_cred(void *ctx, char *cred, size_t cap) {
    hvd_rdv_host *h = ctx;
    char text[HVD_MUNGE_CRED_MAX];

    if (hvd_munge_encode(h->munge_socket[0] ? h->munge_socket : NULL,
                         h->payload, sizeof(h->payload), text) != HVD_OK) {
        HVD_WARN("rdv", "%s", hvd_error_get());
        return -1;
    }
    size_t n = strlen(text);
    if (n > cap)
        return -1;
    memcpy(cred, text, n);
    return (int)n;
}

hvd_status hvd_rdv_resolve(const char *name, char addr_out[64]) {
    struct addrinfo hints, *res = NULL, *pick = NULL;
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(name, NULL, &hints, &res);
    if (rc != 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "the rendezvous host %s does not resolve: %s",
                             name, gai_strerror(rc));
    for (struct addrinfo *a = res; a != NULL && pick == NULL; a = a->ai_next)
        if (a->ai_family == AF_INET)
            pick = a;
    for (struct addrinfo *a = res; a != NULL && pick == NULL; a = a->ai_next)
        if (a->ai_family == AF_INET6)
            pick = a;
    rc = pick != NULL ? getnameinfo(pick->ai_addr, pick->ai_addrlen, addr_out,
                                    64, NULL, 0, NI_NUMERICHOST)
                      : EAI_FAMILY;
    freeaddrinfo(res);
    if (rc != 0)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "the rendezvous host %s has no IPv4 or IPv6 "
                             "address",
                             name);
    return HVD_OK;
}

/* 1 if addr (numeric) is an address of this host: a socket binds to it. */
static int local_address(const char *addr) {
    struct sockaddr_in6 sa6;
    struct sockaddr_in sa4;
    int v6 = strchr(addr, ':') != NULL, ok;
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return 0;
    memset(&sa6, 0, sizeof(sa6));
    memset(&sa4, 0, sizeof(sa4));
    sa6.sin6_family = AF_INET6;
    sa4.sin_family = AF_INET;
    if (v6)
        ok = inet_pton(AF_INET6, addr, &sa6.sin6_addr) == 1 &&
             bind(fd, (struct sockaddr *)&sa6, sizeof(sa6)) == 0;
    else
        ok = inet_pton(AF_INET, addr, &sa4.sin_addr) == 1 &&
             bind(fd, (struct sockaddr *)&sa4, sizeof(sa4)) == 0;
    close(fd);
    return ok;
}

/* The server's thread: serves until the job's rounds are done and every
 * rank has closed its connection, or until stopped. */
static void *host_main(void *arg) {
    hvd_rdv_host *h = arg;
    hvd_status st = HVD_OK;

    while (!atomic_load(&h->stop)) {
        struct pollfd pfd[2] = {
            {.fd = hvd_rdv_server_fd(h->srv), .events = POLLIN},
            {.fd = h->wake_fd, .events = POLLIN}};
        if (poll(pfd, 2, 1000) < 0 && errno != EINTR) {
            st = hvd_error_set(HVD_ERR_TRANSPORT,
                               "the rendezvous rank 0 hosts failed: poll(): %s",
                               strerror(errno));
            break;
        }
        st = hvd_rdv_server_progress(h->srv, 0);
        if (st != HVD_OK || hvd_rdv_server_finished(h->srv))
            break;
    }
    if (st != HVD_OK) {
        snprintf(h->why, sizeof(h->why),
                 "the rendezvous rank 0 hosts failed: %s", hvd_error_get());
        HVD_ERROR("rdv", "%s", h->why);
        atomic_store(&h->status, (int)st);
    }
    /* The port is free again as soon as the job no longer needs it. */
    hvd_rdv_server_destroy(h->srv);
    h->srv = NULL;
    return NULL;
}

/* Listens on the first free port of the range. */
static hvd_status listen_range(hvd_rdv_host *h, const char *bind_addr, int port,
                               int last, int size,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const char *secret) {
    char why[HVD_ERROR_MAX] = "";

    for (int p = port; p <= last; p++) {
        if (hvd_rdv_server_create(bind_addr, p, size, job_id, secret,
                                  &h->srv) == HVD_OK) {
            h->port = p;
            return HVD_OK;
        }
        snprintf(why, sizeof(why), "%s", hvd_error_get());
    }
    return hvd_error_set(HVD_ERR_TRANSPORT,
                         "rank 0 hosts the rendezvous but no port of %s "
                         "%d-%d is free (the last said: %s): free one, or "
                         "move the range (HVD_RENDEZVOUS_PORT)",
                         bind_addr, port, last, why);
}

hvd_status hvd_rdv_host_start(const char *addr, int port, int span, int size,
                              const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret, const hvd_rdv_munge *munge,
                              hvd_rdv_host **out) {
    hvd_rdv_host *h;
    const char *bind_addr = addr;
    int last = port + (span > 0 ? span : 1) - 1;
    hvd_status st;

    if (port < 1 || port > 65535)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "rendezvous port %d is not a port", port);
    if (last > 65535)
        last = 65535;
    /* An address of another host (a Kubernetes service's, a NAT's) routes
     * to this one: listen on every address then. */
    if (!local_address(addr))
        bind_addr = strchr(addr, ':') != NULL ? "::" : "0.0.0.0";
    h = calloc(1, sizeof(*h));
    if (h == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (h->wake_fd < 0) {
        st = hvd_error_set(HVD_ERR_TRANSPORT, "eventfd() failed: %s",
                           strerror(errno));
        goto free_host;
    }
    st = listen_range(h, bind_addr, port, last, size, job_id, secret);
    if (st != HVD_OK)
        goto free_host;
    if (munge != NULL && munge->on) {
        memcpy(h->payload, job_id, HVD_JOB_ID_LEN);
        strncpy((char *)h->payload + HVD_JOB_ID_LEN, secret,
                HVD_RDV_CRED_SECRET);
        snprintf(h->munge_socket, sizeof(h->munge_socket), "%s",
                 munge->socket != NULL ? munge->socket : "");
        hvd_rdv_server_set_cred(h->srv, make_cred, h);
    }
    int rc = pthread_create(&h->thread, NULL, host_main, h);
    if (rc != 0) {
        hvd_rdv_server_destroy(h->srv);
        st = hvd_error_set(HVD_ERR_INTERNAL,
                           "could not start the rendezvous thread: %s",
                           strerror(rc));
        goto free_host;
    }
    *out = h;
    return HVD_OK;
free_host:
    if (h->wake_fd >= 0)
        close(h->wake_fd);
    free(h);
    return st;
}

int hvd_rdv_host_port(const hvd_rdv_host *host) { return host->port; }

hvd_status hvd_rdv_host_status(const hvd_rdv_host *host) {
    hvd_status st = (hvd_status)atomic_load(&host->status);

    if (st != HVD_OK)
        return hvd_error_copy(st, host->why);
    return HVD_OK;
}

void hvd_rdv_host_stop(hvd_rdv_host *host) {
    uint64_t one = 1;

    if (host == NULL)
        return;
    atomic_store(&host->stop, 1);
    if (write(host->wake_fd, &one, sizeof(one)) < 0)
        HVD_DEBUG("rdv", "waking the rendezvous thread: %s", strerror(errno));
    pthread_join(host->thread, NULL);
    close(host->wake_fd);
    free(host);
}

/* What a client saw on the range, for its final sentence. */
typedef struct range_seen {
    int other_job;
    int not_hvd;
} range_seen;

static hvd_status not_found(const char *addr, int port, int last, int64_t start,
                            const range_seen *seen) {
    char what[160] = "";

    if (seen->other_job > 0 || seen->not_hvd > 0)
        snprintf(what, sizeof(what),
                 " (there: %d answer(s) of another hvd job, %d of a program "
                 "that is not hvd)",
                 seen->other_job, seen->not_hvd);
    return hvd_error_set(HVD_ERR_TIMEOUT,
                         "no rendezvous of this job on %s ports %d-%d after "
                         "%.0f s%s; rank 0 hosts it: is rank 0 running, and "
                         "is the port range free? (HVD_RENDEZVOUS_PORT moves "
                         "it; HVD_START_TIMEOUT_SECONDS bounds the wait)",
                         addr, port, last, (double)(hvd_now_ns() - start) / 1e9,
                         what);
}

/* Blocking I/O of a whole buffer on a non-blocking socket, bounded by
 * deadline: 0 when done, -1 when the peer closed, failed or was late. */
static int io_all(int fd, void *buf, size_t len, int sending,
                  int64_t deadline) {
    size_t off = 0;

    while (off < len) {
        ssize_t n =
            sending ? send(fd, (uint8_t *)buf + off, len - off,
                           MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(fd, (uint8_t *)buf + off, len - off, MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n == 0 ||
            (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        int64_t left = (deadline - hvd_now_ns()) / 1000000;
        if (left <= 0)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        poll(&pfd, 1, (int)left);
    }
    return 0;
}

/* Asks the server on fd for its credential; skip_out as hvd_rdv_client_try
 * (0: this job's server answered, its code in *code, its credential in
 * cred). */
static void ask_cred(int fd, int rank, const uint8_t job_id[HVD_JOB_ID_LEN],
                     int64_t deadline, char cred[HVD_HS_CRED_MAX + 1],
                     uint32_t *code, int *skip_out) {
    uint8_t req[HVD_HS_HELLO_LEN], head[HVD_HS_CRED_HEAD];
    uint32_t len;

    memset(req, 0, sizeof(req));
    hvd_put32(req, HVD_HS_MAGIC_CRED);
    hvd_put16(req + 4, HVD_HS_VERSION);
    hvd_put16(req + 6, HVD_HS_KIND_RENDEZVOUS);
    memcpy(req + 8, job_id, HVD_JOB_ID_LEN);
    hvd_put32(req + 24, (uint32_t)rank);
    *skip_out = RDV_SKIP_NOT_HVD;
    if (io_all(fd, req, sizeof(req), 1, deadline) != 0 ||
        io_all(fd, head, sizeof(head), 0, deadline) != 0 ||
        hvd_get32(head) != HVD_HS_MAGIC_CRED)
        return;
    *code = hvd_get32(head + 4);
    len = hvd_get32(head + 8);
    if (*code == HVD_HS_WRONG_JOB) {
        *skip_out = RDV_SKIP_OTHER_JOB;
        return;
    }
    if (*code == HVD_HS_BAD_VERSION || len > HVD_HS_CRED_MAX ||
        io_all(fd, cred, len, 0, deadline) != 0)
        return;
    cred[len] = '\0';
    *skip_out = 0;
}

/*
 * Under srun with munge: learns the job secret from the server at
 * addr:port, in a credential only this uid can decode, encoded by this
 * uid, for this job. HVD_OK with *skip_out set when that is no server of
 * this job; a final failure when this job's server gives none or the
 * credential fails its checks.
 */
static hvd_status fetch_secret(const char *addr, int port, int rank,
                               const uint8_t job_id[HVD_JOB_ID_LEN],
                               const hvd_rdv_munge *munge, int64_t deadline,
                               char *secret, size_t secret_cap, int *skip_out) {
    char cred[HVD_HS_CRED_MAX + 1];
    uint8_t payload[HVD_RDV_CRED_PAYLOAD];
    uint32_t code = HVD_HS_OK;
    int fd = -1;
    hvd_status st = hvd_net_connect_start(addr, port, &fd);

    *skip_out = RDV_SKIP_NOBODY;
    if (st != HVD_OK)
        return st == HVD_ERR_INVALID_ARG ? st : HVD_OK;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int64_t left = (deadline - hvd_now_ns()) / 1000000;
    if (poll(&pfd, 1, left > 0 ? (int)left : 0) > 0 &&
        hvd_net_connect_result(fd) == 0)
        ask_cred(fd, rank, job_id, deadline, cred, &code, skip_out);
    close(fd);
    if (*skip_out != 0)
        return HVD_OK;
    if (code != HVD_HS_OK)
        return hvd_error_set(HVD_ERR_AUTH,
                             "rank %d: the rendezvous of this job at %s:%d "
                             "gives no munge credential, but munge works on "
                             "this rank's node: run munged on every node "
                             "(rank 0's too), or export HVD_SECRET",
                             rank, addr, port);
    st = hvd_munge_decode(munge->socket, cred, payload, sizeof(payload));
    if (st == HVD_OK && memcmp(payload, job_id, HVD_JOB_ID_LEN) != 0)
        st = hvd_error_set(HVD_ERR_AUTH,
                           "the munge credential from %s:%d is for another "
                           "job",
                           addr, port);
    if (st != HVD_OK) {
        OPENSSL_cleanse(payload, sizeof(payload));
        hvd_error_prefix("rank %d: ", rank);
        return st;
    }
    if (secret_cap > HVD_RDV_CRED_SECRET) {
        memcpy(secret, payload + HVD_JOB_ID_LEN, HVD_RDV_CRED_SECRET);
        secret[HVD_RDV_CRED_SECRET] = '\0';
    }
    OPENSSL_cleanse(payload, sizeof(payload));
    return HVD_OK;
}

hvd_status hvd_rdv_client_connect_range(const char *addr, int port, int span,
                                        int rank, int size,
                                        const uint8_t job_id[HVD_JOB_ID_LEN],
                                        char *secret, size_t secret_cap,
                                        const hvd_rdv_munge *munge,
                                        int64_t timeout_ns, hvd_bootstrap **out,
                                        char local_addr_out[64]) {
    int64_t start = hvd_now_ns(), deadline = start + timeout_ns;
    int last = port + (span > 0 ? span : 1) - 1;
    range_seen seen = {0, 0};

    *out = NULL;
    if (last > 65535)
        last = 65535;
    /* Each cycle tries every port once; the deadline ends the cycles. */
    while (hvd_now_ns() < deadline) {
        for (int p = port; p <= last && hvd_now_ns() < deadline; p++) {
            int64_t try_deadline = hvd_now_ns() + TRY_NS;
            int skip = 0;
            hvd_status st = HVD_OK;
            if (munge != NULL && munge->on)
                st = fetch_secret(addr, p, rank, job_id, munge,
                                  try_deadline < deadline ? try_deadline
                                                          : deadline,
                                  secret, secret_cap, &skip);
            if (st == HVD_OK && skip == 0)
                st = hvd_rdv_client_try(addr, p, rank, size, job_id, secret,
                                        try_deadline < deadline ? try_deadline
                                                                : deadline,
                                        deadline, out, local_addr_out, &skip);
            if (st != HVD_OK || *out != NULL)
                return st;
            seen.other_job += skip == RDV_SKIP_OTHER_JOB;
            seen.not_hvd += skip == RDV_SKIP_NOT_HVD;
            if (skip != RDV_SKIP_NOBODY)
                HVD_DEBUG("rdv", "rank %d: %s:%d is %s; trying the next port",
                          rank, addr, p,
                          skip == RDV_SKIP_OTHER_JOB
                              ? "another job's rendezvous"
                              : "not an hvd rendezvous");
        }
        poll(NULL, 0, CYCLE_PAUSE_MS);
    }
    return not_found(addr, port, last, start, &seen);
}
