/*
 * Memory-type detection: is a pointer host memory or CUDA device memory,
 * and on which device?
 *
 * It asks the CUDA driver (libcuda.so.1, opened with dlopen the first time
 * it is needed; hvd never links it) with cuPointerGetAttributes, which
 * needs no CUDA context: detection never creates one, and a host-only job
 * on a GPU machine stays off its GPUs. Where there is no driver, or the
 * driver sees no device, every pointer is host memory and detection costs
 * one load and a branch; that answer is probed once per process and kept.
 *
 * This part is built with or without the CUDA toolkit, so that a build
 * without CUDA still recognizes a device pointer and refuses it with a
 * sentence instead of touching it.
 */
#ifndef HVD_BASE_MEMTYPE_H
#define HVD_BASE_MEMTYPE_H

#include <stddef.h>

#include "hvd/types.h"

/*
 * Where a buffer lives. Transports see only byte ranges; a transport that
 * can move device memory itself (RDMA with GPUDirect) says so in its caps
 * (mem_types), and then gets device pointers in isend/irecv. Every other
 * transport only ever gets host memory: device buffers reach it through
 * the staging pipeline of gpu/stage.h.
 */
typedef enum {
    HVD_MEM_HOST = 0,   /* host memory (pageable, pinned or managed) */
    HVD_MEM_DEVICE = 1, /* CUDA device memory */
    HVD_MEM_COUNT
} hvd_memtype;

#define HVD_MEM_BIT(type) (1u << (unsigned)(type))

typedef struct hvd_meminfo {
    hvd_memtype type;
    int device; /* CUDA device ordinal for HVD_MEM_DEVICE, else -1 */
    /* For HVD_MEM_DEVICE: the driver's id of the allocation
     * (CU_POINTER_ATTRIBUTE_BUFFER_ID), unique in the process for its
     * lifetime, so a new allocation at a freed one's address has another
     * id; else 0. */
    unsigned long long buffer_id;
} hvd_meminfo;

/* CUDA devices this process sees (0 without a driver or a device). The
 * first call probes, later ones read the cached answer. Thread-safe. */
int hvd_mem_device_count(void);

/* Why hvd_mem_device_count() is 0, as a phrase for a sentence ("libcuda.so.1
 * not found: no NVIDIA driver"); "" when it is not. */
const char *hvd_mem_no_device_reason(void);

/*
 * Where ptr points. Managed memory (cudaMallocManaged) and registered or
 * pinned host memory count as host memory: the CPU can read them. A
 * pointer the driver does not know is host memory. Thread-safe.
 */
void hvd_mem_classify(const void *ptr, hvd_meminfo *out);

/*
 * Makes what GPUDirect RDMA wrote into memory of device (the current
 * context's) visible to that device's kernels: cuFlushGPUDirectRDMAWrites
 * to the owner, unless the device orders such writes natively
 * (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, asked once). A
 * receiver calls it after the network said the data is there and before
 * a kernel reads it. A failure is logged once (it cannot be repaired
 * here). Thread-safe.
 */
void hvd_mem_flush_rdma_writes(int device);

/*
 * Sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on the allocation ptr points into,
 * as NVIDIA's GPUDirect RDMA guide asks of memory registered with the NIC:
 * synchronous copies into it (cudaMemcpy, cudaMemset) have then reached
 * the memory when they return, before the NIC reads it. A failure is
 * logged once. Thread-safe.
 */
void hvd_mem_sync_memops(const void *ptr);

/* "host memory" or "CUDA device 1 memory", for sentences. */
void hvd_mem_describe(const hvd_meminfo *info, char *out, size_t outlen);

#endif
