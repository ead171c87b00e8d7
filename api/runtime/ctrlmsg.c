#include "api/runtime/ctrlmsg.h"

#include <stdint.h>
#include <string.h>

#include "transport/base/dtype.h"
#include "transport/base/error.h"

/* Statuses this build knows: a response may carry any of them. */
enum {
#define HVD_CTRL_COUNT_(name, text) +1
    STATUS_COUNT = 0 HVD_STATUS_MAP(HVD_CTRL_COUNT_)
#undef HVD_CTRL_COUNT_
};

/* The fields a Request and a Response share. */
static hvd_status check_op(const char *what, const char *name, uint32_t kind,
                           uint32_t dtype, uint32_t op, int32_t root,
                           uint32_t mem, uint32_t pset, size_t ncounts,
                           const uint64_t *counts, size_t nshape,
                           const int64_t *shape, int size, hvd_opdesc *out) {
    uint64_t total = 0;
    size_t esize;

    if (name == NULL)
        return hvd_error_set(HVD_ERR_PROTOCOL, "%s without a name", what);
    if (kind >= HVD_KIND_COUNT)
        return hvd_error_set(HVD_ERR_PROTOCOL, "%s '%s' of unknown kind %u",
                             what, name, kind);
    if (!hvd_dtype_valid((hvd_dtype)dtype))
        return hvd_error_set(HVD_ERR_PROTOCOL, "%s '%s' with unknown dtype %u",
                             what, name, dtype);
    if (!hvd_op_valid((hvd_op)op) &&
        !(op == HVD_ADASUM && kind == HVD_KIND_ALLREDUCE))
        return hvd_error_set(HVD_ERR_PROTOCOL, "%s '%s' with unknown op %u",
                             what, name, op);
    if (mem >= HVD_MEM_COUNT)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "%s '%s' with unknown memory type %u", what, name,
                             mem);
    if (ncounts < 1 || ncounts > HVD_CTRL_MAX_COUNTS)
        return hvd_error_set(HVD_ERR_PROTOCOL, "%s '%s' with %zu buffers", what,
                             name, ncounts);
    if (pset > INT32_MAX ||
        (pset != 0 && (kind == HVD_KIND_PSET || kind == HVD_KIND_JOIN ||
                       kind == HVD_KIND_CALL)))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "%s '%s' of a %s in process set %u", what, name,
                             hvd_kind_name((hvd_kind)kind), pset);
    if (kind == HVD_KIND_PSET) {
        /* A new set's ranks, ascending; or the id of the one removed. */
        for (size_t i = 0; op == HVD_PSET_CREATE && i < ncounts; i++)
            if (counts[i] >= (uint64_t)size ||
                (i > 0 && counts[i] <= counts[i - 1]))
                return hvd_error_set(HVD_ERR_PROTOCOL,
                                     "%s '%s' creates a process set whose "
                                     "ranks are not ascending ranks of the job",
                                     what, name);
        if ((op != HVD_PSET_CREATE && op != HVD_PSET_REMOVE) ||
            (op == HVD_PSET_REMOVE && root <= 0) || (size_t)size < ncounts ||
            nshape > 0)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "%s '%s': a malformed process set operation",
                                 what, name);
    }
    /* An alltoall has a count for each rank of its set (the sender's). */
    if (kind == HVD_KIND_ALLTOALL &&
        (pset == 0 ? ncounts != (size_t)size : ncounts > (size_t)size))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "%s '%s' for an alltoall of %d ranks with %zu "
                             "counts",
                             what, name, size, ncounts);
    if (kind == HVD_KIND_BROADCAST && (root < 0 || root >= size))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "%s '%s' with root %d in a job of %d ranks", what,
                             name, (int)root, size);
    esize = hvd_dtype_size((hvd_dtype)dtype);
    for (size_t i = 0; i < ncounts; i++) {
        if (counts[i] > (SIZE_MAX / 2) / esize - total)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "%s '%s' of more than %zu elements", what,
                                 name, (SIZE_MAX / 2) / esize);
        total += counts[i];
    }
    if (nshape > 0) {
        uint64_t product = 1;

        if (nshape < 2 || nshape > HVD_DESC_MAX_DIMS || ncounts != 1 ||
            (kind != HVD_KIND_ALLREDUCE && kind != HVD_KIND_BROADCAST &&
             kind != HVD_KIND_REDUCESCATTER))
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "%s '%s' with a shape of %zu dimensions "
                                 "for %zu buffers of a %s",
                                 what, name, nshape, ncounts,
                                 hvd_kind_name((hvd_kind)kind));
        for (size_t i = 0; i < nshape; i++) {
            if (shape[i] < 0 ||
                (shape[i] > 0 && product > UINT64_MAX / (uint64_t)shape[i]))
                return hvd_error_set(HVD_ERR_PROTOCOL,
                                     "%s '%s' with dimension %zu of %lld", what,
                                     name, i, (long long)shape[i]);
            product *= (uint64_t)shape[i];
        }
        if (product != counts[0])
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "%s '%s' with a shape of %llu elements "
                                 "and a count of %llu",
                                 what, name, (unsigned long long)product,
                                 (unsigned long long)counts[0]);
    }
    out->kind = (hvd_kind)kind;
    out->dtype = (hvd_dtype)dtype;
    out->op = (hvd_op)op;
    out->root = root;
    out->mem = (hvd_memtype)mem;
    out->pset = (int)pset;
    out->ncounts = ncounts;
    out->counts = counts;
    out->ndims = (int)nshape;
    for (size_t i = 0; i < nshape; i++)
        out->dims[i] = shape[i];
    return HVD_OK;
}

