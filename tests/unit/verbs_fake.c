#include "verbs_fake.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transport/base/error.h"

/* ------------------------------------------------------------------ */
/* State                                                               */

typedef struct fmr {
    struct ibv_mr mr;
    int access;
    struct fmr *next;
} fmr;

typedef struct fchan {
    struct ibv_comp_channel ch;
    struct fcq *cq; /* the one CQ with an event pending, if any */
} fchan;

typedef struct fcq {
    struct ibv_cq cq;
    struct ibv_wc *v;
    int cap;
    int head;
    int count;
    int armed;
    fchan *chan;
} fcq;

typedef struct frecv {
    uint64_t wr_id;
    uint64_t addr;
    uint32_t len;
    uint32_t lkey;
} frecv;

/* A send work request not delivered yet (receiver not ready). */
typedef struct fsend {
    uint64_t wr_id;
    int opcode;
    int signaled;
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    uint64_t addr;
    uint32_t len;
    uint32_t lkey;
} fsend;

typedef struct fqp {
    struct ibv_qp qp;
    fcq *scq;
    fcq *rcq;
    int qstate;
    uint32_t dest;
    frecv *rq;
    int rq_cap;
    int rq_head;
    int rq_count;
    fsend *held;
    int held_cap;
    int held_head;
    int held_count;
    int max_send;
    int outstanding; /* sends posted and not completed */
    int island;
    struct fqp *next;
} fqp;

typedef struct fctx {
    struct ibv_context ctx;
    int dev;
} fctx;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static fake_config cfg;
static fake_stats stats;
static struct ibv_device devices[FAKE_MAX_DEVS];
static struct ibv_device *device_list[FAKE_MAX_DEVS + 1];
static fmr *mrs;
static fqp *qps;
static uint32_t next_key = 0x100;
static uint32_t next_qpn = 0x40;
/* Simulated device memory. */
#define MAX_DEV_RANGES 4096
static struct drange {
    uintptr_t base;
    size_t len; /* whole pages */
    uint64_t id;
    int protect;
} dranges[MAX_DEV_RANGES];
static int ndranges;
static uint64_t next_buffer_id = 1;
static __thread int hide_devices;
static __thread int island;

void fake_hide_devices(int hide) { hide_devices = hide; }

void fake_set_island(int n) { island = n; }

void fake_reset(void) {
    pthread_mutex_lock(&mu);
    memset(&cfg, 0, sizeof(cfg));
    memset(&stats, 0, sizeof(stats));
    cfg.ndevs = 1;
    snprintf(cfg.devs[0].name, sizeof(cfg.devs[0].name), "fake0");
    cfg.devs[0].nports = 1;
    cfg.devs[0].ports[0].state = IBV_PORT_ACTIVE;
    cfg.devs[0].ports[0].link_layer = IBV_LINK_LAYER_INFINIBAND;
    cfg.devs[0].ports[0].lid = 1;
    cfg.devs[0].ports[0].ngids = 1;
    cfg.devs[0].ports[0].gids[0].valid = 1;
    cfg.devs[0].ports[0].gids[0].type = IBV_GID_TYPE_IB;
    cfg.devs[0].ports[0].gids[0].raw[0] = 0xfe;
    cfg.devs[0].ports[0].gids[0].raw[1] = 0x80;
    cfg.devs[0].ports[0].gids[0].raw[15] = 1;
    mrs = NULL;
    qps = NULL;
    ndranges = 0;
    pthread_mutex_unlock(&mu);
}

/* ------------------------------------------------------------------ */
/* Simulated device memory                                             */

static size_t pages(size_t len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (len + page - 1) / page * page;
}

void *fake_dev_alloc(size_t len, int protect) {
    size_t n = pages(len ? len : 1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);

    if (p == MAP_FAILED)
        return NULL;
    pthread_mutex_lock(&mu);
    if (ndranges == MAX_DEV_RANGES) {
        pthread_mutex_unlock(&mu);
        munmap(p, n);
        return NULL;
    }
    dranges[ndranges++] = (struct drange){.base = (uintptr_t)p,
                                          .len = n,
                                          .id = next_buffer_id++,
                                          .protect = protect};
    if (protect)
        mprotect(p, n, PROT_NONE);
    pthread_mutex_unlock(&mu);
    return p;
}

