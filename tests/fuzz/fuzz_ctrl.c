/*
 * Fuzz target: decoding of the protobuf-c control messages and what the
 * engine does with them before any collective runs.
 *
 *   byte 0 (mod 6) selects:
 *   0  Updates from ranks to rank 0: byte 1 sets the job size (2 to 8) and
 *      whether stalled operations fail (HVD_STALL_SHUTDOWN_SECONDS); then
 *      records of [rank byte][2-byte length][an Update]. Each Update is
 *      unpacked, its requests checked (api/runtime/ctrlmsg.c) and given to a
 *      coordinator (api/runtime/coordinator.c) as rank 0 does; then the
 *      coordinator decides. Every response it decides must pass the checks
 *      every rank applies to a Cycle, before and after a pack/unpack round
 *      trip: rank 0 must never send what the others refuse.
 *   1  a Cycle as another rank receives it: unpacked, every response
 *      checked and described.
 *   2  a rendezvous Contribute, 3 a rendezvous Result, 4 a ResponseList:
 *      unpacked and freed.
 *   5  a step in the brief form (api/runtime/ctrlmsg.h), from rank 0 and
 *      from another rank: every slot it lists is read.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/runtime/coordinator.h"
#include "api/runtime/ctrlmsg.h"
#include "api/runtime/engine.pb-c.h"
#include "transport/base/dtype.h"
#include "transport/base/log.h"
#include "transport/bootstrap/rendezvous.pb-c.h"

static void describe(const hvd_opdesc *d) {
    char text[256];

    hvd_opdesc_format(d, text, sizeof(text));
    if (strlen(text) >= sizeof(text))
        __builtin_trap();
    /* The engine sizes buffers with this; the checks keep it in range. */
    if (hvd_opdesc_total(d) > (SIZE_MAX / 2) / hvd_dtype_size(d->dtype))
        __builtin_trap();
}

static void check_decided(Hvd__Engine__ResponseList *list, int size) {
    Hvd__Engine__Cycle c = HVD__ENGINE__CYCLE__INIT;
    Hvd__Engine__Cycle *back;
    hvd_opdesc d;
    uint8_t *buf;
    size_t len;

    for (size_t i = 0; i < list->n_responses; i++) {
        if (hvd_ctrl_check_response(list->responses[i], size, &d) != HVD_OK)
            __builtin_trap(); /* rank 0 would send what others refuse */
        describe(&d);
    }
    c.number = 1;
    c.n_responses = list->n_responses;
    c.responses = list->responses;
    len = hvd__engine__cycle__get_packed_size(&c);
    buf = malloc(len ? len : 1);
    if (buf == NULL)
        return;
    hvd__engine__cycle__pack(&c, buf);
    back = hvd__engine__cycle__unpack(NULL, len, buf);
    if (back == NULL || back->n_responses != list->n_responses)
        __builtin_trap();
    for (size_t i = 0; i < back->n_responses; i++)
        if (hvd_ctrl_check_response(back->responses[i], size, &d) != HVD_OK)
            __builtin_trap();
    hvd__engine__cycle__free_unpacked(back, NULL);
    free(buf);
}

static void updates(const uint8_t *p, size_t left) {
    Hvd__Engine__ResponseList list = HVD__ENGINE__RESPONSE_LIST__INIT;
    hvd_coord *coord = NULL;
    double now = 1000.0;
    int size;

    if (left < 1)
        return;
    size = 2 + p[0] % 7;
    if (hvd_coord_create(size, 0, (p[0] & 0x80) ? 1.0 : 0, &coord) != HVD_OK)
        return;
    p++;
    left--;
    while (left >= 3) {
        int rank = p[0] % size;
        size_t len = (size_t)(p[1] | p[2] << 8);
        p += 3;
        left -= 3;
        if (len > left)
            len = left;
        Hvd__Engine__Update *u = hvd__engine__update__unpack(NULL, len, p);
        p += len;
        left -= len;
        if (u == NULL)
            continue;
        for (size_t i = 0; i < u->n_requests; i++) {
            hvd_opdesc d;
            if (hvd_ctrl_check_request(u->requests[i], size, &d) != HVD_OK)
                continue;
            describe(&d);
            hvd_coord_add(coord, rank, u->requests[i]->name, &d,
                          u->requests[i]->age_s, now);
        }
        hvd__engine__update__free_unpacked(u, NULL);
        now += 0.5;
        /* Rank 0 decides after every update, as its engine may. */
        if (hvd_coord_collect(coord, now, &list) == HVD_OK)
            check_decided(&list, size);
        hvd_coord_free_responses(&list);
    }
    hvd_coord_next_deadline(coord);
    hvd_coord_pending(coord);
    hvd_coord_joined(coord);
    hvd_coord_destroy(coord);
}

static void cycle(const uint8_t *p, size_t left) {
    Hvd__Engine__Cycle *c = hvd__engine__cycle__unpack(NULL, left, p);
    hvd_opdesc d;

    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_responses; i++)
        if (hvd_ctrl_check_response(c->responses[i], 4, &d) == HVD_OK)
            describe(&d);
    hvd__engine__cycle__free_unpacked(c, NULL);
}

static void brief(const uint8_t *data, size_t size) {
    /* The engine reads a step from a malloc'd buffer: aligned. */
    uint8_t *buf = malloc(size > 0 ? size : 1);
    Hvd__Engine__Step m;
    Hvd__Engine__Cycle c;
    uint64_t sum = 0;

    if (buf == NULL)
        return;
    if (size > 0)
        memcpy(buf, data, size);
    for (int from0 = 0; from0 < 2; from0++) {
        if (hvd_ctrl_brief_unpack(buf, size, &m, from0 ? &c : NULL) != HVD_OK)
            continue;
        for (size_t i = 0; i < m.n_ready; i++)
            sum += m.ready[i];
        for (size_t i = 0; i < m.n_carried; i++)
            sum += m.carried[i];
        if ((m.cycle != NULL) != from0 || hvd_ctrl_brief_size(&m) != size)
            __builtin_trap(); /* what was read packs back to its length */
    }
    free(buf);
    if (sum == 1) /* keep the reads */
        hvd_log_current = HVD_LOG_ERROR;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    hvd_log_current = HVD_LOG_ERROR; /* no stall warnings */
    switch (data[0] % 6) {
    case 0:
        updates(data + 1, size - 1);
        break;
    case 1:
        cycle(data + 1, size - 1);
        break;
    case 2: {
        Hvd__Rdv__Contribute *m =
            hvd__rdv__contribute__unpack(NULL, size - 1, data + 1);
        if (m != NULL)
            hvd__rdv__contribute__free_unpacked(m, NULL);
        break;
    }
    case 3: {
        Hvd__Rdv__Result *m =
            hvd__rdv__result__unpack(NULL, size - 1, data + 1);
        if (m != NULL)
            hvd__rdv__result__free_unpacked(m, NULL);
        break;
    }
    case 5:
        brief(data + 1, size - 1);
        break;
    default: {
        Hvd__Engine__ResponseList *m =
            hvd__engine__response_list__unpack(NULL, size - 1, data + 1);
        if (m != NULL)
            hvd__engine__response_list__free_unpacked(m, NULL);
        break;
    }
    }
    return 0;
}
