#include "transport/shm/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"
#include "transport/failure.h"

#define SHM_MAGIC 0x31306d6873647668ULL /* "hvdshm01" */
#define SHM_VERSION 1
#define LINE 64
#define NCHANNELS 2
/* Cells per FIFO and payload bytes per cell, per channel. The data
 * channel's cells carry whole pipeline chunks of small messages; the
 * control channel's carry the engine's small messages. */
static const uint32_t ncells_of[NCHANNELS] = {8, 8};
static const uint32_t cell_bytes_of[NCHANNELS] = {64 * 1024, 4096};
/* How long a waiting rank spins before it sleeps on its futex, by default
 * (HVD_SHM_SPIN_US). Long enough for the peer's reply to come while this
 * rank still spins once both are running; a futex wake-up alone costs
 * about 10 us, and far more on a loaded host. */
#define SPIN_NS_DEFAULT (200 * 1000LL)
/* Longest sleep before peers are checked again. */
#define SLICE_MS 100
/* How often a waiting rank writes its heartbeat. */
#define HEARTBEAT_NS (100 * 1000000LL)

enum { CELL_DATA = 1, CELL_RNDV = 2 };

/* A cell's header; its payload follows. seq is written last (release):
 * seq == n + 1 says the n-th cell of the FIFO is there. */
typedef struct cell {
    _Atomic uint64_t seq;
    uint64_t len;     /* payload bytes in this cell */
    uint64_t msg_len; /* the whole message */
    uint64_t addr;    /* CELL_RNDV: the message in the sender's memory */
    uint32_t kind;
    uint32_t first; /* 1 on a message's first cell */
    uint8_t pad[LINE - 40];
} cell;
_Static_assert(sizeof(cell) == LINE, "a cell header is one cache line");

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
    uint8_t pad0[LINE - 36];
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
    uint64_t rndv_sent[NCHANNELS]; /* CELL_RNDV messages sent to it */
    uint64_t rx_head[NCHANNELS];   /* cells consumed from it (mine) */
    int pending;                   /* messages in flight with it */
    int64_t last_active;
} speer;

typedef struct shm {
    hvd_transport base;
    int rank;
    int size;
    int nlocal;
    int my_local;
    int cma;         /* every same-host rank can process_vm_readv every other */
    int64_t spin_ns; /* 0: sleep at once */
    uint8_t *seg;    /* mine */
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
    hvd_tp_failure failure; /* the first failure, which wins */
} shm;

/* ------------------------------------------------------------------ */
/* Layout                                                              */

static size_t fifo_bytes(int ch) {
    return sizeof(fifo) +
           (size_t)ncells_of[ch] * (sizeof(cell) + cell_bytes_of[ch]);
}

static size_t segment_bytes(int nlocal) {
    size_t per_src = 0;
    for (int ch = 0; ch < NCHANNELS; ch++)
        per_src += fifo_bytes(ch);
    return sizeof(seg_hdr) + (size_t)nlocal * per_src;
}

static seg_hdr *hdr_of(uint8_t *seg) { return (seg_hdr *)(void *)seg; }

/* The FIFO of segment seg that rank src (local index) writes into. */
static fifo *fifo_of(uint8_t *seg, int src, int ch) {
    size_t per_src = 0, off;
    for (int c = 0; c < NCHANNELS; c++)
        per_src += fifo_bytes(c);
    off = sizeof(seg_hdr) + (size_t)src * per_src;
    for (int c = 0; c < ch; c++)
        off += fifo_bytes(c);
    return (fifo *)(void *)(seg + off);
}

static cell *cell_of(fifo *f, int ch, uint64_t n) {
    size_t i = (size_t)(n % ncells_of[ch]);
    return (cell *)(void *)((uint8_t *)(f + 1) +
                            i * (sizeof(cell) + cell_bytes_of[ch]));
}

static uint8_t *payload_of(cell *c) { return (uint8_t *)(c + 1); }

void hvd_shm_segment_name(const uint8_t job_id[HVD_JOB_ID_LEN], int rank,
                          char *out, size_t outlen) {
    char hex[2 * HVD_JOB_ID_LEN + 1];
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", job_id[i]);
    snprintf(out, outlen, "/hvd-%s-%d", hex, rank);
}

