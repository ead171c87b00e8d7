/*
 * The transport interface: point-to-point messages between the ranks of a
 * job, plus optional native collectives.
 *
 * A transport knows nothing of collectives: it moves byte ranges between
 * ranks, in order per (sender, receiver) pair, and reports completions.
 * Collectives (collectives/) are written once against this table.
 *
 * Matching rule: between two ranks, on each channel, the n-th isend of A to
 * B is matched with the n-th receive of B from A. An irecv must give the
 * same length as the isend (the collectives always know exact sizes); an
 * irecv_upto, on the control channel, takes a message of any length up to
 * the one it gives (the control protocol's messages vary). A length
 * mismatch is a protocol error reported by the receiver.
 *
 * Threading: a transport instance is used by one thread at a time, except
 * wake, which any thread may call.
 */
#ifndef HVD_TRANSPORT_TRANSPORT_H
#define HVD_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"
#include "transport/base/env.h"
#include "transport/base/memtype.h"
#include "transport/bootstrap/bootstrap.h"

/*
 * Channels: independent ordered streams between each pair of ranks.
 * Messages of one channel never wait behind those of another, so a
 * control protocol can run beside the data of collectives.
 */
enum { HVD_CHANNEL_DATA = 0, HVD_CHANNEL_CONTROL = 1 };

/* The largest cap an irecv_upto may give: a transport may keep a message
 * of up to this length whole (shared memory: one control cell). */
#define HVD_UPTO_MAX 4096

/*
 * One send or receive. The memory is the caller's (no malloc per message):
 * it must stay valid and untouched until done is set. The transport sets
 * done and status; the rest is private to the transport.
 */
typedef struct hvd_req {
    int done;          /* 0 while in flight, 1 once finished (ok or not) */
    hvd_status status; /* valid once done */
    size_t got;        /* irecv_upto: the message's length, once done ok */
    /* Private to the transport. */
    int peer;
    int parts_left; /* stripes still in flight */
    size_t len;
} hvd_req;

/* One message of a batch sent with isendv. */
typedef struct hvd_sendv {
    const void *buf;
    size_t len;
} hvd_sendv;

/* What the job tells a transport at open. Borrowed for the call only. */
typedef struct hvd_transport_params {
    int rank;
    int size;
    hvd_bootstrap *bootstrap;
    uint8_t job_id[HVD_JOB_ID_LEN];
    const char *secret;                /* job secret; "" for a job of one */
    const char (*hosts)[HVD_HOST_MAX]; /* size entries, for messages */
    const int *pids;                   /* size entries, for messages */
    int gpu_device;     /* CUDA device this rank's GPU work runs on, -1: none
                           (lets a transport pick the NIC next to it) */
    int64_t timeout_ns; /* a peer may stall this long mid-operation */
    int64_t connect_timeout_ns; /* bound on connection setup */
    /* Where the transport reads its own settings (ops->settings): getenv in
     * the library, a table in tests. NULL: getenv. */
    hvd_env_get_fn env;
    void *env_ctx;
    /* The address through which the launcher reached this rank ("" when
     * it does not tell one): where a network transport listens by
     * default. */
    const char *launcher_addr;
    /* 1 when another transport takes over if this one cannot be opened:
     * a transport may then bound its setup by a shorter limit of its own
     * (HVD_TCP_SETUP_SECONDS). */
    int may_fall_back;
} hvd_transport_params;

/* What a transport can do here, filled by probe. */
typedef struct hvd_caps {
    int usable;             /* 1 if open can succeed on this machine */
    int native_collectives; /* 1 if allreduce/allgather/broadcast exist */
    int one_sided;          /* 1 if get may work (open says for sure) */
    /* Memory types isend/irecv accept (HVD_MEM_BIT of each); 0 means host
     * memory only. A transport that sets HVD_MEM_BIT(HVD_MEM_DEVICE) (RDMA
     * with GPUDirect: nvidia-peermem loaded) receives device pointers of
     * the device named in params->gpu_device and registers them itself,
     * on the data channel only (the control channel carries host memory);
     * device collectives then skip staging. What this rank could do: the
     * open instance says what every rank agreed on (ops->mem_types). */
    unsigned mem_types;
    unsigned reach;   /* HVD_REACH_* bits: between which ranks it can serve */
    int priority;     /* auto takes the usable transport of the highest */
    char reason[256]; /* why not usable, for the user */
} hvd_caps;

/* Between which ranks a transport can carry messages. */
enum {
    HVD_REACH_SAME_HOST = 1 << 0,   /* ranks on one host */
    HVD_REACH_OTHER_HOSTS = 1 << 1, /* ranks on different hosts */
};

typedef struct hvd_transport hvd_transport;

