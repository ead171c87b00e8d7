/*
 * The time of small operations, one at a time: what a slow or lossy link
 * costs per operation.
 *
 *     test_latency [--ops N] [--min-bytes B0] [--max-bytes B1] [--each]
 *
 * Every rank runs N (default 200) blocking allreduces (int32 sums) one
 * after another, the sizes cycling through the powers of two from B0
 * (default 4) to B1 (default 4096) bytes, and checks each result exactly.
 * One barrier before the loop puts the ranks' clocks in step: each
 * operation's time is from the call to its return on this rank.
 *
 * Rank 0 prints "LATENCY ops N median M ms p90 P ms max X ms mean A ms"
 * (and with --each one "OP i bytes b ms t" line per operation); every
 * rank prints "PASS latency rank R" or "FAIL latency rank R: ...".
 * The program asserts no time: it measures, the caller compares.
 *
 *     test_latency --echo ADDR PORT SECONDS
 *     test_latency --ping ADDR PORT N
 *
 * measure the link itself, without hvd and without TCP: --echo answers
 * every UDP datagram that reaches ADDR:PORT until SECONDS pass with none;
 * --ping sends N datagrams of 64 bytes to ADDR:PORT, one every 20 ms, each
 * waited for up to 1 s (a lost one is counted, not retried), and prints
 * "RTT sent N received R median M ms p90 P ms" (ping(8) is not needed).
 * Exit status: 0 pass, 1 fail, 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_count(const char *s, long lo, long hi, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Runs the loop; times[i] gets operation i's seconds. Returns 0, or -1
 * with a FAIL line printed. */
static int run_ops(long nops, long min_b, long max_b, int unique,
                   double *times) {
    int rank = hvd_rank(), size = hvd_size();
    size_t max_n = (size_t)max_b / sizeof(int32_t);
    int32_t *buf = malloc(max_n * sizeof(int32_t));
    if (buf == NULL) {
        printf("FAIL latency rank %d: out of memory\n", rank);
        return -1;
    }
    long bytes = min_b;
    for (long i = 0; i < nops; i++) {
        size_t n = (size_t)bytes / sizeof(int32_t);
        for (size_t k = 0; k < n; k++)
            buf[k] = (int32_t)((long)rank * 1000 + (long)k + i);
        char name[48];
        if (unique)
            snprintf(name, sizeof name, "latency.op%ld", i);
        else
            snprintf(name, sizeof name, "latency.%ldB", bytes);
        double t0 = now_s();
        hvd_status s = hvd_allreduce(name, buf, buf, n, HVD_INT32, HVD_SUM);
        times[i] = now_s() - t0;
        if (s != HVD_OK) {
            printf("FAIL latency rank %d: op %ld: %s: %s\n", rank, i,
                   status_name(s), hvd_last_error());
            free(buf);
            return -1;
        }
        /* Sum over r of r*1000 + k + i. */
        long base = 1000L * size * (size - 1) / 2;
        for (size_t k = 0; k < n; k++) {
            long want = base + (long)size * ((long)k + i);
            if (buf[k] != (int32_t)want) {
                printf("FAIL latency rank %d: op %ld element %zu: %d, want "
                       "%ld\n",
                       rank, i, k, buf[k], want);
                free(buf);
                return -1;
            }
        }
        bytes = bytes * 2 > max_b ? min_b : bytes * 2;
    }
    free(buf);
    return 0;
}

static void report(long nops, long min_b, long max_b, const double *times,
                   int each) {
    double *sorted = malloc((size_t)nops * sizeof(double));
    if (sorted == NULL)
        return;
    double sum = 0;
    long bytes = min_b;
    for (long i = 0; i < nops; i++) {
        if (each)
            printf("OP %ld bytes %ld ms %.3f\n", i, bytes, times[i] * 1e3);
        bytes = bytes * 2 > max_b ? min_b : bytes * 2;
        sorted[i] = times[i];
        sum += times[i];
    }
    qsort(sorted, (size_t)nops, sizeof(double), cmp_double);
    printf("LATENCY ops %ld median %.1f ms p90 %.1f ms max %.1f ms mean %.1f "
           "ms\n",
           nops, sorted[nops / 2] * 1e3, sorted[(nops * 9) / 10] * 1e3,
           sorted[nops - 1] * 1e3, sum / (double)nops * 1e3);
    free(sorted);
}

/* A UDP socket and the address ADDR:PORT; -1 with a message on failure. */
static int udp_socket(const char *addr, const char *port,
                      struct sockaddr_in *sa) {
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(port));
    if (inet_pton(AF_INET, addr, &sa->sin_addr) != 1) {
        fprintf(stderr, "test_latency: '%s' is not an IPv4 address\n", addr);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        perror("test_latency: socket");
    return fd;
}

