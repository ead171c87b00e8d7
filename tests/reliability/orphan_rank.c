/*
 * A rank of run_orphans.sh, whose launcher is killed under it.
 *
 *     orphan_rank --dir DIR [--ignore-term] [--no-hvd] [--max-seconds S]
 *                 [MARKER...]
 *
 * It joins the job (hvd_init), then writes DIR/up.<pid> holding "rank R
 * pid P ppid Q" (written aside and renamed, so the file is whole when it
 * appears) and runs small allreduces, 100 a second, writing nothing more
 * to stdout or stderr: only a signal ends it, not a write to a pipe
 * nobody reads. If an operation fails (the library noticed the launcher's
 * end), the sentence goes to DIR/err.<pid> and the rank goes on sleeping:
 * the test wants it ended by the launcher's death, not by hvd. With
 * --ignore-term it ignores SIGTERM, as some programs do. With --no-hvd it
 * only sleeps (R is then its HVD_ELASTIC_WORKER, else -1): a worker that
 * hvdrun starts while no generation can form. After S seconds
 * (default 60) it exits 3 by itself, so a failed test leaves nothing
 * running for long. Arguments it does not know (a marker) are ignored.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hvd/hvd.h>

static double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* DIR/NAME.<pid> holding text, whole when it appears. */
static int write_file(const char *dir, const char *name, const char *text) {
    char tmp[4096], path[4096];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s/.%s.%d", dir, name, (int)getpid());
    snprintf(path, sizeof(path), "%s/%s.%d", dir, name, (int)getpid());
    f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    fputs(text, f);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    double max_s = 60;
    struct timespec pace = {0, 10 * 1000000L};
    char text[1024];
    float buf[16] = {0};
    int use_hvd = 1;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--max-seconds") == 0 && i + 1 < argc)
            max_s = atof(argv[++i]);
        else if (strcmp(argv[i], "--ignore-term") == 0)
            signal(SIGTERM, SIG_IGN);
        else if (strcmp(argv[i], "--no-hvd") == 0)
            use_hvd = 0;
    }
    if (dir == NULL) {
        fprintf(stderr, "usage: orphan_rank --dir DIR [--ignore-term] "
                        "[--max-seconds S]\n");
        return 2;
    }
    double end = now_s() + max_s;
    hvd_status st = use_hvd ? hvd_init() : HVD_OK;
    if (st != HVD_OK) {
        fprintf(stderr, "orphan_rank: hvd_init: %s\n", hvd_last_error());
        return 1;
    }
    const char *worker = getenv("HVD_ELASTIC_WORKER");
    int rank = use_hvd ? hvd_rank() : worker != NULL ? atoi(worker) : -1;
    snprintf(text, sizeof(text), "rank %d pid %d ppid %d\n", rank,
             (int)getpid(), (int)getppid());
    if (write_file(dir, "up", text) != 0) {
        perror("orphan_rank: cannot write its up file");
        return 1;
    }
    while (use_hvd && st == HVD_OK && now_s() < end) {
        st = hvd_allreduce("orphan.step", buf, buf, 16, HVD_FLOAT32, HVD_SUM);
        nanosleep(&pace, NULL);
    }
    if (st != HVD_OK) {
        snprintf(text, sizeof(text), "%d %s\n", (int)st, hvd_last_error());
        write_file(dir, "err", text);
    }
    while (now_s() < end)
        nanosleep(&pace, NULL);
    return 3;
}
