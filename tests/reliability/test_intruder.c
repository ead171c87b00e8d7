/*
 * The honest job of run_intruder.sh: ranks that run allreduces while an
 * intruder (intruder.py) knocks on the rendezvous and on the data ports.
 *
 *     hvdrun -np N test_intruder --dir DIR
 *
 * The data ports only listen while the mesh is being built in hvd_init,
 * and the rendezvous only waits for a rank that has not joined while
 * one is late; so the last rank (the "slow" one) is made late on
 * purpose, twice, to hold those windows open for the intruder. This file
 * defines connect(): the dynamic linker binds libhvd's calls to it, and it
 * passes every call on to the C library's connect(), except that the slow
 * rank stops before
 *
 *   1. its first connection (to hvdrun's rendezvous): it writes
 *      "ADDR PORT" of the rendezvous to DIR/rdv.addr and waits for
 *      DIR/rdv.go;
 *   2. its first connection to another port (the data listener of rank
 *      0): DIR/data.addr, then waits for DIR/data.go.
 *
 * Before that, the slow rank writes the job id and secret to DIR/job,
 * because the intruder needs them to forge the recording of an honest
 * handshake that it then replays (what an eavesdropper would have), and
 * to send a well-formed hello of this job with a wrong proof. Each wait is
 * bounded (120 s).
 *
 * After hvd_init every rank runs allreduces with exact results until the
 * slow rank finds DIR/done (the intruder's last attacks are over; at most
 * 60 s): the slow rank's "go on" flag is reduced with HVD_MAX so that all
 * ranks stop together. Prints "PASS intruder rank R: ..." and exits 0, or
 * "FAIL intruder rank R: ..." and exits 1; 2 for bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WAIT_S 120
#define RUN_S 60
#define COUNT 4099

static const char *g_dir;
static int g_slow = -1; /* 1 in the slow rank, 0 elsewhere, -1 unknown */
static int g_stage;     /* 0: before the rendezvous, 1: before data, 2 */

static int file_exists(const char *name) {
    char path[4096];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    return stat(path, &st) == 0;
}

static void write_file(const char *name, const char *text) {
    char path[4096], tmp[4200];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL)
        return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* the reader never sees half a file */
}

static void wait_file(const char *name) {
    struct timespec tick = {0, 20 * 1000000L};

    for (int i = 0; i < WAIT_S * 50 && !file_exists(name); i++)
        nanosleep(&tick, NULL);
}

/* Holds the slow rank before stage 1 and 2 (see the top of the file). */
static void hold(const struct sockaddr *addr) {
    char ip[INET6_ADDRSTRLEN] = "?", text[128];
    int port = 0;
    const char *stage;

    if (g_slow == 0 || g_stage >= 2)
        return;
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)addr;
        inet_ntop(AF_INET, &in4->sin_addr, ip, sizeof(ip));
        port = ntohs(in4->sin_port);
    } else if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
        port = ntohs(in6->sin6_port);
    } else {
        return;
    }
    if (g_stage == 1) {
        const char *rdv = getenv("HVD_RENDEZVOUS_PORT");
        if (rdv != NULL && atoi(rdv) == port)
            return; /* a retry towards the rendezvous */
    }
    stage = g_stage == 0 ? "rdv" : "data";
    snprintf(text, sizeof(text), "%s %d\n", ip, port);
    char name[32];
    snprintf(name, sizeof(name), "%s.addr", stage);
    write_file(name, text);
    printf("HOLD slow rank before connecting to %s:%d (%s)\n", ip, port, stage);
    snprintf(name, sizeof(name), "%s.go", stage);
    wait_file(name);
    g_stage++;
}

/* The C library's connect(), found once. */
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

/* Exported (the build hides symbols by default), so that libhvd's calls
 * bind to it. */
__attribute__((visibility("default"))) int
connect(int fd, const struct sockaddr *addr, socklen_t len);

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real;

    if (real == NULL)
        real = (connect_fn)(uintptr_t)dlsym(RTLD_NEXT, "connect");
    if (real == NULL)
        return -1;
    if (g_dir != NULL && addr != NULL)
        hold(addr);
    return real(fd, addr, len);
}

int main(int argc, char **argv) {
    int rank = -1, size, it;
    float *send, *recv, flag[1];
    double start;
    char name[64];
    hvd_status s;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3 || strcmp(argv[1], "--dir") != 0) {
        fprintf(stderr, "usage: %s --dir DIR\n", argv[0]);
        return 2;
    }
    if (parse_int(getenv("HVD_RANK"), &rank) != 0 ||
        parse_int(getenv("HVD_SIZE"), &size) != 0 || size < 2) {
        printf("FAIL intruder: run under hvdrun with at least 2 ranks\n");
        return 1;
    }
    g_slow = rank == size - 1;
    if (g_slow) {
        char text[512];
        const char *job = getenv("HVD_JOB_ID"), *secret = getenv("HVD_SECRET");
        snprintf(text, sizeof(text), "%s %s %d\n", job ? job : "-",
                 secret ? secret : "-", rank);
        umask(077);
        g_dir = argv[2];
        write_file("job", text);
    }

    s = hvd_init();
    g_dir = NULL;
    if (s != HVD_OK) {
        printf("FAIL intruder rank %d: hvd_init: %s: %s\n", rank,
               status_name(s), hvd_last_error());
        return 1;
    }
    printf("READY rank %d pid %d\n", rank, (int)getpid());
    send = malloc(COUNT * sizeof(float));
    recv = malloc(COUNT * sizeof(float));
    if (send == NULL || recv == NULL) {
        printf("FAIL intruder rank %d: out of memory\n", rank);
        return 1;
    }
    for (int i = 0; i < COUNT; i++)
        send[i] = (float)(i % 101 + rank);

    start = now_s();
    for (it = 0;; it++) {
        snprintf(name, sizeof(name), "intruder.%d", it);
        s = hvd_allreduce(name, send, recv, COUNT, HVD_FLOAT32, HVD_SUM);
        if (s != HVD_OK) {
            printf("FAIL intruder rank %d: allreduce %d: %s: %s\n", rank, it,
                   status_name(s), hvd_last_error());
            return 1;
        }
        for (int i = 0; i < COUNT; i++) {
            float want = (float)(size * (i % 101) + size * (size - 1) / 2);
            if (recv[i] != want) {
                printf("FAIL intruder rank %d: allreduce %d element %d is %g, "
                       "expected %g\n",
                       rank, it, i, (double)recv[i], (double)want);
                return 1;
            }
        }
        /* Go on while the intruder is at work (the slow rank decides). */
        g_dir = argv[2];
        flag[0] = g_slow && !file_exists("done") && now_s() - start < RUN_S;
        g_dir = NULL;
        snprintf(name, sizeof(name), "intruder.flag.%d", it);
        s = hvd_allreduce(name, flag, flag, 1, HVD_FLOAT32, HVD_MAX);
        if (s != HVD_OK) {
            printf("FAIL intruder rank %d: flag %d: %s: %s\n", rank, it,
                   status_name(s), hvd_last_error());
            return 1;
        }
        if (flag[0] == 0)
            break;
        usleep(10000);
    }
    s = hvd_shutdown();
    if (s != HVD_OK) {
        printf("FAIL intruder rank %d: hvd_shutdown: %s: %s\n", rank,
               status_name(s), hvd_last_error());
        return 1;
    }
    printf("PASS intruder rank %d: %d allreduces, every result exact\n", rank,
           it + 1);
    free(send);
    free(recv);
    return 0;
}
