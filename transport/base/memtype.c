#include "transport/base/memtype.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "transport/base/log.h"

/*
 * The few driver entry points used, declared here so that this file needs
 * no CUDA header (it is built without the toolkit too). Their values are
 * the driver ABI's, stable since CUDA 4.
 */
typedef int cu_result;
typedef unsigned long long cu_deviceptr;
enum {
    CU_SUCCESS = 0,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_MEMORYTYPE_DEVICE = 2,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = 118,
    CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER = 100,
    CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX = 0,
    CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER = 100,
};

typedef cu_result (*cu_init_fn)(unsigned int flags);
typedef cu_result (*cu_count_fn)(int *count);
typedef cu_result (*cu_attrs_fn)(unsigned int n, int *attributes, void **data,
                                 cu_deviceptr ptr);
typedef cu_result (*cu_errstr_fn)(cu_result error, const char **text);
typedef cu_result (*cu_devget_fn)(int *device, int ordinal);
typedef cu_result (*cu_devattr_fn)(int *value, int attribute, int device);
typedef cu_result (*cu_flush_fn)(int target, int scope);
typedef cu_result (*cu_setattr_fn)(const void *value, int attribute,
                                   cu_deviceptr ptr);

/* Devices whose GPUDirect RDMA write ordering is remembered. */
#define ORDERING_MAX 64

static struct {
    pthread_once_t once;
    int count;
    char reason[256];
    cu_attrs_fn attrs;
    cu_errstr_fn errstr;
    cu_devget_fn devget;
    cu_devattr_fn devattr;
    cu_flush_fn flush; /* NULL before CUDA 11.3 */
    cu_setattr_fn setattr;
    int sync_warned;
    /* Per device: 1 if RDMA writes need a flush, 0 if not, -1 unknown. */
    int needs_flush[ORDERING_MAX];
    int flush_warned;
    pthread_mutex_t mu;
} probe = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static void probe_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    cu_init_fn init;
    cu_count_fn count;
    cu_errstr_fn errstr;
    const char *text = NULL;
    cu_result rc;
    int n = 0;

    if (lib == NULL) {
        snprintf(probe.reason, sizeof(probe.reason),
                 "libcuda.so.1 cannot be loaded (no NVIDIA driver here)");
        return;
    }
    /* The handle stays open for the process: the driver is never unloaded
     * under the CUDA runtime, which opens the same library. */
    *(void **)&init = dlsym(lib, "cuInit");
    *(void **)&count = dlsym(lib, "cuDeviceGetCount");
    *(void **)&probe.attrs = dlsym(lib, "cuPointerGetAttributes");
    *(void **)&errstr = dlsym(lib, "cuGetErrorString");
    probe.errstr = errstr;
    *(void **)&probe.devget = dlsym(lib, "cuDeviceGet");
    *(void **)&probe.devattr = dlsym(lib, "cuDeviceGetAttribute");
    *(void **)&probe.flush = dlsym(lib, "cuFlushGPUDirectRDMAWrites");
    *(void **)&probe.setattr = dlsym(lib, "cuPointerSetAttribute");
    for (int i = 0; i < ORDERING_MAX; i++)
        probe.needs_flush[i] = -1;
    if (init == NULL || count == NULL || probe.attrs == NULL) {
        snprintf(probe.reason, sizeof(probe.reason),
                 "libcuda.so.1 lacks cuInit, cuDeviceGetCount or "
                 "cuPointerGetAttributes");
        return;
    }
    rc = init(0);
    if (rc == CU_SUCCESS)
        rc = count(&n);
    if (rc != CU_SUCCESS) {
        if (errstr == NULL || errstr(rc, &text) != CU_SUCCESS || text == NULL)
            text = "unknown error";
        snprintf(probe.reason, sizeof(probe.reason),
                 "the CUDA driver reports no usable device (cuInit: error "
                 "%d, %s)",
                 rc, text);
        return;
    }
    if (n <= 0) {
        snprintf(probe.reason, sizeof(probe.reason),
                 "the CUDA driver sees no device (cuDeviceGetCount: 0; "
                 "check CUDA_VISIBLE_DEVICES)");
        return;
    }
    probe.count = n;
    HVD_DEBUG("gpu", "CUDA driver sees %d device(s)", n);
}

int hvd_mem_device_count(void) {
    pthread_once(&probe.once, probe_driver);
    return probe.count;
}

const char *hvd_mem_no_device_reason(void) {
    pthread_once(&probe.once, probe_driver);
    return probe.count > 0 ? "" : probe.reason;
}

