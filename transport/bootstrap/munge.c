#include "transport/bootstrap/munge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/base/error.h"

#ifdef HVD_WITH_MUNGE
#include <dlfcn.h>
#include <munge.h>
#include <pthread.h>
#endif

hvd_status hvd_munge_check(long encoder_uid, long my_uid, size_t got,
                           size_t want) {
    /* A listener of another uid on the port could hand this rank a
     * credential of its own, with a secret it chose: only one this uid
     * encoded comes from rank 0 of this job. */
    if (encoder_uid != my_uid)
        return hvd_error_set(HVD_ERR_AUTH,
                             "the munge credential from the rendezvous was "
                             "encoded by uid %ld, not by this job's uid %ld: "
                             "the program on that port is not rank 0 of this "
                             "job",
                             encoder_uid, my_uid);
    if (got != want)
        return hvd_error_set(HVD_ERR_AUTH,
                             "the munge credential from the rendezvous holds "
                             "%zu bytes where %zu were expected",
                             got, want);
    return HVD_OK;
}

#ifdef HVD_WITH_MUNGE

int hvd_munge_built(void) { return 1; }

/* libmunge, loaded when first needed: libhvd does not depend on it, and
 * where it is missing munge is not used (the job falls back, saying
 * why). */
static struct {
    pthread_once_t once;
    int ok;
    char why[160];
    munge_ctx_t (*ctx_create)(void);
    void (*ctx_destroy)(munge_ctx_t);
    munge_err_t (*ctx_set)(munge_ctx_t, int, ...);
    const char *(*ctx_strerror)(munge_ctx_t);
    const char *(*strerror)(munge_err_t);
    munge_err_t (*encode)(char **, munge_ctx_t, const void *, int);
    munge_err_t (*decode)(const char *, munge_ctx_t, void **, int *, uid_t *,
                          gid_t *);
} lib = {.once = PTHREAD_ONCE_INIT};

static void load(void) {
    void *h = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);

    if (h == NULL) {
        snprintf(lib.why, sizeof(lib.why), "libmunge.so.2 cannot be loaded: %s",
                 dlerror());
        return;
    }
    *(void **)&lib.ctx_create = dlsym(h, "munge_ctx_create");
    *(void **)&lib.ctx_destroy = dlsym(h, "munge_ctx_destroy");
    *(void **)&lib.ctx_set = dlsym(h, "munge_ctx_set");
    *(void **)&lib.ctx_strerror = dlsym(h, "munge_ctx_strerror");
    *(void **)&lib.strerror = dlsym(h, "munge_strerror");
    *(void **)&lib.encode = dlsym(h, "munge_encode");
    *(void **)&lib.decode = dlsym(h, "munge_decode");
    lib.ok = lib.ctx_create && lib.ctx_destroy && lib.ctx_set &&
             lib.ctx_strerror && lib.strerror && lib.encode && lib.decode;
    if (!lib.ok)
        snprintf(lib.why, sizeof(lib.why),
                 "libmunge.so.2 lacks a function hvd calls");
}

/* A context for socket (NULL: munge's default); NULL if libmunge is
 * missing or out of memory. */
static munge_ctx_t context(const char *socket) {
    munge_ctx_t ctx;

    pthread_once(&lib.once, load);
    if (!lib.ok)
        return NULL;
    ctx = lib.ctx_create();
    if (ctx != NULL && socket != NULL && socket[0] != '\0' &&
        lib.ctx_set(ctx, MUNGE_OPT_SOCKET, socket) != EMUNGE_SUCCESS) {
        lib.ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* What went wrong in ctx. */
static const char *failure(munge_ctx_t ctx, munge_err_t e) {
    const char *text = lib.ctx_strerror(ctx);
    return text != NULL ? text : lib.strerror(e);
}

/* Why context() failed. */
static const char *no_context(void) {
    return lib.ok ? "munge_ctx_create failed" : lib.why;
}

int hvd_munge_usable(const char *socket, char *why, size_t whylen) {
    munge_ctx_t ctx = context(socket);
    char *cred = NULL;
    munge_err_t e;

    if (ctx == NULL) {
        snprintf(why, whylen, "%s", no_context());
        return 0;
    }
    e = lib.encode(&cred, ctx, NULL, 0);
    if (e != EMUNGE_SUCCESS)
        snprintf(why, whylen, "munged does not answer: %s", failure(ctx, e));
    free(cred);
    lib.ctx_destroy(ctx);
    return e == EMUNGE_SUCCESS;
}

hvd_status hvd_munge_encode(const char *socket, const void *payload, size_t len,
                            char cred[HVD_MUNGE_CRED_MAX]) {
    munge_ctx_t ctx = context(socket);
    char *text = NULL;
    munge_err_t e;
    hvd_status st = HVD_OK;

    if (ctx == NULL)
        return hvd_error_set(HVD_ERR_AUTH, "munge: %s", no_context());
    e = lib.ctx_set(ctx, MUNGE_OPT_UID_RESTRICTION, getuid());
    if (e == EMUNGE_SUCCESS)
        e = lib.encode(&text, ctx, payload, (int)len);
    if (e != EMUNGE_SUCCESS)
        st = hvd_error_set(HVD_ERR_AUTH, "munge_encode failed: %s",
                           failure(ctx, e));
    else if (strlen(text) >= HVD_MUNGE_CRED_MAX)
        st = hvd_error_set(HVD_ERR_INTERNAL,
                           "munge made a credential of %zu characters (at "
                           "most %d)",
                           strlen(text), HVD_MUNGE_CRED_MAX - 1);
    else
        snprintf(cred, HVD_MUNGE_CRED_MAX, "%s", text);
    free(text);
    lib.ctx_destroy(ctx);
    return st;
}

hvd_status hvd_munge_decode(const char *socket, const char *cred, void *payload,
                            size_t want) {
    munge_ctx_t ctx = context(socket);
    void *buf = NULL;
    int len = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    munge_err_t e;
    hvd_status st;

    if (ctx == NULL)
        return hvd_error_set(HVD_ERR_AUTH, "munge: %s", no_context());
    e = lib.decode(cred, ctx, &buf, &len, &uid, &gid);
    if (e != EMUNGE_SUCCESS)
        st = hvd_error_set(HVD_ERR_AUTH,
                           "munge refused the credential from the "
                           "rendezvous: %s",
                           failure(ctx, e));
    else
        st = hvd_munge_check((long)uid, (long)getuid(),
                             len > 0 ? (size_t)len : 0, want);
    if (st == HVD_OK)
        memcpy(payload, buf, want);
    if (buf != NULL)
        memset(buf, 0, len > 0 ? (size_t)len : 0);
    free(buf);
    lib.ctx_destroy(ctx);
    return st;
}

#else /* !HVD_WITH_MUNGE */

int hvd_munge_built(void) { return 0; }

int hvd_munge_usable(const char *socket, char *why, size_t whylen) {
    (void)socket;
    snprintf(why, whylen, "this hvd was built without munge (libmunge-dev)");
    return 0;
}

hvd_status hvd_munge_encode(const char *socket, const void *payload, size_t len,
                            char cred[HVD_MUNGE_CRED_MAX]) {
    (void)socket;
    (void)payload;
    (void)len;
    (void)cred;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "this hvd was built without munge");
}

hvd_status hvd_munge_decode(const char *socket, const char *cred, void *payload,
                            size_t want) {
    (void)socket;
    (void)cred;
    (void)payload;
    (void)want;
    return hvd_error_set(HVD_ERR_UNSUPPORTED,
                         "this hvd was built without munge");
}

#endif
