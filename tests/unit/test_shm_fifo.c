/*
 * The shared-memory transport's FIFOs (transport/shm/): the ring of cells
 * each rank writes into another's segment, and the message queues that
 * feed it. Two ranks live in this one process and one thread, each with a
 * segment in ordinary memory pointing at the other's; moving data is
 * hvd_shm_pass called on each side in turn, so every step is
 * deterministic: push and pop of one cell, wrap-around past the ring's
 * capacity, a full FIFO that holds the sender back until a cell is freed,
 * messages of many cells, a message larger than the whole FIFO, receives
 * of a message of unknown length (irecv_upto), the buffered control send, a
 * length mismatch, and the ring arithmetic of the power-of-two capacities;
 * messages carried in the cell's header line (every length from 0 to past it,
 * exact, the payload untouched), the longest whole message and one byte more,
 * malformed cells, the doorbell rung only for a sleeping rank, and a sleeping
 * receiver (a forked child on shared memory) woken by a message, with a
 * fence on each side or membarrier's barrier on the sleeper's; and the
 * segments' names (setup.c), which must not show the job id.
 *
 * The internal functions called (transport/shm/shm_internal.h):
 * hvd_shm_isend, hvd_shm_irecv, hvd_shm_irecv_upto, hvd_shm_pass,
 * hvd_shm_membar_setup, hvd_shm_push, and the inline layout and queue
 * helpers segment_bytes, fifo_bytes, fifo_of, cell_of, payload_of, q_push,
 * q_front, q_pop (with ncells_of and cell_bytes_of), and
 * hvd_shm_segment_name.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/shm/shm_internal.h"

#define DATA HVD_CHANNEL_DATA
#define CTRL HVD_CHANNEL_CONTROL

typedef struct pair {
    shm side[2];
    speer peers[2][2];
} pair;

/* Two ranks of one host: rank r's segment is its own memory, and it
 * writes into the other's. No process_vm_readv (every message goes
 * through the cells). */
static int pair_setup(void **state) {
    pair *pr = calloc(1, sizeof(*pr));
    size_t len = segment_bytes(2);

    assert_non_null(pr);
    for (int r = 0; r < 2; r++) {
        shm *tp = &pr->side[r];
        tp->rank = r;
        tp->size = 2;
        tp->nlocal = 2;
        tp->my_local = r;
        tp->seg_len = len;
        tp->seg = aligned_alloc(LINE, (len + LINE - 1) / LINE * LINE);
        assert_non_null(tp->seg);
        memset(tp->seg, 0, len);
        tp->peers = pr->peers[r];
        tp->eager_max = SIZE_MAX;
    }
    for (int r = 0; r < 2; r++) {
        for (int p = 0; p < 2; p++) {
            speer *pe = &pr->peers[r][p];
            pe->local = p;
            pe->pid = getpid();
            pe->pidfd = -1;
            pe->seg = p == r ? NULL : pr->side[p].seg;
            pe->seg_len = len;
        }
    }
    *state = pr;
    return 0;
}

static int pair_teardown(void **state) {
    pair *pr = *state;

    for (int r = 0; r < 2; r++) {
        for (int p = 0; p < 2; p++) {
            for (int ch = 0; ch < NCHANNELS; ch++) {
                speer *pe = &pr->peers[r][p];
                msg *m;
                while ((m = q_front(&pe->sendq[ch])) != NULL) {
                    if (m->owned)
                        free(m->buf);
                    q_pop(&pe->sendq[ch]);
                }
                free(pe->sendq[ch].v);
                free(pe->ackq[ch].v);
                free(pe->recvq[ch].v);
            }
        }
        free(pr->side[r].seg);
    }
    free(pr);
    return 0;
}

static hvd_transport *T(pair *pr, int r) { return &pr->side[r].base; }

/* Passes on both sides until neither moves anything (bounded). */
static void settle(pair *pr) {
    for (int i = 0; i < 10000; i++)
        if (!hvd_shm_pass(&pr->side[0]) && !hvd_shm_pass(&pr->side[1]))
            return;
    fail_msg("the FIFOs never settled");
}

