/*
 * Protection of a byte stream after its handshake (HVD_TCP_PROTECT): keys
 * derived per connection and per direction from the job secret and the
 * handshake's two fresh nonces (HKDF-SHA256), and AES-256-GCM records
 * through OpenSSL's EVP. Used by the TCP transport's frames.
 *
 * A stream is a sequence of records; the n-th record a side sends in one
 * direction uses n as its nonce (4 zero bytes, then n as 8 bytes,
 * little-endian). The counter is never sent: each side counts, so a
 * record that is replayed, dropped, reordered or cut off makes the next
 * tag fail. Each direction of each connection has its own key, so a nonce
 * is never used twice under one key.
 *
 *   integrity  a record's bytes are authenticated only (GCM with the
 *              bytes as additional data: GMAC) and travel in the clear
 *   encrypt    a record's bytes are encrypted and authenticated (GCM)
 *
 * Each record carries a 16-byte tag after its bytes. A record can be
 * sealed or opened in pieces (hvd_aead_begin, _update as bytes become
 * ready, _seal_end/_open_end), so a large payload is checked while it
 * streams, in the same pass that moves it.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_PROTECT_H
#define HVD_TRANSPORT_BOOTSTRAP_PROTECT_H

#include <stddef.h>
#include <stdint.h>

#include "hvd/types.h"

#define HVD_PROTECT_TAG 16
#define HVD_PROTECT_KEY 32

typedef enum hvd_protect_mode {
    HVD_PROTECT_NONE = 0,
    HVD_PROTECT_INTEGRITY = 1,
    HVD_PROTECT_ENCRYPT = 2
} hvd_protect_mode;

/* "none", "integrity" or "encrypt" ("?" for anything else). */
const char *hvd_protect_name(int mode);

/* Parses a setting's text (case-insensitive); "" gives fallback. A bad
 * value is HVD_ERR_INVALID_ARG with a sentence naming setting_name and
 * listing the values. */
hvd_status hvd_protect_parse(const char *setting_name, const char *text,
                             int fallback, int *mode_out);

/* HKDF-SHA256 (EVP_KDF): out of len bytes from the secret (the key
 * material), salt and info. */
hvd_status hvd_protect_hkdf(const char *secret, const uint8_t *salt,
                            size_t saltlen, const uint8_t *info, size_t infolen,
                            uint8_t *out, size_t len);

/* One direction's AEAD state: a key set up once, only the nonce reset per
 * record. */
typedef struct hvd_aead {
    void *ctx; /* EVP_CIPHER_CTX */
    int mode;  /* hvd_protect_mode; NONE: no ctx */
    int seal;  /* 1: this side seals (sends), 0: it opens */
} hvd_aead;

/* Sets a up for mode with a 32-byte key. NONE needs no key (may be NULL). */
hvd_status hvd_aead_init(hvd_aead *a, int mode, int seal, const uint8_t *key);
void hvd_aead_free(hvd_aead *a);

/* Starts record number counter. */
int hvd_aead_begin(hvd_aead *a, uint64_t counter);
/* Feeds n bytes of the record: integrity authenticates in (out unused);
 * encrypt writes n bytes to out (out may equal in). 0 on success. */
int hvd_aead_update(hvd_aead *a, const uint8_t *in, uint8_t *out, size_t n);
/* Ends a sealed record: its tag. 0 on success. */
int hvd_aead_seal_end(hvd_aead *a, uint8_t tag[HVD_PROTECT_TAG]);
/* Ends an opened record: 0 if tag is right, -1 if not. */
int hvd_aead_open_end(hvd_aead *a, const uint8_t tag[HVD_PROTECT_TAG]);

/* Whole records at once: seal buf[0, n) (encrypt: in place) and write its
 * tag; open buf (encrypt: decrypts in place) against tag. 0 on success. */
int hvd_aead_seal(hvd_aead *a, uint64_t counter, uint8_t *buf, size_t n,
                  uint8_t tag[HVD_PROTECT_TAG]);
int hvd_aead_open(hvd_aead *a, uint64_t counter, uint8_t *buf, size_t n,
                  const uint8_t tag[HVD_PROTECT_TAG]);

#endif