static struct drange *drange_of(uintptr_t a) {
    for (int i = 0; i < ndranges; i++)
        if (a >= dranges[i].base && a < dranges[i].base + dranges[i].len)
            return &dranges[i];
    return NULL;
}

void fake_dev_free(void *p) {
    struct drange *r;
    size_t n = 0;

    pthread_mutex_lock(&mu);
    r = drange_of((uintptr_t)p);
    if (r != NULL) {
        n = r->len;
        *r = dranges[--ndranges];
    }
    pthread_mutex_unlock(&mu);
    if (n > 0)
        munmap(p, n);
}

void fake_dev_reuse(void *p) {
    struct drange *r;

    pthread_mutex_lock(&mu);
    r = drange_of((uintptr_t)p);
    if (r != NULL)
        r->id = next_buffer_id++;
    pthread_mutex_unlock(&mu);
}

/* Under mu: opens (1) or closes (0) the protected ranges that
 * [a, a + n) touches. */
static void dev_open(uintptr_t a, size_t n, int open) {
    for (int i = 0; i < ndranges && n > 0; i++) {
        struct drange *r = &dranges[i];
        if (r->protect && a < r->base + r->len && r->base < a + n)
            mprotect((void *)r->base, r->len,
                     open ? PROT_READ | PROT_WRITE : PROT_NONE);
    }
}

/* Under mu: a copy by the HCA, or by cudaMemcpy. */
static void dma_copy(void *dst, const void *src, size_t n) {
    dev_open((uintptr_t)dst, n, 1);
    dev_open((uintptr_t)src, n, 1);
    memcpy(dst, src, n);
    dev_open((uintptr_t)dst, n, 0);
    dev_open((uintptr_t)src, n, 0);
}

void fake_dev_write(void *dst, const void *src, size_t n) {
    pthread_mutex_lock(&mu);
    dma_copy(dst, src, n);
    pthread_mutex_unlock(&mu);
}

void fake_dev_read(void *dst, const void *src, size_t n) {
    pthread_mutex_lock(&mu);
    dma_copy(dst, src, n);
    pthread_mutex_unlock(&mu);
}

static int cuda_devices(void) { return cfg.cuda_devices; }

static void flush_rdma_writes(int device) {
    (void)device;
    pthread_mutex_lock(&mu);
    stats.flushes++;
    pthread_mutex_unlock(&mu);
}

static void sync_memops(const void *addr) {
    (void)addr;
    pthread_mutex_lock(&mu);
    stats.sync_memops++;
    pthread_mutex_unlock(&mu);
}

static int mem_type(const void *addr, uint64_t *buffer_id_out) {
    struct drange *r;
    int type = HVD_MEM_HOST;

    pthread_mutex_lock(&mu);
    r = drange_of((uintptr_t)addr);
    *buffer_id_out = r != NULL ? r->id : 0;
    if (r != NULL)
        type = HVD_MEM_DEVICE;
    pthread_mutex_unlock(&mu);
    return type;
}

fake_config *fake_cfg(void) { return &cfg; }

void fake_get_stats(fake_stats *out) {
    pthread_mutex_lock(&mu);
    *out = stats;
    pthread_mutex_unlock(&mu);
}