static void pattern(uint8_t *buf, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 131 + seed * 7 + 1);
}

/* The cell of the n-th write of rank src into rank dst's FIFO on ch. */
static cell *written(pair *pr, int src, int dst, int ch, uint64_t n) {
    return cell_of(fifo_of(pr->side[dst].seg, src, ch), ch, n);
}

static void one_cell(void **state) {
    pair *pr = *state;
    uint8_t out[100], in[100];
    hvd_req s, r;

    pattern(out, sizeof(out), 1);
    memset(in, 0, sizeof(in));
    assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, DATA, in, sizeof(in), &r),
                     HVD_OK);
    assert_int_equal(hvd_shm_isend(T(pr, 0), 1, DATA, out, sizeof(out), &s),
                     HVD_OK);
    /* A message of one cell is written at once: the sender is done. */
    assert_int_equal(s.done, 1);
    assert_int_equal(pr->peers[0][1].tail[DATA], 1);
    cell *c = written(pr, 0, 1, DATA, 0);
    assert_int_equal(atomic_load(&c->seq), 1);
    assert_int_equal(c->len, sizeof(out));
    assert_int_equal(c->kind, CELL_DATA);
    /* Its first bytes ride in the header line, the rest in the payload. */
    assert_memory_equal(c->inl, out, CELL_INLINE);
    assert_memory_equal(payload_of(c), out + CELL_INLINE,
                        sizeof(out) - CELL_INLINE);
    assert_int_equal(r.done, 0);
    settle(pr);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.status, HVD_OK);
    assert_memory_equal(in, out, sizeof(out));
    /* The receiver consumed the cell and said so. */
    assert_int_equal(pr->peers[1][0].rx_head[DATA], 1);
    assert_int_equal(atomic_load(&fifo_of(pr->side[1].seg, 0, DATA)->head), 1);
    assert_int_equal(pr->peers[0][1].pending, 0);
    assert_int_equal(pr->peers[1][0].pending, 0);
}

/* Three times the ring's capacity of one-cell messages, each received
 * before the next is sent: the cell index wraps, the counters do not. */
static void wrap_around(void **state) {
    pair *pr = *state;
    uint32_t n = 3 * ncells_of[CTRL] + 1;

    for (uint32_t k = 0; k < n; k++) {
        uint8_t out[40], in[40];
        hvd_req s, r;
        pattern(out, sizeof(out), k);
        assert_int_equal(hvd_shm_isend(T(pr, 1), 0, CTRL, out, sizeof(out), &s),
                         HVD_OK);
        assert_int_equal(hvd_shm_irecv(T(pr, 0), 1, CTRL, in, sizeof(in), &r),
                         HVD_OK);
        settle(pr);
        assert_int_equal(s.done, 1);
        assert_int_equal(r.done, 1);
        assert_memory_equal(in, out, sizeof(out));
        /* The cell that carried it is the k-th modulo the capacity. */
        assert_ptr_equal(written(pr, 1, 0, CTRL, k),
                         written(pr, 1, 0, CTRL, k % ncells_of[CTRL]));
        assert_int_equal(atomic_load(&written(pr, 1, 0, CTRL, k)->seq), k + 1);
    }
    assert_int_equal(pr->peers[1][0].tail[CTRL], n);
    assert_int_equal(pr->peers[0][1].rx_head[CTRL], n);
}

/* More one-cell data messages than cells, none received yet: the FIFO
 * fills, the rest wait in the send queue (incomplete), and each receive
 * frees a cell the sender then fills. */