int hvd_shm_cleanup_job(const uint8_t job_id[HVD_JOB_ID_LEN]) {
    char prefix[96];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int removed = 0;
    size_t plen;

    if (d == NULL)
        return 0;
    hvd_shm_segment_name(job_id, 0, prefix, sizeof(prefix));
    plen = strlen(prefix) - 1; /* "/hvd-<hex>-" */
    while ((e = readdir(d)) != NULL) {
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (strncmp(name, prefix, plen) == 0 && shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

/* ------------------------------------------------------------------ */
/* Queues                                                              */

static int q_push(msgq *q, const msg *m) {
    if (q->count == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 16;
        msg *v = malloc(cap * sizeof(*v));
        if (v == NULL)
            return -1;
        for (size_t i = 0; i < q->count; i++)
            v[i] = q->v[(q->head + i) % q->cap];
        free(q->v);
        q->v = v;
        q->cap = cap;
        q->head = 0;
    }
    q->v[(q->head + q->count) % q->cap] = *m;
    q->count++;
    return 0;
}

static msg *q_front(msgq *q) { return q->count ? &q->v[q->head] : NULL; }

static void q_pop(msgq *q) {
    q->head = (q->head + 1) % q->cap;
    q->count--;
}

/* ------------------------------------------------------------------ */
/* Waking and failing                                                  */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val,
                  const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)(void *)addr, op, val, ts, NULL, 0);
}

/* Tells the owner of seg that there is something for it. */
static void ring(uint8_t *seg) {
    seg_hdr *h = hdr_of(seg);
    atomic_fetch_add(&h->doorbell, 1);
    if (atomic_load(&h->sleeping))
        futex(&h->doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

static void describe(const shm *tp, int peer, char *out, size_t outlen) {
    if (peer < 0 || peer >= tp->size)
        snprintf(out, outlen, "an unknown peer");
    else if (tp->hosts != NULL)
        snprintf(out, outlen, "rank %d (pid %d on %s)", peer,
                 (int)tp->peers[peer].pid, tp->hosts[peer]);
    else
        snprintf(out, outlen, "rank %d", peer);
}

static void complete(hvd_req *req, hvd_status status) {
    req->status = status;
    req->done = 1;
}

/*
 * Makes the transport fail for good: every request in flight completes
 * with status, every later call returns it, and the same-host peers read
 * why in this rank's segment.
 */
static hvd_status fail_with(void *arg, hvd_status status, int culprit,
                            int origin, const char *text) {
    shm *tp = arg;

    /* A peer's sentence read from its segment is its own: no relay. */
    (void)origin;
    if (!hvd_tp_failure_set(&tp->failure, "shm", status, tp->rank, tp->rank,
                            text))
        return hvd_tp_failure_error(&tp->failure);
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        for (int ch = 0; ch < NCHANNELS; ch++) {
            msgq *qs[3] = {&pe->sendq[ch], &pe->ackq[ch], &pe->recvq[ch]};
            for (int k = 0; k < 3; k++) {
                for (size_t i = 0; i < qs[k]->count; i++) {
                    msg *m = &qs[k]->v[(qs[k]->head + i) % qs[k]->cap];
                    if (m->req != NULL)
                        complete(m->req, status);
                    if (m->owned)
                        free(m->buf);
                }
                qs[k]->count = 0;
            }
        }
        pe->pending = 0;
    }
    if (tp->seg != NULL) {
        seg_hdr *h = hdr_of(tp->seg);
        snprintf(h->failmsg, sizeof(h->failmsg), "%s", text);
        h->culprit = culprit;
        atomic_store(&h->failed, (int32_t)status);
        for (int p = 0; p < tp->size; p++)
            if (tp->peers[p].seg != NULL)
                ring(tp->peers[p].seg);
    }
    return hvd_tp_failure_error(&tp->failure);
}

static int pass(shm *tp);

/* 1 if all that is in flight with pe is control messages to it. */
static int only_control_sends(const speer *pe) {
    for (int ch = 0; ch < NCHANNELS; ch++)
        if (pe->recvq[ch].count > 0 || pe->ackq[ch].count > 0 ||
            (ch != HVD_CHANNEL_CONTROL && pe->sendq[ch].count > 0))
            return 0;
    return 1;
}

/* Drops the sends queued to pe on ch (its peer left in order). */
static void drop_sends(speer *pe, int ch) {
    msgq *q = &pe->sendq[ch];
    while (q->count > 0) {
        msg *m = q_front(q);
        if (m->req != NULL)
            complete(m->req, HVD_OK);
        if (m->owned)
            free(m->buf);
        pe->pending--;
        q_pop(q);
    }
}

static int peer_exited(const speer *pe) {
    if (pe->pidfd >= 0) {
        struct pollfd pfd = {.fd = pe->pidfd, .events = POLLIN};
        return poll(&pfd, 1, 0) > 0;
    }
    return kill(pe->pid, 0) != 0 && errno == ESRCH;
}

/*
 * The slow checks, at most every SLICE_MS while waiting: a peer that
 * failed, died, or has stalled past the timeout while this rank waits on
 * it.
 */
static hvd_status check_peers(shm *tp, int64_t now) {
    if (now - tp->last_check < SLICE_MS * 1000000LL)
        return HVD_OK;
    tp->last_check = now;
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        char who[160];
        if (pe->seg == NULL)
            continue;
        seg_hdr *h = hdr_of(pe->seg);
        int32_t st = atomic_load(&h->failed);
        if (st != HVD_OK) {
            char text[HVD_ERROR_MAX];
            memcpy(text, h->failmsg, sizeof(text));
            text[sizeof(text) - 1] = '\0';
            return fail_with(tp, (hvd_status)st, h->culprit, tp->rank, text);
        }
        describe(tp, p, who, sizeof(who));
        if ((!atomic_load(&h->bye) || pe->pending > 0) && peer_exited(pe)) {
            /* What it wrote before it went is still in this rank's FIFOs:
             * take it first, as a socket is read to its end. */
            pass(tp);
            if (tp->failure.status != HVD_OK)
                return hvd_tp_failure_error(&tp->failure);
            if (atomic_load(&h->bye) && only_control_sends(pe)) {
                /* It left in order: control messages it will never read
                 * (the engine's last ones) are dropped. */
                drop_sends(pe, HVD_CHANNEL_CONTROL);
                continue;
            }
        }
        if ((!atomic_load(&h->bye) || pe->pending > 0) && peer_exited(pe))
            return hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, p,
                                "%s exited or was killed while rank %d %s (its "
                                "process is gone)",
                                who, tp->rank,
                                pe->pending > 0 ? "waited on it" : "still ran");
        if (pe->pending > 0) {
            int64_t last = atomic_load(&h->heartbeat);
            if (last < pe->last_active)
                last = pe->last_active;
            if (now - last > tp->timeout_ns)
                return hvd_tp_fail_stalled(fail_with, tp, tp->rank, p, who,
                                           tp->timeout_ns);
        }
    }
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* Moving data                                                         */

