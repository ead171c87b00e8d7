/*
 * The engine's state and the declarations its files share (engine.h has
 * the interface the rest of hvd uses). Nothing outside api/runtime/engine*.c
 * (and the engine's unit tests) includes this. Its files, and the one way
 * their calls go (a file calls only files below it, never one above):
 *
 *   engine.c        the entry: requests, submission (any thread), waiting
 *                   and driving the engine, start and stop
 *                           -> engine_cycle.c, engine_done.c; and below
 *                              it, the init and free of the step, vote
 *                              and pset tables, hvd_eng_take (the express
 *                              request) and hvd_eng_dev_wake (a pointer)
 *   engine_cycle.c  a pass of the engine: when a step starts and when its
 *                   cycle runs, rank 0's decisions, updates to rank 0, the
 *                   express step, the engine thread's loop
 *                           -> engine_step.c, engine_run.c, engine_msg.c,
 *                              engine_vote.c, engine_pset.c, engine_done.c
 *   engine_step.c   a step: every rank's part of it to every rank, and
 *                   what they decide together (the slots every rank
 *                   offers, the carried data, the lone-slot path)
 *                           -> engine_apply.c and below
 *   engine_apply.c  applying a cycle on every rank: the erasures, the
 *                   slots every rank offered, rank 0's responses, what the
 *                   cache learns     -> engine_run.c, engine_msg.c,
 *                                       engine_vote.c, engine_pset.c
 *   engine_run.c    running a cycle's responses: fused host allreduces,
 *                   the other collectives, device tensors
 *                           -> engine_carry.c, engine_pset.c,
 *                              engine_done.c
 *   engine_carry.c  the data steps carry, of every kind: its layout and
 *                   lengths, and running it where it arrives
 *                           -> engine_done.c
 *   engine_msg.c    control messages between the ranks, and taking
 *                   submitted requests in
 *                           -> engine_vote.c, engine_done.c
 *   engine_vote.c   rank 0's vote table: which ranks have each cached
 *                   operation ready, and stalls     -> engine_pset.c
 *   engine_pset.c   process sets: every rank's table of them and their
 *                   communicators                   -> engine_done.c
 *   engine_done.c   the bottom: finishing, completing, retiring and
 *                   failing requests, the engine's failure, the lock and
 *                   condition every engine shares; calls no engine file
 */
#ifndef HVD_API_ENGINE_STATE_H
#define HVD_API_ENGINE_STATE_H

#include "api/runtime/engine.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/arena.h"
#include "api/runtime/cache.h"
#include "api/runtime/coordinator.h"
#include "api/runtime/ctrlmsg.h"
#include "api/runtime/engine.pb-c.h"
#include "api/runtime/namemap.h"
#include "api/runtime/timeline.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/grow.h"
#include "transport/base/hostload.h"
#include "transport/base/log.h"

#define NS_PER_S 1000000000LL
/* The longest an idle engine waits before looking at its timers again. */
#define IDLE_WAIT_MS 1000

/*
 * Control messages travel on the control channel as a first message sent
 * at its own length: a 16-byte header and the body, whole if it is at
 * most CTRL_INLINE bytes (the first message then at most CTRL_FIRST);
 * a longer body's first CTRL_LONG_HEAD bytes, and the rest as a second
 * message, received straight into the body's buffer. Every rank always
 * has a receive of a first message (transport.h, irecv_upto) posted from
 * every other rank, so a message of up to 4 KiB (a step of small
 * tensors, an update) is one message each way, as long as it is.
 */
#define CTRL_FIRST HVD_UPTO_MAX
#define CTRL_INLINE (CTRL_FIRST - sizeof(msg_header))
#define CTRL_LONG_HEAD 240
enum {
    MSG_UPDATE = 1, /* rank -> 0: Update, whenever its state changes */
    MSG_STEP = 2,   /* rank -> every rank: its Step, then carried data */
    MSG_STOP = 3,   /* every rank to every rank, after the last step */
    MSG_BRIEF = 4,  /* a step in the brief form (ctrlmsg.h), then data */
};

typedef struct msg_header {
    uint32_t type;
    uint32_t proto_len; /* MSG_STEP, MSG_BRIEF: bytes of the Step; data
                           follows */
    uint64_t len;
} msg_header;

_Static_assert(sizeof(msg_header) == 16, "the control header is 16 bytes");

/* Of a control message's body of len bytes: what its first message
 * holds, and what follows in a second. */
static inline size_t ctrl_head(uint64_t len) {
    return len <= CTRL_INLINE ? (size_t)len : CTRL_LONG_HEAD;
}
static inline size_t ctrl_rest(uint64_t len) {
    return (size_t)(len - ctrl_head(len));
}