static void full_fifo(void **state) {
    pair *pr = *state;
    uint32_t cap = ncells_of[DATA], n = cap + 3;
    uint8_t out[16][32], in[16][32];
    hvd_req s[16], r[16];

    assert_true(n <= 16);
    for (uint32_t k = 0; k < n; k++) {
        pattern(out[k], sizeof(out[k]), k);
        assert_int_equal(
            hvd_shm_isend(T(pr, 0), 1, DATA, out[k], sizeof(out[k]), &s[k]),
            HVD_OK);
        hvd_shm_pass(&pr->side[0]);
    }
    assert_int_equal(pr->peers[0][1].tail[DATA], cap);
    for (uint32_t k = 0; k < n; k++)
        assert_int_equal(s[k].done, k < cap);
    /* Nothing received: passing again writes nothing. */
    assert_int_equal(hvd_shm_push(&pr->side[0], 1, DATA), 0);
    assert_int_equal(pr->peers[0][1].tail[DATA], cap);
    /* One receive frees one cell: exactly one more message goes in. */
    assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, DATA, in[0], 32, &r[0]),
                     HVD_OK);
    hvd_shm_pass(&pr->side[1]);
    assert_int_equal(r[0].done, 1);
    assert_int_equal(hvd_shm_push(&pr->side[0], 1, DATA), 1);
    assert_int_equal(pr->peers[0][1].tail[DATA], cap + 1);
    assert_int_equal(s[cap].done, 1);
    assert_int_equal(s[cap + 1].done, 0);
    for (uint32_t k = 1; k < n; k++)
        assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, DATA, in[k], 32, &r[k]),
                         HVD_OK);
    settle(pr);
    for (uint32_t k = 0; k < n; k++) {
        assert_int_equal(s[k].done, 1);
        assert_int_equal(r[k].done, 1);
        assert_memory_equal(in[k], out[k], 32);
    }
}

/* Messages of several cells, and one larger than the whole FIFO (it can
 * only move while the receiver frees cells). */
static void many_cells(void **state) {
    pair *pr = *state;
    size_t cb = cell_bytes_of[DATA];
    size_t lens[] = {cb - 1, cb, cb + 1, 3 * cb + 17,
                     (size_t)(ncells_of[DATA] + 2) * cb + 5};

    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        size_t len = lens[k];
        uint8_t *out = malloc(len), *in = calloc(1, len);
        hvd_req s, r;
        pattern(out, len, (unsigned)k);
        assert_int_equal(hvd_shm_isend(T(pr, 0), 1, DATA, out, len, &s),
                         HVD_OK);
        assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, DATA, in, len, &r), HVD_OK);
        settle(pr);
        assert_int_equal(s.done, 1);
        assert_int_equal(r.done, 1);
        assert_int_equal(r.status, HVD_OK);
        assert_memory_equal(in, out, len);
        free(out);
        free(in);
    }
    /* Every cell written was consumed. */
    assert_int_equal(pr->peers[0][1].tail[DATA], pr->peers[1][0].rx_head[DATA]);
}

/* irecv_upto takes a message of any length up to its cap: the cell says
 * how long it is, the receive reports it, every byte is copied (zeros at
 * the end too), nothing past it is written; a message of several cells
 * (its first piece says the whole length) likewise; a longer one than the
 * cap is a mismatch. */
