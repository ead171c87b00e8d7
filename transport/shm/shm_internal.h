/*
 * Private to the shared-memory transport (transport/shm/): its constants,
 * the segment layout, its structs and the functions its files share.
 * Nothing in the library outside transport/shm/ includes it (tests do, to
 * drive the parts); the transport's interface is transport/shm/shm.h.
 *
 * Calls go one way, down this list:
 *
 *   shm.c       the ops table (the registry's entry)
 *   setup.c     the segments (names, making, mapping, a dead job's
 *               leftovers: ops->cleanup_job), probe, open, goodbye
 *               (shutdown) and close
 *   progress.c  moving data: isend, irecv, progress (spin, then a futex
 *               sleep), watching the peers while waiting, wake, get
 *   fifo.c      the FIFOs: writing into a peer's, reading from this
 *               rank's, process_vm_readv
 *   fail.c      waking (futex, doorbell), naming a peer, failing for good
 *   thp.c       huge pages for the memory the peers read (expose)
 *   settings.c  the HVD_* settings table
 */
#ifndef HVD_TRANSPORT_SHM_SHM_INTERNAL_H
#define HVD_TRANSPORT_SHM_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#include "transport/base/env.h"
#include "transport/base/error.h"
#include "transport/base/grow.h"
#include "transport/base/hostload.h"
#include "transport/bootstrap/failure.h"
#include "transport/bootstrap/job_id.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

#define SHM_MAGIC 0x31306d6873647668ULL /* "hvdshm01" */
#define SHM_VERSION 5
#define LINE 64
#define NCHANNELS 2
/* Cells per FIFO and payload bytes per cell, per channel. The data
 * channel's cells carry whole pipeline chunks of small messages; the
 * control channel's carry the engine's small messages. */
static const uint32_t ncells_of[NCHANNELS] = {8, 8}; /* powers of two */
static const uint32_t cell_bytes_of[NCHANNELS] = {64 * 1024, 4096};
/* Longest sleep before peers are checked again. */
#define SLICE_MS 100
/* How often a waiting rank writes its heartbeat. */
#define HEARTBEAT_NS (100 * 1000000LL)

/*
 * Cell kinds. CELL_DATA holds a whole message. Up to CELL_SPLIT_MAX bytes,
 * its first CELL_INLINE bytes are in the header's
 * own line and the rest in the payload, so a message of up to CELL_INLINE
 * bytes moves as one cache line: the sender writes it, the receiver reads
 * it, nothing else. A longer one is all in the payload, where the copies
 * stay aligned to the line: one line saved is nothing to it, and a copy
 * split at 48 bytes is misaligned. CELL_PART is one piece of a message longer
 * than a cell (payload only); CELL_RNDV carries the address of a large message
 * for process_vm_readv.
 */
enum { CELL_DATA = 1, CELL_RNDV = 2, CELL_PART = 3 };
#define CELL_INLINE 48
#define CELL_SPLIT_MAX 1024

/* The bytes of a CELL_DATA of n bytes that are in its header line. */
static inline size_t cell_inline_of(size_t n) {
    return n > CELL_SPLIT_MAX ? 0 : n < CELL_INLINE ? n : CELL_INLINE;
}

/* A cell's header line; the payload follows. seq is written last
 * (release): seq == n + 1 says the n-th cell of the FIFO is there. */
typedef struct cell {
    _Atomic uint64_t seq;
    uint8_t kind;
    uint8_t first; /* CELL_PART: 1 on a message's first piece */
    uint16_t pad;
    uint32_t len; /* bytes copied into this cell (inline + payload) */
    union {
        uint8_t inl[CELL_INLINE]; /* CELL_DATA: the message's first bytes */
        struct {
            uint64_t msg_len; /* CELL_PART, CELL_RNDV: the whole message */
            uint64_t addr;    /* CELL_RNDV: the message in the sender's
                                 memory */
        };
    };
} cell;
_Static_assert(sizeof(cell) == LINE, "a cell header is one cache line");
_Static_assert(offsetof(cell, inl) + CELL_INLINE == LINE,
               "inline bytes fill the header line");

