/*
 * Rabenseifner's allreduce: a reduce-scatter by recursive halving, then an
 * allgather by recursive doubling (Thakur, Rabenseifner and Gropp,
 * "Optimization of collective communication operations in MPICH").
 * Each rank sends and receives 2(p-1)/p of the data, as in the ring, but in
 * 2 log2(p) steps instead of 2(p-1): between the ring (bandwidth, many
 * steps) and recursive doubling (latency, whole buffer every step).
 *
 * The buffer is cut into p2 blocks (p2: the largest power of two <= p).
 * In halving step k the partners newrank ^ 2^k split their current window
 * of blocks: the lower rank keeps the lower half and sends the upper, the
 * other the reverse, and each reduces what it receives into what it keeps.
 * After log2(p2) steps each rank holds the full result of one window; the
 * doubling steps replay the splits backwards, exchanging finished windows.
 * For a p that is not a power of two the first 2*rem ranks fold pairwise
 * first and unfold at the end, as in recursive doubling (rd.c).
 */
#include "collectives/coll.h"

/* Window of blocks [lo, hi) as an element range. */
static void window(size_t count, int p2, int lo, int hi, size_t *off,
                   size_t *cnt) {
    size_t o1, c1, o2, c2;
    hvd_part_range(count, (size_t)p2, (size_t)lo, &o1, &c1);
    hvd_part_range(count, (size_t)p2, (size_t)hi - 1, &o2, &c2);
    *off = o1;
    *cnt = o2 + c2 - o1;
}

static hvd_status exchange(hvd_comm *comm, int partner, const void *sbuf,
                           size_t slen, void *rbuf, size_t rlen) {
    hvd_req *req = comm->reqs;
    hvd_status st = hvd_comm_irecv(comm, partner, rbuf, rlen, &req[0]);
    if (st == HVD_OK)
        st = hvd_comm_isend(comm, partner, sbuf, slen, &req[1]);
    if (st == HVD_OK)
        st = hvd_comm_waitall(comm, req, 2);
    return st;
}

hvd_status hvd_rabenseifner_allreduce(hvd_comm *comm, const void *sendbuf,
                                      void *recvbuf, size_t count,
                                      hvd_dtype dtype, hvd_op op) {
    size_t es = hvd_dtype_size(dtype), bytes = count * es;
    int p = comm->size, r = comm->rank;
    int p2 = 1, rem, newrank, steps = 0;
    uint8_t *buf = recvbuf, *tmp;
    hvd_status st;

    if (sendbuf != recvbuf && bytes > 0)
        hvd_comm_copy(comm, recvbuf, sendbuf, bytes);
    if (p == 1)
        return HVD_OK;
    while (p2 * 2 <= p) {
        p2 *= 2;
        steps++;
    }
    rem = p - p2;
    /* Received halves never exceed half the buffer plus one block. */
    st = hvd_comm_scratch(comm, bytes ? bytes : 1, (void **)&tmp);
    if (st != HVD_OK)
        return st;

    /* Fold: the even rank of each of the first rem pairs hands its data to
     * the odd one and sits out. */
    st = hvd_fold(comm, buf, tmp, count, dtype, op, rem, &newrank);
    if (st != HVD_OK)
        return st;

    if (newrank >= 0) {
        int lo = 0, hi = p2;
        int los[32], his[32];

        /* Recursive halving. */
        for (int k = 0; k < steps; k++) {
            int mask = 1 << k;
            int np = newrank ^ mask;
            int partner = np < rem ? np * 2 + 1 : np + rem;
            int mid = lo + (hi - lo) / 2;
            int klo = newrank < np ? lo : mid, khi = newrank < np ? mid : hi;
            int slo = newrank < np ? mid : lo, shi = newrank < np ? hi : mid;
            size_t koff, kcnt, soff, scnt;

            los[k] = lo;
            his[k] = hi;
            window(count, p2, klo, khi, &koff, &kcnt);
            window(count, p2, slo, shi, &soff, &scnt);
            st = exchange(comm, partner, buf + soff * es, scnt * es, tmp,
                          kcnt * es);
            if (st != HVD_OK)
                return st;
            /* Lower rank's data first, so both halves of a pair combine
             * their operands in the same order as recursive doubling. */
            if (partner < r)
                hvd_comm_reduce(comm, buf + koff * es, tmp, buf + koff * es,
                                kcnt, dtype, op);
            else
                hvd_comm_reduce(comm, buf + koff * es, buf + koff * es, tmp,
                                kcnt, dtype, op);
            lo = klo;
            hi = khi;
        }
        if (op == HVD_AVERAGE) {
            size_t off, cnt;
            window(count, p2, lo, hi, &off, &cnt);
            hvd_comm_scale_div(comm, buf + off * es, cnt, dtype, p);
        }
        /* Recursive doubling, the splits in reverse. */
        for (int k = steps - 1; k >= 0; k--) {
            int mask = 1 << k;
            int np = newrank ^ mask;
            int partner = np < rem ? np * 2 + 1 : np + rem;
            int plo = lo == los[k] ? hi : los[k];
            int phi = lo == los[k] ? his[k] : lo;
            size_t moff, mcnt, poff, pcnt;

            window(count, p2, lo, hi, &moff, &mcnt);
            window(count, p2, plo, phi, &poff, &pcnt);
            st = exchange(comm, partner, buf + moff * es, mcnt * es,
                          buf + poff * es, pcnt * es);
            if (st != HVD_OK)
                return st;
            lo = los[k];
            hi = his[k];
        }
    }

    return hvd_unfold(comm, buf, bytes, rem);
}
