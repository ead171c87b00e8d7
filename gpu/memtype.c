#include "gpu/memtype.h"

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
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_MEMORYTYPE_DEVICE = 2,
};

typedef cu_result (*cu_init_fn)(unsigned int flags);
typedef cu_result (*cu_count_fn)(int *count);
typedef cu_result (*cu_attrs_fn)(unsigned int n, int *attributes, void **data,
                                 cu_deviceptr ptr);
typedef cu_result (*cu_errstr_fn)(cu_result error, const char **text);

static struct {
    pthread_once_t once;
    int count;
    char reason[256];
    cu_attrs_fn attrs;
} probe = {.once = PTHREAD_ONCE_INIT};

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