/* Request states, engine-private. */
enum {
    REQ_NEW = 0, /* rank 0 has not heard of it */
    REQ_CACHED,  /* bound to cache slot `slot`: voted for, not negotiated */
    REQ_SENT,    /* the coordinator has it */
};

/* While device operations are in flight the idle engine looks at the GPU
 * (NCCL's asynchronous errors) at least this often; a host callback wakes
 * it as soon as one finishes. */
#define DEV_POLL_MS 100

/* A request whose device work is queued: done when fence seq is. */
typedef struct devwait {
    hvd_request *req;
    uint64_t seq;
} devwait;

/* A step message (a Step and the data it carries), mine or a peer's. */
typedef struct step_msg {
    uint8_t *buf; /* the body */
    size_t cap;
    Hvd__Engine__Step *msg;  /* unpacked; NULL while there is none */
    hvd_arena arena;         /* what msg unpacked into (a peer's) */
    Hvd__Engine__Step brief; /* msg, for a step in the brief form */
    Hvd__Engine__Cycle brief_cycle;
    const uint8_t *data; /* the carried tensors, in carried order */
    size_t data_len;
} step_msg;

/*
 * What arrives from one peer: a header receive is always posted, then the
 * body's. A peer is at most one step ahead (it needs this rank's part of a
 * step to finish it), so two step messages per peer are enough.
 */
typedef struct ctrl_port {
    union {
        msg_header hdr;
        uint8_t frame[CTRL_FIRST];
    } in; /* the first message's receive */
    hvd_req req;
    int in_body;        /* req is the receive of the body's rest */
    int closed;         /* STOP came: nothing more */
    uint64_t next_step; /* the number of its next step message */
    uint8_t *body;      /* an update's body */
    size_t body_cap;
    step_msg step[2]; /* by step number parity */
} ctrl_port;

/*
 * A process set, registered by every rank when the cycle that creates it
 * runs (so the table is the same everywhere at every cycle). Set 0 is the
 * job. Changed under hvd_eng_lock (other threads read it through
 * hvd_engine_pset), by the thread that runs the engine.
 */
typedef struct pset {
    int size;       /* members; 0: removed (ids are not reused) */
    int index;      /* this rank's place among them; -1: not a member */
    int *ranks;     /* the members, ascending (NULL for the job) */
    hvd_comm *comm; /* over the members; this rank's, if it is one */
} pset;

/* A response of the current cycle, pointing into the cache or into the
 * cycle's message; nothing is copied. */
typedef struct resp {
    const char *name;
    uint64_t hash; /* of name: the request is looked up by it */
    hvd_opdesc desc;
    hvd_status status;
    const char *error;
    int contributors;
    int self_joined;
    int last_joined;
    int created_set; /* a process set's creation: its id */
    int cached;
    /* Carried in every rank's step message: each rank's data, in rank
     * order (then it is reduced here, with no collective); else NULL. */
    const uint8_t *const *parts;
} resp;

/*
 * Rank 0's view of the votes: which ranks offered each cache slot in the
 * last step (for the stall inspector: the step itself runs the slots every
 * rank offers).
 */
typedef struct vote_table {
    int capacity;
    uint8_t *votes;    /* [rank * capacity + slot] */
    int *count;        /* ranks voting per slot */
    int total;         /* the sum of count: votes for slots that wait */
    double *first;     /* when the first vote came (s) */
    double *warned;    /* when the stall inspector last warned */
    uint64_t *changed; /* last cycle that ran, erased or reused it */
    uint8_t *erase;    /* invalidated by some rank: erase next cycle */
    int nerase;        /* slots marked so */
    uint8_t *stop;     /* per rank: it has called hvd_shutdown */
} vote_table;

struct hvd_engine {
    int rank;
    int size;
    hvd_transport *tp;
    hvd_comm *data;
    hvd_comm *ctrl;
    hvd_engine_config cfg;
    pthread_t thread;
    int thread_started;

    /* Shared with the submitting threads, under lock. */
    hvd_request *queue_head, *queue_tail;
    hvd_namemap inflight; /* names submitted and not finished */
    hvd_request *express; /* and the express request's, not in that map */
    int stop_requested;
    int stop_seen;     /* the engine thread has taken stop_requested in */
    int finished;      /* the thread has left its loop */
    hvd_status failed; /* HVD_OK while healthy */
    int resetting;     /* stopped for hvd_elastic_reset (atomic) */
    char failmsg[HVD_ERROR_MAX];
    hvd_status stop_status;

