/*
 * A process with the wrong job secret must not join the job.
 *
 *     hvdrun -np N test_auth --intruder R
 *
 * Rank R (known from HVD_RANK, set by hvdrun) replaces HVD_SECRET with a
 * wrong one before hvd_init. It passes when hvd_init returns HVD_ERR_AUTH
 * with a message, and then exits 3, a distinctive status that makes hvdrun
 * end the job. The other ranks only call hvd_init (it cannot succeed without
 * R), print what it returned, wait to be ended by hvdrun and exit 0 if they
 * are not. Exit status: intruder 3 pass, 1 fail; others 0; 2 bad usage.
 */
#include <hvd/hvd.h>

#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_PASS 3
/* How long an honest rank lingers after hvd_init returns, so that its exit
 * does not change what the intruder sees. hvdrun normally ends it sooner. */
#define LINGER_S 10

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
        return EXIT_PASS;
    }

    s = hvd_init();
    printf("rank %d: hvd_init returned %s: %s\n", rank, status_name(s),
           hvd_last_error());
    fflush(stdout);
    sleep(LINGER_S);
    return 0;
}