/* --echo: answers datagrams until `seconds` pass without one. */
static int udp_echo(const char *addr, const char *port, long seconds) {
    struct sockaddr_in sa;
    int fd = udp_socket(addr, port, &sa);
    if (fd < 0)
        return 1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        perror("test_latency: bind");
        close(fd);
        return 1;
    }
    printf("ECHO ready\n");
    fflush(stdout);
    struct pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, (int)seconds * 1000) == 1) {
        char buf[256];
        struct sockaddr_in from;
        socklen_t len = sizeof(from);
        ssize_t n =
            recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&from, &len);
        if (n > 0)
            sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, len);
    }
    close(fd);
    return 0;
}

/* --ping: n datagrams, one at a time; prints the RTT line. */
static int udp_ping(const char *addr, const char *port, long n) {
    struct sockaddr_in sa;
    int fd = udp_socket(addr, port, &sa);
    if (fd < 0)
        return 1;
    double *rtt = malloc((size_t)n * sizeof(double));
    long got = 0;
    for (long i = 0; rtt != NULL && i < n; i++) {
        char buf[64] = {0};
        memcpy(buf, &i, sizeof(i));
        double t0 = now_s();
        sendto(fd, buf, sizeof(buf), 0, (struct sockaddr *)&sa, sizeof(sa));
        /* Wait for this datagram's answer (a late answer to an earlier
         * one is skipped), up to 1 s. */
        struct pollfd p = {fd, POLLIN, 0};
        double left;
        while ((left = t0 + 1.0 - now_s()) > 0 &&
               poll(&p, 1, (int)(left * 1000) + 1) == 1) {
            long seq = -1;
            if (recv(fd, buf, sizeof(buf), 0) >= (ssize_t)sizeof(seq))
                memcpy(&seq, buf, sizeof(seq));
            if (seq == i) {
                rtt[got++] = now_s() - t0;
                break;
            }
        }
        double pause = t0 + 0.02 - now_s();
        if (pause > 0)
            poll(NULL, 0, (int)(pause * 1000));
    }
    close(fd);
    if (rtt == NULL || got == 0) {
        printf("RTT sent %ld received 0\n", n);
        free(rtt);
        return 1;
    }
    qsort(rtt, (size_t)got, sizeof(double), cmp_double);
    printf("RTT sent %ld received %ld median %.1f ms p90 %.1f ms\n", n, got,
           rtt[got / 2] * 1e3, rtt[(got * 9) / 10] * 1e3);
    free(rtt);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--echo") == 0)
        return udp_echo(argv[2], argv[3], atol(argv[4]));
    if (argc == 5 && strcmp(argv[1], "--ping") == 0)
        return udp_ping(argv[2], argv[3], atol(argv[4]));
    long nops = 200, min_b = 4, max_b = 4096, each = 0, unique = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--each") == 0 ||
            strcmp(argv[i], "--unique") == 0) {
            *(argv[i][2] == 'e' ? &each : &unique) = 1;
            continue;
        }
        long *v = NULL;
        if (strcmp(argv[i], "--ops") == 0)
            v = &nops;
        else if (strcmp(argv[i], "--min-bytes") == 0)
            v = &min_b;
        else if (strcmp(argv[i], "--max-bytes") == 0)
            v = &max_b;
        if (v == NULL || i + 1 >= argc ||
            parse_count(argv[++i], 1, 1L << 26, v) != 0) {
            fprintf(stderr,
                    "usage: %s [--ops N] [--min-bytes B0] [--max-bytes B1] "
                    "[--each]\n",
                    argv[0]);
            return 2;
        }
    }
    if (min_b < 4 || min_b > max_b) {
        fprintf(stderr, "%s: need 4 <= min-bytes <= max-bytes\n", argv[0]);
        return 2;
    }
    hvd_status s = hvd_init();
    if (s != HVD_OK) {
        printf("FAIL latency: hvd_init: %s: %s\n", status_name(s),
               hvd_last_error());
        return 1;
    }
    int rank = hvd_rank();
    printf("READY latency rank %d\n", rank);
    fflush(stdout);
    double *times = malloc((size_t)nops * sizeof(double));
    int rc = times == NULL ? -1 : 0;
    if (rc == 0 && (s = hvd_barrier()) != HVD_OK) {
        printf("FAIL latency rank %d: hvd_barrier: %s: %s\n", rank,
               status_name(s), hvd_last_error());
        rc = -1;
    }
    if (rc == 0)
        rc = run_ops(nops, min_b, max_b, (int)unique, times);
    if (rc == 0 && rank == 0)
        report(nops, min_b, max_b, times, (int)each);
    free(times);
    s = hvd_shutdown();
    if (rc == 0 && s != HVD_OK) {
        printf("FAIL latency rank %d: hvd_shutdown: %s: %s\n", rank,
               status_name(s), hvd_last_error());
        rc = -1;
    }
    if (rc == 0)
        printf("PASS latency rank %d\n", rank);
    fflush(stdout);
    return rc == 0 ? 0 : 1;
}