    /* The engine thread's own. */
    hvd_request **pending; /* submitted, not finished */
    int npending, cappending;
    hvd_namemap by_name; /* pending by name */
    hvd_cache cache;
    uint64_t cycle;  /* the last cycle (step) run */
    int paused;      /* a rank is joined: no cache path */
    int stop_told;   /* rank 0 knows this rank stops */
    uint32_t *inval; /* slots to tell rank 0 about */
    int ninval;
    ctrl_port *ports; /* one per peer */
    uint8_t *body;    /* an update being sent */
    size_t body_cap;
    /* The step in progress (engine_step.c). */
    int in_step;   /* this rank's part of step cycle + 1 is out */
    step_msg mine; /* that part (its data: in out) */
    uint8_t *out;  /* what was sent: header, Step, data (for this rank) */
    size_t out_cap;
    uint8_t **outs; /* per peer, where parts differ per destination */
    size_t *outs_cap;
    Hvd__Engine__Step mine_msg;
    uint32_t *mine_ready, *mine_carried; /* cache capacity entries each */
    hvd_request **mine_creq;             /* the requests carried */
    hvd_req *out_req; /* 2 per peer: frame and the body's rest */
    /* Finishing a step, per cache slot (capacity entries each). */
    uint32_t *run;         /* the slots every rank offers, ascending */
    int *offers;           /* ranks that offer it */
    int *offered_by;       /* the last rank counted + 1 */
    int *run_index;        /* its place in run + 1; 0: it does not run */
    int *carried_all;      /* per run entry: every rank carried its data */
    const uint8_t **parts; /* per run entry: each rank's data (size each) */
    Hvd__Engine__Cycle decision; /* rank 0: its part of the step */
    Hvd__Engine__ResponseList dec_list;
    uint32_t *dec_erase;
    resp *resps;
    size_t resps_cap;
    void *fusion;
    size_t fusion_cap;
    pset *psets; /* by id; psets[0] is the job */
    int npsets;
    size_t *a2a;       /* an alltoall's byte counts and offsets: 8 * size */
    uint64_t *a2a_msg; /* what ranks tell each other of it: 6 * size */
    hvd_timeline *timeline;
    int mark_cycles; /* CYCLE_START marks in the timeline */
    /* A timeline to switch to (hvd_engine_set_timeline), under the lock. */
    hvd_timeline *tl_next;
    int tl_next_marks;
    int tl_swap;
    int64_t stop_deadline;
    /* Rank 0. */
    hvd_coord *coord;
    vote_table vt;
    /* Counters for the debug log. */
    int n_cached, n_negotiated, n_collectives;
    /* Device tensors (api/runtime/devexec.h). */
    hvd_devexec *dev;
    devwait *devq; /* a ring, in fence order */
    size_t devq_head, devq_n, devq_cap;
    hvd_dev_tensor *dtens;
    size_t dtens_cap;
    int gpu_woken; /* under lock: a fence was reached (job of one) */

    /* Who runs the engine, under the lock. A thread in hvd_engine_wait
     * runs the passes itself (drives) while the engine thread stands
     * aside; the engine thread takes over when nobody drives. */
    pthread_cond_t turn_cond; /* the engine thread waits for its turn */
    int driving;              /* a waiting thread runs the engine */
    int wanted;               /* waiting threads that want to */
    int engine_busy;          /* the engine thread is in a pass */
    int waiters;              /* threads that may drive: keep eng alive */
    int async_queued;         /* a request nobody waits for is queued */
    uint64_t drives;          /* times a driver let go */
    uint64_t drives_seen;     /* the engine thread's: drives it saw, */
    int64_t grace_end;        /* and until when it stands aside */
    hvd_status drive_status;  /* a driver's pass failed: the job fails */
    char drive_text[HVD_ERROR_MAX];
    int drive_last; /* a driver ran the last step */
    /* Whoever runs the passes (one thread at a time): how many pollings
     * still yield from their first look (SPIN_HURRY after one that
     * outlasted its calm, one fewer after each that did not). */
    int spin_hurry;
    /* Whether other processes hold this host's cores (looked at only
     * where this host has a core for each of its ranks: load_on). */
    hvd_hostload load;
    int load_on;
};

/* engine_done.c. One lock and condition for every engine: handles
 * outlive an engine (hvd_wait after hvd_shutdown must still work). */
extern pthread_mutex_t hvd_eng_lock;
extern pthread_cond_t hvd_eng_cond;
/* The express request this thread runs the engine for, while it does
 * (hvd_engine_express_run), else NULL: hvd_eng_finish finishes it without
 * the lock. */
