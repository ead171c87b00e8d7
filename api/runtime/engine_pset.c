/*
 * The engine (engine.h): process sets. Every rank keeps the same table of
 * them: a set is created or removed by an operation every rank of the job
 * asks for, which rank 0's coordinator decides (giving a new set its id)
 * and every rank runs in the same cycle, so that from that cycle on every
 * rank counts the same members for the set's operations. A member also
 * builds the set's communicator then (no message: it maps the set's ranks
 * onto the job's transport), and the set's collectives run on it.
 */

#include "api/runtime/engine_state.h"

int hvd_eng_pset_init(hvd_engine *eng) {
    eng->psets = calloc(1, sizeof(*eng->psets));
    if (eng->psets == NULL)
        return -1;
    eng->psets[0] = (pset){.size = eng->size, .index = eng->rank};
    eng->npsets = 1;
    return 0;
}

void hvd_eng_pset_free(hvd_engine *eng) {
    for (int id = 1; id < eng->npsets; id++) {
        free(eng->psets[id].ranks);
        hvd_comm_destroy(eng->psets[id].comm);
    }
    free(eng->psets);
}

const pset *hvd_eng_pset(const hvd_engine *eng, int id) {
    return id >= 0 && id < eng->npsets && eng->psets[id].size > 0
               ? &eng->psets[id]
               : NULL;
}

int hvd_eng_pset_size(const hvd_engine *eng, int id) {
    const pset *p = hvd_eng_pset(eng, id);
    return p != NULL ? p->size : 0;
}

int hvd_eng_pset_has(const hvd_engine *eng, int id, int r) {
    const pset *p = hvd_eng_pset(eng, id);

    if (id == 0 || p == NULL)
        return 1;
    for (int i = 0; i < p->size; i++)
        if (p->ranks[i] == r)
            return 1;
    return 0;
}

hvd_comm *hvd_eng_pset_comm(const hvd_engine *eng, const hvd_opdesc *d) {
    if (d->pset == 0)
        return eng->data;
    const pset *p = hvd_eng_pset(eng, d->pset);
    return p != NULL ? p->comm : NULL;
}

/* Fails this rank's requests of set id that wait on the cache path (the
 * coordinator fails those it holds). */
static void fail_removed(hvd_engine *eng, int id) {
    char text[HVD_ERROR_MAX];

    for (int k = eng->npending - 1; k >= 0; k--) {
        hvd_request *req = eng->pending[k];
        if (req->desc.pset != id || req->state != REQ_CACHED)
            continue;
        snprintf(text, sizeof(text),
                 "'%s': process set %d was removed before it ran", req->name,
                 id);
        hvd_eng_complete(eng, req, HVD_ERR_INVALID_ARG, text);
    }
}

hvd_status hvd_eng_pset_run(hvd_engine *eng, const hvd_opdesc *d, int id) {
    if ((int)d->op == HVD_PSET_REMOVE) {
        pset *p = (pset *)hvd_eng_pset(eng, d->root);
        if (p == NULL)
            return hvd_error_set(HVD_ERR_INTERNAL,
                                 "rank %d has no process set %d to remove",
                                 eng->rank, d->root);
        hvd_comm *comm = p->comm;
        pthread_mutex_lock(&hvd_eng_lock);
        p->size = 0;
        p->index = -1;
        p->comm = NULL;
        pthread_mutex_unlock(&hvd_eng_lock);
        hvd_comm_destroy(comm);
        free(p->ranks);
        p->ranks = NULL;
        fail_removed(eng, d->root);
        return HVD_OK;
    }
    if (id != eng->npsets)
        return hvd_error_set(HVD_ERR_PROTOCOL,
                             "rank 0 created process set %d, but rank %d "
                             "expected id %d",
                             id, eng->rank, eng->npsets);
    int n = (int)d->ncounts, index = -1;
    int *ranks = malloc((size_t)n * sizeof(*ranks));
    hvd_comm *comm = NULL;
    hvd_status st = HVD_OK;

    if (ranks == NULL)
        return hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) {
        ranks[i] = (int)d->counts[i];
        if (ranks[i] == eng->rank)
            index = i;
    }
    if (index >= 0)
        st = hvd_comm_create_sub(index, n, ranks, eng->data->tp,
                                 eng->data->channel, &eng->data->cfg, &comm);
    pthread_mutex_lock(&hvd_eng_lock);
    pset *v = st == HVD_OK ? realloc(eng->psets, (size_t)(id + 1) * sizeof(*v))
                           : NULL;
    if (v != NULL) {
        eng->psets = v;
        v[id] = (pset){.size = n, .index = index, .ranks = ranks, .comm = comm};
        eng->npsets = id + 1;
    }
    pthread_mutex_unlock(&hvd_eng_lock);
    if (v == NULL) {
        free(ranks);
        hvd_comm_destroy(comm);
        return st != HVD_OK ? st
                            : hvd_error_set(HVD_ERR_NO_MEMORY, "out of memory");
    }
    return HVD_OK;
}

hvd_status hvd_engine_pset(hvd_engine *eng, int id, int *size, int *index,
                           int *ranks, int cap) {
    hvd_status st = HVD_OK;

    pthread_mutex_lock(&hvd_eng_lock);
    const pset *p = hvd_eng_pset(eng, id);
    if (p == NULL) {
        st = HVD_ERR_INVALID_ARG;
    } else {
        *size = p->size;
        *index = p->index;
        for (int i = 0; ranks != NULL && i < p->size && i < cap; i++)
            ranks[i] = p->ranks != NULL ? p->ranks[i] : i;
    }
    pthread_mutex_unlock(&hvd_eng_lock);
    return st;
}
