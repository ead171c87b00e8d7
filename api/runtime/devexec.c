#include "api/runtime/devexec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/coll.h"
#include "transport/base/clock.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

enum { ST_NEW = 0, ST_READY, ST_BROKEN };
enum { P_NONE = 0, P_LOCAL, P_NCCL, P_DIRECT, P_STAGED };

struct hvd_devexec {
    hvd_devexec_config cfg;
    int state;
    int path;
    char path_name[64];
    hvd_status broken; /* ST_BROKEN: why every device op fails */
    char brokenmsg[HVD_ERROR_MAX];
    hvd_gpu *gpu;
    hvd_transport *stage; /* P_STAGED */
    hvd_comm *comm;       /* P_DIRECT, P_STAGED: device memops */
    hvd_gpu_copy *copies;
    size_t copies_cap;
    int32_t *votes;
    int aborted;
};

hvd_status hvd_devexec_create(const hvd_devexec_config *cfg,
                              hvd_devexec **out) {
    hvd_devexec *d = calloc(1, sizeof(*d));

    if (d == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    d->cfg = *cfg;
    d->votes = calloc((size_t)cfg->size, sizeof(*d->votes));
    if (d->votes == NULL) {
        free(d);
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    snprintf(d->path_name, sizeof(d->path_name), "none");
    *out = d;
    return HVD_OK;
}

void hvd_devexec_abort(hvd_devexec *d) {
    if (d != NULL) {
        d->aborted = 1;
        hvd_gpu_abort(d->gpu);
    }
}

void hvd_devexec_destroy(hvd_devexec *d, int64_t timeout_ns) {
    if (d == NULL)
        return;
    if (d->gpu != NULL && !d->aborted) {
        /* Bounded: the GPU may wait on a peer that is gone. */
        int64_t deadline = hvd_now_ns() + timeout_ns;
        uint64_t done = 0, want;
        if (hvd_gpu_fence(d->gpu, &want) == HVD_OK) {
            while (hvd_gpu_poll(d->gpu, &done) == HVD_OK && done < want &&
                   hvd_now_ns() < deadline) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        }
        if (done < want) {
            HVD_WARN("gpu",
                     "the GPU did not finish hvd's work within %.0f s "
                     "at shutdown; aborting it",
                     (double)timeout_ns / 1e9);
            hvd_gpu_abort(d->gpu);
        }
    }
    hvd_comm_destroy(d->comm); /* its device scratch goes with the GPU */
    if (d->stage != NULL)
        d->stage->ops->close(d->stage);
    hvd_gpu_close(d->gpu);
    free(d->copies);
    free(d->votes);
    free(d);
}

const char *hvd_devexec_path(const hvd_devexec *d) { return d->path_name; }

/* ------------------------------------------------------------------ */
/* Setup                                                               */

/*
 * Every rank says whether its step worked; *bad_out lists the ranks where
 * it did not ("" if none). A failure to agree is fatal.
 */
static hvd_status agree(hvd_devexec *d, int ok, char *bad_out, size_t len) {
    int32_t mine = ok;
    size_t off = 0;
    hvd_status st;

    bad_out[0] = '\0';
    if (d->cfg.size == 1) {
        if (!ok)
            snprintf(bad_out, len, "0");
        return HVD_OK;
    }
    st = hvd_coll_allgather(d->cfg.host, &mine, d->votes, 1, HVD_INT32);
    if (st != HVD_OK)
        return st;
    for (int r = 0; r < d->cfg.size && off + 16 < len; r++)
        if (!d->votes[r])
            off += (size_t)snprintf(bad_out + off, len - off, "%s%d",
                                    off ? "," : "", r);
    return HVD_OK;
}

/* The GPU cannot be used on rank(s) bad: every device operation fails
 * with "what failed on rank(s) bad" and, on a failing rank, its reason. */
static hvd_status broken(hvd_devexec *d, hvd_status status, const char *what,
                         const char *bad, const char *mine) {
    d->state = ST_BROKEN;
    d->broken = status;
    snprintf(d->brokenmsg, sizeof(d->brokenmsg),
             "%s failed on rank(s) %s%s%s%s", what, bad,
             mine[0] ? " (here: " : " (their logs say why)", mine,
             mine[0] ? ")" : "");
    HVD_ERROR("gpu", "%s", d->brokenmsg);
    return hvd_error_copy(status, d->brokenmsg);
}

static hvd_status setup(hvd_devexec *d, int *fatal) {
    char bad[128], mine[HVD_ERROR_MAX] = "";
    hvd_status st;

    *fatal = 0;
    if (d->state == ST_READY)
        return HVD_OK;
    if (d->state == ST_BROKEN)
        return hvd_error_copy(d->broken, d->brokenmsg);

    /* 1. The device and hvd's stream, on every rank. */
    st = hvd_gpu_open(&d->cfg.gpu, &d->gpu);
    if (st != HVD_OK) {
        snprintf(mine, sizeof(mine), "%s", hvd_error_get());
        HVD_ERROR("gpu", "%s", mine);
    }
    *fatal = 1;
    hvd_status ast = agree(d, st == HVD_OK, bad, sizeof(bad));
    if (ast != HVD_OK)
        return ast;
    *fatal = 0;
    if (bad[0] != '\0')
        return broken(d, st != HVD_OK ? st : HVD_ERR_UNSUPPORTED,
                      "device tensors cannot be used: CUDA setup", bad, mine);

    /* 2. NCCL, where wanted. */
    if (d->cfg.nccl != HVD_NCCL_OFF) {
        st = hvd_gpu_nccl_open(d->gpu,
                               d->cfg.nccl_have_id ? d->cfg.nccl_id : NULL,
                               d->cfg.rank, d->cfg.size);
        mine[0] = '\0';
        if (st != HVD_OK) {
            snprintf(mine, sizeof(mine), "%s", hvd_error_get());
            HVD_ERROR("gpu", "NCCL setup: %s", mine);
        }
        *fatal = 1;
        ast = agree(d, st == HVD_OK, bad, sizeof(bad));
        if (ast != HVD_OK)
            return ast;
        *fatal = 0;
        if (bad[0] != '\0') {
            hvd_gpu_nccl_close(d->gpu);
            if (d->cfg.nccl == HVD_NCCL_REQUIRED)
                return broken(d, st != HVD_OK ? st : HVD_ERR_UNSUPPORTED,
                              "HVD_TRANSPORT=nccl: NCCL setup", bad, mine);
            HVD_WARN("gpu",
                     "NCCL setup failed on rank(s) %s; device tensors are "
                     "staged through host memory instead",
                     bad);
        }
    }

    /* 3. The path. */
    *fatal = 1;
    if (hvd_gpu_has_nccl(d->gpu)) {
        d->path = P_NCCL;
        snprintf(d->path_name, sizeof(d->path_name), "nccl");
    } else if (d->cfg.size == 1) {
        d->path = P_LOCAL;
        snprintf(d->path_name, sizeof(d->path_name), "local");
    } else {
        hvd_transport *tp = d->cfg.tp;
        hvd_comm_config cc = d->cfg.comm;
        if (d->cfg.tp_mem_types & HVD_MEM_BIT(HVD_MEM_DEVICE)) {
            d->path = P_DIRECT;
            snprintf(d->path_name, sizeof(d->path_name), "direct over %s",
                     tp->ops->name);
        } else {
            st = hvd_gpu_stage_open(d->gpu, d->cfg.tp, d->cfg.size, &d->stage);
            if (st != HVD_OK)
                return st;
            d->path = P_STAGED;
            snprintf(d->path_name, sizeof(d->path_name), "staged over %s",
                     d->cfg.tp->ops->name);
            tp = d->stage;
        }
        /* The transport's own collectives read host memory only. */
        cc.native = 0;
        st = hvd_comm_create(d->cfg.rank, d->cfg.size, tp, HVD_CHANNEL_DATA,
                             &cc, &d->comm);
        if (st != HVD_OK)
            return st;
        /* Staged: the copies are on the stream, in order with the
         * kernels. Direct: the transport reads device memory on its own,
         * so each kernel is waited for before the next message. */
        hvd_comm_set_memops(d->comm,
                            d->path == P_DIRECT ? &hvd_gpu_memops_sync
                                                : &hvd_gpu_memops,
                            d->gpu);
    }
    *fatal = 0;
    d->state = ST_READY;
    HVD_INFO("gpu", "device tensors: CUDA device %d, path %s",
             d->cfg.gpu.device, d->path_name);
    return HVD_OK;
}

/* ------------------------------------------------------------------ */
/* Operations                                                          */

static hvd_status copies_room(hvd_devexec *d, size_t n) {
    if (n > d->copies_cap) {
        hvd_gpu_copy *p = realloc(d->copies, n * sizeof(*p));
        if (p == NULL)
            return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
        d->copies = p;
        d->copies_cap = n;
    }
    return HVD_OK;
}

/* The direct path: what is queued (packing) must have run before the
 * transport reads the buffers. */
static hvd_status before_direct(hvd_devexec *d) {
    return d->path == P_DIRECT ? hvd_gpu_sync(d->gpu) : HVD_OK;
}

/* The collective itself on device buffers. op may be HVD_AVERAGE (divides
 * by the job's size). */
static hvd_status allreduce_path(hvd_devexec *d, const void *send, void *recv,
                                 size_t count, hvd_dtype dtype, hvd_op op) {
    hvd_status st;

    switch (d->path) {
    case P_LOCAL:
        hvd_gpu_memops.copy(d->gpu, recv, send, count * hvd_dtype_size(dtype));
        return HVD_OK;
    case P_NCCL:
        st = hvd_gpu_nccl_allreduce(d->gpu, send, recv, count, dtype,
                                    op == HVD_AVERAGE ? HVD_SUM : op);
        if (st == HVD_OK && op == HVD_AVERAGE)
            st = hvd_gpu_scale_div(d->gpu, recv, count, dtype, d->cfg.size);
        return st;
    default:
        st = before_direct(d);
        return st != HVD_OK
                   ? st
                   : hvd_coll_allreduce(d->comm, send, recv, count, dtype, op);
    }
}

/* Ends an operation: its errors so far, and a fence. */
static hvd_status finish_op(hvd_devexec *d, hvd_status st, uint64_t *seq_out) {
    uint64_t done;

    if (st == HVD_OK)
        st = hvd_gpu_poll(d->gpu, &done); /* errors queued work has shown */
    if (st == HVD_OK)
        st = hvd_gpu_fence(d->gpu, seq_out);
    return st;
}

hvd_status hvd_devexec_allreduce(hvd_devexec *d, const hvd_dev_tensor *t,
                                 size_t n, hvd_dtype dtype, hvd_op op,
                                 uint64_t *seq_out, int *fatal_out) {
    size_t esize = hvd_dtype_size(dtype), total = 0, off = 0, nc = 0;
    hvd_op cop = op;
    uint8_t *fb;
    hvd_status st = setup(d, fatal_out);

    if (st != HVD_OK)
        return st;
    *fatal_out = 1;
    for (size_t i = 0; i < n; i++)
        total += (size_t)t[i].count;
    if (n == 1 && t[0].send != NULL) {
        /* One tensor: in place on the caller's buffers. */
        st = allreduce_path(d, t[0].send, t[0].recv, total, dtype, cop);
        return finish_op(d, st, seq_out);
    }
    st = hvd_gpu_fusion(d->gpu, total * esize > 0 ? total * esize : 1,
                        (void **)&fb);
    if (st == HVD_OK)
        st = copies_room(d, n);
    if (st != HVD_OK)
        return st;
    /* Pack: one batched kernel; a joined rank's share is neutral. */
    for (size_t i = 0; i < n && st == HVD_OK; i++) {
        size_t bytes = (size_t)t[i].count * esize;
        if (t[i].send == NULL)
            st = hvd_gpu_fill_neutral(d->gpu, fb + off, (size_t)t[i].count,
                                      dtype, op);
        else if (bytes > 0)
            d->copies[nc++] = (hvd_gpu_copy){
                .dst = fb + off, .src = t[i].send, .bytes = bytes};
        off += bytes;
    }
    if (st == HVD_OK)
        st = hvd_gpu_copies(d->gpu, d->copies, nc);
    if (st == HVD_OK)
        st = allreduce_path(d, fb, fb, total, dtype, cop);
    /* Unpack. */
    off = nc = 0;
    for (size_t i = 0; i < n && st == HVD_OK; i++) {
        size_t bytes = (size_t)t[i].count * esize;
        if (t[i].send != NULL && bytes > 0)
            d->copies[nc++] = (hvd_gpu_copy){
                .dst = t[i].recv, .src = fb + off, .bytes = bytes};
        off += bytes;
    }
    if (st == HVD_OK)
        st = hvd_gpu_copies(d->gpu, d->copies, nc);
    return finish_op(d, st, seq_out);
}

hvd_status hvd_devexec_broadcast(hvd_devexec *d, void *buf, size_t count,
                                 hvd_dtype dtype, int root, uint64_t *seq_out,
                                 int *fatal_out) {
    hvd_status st = setup(d, fatal_out);

    if (st != HVD_OK)
        return st;
    *fatal_out = 1;
    switch (d->path) {
    case P_LOCAL:
        break;
    case P_NCCL:
        st = hvd_gpu_nccl_broadcast(d->gpu, buf, count * hvd_dtype_size(dtype),
                                    root);
        break;
    default:
        st = before_direct(d);
        if (st == HVD_OK)
            st = hvd_coll_broadcast(d->comm, buf, count, dtype, root);
        break;
    }
    return finish_op(d, st, seq_out);
}

hvd_status hvd_devexec_allgather(hvd_devexec *d, const void *sendbuf,
                                 void *recvbuf, size_t count, hvd_dtype dtype,
                                 uint64_t *seq_out, int *fatal_out) {
    size_t bytes = count * hvd_dtype_size(dtype);
    hvd_status st = setup(d, fatal_out);

    if (st != HVD_OK)
        return st;
    *fatal_out = 1;
    switch (d->path) {
    case P_LOCAL:
        hvd_gpu_memops.copy(d->gpu, recvbuf, sendbuf, bytes);
        break;
    case P_NCCL:
        /* NCCL's in place is sendbuf == recvbuf + rank * bytes only; hvd
         * also takes sendbuf == recvbuf (the input at the start). */
        if (sendbuf == recvbuf && d->cfg.rank > 0) {
            void *mine = (uint8_t *)recvbuf + (size_t)d->cfg.rank * bytes;
            hvd_gpu_memops.copy(d->gpu, mine, sendbuf, bytes);
            sendbuf = mine;
        }
        st = hvd_gpu_nccl_allgather(d->gpu, sendbuf, recvbuf, bytes);
        break;
    default:
        st = before_direct(d);
        if (st == HVD_OK)
            st = hvd_coll_allgather(d->comm, sendbuf, recvbuf, count, dtype);
        break;
    }
    return finish_op(d, st, seq_out);
}

hvd_status hvd_devexec_poll(hvd_devexec *d, uint64_t *done_out) {
    if (d->gpu == NULL) {
        *done_out = 0;
        return HVD_OK;
    }
    return hvd_gpu_poll(d->gpu, done_out);
}
