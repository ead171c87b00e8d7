/*
 * The shared-memory transport's FIFOs (see shm_internal.h): writing queued
 * messages into a peer's FIFO (hvd_shm_push), taking what arrived into
 * the posted receives, one pass over every peer with work
 * (hvd_shm_pass), and reading a peer's memory with process_vm_readv
 * (hvd_shm_cma_read).
 */
#include "transport/shm/shm_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"

/* Reads len bytes at remote of peer's memory into buf. */
hvd_status hvd_shm_cma_read(shm *tp, int peer, void *buf, uint64_t remote,
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
        hvd_shm_describe(tp, peer, who, sizeof(who));
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
            return hvd_shm_fail_with(tp, (hvd_status)pst, h->culprit, tp->rank,
                                     text);
        }
        if (err == ESRCH || hvd_shm_peer_exited(&tp->peers[peer]))
            return hvd_tp_failf(
                hvd_shm_fail_with, tp, tp->rank, HVD_ERR_PEER_LOST, peer,
                "%s exited or was killed while rank %d read from it", who,
                tp->rank);
        errno = err;
        return hvd_tp_failf(
            hvd_shm_fail_with, tp, tp->rank, HVD_ERR_TRANSPORT, peer,
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
        hvd_shm_complete(m->req, HVD_OK);
    if (m->owned)
        free(m->buf);
    pe->pending--;
}

/* 1 if the FIFO f to pe on ch has a free cell. The receiver's head is
 * read only when the last value read says the FIFO is full: its line then
 * moves between the cores once per FIFO's worth of cells, not per cell. */
static int has_room(speer *pe, fifo *f, int ch, uint32_t cap) {
    if (pe->tail[ch] - pe->head_seen[ch] < cap)
        return 1;
    pe->head_seen[ch] = atomic_load_explicit(&f->head, memory_order_acquire);
    return pe->tail[ch] - pe->head_seen[ch] < cap;
}

/* Writes message m, whole, into cell c: a short one's first bytes in the
 * header line (cell_inline_of), the rest in the payload. */
static void write_whole(cell *c, const msg *m) {
    size_t n = m->len, k = cell_inline_of(n);
    c->kind = CELL_DATA;
    c->len = (uint32_t)n;
    if (k > 0)
        memcpy(c->inl, m->buf, k);
    if (n > k)
        memcpy(payload_of(c), m->buf + k, n - k);
}

/* Writes into cell c the next piece of m, a message longer than a cell,
 * or its address (CELL_RNDV); returns the bytes it covers. */
static size_t write_piece(shm *tp, cell *c, int ch, msg *m) {
    size_t cbytes = cell_bytes_of[ch];
    size_t n = m->len - m->off < cbytes ? m->len - m->off : cbytes;

    c->msg_len = m->len;
    c->first = m->off == 0;
    if (m->off == 0 && m->len > tp->eager_max && tp->cma) {
        c->kind = CELL_RNDV;
        c->addr = (uint64_t)(uintptr_t)m->buf;
        c->len = 0;
        return m->len;
    }
    c->kind = CELL_PART;
    c->len = (uint32_t)n;
    memcpy(payload_of(c), m->buf + m->off, n);
    return n;
}

/* Writes what fits of the messages queued for peer p on ch; retires the
 * CELL_RNDV ones p has read. Returns 1 if anything moved. */
int hvd_shm_push(shm *tp, int p, int ch) {
    speer *pe = &tp->peers[p];
    fifo *f = fifo_of(pe->seg, tp->my_local, ch);
    uint32_t cap = ncells_of[ch];
    size_t whole_max = cell_bytes_of[ch];
    int wrote = 0, moved = 0;
    msg *m;

    while ((m = q_front(&pe->sendq[ch])) != NULL && has_room(pe, f, ch, cap)) {
        cell *c = cell_of(f, ch, pe->tail[ch]);
        int rndv = 0;
        if (m->off == 0 && m->len <= whole_max &&
            !(m->len > tp->eager_max && tp->cma)) {
            write_whole(c, m);
            m->off = m->len;
        } else {
            rndv = m->off == 0 && m->len > tp->eager_max && tp->cma;
            m->off += write_piece(tp, c, ch, m);
        }
        if (rndv)
            m->ack_id = ++pe->rndv_sent[ch];
        atomic_store_explicit(&c->seq, ++pe->tail[ch], memory_order_release);
        wrote = 1;
        if (rndv && q_push(&pe->ackq[ch], m) != 0) {
            hvd_tp_failf(hvd_shm_fail_with, tp, tp->rank, HVD_ERR_NO_MEMORY, -1,
                         "out of memory");
            return 1;
        }
        if (m->off == m->len) {
            if (!rndv)
                retire(pe, m);
            q_pop(&pe->sendq[ch]);
        }
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
        hvd_shm_notify(pe->seg, tp->membar);
        pe->last_active = hvd_coarse_ns();
    }
    return wrote || moved;
}