static void upto(void **state) {
    pair *pr = *state;
    static const size_t lens[] = {0, 10, 48, 49, 1024, 1025, 4095, 4096};
    uint8_t out[4096 + 16], in[4096 + 16];

    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        size_t len = lens[k];
        hvd_req s, r;
        uint64_t n = pr->peers[0][1].tail[CTRL];
        pattern(out, len, (unsigned)k + 7);
        memset(out + len / 2, 0, len - len / 2); /* a zero tail */
        memset(in, 0xff, sizeof(in));
        assert_int_equal(hvd_shm_isend(T(pr, 0), 1, CTRL, out, len, &s),
                         HVD_OK);
        assert_int_equal(written(pr, 0, 1, CTRL, n)->len, len);
        assert_int_equal(hvd_shm_irecv_upto(T(pr, 1), 0, CTRL, in, 4096, &r),
                         HVD_OK);
        settle(pr);
        assert_int_equal(r.done, 1);
        assert_int_equal(r.status, HVD_OK);
        assert_int_equal(r.got, len);
        if (len > 0)
            assert_memory_equal(in, out, len);
        for (size_t b = len; b < sizeof(in); b++)
            assert_int_equal(in[b], 0xff);
    }
    /* Several cells of the data channel. */
    size_t cb = cell_bytes_of[DATA], len = 3 * cb + 17;
    uint8_t *big = malloc(len), *into = malloc(4 * cb);
    hvd_req s, r;
    pattern(big, len, 99);
    memset(into, 0xff, 4 * cb);
    assert_int_equal(hvd_shm_isend(T(pr, 0), 1, DATA, big, len, &s), HVD_OK);
    assert_int_equal(hvd_shm_irecv_upto(T(pr, 1), 0, DATA, into, 4 * cb, &r),
                     HVD_OK);
    settle(pr);
    assert_int_equal(r.status, HVD_OK);
    assert_int_equal(r.got, len);
    assert_memory_equal(into, big, len);
    assert_int_equal(into[len], 0xff);
    free(big);
    free(into);
    /* Longer than the cap. */
    assert_int_equal(hvd_shm_isend(T(pr, 0), 1, CTRL, out, 100, &s), HVD_OK);
    assert_int_equal(hvd_shm_irecv_upto(T(pr, 1), 0, CTRL, in, 64, &r), HVD_OK);
    hvd_shm_pass(&pr->side[1]);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.status, HVD_ERR_MISMATCH);
    assert_non_null(strstr(hvd_error_get(), "at most 64"));
}

/* A control message that finds the FIFO full is copied and completes at
 * once (the engine never waits for a busy peer to make room). */
static void control_send_buffered(void **state) {
    pair *pr = *state;
    uint32_t cap = ncells_of[CTRL], n = cap + 2;
    uint8_t out[16][24], in[16][24];
    hvd_req s[16], r[16];

    assert_true(n <= 16);
    for (uint32_t k = 0; k < n; k++) {
        pattern(out[k], 24, k + 50);
        assert_int_equal(hvd_shm_isend(T(pr, 0), 1, CTRL, out[k], 24, &s[k]),
                         HVD_OK);
        assert_int_equal(s[k].done, 1);
    }
    assert_int_equal(pr->peers[0][1].tail[CTRL], cap);
    assert_int_equal(pr->peers[0][1].sendq[CTRL].count, 2);
    /* The copies, not the caller's buffers, are sent. */
    memset(out[cap], 0, 24);
    memset(out[cap + 1], 0, 24);
    for (uint32_t k = 0; k < n; k++)
        assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, CTRL, in[k], 24, &r[k]),
                         HVD_OK);
    settle(pr);
    for (uint32_t k = 0; k < n; k++) {
        uint8_t want[24];
        pattern(want, 24, k + 50);
        assert_int_equal(r[k].done, 1);
        assert_memory_equal(in[k], want, 24);
    }
}

/* A receive of another length than the message's fails the transport. */
static void length_mismatch(void **state) {
    pair *pr = *state;
    uint8_t out[32] = {1}, in[48];
    hvd_req s, r;

    assert_int_equal(hvd_shm_isend(T(pr, 0), 1, DATA, out, 32, &s), HVD_OK);
    assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, DATA, in, 48, &r), HVD_OK);
    hvd_shm_pass(&pr->side[1]);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.status, HVD_ERR_MISMATCH);
    assert_int_equal(pr->side[1].failure.status, HVD_ERR_MISMATCH);
    assert_int_equal(atomic_load(&hdr_of(pr->side[1].seg)->failed),
                     HVD_ERR_MISMATCH);
}

/* Sends len pattern bytes from rank 0 to rank 1 on ch and receives them
 * into a buffer whose bytes past len must stay as they were; returns the
 * kind of the (first) cell that carried it. The payload of the cell is
 * filled with a sentinel first: a message that fits the header line must
 * leave it untouched. */
