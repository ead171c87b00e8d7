/* The engine (engine.h): running a cycle's responses: fused host allreduces,
 * the other collectives, device tensors. */

#include "api/runtime/engine_state.h"

/* ------------------------------------------------------------------ */
/* Running responses                                                   */

static hvd_status fusion_room(hvd_engine *eng, size_t bytes) {
    if (bytes > eng->fusion_cap) {
        size_t cap = hvd_grow_cap(bytes, eng->cfg.fusion_threshold);
        void *p = malloc(cap);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY,
                                 "out of memory for a %zu-byte fusion buffer",
                                 cap);
        free(eng->fusion);
        eng->fusion = p;
        eng->fusion_cap = cap;
    }
    return HVD_OK;
}

/* Now, if a timeline is written (clock reads cost nothing otherwise). */
static int64_t stamp(const hvd_engine *eng) {
    return eng->timeline != NULL ? hvd_now_ns() : 0;
}

/* Timeline args of a collective: where it runs and how (the plan it runs
 * with), written only while a timeline is. */
static const char *plan_args(const hvd_engine *eng, const hvd_plan *plan,
                             char *out, size_t outlen, int ntensors,
                             size_t bytes) {
    if (eng->timeline == NULL)
        return NULL;
    snprintf(out, outlen,
             "\"transport\": \"%s\", \"algorithm\": \"%s\", "
             "\"chunk\": %zu, \"tensors\": %d, \"bytes\": %zu",
             hvd_plan_transport(plan), hvd_algo_name(plan->algo), plan->chunk,
             ntensors, bytes);
    return out;
}

/* ------------------------------------------------------------------ */
/* Device tensors (api/runtime/devexec.h) */

/* A fence may have been reached: wakes the engine (any thread; a CUDA
 * host callback). */
