/* Device, port and GID selection of the verbs transport against fake
 * device lists, and the sentences probe gives where none is usable (no
 * device, a named device missing, ports down, no GID), which are what
 * HVD_TRANSPORT=verbs fails with. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "transport/verbs/device.h"
#include "transport/verbs/verbs.h"
#include "verbs_fake.h"

static int setup(void **state) {
    (void)state;
    fake_reset();
    return 0;
}

static hvd_vdev_why pick(const char *dev, int port, int gid, hvd_vdev *d,
                         char *why, size_t whylen) {
    hvd_vdev_cfg cfg = {.device = dev, .port = port, .gid_index = gid};
    why[0] = '\0';
    return hvd_vdev_open(&fake_seam, &cfg, d, why, whylen);
}

static void set_gid(fake_port *p, int i, int type, const uint8_t raw[16]) {
    p->gids[i].valid = 1;
    p->gids[i].type = type;
    memcpy(p->gids[i].raw, raw, 16);
    if (p->ngids <= i)
        p->ngids = i + 1;
}

static void infiniband(void **state) {
    hvd_vdev d;
    char why[512];

    (void)state;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)), HVD_VDEV_OK);
    assert_string_equal(d.name, "fake0");
    assert_int_equal(d.port, 1);
    assert_int_equal(d.link_layer, IBV_LINK_LAYER_INFINIBAND);
    assert_int_equal(d.lid, 1);
    assert_int_equal(d.gid_index, -1);
    assert_int_equal(d.mtu, IBV_MTU_4096);
    hvd_vdev_close(&fake_seam, &d);
    hvd_vdev_close(&fake_seam, &d); /* closing twice is harmless */
}

static void no_device(void **state) {
    hvd_vdev d;
    char why[512];

    (void)state;
    fake_cfg()->ndevs = 0;
    fake_cfg()->list_errno = ENOSYS;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)),
                     HVD_VDEV_NO_DEVICE);
    assert_non_null(strstr(why, "no RDMA device found"));
    assert_non_null(strstr(why, "the kernel has no RDMA device"));
    fake_cfg()->list_errno = 0;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)),
                     HVD_VDEV_NO_DEVICE);
    assert_string_equal(why, "no RDMA device found (ibv_get_device_list: no "
                             "devices)");
}

static void named_device(void **state) {
    fake_config *c = fake_cfg();
    hvd_vdev d;
    char why[512];

    (void)state;
    c->ndevs = 2;
    c->devs[1] = c->devs[0];
    strcpy(c->devs[1].name, "fake1");
    c->devs[1].ports[0].lid = 9;
    assert_int_equal(pick("fake1", 0, -1, &d, why, sizeof(why)), HVD_VDEV_OK);
    assert_string_equal(d.name, "fake1");
    assert_int_equal(d.lid, 9);
    hvd_vdev_close(&fake_seam, &d);
    assert_int_equal(pick("mlx5_7", 0, -1, &d, why, sizeof(why)),
                     HVD_VDEV_NO_SUCH_DEVICE);
    assert_string_equal(why, "HVD_IB_DEVICE=mlx5_7: no such RDMA device "
                             "(found: fake0; fake1)");
}

static void ports_down(void **state) {
    fake_config *c = fake_cfg();
    hvd_vdev d;
    char why[512];

    (void)state;
    c->devs[0].ports[0].state = IBV_PORT_DOWN;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)),
                     HVD_VDEV_PORT_DOWN);
    assert_non_null(strstr(why, "no active RDMA port (fake0 port 1: down)"));
    assert_non_null(strstr(why, "ibv_devinfo"));
    /* A second device with its second port active is found; the list of
     * what is down names every port looked at. */
    c->ndevs = 2;
    c->devs[1] = c->devs[0];
    strcpy(c->devs[1].name, "fake1");
    c->devs[1].nports = 2;
    c->devs[1].ports[1] = c->devs[1].ports[0];
    c->devs[1].ports[0].state = IBV_PORT_INIT;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)),
                     HVD_VDEV_PORT_DOWN);
    assert_non_null(strstr(why, "fake0 port 1: down; fake1 port 1: init; "
                                "fake1 port 2: down"));
    c->devs[1].ports[1].state = IBV_PORT_ACTIVE;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)), HVD_VDEV_OK);
    assert_string_equal(d.name, "fake1");
    assert_int_equal(d.port, 2);
    hvd_vdev_close(&fake_seam, &d);
    /* HVD_IB_PORT: a port that is down, and one that does not exist. */
    assert_int_equal(pick("fake1", 1, -1, &d, why, sizeof(why)),
                     HVD_VDEV_PORT_DOWN);
    assert_int_equal(pick("fake1", 2, -1, &d, why, sizeof(why)), HVD_VDEV_OK);
    hvd_vdev_close(&fake_seam, &d);
    assert_int_equal(pick("fake1", 3, -1, &d, why, sizeof(why)),
                     HVD_VDEV_NO_PORT);
    assert_string_equal(why, "HVD_IB_PORT=3: fake1 has 2 port(s)");
}

