/*
 * The engine (engine.h): the data a step message carries (docs/design.md,
 * "Steps"), of every kind of operation, and running it where it arrives.
 * Every rank sends every other rank its part of a step, so one exchange
 * of parts is already each of the collectives: an allreduce (each rank
 * reduces every part), an allgather (each rank puts every part in its
 * place), a broadcast (only the root's part holds data), a reduce-scatter
 * (each rank reduces its own block of every part) and an alltoall (each
 * part holds its sender's counts and its sendbuf; each rank takes its
 * block of every part); a barrier is the exchange itself (its part is
 * empty). Nothing else goes on the wire for them. From PER_PEER_MIN, the
 * part of a reduce-scatter or an alltoall holds only what the rank it
 * goes to needs, so it differs from one destination to the next: a step
 * that carries one is written for each peer (engine_step.c). A larger
 * alltoall carries its counts alone, which spares its collective an
 * exchange.
 */

#include "api/runtime/engine_state.h"

/* Carried tensors start at multiples of 8 bytes in the message (the body
 * starts so aligned: its buffers come from malloc), so that each is read
 * where it lies, as its dtype needs. */
static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Bytes of the data an operation of d gives (its buffers, one after the
 * other: each a whole number of elements, so each is aligned as its
 * dtype needs when the first is). */
static size_t data_bytes(const hvd_opdesc *d) {
    return (size_t)hvd_opdesc_total(d) * hvd_dtype_size(d->dtype);
}

/* An alltoall's part starts with a word that says what follows the
 * sender's counts (one per rank, after it): nothing (A2A_COUNTS), the
 * whole sendbuf (A2A_ALL) or the block for the rank it goes to
 * (A2A_BLOCK). */
enum { A2A_COUNTS = 0, A2A_ALL = 1, A2A_BLOCK = 2 };

static size_t a2a_head(const hvd_engine *eng) {
    return ((size_t)eng->size + 1) * sizeof(uint64_t);
}

static uint64_t a2a_layout(const uint8_t *part) {
    uint64_t w;

    memcpy(&w, part, sizeof(w));
    return w;
}

/*
 * The data from which a reduce-scatter's or an alltoall's part holds only
 * what its destination needs, in a message of its own for each peer (at
 * np 2, half of the whole buffer every peer got before). Below it the
 * whole buffer goes to every peer in one message: writing a message for
 * each costs more than the bytes it saves (np 2, shared memory: a 512 B
 * reduce-scatter 1.37 -> 1.70 us written per peer, 8 KiB 3.57 -> 3.20;
 * TCP 8 KiB 20.2 -> 15.5; docs/benchmarks.md, "Issue 35: parts for each
 * peer").
 */
#define PER_PEER_MIN 4096

/* Whether a reduce-scatter of d is cut per peer: d is the same on every
 * rank, so every rank tells from it alone. */
static int rs_per_peer(const hvd_opdesc *d) {
    return data_bytes(d) >= PER_PEER_MIN;
}

/* Count k of an alltoall's part. */
static uint64_t a2a_count(const uint8_t *part, size_t k) {
    uint64_t c;

    memcpy(&c, part + (k + 1) * sizeof(c), sizeof(c));
    return c;
}

/*
 * The largest part of a kind other than an allreduce that a step carries:
 * an eighth of the step's budget (8 KiB by default) where the control
 * channel is shared memory, half of it (32 KiB) where it is a network
 * (cfg.carry_part_max, hvd_setup_engine_config). A part goes to every
 * peer and is copied three times on its way (into the message, out of the
 * control channel, into the result); in memory, past a few KiB that costs
 * more than the collective's own exchange of what each rank needs
 * (measured at np 2: a 4 KiB part was faster carried, a 16 KiB one slower;
 * docs/benchmarks.md, "Issue 35: every collective's small messages"), but
 * over TCP each exchange the collective saves costs tens of microseconds
 * (an 8 KiB alltoall: 18 us carried, over 70 not). An allreduce gains
 * more (its collective is two exchanges and a reduction) and keeps the
 * whole budget.
 */
static size_t other_part_max(const hvd_engine *eng) {
    return eng->cfg.carry_part_max;
}

