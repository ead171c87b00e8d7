/*
 * An elastic trainer in C, run by run_elastic.sh under hvdrun's elastic
 * mode while workers are killed, added and removed.
 *
 * Its "model" is a vector x of N doubles and a step counter. Each step
 * every rank contributes x + f(step) + (rank - (size - 1) / 2) * g to a
 * sum: the last term cancels only if every rank's part is in once, and
 * the sum divided by size is x + f(step) exactly (small integers and
 * halves, so no rounding anywhere). Whatever the failures, a run that ends
 * at step S must hold x0 + f(0) + ... + f(S - 1): that is checked on every
 * rank at the end, against a fault-free computation of the same steps.
 *
 * Every --commit steps the state is committed (copied). On
 * HVD_ERR_PEERS_CHANGED the worker restores the committed copy, calls
 * hvd_elastic_reset() and takes rank 0's state (rank 0 is the oldest
 * survivor; a new worker has none). Two flags ride in the sum's tail:
 * rank 0 sees the stop file (--stop-file: the driver is done injecting
 * faults) and any rank saw hvd_elastic_hosts_updated(); both are acted on
 * at a commit, by every rank together.
 *
 * Prints "ELASTIC worker W rank R size S generation G step K" at each
 * (re)start and "PASS elastic worker W rank R size S generations G steps
 * K resets N" at the end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define N 1021
#define MAX_RESETS 1000

static double f(long step, int i) { return (double)((step * 7 + i) % 13); }

static double g(int i) { return (double)(i % 5 + 1); }

struct state {
    long step;
    double x[N];
};

static int file_exists(const char *path) {
    return path != NULL && access(path, F_OK) == 0;
}

static void pace(int us) {
    struct timespec ts = {0, (long)us * 1000};

    if (us > 0)
        nanosleep(&ts, NULL);
}

/* Rank 0's committed state to everyone. */
static hvd_status sync_state(struct state *st) {
    hvd_status s = hvd_broadcast("elastic.sync.step", &st->step,
                                 sizeof(st->step), HVD_UINT8, 0);
    if (s == HVD_OK)
        s = hvd_broadcast("elastic.sync.x", st->x, N, HVD_FLOAT64, 0);
    return s;
}

static int check_final(const struct state *st) {
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (long k = 0; k < st->step; k++)
            want += f(k, i);
        if (st->x[i] != want) {
            printf("FAIL elastic worker %s: x[%d] = %.1f after %ld steps, a "
                   "fault-free run has %.1f\n",
                   getenv("HVD_ELASTIC_WORKER"), i, st->x[i], st->step, want);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *stop_file = NULL;
    int commit_every = 10, pace_us = 1000, min_steps = 50;
    static struct state cur, committed;
    static double buf[N + 2];
    int resets = 0;
    int generations = 1;
    hvd_status st;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--stop-file") == 0)
            stop_file = argv[i + 1];
        else if (strcmp(argv[i], "--commit") == 0)
            commit_every = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--pace-us") == 0)
            pace_us = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--min-steps") == 0)
            min_steps = atoi(argv[i + 1]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!hvd_elastic_enabled()) {
        printf("FAIL elastic: HVD_ELASTIC is not set (run under hvdrun "
               "--min-np)\n");
        return 1;
    }
    st = hvd_init();
    if (st != HVD_OK) {
        printf("FAIL elastic worker %s: hvd_init: %s: %s\n",
               getenv("HVD_ELASTIC_WORKER"), status_name(st), hvd_last_error());
        return 1;
    }
    /* A worker that joins a running job takes rank 0's state. */
    for (;;) {
        st = sync_state(&cur);
        if (st == HVD_OK) {
            committed = cur;
            printf("ELASTIC worker %s rank %d size %d generation %d step "
                   "%ld\n",
                   getenv("HVD_ELASTIC_WORKER"), hvd_rank(), hvd_size(),
                   hvd_elastic_generation(), cur.step);
            break;
        }
        if (st != HVD_ERR_PEERS_CHANGED || ++resets > MAX_RESETS)
            goto failed;
        st = hvd_elastic_reset();
        if (st != HVD_OK)
            goto failed;
        generations++;
    }

    for (;;) {
        int rank = hvd_rank(), size = hvd_size();
        for (int i = 0; i < N; i++)
            buf[i] =
                cur.x[i] + f(cur.step, i) + (rank - (size - 1) / 2.0) * g(i);
        buf[N] =
            rank == 0 && file_exists(stop_file) && cur.step + 1 >= min_steps;
        buf[N + 1] = hvd_elastic_hosts_updated();
        st = hvd_allreduce("elastic.step", buf, buf, N + 2, HVD_FLOAT64,
                           HVD_SUM);
        if (st == HVD_OK) {
            for (int i = 0; i < N; i++)
                cur.x[i] = buf[i] / size;
            cur.step++;
            if (cur.step % commit_every == 0 || buf[N] > 0) {
                committed = cur;
                if (buf[N] > 0)
                    break;
                if (buf[N + 1] > 0) {
                    /* Hosts changed: every rank resets here together. */
                    st = HVD_ERR_PEERS_CHANGED;
                }
            }
            pace(pace_us);
        }
        if (st == HVD_OK)
            continue;
        if (st != HVD_ERR_PEERS_CHANGED || ++resets > MAX_RESETS)
            goto failed;
        cur = committed;
        st = hvd_elastic_reset();
        if (st != HVD_OK)
            goto failed;
        generations++;
        st = sync_state(&cur);
        if (st == HVD_OK) {
            committed = cur;
            printf("ELASTIC worker %s rank %d size %d generation %d step "
                   "%ld\n",
                   getenv("HVD_ELASTIC_WORKER"), hvd_rank(), hvd_size(),
                   hvd_elastic_generation(), cur.step);
        } else {
            cur = committed; /* the next step fails alike and resets */
        }
    }
    if (check_final(&cur) != 0) {
        hvd_shutdown();
        return 1;
    }
    printf("PASS elastic worker %s rank %d size %d generations %d steps %ld "
           "resets %d\n",
           getenv("HVD_ELASTIC_WORKER"), hvd_rank(), hvd_size(), generations,
           cur.step, resets);
    hvd_shutdown();
    return 0;
failed:
    printf("FAIL elastic worker %s: %s: %s\n", getenv("HVD_ELASTIC_WORKER"),
           status_name(st), hvd_last_error());
    hvd_shutdown();
    return 1;
}