/* Reads len bytes at remote of peer's memory into buf. */
static hvd_status cma_read(shm *tp, int peer, void *buf, uint64_t remote,
                           size_t len) {
    size_t done = 0;

    while (done < len) {
        struct iovec l = {(uint8_t *)buf + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(remote + done), len - done};
        ssize_t n = process_vm_readv(tp->peers[peer].pid, &l, 1, &r, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        int err = n < 0 ? errno : 0;
        char who[160];
        describe(tp, peer, who, sizeof(who));
        /* A peer that failed abandons the buffers it offered (and frees
         * them at hvd_shutdown): what it published is the cause, not
         * the read that found its memory gone. Found by the dead-rank
         * test: rank 3 was killed, rank 1 saw it and shut down, and rank
         * 0, reading rank 1's fusion buffer, reported EFAULT. */
        seg_hdr *h =
            tp->peers[peer].seg != NULL ? hdr_of(tp->peers[peer].seg) : NULL;
        int32_t pst = h != NULL ? atomic_load(&h->failed) : HVD_OK;
        if (pst != HVD_OK) {
            char text[HVD_ERROR_MAX];
            memcpy(text, h->failmsg, sizeof(text));
            text[sizeof(text) - 1] = '\0';
            return fail_with(tp, (hvd_status)pst, h->culprit, tp->rank, text);
        }
        if (err == ESRCH || peer_exited(&tp->peers[peer]))
            return hvd_tp_failf(
                fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, peer,
                "%s exited or was killed while rank %d read from it", who,
                tp->rank);
        errno = err;
        return hvd_tp_failf(
            fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, peer,
            "process_vm_readv(%s, %zu bytes at 0x%llx) failed: %s", who,
            len - done, (unsigned long long)(remote + done),
            n < 0 ? strerror(errno) : "no bytes read");
    }
    return HVD_OK;
}

/* A send has fully left: its request completes (unless it did when it was
 * buffered), its copy is freed. */
static void retire(speer *pe, msg *m) {
    if (m->req != NULL)
        complete(m->req, HVD_OK);
    if (m->owned)
        free(m->buf);
    pe->pending--;
}

/* Writes what fits of the messages queued for peer p on ch; retires the
 * CELL_RNDV ones p has read. Returns 1 if anything moved. */
static int push(shm *tp, int p, int ch) {
    speer *pe = &tp->peers[p];
    fifo *f = fifo_of(pe->seg, tp->my_local, ch);
    uint32_t cap = ncells_of[ch], cbytes = cell_bytes_of[ch];
    int wrote = 0, moved = 0;
    msg *m;

    while ((m = q_front(&pe->sendq[ch])) != NULL &&
           pe->tail[ch] - atomic_load_explicit(&f->head, memory_order_acquire) <
               cap) {
        cell *c = cell_of(f, ch, pe->tail[ch]);
        c->msg_len = m->len;
        c->first = m->off == 0;
        if (m->off == 0 && m->len > tp->eager_max && tp->cma) {
            c->kind = CELL_RNDV;
            c->addr = (uint64_t)(uintptr_t)m->buf;
            c->len = 0;
            m->ack_id = ++pe->rndv_sent[ch];
            atomic_store_explicit(&c->seq, ++pe->tail[ch],
                                  memory_order_release);
            if (q_push(&pe->ackq[ch], m) != 0) {
                hvd_tp_failf(fail_with, tp, tp->rank, HVD_ERR_NO_MEMORY, -1,
                             "out of memory");
                return 1;
            }
            q_pop(&pe->sendq[ch]);
        } else {
            size_t n = m->len - m->off < cbytes ? m->len - m->off : cbytes;
            c->kind = CELL_DATA;
            c->len = n;
            if (n > 0)
                memcpy(payload_of(c), m->buf + m->off, n);
            m->off += n;
            atomic_store_explicit(&c->seq, ++pe->tail[ch],
                                  memory_order_release);
            if (m->off == m->len) {
                retire(pe, m);
                q_pop(&pe->sendq[ch]);
            }
        }
        wrote = 1;
    }
    if (pe->ackq[ch].count > 0) {
        uint64_t acked = atomic_load_explicit(&f->acked, memory_order_acquire);
        while ((m = q_front(&pe->ackq[ch])) != NULL && m->ack_id <= acked) {
            retire(pe, m);
            q_pop(&pe->ackq[ch]);
            moved = 1;
        }
    }
    if (wrote) {
        ring(pe->seg);
        pe->last_active = hvd_now_ns();
    }
    return wrote || moved;
}

/* Takes what has arrived from peer p on ch into the posted receives.
 * Returns 1 if anything moved. */
static int pull(shm *tp, int p, int ch) {
    speer *pe = &tp->peers[p];
    fifo *f = fifo_of(tp->seg, pe->local, ch);
    int moved = 0;
    msg *m;

    while ((m = q_front(&pe->recvq[ch])) != NULL) {
        cell *c = cell_of(f, ch, pe->rx_head[ch]);
        if (atomic_load_explicit(&c->seq, memory_order_acquire) !=
            pe->rx_head[ch] + 1)
            break;
        if (c->first != (m->off == 0) || c->msg_len != m->len ||
            (c->kind == CELL_DATA && c->len > m->len - m->off) ||
            (c->kind != CELL_DATA && c->kind != CELL_RNDV)) {
            char who[160];
            describe(tp, p, who, sizeof(who));
            hvd_tp_failf(
                fail_with, tp, tp->rank, HVD_ERR_MISMATCH, p,
                "%s sent a message of %llu bytes where rank %d expected "
                "%zu: ranks called collectives in different orders or with "
                "different counts",
                who, (unsigned long long)c->msg_len, tp->rank, m->len);
            return 1;
        }
        if (c->kind == CELL_RNDV) {
            if (cma_read(tp, p, m->buf, c->addr, m->len) != HVD_OK)
                return 1;
            m->off = m->len;
            atomic_fetch_add_explicit(&f->acked, 1, memory_order_release);
        } else if (c->len > 0) {
            memcpy(m->buf + m->off, payload_of(c), c->len);
            m->off += c->len;
        }
        atomic_store_explicit(&f->head, ++pe->rx_head[ch],
                              memory_order_release);
        moved = 1;
        if (m->off == m->len) {
            complete(m->req, HVD_OK);
            pe->pending--;
            q_pop(&pe->recvq[ch]);
        }
    }
    if (moved) {
        ring(pe->seg); /* cells freed, or a CELL_RNDV read */
        pe->last_active = hvd_now_ns();
    }
    return moved;
}

/* One pass over every peer with work. Returns 1 if anything moved. */
static int pass(shm *tp) {
    int moved = 0;
    for (int p = 0; p < tp->size && tp->failure.status == HVD_OK; p++) {
        speer *pe = &tp->peers[p];
        if (pe->pending == 0)
            continue;
        for (int ch = 0; ch < NCHANNELS && tp->failure.status == HVD_OK; ch++) {
            if (pe->recvq[ch].count > 0)
                moved |= pull(tp, p, ch);
            if (pe->sendq[ch].count > 0 || pe->ackq[ch].count > 0)
                moved |= push(tp, p, ch);
        }
    }
    return moved;
}

static hvd_status shm_progress(hvd_transport *t, int timeout_ms) {
    shm *tp = (shm *)t;
    seg_hdr *me = tp->seg != NULL ? hdr_of(tp->seg) : NULL;
    int64_t now = hvd_now_ns(), deadline, spin_end;

    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (me == NULL) {
        /* No same-host peer: nothing can ever arrive. */
        if (timeout_ms != 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        return HVD_OK;
    }
    if (now - tp->last_heartbeat >= HEARTBEAT_NS) {
        tp->last_heartbeat = now;
        atomic_store_explicit(&me->heartbeat, now, memory_order_relaxed);
    }
    /* Peers are looked at every SLICE_MS even while traffic from others
     * keeps this rank from ever sleeping. */
    if (check_peers(tp, now) != HVD_OK)
        goto out;
    if (pass(tp) || timeout_ms == 0)
        goto out;
    deadline = timeout_ms < 0 ? INT64_MAX : now + timeout_ms * 1000000LL;
    /* Spin while the doorbell is quiet, unless the host has fewer cores
     * than ranks (spinning would steal the peer's core). */
    spin_end = now + tp->spin_ns;
    /* Any ring of the doorbell ends the wait: data, freed cells, or
     * another thread's wake; the caller looks at its requests again. */
    while (hvd_now_ns() < spin_end) {
        uint32_t bell =
            atomic_load_explicit(&me->doorbell, memory_order_acquire);
        if (bell != tp->seen_bell) {
            tp->seen_bell = bell;
            pass(tp);
            goto out;
        }
        /* Give the core to any other runnable thread (the peer, if they
         * share it; this rank's own application thread): a busy loop would
         * hold it for a whole time slice. */
        sched_yield();
    }
    for (;;) {
        uint32_t bell;
        int64_t left;
        struct timespec ts;

        atomic_store(&me->sleeping, 1);
        bell = atomic_load(&me->doorbell);
        if (bell != tp->seen_bell || pass(tp)) {
            tp->seen_bell = bell;
            atomic_store(&me->sleeping, 0);
            pass(tp);
            break;
        }
        now = hvd_now_ns();
        left = deadline - now;
        if (left > SLICE_MS * 1000000LL)
            left = SLICE_MS * 1000000LL;
        if (left > 0) {
            ts.tv_sec = left / 1000000000LL;
            ts.tv_nsec = left % 1000000000LL;
            futex(&me->doorbell, FUTEX_WAIT, bell, &ts);
        }
        atomic_store(&me->sleeping, 0);
        if (atomic_load(&me->doorbell) != bell) {
            tp->seen_bell = atomic_load(&me->doorbell);
            pass(tp);
            break;
        }
        now = hvd_now_ns();
        if (now - tp->last_heartbeat >= HEARTBEAT_NS) {
            tp->last_heartbeat = now;
            atomic_store_explicit(&me->heartbeat, now, memory_order_relaxed);
        }
        if (check_peers(tp, now) != HVD_OK || now >= deadline)
            break;
    }
out:
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    return HVD_OK;
}

static hvd_status check_peer(shm *tp, int peer, int channel, const char *what) {
    if (tp->failure.status != HVD_OK)
        return hvd_tp_failure_error(&tp->failure);
    if (peer < 0 || peer >= tp->size || peer == tp->rank)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "shm: cannot %s rank %d (this is rank %d of %d)",
                             what, peer, tp->rank, tp->size);
    if (tp->peers[peer].seg == NULL)
        return hvd_error_set(HVD_ERR_INVALID_ARG,
                             "shm: rank %d is on another host (%s) than rank "
                             "%d: shared memory cannot reach it",
                             peer, tp->hosts ? tp->hosts[peer] : "?", tp->rank);
    if (channel < 0 || channel >= NCHANNELS)
        return hvd_error_set(HVD_ERR_INVALID_ARG, "shm: no channel %d",
                             channel);
    return HVD_OK;
}

static hvd_status post(shm *tp, int peer, int ch, msgq *q, void *buf,
                       size_t len, hvd_req *req) {
    msg m = {.req = req, .buf = buf, .len = len};

    req->done = 0;
    req->status = HVD_OK;
    req->peer = peer;
    req->len = len;
    if (q_push(q, &m) != 0)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    if (tp->peers[peer].pending++ == 0)
        tp->peers[peer].last_active = hvd_now_ns();
    (void)ch;
    return HVD_OK;
}

static hvd_status shm_isend(hvd_transport *t, int peer, int channel,
                            const void *buf, size_t len, hvd_req *req) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, channel, "send to");
    msgq *q;

    if (st == HVD_OK)
        st = post(tp, peer, channel, &tp->peers[peer].sendq[channel],
                  (void *)(uintptr_t)buf, len, req);
    if (st != HVD_OK)
        return st;
    /* Start at once: a small message is in the peer's FIFO before the
     * caller next waits. */
    q = &tp->peers[peer].sendq[channel];
    if (q->count == 1)
        push(tp, peer, channel);
    /*
     * A control message the FIFO cannot take now is copied and completes
     * at once, as a socket buffers it: the engine sends control messages
     * and waits for them while the peer may be busy in a collective that
     * waits on this rank, so they must never wait for the peer.
     */
    if (channel == HVD_CHANNEL_CONTROL && !req->done && q->count > 0) {
        msg *m = &q->v[(q->head + q->count - 1) % q->cap];
        uint8_t *copy = malloc(len > 0 ? len : 1);
        if (copy == NULL)
            return HVD_OK; /* it completes when written, as data does */
        if (len > 0)
            memcpy(copy, buf, len);
        m->buf = copy;
        m->owned = 1;
        m->req = NULL;
        complete(req, HVD_OK);
    }
    return HVD_OK;
}

