/* Where this process stands in a distributed job: the torchrun environment (RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; TORCHELASTIC_RUN_ID and
 * TORCHELASTIC_RESTART_COUNT name the attempt). Without RANK and WORLD_SIZE the process is a
 * world of one. */
#ifndef TD_DIST_H
#define TD_DIST_H

#include "base/td_error.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct td_dist {
    int rank, world;
    int local_rank, local_world, group_rank;
    char master_addr[256];
    int master_port;
    char host[256];       /* the address other ranks reach this one at */
    char host_why[160];   /* how it was chosen, for the start-up line */
    char namespace_[256]; /* "<run id>/attempt-<restart count>" */
    double timeout_s;     /* for the rendezvous and every collective */
} td_dist;

/* The rendezvous store's namespace for attempt `restart` of run `run_id`:
 * "<run id>" TD_DIST_ATTEMPT "<restart>". The workers and traind-run (which tells the store when
 * a worker of its node failed) spell it here, and the store tells a stale attempt of its own run
 * (refused) from another run (a configuration error) by the part before TD_DIST_ATTEMPT. */
#define TD_DIST_ATTEMPT "/attempt-"
void td_dist_namespace(char *out, size_t len, const char *run_id, int restart);

/* The address this rank advertises for its ring connections, in order of precedence:
 * TRAIND_HOST (an address or name, as given); the IPv4 address of the interface named by
 * TRAIND_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME, as PyTorch's Gloo reads it); with one node the
 * master's address; otherwise the local address of the route to the master, the one its peers
 * reach it at (as c10d and Gloo choose): never the hostname, which Debian's /etc/hosts maps to a
 * loopback address, so a peer on another host would dial itself. */
int td_dist_pick_host(td_dist *d, td_err *err);

/* Reads the environment; every malformed variable is an error naming it. */
int td_dist_from_env(td_dist *d, td_err *err);
static inline bool td_dist_active(const td_dist *d) {
    return d && d->world > 1;
}

#endif
