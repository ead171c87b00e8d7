/*
 * HVD_TRANSPORT=verbs on a machine where no rank has a usable RDMA device:
 * hvd_init must fail with HVD_ERR_UNSUPPORTED and a sentence that names
 * the reason and what to do, on every rank, and leave hvd uninitialized.
 * Prints "PASS verbs_refusal rank N" and exits 0 when it does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/hvd.h"

int main(void) {
    const char *rank = getenv("HVD_RANK");
    const char *reasons[] = {"no RDMA device found", "no active RDMA port",
                             "no such RDMA device",  "has no GID",
                             "HVD_IB_PORT=",         "ibv_open_device"};
    hvd_status st = hvd_init();
    const char *err = hvd_last_error();
    int reason = 0;

    printf("rank %s: hvd_init returned %d (%s): %s\n", rank ? rank : "?",
           (int)st, hvd_strerror(st), err);
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        reason |= strstr(err, reasons[i]) != NULL;
    if (st != HVD_ERR_UNSUPPORTED || !reason ||
        strstr(err, "HVD_TRANSPORT=verbs: ") == NULL ||
        strstr(err, "unset HVD_TRANSPORT or use tcp") == NULL ||
        hvd_initialized()) {
        printf("FAIL verbs_refusal rank %s\n", rank ? rank : "?");
        if (st == HVD_OK)
            hvd_shutdown();
        return 1;
    }
    printf("PASS verbs_refusal rank %s\n", rank ? rank : "?");
    return 0;
}
