#include "transport/bootstrap/protect.h"

#include <limits.h>
#include <string.h>
#include <strings.h>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include "transport/base/error.h"
#include "transport/base/wire.h"

const char *hvd_protect_name(int mode) {
    switch (mode) {
    case HVD_PROTECT_NONE:
        return "none";
    case HVD_PROTECT_INTEGRITY:
        return "integrity";
    case HVD_PROTECT_ENCRYPT:
        return "encrypt";
    }
    return "?";
}

hvd_status hvd_protect_parse(const char *setting_name, const char *text,
                             int fallback, int *mode_out) {
    if (text == NULL || text[0] == '\0') {
        *mode_out = fallback;
        return HVD_OK;
    }
    for (int m = HVD_PROTECT_NONE; m <= HVD_PROTECT_ENCRYPT; m++) {
        if (strcasecmp(text, hvd_protect_name(m)) == 0) {
            *mode_out = m;
            return HVD_OK;
        }
    }
    return hvd_error_set(HVD_ERR_INVALID_ARG,
                         "%s=%s is not one of none, integrity, encrypt",
                         setting_name, text);
}

hvd_status hvd_protect_hkdf(const char *secret, const uint8_t *salt,
                            size_t saltlen, const uint8_t *info, size_t infolen,
                            uint8_t *out, size_t len) {
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *kctx = kdf != NULL ? EVP_KDF_CTX_new(kdf) : NULL;
    OSSL_PARAM params[5];
    hvd_status st = HVD_OK;

    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST,
                                                 (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_octet_string(
        OSSL_KDF_PARAM_KEY, (void *)secret, strlen(secret));
    params[2] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT,
                                                  (void *)salt, saltlen);
    params[3] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO,
                                                  (void *)info, infolen);
    params[4] = OSSL_PARAM_construct_end();
    if (kctx == NULL || EVP_KDF_derive(kctx, out, len, params) != 1)
        st = hvd_error_set(HVD_ERR_INTERNAL,
                           "HKDF-SHA256 through OpenSSL failed to derive the "
                           "connection's keys");
    EVP_KDF_CTX_free(kctx);
    EVP_KDF_free(kdf);
    return st;
}

hvd_status hvd_aead_init(hvd_aead *a, int mode, int seal, const uint8_t *key) {
    EVP_CIPHER_CTX *ctx;

    memset(a, 0, sizeof(*a));
    if (mode == HVD_PROTECT_NONE)
        return HVD_OK;
    ctx = EVP_CIPHER_CTX_new();
    /* The key schedule is set up here, once; each record only resets the
     * nonce (hvd_aead_begin). */
    if (ctx == NULL ||
        EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL, seal) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return hvd_error_set(HVD_ERR_INTERNAL,
                             "OpenSSL could not set up AES-256-GCM");
    }
    a->ctx = ctx;
    a->mode = mode;
    a->seal = seal;
    return HVD_OK;
}

void hvd_aead_free(hvd_aead *a) {
    EVP_CIPHER_CTX_free(a->ctx);
    a->ctx = NULL;
}

int hvd_aead_begin(hvd_aead *a, uint64_t counter) {
    uint8_t iv[12] = {0};

    hvd_put64(iv + 4, counter);
    return EVP_CipherInit_ex2(a->ctx, NULL, NULL, iv, a->seal, NULL) == 1 ? 0
                                                                          : -1;
}

int hvd_aead_update(hvd_aead *a, const uint8_t *in, uint8_t *out, size_t n) {
    int outl;

    /* EVP takes an int length: feed huge records in pieces. */
    while (n > 0) {
        int k = n > (size_t)INT_MAX / 2 ? INT_MAX / 2 : (int)n;
        if (a->mode == HVD_PROTECT_INTEGRITY) {
            if (EVP_CipherUpdate(a->ctx, NULL, &outl, in, k) != 1)
                return -1;
        } else {
            if (EVP_CipherUpdate(a->ctx, out, &outl, in, k) != 1 || outl != k)
                return -1;
            out += k;
        }
        in += k;
        n -= (size_t)k;
    }
    return 0;
}

int hvd_aead_seal_end(hvd_aead *a, uint8_t tag[HVD_PROTECT_TAG]) {
    uint8_t dummy[16];
    int outl;

    if (EVP_CipherFinal_ex(a->ctx, dummy, &outl) != 1 ||
        EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_GCM_GET_TAG, HVD_PROTECT_TAG,
                            tag) != 1)
        return -1;
    return 0;
}

int hvd_aead_open_end(hvd_aead *a, const uint8_t tag[HVD_PROTECT_TAG]) {
    uint8_t dummy[16];
    int outl;

    if (EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_GCM_SET_TAG, HVD_PROTECT_TAG,
                            (void *)tag) != 1 ||
        EVP_CipherFinal_ex(a->ctx, dummy, &outl) != 1)
        return -1;
    return 0;
}

int hvd_aead_seal(hvd_aead *a, uint64_t counter, uint8_t *buf, size_t n,
                  uint8_t tag[HVD_PROTECT_TAG]) {
    if (hvd_aead_begin(a, counter) != 0 || hvd_aead_update(a, buf, buf, n) != 0)
        return -1;
    return hvd_aead_seal_end(a, tag);
}

int hvd_aead_open(hvd_aead *a, uint64_t counter, uint8_t *buf, size_t n,
                  const uint8_t tag[HVD_PROTECT_TAG]) {
    if (hvd_aead_begin(a, counter) != 0 || hvd_aead_update(a, buf, buf, n) != 0)
        return -1;
    return hvd_aead_open_end(a, tag);
}
