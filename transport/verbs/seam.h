/*
 * The seam between the verbs transport and libibverbs: every libibverbs
 * call the transport makes goes through this table (and the two questions
 * it asks the CUDA driver for GPUDirect RDMA), so that unit tests
 * can stand a fake in for the library on a machine without an RDMA
 * device: device lists with ports down, registrations that fail, counted
 * deregistrations, and a loopback fabric in which several transports of
 * one process exchange real messages (tests/unit/verbs_fake.h). The
 * library uses hvd_ibv_real; an indirect call costs nothing next to a
 * doorbell.
 *
 * Members take and return what the libibverbs call of the same name does.
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
    /* CUDA devices this process can use: 0 where hvd was built without
     * CUDA or the driver sees none (transport/base/memtype.h). */
    int (*cuda_devices)(void);
    /* Where addr points: HVD_MEM_HOST or HVD_MEM_DEVICE (CUDA device
     * memory, not managed), and for device memory the driver's id of its
     * allocation in *buffer_id_out (0 otherwise), through
     * cuPointerGetAttributes (transport/base/memtype.h). */
    int (*mem_type)(const void *addr, uint64_t *buffer_id_out);
    /* Makes what the HCA wrote into memory of CUDA device `device` visible
     * to its kernels (hvd_mem_flush_rdma_writes); failures are logged. */
    void (*flush_rdma_writes)(int device);
    /* Makes synchronous CUDA copies into the device allocation at addr
     * complete before they return (hvd_mem_sync_memops), for memory the
     * NIC reads; failures are logged. */
    void (*sync_memops)(const void *addr);
    /* ibv_reg_mr: NULL (errno set) on failure. */
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len,
                             int access);
    int (*dereg_mr)(struct ibv_mr *mr);

    /* Resources, completions and posting. */
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *chan);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe,
                                struct ibv_comp_channel *chan);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*req_notify_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *chan, struct ibv_cq **cq);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
    int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd,
                                struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
                     struct ibv_send_wr **bad);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                     struct ibv_recv_wr **bad);
} hvd_ibv_seam;

/* The real library. */
extern const hvd_ibv_seam hvd_ibv_real;

#endif
