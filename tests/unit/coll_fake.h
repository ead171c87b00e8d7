/*
 * An in-memory transport for the collectives' unit tests (test_algorithms.c,
 * test_ring.c, test_rd.c, test_adasum.c): one thread per rank, messages
 * copied through queues under one mutex, with a socket's flow control (a
 * send completes once the bytes queued ahead of it fit in a small buffer,
 * or once it is received), so that an algorithm that would deadlock over
 * TCP deadlocks here too; and one-sided reads (get, can_get on every peer)
 * for the direct algorithms.
 *
 * coll_fake_run starts one thread per rank, gives each a communicator over
 * the fake transport and runs body on it; body reports what it finds wrong
 * with coll_fake_fail, and coll_fake_run returns how many failures there
 * were (leftover messages included).
 */
#ifndef HVD_TESTS_UNIT_COLL_FAKE_H
#define HVD_TESTS_UNIT_COLL_FAKE_H

#include <stddef.h>

#include "collectives/coll.h"

#define COLL_FAKE_MAXP 16

typedef struct coll_fake_job coll_fake_job;

typedef void (*coll_fake_body)(coll_fake_job *job, hvd_comm *comm, void *arg);

int coll_fake_run(int size, const hvd_comm_config *cfg, coll_fake_body body,
                  void *arg);

/* Records one failure (the first few are printed with what and rank). */
void coll_fake_fail(coll_fake_job *job, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Element i of a buffer of dtype as a double, and back (the values the
 * tests use are small integers, exact in every dtype). */
double coll_fake_load(const void *buf, size_t i, hvd_dtype dtype);
void coll_fake_store(void *buf, size_t i, hvd_dtype dtype, double v);

/* Rank r's input element i for op in a job of size p, and the exact
 * result of reducing every rank's: chosen so that no partial result of
 * any order overflows int8 or loses precision in float16 (AVERAGE: one
 * rank holds p times the answer, so the truncating integer division is
 * exact). */
double coll_fake_value(int r, size_t i, hvd_op op, int p);
double coll_fake_expected(size_t i, hvd_op op, int p);

#endif
