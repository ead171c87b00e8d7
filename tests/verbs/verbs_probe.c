/*
 * Says whether the verbs transport could run on this machine, with the
 * HVD_IB_* settings of the environment: prints "usable: DEVICE..." and
 * exits 0, or prints "not usable: REASON" and exits 1. The verbs tests use
 * it to decide between running and SKIP (77).
 */
#include <stdio.h>
#include <string.h>

#include "api/runtime/config.h"
#include "transport/base/error.h"
#include "transport/transport.h"

int main(void) {
    const hvd_transport_ops *ops;
    hvd_transport_params p;
    hvd_config cfg;
    hvd_caps caps;

    if (hvd_config_load(hvd_env_getenv, NULL, &cfg) != HVD_OK ||
        hvd_transport_lookup("verbs", &ops) != HVD_OK) {
        printf("not usable: %s\n", hvd_error_get());
        return 1;
    }
    /* The transport reads its HVD_IB_* settings from the environment. */
    memset(&p, 0, sizeof(p));
    p.env = hvd_env_getenv;
    if (ops->probe(&p, &caps) != HVD_OK) {
        printf("not usable: %s\n", hvd_error_get());
        return 1;
    }
    if (!caps.usable) {
        printf("not usable: %s\n", caps.reason);
        return 1;
    }
    printf("usable\n");
    return 0;
}