static unsigned send_exact(pair *pr, int ch, size_t len, unsigned seed) {
    uint8_t *out = malloc(len + 1), *in = malloc(len + 16);
    uint64_t n = pr->peers[0][1].tail[ch];
    cell *c = written(pr, 0, 1, ch, n);
    hvd_req s, r;
    unsigned kind;

    assert_non_null(out);
    assert_non_null(in);
    pattern(out, len, seed);
    memset(in, 0xee, len + 16);
    memset(payload_of(c), 0xa5, 64);
    assert_int_equal(hvd_shm_isend(T(pr, 0), 1, ch, out, len, &s), HVD_OK);
    kind = c->kind;
    if (len <= CELL_INLINE)
        for (size_t i = 0; i < 64; i++)
            assert_int_equal(payload_of(c)[i], 0xa5);
    assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, ch, in, len, &r), HVD_OK);
    settle(pr);
    assert_int_equal(s.done, 1);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.status, HVD_OK);
    if (len > 0)
        assert_memory_equal(in, out, len);
    for (size_t i = len; i < len + 16; i++)
        assert_int_equal(in[i], 0xee);
    free(out);
    free(in);
    return kind;
}

/* Every length from 0 to past the header line's inline bytes, on both
 * channels, one after the other (the ring wraps several times): bytes
 * exact, one cell each, the payload untouched while the message fits the
 * header line. */
static void inline_lengths(void **state) {
    pair *pr = *state;

    for (int ch = 0; ch < NCHANNELS; ch++) {
        uint64_t t0 = pr->peers[0][1].tail[ch];
        for (size_t len = 0; len <= CELL_INLINE + 70; len++)
            assert_int_equal(send_exact(pr, ch, len, (unsigned)len), CELL_DATA);
        assert_int_equal(pr->peers[0][1].tail[ch] - t0, CELL_INLINE + 71);
        assert_true(CELL_INLINE + 71 > 3 * ncells_of[ch]);
    }
}

/* Up to CELL_SPLIT_MAX bytes a message starts in the header line; one
 * byte more and it is all in the payload (aligned copies). A cell's
 * payload is the longest message that goes whole; one byte more goes in
 * pieces (two cells). */
static void whole_or_pieces(void **state) {
    pair *pr = *state;

    for (int ch = 0; ch < NCHANNELS; ch++) {
        size_t most = cell_bytes_of[ch];
        uint64_t t0 = pr->peers[0][1].tail[ch];
        for (size_t len = CELL_SPLIT_MAX; len <= CELL_SPLIT_MAX + 1; len++) {
            uint8_t want[CELL_SPLIT_MAX + 1];
            cell *c = written(pr, 0, 1, ch, pr->peers[0][1].tail[ch]);
            pattern(want, len, 7);
            assert_int_equal(send_exact(pr, ch, len, 7), CELL_DATA);
            size_t k = len > CELL_SPLIT_MAX ? 0 : CELL_INLINE;
            assert_int_equal(cell_inline_of(len), k);
            if (k > 0)
                assert_memory_equal(c->inl, want, k);
            assert_memory_equal(payload_of(c), want + k, len - k);
        }
        assert_int_equal(send_exact(pr, ch, most, 3), CELL_DATA);
        assert_int_equal(pr->peers[0][1].tail[ch] - t0, 3);
        assert_int_equal(send_exact(pr, ch, most + 1, 4), CELL_PART);
        assert_int_equal(pr->peers[0][1].tail[ch] - t0, 5);
    }
}

/* A cell that cannot be what a sender writes (a length past the cell, an
 * unknown kind) fails the transport with a sentence, and nothing is
 * copied out of the FIFO. */