/* Fails the transport: peer p wrote a cell that does not fit the receive
 * posted for it (m): a mismatch of the ranks' calls, or a malformed cell. */
static void bad_cell(shm *tp, int p, const cell *c, const msg *m, uint64_t sent,
                     int ch, int malformed) {
    char who[160];

    hvd_shm_describe(tp, p, who, sizeof(who));
    if (malformed)
        hvd_tp_failf(hvd_shm_fail_with, tp, tp->rank, HVD_ERR_PROTOCOL, p,
                     "%s wrote a malformed cell (kind %u, %u bytes, %zu "
                     "at most) into rank %d's FIFO",
                     who, (unsigned)c->kind, (unsigned)c->len,
                     (size_t)cell_bytes_of[ch], tp->rank);
    else
        hvd_tp_failf(hvd_shm_fail_with, tp, tp->rank, HVD_ERR_MISMATCH, p,
                     "%s sent a message of %llu bytes where rank %d expected "
                     "%s%zu: ranks called collectives in different orders or "
                     "with different counts",
                     who, (unsigned long long)sent, tp->rank,
                     m->upto ? "at most " : "", m->len);
}

/* Takes cell c from peer p into m; returns 0, or -1 if the transport
 * failed (the cell does not fit m, or a process_vm_readv failed). */
static int take(shm *tp, int p, int ch, cell *c, msg *m, fifo *f) {
    /* Each field is read once: what is checked is what is used. */
    size_t cbytes = cell_bytes_of[ch], n = c->len;
    unsigned kind = c->kind;

    if (kind == CELL_DATA) {
        size_t k = cell_inline_of(n);
        if (n > cbytes) {
            bad_cell(tp, p, c, m, 0, ch, 1);
            return -1;
        }
        if (m->off != 0 || (m->upto ? n > m->len : n != m->len)) {
            bad_cell(tp, p, c, m, n, ch, 0);
            return -1;
        }
        if (k > 0)
            memcpy(m->buf, c->inl, k);
        if (n > k)
            memcpy(m->buf + k, payload_of(c), n - k);
        m->len = m->off = n;
        return 0;
    }
    if ((kind != CELL_PART && kind != CELL_RNDV) ||
        (kind == CELL_PART && n > cbytes)) {
        bad_cell(tp, p, c, m, 0, ch, 1);
        return -1;
    }
    uint64_t msg_len = c->msg_len, addr = c->addr;
    if (m->upto && c->first && m->off == 0 && msg_len <= m->len)
        m->len = msg_len; /* what the pieces to come add up to */
    if (c->first != (m->off == 0) || msg_len != m->len ||
        (kind == CELL_PART && n > m->len - m->off)) {
        bad_cell(tp, p, c, m, msg_len, ch, 0);
        return -1;
    }
    if (kind == CELL_RNDV) {
        if (hvd_shm_cma_read(tp, p, m->buf, addr, m->len) != HVD_OK)
            return -1;
        m->off = m->len;
        atomic_fetch_add_explicit(&f->acked, 1, memory_order_release);
        return 0;
    }
    memcpy(m->buf + m->off, payload_of(c), n);
    m->off += n;
    return 0;
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
        if (take(tp, p, ch, c, m, f) != 0)
            return 1;
        atomic_store_explicit(&f->head, ++pe->rx_head[ch],
                              memory_order_release);
        moved = 1;
        if (m->off == m->len) {
            m->req->got = m->len;
            hvd_shm_complete(m->req, HVD_OK);
            pe->pending--;
            q_pop(&pe->recvq[ch]);
        }
    }
    if (moved) {
        /* Cells freed, or a CELL_RNDV read: the sender may wait on them. */
        hvd_shm_notify(pe->seg, tp->membar);
        pe->last_active = hvd_coarse_ns();
    }
    return moved;
}

/* One pass over every peer with work. Returns 1 if anything moved. */
int hvd_shm_pass(shm *tp) {
    int moved = 0;
    for (int p = 0; p < tp->size && tp->failure.status == HVD_OK; p++) {
        speer *pe = &tp->peers[p];
        if (pe->pending == 0)
            continue;
        for (int ch = 0; ch < NCHANNELS && tp->failure.status == HVD_OK; ch++) {
            if (pe->recvq[ch].count > 0)
                moved |= pull(tp, p, ch);
            if (pe->sendq[ch].count > 0 || pe->ackq[ch].count > 0)
                moved |= hvd_shm_push(tp, p, ch);
        }
    }
    return moved;
}
