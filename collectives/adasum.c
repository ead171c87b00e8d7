/*
 * Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
 * Summation"), as Horovod runs it on the CPU: gradients a and b combine
 * as
 *
 *     (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
 *
 * (a norm below sqrt(DBL_MIN) leaves its coefficient at 1), so that equal
 * gradients average and orthogonal ones add. Over a power-of-two number
 * of ranks the combination is recursive: in level l = 1, 2, 4, ... rank r
 * and rank r ^ l each keep one half of the part they hold and send the
 * other (vector halving, as a reduce-scatter), the dot product and the
 * two squared norms of the groups being combined are summed over the 2l
 * ranks that hold the group's pieces (recursive doubling of three
 * doubles), and each rank combines its half. The halves then travel back
 * level by level (an allgather). Every element is combined by one rank,
 * with the same coefficients everywhere, so every rank ends with the same
 * bits.
 */
#include "collectives/coll.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reduce.h"
#include "transport/base/dtype.h"
#include "transport/base/error.h"

/* The deepest recursion: 2^32 ranks. */
#define MAX_LEVELS 32

/* Element i of buf (float16, float32 or float64) as a double. */
static double get(hvd_dtype dt, const void *buf, size_t i) {
    switch (dt) {
    case HVD_FLOAT16:
        return (double)hvd_half_to_float(((const uint16_t *)buf)[i]);
    case HVD_FLOAT32:
        return (double)((const float *)buf)[i];
    default:
        return ((const double *)buf)[i];
    }
}

static void put(hvd_dtype dt, void *buf, size_t i, double v) {
    switch (dt) {
    case HVD_FLOAT16:
        ((uint16_t *)buf)[i] = hvd_float_to_half((float)v);
        break;
    case HVD_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    default:
        ((double *)buf)[i] = v;
        break;
    }
}

/* Sends len bytes to peer and receives rlen from it, at once. */
static hvd_status swap(hvd_comm *comm, int peer, const void *sbuf, size_t len,
                       void *rbuf, size_t rlen) {
    hvd_status st = hvd_comm_irecv(comm, peer, rbuf, rlen, &comm->reqs[0]);

    if (st == HVD_OK)
        st = hvd_comm_isend(comm, peer, sbuf, len, &comm->reqs[1]);
    return st == HVD_OK ? hvd_comm_waitall(comm, comm->reqs, 2) : st;
}

/* Sums v[0..3) over the group of the 2l ranks that share r / (2l):
 * recursive doubling, the same sums (bit for bit) on every member. */
static hvd_status group_sum(hvd_comm *comm, double v[3], int l) {
    double other[3];

    for (int m = 1; m <= l; m <<= 1) {
        hvd_status st =
            swap(comm, comm->rank ^ m, v, sizeof(other), other, sizeof(other));
        if (st != HVD_OK)
            return st;
        for (int k = 0; k < 3; k++)
            v[k] += other[k];
    }
    return HVD_OK;
}

int hvd_adasum_supports(int size, hvd_dtype dtype) {
    return size > 0 && (size & (size - 1)) == 0 &&
           (dtype == HVD_FLOAT16 || dtype == HVD_FLOAT32 ||
            dtype == HVD_FLOAT64);
}

hvd_status hvd_adasum_allreduce(hvd_comm *comm, const void *sendbuf,
                                void *recvbuf, size_t count, hvd_dtype dtype) {
    size_t es = hvd_dtype_size(dtype);
    size_t off[MAX_LEVELS], cnt[MAX_LEVELS];
    size_t my_off = 0, my_cnt = count;
    int p = comm->size, r = comm->rank, nlev = 0;
    uint8_t *buf = recvbuf, *tmp;
    hvd_status st;

    if (!hvd_adasum_supports(p, dtype))
        return hvd_error_set(HVD_ERR_UNSUPPORTED,
                             "Adasum runs on a power-of-two number of ranks "
                             "and float16, float32 or float64 (here %d ranks, "
                             "%s)",
                             p, hvd_dtype_name(dtype));
    comm->last_path = p == 1 ? "local" : "adasum";
    comm->last_transport = comm->tp != NULL ? comm->tp->ops->name : "local";
    if (sendbuf != recvbuf && count > 0)
        memcpy(recvbuf, sendbuf, count * es);
    if (p == 1)
        return HVD_OK;
    st = hvd_comm_scratch(comm, (count / 2 + 1) * es, (void **)&tmp);
    if (st != HVD_OK)
        return st;

    /* Vector halving: this rank keeps one half of what it holds, combined
     * with the neighbour's copy of that half. */
    for (int l = 1; l < p; l <<= 1, nlev++) {
        size_t first = my_cnt / 2, second = my_cnt - first;
        int right = (r & l) != 0;
        size_t keep = right ? my_off + first : my_off;
        size_t nkeep = right ? second : first;
        size_t give = right ? my_off : my_off + first;
        size_t ngive = right ? first : second;

        off[nlev] = my_off;
        cnt[nlev] = my_cnt;
        st = swap(comm, r ^ l, buf + give * es, ngive * es, tmp, nkeep * es);
        if (st != HVD_OK)
            return st;
        /* a: this rank's group's sum, b: the neighbour's. The left group's
         * squared norm goes in v[1] on both sides. */
        double dot = 0, aa = 0, bb = 0, v[3];
        for (size_t i = 0; i < nkeep; i++) {
            double a = get(dtype, buf, keep + i), b = get(dtype, tmp, i);
            dot += a * b;
            aa += a * a;
            bb += b * b;
        }
        v[0] = dot;
        v[1] = right ? bb : aa;
        v[2] = right ? aa : bb;
        st = group_sum(comm, v, l);
        if (st != HVD_OK)
            return st;
        double anorm = right ? v[2] : v[1], bnorm = right ? v[1] : v[2];
        double ac = 1, bc = 1;
        if (anorm >= sqrt(DBL_MIN))
            ac = 1.0 - v[0] / anorm * 0.5;
        if (bnorm >= sqrt(DBL_MIN))
            bc = 1.0 - v[0] / bnorm * 0.5;
        for (size_t i = 0; i < nkeep; i++)
            put(dtype, buf, keep + i,
                ac * get(dtype, buf, keep + i) + bc * get(dtype, tmp, i));
        my_off = keep;
        my_cnt = nkeep;
    }

    /* Back: each level's halves are exchanged into place. */
    for (int k = nlev - 1; k >= 0; k--) {
        int l = 1 << k, right = (r & l) != 0;
        size_t first = cnt[k] / 2;
        size_t other = right ? off[k] : off[k] + first;
        size_t nother = right ? first : cnt[k] - first;

        st = swap(comm, r ^ l, buf + my_off * es, my_cnt * es, buf + other * es,
                  nother * es);
        if (st != HVD_OK)
            return st;
        my_off = off[k];
        my_cnt = cnt[k];
    }
    return HVD_OK;
}
