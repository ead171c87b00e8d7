/*
 * libnccl, loaded with dlopen the first time it is needed (so that libhvd
 * loads where NCCL is not installed, and processes that never use it do
 * not map its 200 MB). The library is HVD_NCCL_LIBRARY if set, else
 * libnccl.so.2 from the loader's search path, else the one found when hvd
 * was built. NCCL 2.14 or later is needed (non-blocking communicators,
 * ncclCommGetAsyncError, ncclGetLastError).
 */
#ifndef HVD_GPU_NCCL_H
#define HVD_GPU_NCCL_H

#include <stddef.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "hvd/types.h"

typedef struct hvd_nccl_api {
    int version;
    ncclResult_t (*get_unique_id)(ncclUniqueId *id);
    ncclResult_t (*comm_init_rank_config)(ncclComm_t *comm, int nranks,
                                          ncclUniqueId id, int rank,
                                          ncclConfig_t *config);
    ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t *error);
    ncclResult_t (*comm_abort)(ncclComm_t comm);
    ncclResult_t (*comm_finalize)(ncclComm_t comm);
    ncclResult_t (*comm_destroy)(ncclComm_t comm);
    const char *(*get_error_string)(ncclResult_t result);
    const char *(*get_last_error)(ncclComm_t comm);
    ncclResult_t (*all_reduce)(const void *sendbuf, void *recvbuf, size_t count,
                               ncclDataType_t dtype, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*broadcast)(const void *sendbuf, void *recvbuf, size_t count,
                              ncclDataType_t dtype, int root, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*all_gather)(const void *sendbuf, void *recvbuf, size_t count,
                               ncclDataType_t dtype, ncclComm_t comm,
                               cudaStream_t stream);
} hvd_nccl_api;

/* The loaded library, or NULL with why (a phrase) when it cannot be used.
 * Loads once per process; thread-safe. */
const hvd_nccl_api *hvd_nccl_load(char *why, size_t whylen);

/* NCCL_VERSION_CODE of the header hvd was built with. */
int hvd_nccl_header_version(void);

/* rc as an hvd_status, with "call failed: NCCL's text (its last error)"
 * as the sentence. comm may be NULL. */
hvd_status hvd_nccl_error(const hvd_nccl_api *api, ncclResult_t rc,
                          ncclComm_t comm, const char *call);

#endif