extern _Thread_local hvd_request *hvd_eng_express_req;
void hvd_eng_retire(hvd_engine *eng, hvd_request *req);
void hvd_eng_finish(hvd_engine *eng, hvd_request *req, hvd_status status,
                    const char *error);
void hvd_eng_complete(hvd_engine *eng, hvd_request *req, hvd_status status,
                      const char *error);
/* Runs req's completion function and frees req (outside the lock). */
void hvd_eng_call_back(hvd_request *req);
void hvd_eng_fail_all(hvd_engine *eng, hvd_status status, const char *text);
/* 1 if status says a peer is gone or failed (what an elastic job reports
 * as HVD_ERR_PEERS_CHANGED), 0 for this rank's own errors. */
int hvd_eng_peers_changed(hvd_status status);
hvd_status hvd_eng_fail(hvd_engine *eng, hvd_status status);

/* engine_msg.c */
hvd_status hvd_eng_open_ports(hvd_engine *eng);
size_t hvd_eng_frame(uint8_t *frame, uint32_t type, uint32_t proto_len,
                     const void *body, size_t len);
hvd_status hvd_eng_send_msg(hvd_engine *eng, int peer, uint32_t type,
                            const void *body, size_t len);
hvd_status hvd_eng_body_room(hvd_engine *eng, size_t len);
hvd_status hvd_eng_pump(hvd_engine *eng, double now);
int hvd_eng_port_ready(const hvd_engine *eng);
hvd_status hvd_eng_close_ports(hvd_engine *eng);
int hvd_eng_room(void **buf, size_t *cap, size_t len);
int hvd_eng_invalidate(hvd_engine *eng, int slot);
void hvd_eng_classify(hvd_engine *eng, hvd_request *req);
int hvd_eng_queued(const hvd_engine *eng);
void hvd_eng_take(hvd_engine *eng, hvd_request *req);
void hvd_eng_intake(hvd_engine *eng, int *stop);
int hvd_eng_has_news(const hvd_engine *eng, int stop);
int hvd_eng_has_offers(const hvd_engine *eng);

/* engine_run.c */
void hvd_eng_dev_wake(void *arg);
hvd_status hvd_eng_dev_reap(hvd_engine *eng);
int hvd_eng_dev_ready(hvd_engine *eng);
hvd_status hvd_eng_dev_drain(hvd_engine *eng);
void hvd_eng_dev_fail_all(hvd_engine *eng, hvd_status status, const char *text);
hvd_status hvd_eng_run_responses(hvd_engine *eng, resp *rs, size_t n);
/* Runs one response other than an allreduce as a collective (an alltoall
 * whose parts carried counts takes them from r->parts). */
hvd_status hvd_eng_run_other(hvd_engine *eng, const resp *r);

/* engine_carry.c: the data steps carry (docs/design.md, "Steps"). */
/* 1 if req's data may travel in a step message (its kind, memory, set
 * and size allow it; the step's budget is the caller's). */
int hvd_eng_carries(const hvd_engine *eng, const hvd_request *req);
/* 1 if req (an alltoall) may carry its counts alone in a step message
 * when its data does not go there. */
int hvd_eng_carries_counts(const hvd_engine *eng, const hvd_request *req);
/* 1 if req's part differs from one destination to the next (a
 * reduce-scatter, an alltoall with its data). */
int hvd_eng_part_per_peer(const hvd_request *req);
/* Bytes this rank's part of req for rank dest takes in a step message
 * (padded to 8): its counts alone for an alltoall whose counts_only is
 * set. */
size_t hvd_eng_part_bytes_to(const hvd_engine *eng, const hvd_request *req,
                             int dest);
/* The most of those over every dest: what it takes of the step's budget. */
size_t hvd_eng_part_bytes(const hvd_engine *eng, const hvd_request *req);
/* Writes that part for dest (hvd_eng_part_bytes_to bytes) at out. */
void hvd_eng_part_write(const hvd_engine *eng, const hvd_request *req, int dest,
                        uint8_t *out);
/* Bytes rank r's part of an operation d for this rank takes, read from
 * its data (avail bytes left in the message); SIZE_MAX if they do not add
 * up. */
size_t hvd_eng_part_len(const hvd_engine *eng, const hvd_opdesc *d, int r,
                        const uint8_t *data, size_t avail);
/* An operation every rank carried in its step (r->parts: each rank's
 * part, in rank order): run here, and its request (req, or NULL: the one
 * of that name) completed. */
hvd_status hvd_eng_run_carried(hvd_engine *eng, const resp *r,
                               hvd_request *req);

