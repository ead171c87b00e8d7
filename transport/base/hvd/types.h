/*
 * hvd's value types: status codes, element types (and their size) and
 * reduction operations.
 *
 * The public header <hvd/hvd.h> includes this one, so a trainer sees every
 * name here through it and needs nothing else. It is a header of its own,
 * installed beside hvd.h as <hvd/types.h>, so that the library's lower
 * layers (transport/base/ and everything above it) can name these types
 * without including the public API's entry points, which belong to the
 * layer above them all (docs/design.md, "Layers"). Every name and value is
 * part of the API contract: add at the end, never change.
 */
#ifndef HVD_TYPES_H
#define HVD_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HVD_EXPORT __attribute__((visibility("default")))
#else
#define HVD_EXPORT
#endif

/**
 * Status codes, generated from one table (as libuv's UV_ERRNO_MAP) so that
 * the enum, hvd_strerror() and the names in messages never drift apart.
 * X(name, description)
 */
#define HVD_STATUS_MAP(X)                                                      \
    X(HVD_OK, "success")                                                       \
    X(HVD_ERR_INVALID_ARG, "invalid argument")                                 \
    X(HVD_ERR_NOT_INITIALIZED, "hvd is not initialized (call hvd_init)")       \
    X(HVD_ERR_MISMATCH, "ranks disagree on an operation")                      \
    X(HVD_ERR_PEER_LOST, "a peer rank died or its connection broke")           \
    X(HVD_ERR_TIMEOUT, "a peer stopped moving data (timeout)")                 \
    X(HVD_ERR_TRANSPORT, "transport could not be set up or failed")            \
    X(HVD_ERR_AUTH, "a peer failed the job-secret handshake")                  \
    X(HVD_ERR_NO_MEMORY, "out of memory")                                      \
    X(HVD_ERR_UNSUPPORTED, "not supported by this build or machine")           \
    X(HVD_ERR_SHUTDOWN, "hvd was shut down or failed earlier")                 \
    X(HVD_ERR_INTERNAL, "internal error in hvd (please report it)")            \
    X(HVD_ERR_PEERS_CHANGED,                                                   \
      "the job's ranks changed (elastic): restore your state and call "        \
      "hvd_elastic_reset")                                                     \
    X(HVD_ERR_PROTOCOL, "a peer sent a malformed or unexpected message")

typedef enum {
#define HVD_STATUS_ENUM_(name, text) name,
    HVD_STATUS_MAP(HVD_STATUS_ENUM_)
#undef HVD_STATUS_ENUM_
} hvd_status;

/** Element types. float16/bfloat16 are reduced in float32. */
typedef enum {
    HVD_UINT8,
    HVD_INT8,
    HVD_INT32,
    HVD_INT64,
    HVD_FLOAT16,
    HVD_BFLOAT16,
    HVD_FLOAT32,
    HVD_FLOAT64
} hvd_dtype;

/** Size in bytes of one element of dtype, 0 for an invalid dtype. */
HVD_EXPORT size_t hvd_dtype_size(hvd_dtype dtype);

/** Reduction operations. HVD_AVERAGE divides the sum by hvd_size()
 *  (integer types: truncating division). HVD_ADASUM, for allreduce only,
 *  combines the ranks' tensors by adaptive summation as Horovod's Adasum
 *  (equal tensors average, orthogonal ones add): float16, float32 and
 *  float64 in host memory on a power-of-two number of ranks, else
 *  HVD_ERR_UNSUPPORTED with a sentence. */
typedef enum {
    HVD_SUM,
    HVD_AVERAGE,
    HVD_MIN,
    HVD_MAX,
    HVD_PRODUCT,
    HVD_ADASUM
} hvd_op;

#ifdef __cplusplus
}
#endif

#endif /* HVD_TYPES_H */