/* A FIFO's receiver-written counters, then its cells. */
typedef struct fifo {
    _Atomic uint64_t head;  /* cells the receiver has consumed */
    _Atomic uint64_t acked; /* CELL_RNDV messages the receiver has read */
    uint8_t pad[LINE - 16];
} fifo;
_Static_assert(sizeof(fifo) == LINE, "a FIFO header is one cache line");

/* The start of every segment. Fields one process writes and others poll
 * sit on lines of their own. */
typedef struct seg_hdr {
    uint64_t magic;
    uint32_t version;
    uint32_t nlocal;
    int32_t pid;
    uint32_t ncells[NCHANNELS];
    uint32_t cell_bytes[NCHANNELS];
    /* While 1, the owner sleeps only after a membarrier(2)
     * (hvd_shm_sleep_fence): a publisher registered for it needs no fence
     * (hvd_shm_notify). The owner sets it to 0 for good where its
     * barriers are slow. */
    _Atomic uint32_t membar;
    uint8_t pad0[LINE - 40];
    _Atomic uint32_t doorbell; /* rung by whoever gives the owner work */
    uint8_t pad1[LINE - 4];
    _Atomic uint32_t sleeping; /* the owner sleeps on doorbell */
    uint8_t pad2[LINE - 4];
    _Atomic int64_t heartbeat; /* CLOCK_MONOTONIC of the owner, waiting */
    _Atomic uint32_t bye;      /* the owner has shut down in order */
    _Atomic int32_t failed;    /* the owner's transport failed: status */
    int32_t culprit;
    char failmsg[HVD_ERROR_MAX];
} seg_hdr;

/* One message in a queue: the caller's request and its progress. */
typedef struct msg {
    hvd_req *req; /* NULL once completed early (a buffered send) */
    uint8_t *buf;
    size_t len;
    size_t off;      /* bytes copied so far */
    uint64_t ack_id; /* CELL_RNDV: acked count that completes it */
    int owned;       /* buf is a copy this transport frees */
    int upto;        /* irecv_upto: len is the most it takes */
} msg;

/* FIFO of messages, a ring that grows by doubling (never per message in
 * the steady state). */
typedef struct msgq {
    msg *v;
    size_t cap;
    size_t head;
    size_t count;
} msgq;

typedef struct speer {
    int local; /* index among this host's ranks, -1: another host */
    pid_t pid;
    int pidfd;    /* -1 where pidfd_open is missing */
    uint8_t *seg; /* its segment: this rank writes into its FIFOs */
    size_t seg_len;
    msgq sendq[NCHANNELS]; /* not yet fully written */
    msgq ackq[NCHANNELS];  /* CELL_RNDV written, not yet read */
    msgq recvq[NCHANNELS];
    uint64_t tail[NCHANNELS];      /* cells written into its FIFO */
    uint64_t head_seen[NCHANNELS]; /* its head when last read: cells it
                                      had consumed then (at most head) */
    uint64_t rndv_sent[NCHANNELS]; /* CELL_RNDV messages sent to it */
    uint64_t rx_head[NCHANNELS];   /* cells consumed from it (mine) */
    int pending;                   /* messages in flight with it */
    int64_t last_active;
} speer;

/* membarrier's cost is judged every this many barriers, and given up
 * (fail.c) where they took more than this on average. */
#define HVD_SHM_MEMBAR_JUDGE 32
#define HVD_SHM_MEMBAR_SLOW_NS (3 * 1000LL)

/* Huge pages for exposed memory (thp.c): the ranges seen lately. */
#define HVD_SHM_THP_RANGES 16
/* Collapses that had to be done again before they stop for good. */
#define HVD_SHM_THP_REDONE_MAX 3
/* Smaller buffers are left alone: at most one huge page inside. */
#define HVD_SHM_THP_MIN ((size_t)4 << 20)

typedef struct hvd_shm_thp_range {
    uintptr_t start, end; /* whole huge pages, [start, end) */
    int collapsed;        /* a collapse of it succeeded */
} hvd_shm_thp_range;

