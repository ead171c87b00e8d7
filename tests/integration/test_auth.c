/*
 * A process with the wrong job secret must not join the job.
 *
 *     hvdrun -np N test_auth --intruder R
 *
 * Rank R (known from HVD_RANK, set by hvdrun) replaces HVD_SECRET with a
 * wrong one before hvd_init. It passes when hvd_init returns HVD_ERR_AUTH
 * with a message, and then exits 3, a distinctive status that makes hvdrun
 * end the job. The other ranks only call hvd_init (it cannot succeed without
 * R), print what it returned, and wait until the intruder has exited: it
 * writes its pid to a file named after the job (in HVD_TEST_SYNC_DIR, else
 * TMPDIR) once it has its verdict, and they poll (bounded) for that process
 * to be gone, so that their exit cannot change what the intruder sees nor
 * come before its status. hvdrun normally ends them sooner; if not they
 * exit 0. Exit status: intruder 3 pass, 1 fail; others 0; 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXIT_PASS 3
/* The longest an honest rank waits for the intruder to be gone. */
#define LINGER_S 10

/* The file where the intruder leaves its pid. */
static void verdict_path(char *out, size_t outlen) {
    const char *dir = getenv("HVD_TEST_SYNC_DIR"), *job = getenv("HVD_JOB_ID");

    if (dir == NULL || dir[0] == '\0')
        dir = getenv("TMPDIR");
    snprintf(out, outlen, "%s/hvd-auth-%s", dir != NULL ? dir : "/tmp",
             job != NULL ? job : "nojob");
}

/* The intruder has its verdict: its pid, written whole (a rename). */
static void say_verdict(void) {
    char path[512], tmp[520];
    FILE *f;

    verdict_path(path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL)
        return;
    fprintf(f, "%ld\n", (long)getpid());
    if (fclose(f) == 0)
        rename(tmp, path);
}

/* Waits (bounded: LINGER_S) until the intruder has said its verdict and
 * its process is gone (reaped by hvdrun, which has its status then). */
static void await_intruder_gone(void) {
    char path[512];
    struct timespec tick = {0, 20 * 1000 * 1000};
    double deadline = now_s() + LINGER_S;
    long pid = 0;

    verdict_path(path, sizeof(path));
    while (now_s() < deadline) {
        FILE *f = pid == 0 ? fopen(path, "r") : NULL;
        if (f != NULL) {
            if (fscanf(f, "%ld", &pid) != 1)
                pid = 0;
            fclose(f);
        }
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            return;
        nanosleep(&tick, NULL);
    }
}

int main(int argc, char **argv) {
    int intruder = -1, rank = -1;
    const char *text;
    hvd_status s;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3 || strcmp(argv[1], "--intruder") != 0 ||
        parse_int(argv[2], &intruder) != 0) {
        fprintf(stderr, "usage: %s --intruder RANK\n", argv[0]);
        return 2;
    }
    if (parse_int(getenv("HVD_RANK"), &rank) != 0) {
        printf("FAIL auth: HVD_RANK is not set; run under hvdrun\n");
        return 1;
    }

    if (rank == intruder) {
        if (setenv("HVD_SECRET", "wrong-secret", 1) != 0) {
            printf("FAIL auth rank %d: setenv failed\n", rank);
            return 1;
        }
        s = hvd_init();
        text = hvd_last_error();
        if (s != HVD_ERR_AUTH || text == NULL || text[0] == '\0') {
            printf("FAIL auth rank %d: hvd_init returned %s, expected "
                   "HVD_ERR_AUTH with a message: \"%s\"\n",
                   rank, status_name(s), text != NULL ? text : "(null)");
            if (s == HVD_OK)
                hvd_shutdown();
            return 1;
        }
        printf("PASS auth rank %d: %s\n", rank, text);
        say_verdict();
        return EXIT_PASS;
    }

    s = hvd_init();
    printf("rank %d: hvd_init returned %s: %s\n", rank, status_name(s),
           hvd_last_error());
    fflush(stdout);
    await_intruder_gone();
    return 0;
}
