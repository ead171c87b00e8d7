/*
 * Loading libibverbs (transport/verbs/lib.h), and the functions of it that
 * libhvd calls, defined here as forwarders. Each has <infiniband/verbs.h>'s
 * prototype (its name in parentheses where the header also makes it a
 * macro); without the library each fails as libibverbs does without a
 * device, with errno ENOSYS, though the probe refuses the transport first.
 */
#include "transport/verbs/lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>

#include <infiniband/verbs.h>

#include "transport/base/dlib.h"

/* clang-format off */
#define HVD_IBV_FUNCTIONS(X) \
    X(_ibv_query_gid_ex) X(ibv_ack_cq_events) X(ibv_alloc_pd) \
    X(ibv_close_device) X(ibv_create_comp_channel) X(ibv_create_cq) \
    X(ibv_create_qp) X(ibv_dealloc_pd) X(ibv_dereg_mr) \
    X(ibv_destroy_comp_channel) X(ibv_destroy_cq) X(ibv_destroy_qp) \
    X(ibv_free_device_list) X(ibv_get_cq_event) X(ibv_get_device_list) \
    X(ibv_get_device_name) X(ibv_modify_qp) X(ibv_open_device) \
    X(ibv_port_state_str) X(ibv_query_device) X(ibv_query_port) \
    X(ibv_reg_mr_iova2) X(ibv_wc_status_str)
/* clang-format on */

#define HVD_IBV_SLOT(name) __typeof__(name) *f_##name;
static struct { HVD_IBV_FUNCTIONS(HVD_IBV_SLOT) } lib;

#define HVD_IBV_SYM(name) {#name, (void **)&lib.f_##name},
static const hvd_dl_symbol symbols[] = {HVD_IBV_FUNCTIONS(HVD_IBV_SYM)};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded;
static char why[256];

static void load(void) {
    loaded = hvd_dl_load(HVD_IBV_SONAME, RTLD_NOW | RTLD_LOCAL, 0, symbols,
                         sizeof(symbols) / sizeof(symbols[0]),
                         "the verbs transport needs libibverbs (Debian: "
                         "apt-get install libibverbs1 and the provider of "
                         "the RDMA device, e.g. rdma-core)",
                         why, sizeof(why));
}

int hvd_ibv_lib_load(void) {
    pthread_once(&once, load);
    return loaded;
}

const char *hvd_ibv_lib_why(void) {
    hvd_ibv_lib_load();
    return why;
}

/* The forwarders: R(value) when the library is missing. */
#define FORWARD(name, missing, ...)                                            \
    do {                                                                       \
        if (!hvd_ibv_lib_load()) {                                             \
            errno = ENOSYS;                                                    \
            return missing;                                                    \
        }                                                                      \
        return lib.f_##name(__VA_ARGS__);                                      \
    } while (0)

int(_ibv_query_gid_ex)(struct ibv_context *context, uint32_t port_num,
                       uint32_t gid_index, struct ibv_gid_entry *entry,
                       uint32_t flags, size_t entry_size) {
    FORWARD(_ibv_query_gid_ex, ENOSYS, context, port_num, gid_index, entry,
            flags, entry_size);
}

void(ibv_ack_cq_events)(struct ibv_cq *cq, unsigned int nevents) {
    if (hvd_ibv_lib_load())
        lib.f_ibv_ack_cq_events(cq, nevents);
}

struct ibv_pd *(ibv_alloc_pd)(struct ibv_context *context) {
    FORWARD(ibv_alloc_pd, NULL, context);
}

int(ibv_close_device)(struct ibv_context *context) {
    FORWARD(ibv_close_device, -1, context);
}

struct ibv_comp_channel *(
    ibv_create_comp_channel)(struct ibv_context *context) {
    FORWARD(ibv_create_comp_channel, NULL, context);
}

struct ibv_cq *(ibv_create_cq)(struct ibv_context *context, int cqe,
                               void *cq_context,
                               struct ibv_comp_channel *channel,
                               int comp_vector) {
    FORWARD(ibv_create_cq, NULL, context, cqe, cq_context, channel,
            comp_vector);
}

struct ibv_qp *(ibv_create_qp)(struct ibv_pd *pd,
                               struct ibv_qp_init_attr *qp_init_attr) {
    FORWARD(ibv_create_qp, NULL, pd, qp_init_attr);
}

int(ibv_dealloc_pd)(struct ibv_pd *pd) { FORWARD(ibv_dealloc_pd, ENOSYS, pd); }

int(ibv_dereg_mr)(struct ibv_mr *mr) { FORWARD(ibv_dereg_mr, ENOSYS, mr); }

int(ibv_destroy_comp_channel)(struct ibv_comp_channel *channel) {
    FORWARD(ibv_destroy_comp_channel, -1, channel);
}

int(ibv_destroy_cq)(struct ibv_cq *cq) { FORWARD(ibv_destroy_cq, ENOSYS, cq); }

int(ibv_destroy_qp)(struct ibv_qp *qp) { FORWARD(ibv_destroy_qp, ENOSYS, qp); }

void(ibv_free_device_list)(struct ibv_device **list) {
    if (hvd_ibv_lib_load())
        lib.f_ibv_free_device_list(list);
}

int(ibv_get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq,
                      void **cq_context) {
    FORWARD(ibv_get_cq_event, -1, channel, cq, cq_context);
}

struct ibv_device **(ibv_get_device_list)(int *num_devices) {
    FORWARD(ibv_get_device_list, NULL, num_devices);
}

const char *(ibv_get_device_name)(struct ibv_device *device) {
    FORWARD(ibv_get_device_name, NULL, device);
}

int(ibv_modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) {
    FORWARD(ibv_modify_qp, ENOSYS, qp, attr, attr_mask);
}

struct ibv_context *(ibv_open_device)(struct ibv_device *device) {
    FORWARD(ibv_open_device, NULL, device);
}

const char *(ibv_port_state_str)(enum ibv_port_state port_state) {
    FORWARD(ibv_port_state_str, "unknown", port_state);
}

int(ibv_query_device)(struct ibv_context *context,
                      struct ibv_device_attr *device_attr) {
    FORWARD(ibv_query_device, ENOSYS, context, device_attr);
}

int(ibv_query_port)(struct ibv_context *context, uint8_t port_num,
                    struct _compat_ibv_port_attr *port_attr) {
    FORWARD(ibv_query_port, ENOSYS, context, port_num, port_attr);
}

struct ibv_mr *(ibv_reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t length,
                                  uint64_t iova, unsigned int access) {
    FORWARD(ibv_reg_mr_iova2, NULL, pd, addr, length, iova, access);
}

const char *(ibv_wc_status_str)(enum ibv_wc_status status) {
    FORWARD(ibv_wc_status_str, "unknown", status);
}