static hvd_status shm_irecv(hvd_transport *t, int peer, int channel, void *buf,
                            size_t len, hvd_req *req) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, channel, "receive from");

    if (st == HVD_OK)
        st = post(tp, peer, channel, &tp->peers[peer].recvq[channel], buf, len,
                  req);
    return st;
}

static void shm_wake(hvd_transport *t) {
    shm *tp = (shm *)t;
    if (tp->seg != NULL)
        ring(tp->seg);
}

static hvd_status shm_get(hvd_transport *t, int peer, void *buf,
                          uint64_t remote, size_t len) {
    shm *tp = (shm *)t;
    hvd_status st = check_peer(tp, peer, 0, "read from");

    if (st != HVD_OK)
        return st;
    if (!tp->cma)
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "shm: process_vm_readv is not permitted here");
    return len > 0 ? cma_read(tp, peer, buf, remote, len) : HVD_OK;
}

static int shm_can_get(hvd_transport *t, int peer) {
    shm *tp = (shm *)t;
    return tp->cma && peer >= 0 && peer < tp->size &&
           tp->peers[peer].seg != NULL;
}

/* ------------------------------------------------------------------ */
/* Setup                                                               */

/* What each rank tells the others at open, twice: first its segment,
 * then whether it mapped and can read every same-host peer. */
