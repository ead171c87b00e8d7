#include "transport/verbs/seam.h"

#include <errno.h>
#include <unistd.h>

#include "transport/base/memtype.h"

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

/* (A build without CUDA never asks: its params->gpu_device is -1.) */
static int cuda_devices(void) { return hvd_mem_device_count(); }

static int mem_type(const void *addr, uint64_t *buffer_id_out) {
    hvd_meminfo mi;

    hvd_mem_classify(addr, &mi);
    *buffer_id_out = mi.buffer_id;
    return (int)mi.type;
}

static void flush_rdma_writes(int device) { hvd_mem_flush_rdma_writes(device); }

static void sync_memops(const void *addr) { hvd_mem_sync_memops(addr); }

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len,
                             int access) {
    return ibv_reg_mr(pd, addr, len, access);
}

static int dereg_mr(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }

static struct ibv_pd *alloc_pd(struct ibv_context *ctx) {
    return ibv_alloc_pd(ctx);
}

static int dealloc_pd(struct ibv_pd *pd) { return ibv_dealloc_pd(pd); }

static struct ibv_comp_channel *create_comp_channel(struct ibv_context *ctx) {
    return ibv_create_comp_channel(ctx);
}

static int destroy_comp_channel(struct ibv_comp_channel *chan) {
    return ibv_destroy_comp_channel(chan);
}

static struct ibv_cq *create_cq(struct ibv_context *ctx, int cqe,
                                struct ibv_comp_channel *chan) {
    return ibv_create_cq(ctx, cqe, NULL, chan, 0);
}

static int destroy_cq(struct ibv_cq *cq) { return ibv_destroy_cq(cq); }

static int req_notify_cq(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

static int get_cq_event(struct ibv_comp_channel *chan, struct ibv_cq **cq) {
    void *ctx;
    return ibv_get_cq_event(chan, cq, &ctx);
}

static void ack_cq_events(struct ibv_cq *cq, unsigned int n) {
    ibv_ack_cq_events(cq, n);
}

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    return ibv_poll_cq(cq, n, wc);
}

static struct ibv_qp *create_qp(struct ibv_pd *pd,
                                struct ibv_qp_init_attr *attr) {
    return ibv_create_qp(pd, attr);
}

static int modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
    return ibv_modify_qp(qp, attr, mask);
}

static int destroy_qp(struct ibv_qp *qp) { return ibv_destroy_qp(qp); }

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                     struct ibv_send_wr **bad) {
    return ibv_post_send(qp, wr, bad);
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                     struct ibv_recv_wr **bad) {
    return ibv_post_recv(qp, wr, bad);
}

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
    .cuda_devices = cuda_devices,
    .mem_type = mem_type,
    .flush_rdma_writes = flush_rdma_writes,
    .sync_memops = sync_memops,
    .reg_mr = reg_mr,
    .dereg_mr = dereg_mr,
    .alloc_pd = alloc_pd,
    .dealloc_pd = dealloc_pd,
    .create_comp_channel = create_comp_channel,
    .destroy_comp_channel = destroy_comp_channel,
    .create_cq = create_cq,
    .destroy_cq = destroy_cq,
    .req_notify_cq = req_notify_cq,
    .get_cq_event = get_cq_event,
    .ack_cq_events = ack_cq_events,
    .poll_cq = poll_cq,
    .create_qp = create_qp,
    .modify_qp = modify_qp,
    .destroy_qp = destroy_qp,
    .post_send = post_send,
    .post_recv = post_recv,
};
