#include "transport/verbs/device.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* How far a device got: the reason of the one that got furthest is the
 * one the user sees. */
static int depth(hvd_vdev_why why) {
    switch (why) {
    case HVD_VDEV_OK:
        return 9;
    case HVD_VDEV_NO_GID:
        return 5;
    case HVD_VDEV_PORT_DOWN:
        return 4;
    case HVD_VDEV_NO_PORT:
        return 3;
    case HVD_VDEV_OPEN_FAILED:
        return 2;
    default:
        return 1;
    }
}

static void set_why(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_why(char *why, size_t whylen, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
}

/* Appends "sep text" to buf (truncating quietly). */
static void append(char *buf, size_t len, const char *text) {
    size_t used = strlen(buf);

    if (used + 1 < len)
        snprintf(buf + used, len - used, "%s%s", used ? "; " : "", text);
}

const char *hvd_vdev_link_name(int link_layer) {
    return link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand";
}

static int gid_zero(const union ibv_gid *gid) {
    static const uint8_t zero[16];
    return memcmp(gid->raw, zero, sizeof(zero)) == 0;
}

static int gid_ipv4(const union ibv_gid *gid) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0,    0,
                                       0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid->raw, prefix, sizeof(prefix)) == 0;
}

/* Picks the GID of an active port; returns HVD_VDEV_OK or NO_GID. */
static hvd_vdev_why pick_gid(const hvd_ibv_seam *seam, const hvd_vdev_cfg *cfg,
                             hvd_vdev *d, const struct ibv_port_attr *pa,
                             char *why, size_t whylen) {
    struct ibv_gid_entry e;
    int best = -1, best_score = 0;

    if (cfg->gid_index >= 0) {
        memset(&e, 0, sizeof(e));
        if (cfg->gid_index >= pa->gid_tbl_len ||
            seam->query_gid_ex(d->ctx, (uint32_t)d->port,
                               (uint32_t)cfg->gid_index, &e) != 0 ||
            gid_zero(&e.gid)) {
            set_why(
                why, whylen,
                "HVD_IB_GID_INDEX=%d: %s port %d has no GID at that index "
                "(its table has %d entries; list them with `ibv_devinfo -v`)",
                cfg->gid_index, d->name, d->port, pa->gid_tbl_len);
            return HVD_VDEV_NO_GID;
        }
        d->gid_index = cfg->gid_index;
        d->gid = e.gid;
        return HVD_VDEV_OK;
    }
    if (d->link_layer != IBV_LINK_LAYER_ETHERNET) {
        d->gid_index = -1; /* InfiniBand: addressed by LID */
        return HVD_VDEV_OK;
    }
    /* RoCE: RoCE v2 (routable, UDP) with an IPv4 address first. */
    for (int i = 0; i < pa->gid_tbl_len && i < 1024; i++) {
        int score;
        memset(&e, 0, sizeof(e));
        if (seam->query_gid_ex(d->ctx, (uint32_t)d->port, (uint32_t)i, &e) !=
                0 ||
            gid_zero(&e.gid))
            continue;
        score = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
        if (score == 2 && gid_ipv4(&e.gid))
            score = 3;
        if (score > best_score) {
            best = i;
            best_score = score;
            d->gid = e.gid;
        }
    }
    if (best < 0) {
        set_why(why, whylen,
                "%s port %d (RoCE) has no GID: its network interface has no IP "
                "address; give it one, or choose another port with "
                "HVD_IB_DEVICE/HVD_IB_PORT",
                d->name, d->port);
        return HVD_VDEV_NO_GID;
    }
    d->gid_index = best;
    return HVD_VDEV_OK;
}

/* Tries one device; on success d holds its open context. ports collects
 * "dev port N: STATE" of the ports that are not active. */