void fake_mr_range(const struct ibv_mr *mr, uintptr_t *start_out,
                   size_t *len_out) {
    *start_out = (uintptr_t)mr->addr;
    *len_out = mr->length;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */

static struct ibv_device **get_device_list(int *num) {
    struct ibv_device **l;

    pthread_mutex_lock(&mu);
    if (hide_devices) {
        *num = 0;
        l = calloc(1, sizeof(*l));
        pthread_mutex_unlock(&mu);
        return l;
    }
    if (cfg.ndevs == 0 && cfg.list_errno != 0) {
        errno = cfg.list_errno;
        *num = 0;
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    for (int i = 0; i < cfg.ndevs; i++) {
        /* Written only when it changes: other threads read the names of
         * a list they got earlier without the lock, as real libibverbs
         * allows (ThreadSanitizer saw the rewrite race with them). */
        if (strcmp(devices[i].name, cfg.devs[i].name) != 0)
            snprintf(devices[i].name, sizeof(devices[i].name), "%s",
                     cfg.devs[i].name);
        device_list[i] = &devices[i];
    }
    device_list[cfg.ndevs] = NULL;
    *num = cfg.ndevs;
    l = malloc(sizeof(device_list));
    if (l != NULL)
        memcpy(l, device_list, sizeof(device_list));
    pthread_mutex_unlock(&mu);
    return l;
}

static void free_device_list(struct ibv_device **list) { free(list); }

static const char *get_device_name(struct ibv_device *dev) { return dev->name; }

static struct ibv_context *open_device(struct ibv_device *dev) {
    int i = (int)(dev - devices);
    fctx *c;

    if (i < 0 || i >= cfg.ndevs || cfg.devs[i].open_fails) {
        errno = EACCES;
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->ctx.device = dev;
    c->dev = i;
    return &c->ctx;
}

static int close_device(struct ibv_context *ctx) {
    free(ctx);
    return 0;
}

static int query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
    fctx *c = (fctx *)ctx;

    memset(a, 0, sizeof(*a));
    a->phys_port_cnt = (uint8_t)cfg.devs[c->dev].nports;
    a->max_qp_wr = 16384;
    a->max_cqe = 1 << 20;
    return 0;
}

static int query_port(struct ibv_context *ctx, uint8_t port,
                      struct ibv_port_attr *a) {
    fctx *c = (fctx *)ctx;
    const fake_port *p;

    if (port < 1 || port > cfg.devs[c->dev].nports)
        return EINVAL;
    p = &cfg.devs[c->dev].ports[port - 1];
    memset(a, 0, sizeof(*a));
    a->state = (enum ibv_port_state)p->state;
    a->link_layer = (uint8_t)p->link_layer;
    a->lid = (uint16_t)p->lid;
    a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = p->ngids;
    return 0;
}

static int query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *e) {
    fctx *c = (fctx *)ctx;
    const fake_port *p;

    if (port < 1 || (int)port > cfg.devs[c->dev].nports)
        return EINVAL;
    p = &cfg.devs[c->dev].ports[port - 1];
    if ((int)index >= p->ngids || !p->gids[index].valid)
        return ENODATA;
    memset(e, 0, sizeof(*e));
    memcpy(e->gid.raw, p->gids[index].raw, 16);
    e->gid_index = index;
    e->port_num = port;
    e->gid_type = (uint32_t)p->gids[index].type;
    return 0;
}

static int odp_supported(struct ibv_context *ctx) {
    (void)ctx;
    return cfg.odp;
}

static int peermem_loaded(void) { return cfg.peermem; }

/* ------------------------------------------------------------------ */
/* Memory                                                              */

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len,
                             int access) {
    fmr *m;

    pthread_mutex_lock(&mu);
    if (cfg.reg_fail_after > 0 && --cfg.reg_fail_after == 0) {
        pthread_mutex_unlock(&mu);
        errno = ENOMEM;
        return NULL;
    }
    if (cfg.reg_fail_over > 0 && len > (size_t)cfg.reg_fail_over) {
        pthread_mutex_unlock(&mu);
        errno = EFAULT;
        return NULL;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        pthread_mutex_unlock(&mu);
        errno = ENOMEM;
        return NULL;
    }
    m->mr.pd = pd;
    m->mr.context = pd != NULL ? pd->context : NULL;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = next_key;
    m->mr.rkey = next_key + 1;
    next_key += 2;
    m->access = access;
    m->next = mrs;
    mrs = m;
    stats.regs++;
    stats.live_mrs++;
    stats.last_access = access;
    stats.last_addr = (uintptr_t)addr;
    stats.last_len = len;
    pthread_mutex_unlock(&mu);
    return &m->mr;
}