typedef struct shm_blob {
    uint64_t magic;
    uint64_t probe_addr;
    uint64_t seg_len;
    int32_t pid;
    int32_t ok;     /* round 1: segment made; round 2: peers mapped */
    int32_t cma_ok; /* round 2 */
    int32_t pad;
    char err[200];
} shm_blob;

static void shm_close(hvd_transport *t) {
    shm *tp = (shm *)t;

    if (tp == NULL)
        return;
    for (int p = 0; tp->peers != NULL && p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        if (pe->seg != NULL)
            munmap(pe->seg, pe->seg_len);
        if (pe->pidfd >= 0)
            close(pe->pidfd);
        for (int ch = 0; ch < NCHANNELS; ch++) {
            msgq *qs[2] = {&pe->sendq[ch], &pe->ackq[ch]};
            for (int k = 0; k < 2; k++)
                for (size_t i = 0; i < qs[k]->count; i++) {
                    msg *m = &qs[k]->v[(qs[k]->head + i) % qs[k]->cap];
                    if (m->owned)
                        free(m->buf);
                }
            free(pe->sendq[ch].v);
            free(pe->ackq[ch].v);
            free(pe->recvq[ch].v);
        }
    }
    if (tp->seg_named)
        shm_unlink(tp->seg_name);
    if (tp->seg != NULL)
        munmap(tp->seg, tp->seg_len);
    free(tp->peers);
    free(tp->hosts);
    free(tp);
}

