/*
 * The seam between the verbs transport and libibverbs: the calls that find,
 * open and query devices and that register memory go through this table,
 * so that unit tests can stand a fake in for the library (device lists
 * with ports down, registrations that fail, counted deregistrations) on a
 * machine without an RDMA device. The transport itself uses hvd_ibv_real.
 *
 * Queue pairs, completion queues and posting stay direct libibverbs calls:
 * no fake could say anything useful about them.
 */
#ifndef HVD_TRANSPORT_VERBS_SEAM_H
#define HVD_TRANSPORT_VERBS_SEAM_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

typedef struct hvd_ibv_seam {
    /* ibv_get_device_list: NULL (errno set) or a NULL-terminated list. */
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    /* 0 or an errno value. */
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port,
                      struct ibv_port_attr *attr);
    int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *entry);
    /* 1 if the device can register memory on demand (ODP) for RC SEND and
     * RDMA WRITE as requester. */
    int (*odp_supported)(struct ibv_context *ctx);
    /* 1 if the nvidia-peermem module (or the older nv_peer_mem) is loaded,
     * so ibv_reg_mr accepts CUDA device pointers. */
    int (*peermem_loaded)(void);
    /* ibv_reg_mr: NULL (errno set) on failure. */
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len,
                             int access);
    int (*dereg_mr)(struct ibv_mr *mr);
} hvd_ibv_seam;

/* The real library. */
extern const hvd_ibv_seam hvd_ibv_real;

#endif
