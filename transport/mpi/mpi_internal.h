/*
 * Private to the MPI transport (transport/mpi/): its constants, structs and
 * the functions its files share. Nothing outside transport/mpi/ includes
 * it; the registry reaches the transport through transport/mpi/mpi.h.
 * Calls go one way, down this list:
 *
 *   mpi.c          the ops table (the registry's entry)
 *   setup.c        probe, open and close
 *   collectives.c  the native collectives (allreduce, allgather,
 *                  broadcast), bounded waits that watch the peers
 *   progress.c     moving data: isend/irecv, progress, heartbeats, wake
 *   world.c        MPI for the job: initializing and finalizing it, the
 *                  bootstrap under mpirun (registry hooks)
 *   fail.c         MPI's errors as hvd's; an instance's first failure
 *   lib.c          loading libmpi at run time (lib.h: every file calls
 *                  MPI through its table, under MPI's own names)
 *
 * MPI reads no HVD_* variable of its own (mpirun's MCA parameters govern
 * it), so it has no settings.c.
 */
#ifndef HVD_TRANSPORT_MPI_MPI_INTERNAL_H
#define HVD_TRANSPORT_MPI_MPI_INTERNAL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/base/error.h"
#include "transport/bootstrap/failure.h"
#include "transport/mpi/lib.h"
#include "transport/mpi/mpi.h"
#include "transport/transport.h"

/* MPI counts are int: hvd messages are cut into parts of at most this. */
#define PART_MAX ((size_t)1 << 30)
/* Tags: the channel of a message, or a heartbeat. */
#define TAG_HEARTBEAT 7
#define TAG_ABORT 8
#define HEARTBEAT_NS (1000 * 1000000LL)
#define CHECK_NS (100 * 1000000LL)
/* Idle polling: spin this long, then sleep in steps growing to 1 ms. */
#define SPIN_NS (50 * 1000LL)
#define SLEEP_MAX_NS (1000 * 1000LL)

/* One MPI message of a request in flight. */
typedef struct entry {
    hvd_req *req;
    size_t len; /* bytes of this MPI message (upto: at most) */
    int send;
    int upto; /* irecv_upto: a shorter message is fine */
    int64_t posted;
} entry;

/* What a failing rank tells its peers: its status and its sentence. */
typedef struct abort_msg {
    int32_t status;
    char text[HVD_ERROR_MAX];
} abort_msg;

typedef struct mpi_tp {
    hvd_transport base;
    MPI_Comm comm;
    int rank;
    int size;
    int64_t timeout_ns;
    /* Parallel arrays of what is in flight (MPI_Testsome wants the
     * requests contiguous). */
    MPI_Request *mreqs;
    entry *entries;
    int *idx; /* for MPI_Testsome */
    MPI_Status *sts;
    int n;
    int cap;
    /* Heartbeats: one receive from any source, always posted. */
    MPI_Request hb_recv;
    char hb_in;
    char hb_out;
    MPI_Request *hb_sends; /* one per peer */
    /* Failures: a rank that fails tells every peer why (one message
     * each, tag TAG_ABORT), and one receive from any source is always
     * posted for theirs. */
    MPI_Request abort_recv;
    abort_msg abort_in;
    abort_msg abort_out;
    MPI_Request *abort_sends; /* one per peer */
    int64_t *last_rx;         /* per peer */
    int64_t last_hb;
    int64_t last_check;
    int wake;               /* set by any thread (atomic) */
    hvd_tp_failure failure; /* the first failure, which wins */
} mpi_tp;

/* fail.c: MPI's error err of call as status, with MPI's text. */
hvd_status hvd_mpi_error(hvd_status status, int err, const char *call);
/* The transport's fail function (transport/bootstrap/failure.h). */
hvd_status hvd_mpi_fail_with(void *arg, hvd_status status, int culprit,
                             int origin, const char *text);
/* Fails t for good, found by this rank. */
hvd_status hvd_mpi_fail(mpi_tp *t, hvd_status status, const char *text);
/* Fails t for good with MPI's error err of call. */
hvd_status hvd_mpi_fail_call(mpi_tp *t, int err, const char *call);

/* world.c: MPI for the job. */
/* 1 if MPI is initialized (by the application or by hvd). */
int hvd_mpi_initialized(void);
/* Initializes MPI unless it already is, asking for MPI_THREAD_SERIALIZED.
 * *rank_out and *size_out get MPI_COMM_WORLD's. */
hvd_status hvd_mpi_env_init(int *rank_out, int *size_out);
/* HVD_ERR_UNSUPPORTED with a sentence unless MPI gives the engine thread
 * leave to call it (SERIALIZED or MULTIPLE). */
hvd_status hvd_mpi_check_threads(void);
/* Finalizes MPI if hvd initialized it. */
void hvd_mpi_env_finalize(void);
/* ops->bootstrap_open: initializes MPI and opens a bootstrap whose
 * allgather is MPI_Allgather (in hvd_init's thread). */
hvd_status hvd_mpi_bootstrap_open(hvd_bootstrap **out);
void hvd_mpi_bootstrap_close(hvd_bootstrap *bs);
/* ops->at_shutdown: MPI is finalized at exit after an orderly end. */
void hvd_mpi_at_shutdown(int orderly);

/* progress.c: moving data. */
hvd_status hvd_mpi_isend(hvd_transport *tp, int peer, int channel,
                         const void *buf, size_t len, hvd_req *req);
hvd_status hvd_mpi_irecv(hvd_transport *tp, int peer, int channel, void *buf,
                         size_t len, hvd_req *req);
hvd_status hvd_mpi_irecv_upto(hvd_transport *tp, int peer, int channel,
                              void *buf, size_t cap, hvd_req *req);
hvd_status hvd_mpi_progress(hvd_transport *tp, int timeout_ms);
void hvd_mpi_wake(hvd_transport *tp);
/* Peers' aborts and heartbeats, this rank's heartbeats, stalled peers:
 * what a wait does at now, besides testing its own requests. */
hvd_status hvd_mpi_heartbeats(mpi_tp *t, int64_t now);
/* Sleeps ns nanoseconds (less than a second). */
void hvd_mpi_nap(int64_t ns);

/* collectives.c. */
hvd_status hvd_mpi_allreduce(hvd_transport *tp, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype,
                             hvd_op op);
hvd_status hvd_mpi_allgather(hvd_transport *tp, const void *sendbuf,
                             void *recvbuf, size_t count, hvd_dtype dtype);
hvd_status hvd_mpi_broadcast(hvd_transport *tp, void *buf, size_t count,
                             hvd_dtype dtype, int root);

/* setup.c. */
hvd_status hvd_mpi_probe(const hvd_transport_params *params, hvd_caps *caps);
hvd_status hvd_mpi_open(const hvd_transport_params *params,
                        hvd_transport **out);
void hvd_mpi_close(hvd_transport *tp);

#endif
