/*
 * The shared-memory transport, for ranks on the same host.
 *
 * Each rank makes one segment (POSIX shared memory) that holds the FIFOs
 * its same-host peers write into: one per (sender, channel), a ring of
 * cache-line-flagged cells. A message up to one cell is copied in by the
 * sender and out by the receiver; a larger one is read by the receiver
 * straight from the sender's buffer with process_vm_readv (Linux cross
 * memory attach: one copy) where the kernel allows it, and otherwise
 * streamed through the cells (copy-in/copy-out, pipelined).
 *
 * Segments are unlinked as soon as every same-host rank has mapped them,
 * so that no /dev/shm entry outlives a crash after hvd_init.
 *
 * A waiting rank spins briefly, then sleeps on a futex in its own segment
 * that every peer rings when it gives it something to do. It watches its
 * peers' processes (pidfd) and the heartbeat each waiting peer writes into
 * its segment, so a dead peer fails every operation at once and a stopped
 * one after HVD_TIMEOUT_SECONDS, naming the rank.
 *
 * Peers on other hosts are not reachable: isend/irecv towards them fail
 * with HVD_ERR_INVALID_ARG. With one-sided get (process_vm_readv) the
 * collectives can reduce straight out of a peer's buffers.
 */
#ifndef HVD_TRANSPORT_SHM_SHM_H
#define HVD_TRANSPORT_SHM_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

/* The ops table, with the registry hook cleanup_job (hvdrun removes a
 * dead rank's segments when a job ends). Its settings: HVD_SHM_CMA,
 * HVD_SHM_SPIN_US. */
extern const hvd_transport_ops hvd_shm_ops;

#endif
