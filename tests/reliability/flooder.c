/*
 * A connection flood against a port on 127.0.0.0/8 (run_flood.sh): one
 * process opening connections as fast as it can, as a stranger would.
 *
 *     hvd_flooder ADDR PORT --seconds S [--hold N] [--keep] [--mark K FILE]
 *                 [--stop FILE] [--hello JOBID_HEX RANK]
 *
 * Each connection is made non-blocking and held open, silent, among the
 * last N (default 64); the oldest is then closed with a reset (SO_LINGER
 * 0), so that the flood leaves no TIME_WAIT behind and keeps its rate.
 * The server thus always holds a table full of strangers that sent
 * nothing. With --hello, each connection first sends a well-formed HELLO
 * of that job (32 hex digits) claiming RANK, as a process of the same
 * user that read the job's id could, and then stalls: the server answers
 * it and must keep it until its handshake deadline. With --keep, the
 * flood stops opening connections once it holds N and keeps them open
 * until it ends (a table held full, rather than churned).
 *
 * After K connections FILE is created (the test then lets its late rank
 * start); the flood ends after S seconds or once --stop FILE exists
 * (looked for every 256 connections). Prints "FLOOD n connections in t s
 * (r per s)". Exit status: 0, or 2 for bad usage or an address that is
 * not on loopback.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOLD 4096

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* The handshake's HELLO (transport/bootstrap/handshake.h, version 2):
 * magic, version, kind (rendezvous), job id, rank, socket index, nonce,
 * frame protection (0 at the rendezvous). */
#define HELLO_LEN 68
static int make_hello(const char *job_hex, long rank,
                      uint8_t hello[HELLO_LEN]) {
    memset(hello, 0, HELLO_LEN);
    if (strlen(job_hex) != 32)
        return -1;
    put32(hello, 0x48564448u);
    hello[4] = 2; /* version */
    hello[6] = 1; /* kind: rendezvous */
    for (int i = 0; i < 16; i++) {
        unsigned v;
        if (sscanf(job_hex + 2 * i, "%2x", &v) != 1)
            return -1;
        hello[8 + i] = (uint8_t)v;
    }
    put32(hello + 24, (uint32_t)rank);
    for (int i = 32; i < 64; i++)
        hello[i] = (uint8_t)(rand() & 0xff);
    return 0;
}

static void close_reset(int fd) {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};

    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
}

static int exists(const char *path) {
    struct stat st;
    return path != NULL && stat(path, &st) == 0;
}

int main(int argc, char **argv) {
    struct sockaddr_in sa;
    double seconds = 10, t0;
    long hold = 64, mark = 0;
    const char *mark_file = NULL, *stop_file = NULL;
    uint8_t hello[HELLO_LEN];
    int with_hello = 0, keep = 0;
    static int fds[MAX_HOLD];
    unsigned long n = 0, failed = 0;

    if (argc < 3) {
        fprintf(stderr,
                "usage: %s ADDR PORT --seconds S [--hold N] "
                "[--mark K FILE] [--stop FILE] [--hello JOB RANK]\n",
                argv[0]);
        return 2;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(argv[2]));
    /* Loopback only: the tests never reach beyond this host. */
    if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1 ||
        (ntohl(sa.sin_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, "flooder: %s is not an IPv4 address on 127.0.0.0/8\n",
                argv[1]);
        return 2;
    }
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc) {
            hold = atol(argv[++i]);
        } else if (strcmp(argv[i], "--keep") == 0) {
            keep = 1;
        } else if (strcmp(argv[i], "--mark") == 0 && i + 2 < argc) {
            mark = atol(argv[++i]);
            mark_file = argv[++i];
        } else if (strcmp(argv[i], "--stop") == 0 && i + 1 < argc) {
            stop_file = argv[++i];
        } else if (strcmp(argv[i], "--hello") == 0 && i + 2 < argc) {
            if (make_hello(argv[i + 1], atol(argv[i + 2]), hello) != 0) {
                fprintf(stderr, "flooder: bad job id %s\n", argv[i + 1]);
                return 2;
            }
            with_hello = 1;
            i += 2;
        } else {
            fprintf(stderr, "flooder: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    if (hold < 1 || hold > MAX_HOLD || seconds <= 0 || seconds > 600) {
        fprintf(stderr, "flooder: --hold 1..%d, --seconds 0..600\n", MAX_HOLD);
        return 2;
    }
    for (long i = 0; i < hold; i++)
        fds[i] = -1;
    t0 = now_s();
    for (;;) {
        if ((n & 255) == 0 && (now_s() - t0 > seconds || exists(stop_file)))
            break;
        if (keep && n >= (unsigned long)hold) {
            /* Held full: only the end is waited for (20 ms looks). */
            struct timespec tick = {0, 20 * 1000000L};
            nanosleep(&tick, NULL);
            if (now_s() - t0 > seconds || exists(stop_file))
                break;
            continue;
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            failed++;
            n++;
            continue;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 &&
            errno != EINPROGRESS) {
            close(fd);
            failed++;
            n++;
            continue;
        }
        if (with_hello) {
            /* The HELLO goes once the connection is made (bounded wait). */
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 200) == 1) {
                ssize_t w = send(fd, hello, sizeof(hello), MSG_NOSIGNAL);
                (void)w;
            }
        }
        long slot = (long)(n % (unsigned long)hold);
        if (fds[slot] >= 0)
            close_reset(fds[slot]);
        fds[slot] = fd;
        n++;
        if (mark_file != NULL && n == (unsigned long)mark) {
            int m = open(mark_file, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
            if (m >= 0)
                close(m);
        }
    }
    double t = now_s() - t0;
    for (long i = 0; i < hold; i++)
        if (fds[i] >= 0)
            close_reset(fds[i]);
    printf("FLOOD %lu connections in %.1f s (%.0f per s, %lu failed)\n", n, t,
           (double)n / t, failed);
    return 0;
}
