/*
 * The NCCL part of gpu/gpu.h with the CUDA runtime: the communicator (set
 * up and torn down bounded: it is non-blocking) and its collectives, on
 * hvd's stream; stubs where hvd is built with CUDA but without NCCL. The
 * library itself is loaded by gpu/nccl.c.
 */
#include "gpu/gpu_state.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "transport/base/clock.h"
#include "transport/base/error.h"
#include "transport/base/log.h"

#ifdef HVD_WITH_NCCL

int hvd_gpu_nccl_built(void) { return 1; }

int hvd_gpu_nccl_version(void) { return hvd_nccl_header_version(); }

int hvd_gpu_nccl_usable(char *why, size_t whylen) {
    return hvd_nccl_load(why, whylen) != NULL;
}

hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]) {
    char why[320];
    const hvd_nccl_api *api = hvd_nccl_load(why, sizeof(why));
    ncclUniqueId id;
    ncclResult_t rc;

    if (api == NULL)
        return hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", why);
    rc = api->get_unique_id(&id);
    if (rc != ncclSuccess)
        return hvd_nccl_error(api, rc, NULL, "ncclGetUniqueId");
    memcpy(id_out, &id, HVD_NCCL_ID_BYTES);
    return HVD_OK;
}

/* A non-blocking communicator may answer ncclInProgress: waits (bounded)
 * until it has finished what it was asked. Setup only: a collective's
 * launch is done in microseconds. */
static hvd_status nccl_ready(hvd_gpu *g, ncclComm_t comm, ncclResult_t rc,
                             const char *call) {
    int64_t deadline = hvd_now_ns() + g->cfg.nccl_timeout_ns;

    while (rc == ncclInProgress) {
        ncclResult_t state = ncclInProgress;
        rc = g->nccl->comm_get_async_error(comm, &state);
        if (rc == ncclSuccess)
            rc = state;
        if (rc == ncclInProgress) {
            if (hvd_now_ns() > deadline)
                return hvd_error_set(HVD_ERR_TIMEOUT,
                                     "%s did not finish within %.0f s", call,
                                     (double)g->cfg.nccl_timeout_ns / 1e9);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    return rc == ncclSuccess ? HVD_OK : hvd_nccl_error(g->nccl, rc, comm, call);
}

hvd_status hvd_gpu_nccl_open(hvd_gpu *g, const uint8_t *id, int rank,
                             int size) {
    char why[320];
    ncclUniqueId uid;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    ncclResult_t rc;
    hvd_status st;

    g->nccl = hvd_nccl_load(why, sizeof(why));
    if (g->nccl == NULL)
        return hvd_error_set(HVD_ERR_UNSUPPORTED, "%s", why);
    if (id != NULL) {
        memcpy(&uid, id, sizeof(uid));
    } else {
        rc = g->nccl->get_unique_id(&uid);
        if (rc != ncclSuccess)
            return hvd_nccl_error(g->nccl, rc, NULL, "ncclGetUniqueId");
    }
    /* Non-blocking, so that setup is bounded and an error is seen. */
    config.blocking = 0;
    rc = g->nccl->comm_init_rank_config(&comm, size, uid, rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
        return hvd_nccl_error(g->nccl, rc, comm, "ncclCommInitRankConfig");
    st = nccl_ready(g, comm, rc, "ncclCommInitRankConfig");
    if (st != HVD_OK) {
        if (comm != NULL)
            g->nccl->comm_abort(comm);
        return st;
    }
    g->comm = comm;
    HVD_INFO("gpu", "NCCL %d communicator: rank %d of %d on CUDA device %d",
             g->nccl->version, rank, size, g->cfg.device);
    return HVD_OK;
}

int hvd_gpu_has_nccl(const hvd_gpu *g) { return g->comm != NULL; }

/* A non-blocking communicator is finalized (its work flushed, bounded),
 * then destroyed; one that will not finish is aborted. */
void hvd_cuda_nccl_finalize(hvd_gpu *g) {
    ncclResult_t rc = g->nccl->comm_finalize(g->comm);

    if ((rc == ncclSuccess || rc == ncclInProgress) &&
        nccl_ready(g, g->comm, ncclInProgress, "ncclCommFinalize") == HVD_OK) {
        g->nccl->comm_destroy(g->comm);
    } else {
        HVD_WARN("gpu", "NCCL communicator not finalized (%s); aborting it",
                 hvd_error_get());
        g->nccl->comm_abort(g->comm);
    }
    g->comm = NULL;
}

hvd_status hvd_cuda_nccl_poll(hvd_gpu *g) {
    hvd_status st;

    if (g->comm != NULL) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t rc = g->nccl->comm_get_async_error(g->comm, &state);
        if (rc == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress)
            rc = state;
        if (rc != ncclSuccess) {
            st = hvd_nccl_error(g->nccl, rc, g->comm,
                                "an NCCL collective (ncclCommGetAsyncError)");
            g->failed = st;
            snprintf(g->failmsg, sizeof(g->failmsg), "%s", hvd_error_get());
            return st;
        }
    }
    return HVD_OK;
}

void hvd_gpu_nccl_close(hvd_gpu *g) {
    if (g->comm != NULL) {
        g->nccl->comm_abort(g->comm);
        g->comm = NULL;
    }
}

static ncclDataType_t nccl_dtype(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
        return ncclUint8;
    case HVD_INT8:
        return ncclInt8;
    case HVD_INT32:
        return ncclInt32;
    case HVD_INT64:
        return ncclInt64;
    case HVD_FLOAT16:
        return ncclFloat16;
    case HVD_BFLOAT16:
        return ncclBfloat16;
    case HVD_FLOAT32:
        return ncclFloat32;
    case HVD_FLOAT64:
        break;
    }
    return ncclFloat64;
}

static ncclRedOp_t nccl_op(hvd_op op) {
    switch (op) {
    case HVD_PRODUCT:
        return ncclProd;
    case HVD_MIN:
        return ncclMin;
    case HVD_MAX:
        return ncclMax;
    default:
        return ncclSum;
    }
}

/* Turns a collective's launch result into a status; a failure sticks. */
static hvd_status launched(hvd_gpu *g, ncclResult_t rc, const char *call) {
    hvd_status st =
        rc == ncclInProgress
            ? nccl_ready(g, g->comm, rc, call)
            : (rc == ncclSuccess ? HVD_OK
                                 : hvd_nccl_error(g->nccl, rc, g->comm, call));
    if (st != HVD_OK && g->failed == HVD_OK) {
        g->failed = st;
        snprintf(g->failmsg, sizeof(g->failmsg), "%s", hvd_error_get());
    }
    return st;
}

hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    hvd_status st = hvd_cuda_check(g);

    if (st != HVD_OK)
        return st;
    return launched(g,
                    g->nccl->all_reduce(sendbuf, recvbuf, count,
                                        nccl_dtype(dtype), nccl_op(op), g->comm,
                                        g->stream),
                    "ncclAllReduce");
}

hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *g, void *buf, size_t bytes,
                                  int root) {
    hvd_status st = hvd_cuda_check(g);

    if (st != HVD_OK)
        return st;
    return launched(g,
                    g->nccl->broadcast(buf, buf, bytes, ncclUint8, root,
                                       g->comm, g->stream),
                    "ncclBroadcast");
}

hvd_status hvd_gpu_nccl_allgather(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t bytes) {
    hvd_status st = hvd_cuda_check(g);

    if (st != HVD_OK)
        return st;
    return launched(g,
                    g->nccl->all_gather(sendbuf, recvbuf, bytes, ncclUint8,
                                        g->comm, g->stream),
                    "ncclAllGather");
}

#else /* CUDA without NCCL */

int hvd_gpu_nccl_built(void) { return 0; }

int hvd_gpu_nccl_version(void) { return 0; }

int hvd_gpu_nccl_usable(char *why, size_t whylen) {
    snprintf(why, whylen, "this hvd was built without NCCL");
    return 0;
}

hvd_status hvd_gpu_nccl_unique_id(uint8_t id_out[HVD_NCCL_ID_BYTES]) {
    (void)id_out;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "this hvd was built without NCCL");
}

hvd_status hvd_gpu_nccl_open(hvd_gpu *g, const uint8_t *id, int rank,
                             int size) {
    (void)g, (void)id, (void)rank, (void)size;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "this hvd was built without NCCL");
}

int hvd_gpu_has_nccl(const hvd_gpu *g) {
    (void)g;
    return 0;
}

void hvd_gpu_nccl_close(hvd_gpu *g) { (void)g; }

hvd_status hvd_gpu_nccl_allreduce(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t count, hvd_dtype dtype,
                                  hvd_op op) {
    (void)g, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "no NCCL");
}

hvd_status hvd_gpu_nccl_broadcast(hvd_gpu *g, void *buf, size_t bytes,
                                  int root) {
    (void)g, (void)buf, (void)bytes, (void)root;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "no NCCL");
}

hvd_status hvd_gpu_nccl_allgather(hvd_gpu *g, const void *sendbuf,
                                  void *recvbuf, size_t bytes) {
    (void)g, (void)sendbuf, (void)recvbuf, (void)bytes;
    return hvd_error_set(HVD_ERR_UNSUPPORTED, "no NCCL");
}

#endif