void hvd_eng_dev_wake(void *arg) {
    hvd_engine *eng = arg;

    if (eng->tp != NULL) {
        eng->tp->ops->wake(eng->tp);
        return;
    }
    pthread_mutex_lock(&hvd_eng_lock);
    eng->gpu_woken = 1;
    pthread_cond_broadcast(&hvd_eng_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
}

static hvd_status devq_push(hvd_engine *eng, hvd_request *req, uint64_t seq) {
    if (eng->devq_n == eng->devq_cap) {
        size_t cap = eng->devq_cap ? 2 * eng->devq_cap : 64;
        devwait *q = malloc(cap * sizeof(*q));
        if (q == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        for (size_t i = 0; i < eng->devq_n; i++)
            q[i] = eng->devq[(eng->devq_head + i) % eng->devq_cap];
        free(eng->devq);
        eng->devq = q;
        eng->devq_cap = cap;
        eng->devq_head = 0;
    }
    eng->devq[(eng->devq_head + eng->devq_n) % eng->devq_cap] =
        (devwait){.req = req, .seq = seq};
    eng->devq_n++;
    return HVD_OK;
}

/* Completes the device requests whose fence the GPU has reached. */
hvd_status hvd_eng_dev_reap(hvd_engine *eng) {
    uint64_t done;
    hvd_status st;
    int64_t t;

    if (eng->devq_n == 0)
        return HVD_OK;
    st = hvd_devexec_poll(eng->dev, &done);
    if (st != HVD_OK)
        return st;
    t = stamp(eng);
    while (eng->devq_n > 0 && eng->devq[eng->devq_head].seq <= done) {
        hvd_request *req = eng->devq[eng->devq_head].req;
        eng->devq_head = (eng->devq_head + 1) % eng->devq_cap;
        eng->devq_n--;
        hvd_timeline_end(eng->timeline, req->name, t);
        hvd_eng_finish(eng, req, HVD_OK, NULL);
    }
    return HVD_OK;
}

/* 1 if hvd_eng_dev_reap has something to do (or an error to report). */
int hvd_eng_dev_ready(hvd_engine *eng) {
    uint64_t done;

    if (eng->devq_n == 0)
        return 0;
    return hvd_devexec_poll(eng->dev, &done) != HVD_OK ||
           done >= eng->devq[eng->devq_head].seq;
}

/* At the end: waits (bounded) for the device work still in flight. */
hvd_status hvd_eng_dev_drain(hvd_engine *eng) {
    int64_t deadline = hvd_now_ns() + eng->cfg.timeout_ns;

    for (;;) {
        hvd_status st = hvd_eng_dev_reap(eng);
        if (st != HVD_OK || eng->devq_n == 0)
            return st;
        if (hvd_now_ns() > deadline)
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "rank %d: the GPU did not finish '%s' "
                                 "within %.0f s of shutdown",
                                 eng->rank, eng->devq[eng->devq_head].req->name,
                                 (double)eng->cfg.timeout_ns / 1e9);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The job failed: so do the device requests in flight. */
void hvd_eng_dev_fail_all(hvd_engine *eng, hvd_status status,
                          const char *text) {
    while (eng->devq_n > 0) {
        hvd_request *req = eng->devq[eng->devq_head].req;
        eng->devq_head = (eng->devq_head + 1) % eng->devq_cap;
        eng->devq_n--;
        hvd_eng_finish(eng, req, status, text);
    }
}

/*
 * After a device operation was handed to the GPU (st == HVD_OK, fence
 * seq) or was refused: reqs (NULL entries: joined) then wait for the fence,
 * or fail alike on every rank when the GPU cannot be used (not fatal).
 */
static hvd_status dev_handed(hvd_engine *eng, hvd_request **reqs, size_t n,
                             hvd_status st, int fatal, uint64_t seq,
                             const char *event, int64_t t, int ntensors,
                             size_t bytes) {
    char args[256], text[HVD_ERROR_MAX];

    eng->n_collectives++;
    if (st != HVD_OK && fatal)
        return st;
    if (st != HVD_OK) {
        snprintf(text, sizeof(text), "%s", hvd_error_get());
        for (size_t i = 0; i < n; i++)
            if (reqs[i] != NULL)
                hvd_eng_complete(eng, reqs[i], st, text);
        return HVD_OK;
    }
    snprintf(args, sizeof(args),
             "\"transport\": \"%s\", \"memory\": \"device\", "
             "\"tensors\": %d, \"bytes\": %zu",
             hvd_devexec_path(eng->dev), ntensors, bytes);
    for (size_t i = 0; i < n; i++) {
        if (reqs[i] == NULL)
            continue;
        hvd_timeline_begin(eng->timeline, reqs[i]->name, event, t, args);
        hvd_eng_retire(eng, reqs[i]);
        st = devq_push(eng, reqs[i], seq);
        if (st != HVD_OK)
            return st;
    }
    return HVD_OK;
}

/* Allreduces resps[first, last) of device tensors (one collective). */
static hvd_status run_device_allreduce(hvd_engine *eng, resp *rs, size_t first,
                                       size_t last) {
    const resp *r0 = &rs[first];
    size_t n = 0, k = 0, total = 0, nreq = last - first;
    hvd_request **reqs;
    uint64_t seq = 0;
    int fatal = 1;
    int64_t t = stamp(eng);
    hvd_status st;

    for (size_t i = first; i < last; i++) {
        n += rs[i].desc.ncounts;
        total += (size_t)hvd_opdesc_total(&rs[i].desc);
    }
    /* The tensors, then the requests after them in the same array. */
    size_t need = n * sizeof(hvd_dev_tensor) + nreq * sizeof(hvd_request *);
    if (need > eng->dtens_cap * sizeof(hvd_dev_tensor)) {
        size_t cap = need / sizeof(hvd_dev_tensor) + 1;
        hvd_dev_tensor *p = realloc(eng->dtens, cap * sizeof(*p));
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        eng->dtens = p;
        eng->dtens_cap = cap;
    }
    reqs = (hvd_request **)(void *)(eng->dtens + n);
    for (size_t i = first; i < last; i++) {
        hvd_request *req =
            rs[i].self_joined
                ? NULL
                : hvd_namemap_get_h(&eng->by_name, rs[i].name, rs[i].hash);
        if (!rs[i].self_joined && req == NULL)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "rank %d has no request '%s' to run",
                                 eng->rank, rs[i].name);
        reqs[i - first] = req;
        for (size_t c = 0; c < rs[i].desc.ncounts; c++)
            eng->dtens[k++] =
                (hvd_dev_tensor){.send = req != NULL ? req->send[c] : NULL,
                                 .recv = req != NULL ? req->recv[c] : NULL,
                                 .count = rs[i].desc.counts[c]};
    }
    st = hvd_devexec_allreduce(eng->dev, eng->dtens, n, r0->desc.dtype,
                               r0->desc.op, &seq, &fatal);
    return dev_handed(eng, reqs, nreq, st, fatal, seq, "ALLREDUCE", t, (int)n,
                      total * hvd_dtype_size(r0->desc.dtype));
}

/* A broadcast or allgather of device tensors. */
static hvd_status run_device_other(hvd_engine *eng, const resp *r,
                                   hvd_request *req) {
    uint64_t seq = 0;
    int fatal = 1;
    int64_t t = stamp(eng);
    hvd_status st;

    if (r->desc.kind == HVD_KIND_BROADCAST)
        st = hvd_devexec_broadcast(eng->dev, req->recv[0], req->counts[0],
                                   r->desc.dtype, r->desc.root, &seq, &fatal);
    else
        st = hvd_devexec_allgather(eng->dev, req->send[0], req->recv[0],
                                   req->counts[0], r->desc.dtype, &seq, &fatal);
    return dev_handed(
        eng, &req, 1, st, fatal, seq,
        r->desc.kind == HVD_KIND_BROADCAST ? "BROADCAST" : "ALLGATHER", t, 1,
        (size_t)req->counts[0] * hvd_dtype_size(r->desc.dtype));
}

/* The allreduce of op: Adasum's own algorithm, or the selector's plan. */
static hvd_status allreduce_op(const hvd_plan *plan, const void *send,
                               void *recv, size_t count, hvd_dtype dtype,
                               hvd_op op) {
    if (op == HVD_ADASUM)
        return hvd_adasum_allreduce(plan->base, send, recv, count, dtype);
    return hvd_coll_allreduce_planned(plan, send, recv, count, dtype, op);
}

/*
 * Allreduces resps[first, last): one collective, in place on the caller's
 * buffers for a single tensor, else through the fusion buffer.
 */
static hvd_status run_allreduce(hvd_engine *eng, resp *rs, size_t first,
                                size_t last) {
    const resp *r0 = &rs[first];
    hvd_comm *comm = hvd_eng_pset_comm(eng, &r0->desc);
    hvd_dtype dtype = r0->desc.dtype;
    size_t esize = hvd_dtype_size(dtype);
    /* With ranks joined, they contribute the neutral element, and an
     * average still divides by the job's size (Horovod's semantics). */
    hvd_op op = r0->desc.op;
    size_t total = 0, ntensors = 0;
    int64_t t;
    hvd_status st;
    hvd_plan plan;
    char buf[256];
    const char *args;

    for (size_t i = first; i < last; i++) {
        total += (size_t)hvd_opdesc_total(&rs[i].desc);
        ntensors += rs[i].desc.ncounts;
    }
    t = stamp(eng);
    for (size_t i = first; i < last; i++) {
        hvd_timeline_end(eng->timeline, rs[i].name, t); /* QUEUE */
    }
    if (r0->desc.mem == HVD_MEM_DEVICE)
        return run_device_allreduce(eng, rs, first, last);

    /* The path is the selector's choice for this size, made once: the
     * timeline shows it before the collective runs it. */
    hvd_coll_plan(comm, HVD_COLL_ALLREDUCE, total * esize, dtype, &plan);
    args =
        plan_args(eng, &plan, buf, sizeof(buf), (int)ntensors, total * esize);
    if (ntensors == 1 && !r0->self_joined) {
        hvd_request *req = hvd_namemap_get_h(&eng->by_name, r0->name, r0->hash);
        if (req == NULL)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "rank %d has no request '%s' to run",
                                 eng->rank, r0->name);
        void *recv = req->recv[0];
        hvd_timeline_begin(eng->timeline, r0->name, "ALLREDUCE", t, args);
        st = allreduce_op(&plan, req->send[0], recv, total, dtype, op);
        t = hvd_now_ns();
        hvd_timeline_end(eng->timeline, r0->name, t);
        eng->n_collectives++;
        if (st != HVD_OK)
            return st;
        hvd_eng_complete(eng, req, HVD_OK, NULL);
        return HVD_OK;
    }

    st = fusion_room(eng, total * esize > 0 ? total * esize : 1);
    if (st != HVD_OK)
        return st;
    uint8_t *fb = eng->fusion;
    size_t off = 0;
    for (size_t i = first; i < last; i++) {
        hvd_request *req =
            rs[i].self_joined
                ? NULL
                : hvd_namemap_get_h(&eng->by_name, rs[i].name, rs[i].hash);
        hvd_timeline_begin(eng->timeline, rs[i].name, "MEMCPY_IN_FUSION_BUFFER",
                           stamp(eng), NULL);
        for (size_t k = 0; k < rs[i].desc.ncounts; k++) {
            size_t n = (size_t)rs[i].desc.counts[k];
            if (req == NULL)
                hvd_reduce_fill_neutral(fb + off, n, dtype, op);
            else if (n > 0)
                memcpy(fb + off, req->send[k], n * esize);
            off += n * esize;
        }
        hvd_timeline_end(eng->timeline, rs[i].name, stamp(eng));
    }
    t = stamp(eng);
    for (size_t i = first; i < last; i++)
        hvd_timeline_begin(eng->timeline, rs[i].name, "ALLREDUCE", t, args);
    st = allreduce_op(&plan, fb, fb, total, dtype, op);
    eng->n_collectives++;
    t = stamp(eng);
    for (size_t i = first; i < last; i++)
        hvd_timeline_end(eng->timeline, rs[i].name, t);
    if (st != HVD_OK)
        return st;
    off = 0;
    for (size_t i = first; i < last; i++) {
        hvd_request *req =
            rs[i].self_joined
                ? NULL
                : hvd_namemap_get_h(&eng->by_name, rs[i].name, rs[i].hash);
        hvd_timeline_begin(eng->timeline, rs[i].name,
                           "MEMCPY_OUT_FUSION_BUFFER", stamp(eng), NULL);
        for (size_t k = 0; k < rs[i].desc.ncounts; k++) {
            size_t n = (size_t)rs[i].desc.counts[k];
            if (req != NULL && n > 0)
                memcpy(req->recv[k], fb + off, n * esize);
            off += n * esize;
        }
        hvd_timeline_end(eng->timeline, rs[i].name, stamp(eng));
        if (req != NULL)
            hvd_eng_complete(eng, req, HVD_OK, NULL);
    }
    return HVD_OK;
}

/*
 * What rank k sends to this rank of alltoall r (told[3k]), where it starts
 * in k's sendbuf (told[3k + 1]) and all k sends (told[3k + 2]), in bytes:
 * read from the counts each rank's step part carried (r->parts,
 * engine_carry.c: a word, then the counts), or else learned in a pairwise
 * exchange of what this rank tells (tell).
 */
static hvd_status alltoall_told(hvd_engine *eng, hvd_comm *comm, const resp *r,
                                uint64_t *tell, uint64_t *told) {
    size_t p = (size_t)comm->size, me = (size_t)comm->rank;
    uint64_t es = hvd_dtype_size(r->desc.dtype);
    size_t *hb = eng->a2a + 5 * p, *hd = hb + p, *hp = hd + p;

    if (r->parts != NULL) {
        for (size_t k = 0; k < p; k++) {
            uint64_t c, before = 0, all = 0;
            for (size_t j = 0; j < p; j++) {
                memcpy(&c, r->parts[k] + (j + 1) * sizeof(c), sizeof(c));
                if (j == me)
                    told[3 * k] = c * es;
                else if (j < me)
                    before += c;
                all += c;
            }
            told[3 * k + 1] = before * es;
            told[3 * k + 2] = all * es;
        }
        return HVD_OK;
    }
    for (size_t k = 0; k < p; k++) {
        hb[k] = 3 * sizeof(uint64_t);
        hd[k] = k * hb[k];
        hp[k] = me * hb[k];
    }
    return hvd_coll_alltoall(comm, tell, hb, hd, told, hb, hd, hp, hb[0] * p);
}

/*
 * An alltoall. Each rank knows what it sends; what it receives, where its
 * part starts in each peer's sendbuf, and how much every rank sends in all
 * (which picks the path the same way everywhere), it has from the step's
 * parts or learns first (alltoall_told). A receive buffer too small for
 * what comes fails this rank's request (*outcome, with a sentence) but the
 * exchange still runs, into the fusion buffer, so that no other rank
 * waits for it.
 */
static hvd_status run_alltoall(hvd_engine *eng, hvd_comm *comm, const resp *r,
                               hvd_request *req, hvd_status *outcome) {
    size_t p = (size_t)comm->size, es = hvd_dtype_size(r->desc.dtype);
    size_t *sb = eng->a2a, *sd = sb + p, *rb = sd + p, *rd = rb + p;
    size_t *po = rd + p;
    uint64_t *tell = eng->a2a_msg, *told = tell + 3 * p;
    size_t sent = 0, got = 0, everyone = 0;
    void *recvbuf = req->recv[0];
    hvd_status st;

    for (size_t k = 0; k < p; k++) {
        sb[k] = (size_t)req->counts[k] * es;
        sd[k] = sent;
        tell[3 * k] = sb[k];    /* what rank k gets from this rank */
        tell[3 * k + 1] = sent; /* and where it starts here */
        sent += sb[k];
    }
    for (size_t k = 0; k < p; k++)
        tell[3 * k + 2] = sent; /* all this rank sends */
    st = alltoall_told(eng, comm, r, tell, told);
    if (st != HVD_OK)
        return st;
    for (size_t k = 0; k < p; k++) {
        rb[k] = (size_t)told[3 * k];
        po[k] = (size_t)told[3 * k + 1];
        everyone += (size_t)told[3 * k + 2];
        rd[k] = got;
        got += rb[k];
    }
    if (got > req->recv_cap * es) {
        st = fusion_room(eng, got);
        if (st != HVD_OK)
            return st;
        recvbuf = eng->fusion;
        *outcome = hvd_error_set(
            HVD_ERR_INVALID_ARG,
            "'%s': %zu elements arrive at rank %d but its recvbuf holds "
            "%llu: pass a larger recvcap (the data was dropped)",
            r->name, got / es, eng->rank, (unsigned long long)req->recv_cap);
    }
    /* The path: by what a rank sends on average, the same everywhere. */
    st = hvd_coll_alltoall(comm, req->send[0], sb, sd, recvbuf, rb, rd, po,
                           everyone / p);
    if (st == HVD_OK && *outcome == HVD_OK && req->recv_counts != NULL)
        for (size_t k = 0; k < p; k++)
            req->recv_counts[k] = rb[k] / es;
    return st;
}

/* A reduce-scatter: the whole count is reduced in the fusion buffer and
 * this rank's block copied out; a grouped one, each buffer in turn. */
static hvd_status run_reducescatter(hvd_engine *eng, hvd_comm *comm,
                                    const resp *r, hvd_request *req) {
    size_t unit = (size_t)hvd_opdesc_unit(&r->desc);
    hvd_status st = HVD_OK;

    for (size_t i = 0; st == HVD_OK && i < r->desc.ncounts; i++) {
        size_t count = (size_t)r->desc.counts[i];
        size_t bytes = count * hvd_dtype_size(r->desc.dtype);
        st = fusion_room(eng, bytes > 0 ? bytes : 1);
        if (st == HVD_OK)
            st = hvd_coll_reducescatter(comm, req->send[i], req->recv[i],
                                        eng->fusion, count, unit > 0 ? unit : 1,
                                        r->desc.dtype, r->desc.op);
    }
    return st;
}

/* A broadcast's root (a rank of the job): its place in r's set. */
static int pset_index(const hvd_engine *eng, const resp *r) {
    const pset *p = hvd_eng_pset(eng, r->desc.pset);

    if (r->desc.pset == 0 || p == NULL)
        return r->desc.root;
    for (int i = 0; i < p->size; i++)
        if (p->ranks[i] == r->desc.root)
            return i;
    return -1;
}

/*
 * A broadcast or allgather of host memory (started at t): one collective
 * each buffer (a grouped allgather has several), each run with the plan
 * made for it; the timeline shows the plan of the whole.
 */
static hvd_status run_gather(hvd_engine *eng, hvd_comm *comm, const resp *r,
                             hvd_request *req, int64_t t) {
    int bc = r->desc.kind == HVD_KIND_BROADCAST;
    hvd_coll_kind kind = bc ? HVD_COLL_BROADCAST : HVD_COLL_ALLGATHER;
    size_t es = hvd_dtype_size(r->desc.dtype);
    /* An allgather moves size times what each rank gives. */
    size_t times = bc ? 1 : (size_t)comm->size;
    hvd_status st = HVD_OK;
    hvd_plan plan;
    char buf[256];
    const char *args = NULL;

    for (int i = 0; st == HVD_OK && i < req->n; i++) {
        hvd_coll_plan(comm, kind, (size_t)req->counts[i] * es * times,
                      r->desc.dtype, &plan);
        if (i == 0 && req->n == 1)
            args = plan_args(eng, &plan, buf, sizeof(buf), 1,
                             (size_t)req->counts[0] * es * times);
        if (bc) /* the root is a rank of the job: its place in the set */
            st = hvd_coll_broadcast_planned(&plan, req->recv[0], req->counts[0],
                                            r->desc.dtype, pset_index(eng, r));
        else
            st = hvd_coll_allgather_planned(&plan, req->send[i], req->recv[i],
                                            req->counts[i], r->desc.dtype);
    }
    if (st != HVD_OK)
        return st;
    if (req->n > 1 && eng->timeline != NULL) {
        size_t bytes = (size_t)hvd_opdesc_total(&r->desc) * es * times;
        hvd_coll_plan(comm, kind, bytes, r->desc.dtype, &plan);
        args = plan_args(eng, &plan, buf, sizeof(buf), req->n, bytes);
    }
    hvd_timeline_begin(eng->timeline, r->name, bc ? "BROADCAST" : "ALLGATHER",
                       t, args);
    hvd_timeline_end(eng->timeline, r->name, hvd_now_ns());
    return HVD_OK;
}

/* Runs one broadcast, allgather, alltoall, reducescatter, barrier, join,
 * call or process-set response. */
hvd_status hvd_eng_run_other(hvd_engine *eng, const resp *r) {
    hvd_request *req = hvd_namemap_get_h(&eng->by_name, r->name, r->hash);
    hvd_comm *comm = hvd_eng_pset_comm(eng, &r->desc);
    hvd_status st = HVD_OK, outcome = HVD_OK;
    int64_t t = hvd_now_ns();
    char why[HVD_ERROR_MAX] = "";

    hvd_timeline_end(eng->timeline, r->name, t); /* QUEUE */
    if (req == NULL) {
        /* Only a joined rank meets an operation it did not ask for, and
         * only for what can complete without it (allreduce, barrier). */
        if (r->desc.kind == HVD_KIND_BARRIER)
            return HVD_OK;
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "rank %d has no request '%s' to run", eng->rank,
                             r->name);
    }
    if (r->desc.mem == HVD_MEM_DEVICE && (r->desc.kind == HVD_KIND_BROADCAST ||
                                          r->desc.kind == HVD_KIND_ALLGATHER))
        return run_device_other(eng, r, req);
    switch (r->desc.kind) {
    case HVD_KIND_BROADCAST:
    case HVD_KIND_ALLGATHER:
        st = run_gather(eng, comm, r, req, t);
        eng->n_collectives++;
        break;
    case HVD_KIND_ALLTOALL:
        st = run_alltoall(eng, comm, r, req, &outcome);
        if (outcome != HVD_OK)
            snprintf(why, sizeof(why), "%s", hvd_error_get());
        eng->n_collectives++;
        break;
    case HVD_KIND_REDUCESCATTER:
        st = run_reducescatter(eng, comm, r, req);
        eng->n_collectives++;
        break;
    case HVD_KIND_CALL:
        req->fn(req->fn_arg, eng->data);
        break;
    case HVD_KIND_JOIN:
        req->last_rank = r->last_joined;
        break;
    case HVD_KIND_PSET:
        st = hvd_eng_pset_run(eng, &r->desc, r->created_set);
        req->last_rank =
            (int)r->desc.op == HVD_PSET_CREATE ? r->created_set : 0;
        break;
    default: /* barrier: that every rank asked is the barrier */
        break;
    }
    if (st != HVD_OK)
        return st;
    if (r->desc.kind == HVD_KIND_ALLTOALL ||
        r->desc.kind == HVD_KIND_REDUCESCATTER) {
        int a2a = r->desc.kind == HVD_KIND_ALLTOALL;
        hvd_timeline_begin(eng->timeline, r->name,
                           a2a ? "ALLTOALL" : "REDUCESCATTER", t, NULL);
        hvd_timeline_end(eng->timeline, r->name, hvd_now_ns());
    }
    hvd_eng_complete(eng, req, outcome, outcome != HVD_OK ? why : NULL);
    return HVD_OK;
}

