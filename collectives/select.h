/*
 * The path selector: for each collective, peer class and size bucket, the
 * transport, algorithm and chunk size that run it.
 *
 * Peer classes: SAME_HOST is a communicator whose ranks all share a host
 * (a one-host job, or the same-host phases of hier); OTHER_HOST is a job
 * spread over hosts; CROSS is the middle phase of hier (one rank a host).
 * Size bucket b holds sizes in (2^(b-1), 2^b] bytes (bucket 0: 0 and 1).
 *
 * The table's defaults come from an alpha-beta cost model (hvd_model):
 * alpha (latency) and beta (seconds a byte) for each transport and class,
 * measured when the job starts (hvd_paths_tune), the one-sided read rate,
 * and gamma (seconds a byte of reduction). A tuning file (written by
 * hvd-tune, read through HVD_TUNING_FILE) overrides entries with measured
 * winners. Rank 0 decides and every rank gets its table, so all ranks take
 * the same path for every call.
 */
#ifndef HVD_COLLECTIVES_SELECT_H
#define HVD_COLLECTIVES_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/comm.h"

#define HVD_SEL_BUCKETS 32

typedef enum {
    HVD_COLL_ALLREDUCE,
    HVD_COLL_ALLGATHER,
    HVD_COLL_BROADCAST,
    HVD_COLL_NKINDS
} hvd_coll_kind;

typedef enum {
    HVD_CLASS_SAME_HOST,
    HVD_CLASS_OTHER_HOST,
    HVD_CLASS_CROSS,
    HVD_NCLASSES
} hvd_peer_class;

/* The transports a path may take: the job's primary (tcp or mpi, every
 * rank) and shared memory (same-host ranks). */
typedef enum { HVD_TP_NET, HVD_TP_SHM, HVD_NTPS } hvd_tp_index;

typedef struct hvd_choice {
    uint8_t tp;    /* hvd_tp_index */
    uint8_t algo;  /* hvd_algo, never AUTO */
    uint8_t tuned; /* 1: from a tuning file, not from the model */
    uint8_t pad;
    uint32_t chunk; /* bytes: pipeline unit */
} hvd_choice;

typedef struct hvd_selector {
    hvd_choice t[HVD_COLL_NKINDS][HVD_NCLASSES][HVD_SEL_BUCKETS];
} hvd_selector;

/* Cost of moving bytes over one link: alpha + bytes * beta seconds. */
typedef struct hvd_link {
    double alpha; /* < 0: this transport does not serve this class */
    double beta;
} hvd_link;

/* What the model knows of the job. Same on every rank. */
typedef struct hvd_model {
    int32_t size;
    int32_t local_size; /* ranks a host (equal on every host, else 0) */
    int32_t cross_size; /* hosts */
    int32_t native;     /* the primary has native collectives (mpi) */
    int32_t direct;     /* one-sided reads work between same-host ranks */
    int32_t hier;       /* local and cross communicators exist */
    hvd_link link[HVD_NTPS][HVD_NCLASSES];
    double get_beta;          /* one-sided read, seconds a byte */
    double gamma;             /* reduction, seconds a byte */
    uint32_t chunk[HVD_NTPS]; /* default pipeline unit of each transport */
} hvd_model;

/* Bucket of a size in bytes. */
int hvd_sel_bucket(size_t bytes);

/* Predicted seconds of algo on transport tp for bytes in class cls (p ranks
 * of that class); < 0 when the algorithm cannot run there. */
double hvd_model_cost(const hvd_model *m, hvd_coll_kind kind,
                      hvd_peer_class cls, int tp, hvd_algo algo, size_t bytes);

/* Fills the table with the model's cheapest path for every entry. */
void hvd_select_from_model(const hvd_model *m, hvd_selector *sel);

/*
 * Forces algo for every entry of kind (HVD_ALGORITHM): where it cannot run
 * (direct without shared memory, hier in a job of one host...), the entry
 * keeps the model's choice. Returns how many entries it set.
 */
int hvd_select_force(const hvd_model *m, hvd_selector *sel, hvd_coll_kind kind,
                     hvd_algo algo);

/*
 * Tuning files: a text format, one entry a line:
 *   <collective> <class> <max bytes> <transport> <algorithm> <chunk bytes>
 * e.g. "allreduce same-host 65536 shm direct 262144": sizes up to max
 * bytes, from the previous line's max up, take that path. '#' starts a
 * comment. Transport names: net (the job's primary, tcp or mpi), tcp, mpi,
 * shm.
 *
 * hvd_select_parse applies text over sel, marking entries tuned; entries
 * the text does not cover keep their values. An entry the job cannot run
 * (shm without shared memory, say) is skipped. Returns 0, or -1 with a
 * sentence in err.
 */
int hvd_select_parse(const char *text, const hvd_model *m, hvd_selector *sel,
                     char *err, size_t errlen);

/* Writes sel as tuning-file text (every entry, coalesced); returns the
 * length, as snprintf. */
size_t hvd_select_format(const hvd_selector *sel, char *out, size_t outlen);

/* Names of kinds and classes as in tuning files ("allreduce",
 * "same-host"). */
const char *hvd_coll_kind_name(hvd_coll_kind kind);
const char *hvd_peer_class_name(hvd_peer_class cls);

/*
 * The ways a job's data can travel, owned by api/hvd.c and hung on the
 * engine's data communicator (the primary transport over every rank): the
 * other communicators and the table.
 */
typedef struct hvd_paths {
    int single_host; /* every rank on one host */
    hvd_comm *shm;   /* shm over every rank (one-host jobs), or NULL */
    hvd_comm *local; /* shm over this host's ranks (several hosts), or NULL */
    hvd_comm *cross; /* primary over the ranks of this local rank, or NULL */
    const char *net_name; /* the primary's name */
    char hier_name[32];   /* "<local>+<primary>", hier's transports */
    hvd_model model;
    hvd_selector sel;
} hvd_paths;

/*
 * Measures the model's links (rank 0 with one same-host and one other-host
 * partner; a few milliseconds), or takes them from rank 0's tuning-file
 * text, and gives every rank rank 0's table. Collective over net (every
 * rank, the primary). forced: HVD_ALGORITHM, forced_bcast:
 * HVD_BCAST_ALGORITHM (AUTO: none). tuning_path:
 * HVD_TUNING_FILE or NULL.
 */
hvd_status hvd_paths_tune(hvd_paths *paths, hvd_comm *net, hvd_algo forced,
                          hvd_algo forced_bcast, const char *tuning_path);

/* Destroys the communicators of paths (not paths itself). */
void hvd_paths_clear(hvd_paths *paths);

#endif
