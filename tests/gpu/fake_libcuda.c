/*
 * A stand-in for the CUDA driver (libcuda.so.1), for tests on machines
 * without a GPU: it says there are two devices, and that the address
 * ranges a test declares (fake_cuda_add_range, fake_cuda_remove_range)
 * are their memory. The lookup is linear: a few thousand ranges. Nothing
 * else works: the CUDA runtime finds the driver too old and every call
 * of it fails, as on a machine whose driver cannot run this CUDA.
 *
 * hvd opens libcuda.so.1 with dlopen; a test puts this one first with
 * LD_LIBRARY_PATH. The values are the driver ABI's (cuda.h).
 */
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

enum { MAX_RANGES = 4096 };

static struct {
    uintptr_t base;
    size_t len;
    int ordinal;
    unsigned long long id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
} ranges[MAX_RANGES];
static int nranges;
static unsigned long long next_id = 1;

EXPORT void fake_cuda_add_range(void *base, size_t len, int ordinal);
EXPORT void fake_cuda_remove_range(void *base);
EXPORT int cuInit(unsigned int flags);
EXPORT int cuDeviceGetCount(int *count);
EXPORT int cuGetErrorString(int error, const char **text);
EXPORT int cuPointerGetAttributes(unsigned int n, int *attributes, void **data,
                                  unsigned long long ptr);

void fake_cuda_add_range(void *base, size_t len, int ordinal) {
    if (nranges < MAX_RANGES) {
        ranges[nranges].base = (uintptr_t)base;
        ranges[nranges].len = len;
        ranges[nranges].ordinal = ordinal;
        ranges[nranges].id = next_id++;
        nranges++;
    }
}

void fake_cuda_remove_range(void *base) {
    for (int i = 0; i < nranges; i++) {
        if (ranges[i].base == (uintptr_t)base) {
            ranges[i] = ranges[--nranges];
            return;
        }
    }
}

int cuInit(unsigned int flags) {
    (void)flags;
    return 0;
}

int cuDeviceGetCount(int *count) {
    *count = 2;
    return 0;
}

int cuGetErrorString(int error, const char **text) {
    (void)error;
    *text = "fake driver";
    return 0;
}

int cuPointerGetAttributes(unsigned int n, int *attributes, void **data,
                           unsigned long long ptr) {
    int found = -1;

    for (int i = 0; i < nranges; i++)
        if (ptr >= ranges[i].base && ptr < ranges[i].base + ranges[i].len)
            found = i;
    for (unsigned int k = 0; k < n; k++) {
        switch (attributes[k]) {
        case 2: /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
            *(unsigned int *)data[k] = found >= 0 ? 2u : 0u;
            break;
        case 8: /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
            *(unsigned int *)data[k] = 0;
            break;
        case 7: /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
            *(unsigned long long *)data[k] = found >= 0 ? ranges[found].id : 0;
            break;
        case 9: /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
            *(int *)data[k] = found >= 0 ? ranges[found].ordinal : -1;
            break;
        default:
            break;
        }
    }
    return 0;
}