static hvd_status shm_probe(const hvd_transport_params *params,
                            hvd_caps *caps) {
    int same = 0;

    memset(caps, 0, sizeof(*caps));
    if (params->hosts != NULL)
        for (int i = 0; i < params->size; i++)
            same += strcmp(params->hosts[i], params->hosts[params->rank]) == 0;
    caps->usable = same > 1;
    caps->one_sided = 1;
    /* Only within a host, and there first. */
    caps->reach = HVD_REACH_SAME_HOST;
    caps->priority = 30;
    if (!caps->usable)
        snprintf(caps->reason, sizeof(caps->reason),
                 "no other rank runs on this host");
    return HVD_OK;
}

static int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
    long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) {
        fcntl((int)fd, F_SETFD, FD_CLOEXEC);
        return (int)fd;
    }
#else
    (void)pid;
#endif
    return -1;
}

/* Makes and maps this rank's segment. */
static hvd_status make_segment(shm *tp, const hvd_transport_params *params) {
    int fd;

    hvd_shm_segment_name(params->job_id, tp->rank, tp->seg_name,
                         sizeof(tp->seg_name));
    tp->seg_len = segment_bytes(tp->nlocal);
    fd = shm_open(tp->seg_name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Left by an earlier job of the same id: not ours to keep. */
        shm_unlink(tp->seg_name);
        fd =
            shm_open(tp->seg_name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return hvd_error_set(HVD_ERR_TRANSPORT, "shm_open(%s) failed: %s",
                             tp->seg_name, strerror(errno));
    tp->seg_named = 1;
    if (ftruncate(fd, (off_t)tp->seg_len) != 0) {
        int e = errno;
        close(fd);
        return hvd_error_set(HVD_ERR_TRANSPORT,
                             "ftruncate(%s, %zu) failed: %s (is /dev/shm "
                             "full?)",
                             tp->seg_name, tp->seg_len, strerror(e));
    }
    void *p =
        mmap(NULL, tp->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return hvd_error_set(HVD_ERR_TRANSPORT, "mmap(%s, %zu) failed: %s",
                             tp->seg_name, tp->seg_len, strerror(errno));
    tp->seg = p;
    seg_hdr *h = hdr_of(tp->seg);
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->nlocal = (uint32_t)tp->nlocal;
    h->pid = (int32_t)getpid();
    for (int ch = 0; ch < NCHANNELS; ch++) {
        h->ncells[ch] = ncells_of[ch];
        h->cell_bytes[ch] = cell_bytes_of[ch];
    }
    return HVD_OK;
}

/* Maps peer p's segment and checks it; err gets the reason on failure. */
static int map_peer(shm *tp, const hvd_transport_params *params, int p,
                    const shm_blob *b, char *err, size_t errlen) {
    speer *pe = &tp->peers[p];
    char name[96];
    int fd;

    hvd_shm_segment_name(params->job_id, p, name, sizeof(name));
    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s) of rank %d failed: %s", name, p,
                 strerror(errno));
        return -1;
    }
    void *m = mmap(NULL, (size_t)b->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s) of rank %d failed: %s", name, p,
                 strerror(errno));
        return -1;
    }
    pe->seg = m;
    pe->seg_len = (size_t)b->seg_len;
    seg_hdr *h = hdr_of(pe->seg);
    if (pe->seg_len != tp->seg_len || h->magic != SHM_MAGIC ||
        h->version != SHM_VERSION || h->nlocal != (uint32_t)tp->nlocal) {
        snprintf(err, errlen,
                 "the segment of rank %d (%s) is not one this hvd can use "
                 "(another version of hvd?)",
                 p, name);
        return -1;
    }
    pe->pid = (pid_t)b->pid;
    pe->pidfd = open_pidfd(pe->pid);
    return 0;
}