typedef struct hvd_shm_thp {
    int on;           /* HVD_SHM_HUGEPAGES, until the kernel says no */
    size_t min_bytes; /* smaller buffers are left alone */
    hvd_shm_thp_range seen[HVD_SHM_THP_RANGES];
    int next;   /* the oldest entry of seen, replaced next */
    int redone; /* collapsed ranges that had to be collapsed again */
    /* madvise(MADV_COLLAPSE): 0 or -errno; and the clock (tests set
     * both). */
    int (*collapse)(void *addr, size_t len);
    int64_t (*now)(void);
} hvd_shm_thp;

typedef struct shm {
    hvd_transport base;
    int rank;
    int size;
    int nlocal;
    int my_local;
    int cma;    /* every same-host rank can process_vm_readv every other */
    int membar; /* this process is registered for membarrier's global
                   expedited barrier: its publications may skip the fence
                   towards a peer that sleeps after one */
    int membar_failed; /* a barrier failed: sleep in short slices */
    /* What this rank's barriers cost (fail.c, hvd_shm_sleep_fence): the
     * time of the last membar_n, judged every membar_judge against
     * membar_slow_ns each (settings of tests). */
    int64_t membar_ns;
    int membar_n;
    int membar_judge;
    int64_t membar_slow_ns;
    int64_t spin_ns; /* 0: sleep at once */
    /* Whether other processes hold this host's cores (looked at only
     * where it has a core for each of its ranks: load_on). */
    hvd_hostload load;
    int load_on;
    uint8_t *seg; /* mine */
    size_t seg_len;
    char seg_name[96];
    int seg_named; /* still linked in /dev/shm */
    speer *peers;
    size_t eager_max; /* larger messages go by CELL_RNDV when cma */
    int64_t timeout_ns;
    int64_t last_check;
    int64_t last_heartbeat;
    uint32_t seen_bell;
    char (*hosts)[HVD_HOST_MAX];
    uint64_t cma_probe;     /* read by peers to test process_vm_readv */
    hvd_shm_thp thp;        /* huge pages for exposed buffers */
    hvd_tp_failure failure; /* the first failure, which wins */
} shm;

/* ------------------------------------------------------------------ */
/* Layout                                                              */

/* The segment layout and the queues are here, static inline, because
 * every file uses them, fifo.c once per cell or message. */

static inline size_t fifo_bytes(int ch) {
    return sizeof(fifo) +
           (size_t)ncells_of[ch] * (sizeof(cell) + cell_bytes_of[ch]);
}

static inline size_t segment_bytes(int nlocal) {
    size_t per_src = 0;
    for (int ch = 0; ch < NCHANNELS; ch++)
        per_src += fifo_bytes(ch);
    return sizeof(seg_hdr) + (size_t)nlocal * per_src;
}

static inline seg_hdr *hdr_of(uint8_t *seg) { return (seg_hdr *)(void *)seg; }

/* The FIFO of segment seg that rank src (local index) writes into. */
static inline fifo *fifo_of(uint8_t *seg, int src, int ch) {
    size_t per_src = 0, off;
    for (int c = 0; c < NCHANNELS; c++)
        per_src += fifo_bytes(c);
    off = sizeof(seg_hdr) + (size_t)src * per_src;
    for (int c = 0; c < ch; c++)
        off += fifo_bytes(c);
    return (fifo *)(void *)(seg + off);
}

static inline cell *cell_of(fifo *f, int ch, uint64_t n) {
    size_t i = (size_t)(n & (ncells_of[ch] - 1)); /* a power of two */
    return (cell *)(void *)((uint8_t *)(f + 1) +
                            i * (sizeof(cell) + cell_bytes_of[ch]));
}

static inline uint8_t *payload_of(cell *c) { return (uint8_t *)(c + 1); }

/* ------------------------------------------------------------------ */
/* Queues                                                              */

static inline int q_push(msgq *q, const msg *m) {
    if (q->count == q->cap) {
        msg *v = hvd_ring_grow(q->v, sizeof(*v), &q->cap, &q->head, q->count,
                               q->count + 1);
        if (v == NULL)
            return -1;
        q->v = v;
    }
    q->v[(q->head + q->count) & (q->cap - 1)] = *m;
    q->count++;
    return 0;
}

static inline msg *q_front(msgq *q) { return q->count ? &q->v[q->head] : NULL; }

static inline void q_pop(msgq *q) {
    q->head = (q->head + 1) & (q->cap - 1);
    q->count--;
}

