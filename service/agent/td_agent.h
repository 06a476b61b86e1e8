/* A traind started with --join: the agent thread that keeps this node in its master's cluster
 * (td_cluster.h says what the master does). It registers, then heartbeats at the interval the
 * master gives; when the master cannot be reached it keeps retrying with back-off (1, 2, 4 ...
 * up to 10 s) and registers again once the master answers, as it does when the master no longer
 * knows it (a master restart, or it was marked lost).
 *
 * A refusal that retrying cannot cure (a wrong cluster secret, another protocol version, a node
 * name already taken, a master that accepts no agents) is printed with the master's own message
 * and ends the daemon: td_agent_refused() is then true and the process got SIGTERM. */
#ifndef TD_AGENT_H
#define TD_AGENT_H

#include "base/td_error.h"

#include "service/run/td_gpus.h"
#include "base/td_log.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct td_agent td_agent;

typedef struct td_agent_config {
    const char *master;    /* ADDR:PORT of the master's API */
    const char *secret;    /* the cluster secret */
    const char *name;      /* this node's name */
    const char *node_id;   /* this node's id (random, kept in the state directory) */
    const char *advertise; /* NULL: the address this node reaches the master from */
    int slots, gpus;
    const td_node_gpu *gpu; /* the gpus GPUs (NULL: ordinals 0 to gpus - 1, nothing known) */
    const char *version;
    const char *state_dir; /* jobs/<id>/ of the parts this node runs */
    /* the CA certificates (PEM file) the master's certificate must chain to: HTTPS to the
     * master, its name checked against --join's host; NULL: plain HTTP */
    const char *tls_ca;
    td_log *log;
} td_agent_config;

/* Checks the master's address and works out the advertised one: an address that does not parse
 * or has no route is an error here, before the daemon serves. Starts nothing. */
int td_agent_open(td_agent **out, const td_agent_config *cfg, td_err *err);
/* Starts the thread. jobs: this node's, which run the parts the master orders: every heartbeat
 * reports on them (exits, rank 0's lines, the ranks' logs) and its reply says which should run.
 * Before a part starts, the checkpoint it resumes from is fetched from the master (checked by
 * size and SHA-256); after rank 0 writes one here, it is uploaded before the line that announces
 * it. A node that cannot reach its master for the timeout stops its parts: the master has ended
 * those attempts by then, and no two attempts of a job may train at once. */
struct td_jobs;
int td_agent_start(td_agent *a, struct td_jobs *jobs, td_err *err);
/* Whether the master refused this node for good (the daemon should exit 1). */
bool td_agent_refused(td_agent *a);
/* Stops the thread, if started (within one request's timeout), and frees. */
void td_agent_stop(td_agent *a);

#endif
