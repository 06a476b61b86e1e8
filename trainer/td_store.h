/* The rendezvous store: a TCP key-value store hosted by rank 0 at MASTER_ADDR:MASTER_PORT, as
 * torch.distributed's TCPStore. Every rank (rank 0 included) is a client; set, get (waiting for
 * the key), add and barrier each take a deadline. Keys live in a namespace (job and attempt):
 * the server refuses clients of another namespace, so a stale process from an earlier attempt
 * cannot join a new one. */
#ifndef TD_STORE_H
#define TD_STORE_H

#include "td_error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_store td_store;

/* Rank 0 (host_server) listens on host:port and also connects to itself; the others connect,
 * retrying until timeout_s has passed. port 0 with host_server picks a free port (see
 * td_store_port). */
int td_store_open(td_store **out, const char *host, int port, bool host_server,
                  const char *namespace_, double timeout_s, td_err *err);
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

#endif