void hvd_mem_classify(const void *ptr, hvd_meminfo *out) {
    int attrs[4] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_BUFFER_ID};
    unsigned int memtype = 0;
    int managed = 0, ordinal = -1;
    unsigned long long buffer_id = 0;
    void *data[4] = {&memtype, &managed, &ordinal, &buffer_id};

    out->type = HVD_MEM_HOST;
    out->device = -1;
    out->buffer_id = 0;
    if (ptr == NULL || hvd_mem_device_count() == 0)
        return;
    /* Unlike cuPointerGetAttribute, the plural form succeeds on memory
     * the driver does not know and leaves the values zero. */
    if (probe.attrs(4, attrs, data, (cu_deviceptr)(uintptr_t)ptr) != CU_SUCCESS)
        return;
    if (memtype == CU_MEMORYTYPE_DEVICE && !managed) {
        out->type = HVD_MEM_DEVICE;
        out->device = ordinal;
        out->buffer_id = buffer_id;
    }
}

void hvd_mem_describe(const hvd_meminfo *info, char *out, size_t outlen) {
    if (info->type == HVD_MEM_DEVICE)
        snprintf(out, outlen, "CUDA device %d memory", info->device);
    else
        snprintf(out, outlen, "host memory");
}

/* The driver's text for rc. */
static const char *cu_text(cu_result rc) {
    const char *text = NULL;

    if (probe.errstr == NULL || probe.errstr(rc, &text) != CU_SUCCESS ||
        text == NULL)
        text = "unknown error";
    return text;
}

/* 1 if GPUDirect RDMA writes into device need a flush before its kernels
 * read them: the device does not order them natively. Asked once. Under
 * probe.mu. */
static int needs_flush(int device) {
    int dev = 0, order = 0;

    if (device < 0 || device >= ORDERING_MAX)
        return 1;
    if (probe.needs_flush[device] >= 0)
        return probe.needs_flush[device];
    if (probe.devget == NULL || probe.devattr == NULL ||
        probe.devget(&dev, device) != CU_SUCCESS ||
        probe.devattr(&order,
                      CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
                      dev) != CU_SUCCESS)
        order = 0; /* unknown: flush */
    probe.needs_flush[device] =
        order < CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
    HVD_DEBUG("gpu",
              "CUDA device %d orders GPUDirect RDMA writes: %s (attribute "
              "%d)",
              device, probe.needs_flush[device] ? "no, flushed" : "yes", order);
    return probe.needs_flush[device];
}

void hvd_mem_flush_rdma_writes(int device) {
    cu_result rc;

    if (hvd_mem_device_count() == 0)
        return;
    pthread_mutex_lock(&probe.mu);
    if (!needs_flush(device)) {
        pthread_mutex_unlock(&probe.mu);
        return;
    }
    if (probe.flush == NULL) {
        if (!probe.flush_warned)
            HVD_WARN("gpu",
                     "CUDA device %d does not order GPUDirect RDMA writes and "
                     "this driver lacks cuFlushGPUDirectRDMAWrites (CUDA "
                     "11.3): device tensors received over RDMA may be read "
                     "before they are complete; set HVD_IB_GPUDIRECT=off",
                     device);
        probe.flush_warned = 1;
        pthread_mutex_unlock(&probe.mu);
        return;
    }
    rc = probe.flush(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                     CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
    if (rc != CU_SUCCESS && !probe.flush_warned) {
        HVD_WARN("gpu",
                 "cuFlushGPUDirectRDMAWrites(current context, owner) failed: "
                 "error %d, %s; device tensors received over RDMA may be "
                 "read before they are complete; set HVD_IB_GPUDIRECT=off",
                 rc, cu_text(rc));
        probe.flush_warned = 1;
    }
    pthread_mutex_unlock(&probe.mu);
}

void hvd_mem_sync_memops(const void *ptr) {
    const unsigned int one = 1;
    cu_result rc;

    if (hvd_mem_device_count() == 0 || probe.setattr == NULL)
        return;
    rc = probe.setattr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                       (cu_deviceptr)(uintptr_t)ptr);
    if (rc == CU_SUCCESS)
        return;
    pthread_mutex_lock(&probe.mu);
    if (!probe.sync_warned)
        HVD_WARN("gpu",
                 "cuPointerSetAttribute(SYNC_MEMOPS, %p) failed: error %d, "
                 "%s; a cudaMemcpy into a device tensor registered for RDMA "
                 "may return before the NIC can see its data: synchronize "
                 "before hvd reads it",
                 ptr, rc, cu_text(rc));
    probe.sync_warned = 1;
    pthread_mutex_unlock(&probe.mu);
}