/*
 * A broadcast's part is the root's alone (the others' are empty): it is
 * copied into one message and out at each peer, where the parts of the
 * other kinds go from every rank to every rank. Carried, it saves its
 * collective's round trip up to half the step's budget (32 KiB) on shared
 * memory too (np 2: 16 KiB 2.1-2.4 us carried against 2.8-3.9 us not,
 * 32 KiB 3.7-4.5 against 4.0-5.8; 64 KiB the same either way;
 * docs/benchmarks.md, "Issue 35: a broadcast carried further").
 */
static size_t broadcast_part_max(const hvd_engine *eng) {
    size_t half = eng->cfg.step_carry_bytes / 2;
    return half > eng->cfg.carry_part_max ? half : eng->cfg.carry_part_max;
}

/*
 * What of an alltoall the limit holds: over a network its data alone, so
 * that a buffer of the limit's size is carried with its counts (np 2 TCP,
 * 32 KiB: 20-22 us carried against 30-40 us as a step, an exchange of
 * counts and one of data; docs/benchmarks.md, "Issue 35: an alltoall's
 * counts"); in memory its data and counts (8 KiB of data carried measured
 * slower than its own collective at np 2). The whole sendbuf either way,
 * also where its parts hold only each peer's block (PER_PEER_MIN): held
 * against the limit per peer, 8-16 KiB alltoalls and reduce-scatters
 * were carried on shared memory and measured slower (np 2 ratio 1.54 ->
 * 1.38 at 8 KiB, 1.56 -> 1.40 for a 16 KiB reduce-scatter).
 */
static size_t alltoall_limited(const hvd_engine *eng, const hvd_request *req) {
    size_t data = data_bytes(&req->desc);

    return pad8(eng->cfg.carry_counts_free ? data : a2a_head(eng) + data);
}

int hvd_eng_carries(const hvd_engine *eng, const hvd_request *req) {
    const hvd_opdesc *d = &req->desc;

    if (eng->size < 2 || d->pset != 0 || d->mem != HVD_MEM_HOST ||
        data_bytes(d) > eng->cfg.fusion_tensor_max)
        return 0;
    switch (d->kind) {
    case HVD_KIND_ALLREDUCE:
        return d->op != HVD_ADASUM;
    case HVD_KIND_BROADCAST:
        return hvd_eng_part_bytes(eng, req) <= broadcast_part_max(eng);
    case HVD_KIND_ALLGATHER:
    case HVD_KIND_REDUCESCATTER: /* the whole buffer (alltoall_limited) */
        return pad8(data_bytes(d)) <= other_part_max(eng);
    case HVD_KIND_ALLTOALL:
        return alltoall_limited(eng, req) <= other_part_max(eng);
    case HVD_KIND_BARRIER: /* no data: listed, so that its step is lone */
        return 1;
    default:
        return 0;
    }
}

/*
 * An alltoall too large to carry (or that the step has no room for) still
 * carries its counts, where every rank's would reach every rank anyway:
 * its collective then needs no exchange of counts of its own (it runs
 * where the parts arrive, hvd_eng_run_carried). A step without room for
 * them either (HVD_STEP_CARRY_BYTES=0) carries nothing of it.
 */
int hvd_eng_carries_counts(const hvd_engine *eng, const hvd_request *req) {
    const hvd_opdesc *d = &req->desc;

    return d->kind == HVD_KIND_ALLTOALL && eng->size >= 2 && d->pset == 0 &&
           d->mem == HVD_MEM_HOST;
}

int hvd_eng_part_per_peer(const hvd_request *req) {
    const hvd_opdesc *d = &req->desc;

    if (d->kind == HVD_KIND_REDUCESCATTER)
        return rs_per_peer(d);
    return d->kind == HVD_KIND_ALLTOALL && !req->counts_only &&
           data_bytes(d) >= PER_PEER_MIN;
}

/* Where rank dest's block of buffer i of a reduce-scatter d lies (the
 * collective's cut: hvd_part_range of whole rows), in elements. */
static void rs_block(const hvd_opdesc *d, size_t i, int size, int dest,
                     size_t *start, size_t *count) {
    size_t unit = (size_t)hvd_opdesc_unit(d);

    if (unit == 0)
        unit = 1;
    hvd_part_range((size_t)d->counts[i] / unit, (size_t)size, (size_t)dest,
                   start, count);
    *start *= unit;
    *count *= unit;
}

