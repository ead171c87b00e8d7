/*
 * Which RDMA device, port and GID the verbs transport uses, and why none
 * can be used: the answer behind probe and behind the sentence that
 * HVD_TRANSPORT=verbs fails with where no device is usable.
 *
 * Selection: HVD_IB_DEVICE names the device (default: every device in
 * ibv_get_device_list's order), HVD_IB_PORT the port (default: the first
 * active one), HVD_IB_GID_INDEX the GID on a RoCE port (default: a RoCE v2
 * GID that holds an IPv4 address, else any RoCE v2 GID, else any GID).
 * InfiniBand ports are addressed by LID and need no GID.
 */
#ifndef HVD_TRANSPORT_VERBS_DEVICE_H
#define HVD_TRANSPORT_VERBS_DEVICE_H

#include <stddef.h>

#include "transport/verbs/seam.h"

/* Why no device is usable (0: one is). */
typedef enum {
    HVD_VDEV_OK = 0,
    HVD_VDEV_NO_DEVICE,      /* ibv_get_device_list found none */
    HVD_VDEV_NO_SUCH_DEVICE, /* HVD_IB_DEVICE names none of them */
    HVD_VDEV_OPEN_FAILED,    /* ibv_open_device or a query failed */
    HVD_VDEV_NO_PORT,        /* HVD_IB_PORT is not a port of the device */
    HVD_VDEV_PORT_DOWN,      /* no port is active */
    HVD_VDEV_NO_GID          /* a RoCE port without a usable GID */
} hvd_vdev_why;

typedef struct hvd_vdev_cfg {
    const char *device; /* NULL or "": any */
    int port;           /* 0: the first active one */
    int gid_index;      /* -1: chosen as above */
} hvd_vdev_cfg;

typedef struct hvd_vdev {
    struct ibv_context *ctx;
    char name[64];
    int port;
    int link_layer; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    int lid;
    int mtu;       /* enum ibv_mtu, the port's active MTU */
    int gid_index; /* -1 on InfiniBand without HVD_IB_GID_INDEX */
    union ibv_gid gid;
    int odp; /* on-demand paging for RC SEND and WRITE */
    struct ibv_device_attr attr;
} hvd_vdev;

/*
 * Opens the device and port to use. On success *out holds an open context
 * (close it with hvd_vdev_close) and HVD_VDEV_OK is returned. Otherwise
 * the reason code is returned and why (whylen bytes) gets a sentence that
 * says what is missing and what to do, e.g. "no RDMA device found
 * (ibv_get_device_list: no devices)"; *out is then closed.
 */
hvd_vdev_why hvd_vdev_open(const hvd_ibv_seam *seam, const hvd_vdev_cfg *cfg,
                           hvd_vdev *out, char *why, size_t whylen);

/* Closes what hvd_vdev_open opened; accepts a closed one. */
void hvd_vdev_close(const hvd_ibv_seam *seam, hvd_vdev *dev);

/* "InfiniBand" or "RoCE", for messages. */
const char *hvd_vdev_link_name(int link_layer);

#endif
