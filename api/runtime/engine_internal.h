/*
 * The engine's own declarations, shared by its files (engine.h has the
 * interface the rest of hvd uses):
 *  engine.c       requests and their completion, submission (any
 *                 thread), start and stop;
 *  engine_msg.c   control messages between rank 0 and the others, and
 *                 taking submitted requests in;
 *  engine_run.c   running a cycle's responses: fused host allreduces,
 *                 the other collectives, device tensors;
 *  engine_vote.c  rank 0's vote table: which ranks have each cached
 *                 operation ready, and stalls;
 *  engine_cycle.c one cycle on every rank (rank 0 decides, all run), and
 *                 the engine thread's loop.
 * Nothing outside api/runtime/engine*.c includes this.
 */
#ifndef HVD_API_ENGINE_INTERNAL_H
#define HVD_API_ENGINE_INTERNAL_H

#include "api/runtime/engine.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#include "transport/base/log.h"

#define NS_PER_S 1000000000LL
/* The longest an idle engine waits before looking at its timers again. */
#define IDLE_WAIT_MS 1000
/*
 * Rank 0 holds small operations every rank has ready for at most
 * FUSION_WAIT_S while others are ready on some ranks only and votes keep
 * coming (none for FUSION_QUIET_S ends the wait), so that a burst of
 * gradients fuses instead of taking one cycle each.
 */
#define FUSION_WAIT_S 0.002
#define FUSION_QUIET_S 0.0002

/*
 * Control messages travel on the control channel as a 16-byte header and,
 * if len > 0, a body of len bytes as a second message. Rank 0 always has
 * one header receive posted from every other rank, and every other rank
 * one from rank 0.
 */
enum {
    MSG_UPDATE = 1, /* rank -> 0: Update, whenever its state changes */
    MSG_CYCLE = 2,  /* 0 -> rank: Cycle */
    MSG_STOP = 3,   /* both ways, after the last cycle */
};

typedef struct msg_header {
    uint32_t type;
    uint32_t reserved;
    uint64_t len;
} msg_header;

_Static_assert(sizeof(msg_header) == 16, "the control header is 16 bytes");

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

/* One header receive per peer. */
typedef struct ctrl_port {
    msg_header hdr;
    hvd_req req;
} ctrl_port;

/* A response of the current cycle, pointing into the cache or into the
 * cycle's message; nothing is copied. */
typedef struct resp {
    const char *name;
    hvd_opdesc desc;
    hvd_status status;
    const char *error;
    int contributors;
    int self_joined;
    int last_joined;
    int cached;
} resp;

/*
 * Rank 0's view of the votes: which ranks have a request ready for each
 * cache slot. A slot every rank votes for runs in the next cycle.
 */
typedef struct vote_table {
    int capacity;
    uint8_t *votes;     /* [rank * capacity + slot] */
    int *count;         /* ranks voting per slot */
    double *first;      /* when the first vote came (s) */
    double *warned;     /* when the stall inspector last warned */
    double small_since; /* small ready operations wait since (0: none) */
    double last_vote;   /* when a vote last changed */
    uint64_t *changed;  /* last cycle that ran, erased or reused it */
    uint8_t *erase;     /* invalidated by some rank: erase next cycle */
    uint8_t *stop;      /* per rank: it has called hvd_shutdown */
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
    int stop_requested;
    int stop_seen;     /* the engine thread has taken stop_requested in */
    int finished;      /* the thread has left its loop */
    hvd_status failed; /* HVD_OK while healthy */
    char failmsg[HVD_ERROR_MAX];
    hvd_status stop_status;

    /* The engine thread's own. */
    hvd_request **pending; /* submitted, not finished */
    int npending, cappending;
    hvd_namemap by_name; /* pending by name */
    hvd_cache cache;
    uint64_t cycle;  /* the last cycle run */
    int paused;      /* a rank is joined: no cache path */
    int stop_told;   /* rank 0 knows this rank stops */
    uint32_t *inval; /* slots to tell rank 0 about */
    int ninval;
    ctrl_port *ports; /* rank 0: one per rank; others: [0] from rank 0 */
    uint8_t *body;
    size_t body_cap;
    resp *resps;
    size_t resps_cap;
    void *fusion;
    size_t fusion_cap;
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
};

/* One lock and condition for every engine: handles outlive an engine
 * (hvd_wait after hvd_shutdown must still work). Defined in engine.c. */
extern pthread_mutex_t hvd_eng_lock;
extern pthread_cond_t hvd_eng_cond;

/* engine.c */
void hvd_eng_retire(hvd_engine *eng, hvd_request *req);
void hvd_eng_finish(hvd_engine *eng, hvd_request *req, hvd_status status,
                    const char *error);
void hvd_eng_complete(hvd_engine *eng, hvd_request *req, hvd_status status,
                      const char *error);
void hvd_eng_fail_all(hvd_engine *eng, hvd_status status, const char *text);
hvd_status hvd_eng_fail(hvd_engine *eng, hvd_status status);
void hvd_eng_swap_timeline(hvd_engine *eng);

/* engine_msg.c */
hvd_status hvd_eng_post_header(hvd_engine *eng, int peer);
hvd_status hvd_eng_send_msg(hvd_engine *eng, int peer, uint32_t type,
                            const void *body, size_t len);
hvd_status hvd_eng_body_room(hvd_engine *eng, size_t len);
hvd_status hvd_eng_take_msg(hvd_engine *eng, int peer, uint32_t *type_out,
                            size_t *len_out);
int hvd_eng_invalidate(hvd_engine *eng, int slot);
void hvd_eng_classify(hvd_engine *eng, hvd_request *req);
void hvd_eng_intake(hvd_engine *eng, int *stop);
int hvd_eng_has_news(const hvd_engine *eng, int stop);

/* engine_run.c */
void hvd_eng_dev_wake(void *arg);
hvd_status hvd_eng_dev_reap(hvd_engine *eng);
int hvd_eng_dev_ready(hvd_engine *eng);
hvd_status hvd_eng_dev_drain(hvd_engine *eng);
void hvd_eng_dev_fail_all(hvd_engine *eng, hvd_status status, const char *text);
hvd_status hvd_eng_run_responses(hvd_engine *eng, resp *rs, size_t n);

/* engine_vote.c */
int hvd_eng_vote_init(vote_table *vt, int size, int capacity);
void hvd_eng_vote_free(vote_table *vt);
void hvd_eng_vote_reset(vote_table *vt, int size, int slot, uint64_t cycle);
void hvd_eng_vote_clear(vote_table *vt, int size, int slot);
hvd_status hvd_eng_local_update(hvd_engine *eng, int stop, double now);
hvd_status hvd_eng_read_updates(hvd_engine *eng, double now);
double hvd_eng_vote_deadline(const hvd_engine *eng);
hvd_status hvd_eng_vote_stalls(hvd_engine *eng, double now,
                               Hvd__Engine__ResponseList *list);

/* engine_cycle.c */
void *hvd_eng_main(void *arg);

#endif