/* engine_vote.c */
int hvd_eng_vote_init(vote_table *vt, int size, int capacity);
void hvd_eng_vote_free(vote_table *vt);
void hvd_eng_vote_reset(vote_table *vt, int size, int slot, uint64_t cycle);
void hvd_eng_vote_clear(vote_table *vt, int size, int slot);
/* Marks slot to be erased in the next cycle. */
void hvd_eng_vote_erase(vote_table *vt, int slot);
hvd_status hvd_eng_local_update(hvd_engine *eng, int stop, double now);
hvd_status hvd_eng_apply_update(hvd_engine *eng, int rank, const uint8_t *buf,
                                size_t len, double now);
void hvd_eng_vote_offers(hvd_engine *eng, int rank, const uint32_t *ready,
                         size_t n, double now);
double hvd_eng_vote_deadline(const hvd_engine *eng);
hvd_status hvd_eng_vote_stalls(hvd_engine *eng, double now,
                               Hvd__Engine__ResponseList *list);

/* engine_step.c */
int hvd_eng_step_init(hvd_engine *eng);
void hvd_eng_step_free(hvd_engine *eng);
int hvd_eng_peer_started(const hvd_engine *eng);
hvd_status hvd_eng_step_start(hvd_engine *eng);
int hvd_eng_step_complete(hvd_engine *eng);
hvd_status hvd_eng_step_finish(hvd_engine *eng, double now, int *last);

/* engine_apply.c: runs cycle c; every rank runs every cycle, in number
 * order. */
hvd_status hvd_eng_run_cycle(hvd_engine *eng, const Hvd__Engine__Cycle *c);

/* engine_pset.c */
int hvd_eng_pset_init(hvd_engine *eng);
void hvd_eng_pset_free(hvd_engine *eng);
/* Set id, or NULL if there is none (removed, or never created). */
const pset *hvd_eng_pset(const hvd_engine *eng, int id);
/* Members of set id (0 if there is none). */
int hvd_eng_pset_size(const hvd_engine *eng, int id);
/* 1 if rank r is a member of set id (or there is no such set). */
int hvd_eng_pset_has(const hvd_engine *eng, int id, int r);
/* The communicator of d's set if this rank is a member, else NULL. */
hvd_comm *hvd_eng_pset_comm(const hvd_engine *eng, const hvd_opdesc *d);
/* Runs a process-set response every rank asked for: creates (id) or
 * removes the set, on every rank alike. */
hvd_status hvd_eng_pset_run(hvd_engine *eng, const hvd_opdesc *d, int id);

/* engine_cycle.c */
hvd_status hvd_eng_pass(hvd_engine *eng, int block, int *last);
hvd_status hvd_eng_express_step(hvd_engine *eng, hvd_request *req, int *last);
/* A thread's polling for the engine (hvd_eng_spin): all zero before its
 * first look. */
typedef struct hvd_eng_spinner {
    int64_t start;    /* its first reading of the clock */
    int64_t calm_end; /* until when it only pauses between looks */
    int yield;        /* whether it yields the core between looks now */
    int late;         /* it outlasted cfg.spin_calm_ns */
    int busy;         /* other processes hold the cores: no yield, calm only */
} hvd_eng_spinner;

/*
 * The n-th look (from 1) of a thread polling for the engine: a pause
 * between looks for the first cfg.spin_calm_ns, then the core yielded at
 * every look (from the first look where the host has fewer cores than
 * ranks, or a recent polling outlasted its calm: eng->spin_hurry). The
 * clock is read every 16 looks only, the first time to start the
 * cfg.spin_ns of polling: 0 once they have passed (no pause then: the
 * caller blocks). Where this host has a core for each of its ranks but
 * other processes hold them (eng->load, looked at on the first look), a
 * yield would hand the core to one of them for a whole time slice: the
 * polling then pauses between looks for its calm only, never yields, and
 * the caller blocks after it (its peer's message wakes it at once).
 */
int hvd_eng_spin(hvd_engine *eng, unsigned n, hvd_eng_spinner *s);
/* The pollings that yield from their first look after one that outlasted
 * its calm: where a peer shares this rank's core, each would end within
 * the calm (the yields let the peer run) and a calm one would cost the
 * whole calm, so only one in SPIN_HURRY + 1 tries it again. */
#define SPIN_HURRY 64
/* The polling s ended (what it waited for came, or it blocks now): the
 * next SPIN_HURRY yield from their first look if this one outlasted its
 * calm. */
void hvd_eng_spin_end(hvd_engine *eng, const hvd_eng_spinner *s);
void *hvd_eng_main(void *arg);

#endif