/* Whether rs[i] may join the fusion group that starts at rs[first]. */
static int fuses(const hvd_engine *eng, const resp *rs, size_t first, size_t i,
                 size_t group_bytes) {
    const resp *a = &rs[first], *b = &rs[i];
    size_t bytes =
        (size_t)hvd_opdesc_total(&b->desc) * hvd_dtype_size(b->desc.dtype);

    /* Adasum's coefficients are per tensor: it never fuses. */
    return b->status == HVD_OK && b->parts == NULL &&
           b->desc.kind == HVD_KIND_ALLREDUCE && b->desc.op != HVD_ADASUM &&
           b->desc.dtype == a->desc.dtype && b->desc.op == a->desc.op &&
           b->desc.mem == a->desc.mem && b->desc.pset == a->desc.pset &&
           b->contributors == a->contributors &&
           b->self_joined == a->self_joined &&
           bytes <= eng->cfg.fusion_tensor_max &&
           group_bytes + bytes <= eng->cfg.fusion_threshold;
}

/* Runs the cycle's responses in order, fusing neighbouring allreduces. */
hvd_status hvd_eng_run_responses(hvd_engine *eng, resp *rs, size_t n) {
    int64_t t = stamp(eng);

    for (size_t i = 0; i < n; i++) {
        hvd_request *req =
            hvd_namemap_get_h(&eng->by_name, rs[i].name, rs[i].hash);
        if (req != NULL) {
            hvd_timeline_end(eng->timeline, rs[i].name, t); /* NEGOTIATE */
            hvd_timeline_begin(eng->timeline, rs[i].name, "QUEUE", t, NULL);
        } else if (rs[i].status == HVD_OK &&
                   hvd_eng_pset_comm(eng, &rs[i].desc) != NULL) {
            /* A joined rank: give it a row all the same. */
            hvd_timeline_begin(eng->timeline, rs[i].name, "QUEUE", t, NULL);
        }
    }
    for (size_t i = 0; i < n;) {
        resp *r = &rs[i];
        hvd_status st;

        if (r->status != HVD_OK) {
            hvd_request *req =
                hvd_namemap_get_h(&eng->by_name, r->name, r->hash);
            if (req != NULL) {
                hvd_timeline_end(eng->timeline, r->name, t); /* QUEUE */
                hvd_eng_complete(eng, req, r->status, r->error);
            }
            i++;
            continue;
        }
        if (hvd_eng_pset_comm(eng, &r->desc) == NULL) {
            /* An operation of a process set this rank is not in. */
            i++;
            continue;
        }
        if (r->parts != NULL || r->desc.kind != HVD_KIND_ALLREDUCE) {
            st = r->parts != NULL ? hvd_eng_run_carried(eng, r, NULL)
                                  : hvd_eng_run_other(eng, r);
            if (st != HVD_OK)
                return st;
            i++;
            continue;
        }
        size_t last = i + 1;
        size_t bytes =
            (size_t)hvd_opdesc_total(&r->desc) * hvd_dtype_size(r->desc.dtype);
        if (r->desc.ncounts == 1 && bytes <= eng->cfg.fusion_tensor_max &&
            bytes <= eng->cfg.fusion_threshold) {
            while (last < n && fuses(eng, rs, i, last, bytes)) {
                bytes += (size_t)hvd_opdesc_total(&rs[last].desc) *
                         hvd_dtype_size(rs[last].desc.dtype);
                last++;
            }
        }
        st = run_allreduce(eng, rs, i, last);
        if (st != HVD_OK)
            return st;
        i = last;
    }
    return HVD_OK;
}