static void open_fails(void **state) {
    hvd_vdev d;
    char why[512];

    (void)state;
    fake_cfg()->devs[0].open_fails = 1;
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)),
                     HVD_VDEV_OPEN_FAILED);
    assert_non_null(strstr(why, "ibv_open_device(fake0) failed"));
}

/* RoCE: RoCE v2 with an IPv4 address first, then RoCE v2, then any. */
static void roce_gids(void **state) {
    fake_port *p = &fake_cfg()->devs[0].ports[0];
    static const uint8_t link_local[16] = {0xfe, 0x80, [15] = 1};
    static const uint8_t v4[16] = {[10] = 0xff, [11] = 0xff, 10, 0, 0, 7};
    static const uint8_t v6[16] = {0x20, 0x01, 0x0d, 0xb8, [15] = 7};
    hvd_vdev d;
    char why[512];

    (void)state;
    p->link_layer = IBV_LINK_LAYER_ETHERNET;
    p->lid = 0;
    p->ngids = 0;
    memset(p->gids, 0, sizeof(p->gids));
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)), HVD_VDEV_NO_GID);
    assert_non_null(strstr(why, "fake0 port 1 (RoCE) has no GID"));
    set_gid(p, 0, IBV_GID_TYPE_ROCE_V1, link_local);
    set_gid(p, 1, IBV_GID_TYPE_ROCE_V2, link_local);
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)), HVD_VDEV_OK);
    assert_int_equal(d.gid_index, 1);
    hvd_vdev_close(&fake_seam, &d);
    set_gid(p, 3, IBV_GID_TYPE_ROCE_V2, v6);
    set_gid(p, 5, IBV_GID_TYPE_ROCE_V2, v4);
    set_gid(p, 6, IBV_GID_TYPE_ROCE_V1, v4);
    assert_int_equal(pick(NULL, 0, -1, &d, why, sizeof(why)), HVD_VDEV_OK);
    assert_int_equal(d.link_layer, IBV_LINK_LAYER_ETHERNET);
    assert_int_equal(d.gid_index, 5);
    assert_memory_equal(d.gid.raw, v4, 16);
    hvd_vdev_close(&fake_seam, &d);
    /* HVD_IB_GID_INDEX takes any valid entry, and names a bad one. */
    assert_int_equal(pick(NULL, 0, 0, &d, why, sizeof(why)), HVD_VDEV_OK);
    assert_int_equal(d.gid_index, 0);
    hvd_vdev_close(&fake_seam, &d);
    assert_int_equal(pick(NULL, 0, 2, &d, why, sizeof(why)), HVD_VDEV_NO_GID);
    assert_non_null(strstr(why, "HVD_IB_GID_INDEX=2: fake0 port 1 has no GID "
                                "at that index"));
    assert_int_equal(pick(NULL, 0, 40, &d, why, sizeof(why)), HVD_VDEV_NO_GID);
}

/* The transport's probe says the same. */
static void probe(void **state) {
    hvd_transport_params params;
    hvd_caps caps;

    (void)state;
    hvd_env_var nope[] = {{"HVD_IB_DEVICE", "nope0"}, {NULL, NULL}};

    memset(&params, 0, sizeof(params));
    params.env = hvd_env_vars_get;
    assert_int_equal(hvd_verbs_probe_with(&fake_seam, &params, &caps), HVD_OK);
    assert_int_equal(caps.usable, 1);
    assert_int_equal(caps.native_collectives, 0);
    fake_cfg()->devs[0].ports[0].state = IBV_PORT_DOWN;
    assert_int_equal(hvd_verbs_probe_with(&fake_seam, &params, &caps), HVD_OK);
    assert_int_equal(caps.usable, 0);
    assert_non_null(strstr(caps.reason, "no active RDMA port"));
    params.env_ctx = nope;
    assert_int_equal(hvd_verbs_probe_with(&fake_seam, &params, &caps), HVD_OK);
    assert_non_null(strstr(caps.reason, "HVD_IB_DEVICE=nope0"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(infiniband, setup),
        cmocka_unit_test_setup(no_device, setup),
        cmocka_unit_test_setup(named_device, setup),
        cmocka_unit_test_setup(ports_down, setup),
        cmocka_unit_test_setup(open_fails, setup),
        cmocka_unit_test_setup(roce_gids, setup),
        cmocka_unit_test_setup(probe, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
