/* Collectives between ranks on the CPU: all-reduce (sum or average), broadcast, all-gather and
 * barrier over a TCP ring (each rank connected to the next), addresses exchanged through the
 * rendezvous store. All-reduce is a ring reduce-scatter then all-gather, each step moving
 * pieces of at most 256 KiB so large buffers stream through the ring. Every rank ends with the
 * same bits: each element is summed in one place, in one order, and then copied. Every call is
 * bounded by the timeout; a dead peer is an error that names it, never a hang.
 *
 * Ranks know which of them share a node (td_comm_node.c): on buffers from td_comm_alloc the
 * ranks of a node all-reduce through shared memory and only one rank per node, its leader,
 * talks TCP to the other nodes. The NCCL backend (GPU issue) implements the same interface. */
#ifndef TD_COMM_H
#define TD_COMM_H

#include "base/td_error.h"
#include "dist/td_store.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct td_comm td_comm;

/* Joins the ring of `world` ranks: publishes this rank's node identity (node, or NULL for
 * this host's: its boot id and /dev/shm) and learns the others', listens on host (this rank's
 * address as the others reach it), publishes it in the store, connects to the next rank and
 * accepts the previous one; the leaders of several nodes also join a ring of their own. A ring
 * connection that does not come within seconds is an error naming the peer and the address. */
int td_comm_init(td_comm **out, td_store *store, int rank, int world, const char *host,
                 const char *node, double timeout_s, td_err *err);
void td_comm_close(td_comm *c);
/* After a failure: shuts the ring connections down at once, so the neighbours fail now rather
 * than at their timeout. Later collectives fail. */
void td_comm_abort(td_comm *c);

int td_comm_allreduce(td_comm *c, float *buf, size_t n, bool average, td_err *err);
int td_comm_broadcast(td_comm *c, float *buf, size_t n, int root, td_err *err);
/* all [world × n] receives every rank's `mine` [n], in rank order. */
int td_comm_allgather(td_comm *c, const float *mine, size_t n, float *all, td_err *err);
int td_comm_barrier(td_comm *c, td_err *err);

/* Collective (every rank calls it with the same n, in the same order): a buffer of n floats for
 * all-reduces. Each rank's buffer is mapped into every rank of its node (POSIX shared memory),
 * and all-reduces on it, or on any part of it at the same offset on every rank, read the node's
 * peers' memory directly instead of streaming it through the TCP ring (as NCCL's registered
 * buffers); with several nodes, each node's sum then travels the ring of node leaders. With one
 * rank per node, or when some node cannot share memory, it is plain memory (the TCP ring).
 * NULL on failure. */
float *td_comm_alloc(td_comm *c, size_t n, td_err *err);
void td_comm_free(td_comm *c, float *p);
/* Seconds spent in all-reduces so far, and of those waiting at shared-memory barriers for the
 * node's slower ranks (TRAIND_PROFILE's breakdown). */
void td_comm_times(const td_comm *c, double *allreduce_s, double *wait_s);
/* How all-reduces on p travel: "shared memory" (one node), "shared memory within each node, a
 * TCP ring between the N nodes", or "the TCP ring (why not shared memory)". */
const char *td_comm_transport(const td_comm *c, const float *p);

#endif
