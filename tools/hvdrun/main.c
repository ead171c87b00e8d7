/*
 * hvdrun: starts the ranks of an hvd job and serves their rendezvous.
 *
 *     hvdrun [-np N] [-H host:slots,... | --hostfile FILE] [options]
 *            [--] program [args...]
 *
 * hvdrun makes a fresh job secret and job id, opens the rendezvous server
 * (transport/bootstrap/rendezvous.h) and starts N copies of the program, each
 * in its own process group and with HVD_RANK, HVD_SIZE, ... in its environment.
 * Then one poll() loop copies every rank's output to hvdrun's own, one
 * "[rank] line" per write(), serves the rendezvous and reaps the ranks. The
 * first rank that fails takes the job down: the others get SIGTERM, SIGKILL
 * after the grace period, and hvdrun exits with the failed rank's status.
 * The job ends when the ranks end; the rendezvous never holds it up.
 *
 * Placement (which rank runs on which host, with which local and cross
 * rank) is decided in place_ranks(). The ranks of a host that is this
 * machine are forked (launch() with exec_rank()); those of another host
 * are started by a local ssh process that runs a small sh wrapper there
 * (remote_script()). The wrapper reads the job secret from ssh's stdin,
 * so that it is on no command line, and keeps reading: when hvdrun closes
 * that pipe (teardown) or dies, the wrapper sees EOF and kills the
 * program. To hvdrun a remote rank is its ssh process, with the same
 * pipes, prefixes and exit status handling as a local rank; only stopping
 * differs (close the pipe, SIGKILL ssh after the grace period).
 *
 * With --mpi hvdrun starts nothing itself: it runs mpirun with the same
 * placement, and hvd bootstraps through MPI.
 *
 * An elastic job (--min-np, --max-np or --host-discovery-script) has
 * workers instead of fixed ranks and a loop of its own: elastic.c, which
 * tells how it works.
 *
 * The files of tools/hvdrun/, in the order a job goes through them:
 * options.c (the command line), env.c (the ranks' environment and
 * --config-file), setup.c (placement, which hosts are this machine, the
 * rendezvous server), launch.c (starting ranks, here or over ssh, with
 * strbuf.c's string builders), loop.c (the event loop), output.c (the
 * ranks' prefixed output and hvdrun's own messages), stop.c (stopping and
 * reaping the ranks), mpi.c (--mpi) and the elastic files (elastic
 * jobs: elastic_setup.c, elastic.c the loop and its policy,
 * elastic_hosts.c the hosts and the discovery script, elastic_workers.c
 * starting and stopping workers); hvdrun.h holds what they share.
 * This file holds main(), the process-wide state that the signal handler
 * and the forked children need, and the signal handlers themselves.
 */
#include "tools/hvdrun/hvdrun.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/bootstrap/job_id.h"
#include "transport/transport.h"

/* What hvdrun changed for itself, restored in each rank before exec. */
sigset_t orig_sigmask;
struct rlimit orig_nofile;
const int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

/* The self-pipe: signal handlers write the signal number into it. */
int sig_pipe[2] = {-1, -1};

/* ---- signals ---- */

static void on_signal(int sig) {
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    ssize_t ignored = write(sig_pipe[1], &byte, 1);

    (void)ignored; /* a full pipe already holds a wake-up */
    errno = saved;
}

static int install_signals(void) {
    struct sigaction sa;

    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        say("pipe2() failed: %s", strerror(errno));
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    for (size_t k = 0; k < ARRAY_LEN(handled_signals); k++)
        sigaction(handled_signals[k], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Descriptors 0-2 must be open, or a pipe could land on one of them. */
static void open_std_fds(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int null_fd = open("/dev/null", O_RDWR);
            if (null_fd >= 0 && null_fd != fd)
                close(null_fd); /* unexpected; leave fd closed */
        }
    }
}

int main(int argc, char **argv) {
    struct options opt;
    struct job job;
    int code;

    open_std_fds();
    /* A bad HVD_LOG_LEVEL would fail every rank's hvd_init: say so once,
     * before anything starts. */
    if (hvd_log_init_from_env() != HVD_OK) {
        say("%s", hvd_error_get());
        return 2;
    }
    code = parse_options(argc, argv, &opt);
    if (code >= 0)
        goto free_options;
    if (opt.verbose && hvd_log_current < HVD_LOG_INFO)
        hvd_log_current = HVD_LOG_INFO;
    if (opt.mpi) {
        code = run_mpirun(&opt);
        goto free_options;
    }

    sigprocmask(SIG_SETMASK, NULL, &orig_sigmask);
    getrlimit(RLIMIT_NOFILE, &orig_nofile);
    memset(&job, 0, sizeof(job));
    job.opt = &opt;
    job.null_fd = -1;
    job.exit_code = -1;
    code = EXIT_SETUP;
    if ((opt.elastic ? elastic_setup(&job)
                     : job_setup(&job, opt.hosts, opt.nhosts)) != 0 ||
        install_signals() != 0 || watchdog_start(&job) != 0)
        goto destroy_job;
    code = opt.elastic ? elastic_run(&job) : job_run(&job);
    watchdog_finish();
    /* A rank killed while hvd_init set up shared memory leaves its segment
     * behind (ranks unlink them as soon as all have mapped them). */
    {
        int removed = hvd_transport_cleanup_job(job.job_id, job.secret);
        /* An elastic job's generations each name theirs after their own
         * job id (transport/bootstrap/job_id.h). */
        uint32_t gens = job.el != NULL ? hvd_rdv_server_generation(job.srv) : 0;
        for (uint32_t g = 1; g <= gens; g++) {
            uint8_t id[HVD_JOB_ID_LEN];
            hvd_job_id_of_generation(job.job_id, g, id);
            removed += hvd_transport_cleanup_job(id, job.secret);
        }
        if (removed > 0)
            HVD_INFO("hvdrun",
                     "removed %d shared-memory segments a failed "
                     "rank left in /dev/shm",
                     removed);
    }

destroy_job:
    elastic_destroy(&job);
    job_destroy(&job);
    close_fd(&sig_pipe[0]);
    close_fd(&sig_pipe[1]);
free_options:
    free_options(&opt);
    return code;
}
