/*
 * munge (Slurm's authentication service), for the rendezvous rank 0
 * hosts under srun: rank 0 hands each rank the job secret only inside a
 * munge credential that only a process of the job's own uid can decode,
 * fresh for each connection. Everything munge-specific is in munge.c and
 * compiled only with HVD_WITH_MUNGE; without it every call says so.
 *
 * socket names munged's socket (NULL: munge's default,
 * /run/munge/munge.socket.2; HVD_MUNGE_SOCKET sets it).
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_MUNGE_H
#define HVD_TRANSPORT_BOOTSTRAP_MUNGE_H

#include <stddef.h>

#include "hvd/types.h"

/* Largest credential hvd passes (its payload is under 100 bytes). */
#define HVD_MUNGE_CRED_MAX 1024

/* 1 if this hvd was built with munge. */
int hvd_munge_built(void);

/* 1 if munge can be used here: built in, and munged answers a test
 * encode. Else 0 and why gets the reason (a sentence fragment). */
int hvd_munge_usable(const char *socket, char *why, size_t whylen);

/*
 * Encodes payload (len bytes) into a credential that only a process of
 * this process's uid can decode (MUNGE_OPT_UID_RESTRICTION), as text of
 * at most HVD_MUNGE_CRED_MAX - 1 characters into cred (NUL-terminated).
 */
hvd_status hvd_munge_encode(const char *socket, const void *payload, size_t len,
                            char cred[HVD_MUNGE_CRED_MAX]);

/*
 * Decodes cred and checks it: munge accepts it (not forged, expired nor
 * replayed, and this uid may decode it), the process that encoded it ran
 * as this process's uid, and its payload is exactly want bytes, copied
 * into payload. HVD_ERR_AUTH with a sentence otherwise.
 */
hvd_status hvd_munge_decode(const char *socket, const char *cred, void *payload,
                            size_t want);

/* The checks hvd_munge_decode makes of what munge decoded, apart from
 * munge (unit-tested): HVD_OK or HVD_ERR_AUTH with a sentence. */
hvd_status hvd_munge_check(long encoder_uid, long my_uid, size_t got,
                           size_t want);

#endif