static void malformed_cell(void **state) {
    pair *pr = *state;
    struct {
        uint8_t kind;
        uint32_t len;
    } bad[] = {{CELL_DATA, 4097}, {CELL_PART, 4097}, {9, 8}};

    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        uint8_t in[64];
        hvd_req r;
        pair_teardown(state);
        pair_setup(state);
        pr = *state;
        cell *c = written(pr, 0, 1, CTRL, 0);
        c->kind = bad[k].kind;
        c->len = bad[k].len;
        c->msg_len = sizeof(in);
        c->first = 1;
        atomic_store(&c->seq, 1);
        memset(in, 0xee, sizeof(in));
        assert_int_equal(hvd_shm_irecv(T(pr, 1), 0, CTRL, in, sizeof(in), &r),
                         HVD_OK);
        hvd_shm_pass(&pr->side[1]);
        assert_int_equal(r.done, 1);
        assert_int_equal(r.status, HVD_ERR_PROTOCOL);
        assert_non_null(strstr(pr->side[1].failure.text, "malformed"));
        for (size_t i = 0; i < sizeof(in); i++)
            assert_int_equal(in[i], 0xee);
    }
}

/* The doorbell rings only for a rank that sleeps: a polling one finds its
 * messages by looking (no write to a line it reads, no system call); a
 * sleeping one is rung for a message and for freed cells. */
static void ring_only_sleepers(void **state) {
    pair *pr = *state;
    seg_hdr *h1 = hdr_of(pr->side[1].seg), *h0 = hdr_of(pr->side[0].seg);
    uint32_t b1 = atomic_load(&h1->doorbell), b0 = atomic_load(&h0->doorbell);

    assert_int_equal(send_exact(pr, CTRL, 8, 1), CELL_DATA);
    assert_int_equal(atomic_load(&h1->doorbell), b1);
    assert_int_equal(atomic_load(&h0->doorbell), b0);
    atomic_store(&h1->sleeping, 1);
    atomic_store(&h0->sleeping, 1);
    assert_int_equal(send_exact(pr, CTRL, 8, 2), CELL_DATA);
    assert_int_equal(atomic_load(&h1->doorbell), b1 + 1); /* a message */
    assert_int_equal(atomic_load(&h0->doorbell), b0 + 1); /* a freed cell */
}

/* Rank 1's part of sleeper_woken, in the child: waits (no spin, so in the
 * futex at once) for n control messages, one after the other; exits 0 if
 * they came, exact, and rank 0 rang the doorbell for them. */
static void sleeper(pair *pr, uint32_t bell0, int n) {
    shm *tp = &pr->side[1];
    uint8_t in[8], want[8];
    hvd_req r;

    tp->spin_ns = 0;
    tp->timeout_ns = 30 * 1000000000LL;
    for (int k = 0; k < n; k++) {
        memset(in, 0, sizeof(in));
        pattern(want, sizeof(want), 9 + k);
        if (hvd_shm_irecv(T(pr, 1), 0, CTRL, in, sizeof(in), &r) != HVD_OK)
            _exit(2);
        for (int i = 0; i < 100 && !r.done; i++)
            if (hvd_shm_progress(T(pr, 1), 1000) != HVD_OK)
                _exit(3);
        if (!r.done || r.status != HVD_OK || memcmp(in, want, sizeof(in)) != 0)
            _exit(4);
    }
    _exit(atomic_load(&hdr_of(tp->seg)->doorbell) != bell0 ? 0 : 5);
}

/* Waits (bounded: 10 s, a loaded machine may not run the child for a
 * while) until the child sleeps, or has failed (*status). */
static void await_sleep(seg_hdr *h1, pid_t pid, int *status) {
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (t = t0; !atomic_load(&h1->sleeping) && t.tv_sec - t0.tv_sec < 10;
         clock_gettime(CLOCK_MONOTONIC, &t)) {
        if (waitpid(pid, status, WNOHANG) == pid)
            break;
        sched_yield();
    }
    assert_int_equal(atomic_load(&h1->sleeping), 1);
}

/* A receiver asleep on its futex (another process) is woken by a message:
 * the sender sees its flag and rings. The segments are shared memory, so
 * the child's futex is the parent's doorbell. With membar, both sides as
 * where the kernel has membarrier's global expedited barrier: the sleeper
 * sleeps after one, the sender publishes without a fence (fail.c,
 * hvd_shm_notify); where it has not, as without. With give_up too, the
 * sleeper judges its first barrier slow and gives barriers up (its flag
 * 0 from then on), and is woken twice: the first message races the give
 * up, the second finds it asleep after a fence only. */