/* Bytes of the blocks of rank dest of every buffer of reduce-scatter d. */
static size_t rs_bytes(const hvd_opdesc *d, int size, int dest) {
    size_t sum = 0, b, cnt;

    for (size_t i = 0; i < d->ncounts; i++) {
        rs_block(d, i, size, dest, &b, &cnt);
        sum += cnt;
    }
    return sum * hvd_dtype_size(d->dtype);
}

size_t hvd_eng_part_bytes_to(const hvd_engine *eng, const hvd_request *req,
                             int dest) {
    const hvd_opdesc *d = &req->desc;
    size_t es = hvd_dtype_size(d->dtype);

    if ((d->kind == HVD_KIND_BROADCAST && d->root != eng->rank) ||
        d->kind == HVD_KIND_BARRIER)
        return 0;
    if (d->kind == HVD_KIND_ALLTOALL) {
        if (req->counts_only)
            return a2a_head(eng);
        return pad8(a2a_head(eng) + (hvd_eng_part_per_peer(req)
                                         ? (size_t)req->counts[dest] * es
                                         : data_bytes(d)));
    }
    if (d->kind == HVD_KIND_REDUCESCATTER && rs_per_peer(d))
        return pad8(rs_bytes(d, eng->size, dest));
    return pad8(data_bytes(d));
}

size_t hvd_eng_part_bytes(const hvd_engine *eng, const hvd_request *req) {
    size_t most = 0;

    if (!hvd_eng_part_per_peer(req))
        return hvd_eng_part_bytes_to(eng, req, eng->rank);
    for (int dest = 0; dest < eng->size; dest++) {
        size_t n = hvd_eng_part_bytes_to(eng, req, dest);
        most = n > most ? n : most;
    }
    return most;
}

void hvd_eng_part_write(const hvd_engine *eng, const hvd_request *req, int dest,
                        uint8_t *out) {
    const hvd_opdesc *d = &req->desc;
    size_t es = hvd_dtype_size(d->dtype), off = 0;
    size_t len = hvd_eng_part_bytes_to(eng, req, dest);

    if (len == 0)
        return;
    if (d->kind == HVD_KIND_ALLTOALL) {
        /* The layout, the counts, then what it says (the blocks lie in
         * send[0] in rank order). */
        uint64_t layout = req->counts_only             ? A2A_COUNTS
                          : hvd_eng_part_per_peer(req) ? A2A_BLOCK
                                                       : A2A_ALL;
        size_t from = 0, b = layout == A2A_ALL ? data_bytes(d) : 0;
        memcpy(out, &layout, sizeof(layout));
        memcpy(out + sizeof(layout), req->counts,
               (size_t)eng->size * sizeof(uint64_t));
        off = a2a_head(eng);
        if (layout == A2A_BLOCK) {
            for (int k = 0; k < dest; k++)
                from += (size_t)req->counts[k] * es;
            b = (size_t)req->counts[dest] * es;
        }
        if (b > 0)
            memcpy(out + off, (const uint8_t *)req->send[0] + from, b);
        off += b;
    } else if (d->kind == HVD_KIND_REDUCESCATTER && rs_per_peer(d)) {
        /* dest's block of each buffer, one after the other. */
        for (int i = 0; i < req->n; i++) {
            size_t start, cnt;
            rs_block(d, (size_t)i, eng->size, dest, &start, &cnt);
            if (cnt > 0)
                memcpy(out + off, (const uint8_t *)req->send[i] + start * es,
                       cnt * es);
            off += cnt * es;
        }
    } else if (d->kind == HVD_KIND_BROADCAST) {
        if (data_bytes(d) > 0)
            memcpy(out, req->recv[0], data_bytes(d));
        off = data_bytes(d);
    } else {
        for (int i = 0; i < req->n; i++) {
            size_t b = (size_t)req->counts[i] * es;
            if (b > 0)
                memcpy(out + off, req->send[i], b);
            off += b;
        }
    }
    memset(out + off, 0, len - off);
}