hvd_status hvd_ctrl_check_request(const Hvd__Engine__Request *req, int size,
                                  hvd_opdesc *desc_out) {
    return check_op("request", req->name, req->kind, req->dtype, req->op,
                    req->root, req->mem, req->process_set, req->n_counts,
                    req->counts, req->n_shape, req->shape, size, desc_out);
}

hvd_status hvd_ctrl_check_response(const Hvd__Engine__Response *resp, int size,
                                   hvd_opdesc *desc_out) {
    hvd_opdesc d;
    hvd_status st =
        check_op("response", resp->name, resp->kind, resp->dtype, resp->op,
                 resp->root, resp->mem, resp->process_set, resp->n_counts,
                 resp->counts, resp->n_shape, resp->shape, size, &d);

    if (st != HVD_OK)
        return st;
    if (resp->status >= STATUS_COUNT || resp->error == NULL)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "response '%s' with unknown status %u", resp->name,
                             resp->status);
    if (resp->status == HVD_OK &&
        (resp->contributors < 1 || resp->contributors > (uint32_t)size))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "response '%s' with %u contributors in a job of "
                             "%d ranks",
                             resp->name, resp->contributors, size);
    if (resp->last_joined < -1 || resp->last_joined >= size)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "response '%s' names rank %d as the last to "
                             "join in a job of %d ranks",
                             resp->name, (int)resp->last_joined, size);
    if (resp->n_joined > (size_t)size)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "response '%s' with %zu joined ranks in a job "
                             "of %d",
                             resp->name, resp->n_joined, size);
    for (size_t i = 0; i < resp->n_joined; i++)
        if (resp->joined[i] >= (uint32_t)size)
            return hvd_error_set(HVD_ERR_PROTOCOL,
                                 "response '%s' names rank %u as joined in a "
                                 "job of %d",
                                 resp->name, resp->joined[i], size);
    *desc_out = d;
    return HVD_OK;
}

size_t hvd_ctrl_brief_size(const Hvd__Engine__Step *m) {
    const Hvd__Engine__Cycle *c = m->cycle;

    if (c != NULL && (c->n_run > 0 || c->n_erase > 0 || c->n_responses > 0 ||
                      c->paused || c->stop || c->number != m->number))
        return 0;
    return sizeof(hvd_ctrl_brief) + (m->n_ready + m->n_carried) * 4;
}

void hvd_ctrl_brief_pack(const Hvd__Engine__Step *m, uint8_t *out) {
    hvd_ctrl_brief head = {m->number, (uint32_t)m->n_ready,
                           (uint32_t)m->n_carried};
    uint32_t *slots = (uint32_t *)(out + sizeof(head));

    memcpy(out, &head, sizeof(head));
    if (m->n_ready > 0)
        memcpy(slots, m->ready, m->n_ready * 4);
    if (m->n_carried > 0)
        memcpy(slots + m->n_ready, m->carried, m->n_carried * 4);
}

hvd_status hvd_ctrl_brief_unpack(const uint8_t *buf, size_t len,
                                 Hvd__Engine__Step *m,
                                 Hvd__Engine__Cycle *cycle) {
    hvd_ctrl_brief head;

    if (len < sizeof(head))
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "brief step of %zu bytes: shorter than its head",
                             len);
    memcpy(&head, buf, sizeof(head));
    if ((uint64_t)sizeof(head) +
            ((uint64_t)head.n_ready + (uint64_t)head.n_carried) * 4 !=
        (uint64_t)len)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "brief step %llu of %zu bytes lists %u offered "
                             "and %u carried slots",
                             (unsigned long long)head.number, len, head.n_ready,
                             head.n_carried);
    hvd__engine__step__init(m);
    m->number = head.number;
    m->n_ready = head.n_ready;
    m->n_carried = head.n_carried;
    m->ready = (uint32_t *)(buf + sizeof(head));
    m->carried = m->ready + head.n_ready;
    if (cycle != NULL) {
        hvd__engine__cycle__init(cycle);
        cycle->number = head.number;
        m->cycle = cycle;
    }
    return HVD_OK;
}
