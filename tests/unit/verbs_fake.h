/*
 * A fake libibverbs behind the verbs transport's seam
 * (transport/verbs/seam.h), for unit tests on machines without an RDMA
 * device.
 *
 * - Devices: a configurable list (names, ports, port states, link layers,
 *   GID tables), or none at all, so that device selection and the refusal
 *   sentences can be tested.
 * - Registrations: counted, checked (every lkey/rkey a work request uses
 *   must lie in a live region with the right access), and failed on
 *   demand.
 * - A loopback fabric: queue pairs of every transport in the process
 *   (one thread per rank) connect by QPN; a SEND or RDMA WRITE WITH
 *   IMMEDIATE is delivered when posted (or, when the target has no
 *   receive posted, held and retried as a real HCA does on "receiver not
 *   ready"), completions go to the completion queues and wake their
 *   completion channels (an eventfd). A destroyed queue pair makes sends
 *   to it fail with IBV_WC_RETRY_EXC_ERR, as a dead peer does.
 *
 * Everything is under one mutex, so the ranks' threads may post and poll
 * at will.
 */
#ifndef HVD_TESTS_VERBS_FAKE_H
#define HVD_TESTS_VERBS_FAKE_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"
#include "transport/verbs/seam.h"

#define FAKE_MAX_DEVS 4
#define FAKE_MAX_PORTS 2
#define FAKE_MAX_GIDS 8

typedef struct fake_gid {
    int valid;
    int type; /* IBV_GID_TYPE_IB, _ROCE_V1, _ROCE_V2 */
    uint8_t raw[16];
} fake_gid;

typedef struct fake_port {
    int state;      /* IBV_PORT_ACTIVE, IBV_PORT_DOWN, ... */
    int link_layer; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    int lid;
    int ngids;
    fake_gid gids[FAKE_MAX_GIDS];
} fake_port;

typedef struct fake_dev {
    char name[32];
    int nports;
    int open_fails; /* ibv_open_device returns NULL */
    fake_port ports[FAKE_MAX_PORTS];
} fake_dev;

typedef struct fake_config {
    int ndevs;
    int list_errno; /* with ndevs 0: ibv_get_device_list returns NULL with
                       this errno (0: an empty list) */
    fake_dev devs[FAKE_MAX_DEVS];
    int odp;
    int peermem;
    int cuda_devices;   /* what the seam's cuda_devices says */
    int reg_fail_after; /* > 0: the n-th later ibv_reg_mr fails (ENOMEM) */
    int reg_fail_over;  /* > 0: ibv_reg_mr of more bytes fails (EFAULT) */
} fake_config;

typedef struct fake_stats {
    int regs;       /* successful ibv_reg_mr */
    int deregs;     /* ibv_dereg_mr */
    int live_mrs;   /* registered now */
    int bad_access; /* work requests that used memory not registered */
    int cq_overflows;
    int rnr_waits;    /* deliveries held for want of a posted receive */
    int sends;        /* SENDs delivered */
    int writes;       /* RDMA WRITEs delivered */
    int plain_writes; /* of which without immediate */
    int flushes;      /* flush_rdma_writes calls */
    int sync_memops;  /* sync_memops calls */
    int last_access;  /* of the last ibv_reg_mr */
    uintptr_t last_addr;
    size_t last_len;
} fake_stats;

extern const hvd_ibv_seam fake_seam;

/* Resets everything to one InfiniBand device "fake0", port 1 active,
 * LID 1, no ODP, no peermem. Call with no fake object alive. */
void fake_reset(void);

/* The configuration, to change before opening devices. */
fake_config *fake_cfg(void);

void fake_get_stats(fake_stats *out);

/* For the calling thread only: ibv_get_device_list finds nothing (a rank
 * without a device), and queue pairs it creates live on island n: sends
 * between queue pairs of different islands fail with
 * IBV_WC_RETRY_EXC_ERR (ports that cannot reach each other). */
void fake_hide_devices(int hide);
void fake_set_island(int n);

/*
 * Simulated CUDA device memory for GPUDirect RDMA: whole pages (mmap)
 * that the seam's mem_type reports as device memory, each with a buffer
 * id of its own. With protect set they are inaccessible (PROT_NONE) to
 * the CPU: only the fake HCA (opening them for the length of its copy)
 * and fake_dev_write/fake_dev_read (cudaMemcpy) reach them, so a
 * transport that touches device memory with the CPU crashes the test.
 */
void *fake_dev_alloc(size_t len, int protect);
void fake_dev_free(void *p);
/* The allocation at p is freed and a new one made at the same address (as
 * cudaFree then cudaMalloc may do): same memory, a new buffer id. */
void fake_dev_reuse(void *p);
void fake_dev_write(void *dst, const void *src, size_t n);
void fake_dev_read(void *dst, const void *src, size_t n);

/* A fake registration's region. */
void fake_mr_range(const struct ibv_mr *mr, uintptr_t *start_out,
                   size_t *len_out);

/* An in-process bootstrap for n ranks (threads): allgather meets at a
 * barrier. fake_bootstrap(b, r) is rank r's. */
typedef struct fake_boot fake_boot;
fake_boot *fake_boot_create(int n);
hvd_bootstrap *fake_bootstrap(fake_boot *b, int rank);
void fake_boot_destroy(fake_boot *b);

/* A rank's HVD_IB_* settings as a table of variables for params->env:
 * fake_ib_settings_fill writes them from numbers (mr_cache and gpudirect:
 * 0 off, 1 on, 2 auto; gpudirect < 0 leaves it unset) and points p at
 * them; s must outlive the open. */
typedef struct fake_ib_settings {
    char chunk[32], ring[32];
    hvd_env_var vars[5];
} fake_ib_settings;
void fake_ib_settings_fill(fake_ib_settings *s, size_t chunk_bytes,
                           int ring_chunks, int mr_cache, int gpudirect,
                           hvd_transport_params *p);

#endif