size_t hvd_eng_part_len(const hvd_engine *eng, const hvd_opdesc *d, int r,
                        const uint8_t *data, size_t avail) {
    size_t es = hvd_dtype_size(d->dtype), sum = 0, me = (size_t)eng->rank;

    switch (d->kind) {
    case HVD_KIND_BARRIER:
        return 0;
    case HVD_KIND_BROADCAST:
        return r == d->root ? pad8(data_bytes(d)) : 0;
    case HVD_KIND_ALLTOALL: {
        /* Its length is in it: the counts it starts with, and whether its
         * data follows. Counts alone may say more than came (the
         * collective moves it), not more than memory could hold. */
        if (avail < a2a_head(eng))
            return SIZE_MAX;
        uint64_t layout = a2a_layout(data);
        size_t most = SIZE_MAX / 2 / es, left = (avail - a2a_head(eng)) / es;
        if (layout > A2A_BLOCK)
            return SIZE_MAX;
        for (int k = 0; k < eng->size; k++) {
            uint64_t c = a2a_count(data, (size_t)k);
            if (c > most || sum + c > most)
                return SIZE_MAX;
            sum += (size_t)c;
        }
        size_t n = layout == A2A_ALL     ? sum
                   : layout == A2A_BLOCK ? (size_t)a2a_count(data, me)
                                         : 0;
        if (n > left)
            return SIZE_MAX;
        return pad8(a2a_head(eng) + n * es);
    }
    case HVD_KIND_REDUCESCATTER:
        if (rs_per_peer(d))
            return pad8(rs_bytes(d, eng->size, eng->rank));
        return pad8(data_bytes(d));
    default:
        return pad8(data_bytes(d));
    }
}

/* out = the reduction of count elements at byte off of every rank's part,
 * in rank order (carried parts come only from jobs of two or more ranks:
 * hvd_eng_carries). */
static void reduce_parts(const hvd_engine *eng, const resp *r, void *out,
                         size_t off, size_t count) {
    hvd_reduce(out, r->parts[0] + off, r->parts[1] + off, count, r->desc.dtype,
               r->desc.op);
    for (int k = 2; k < eng->size; k++)
        hvd_reduce(out, out, r->parts[k] + off, count, r->desc.dtype,
                   r->desc.op);
    if (r->desc.op == HVD_AVERAGE)
        hvd_reduce_scale_div(out, count, r->desc.dtype, eng->size);
}

/* An allreduce (grouped or not): each buffer reduced from every rank's
 * part in rank order, the same bit for bit on every rank. */
static void run_allreduce(const hvd_engine *eng, const resp *r,
                          hvd_request *req) {
    size_t es = hvd_dtype_size(r->desc.dtype), off = 0;

    for (int i = 0; i < req->n; i++) {
        size_t count = (size_t)req->counts[i];
        void *out = req->recv[i];
        reduce_parts(eng, r, out, off, count);
        off += count * es;
    }
}

/* A reduce-scatter (grouped or not): this rank's block of each buffer
 * (the collective's cut, rs_block), reduced from every rank's part in
 * rank order: each part holds the whole buffers, or (rs_per_peer) those
 * blocks alone, one after the other. */
static void run_reducescatter(const hvd_engine *eng, const resp *r,
                              hvd_request *req) {
    size_t es = hvd_dtype_size(r->desc.dtype), off = 0;
    int cut = rs_per_peer(&r->desc);

    for (int i = 0; i < req->n; i++) {
        size_t start, cnt;
        rs_block(&r->desc, (size_t)i, eng->size, eng->rank, &start, &cnt);
        reduce_parts(eng, r, req->recv[i], off + (cut ? 0 : start * es), cnt);
        off += (cut ? cnt : (size_t)req->counts[i]) * es;
    }
}

/* An allgather (grouped or not): rank k's part of buffer i goes to block
 * k of recv[i]. */
static void run_allgather(const hvd_engine *eng, const resp *r,
                          hvd_request *req) {
    size_t es = hvd_dtype_size(r->desc.dtype), off = 0;

    for (int i = 0; i < req->n; i++) {
        size_t b = (size_t)req->counts[i] * es;
        for (int k = 0; k < eng->size && b > 0; k++)
            memcpy((uint8_t *)req->recv[i] + (size_t)k * b, r->parts[k] + off,
                   b);
        off += b;
    }
}

/* An alltoall: the block every rank's part holds for this rank, in rank
 * order; a recvbuf too small for them fails this rank's request alone (no
 * other rank waits on it), with the collective's sentence. */