/* The transport's settings (settings.c, docs/environment.md), read from
 * params->env at open. */
typedef struct hvd_shm_settings {
    int cma;       /* HVD_SHM_CMA: 0 never uses process_vm_readv */
    int spin_us;   /* HVD_SHM_SPIN_US: spin before sleeping on the futex */
    int hugepages; /* HVD_SHM_HUGEPAGES: 0 leaves exposed buffers alone */
} hvd_shm_settings;

#define HVD_SHM_NSETTINGS 3
extern const hvd_setting hvd_shm_settings_table[HVD_SHM_NSETTINGS];

/* ------------------------------------------------------------------ */
/* Shared between the files (each defined where its section lives)     */

/* fail.c: waking and failing. */
long hvd_shm_futex(_Atomic uint32_t *addr, int op, uint32_t val,
                   const struct timespec *ts);
void hvd_shm_ring(uint8_t *seg);
void hvd_shm_notify(uint8_t *seg, int registered);
int hvd_shm_membar_setup(void);
void hvd_shm_sleep_fence(shm *tp);
void hvd_shm_describe(const shm *tp, int peer, char *out, size_t outlen);
void hvd_shm_complete(hvd_req *req, hvd_status status);
hvd_status hvd_shm_fail_with(void *arg, hvd_status status, int culprit,
                             int origin, const char *text);
int hvd_shm_peer_exited(const speer *pe);

/* fifo.c: the FIFOs. */
int hvd_shm_push(shm *tp, int p, int ch);
int hvd_shm_pass(shm *tp);
/* Reads len bytes at remote of peer's memory into buf (process_vm_readv);
 * a failure fails the transport. */
hvd_status hvd_shm_cma_read(shm *tp, int peer, void *buf, uint64_t remote,
                            size_t len);

/* progress.c: moving data. */
hvd_status hvd_shm_check_peers(shm *tp, int64_t now);
hvd_status hvd_shm_progress(hvd_transport *t, int timeout_ms);
hvd_status hvd_shm_isend(hvd_transport *t, int peer, int channel,
                         const void *buf, size_t len, hvd_req *req);
hvd_status hvd_shm_irecv(hvd_transport *t, int peer, int channel, void *buf,
                         size_t len, hvd_req *req);
hvd_status hvd_shm_irecv_upto(hvd_transport *t, int peer, int channel,
                              void *buf, size_t cap, hvd_req *req);
void hvd_shm_wake(hvd_transport *t);
hvd_status hvd_shm_get(hvd_transport *t, int peer, void *buf, uint64_t remote,
                       size_t len);
int hvd_shm_can_get(hvd_transport *t, int peer);

/* thp.c: huge pages for exposed memory. */
void hvd_shm_thp_init(hvd_shm_thp *t, int on, size_t min_bytes);
/* [buf, buf + len) is read by the peers, now and likely again: the whole
 * huge pages inside it are collapsed into huge pages the second time it
 * comes (thp.c says why). */
void hvd_shm_thp_expose(hvd_shm_thp *t, const void *buf, size_t len);
void hvd_shm_expose(hvd_transport *t, const void *buf, size_t len);

/* setup.c. */
/* Name of the segment of rank in job job_id ("/hvd-<32 hex>-<rank>", the
 * hex a keyed hash of the job id that only holders of secret can make).
 * Returns 0, or -1 if the hash failed. */
int hvd_shm_segment_name(const char *secret,
                         const uint8_t job_id[HVD_JOB_ID_LEN], int rank,
                         char *out, size_t outlen);
/* ops->cleanup_job: removes every segment of job job_id (made with secret)
 * still in /dev/shm (a rank that died during hvd_init leaves its own);
 * returns how many. */
int hvd_shm_cleanup_job(const uint8_t job_id[HVD_JOB_ID_LEN],
                        const char *secret);
void hvd_shm_close(hvd_transport *t);
hvd_status hvd_shm_probe(const hvd_transport_params *params, hvd_caps *caps);
hvd_status hvd_shm_open(const hvd_transport_params *params,
                        hvd_transport **out);
hvd_status hvd_shm_shutdown(hvd_transport *t);

#endif