static void woken(pair *pr, int membar, int give_up) {
    size_t len = (segment_bytes(2) + LINE - 1) / LINE * LINE;
    uint8_t *mem = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0),
            out[8];
    hvd_req s;
    int status = -1;

    assert_true(mem != MAP_FAILED);
    for (int r = 0; r < 2; r++) {
        free(pr->side[r].seg);
        pr->side[r].seg = mem + (size_t)r * len;
        pr->peers[1 - r][r].seg = pr->side[r].seg;
    }
    seg_hdr *h1 = hdr_of(pr->side[1].seg);
    uint32_t bell0 = atomic_load(&h1->doorbell);
    int n = give_up ? 2 : 1;
    uint64_t head0 = atomic_load(&fifo_of(pr->side[1].seg, 0, CTRL)->head);
    if (membar) {
        membar = hvd_shm_membar_setup();
        pr->side[0].membar = pr->side[1].membar = membar;
        atomic_store(&h1->membar, (uint32_t)membar);
        atomic_store(&hdr_of(pr->side[0].seg)->membar, (uint32_t)membar);
        pr->side[1].membar_judge = give_up ? 1 : HVD_SHM_MEMBAR_JUDGE;
        pr->side[1].membar_slow_ns = give_up ? 0 : HVD_SHM_MEMBAR_SLOW_NS;
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        sleeper(pr, bell0, n);
    for (int k = 0; k < n; k++) {
        await_sleep(h1, pid, &status);
        pattern(out, sizeof(out), 9 + k);
        assert_int_equal(hvd_shm_isend(T(pr, 0), 1, CTRL, out, sizeof(out), &s),
                         HVD_OK);
        assert_int_equal(s.done, 1);
        /* The child has taken it (so its next sleep is another one). */
        fifo *f = fifo_of(pr->side[1].seg, 0, CTRL);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (t = t0; atomic_load(&f->head) < head0 + (uint64_t)k + 1 &&
                     t.tv_sec - t0.tv_sec < 10;
             clock_gettime(CLOCK_MONOTONIC, &t))
            sched_yield();
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    if (give_up && membar)
        assert_int_equal(atomic_load(&h1->membar), 0);
    else
        assert_int_equal(atomic_load(&h1->membar), (uint32_t)membar);
    for (int r = 0; r < 2; r++)
        pr->side[r].seg = NULL;
    munmap(mem, 2 * len);
}

static void sleeper_woken(void **state) { woken(*state, 0, 0); }

static void sleeper_woken_membar(void **state) { woken(*state, 1, 0); }

static void sleeper_gives_membar_up(void **state) { woken(*state, 1, 1); }

/* The ring arithmetic: capacities are powers of two, cell n and cell
 * n + capacity are the same, the cells of one FIFO are distinct and
 * inside it, and the FIFOs tile the segment. */
static void ring_layout(void **state) {
    pair *pr = *state;
    uint8_t *seg = pr->side[0].seg;
    size_t end = segment_bytes(2);

    for (int ch = 0; ch < NCHANNELS; ch++) {
        uint32_t cap = ncells_of[ch];
        assert_true(cap > 0 && (cap & (cap - 1)) == 0);
        for (int src = 0; src < 2; src++) {
            fifo *f = fifo_of(seg, src, ch);
            uint8_t *lo = (uint8_t *)f, *hi = lo + fifo_bytes(ch);
            assert_true(lo >= seg + sizeof(seg_hdr) && hi <= seg + end);
            for (uint64_t n = 0; n < cap; n++) {
                cell *c = cell_of(f, ch, n);
                assert_ptr_equal(c, cell_of(f, ch, n + cap));
                assert_ptr_equal(c, cell_of(f, ch, n + 5 * (uint64_t)cap));
                assert_true((uint8_t *)c >= lo + sizeof(fifo));
                assert_true(payload_of(c) + cell_bytes_of[ch] <= hi);
                if (n > 0)
                    assert_true(cell_of(f, ch, n - 1) != c);
            }
        }
    }
    /* The FIFOs do not overlap: one after the other, in order. */
    assert_ptr_equal((uint8_t *)fifo_of(seg, 0, 0) + fifo_bytes(0),
                     (uint8_t *)fifo_of(seg, 0, 1));
    assert_ptr_equal((uint8_t *)fifo_of(seg, 0, 1) + fifo_bytes(1),
                     (uint8_t *)fifo_of(seg, 1, 0));
    assert_ptr_equal((uint8_t *)fifo_of(seg, 1, 1) + fifo_bytes(1), seg + end);
}

/* The message queue: a ring that doubles, keeping order across the wrap. */
static void message_queue(void **state) {
    msgq q = {0};
    size_t next_in = 0, next_out = 0;

    (void)state;
    /* Push and pop at different rates so the head wraps while it grows. */
    for (int round = 0; round < 50; round++) {
        for (int k = 0; k < 3; k++) {
            msg m = {.len = next_in++};
            assert_int_equal(q_push(&q, &m), 0);
        }
        for (int k = 0; k < 2; k++) {
            msg *m = q_front(&q);
            assert_non_null(m);
            assert_int_equal(m->len, next_out++);
            q_pop(&q);
        }
        assert_true((q.cap & (q.cap - 1)) == 0);
        assert_int_equal(q.count, next_in - next_out);
    }
    while (q.count > 0) {
        assert_int_equal(q_front(&q)->len, next_out++);
        q_pop(&q);
    }
    assert_null(q_front(&q));
    assert_int_equal(next_out, next_in);
    free(q.v);
}

/*
 * A segment's name is "/hvd-" HMAC-SHA256(secret, "hvd-shm|" job id in
 * hex) cut to 32 hex digits, "-" rank: the job id appears nowhere in it,
 * another secret or job id gives another name, and the value is the one
 * `printf 'hvd-shm|%s' 000102...0f | openssl dgst -sha256 -hmac s3cret`
 * gives (test scripts compute it so, with python3's hmac).
 */
static void segment_names(void **state) {
    uint8_t job[HVD_JOB_ID_LEN], other[HVD_JOB_ID_LEN];
    char hex[33], a[96], b[96], c[96];

    (void)state;
    for (int i = 0; i < HVD_JOB_ID_LEN; i++)
        job[i] = (uint8_t)i;
    memcpy(other, job, sizeof(other));
    other[HVD_JOB_ID_LEN - 1] ^= 1;
    hvd_job_id_format(job, hex);
    assert_int_equal(hvd_shm_segment_name("s3cret", job, 3, a, sizeof(a)), 0);
    assert_string_equal(a, "/hvd-1a13d640c8da323998888d94d577c186-3");
    assert_null(strstr(a, hex));
    assert_null(strstr(a, "0001020304"));
    assert_int_equal(hvd_shm_segment_name("s3cres", job, 3, b, sizeof(b)), 0);
    assert_int_equal(hvd_shm_segment_name("s3cret", other, 3, c, sizeof(c)), 0);
    assert_string_not_equal(a, b);
    assert_string_not_equal(a, c);
    assert_int_equal(hvd_shm_segment_name("s3cret", job, 12, b, sizeof(b)), 0);
    assert_int_equal(strncmp(a, b, strlen(a) - 1), 0);
    assert_string_equal(b + strlen(a) - 1, "12");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(one_cell, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(wrap_around, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(full_fifo, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(many_cells, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(upto, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(control_send_buffered, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(length_mismatch, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(ring_layout, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(inline_lengths, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(whole_or_pieces, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(malformed_cell, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(ring_only_sleepers, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(sleeper_woken, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(sleeper_woken_membar, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(sleeper_gives_membar_up, pair_setup,
                                        pair_teardown),
        cmocka_unit_test(message_queue),
        cmocka_unit_test(segment_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