static hvd_status run_alltoall(hvd_engine *eng, const resp *r, hvd_request *req,
                               char *why, size_t whylen) {
    size_t es = hvd_dtype_size(r->desc.dtype), got = 0, p = (size_t)eng->size;
    size_t me = (size_t)eng->rank;

    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < p; k++) {
            size_t c = (size_t)a2a_count(r->parts[k], me), before = 0;
            if (pass == 0) {
                got += c;
                continue;
            }
            for (size_t j = 0; j < me && a2a_layout(r->parts[k]) == A2A_ALL;
                 j++)
                before += (size_t)a2a_count(r->parts[k], j);
            if (c > 0)
                memcpy((uint8_t *)req->recv[0] + got * es,
                       r->parts[k] + a2a_head(eng) + before * es, c * es);
            if (req->recv_counts != NULL)
                req->recv_counts[k] = c;
            got += c;
        }
        if (pass == 0 && got > req->recv_cap) {
            hvd_error_set(HVD_ERR_INVALID_ARG,
                          "'%s': %zu elements arrive at rank %d but its "
                          "recvbuf holds %llu: pass a larger recvcap (the "
                          "data was dropped)",
                          r->name, got, eng->rank,
                          (unsigned long long)req->recv_cap);
            snprintf(why, whylen, "%s", hvd_error_get());
            return HVD_ERR_INVALID_ARG;
        }
        got = 0;
    }
    return HVD_OK;
}

static const char *event_of(hvd_kind kind) {
    switch (kind) {
    case HVD_KIND_BROADCAST:
        return "BROADCAST";
    case HVD_KIND_ALLGATHER:
        return "ALLGATHER";
    case HVD_KIND_ALLTOALL:
        return "ALLTOALL";
    case HVD_KIND_REDUCESCATTER:
        return "REDUCESCATTER";
    case HVD_KIND_BARRIER:
        return "BARRIER";
    default:
        return "ALLREDUCE";
    }
}

/* 1 if every rank's part of alltoall r holds its data, not its counts
 * alone. */
static int a2a_whole(const hvd_engine *eng, const resp *r) {
    for (int k = 0; k < eng->size; k++)
        if (a2a_layout(r->parts[k]) == A2A_COUNTS)
            return 0;
    return 1;
}

hvd_status hvd_eng_run_carried(hvd_engine *eng, const resp *r,
                               hvd_request *req) {
    hvd_status outcome = HVD_OK;
    char why[HVD_ERROR_MAX] = "";

    if (r->desc.kind == HVD_KIND_ALLTOALL && !a2a_whole(eng, r))
        return hvd_eng_run_other(eng, r); /* its counts known from r->parts */

    if (req == NULL)
        req = hvd_namemap_get_h(&eng->by_name, r->name, r->hash);
    if (req == NULL)
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "rank %d has no request '%s' to run", eng->rank,
                             r->name);
    int64_t t = eng->timeline != NULL ? hvd_now_ns() : 0;
    hvd_timeline_end(eng->timeline, r->name, t); /* QUEUE */
    hvd_timeline_begin(eng->timeline, r->name, event_of(r->desc.kind), t,
                       "\"transport\": \"control\", \"algorithm\": "
                       "\"step\", \"tensors\": 1");
    switch (r->desc.kind) {
    case HVD_KIND_BROADCAST:
        if (eng->rank != r->desc.root && data_bytes(&r->desc) > 0)
            memcpy(req->recv[0], r->parts[r->desc.root], data_bytes(&r->desc));
        break;
    case HVD_KIND_ALLGATHER:
        run_allgather(eng, r, req);
        break;
    case HVD_KIND_REDUCESCATTER:
        run_reducescatter(eng, r, req);
        break;
    case HVD_KIND_ALLTOALL:
        outcome = run_alltoall(eng, r, req, why, sizeof(why));
        break;
    case HVD_KIND_BARRIER: /* that every rank offered it is the barrier */
        break;
    default:
        run_allreduce(eng, r, req);
        break;
    }
    if (eng->timeline != NULL)
        hvd_timeline_end(eng->timeline, r->name, hvd_now_ns());
    hvd_eng_complete(eng, req, outcome, outcome != HVD_OK ? why : NULL);
    return HVD_OK;
}
