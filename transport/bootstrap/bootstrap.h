/*
 * transport/bootstrap/: how the ranks of a job find and trust each other.
 *
 * This folder is the layer between the base (transport/base/) and the
 * transports: it includes only base headers and its own, and the
 * transports, the runtime (api/runtime/setup.c, discovery.c) and the
 * launcher (tools/hvdrun/) use it. It owns:
 *
 *   bootstrap.h    this interface: the out-of-band allgather ranks run
 *                  during hvd_init, and the sizes of a job id and a host
 *                  name
 *   rendezvous.h   the rendezvous, client and server (fixed and elastic
 *                  mode); its messages are rendezvous.proto
 *   rdv_client.c   the client: connecting, joining a generation, the
 *                  allgather rounds (used by hvd_init)
 *   rdv_server.c   the server: listening, accepting, reading, a fixed
 *                  job's rounds, the sweep of stalled connections (run
 *                  by hvdrun)
 *   rdv_elastic.c  the elastic server's workers and generations
 *   rdv_host.c     the rendezvous rank 0 hosts in a thread of its own
 *                  (torchrun, srun without MPI) on the first free port of
 *                  a range, and the client that tries the range
 *   rdv_conn.c     one server connection: its queue of answers, sending,
 *                  failing and closing it; a round's answer to every rank
 *   rdv_internal.h private: the framing client and server share, and the
 *                  server's state, shared by its three files
 *   job_id.{c,h}   a job id as text, the id of an elastic generation
 *   handshake.c/h  the handshake every connection of a job starts with
 *   net.c/h        sockets and the choice of addresses
 *   failure.c/h    how a transport fails for good: the first failure
 *                  wins, the stall sentence, how a peer is named
 *
 * Calls go one way: rdv_host.c calls rdv_server.c and rdv_client.c;
 * rdv_server.c calls rdv_elastic.c and rdv_conn.c,
 * rdv_elastic.c calls rdv_conn.c; the server and the client call
 * handshake.c and net.c; handshake.c, net.c, job_id.c and failure.c call
 * nothing of this folder.
 */
#ifndef HVD_TRANSPORT_BOOTSTRAP_BOOTSTRAP_H
#define HVD_TRANSPORT_BOOTSTRAP_BOOTSTRAP_H

#include <stddef.h>

#include "hvd/types.h"

#define HVD_JOB_ID_LEN 16
#define HVD_HOST_MAX 64

/*
 * The bootstrap: the out-of-band channel through which ranks find each
 * other during hvd_init (hvdrun's rendezvous; mpirun's MPI in a later
 * release). Every rank calls allgather in the same order.
 */
typedef struct hvd_bootstrap hvd_bootstrap;
struct hvd_bootstrap {
    int rank;
    int size;
    /*
     * Gathers len bytes from every rank into all_out (size * len bytes, in
     * rank order). Blocking, bounded by the start timeout. Every rank passes
     * the same len.
     */
    hvd_status (*allgather)(hvd_bootstrap *bs, const void *mine, size_t len,
                            void *all_out);
    void *ctx;
};

#endif