static hvd_status shm_open_tp(const hvd_transport_params *params,
                              hvd_transport **out) {
    shm *tp = calloc(1, sizeof(*tp));
    shm_blob mine, *all = NULL;
    hvd_status st = HVD_OK;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const char *cma_env = getenv("HVD_SHM_CMA");
    const char *spin_env = getenv("HVD_SHM_SPIN_US");

    if (tp == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    tp->base.ops = &hvd_shm_ops;
    tp->rank = params->rank;
    tp->size = params->size;
    tp->timeout_ns = params->timeout_ns;
    tp->eager_max = cell_bytes_of[HVD_CHANNEL_DATA];
    tp->cma_probe = SHM_MAGIC;
    tp->peers = calloc((size_t)tp->size, sizeof(*tp->peers));
    all = calloc((size_t)tp->size, sizeof(*all));
    if (params->hosts != NULL) {
        tp->hosts = malloc((size_t)tp->size * sizeof(*tp->hosts));
        if (tp->hosts != NULL)
            memcpy(tp->hosts, params->hosts,
                   (size_t)tp->size * sizeof(*tp->hosts));
    }
    if (tp->peers == NULL || all == NULL ||
        (params->hosts != NULL && tp->hosts == NULL)) {
        st = hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int p = 0; p < tp->size; p++) {
        speer *pe = &tp->peers[p];
        pe->pidfd = -1;
        pe->local = -1;
        if (params->hosts != NULL &&
            strcmp(params->hosts[p], params->hosts[tp->rank]) == 0) {
            if (p == tp->rank)
                tp->my_local = tp->nlocal;
            pe->local = tp->nlocal++;
        }
    }
    tp->spin_ns = ncpu > 0 && tp->nlocal > ncpu ? 0 : SPIN_NS_DEFAULT;
    if (spin_env != NULL && *spin_env != '\0') {
        char *end;
        long us = strtol(spin_env, &end, 10);
        if (*end != '\0' || us < 0 || us > 1000000) {
            st = hvd_error_set(HVD_ERR_INVALID_ARG,
                               "HVD_SHM_SPIN_US=%s is not a number of "
                               "microseconds from 0 to 1000000",
                               spin_env);
            goto fail;
        }
        tp->spin_ns = us * 1000LL;
    }

    /* Round 1: every rank with a same-host peer makes its segment. */
    memset(&mine, 0, sizeof(mine));
    mine.magic = SHM_MAGIC;
    mine.pid = (int32_t)getpid();
    mine.probe_addr = (uint64_t)(uintptr_t)&tp->cma_probe;
    mine.ok = 1;
    if (tp->nlocal > 1) {
        st = make_segment(tp, params);
        if (st != HVD_OK) {
            mine.ok = 0;
            snprintf(mine.err, sizeof(mine.err), "%s", hvd_error_get());
        }
        mine.seg_len = tp->seg_len;
    }
    hvd_status bst = params->bootstrap->allgather(params->bootstrap, &mine,
                                                  sizeof(mine), all);
    if (bst != HVD_OK) {
        st = bst;
        goto fail;
    }

    /* Round 2: map every same-host peer's segment; test process_vm_readv
     * on each. */
    int ok = mine.ok, cma_ok = cma_env == NULL || strcmp(cma_env, "0") != 0;
    char err[200] = "";
    for (int p = 0; p < tp->size && ok; p++) {
        if (p == tp->rank || tp->peers[p].local < 0)
            continue;
        all[p].err[sizeof(all[p].err) - 1] = '\0';
        if (!all[p].ok) {
            ok = 0;
            snprintf(err, sizeof(err), "rank %d: %.150s", p, all[p].err);
            break;
        }
        if (map_peer(tp, params, p, &all[p], err, sizeof(err)) != 0) {
            ok = 0;
            break;
        }
        uint64_t word = 0;
        struct iovec l = {&word, sizeof(word)};
        struct iovec r = {(void *)(uintptr_t)all[p].probe_addr, sizeof(word)};
        if (cma_ok && (process_vm_readv(all[p].pid, &l, 1, &r, 1, 0) !=
                           (ssize_t)sizeof(word) ||
                       word != SHM_MAGIC)) {
            HVD_INFO("shm",
                     "process_vm_readv from rank %d is not permitted (%s): "
                     "large messages go through the shared segments",
                     p, strerror(errno));
            cma_ok = 0;
        }
    }
    memset(&mine, 0, sizeof(mine));
    mine.ok = ok;
    mine.cma_ok = cma_ok;
    snprintf(mine.err, sizeof(mine.err), "%s", err);
    bst = params->bootstrap->allgather(params->bootstrap, &mine, sizeof(mine),
                                       all);
    if (bst != HVD_OK) {
        st = bst;
        goto fail;
    }
    /* Every rank judges the same way from the same data: one failed rank
     * fails the transport everywhere, and one-sided reads are used only if
     * every rank can make them. */
    tp->cma = 1;
    for (int p = 0; p < tp->size; p++) {
        all[p].err[sizeof(all[p].err) - 1] = '\0';
        if (!all[p].ok) {
            st = hvd_error_set(HVD_ERR_TRANSPORT,
                               "shared memory could not be set up on rank "
                               "%d's host (%s): %s",
                               p, tp->hosts ? tp->hosts[p] : "?", all[p].err);
            goto fail;
        }
        tp->cma &= all[p].cma_ok;
    }
    /* Every same-host rank has mapped every segment: the names can go, so
     * that nothing is left in /dev/shm whatever happens next. */
    if (tp->seg_named) {
        shm_unlink(tp->seg_name);
        tp->seg_named = 0;
    }
    free(all);
    HVD_DEBUG("shm",
              "%d ranks on this host share memory (%zu bytes a segment); "
              "large messages by %s",
              tp->nlocal, tp->seg_len,
              tp->cma ? "process_vm_readv" : "copy through the segments");
    *out = &tp->base;
    return HVD_OK;
fail:
    free(all);
    shm_close(&tp->base);
    return st;
}

/*
 * Says goodbye, then writes out what is still queued: a control message
 * the FIFO could not take was copied and completed at once (shm_isend), so
 * without this it would be lost when the process exits, or, sent by
 * reference (CELL_RNDV), read from memory that is gone; a peer still
 * waiting for it would find this rank gone (found by the transport suite,
 * tests/transport). Towards each peer it stops once the queue is empty,
 * the peer has said goodbye too (it reads nothing more) or has gone, or
 * after the timeout.
 */
static hvd_status shm_shutdown(hvd_transport *t) {
    shm *tp = (shm *)t;
    int64_t end;

    if (tp->failure.status != HVD_OK || tp->seg == NULL)
        return HVD_OK;
    atomic_store(&hdr_of(tp->seg)->bye, 1);
    for (int p = 0; p < tp->size; p++)
        if (tp->peers[p].seg != NULL)
            ring(tp->peers[p].seg);
    end = hvd_now_ns() + tp->timeout_ns;
    for (;;) {
        int left = 0;
        for (int p = 0; p < tp->size; p++) {
            speer *pe = &tp->peers[p];
            if (pe->seg == NULL || atomic_load(&hdr_of(pe->seg)->bye) ||
                atomic_load(&hdr_of(pe->seg)->failed) != HVD_OK)
                continue;
            for (int ch = 0; ch < NCHANNELS; ch++) {
                if (pe->sendq[ch].count == 0 && pe->ackq[ch].count == 0)
                    continue;
                push(tp, p, ch);
                /* A message sent by reference (CELL_RNDV) is read from
                 * this process's memory: it must wait to be read. */
                if ((pe->sendq[ch].count > 0 || pe->ackq[ch].count > 0) &&
                    !peer_exited(pe))
                    left = 1;
            }
        }
        if (!left || tp->failure.status != HVD_OK || hvd_now_ns() > end)
            break;
        sched_yield();
    }
    return HVD_OK;
}

const hvd_transport_ops hvd_shm_ops = {
    .size = sizeof(hvd_transport_ops),
    .name = "shm",
    .title = "shared memory",
    .probe = shm_probe,
    .open = shm_open_tp,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .progress = shm_progress,
    .wake = shm_wake,
    .shutdown = shm_shutdown,
    .close = shm_close,
    .get = shm_get,
    .can_get = shm_can_get,
};