typedef struct hvd_transport_ops {
    size_t size; /* sizeof(hvd_transport_ops) of the provider: lets it grow */
    const char *name;  /* what HVD_TRANSPORT names it by: "tcp" */
    const char *title; /* what messages call it: "TCP", "shared memory" */

    /* The HVD_* variables it reads (its probe and open read them from
     * params->env with hvd_env_read_settings); the registry checks them
     * all at hvd_init, so that a malformed value fails early. */
    const hvd_setting *settings;
    size_t nsettings;
    size_t settings_size; /* of the struct the table fills */

    /* Says whether the transport can run here. Never blocks. */
    hvd_status (*probe)(const hvd_transport_params *params, hvd_caps *caps);

    /*
     * Connects to every peer (collective: every rank calls it). Blocking,
     * bounded by params->connect_timeout_ns. On failure *out is untouched.
     */
    hvd_status (*open)(const hvd_transport_params *params, hvd_transport **out);

    /*
     * Starts sending len bytes of buf to peer. Non-blocking. buf and req
     * stay the caller's and must stay valid until req->done. A return other
     * than HVD_OK means the request was not started.
     */
    hvd_status (*isend)(hvd_transport *tp, int peer, int channel,
                        const void *buf, size_t len, hvd_req *req);

    /* Starts receiving exactly len bytes from peer into buf; as isend. */
    hvd_status (*irecv)(hvd_transport *tp, int peer, int channel, void *buf,
                        size_t len, hvd_req *req);

    /*
     * Starts receiving the next message from peer on the control channel,
     * of any length up to cap bytes (at most HVD_UPTO_MAX), into buf; once
     * done, req->got says how long it was. It is matched like an irecv
     * (the sender uses isend or isendv as usual), so irecvs and
     * irecv_uptos may follow each other on one channel. A message longer
     * than cap is a protocol error reported by the receiver. Required of
     * every transport the engine runs on: its control messages go out at
     * their own length.
     */
    hvd_status (*irecv_upto)(hvd_transport *tp, int peer, int channel,
                             void *buf, size_t cap, hvd_req *req);

    /*
     * Optional (NULL when not provided; hvd_comm_isendv then sends the
     * messages one by one): starts sending n messages to peer on channel,
     * in this order, exactly as n isends would (each matched by its own
     * irecv, completing its own reqs[i]), but together, so that a stream
     * transport writes them with one system call where they fit. A return
     * other than HVD_OK means messages from the failing one on were not
     * started, as with n isends.
     */
    hvd_status (*isendv)(hvd_transport *tp, int peer, int channel,
                         const hvd_sendv *msgs, int n, hvd_req *reqs);

    /*
     * Moves data and completes requests; waits up to timeout_ms (0: do not
     * wait, -1: until something happens) for the network. A fatal error
     * (lost peer, stalled peer past the timeout, protocol error) completes
     * every request in flight with that status, makes every later call
     * return it, and is returned here with the sentence in hvd_last_error.
     */
    hvd_status (*progress)(hvd_transport *tp, int timeout_ms);

    /* Makes a progress call that waits in another thread return soon.
     * Thread-safe, never blocks; a no-op by default. */
    void (*wake)(hvd_transport *tp);

    /*
     * Orderly goodbye: tells every peer this rank is leaving and waits,
     * bounded, for theirs. Collective. No request may be in flight.
     */
    hvd_status (*shutdown)(hvd_transport *tp);

    /* Frees everything; accepts NULL. Requests still in flight are dropped. */
    void (*close)(hvd_transport *tp);

    /* Optional native collectives (blocking); unsupported by default. */
    hvd_status (*allreduce)(hvd_transport *tp, const void *sendbuf,
                            void *recvbuf, size_t count, hvd_dtype dtype,
                            hvd_op op);
    hvd_status (*allgather)(hvd_transport *tp, const void *sendbuf,
                            void *recvbuf, size_t count, hvd_dtype dtype);
    hvd_status (*broadcast)(hvd_transport *tp, void *buf, size_t count,
                            hvd_dtype dtype, int root);

    /*
     * Optional one-sided read: copies len bytes at address remote of peer's
     * memory into buf, and returns once they are in buf (blocking). The
     * peer published remote (in a message) and keeps those bytes valid and
     * unchanged until it hears, by another message, that this rank is done.
     * Unsupported by default; hvd_transport_can_get says whether an open
     * instance has it.
     */
    hvd_status (*get)(hvd_transport *tp, int peer, void *buf, uint64_t remote,
                      size_t len);

    /* 1 if get works towards peer on this open instance. Default 0. */
    int (*can_get)(hvd_transport *tp, int peer);

    /*
     * Optional hint (NULL: nothing to do): the peers are about to read
     * [buf, buf + len) of this process with get, and will likely read it
     * again at later calls (a collective's send or receive buffer). The
     * transport may prepare the memory for it, never changing its
     * contents (shm: huge pages, which process_vm_readv pins 512 times
     * less often). Never fails.
     */
    void (*expose)(hvd_transport *tp, const void *buf, size_t len);

    /*
     * The memory types (HVD_MEM_BIT of each) isend and irecv of this open
     * instance accept, the same on every rank (open agrees on it). The
     * engine uses caps.mem_types & mem_types(tp). Default 0: host memory
     * only.
     */
    unsigned (*mem_types)(hvd_transport *tp);

    /*
     * Registry hooks: what a transport does for the job outside its open
     * instances, so that no layer above transport/ names a transport. Each
     * is optional (NULL when not provided: the registry skips it) and is
     * reached through the hvd_transport_* functions below, never directly.
     */

    /*
     * Bootstraps a job started without hvdrun's rendezvous, through the
     * launcher this transport belongs to (MPI under mpirun): *out gets a
     * bootstrap whose rank and size are the launcher's, which the job then
     * takes as its own. Blocking, in hvd_init's thread. HVD_ERR_UNSUPPORTED
     * says "not this job's launcher" (the registry asks the next
     * transport); any other failure is final. On failure *out is untouched.
     */
    hvd_status (*bootstrap_open)(hvd_bootstrap **out);

    /* Frees a bootstrap bootstrap_open made; accepts NULL. Required with
     * bootstrap_open. */
    void (*bootstrap_close)(hvd_bootstrap *bs);

    /*
     * Called at every hvd_shutdown, after the job's transports are closed;
     * orderly is 1 when every rank left together (the goodbye succeeded),
     * 0 after a failure. For what outlives the instances (MPI, which hvd
     * finalizes at exit, only after an orderly end). Never blocks.
     */
    void (*at_shutdown)(int orderly);

    /*
     * Removes what the ranks of job job_id may have left on this host
     * after dying mid-setup (shared memory's /dev/shm segments). Called by
     * the launcher when a job ends, in another process than the ranks,
     * with the job secret the ranks had (params->secret): what they name
     * may be derived from it, so that the names tell other users nothing.
     * Returns how many things it removed.
     */
    int (*cleanup_job)(const uint8_t job_id[HVD_JOB_ID_LEN],
                       const char *secret);
} hvd_transport_ops;

