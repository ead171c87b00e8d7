/* The engine (engine.h): the bottom of its files. Finishing, completing
 * and retiring requests, failing them all, the engine's failure, and the
 * lock and condition every engine shares. Calls no other engine file. */

#include "api/runtime/engine_state.h"

/* One lock and condition for every engine: handles outlive an engine
 * (hvd_wait after hvd_shutdown must still work). */
pthread_mutex_t hvd_eng_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t hvd_eng_cond = PTHREAD_COND_INITIALIZER;

void hvd_request_free(hvd_request *req) {
    if (req == NULL)
        return;
    if (hvd_request_owns_arrays(req)) {
        free(req->send);
        free(req->recv);
        free(req->counts);
    }
    free(req->error);
    if (req->name_owned)
        free(req->name);
    if (req->heap)
        free(req);
}

/* Takes req off the engine thread's books: it has run (engine thread). */
void hvd_eng_retire(hvd_engine *eng, hvd_request *req) {
    for (int i = 0; i < eng->npending; i++) {
        if (eng->pending[i] == req) {
            eng->pending[i] = eng->pending[--eng->npending];
            break;
        }
    }
    hvd_namemap_remove_h(&eng->by_name, req->name, req->hash);
}

/* Runs req's completion function, if it has one, and frees req: nobody
 * waits for it (outside the lock). */
void hvd_eng_call_back(hvd_request *req) {
    req->on_done(
        req->status,
        req->status != HVD_OK
            ? (req->error != NULL ? req->error : hvd_strerror(req->status))
            : NULL,
        req->on_done_arg);
    hvd_request_free(req);
}

/* The express request this thread runs the engine for, while it does
 * (hvd_engine_express_run): its waiter is this thread, so it finishes
 * without the lock. This is the engine's own state, not a parameter of a
 * call: which thread finishes a request decides whether the lock is
 * needed, and the same express request is finished with the lock by the
 * engine thread if the job fails while it runs (a mark on the request
 * could not tell the two threads apart). */
_Thread_local hvd_request *hvd_eng_express_req;

/* Tells req's waiter the outcome (engine thread). */
void hvd_eng_finish(hvd_engine *eng, hvd_request *req, hvd_status status,
                    const char *error) {
    int called_back;

    if (req == hvd_eng_express_req) {
        req->status = status;
        if (status != HVD_OK)
            req->error = strdup(error != NULL ? error : hvd_strerror(status));
        req->done = 1;
        return;
    }
    pthread_mutex_lock(&hvd_eng_lock);
    req->status = status;
    if (status != HVD_OK)
        req->error = strdup(error != NULL ? error : hvd_strerror(status));
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    hvd_namemap_remove_h(&eng->inflight, req->name, req->hash);
    called_back = req->on_done != NULL;
    pthread_cond_broadcast(&hvd_eng_cond);
    pthread_mutex_unlock(&hvd_eng_lock);
    if (called_back)
        hvd_eng_call_back(req);
}

/* Finishes req (engine thread). */
void hvd_eng_complete(hvd_engine *eng, hvd_request *req, hvd_status status,
                      const char *error) {
    hvd_eng_retire(eng, req);
    hvd_eng_finish(eng, req, status, error);
}

/* Fails everything pending or queued (engine thread, at the end). */
void hvd_eng_fail_all(hvd_engine *eng, hvd_status status, const char *text) {
    hvd_request *queued;

    while (eng->npending > 0)
        hvd_eng_complete(eng, eng->pending[0], status, text);
    pthread_mutex_lock(&hvd_eng_lock);
    queued = eng->queue_head;
    __atomic_store_n(&eng->queue_head, NULL, __ATOMIC_RELAXED);
    eng->queue_tail = NULL;
    pthread_mutex_unlock(&hvd_eng_lock);
    while (queued != NULL) {
        hvd_request *next = queued->next;
        hvd_eng_finish(eng, queued, status, text);
        queued = next;
    }
}

int hvd_eng_peers_changed(hvd_status status) {
    switch (status) {
    case HVD_ERR_PEER_LOST:
    case HVD_ERR_TIMEOUT:
    case HVD_ERR_TRANSPORT:
    case HVD_ERR_PROTOCOL:
    case HVD_ERR_AUTH:
    case HVD_ERR_SHUTDOWN:
    case HVD_ERR_PEERS_CHANGED:
        return 1;
    default:
        return 0;
    }
}

/* The engine cannot go on: remembers why (for later submissions). */
hvd_status hvd_eng_fail(hvd_engine *eng, hvd_status status) {
    pthread_mutex_lock(&hvd_eng_lock);
    if (eng->failed == HVD_OK) {
        eng->failed = status;
        snprintf(eng->failmsg, sizeof(eng->failmsg), "%s", hvd_error_get());
    }
    pthread_mutex_unlock(&hvd_eng_lock);
    return status;
}
