#include "gpu/nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "transport/base/error.h"
#include "transport/base/log.h"

#define MIN_VERSION NCCL_VERSION(2, 14, 0)

int hvd_nccl_header_version(void) { return NCCL_VERSION_CODE; }

static struct {
    pthread_once_t once;
    int ok;
    char why[320];
    hvd_nccl_api api;
} lib = {.once = PTHREAD_ONCE_INIT};

/* Looks name up; 0 if missing (why is set). */
static int sym(void *h, const char *name, void *fn_out) {
    void *p = dlsym(h, name);

    if (p == NULL) {
        snprintf(lib.why, sizeof(lib.why),
                 "the NCCL library lacks %s (NCCL 2.14 or later is needed)",
                 name);
        return 0;
    }
    *(void **)fn_out = p;
    return 1;
}

static void load(void) {
    const char *env = getenv("HVD_NCCL_LIBRARY");
    const char *tried[3] = {NULL, NULL, NULL};
    void *h = NULL;
    ncclResult_t (*get_version)(int *) = NULL;
    hvd_nccl_api *a = &lib.api;
    char err[200] = "";

    if (env != NULL && env[0] != '\0') {
        tried[0] = env;
    } else {
        tried[0] = "libnccl.so.2";
#ifdef HVD_NCCL_LIBRARY_PATH
        tried[1] = HVD_NCCL_LIBRARY_PATH;
#endif
    }
    for (int i = 0; i < 3 && tried[i] != NULL && h == NULL; i++) {
        h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL)
            snprintf(err, sizeof(err), "%s", dlerror());
    }
    if (h == NULL) {
        snprintf(lib.why, sizeof(lib.why),
                 "the NCCL library cannot be loaded (%s)%s", err,
                 env != NULL ? " from HVD_NCCL_LIBRARY" : "");
        return;
    }
    /* The handle stays open for the process. */
    if (!sym(h, "ncclGetVersion", &get_version) ||
        !sym(h, "ncclGetUniqueId", &a->get_unique_id) ||
        !sym(h, "ncclCommInitRankConfig", &a->comm_init_rank_config) ||
        !sym(h, "ncclCommGetAsyncError", &a->comm_get_async_error) ||
        !sym(h, "ncclCommAbort", &a->comm_abort) ||
        !sym(h, "ncclCommFinalize", &a->comm_finalize) ||
        !sym(h, "ncclCommDestroy", &a->comm_destroy) ||
        !sym(h, "ncclGetErrorString", &a->get_error_string) ||
        !sym(h, "ncclGetLastError", &a->get_last_error) ||
        !sym(h, "ncclAllReduce", &a->all_reduce) ||
        !sym(h, "ncclBroadcast", &a->broadcast) ||
        !sym(h, "ncclAllGather", &a->all_gather))
        return;
    if (get_version(&a->version) != ncclSuccess || a->version < MIN_VERSION) {
        snprintf(lib.why, sizeof(lib.why),
                 "the NCCL library is version %d; hvd needs %d or later",
                 a->version, MIN_VERSION);
        return;
    }
    lib.ok = 1;
    HVD_DEBUG("gpu", "NCCL %d loaded", a->version);
}

const hvd_nccl_api *hvd_nccl_load(char *why, size_t whylen) {
    pthread_once(&lib.once, load);
    if (!lib.ok) {
        if (why != NULL)
            snprintf(why, whylen, "%s", lib.why);
        return NULL;
    }
    return &lib.api;
}

hvd_status hvd_nccl_error(const hvd_nccl_api *api, ncclResult_t rc,
                          ncclComm_t comm, const char *call) {
    hvd_status st;
    const char *last = api->get_last_error(comm);

    switch (rc) {
    case ncclSuccess:
        return HVD_OK;
    case ncclRemoteError:
        st = HVD_ERR_PEER_LOST;
        break;
    case ncclSystemError:
        st = HVD_ERR_TRANSPORT;
        break;
    case ncclInvalidUsage:
        st = HVD_ERR_UNSUPPORTED;
        break;
    default:
        st = HVD_ERR_INTERNAL;
        break;
    }
    return hvd_error_set(
        st, "%s failed: %s%s%s%s", call, api->get_error_string(rc),
        last != NULL && last[0] ? " (" : "", last != NULL ? last : "",
        last != NULL && last[0] ? ")" : "");
}