/* Every transport instance starts with this. */
struct hvd_transport {
    const hvd_transport_ops *ops;
};

/*
 * Looks up a transport by name ("tcp", ...) in the registry. The table
 * returned has every member the provider left unset filled with a typed
 * "unsupported" stub, so callers never test for NULL; it lives for the
 * process. Returns HVD_ERR_UNSUPPORTED with a sentence for an unknown or
 * unbuilt name.
 */
hvd_status hvd_transport_lookup(const char *name,
                                const hvd_transport_ops **ops_out);

/* Comma-separated names of the transports built in, e.g. "tcp". */
const char *hvd_transport_names(void);

/* The name of the transport that serves any job on any machine ("tcp",
 * first in the registry), for messages that advise it. */
const char *hvd_transport_always(void);

/* The number of transports built in, and the i-th of them (filled as by
 * lookup), in registry order. */
size_t hvd_transport_count(void);
const hvd_transport_ops *hvd_transport_at(size_t i);

/* The built-in transport called name (case-insensitive), or NULL. Quiet:
 * sets no error. */
const hvd_transport_ops *hvd_transport_find(const char *name);

/* For a transport hvd knows but this build lacks ("verbs" without
 * libibverbs): what building it needs, for messages. NULL otherwise. */
const char *hvd_transport_needs(const char *name);

/* Reads every built-in transport's settings from get, to fail on a
 * malformed value whichever transport is used. */
hvd_status hvd_transport_check_settings(hvd_env_get_fn get, void *ctx);

/*
 * Bootstraps a job that no rendezvous was given for: asks each built-in
 * transport with a bootstrap_open entry, in registry order, until one
 * answers other than HVD_ERR_UNSUPPORTED. *bs_out gets the bootstrap (its
 * rank and size are the launcher's) and *by_out the transport that made
 * it, for hvd_transport_bootstrap_close and messages (its title: "via
 * MPI"). When none can, HVD_ERR_UNSUPPORTED with a sentence for the user
 * that names launcher (who started the process: "openmpi", "slurm"), this
 * rank and size as it said, and what a build would need to bootstrap
 * such a job. On failure the outputs are untouched.
 */
hvd_status hvd_transport_bootstrap_open(const char *launcher, int rank,
                                        int size, hvd_bootstrap **bs_out,
                                        const hvd_transport_ops **by_out);

/* Frees a bootstrap hvd_transport_bootstrap_open made (by: its *by_out);
 * accepts NULL for either. */
void hvd_transport_bootstrap_close(const hvd_transport_ops *by,
                                   hvd_bootstrap *bs);

/* Tells every built-in transport that hvd_shutdown ended (ops->at_shutdown):
 * orderly is 1 after an orderly end, 0 after a failure. */
void hvd_transport_at_shutdown(int orderly);

/* For the launcher, when job job_id (whose secret is secret) ends: removes
 * what its ranks may have left on this host (ops->cleanup_job of every
 * built-in transport), and returns how many things were removed. */
int hvd_transport_cleanup_job(const uint8_t job_id[HVD_JOB_ID_LEN],
                              const char *secret);

/* Reads ops' settings from params->env (getenv when NULL) into out, a
 * struct of ops->settings_size bytes. For providers' probe and open. */
hvd_status hvd_transport_read_settings(const hvd_transport_ops *ops,
                                       const hvd_transport_params *params,
                                       void *out);

#endif
