/* The rendezvous store: a TCP key-value store hosted by rank 0 at MASTER_ADDR:MASTER_PORT, as
 * torch.distributed's TCPStore. Every rank (rank 0 included) is a client; set, get (waiting for
 * the key), add and barrier each take a deadline. Keys live in a namespace (run and attempt, see
 * td_dist_namespace): the server refuses a client of another attempt of its run, so a stale
 * process from an earlier attempt cannot join a new one.
 *
 * Until every rank has joined (td_store_ready from all `world` ranks) the rendezvous can fail as
 * a whole: a client of another run (a configuration error: the nodes were given different run
 * ids), another world size or a rank already taken; a rank that disconnects before it is ready
 * (it crashed); or td_store_abort (a rank's own error, or traind-run's word that a worker of its
 * node died, perhaps before it could connect). The store then remembers why, wakes every waiting
 * get and answers every later call with "rendezvous failed: <why>", so all ranks on all nodes stop
 * within moments with the cause rather than at their timeout. Once every rank is ready, the job
 * has begun: none of this fails the store any more (a dead peer is the collectives' to report,
 * and the trainer reports it through the store, which must keep working for that). */
#ifndef TD_STORE_H
#define TD_STORE_H

#include "base/td_error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_store td_store;

/* Rank 0 (host_server) listens on host:port and also connects to itself; the others connect,
 * retrying until timeout_s has passed. port 0 with host_server picks a free port (see
 * td_store_port). The client is anonymous: it never fails the rendezvous by leaving. */
int td_store_open(td_store **out, const char *host, int port, bool host_server,
                  const char *namespace_, double timeout_s, td_err *err);
/* The same as rank `rank` of `world`: the server checks it against the others and names it in
 * errors (with this host's name and pid), and its disconnect before td_store_ready fails the
 * rendezvous. */
int td_store_open_rank(td_store **out, const char *host, int port, bool host_server,
                       const char *namespace_, int rank, int world, double timeout_s, td_err *err);
int td_store_port(const td_store *s);
/* Changes the deadline of later calls (seconds). */
void td_store_set_timeout(td_store *s, double timeout_s);
void td_store_close(td_store *s);

int td_store_set(td_store *s, const char *key, const void *value, size_t len, td_err *err);
/* Waits until key is set (or the timeout); *value is malloc'd. */
int td_store_get(td_store *s, const char *key, void **value, size_t *len, td_err *err);
int td_store_add(td_store *s, const char *key, int64_t delta, int64_t *result, td_err *err);
/* Waits until `count` ranks reached the barrier called `name`. */
int td_store_barrier(td_store *s, const char *name, int count, td_err *err);

/* Rank `rank` of `world` has joined (its ring or NCCL communicator is up). When all `world` ranks
 * are, the rendezvous is complete and can no longer fail. */
int td_store_ready(td_store *s, int rank, int world, td_err *err);
/* This client failed before every rank had joined: fails the rendezvous with `why` (prefixed by
 * the rank's identity when opened with td_store_open_rank). Best effort; no-op once complete. */
void td_store_abort(td_store *s, const char *why);
/* The same from outside the job (traind-run): connects to host:port for at most timeout_s and
 * fails namespace_'s rendezvous with `why`. *failed tells whether the store took it (false: the
 * job had begun, or the store serves another namespace). */
int td_store_abort_at(const char *host, int port, const char *namespace_, const char *why,
                      double timeout_s, bool *failed, td_err *err);

#endif