static hvd_vdev_why try_device(const hvd_ibv_seam *seam, struct ibv_device *dev,
                               const hvd_vdev_cfg *cfg, hvd_vdev *d,
                               char *ports, size_t portslen, char *why,
                               size_t whylen) {
    hvd_vdev_why r = HVD_VDEV_PORT_DOWN;
    int first, last, err;

    memset(d, 0, sizeof(*d));
    d->gid_index = -1;
    snprintf(d->name, sizeof(d->name), "%s", seam->get_device_name(dev));
    d->ctx = seam->open_device(dev);
    if (d->ctx == NULL) {
        set_why(why, whylen, "ibv_open_device(%s) failed: %s", d->name,
                strerror(errno ? errno : EIO));
        return HVD_VDEV_OPEN_FAILED;
    }
    err = seam->query_device(d->ctx, &d->attr);
    if (err != 0) {
        set_why(why, whylen, "ibv_query_device(%s) failed: %s", d->name,
                strerror(err));
        r = HVD_VDEV_OPEN_FAILED;
        goto close_ctx;
    }
    if (cfg->port > 0) {
        if (cfg->port > d->attr.phys_port_cnt) {
            set_why(why, whylen, "HVD_IB_PORT=%d: %s has %d port(s)", cfg->port,
                    d->name, d->attr.phys_port_cnt);
            r = HVD_VDEV_NO_PORT;
            goto close_ctx;
        }
        first = last = cfg->port;
    } else {
        first = 1;
        last = d->attr.phys_port_cnt;
    }
    for (int p = first; p <= last; p++) {
        struct ibv_port_attr pa;
        char note[128];

        memset(&pa, 0, sizeof(pa));
        err = seam->query_port(d->ctx, (uint8_t)p, &pa);
        if (err != 0) {
            snprintf(note, sizeof(note), "%s port %d: ibv_query_port: %s",
                     d->name, p, strerror(err));
            append(ports, portslen, note);
            continue;
        }
        if (pa.state != IBV_PORT_ACTIVE) {
            snprintf(note, sizeof(note), "%s port %d: %s", d->name, p,
                     ibv_port_state_str(pa.state));
            append(ports, portslen, note);
            continue;
        }
        d->port = p;
        d->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET
                            ? IBV_LINK_LAYER_ETHERNET
                            : IBV_LINK_LAYER_INFINIBAND;
        d->lid = pa.lid;
        d->mtu = pa.active_mtu;
        r = pick_gid(seam, cfg, d, &pa, why, whylen);
        if (r == HVD_VDEV_OK) {
            d->odp = seam->odp_supported(d->ctx);
            return HVD_VDEV_OK;
        }
    }
    if (r == HVD_VDEV_PORT_DOWN)
        set_why(
            why, whylen,
            "no active RDMA port (%s): check the link with `ibv_devinfo`, "
            "or choose another device or port with HVD_IB_DEVICE/HVD_IB_PORT",
            ports[0] ? ports : d->name);
close_ctx:
    seam->close_device(d->ctx);
    d->ctx = NULL;
    return r;
}

hvd_vdev_why hvd_vdev_open(const hvd_ibv_seam *seam, const hvd_vdev_cfg *cfg,
                           hvd_vdev *out, char *why, size_t whylen) {
    struct ibv_device **list;
    char names[256] = "", ports[512] = "", tmp[512];
    hvd_vdev_why best = HVD_VDEV_NO_DEVICE;
    int n = 0, err, named = cfg->device != NULL && cfg->device[0] != '\0';

    memset(out, 0, sizeof(*out));
    out->gid_index = -1;
    errno = 0;
    list = seam->get_device_list(&n);
    err = errno;
    if (list == NULL || n <= 0) {
        if (list != NULL)
            seam->free_device_list(list);
        set_why(why, whylen, "no RDMA device found (ibv_get_device_list: %s%s)",
                list == NULL && err != 0 ? strerror(err) : "no devices",
                list == NULL && err == ENOSYS
                    ? ": the kernel has no RDMA device or driver loaded"
                    : "");
        return HVD_VDEV_NO_DEVICE;
    }
    for (int i = 0; i < n; i++)
        append(names, sizeof(names), seam->get_device_name(list[i]));
    if (named) {
        int found = 0;
        for (int i = 0; i < n && !found; i++)
            found = strcmp(seam->get_device_name(list[i]), cfg->device) == 0;
        if (!found) {
            seam->free_device_list(list);
            set_why(why, whylen,
                    "HVD_IB_DEVICE=%s: no such RDMA device (found: %s)",
                    cfg->device, names);
            return HVD_VDEV_NO_SUCH_DEVICE;
        }
    }
    for (int i = 0; i < n; i++) {
        hvd_vdev d;
        hvd_vdev_why r;

        if (named && strcmp(seam->get_device_name(list[i]), cfg->device) != 0)
            continue;
        tmp[0] = '\0';
        r = try_device(seam, list[i], cfg, &d, ports, sizeof(ports), tmp,
                       sizeof(tmp));
        if (r == HVD_VDEV_OK) {
            seam->free_device_list(list);
            *out = d;
            return HVD_VDEV_OK;
        }
        /* A later device's port list includes the earlier ones. */
        if (depth(r) > depth(best) || (r == best && r == HVD_VDEV_PORT_DOWN)) {
            best = r;
            snprintf(why, whylen, "%s", tmp);
        }
    }
    seam->free_device_list(list);
    return best;
}

void hvd_vdev_close(const hvd_ibv_seam *seam, hvd_vdev *dev) {
    if (dev == NULL || dev->ctx == NULL)
        return;
    seam->close_device(dev->ctx);
    dev->ctx = NULL;
}
