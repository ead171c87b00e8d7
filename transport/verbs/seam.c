#include "transport/verbs/seam.h"

#include <errno.h>
#include <unistd.h>

static struct ibv_device **get_device_list(int *num) {
    return ibv_get_device_list(num);
}

static void free_device_list(struct ibv_device **list) {
    ibv_free_device_list(list);
}

static const char *get_device_name(struct ibv_device *dev) {
    return ibv_get_device_name(dev);
}

static struct ibv_context *open_device(struct ibv_device *dev) {
    return ibv_open_device(dev);
}

static int close_device(struct ibv_context *ctx) {
    return ibv_close_device(ctx);
}

static int query_device(struct ibv_context *ctx, struct ibv_device_attr *attr) {
    return ibv_query_device(ctx, attr);
}

static int query_port(struct ibv_context *ctx, uint8_t port,
                      struct ibv_port_attr *attr) {
    return ibv_query_port(ctx, port, attr);
}

static int query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *entry) {
    return ibv_query_gid_ex(ctx, port, index, entry, 0);
}

static int odp_supported(struct ibv_context *ctx) {
    struct ibv_device_attr_ex attr;
    const uint32_t need = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE;

    if (ibv_query_device_ex(ctx, NULL, &attr) != 0)
        return 0;
    return (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0 &&
           (attr.odp_caps.per_transport_caps.rc_odp_caps & need) == need;
}

static int peermem_loaded(void) {
    return access("/sys/module/nvidia_peermem", F_OK) == 0 ||
           access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len,
                             int access) {
    return ibv_reg_mr(pd, addr, len, access);
}

static int dereg_mr(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }

const hvd_ibv_seam hvd_ibv_real = {
    .get_device_list = get_device_list,
    .free_device_list = free_device_list,
    .get_device_name = get_device_name,
    .open_device = open_device,
    .close_device = close_device,
    .query_device = query_device,
    .query_port = query_port,
    .query_gid_ex = query_gid_ex,
    .odp_supported = odp_supported,
    .peermem_loaded = peermem_loaded,
    .reg_mr = reg_mr,
    .dereg_mr = dereg_mr,
};