static int dereg_mr(struct ibv_mr *mr) {
    pthread_mutex_lock(&mu);
    for (fmr **p = &mrs; *p != NULL; p = &(*p)->next) {
        if (&(*p)->mr == mr) {
            fmr *m = *p;
            *p = m->next;
            free(m);
            stats.deregs++;
            stats.live_mrs--;
            pthread_mutex_unlock(&mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&mu);
    return EINVAL;
}

/* The region of key covering [addr, addr + len) with access, or NULL. */
static fmr *find_mr(uint32_t key, int remote, uint64_t addr, uint32_t len,
                    int access) {
    for (fmr *m = mrs; m != NULL; m = m->next) {
        uint64_t a = (uintptr_t)m->mr.addr;
        if ((remote ? m->mr.rkey : m->mr.lkey) != key)
            continue;
        if (addr < a || addr + len > a + m->mr.length ||
            (m->access & access) != access)
            return NULL;
        return m;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Resources                                                           */

static struct ibv_pd *alloc_pd(struct ibv_context *ctx) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd != NULL)
        pd->context = ctx;
    return pd;
}

static int dealloc_pd(struct ibv_pd *pd) {
    free(pd);
    return 0;
}

static struct ibv_comp_channel *create_comp_channel(struct ibv_context *ctx) {
    fchan *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->ch.context = ctx;
    c->ch.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->ch.fd < 0) {
        free(c);
        return NULL;
    }
    return &c->ch;
}

static int destroy_comp_channel(struct ibv_comp_channel *ch) {
    close(ch->fd);
    free(ch);
    return 0;
}

static struct ibv_cq *create_cq(struct ibv_context *ctx, int cqe,
                                struct ibv_comp_channel *chan) {
    fcq *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->v = calloc((size_t)cqe, sizeof(*c->v));
    if (c->v == NULL) {
        free(c);
        return NULL;
    }
    c->cap = cqe;
    c->chan = (fchan *)chan;
    c->cq.context = ctx;
    c->cq.channel = chan;
    c->cq.cqe = cqe;
    return &c->cq;
}

static int destroy_cq(struct ibv_cq *cq) {
    fcq *c = (fcq *)cq;

    free(c->v);
    free(c);
    return 0;
}

static int req_notify_cq(struct ibv_cq *cq) {
    pthread_mutex_lock(&mu);
    ((fcq *)cq)->armed = 1;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq) {
    fchan *c = (fchan *)ch;
    uint64_t n;

    if (read(ch->fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
        return -1;
    pthread_mutex_lock(&mu);
    *cq = &c->cq->cq;
    pthread_mutex_unlock(&mu);
    return 0;
}

static void ack_cq_events(struct ibv_cq *cq, unsigned int n) {
    (void)cq;
    (void)n;
}

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    fcq *c = (fcq *)cq;
    int k = 0;

    pthread_mutex_lock(&mu);
    while (k < n && c->count > 0) {
        wc[k++] = c->v[c->head];
        c->head = (c->head + 1) % c->cap;
        c->count--;
    }
    pthread_mutex_unlock(&mu);
    return k;
}

/* Under mu. */
static void push_cqe(fcq *c, const struct ibv_wc *wc) {
    uint64_t one = 1;

    if (c->count >= c->cap) {
        stats.cq_overflows++;
        return;
    }
    c->v[(c->head + c->count) % c->cap] = *wc;
    c->count++;
    if (c->armed && c->chan != NULL) {
        c->armed = 0;
        c->chan->cq = c;
        if (write(c->chan->ch.fd, &one, sizeof(one)) < 0)
            stats.cq_overflows++;
    }
}

static fqp *find_qp(uint32_t qpn) {
    for (fqp *q = qps; q != NULL; q = q->next)
        if (q->qp.qp_num == qpn)
            return q;
    return NULL;
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
    fqp *q = calloc(1, sizeof(*q));

    if (q == NULL)
        return NULL;
    q->rq_cap = (int)a->cap.max_recv_wr;
    q->held_cap = (int)a->cap.max_send_wr;
    q->max_send = (int)a->cap.max_send_wr;
    q->rq = calloc((size_t)q->rq_cap, sizeof(*q->rq));
    q->held = calloc((size_t)q->held_cap, sizeof(*q->held));
    if (q->rq == NULL || q->held == NULL) {
        free(q->rq);
        free(q->held);
        free(q);
        return NULL;
    }
    q->scq = (fcq *)a->send_cq;
    q->rcq = (fcq *)a->recv_cq;
    q->qp.pd = pd;
    q->qp.context = pd->context;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_type = IBV_QPT_RC;
    q->qstate = IBV_QPS_RESET;
    q->island = island;
    pthread_mutex_lock(&mu);
    q->qp.qp_num = next_qpn++;
    q->next = qps;
    qps = q;
    pthread_mutex_unlock(&mu);
    return &q->qp;
}

/* Under mu: completes a send work request. */
static void send_cqe(fqp *q, const fsend *s, enum ibv_wc_status st) {
    struct ibv_wc wc;

    q->outstanding--;
    if (!s->signaled && st == IBV_WC_SUCCESS)
        return;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = s->wr_id;
    wc.status = st;
    wc.opcode = s->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
    wc.qp_num = q->qp.qp_num;
    push_cqe(q->scq, &wc);
}

/* Under mu: the queue pair goes to the error state; what is held and
 * posted completes with a flush error (the first held send with first). */
static void qp_error(fqp *q, enum ibv_wc_status first) {
    q->qstate = IBV_QPS_ERR;
    while (q->held_count > 0) {
        fsend *s = &q->held[q->held_head];
        q->held_head = (q->held_head + 1) % q->held_cap;
        q->held_count--;
        send_cqe(q, s, first);
        first = IBV_WC_WR_FLUSH_ERR;
    }
    while (q->rq_count > 0) {
        struct ibv_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = q->rq[q->rq_head].wr_id;
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.qp_num = q->qp.qp_num;
        q->rq_head = (q->rq_head + 1) % q->rq_cap;
        q->rq_count--;
        push_cqe(q->rcq, &wc);
    }
}

/*
 * Under mu: delivers the held sends of q that can go. Returns 0 when all
 * went or the target has no receive posted (they wait), -1 when q failed.
 */
static int deliver(fqp *q) {
    while (q->held_count > 0 && q->qstate == IBV_QPS_RTS) {
        fsend *s = &q->held[q->held_head];
        fqp *t = find_qp(q->dest);
        struct ibv_wc wc;
        frecv *r;

        if (t == NULL || t->qstate == IBV_QPS_ERR || t->island != q->island ||
            (t->qstate != IBV_QPS_RTR && t->qstate != IBV_QPS_RTS) ||
            t->dest != q->qp.qp_num) {
            qp_error(q, IBV_WC_RETRY_EXC_ERR);
            return -1;
        }
        if (s->len > 0 && find_mr(s->lkey, 0, s->addr, s->len, 0) == NULL) {
            stats.bad_access++;
            qp_error(q, IBV_WC_LOC_PROT_ERR);
            return -1;
        }
        if (s->opcode == IBV_WR_RDMA_WRITE) {
            /* No receive consumed, nothing completes at the target. */
            if (s->len > 0 && find_mr(s->rkey, 1, s->raddr, s->len,
                                      IBV_ACCESS_REMOTE_WRITE) == NULL) {
                stats.bad_access++;
                qp_error(q, IBV_WC_REM_ACCESS_ERR);
                return -1;
            }
            dma_copy((void *)(uintptr_t)s->raddr, (void *)(uintptr_t)s->addr,
                     s->len);
            stats.writes++;
            stats.plain_writes++;
            q->held_head = (q->held_head + 1) % q->held_cap;
            q->held_count--;
            send_cqe(q, s, IBV_WC_SUCCESS);
            continue;
        }
        if (t->rq_count == 0) {
            stats.rnr_waits++;
            return 0; /* receiver not ready: retried on its next post */
        }
        r = &t->rq[t->rq_head];
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = r->wr_id;
        wc.qp_num = t->qp.qp_num;
        wc.status = IBV_WC_SUCCESS;
        wc.byte_len = s->len;
        if (s->opcode == IBV_WR_SEND) {
            if (s->len > r->len ||
                (s->len > 0 && find_mr(r->lkey, 0, r->addr, s->len,
                                       IBV_ACCESS_LOCAL_WRITE) == NULL)) {
                stats.bad_access++;
                qp_error(q, IBV_WC_REM_INV_REQ_ERR);
                return -1;
            }
            dma_copy((void *)(uintptr_t)r->addr, (void *)(uintptr_t)s->addr,
                     s->len);
            wc.opcode = IBV_WC_RECV;
            stats.sends++;
        } else {
            if (find_mr(s->rkey, 1, s->raddr, s->len,
                        IBV_ACCESS_REMOTE_WRITE) == NULL) {
                stats.bad_access++;
                qp_error(q, IBV_WC_REM_ACCESS_ERR);
                return -1;
            }
            dma_copy((void *)(uintptr_t)s->raddr, (void *)(uintptr_t)s->addr,
                     s->len);
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = s->imm;
            stats.writes++;
        }
        t->rq_head = (t->rq_head + 1) % t->rq_cap;
        t->rq_count--;
        push_cqe(t->rcq, &wc);
        q->held_head = (q->held_head + 1) % q->held_cap;
        q->held_count--;
        send_cqe(q, s, IBV_WC_SUCCESS);
    }
    return 0;
}

static int modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
    fqp *q = (fqp *)qp;

    if (!(mask & IBV_QP_STATE))
        return EINVAL;
    pthread_mutex_lock(&mu);
    switch (a->qp_state) {
    case IBV_QPS_INIT:
        q->qstate = IBV_QPS_INIT;
        break;
    case IBV_QPS_RTR:
        if (q->qstate != IBV_QPS_INIT || !(mask & IBV_QP_DEST_QPN)) {
            pthread_mutex_unlock(&mu);
            return EINVAL;
        }
        q->dest = a->dest_qp_num;
        q->qstate = IBV_QPS_RTR;
        break;
    case IBV_QPS_RTS:
        if (q->qstate != IBV_QPS_RTR) {
            pthread_mutex_unlock(&mu);
            return EINVAL;
        }
        q->qstate = IBV_QPS_RTS;
        break;
    case IBV_QPS_ERR:
        qp_error(q, IBV_WC_WR_FLUSH_ERR);
        break;
    default:
        pthread_mutex_unlock(&mu);
        return EINVAL;
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static int destroy_qp(struct ibv_qp *qp) {
    fqp *q = (fqp *)qp;

    pthread_mutex_lock(&mu);
    for (fqp **p = &qps; *p != NULL; p = &(*p)->next) {
        if (*p == q) {
            *p = q->next;
            break;
        }
    }
    /* Senders held on it find it gone. */
    for (fqp *o = qps; o != NULL; o = o->next)
        if (o->dest == q->qp.qp_num && o->held_count > 0)
            deliver(o);
    pthread_mutex_unlock(&mu);
    free(q->rq);
    free(q->held);
    free(q);
    return 0;
}

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                     struct ibv_send_wr **bad) {
    fqp *q = (fqp *)qp;

    pthread_mutex_lock(&mu);
    for (; wr != NULL; wr = wr->next) {
        fsend s;
        if (q->qstate != IBV_QPS_RTS && q->qstate != IBV_QPS_ERR) {
            *bad = wr;
            pthread_mutex_unlock(&mu);
            return EINVAL;
        }
        if (q->outstanding >= q->max_send || wr->num_sge > 1 ||
            (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_RDMA_WRITE &&
             wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)) {
            *bad = wr;
            pthread_mutex_unlock(&mu);
            return ENOMEM;
        }
        memset(&s, 0, sizeof(s));
        s.wr_id = wr->wr_id;
        s.opcode = wr->opcode;
        s.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        s.imm = wr->imm_data;
        s.raddr = wr->wr.rdma.remote_addr;
        s.rkey = wr->wr.rdma.rkey;
        if (wr->num_sge == 1) {
            s.addr = wr->sg_list[0].addr;
            s.len = wr->sg_list[0].length;
            s.lkey = wr->sg_list[0].lkey;
        }
        q->outstanding++;
        if (q->qstate == IBV_QPS_ERR) {
            send_cqe(q, &s, IBV_WC_WR_FLUSH_ERR);
            continue;
        }
        q->held[(q->held_head + q->held_count) % q->held_cap] = s;
        q->held_count++;
        deliver(q);
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                     struct ibv_recv_wr **bad) {
    fqp *q = (fqp *)qp;

    pthread_mutex_lock(&mu);
    for (; wr != NULL; wr = wr->next) {
        if (q->rq_count >= q->rq_cap || wr->num_sge != 1 ||
            q->qstate == IBV_QPS_RESET) {
            *bad = wr;
            pthread_mutex_unlock(&mu);
            return ENOMEM;
        }
        q->rq[(q->rq_head + q->rq_count) % q->rq_cap] =
            (frecv){.wr_id = wr->wr_id,
                    .addr = wr->sg_list[0].addr,
                    .len = wr->sg_list[0].length,
                    .lkey = wr->sg_list[0].lkey};
        q->rq_count++;
        if (q->qstate == IBV_QPS_ERR)
            qp_error(q, IBV_WC_WR_FLUSH_ERR);
    }
    /* Senders waiting for a receive here. */
    for (fqp *o = qps; o != NULL; o = o->next)
        if (o->dest == q->qp.qp_num && o->held_count > 0)
            deliver(o);
    pthread_mutex_unlock(&mu);
    return 0;
}

const hvd_ibv_seam fake_seam = {
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

/* ------------------------------------------------------------------ */
/* Bootstrap                                                           */

struct fake_boot {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    int left;
    uint64_t gen;
    size_t len;
    uint8_t *buf; /* n * len */
    struct rank_bs {
        hvd_bootstrap bs;
        fake_boot *b;
    } * ranks;
};

/* Waits (bounded) until every rank has arrived at this barrier. */
static hvd_status barrier(fake_boot *b) {
    uint64_t gen = b->gen;
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    if (++b->arrived == b->n) {
        b->arrived = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
        return HVD_OK;
    }
    while (b->gen == gen)
        if (pthread_cond_timedwait(&b->cv, &b->mu, &until) != 0)
            return hvd_error_set(HVD_ERR_TIMEOUT,
                                 "fake bootstrap: not every rank arrived");
    return HVD_OK;
}

static hvd_status allgather(hvd_bootstrap *bs, const void *mine, size_t len,
                            void *all_out) {
    struct rank_bs *r = bs->ctx;
    fake_boot *b = r->b;
    hvd_status st;

    pthread_mutex_lock(&b->mu);
    if (b->buf == NULL || b->len != len) {
        /* The first rank of a round sizes it; every rank passes the same
         * len. */
        if (b->arrived == 0) {
            free(b->buf);
            b->buf = calloc((size_t)b->n, len ? len : 1);
            b->len = len;
        }
    }
    memcpy(b->buf + (size_t)bs->rank * len, mine, len);
    st = barrier(b);
    if (st == HVD_OK) {
        memcpy(all_out, b->buf, (size_t)b->n * len);
        st = barrier(b);
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

fake_boot *fake_boot_create(int n) {
    fake_boot *b = calloc(1, sizeof(*b));

    b->n = n;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->ranks = calloc((size_t)n, sizeof(*b->ranks));
    for (int i = 0; i < n; i++) {
        b->ranks[i].bs.rank = i;
        b->ranks[i].bs.size = n;
        b->ranks[i].bs.allgather = allgather;
        b->ranks[i].bs.ctx = &b->ranks[i];
        b->ranks[i].b = b;
    }
    return b;
}

hvd_bootstrap *fake_bootstrap(fake_boot *b, int rank) {
    return &b->ranks[rank].bs;
}

void fake_boot_destroy(fake_boot *b) {
    if (b == NULL)
        return;
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b->buf);
    free(b->ranks);
    free(b);
}

static const char *auto_on_off(int v) {
    return v == 0 ? "off" : v == 1 ? "on" : "auto";
}

void fake_ib_settings_fill(fake_ib_settings *s, size_t chunk_bytes,
                           int ring_chunks, int mr_cache, int gpudirect,
                           hvd_transport_params *p) {
    int n = 0;

    snprintf(s->chunk, sizeof(s->chunk), "%zu", chunk_bytes);
    snprintf(s->ring, sizeof(s->ring), "%d", ring_chunks);
    s->vars[n++] = (hvd_env_var){"HVD_IB_CHUNK_BYTES", s->chunk};
    s->vars[n++] = (hvd_env_var){"HVD_IB_RING_CHUNKS", s->ring};
    s->vars[n++] = (hvd_env_var){"HVD_IB_MR_CACHE", auto_on_off(mr_cache)};
    if (gpudirect >= 0)
        s->vars[n++] =
            (hvd_env_var){"HVD_IB_GPUDIRECT", auto_on_off(gpudirect)};
    s->vars[n] = (hvd_env_var){NULL, NULL};
    p->env = hvd_env_vars_get;
    p->env_ctx = s->vars;
}
