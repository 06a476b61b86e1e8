/* The cluster as the master sees it: every node that joined (its name, address, slots, GPUs,
 * version), its state (ready, lost) and its last heartbeat. The master is the only source of
 * truth: agents keep no cluster state, and after a master restart they register again.
 *
 * The protocol rides on the master's HTTP API (api/README.md, "Cluster"): an agent POSTs
 * /v1/cluster/register with the cluster secret (a file given to every node, distinct from users'
 * API tokens, compared in constant time), and gets a credential of its own, new at each
 * registration, which its heartbeats (every heartbeat_s) and file transfers carry: the shared
 * secret crosses the network only to join, and what a node sends is taken as that node's only.
 * A node silent for timeout_s is marked lost by the sweeper thread; its next heartbeat is
 * answered 404 and it registers again.
 *
 * Times are passed in (td_clock_now() seconds) so the rules can be tested without waiting. All
 * functions are thread-safe. */
#ifndef TD_CLUSTER_H
#define TD_CLUSTER_H

#include "base/td_error.h"
#include "base/td_buf.h"
#include "service/store/td_db.h"
#include "service/run/td_gpus.h"
#include "base/td_log.h"
#include "service/submit/td_submit.h" /* td_reply_error */

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The version of the register and heartbeat messages; a node speaking another is refused.
 * 2: "gpus" is the list of the node's GPUs (td_gpus_json), no longer their number.
 * 3: orders carry "gpus_per_proc", "launch_self" and "see_all_gpus", reports
 *    "process_devices": a node that ignored them would start a job in the wrong shape.
 * 4: the register reply gives the node a credential of its own, which its heartbeats and file
 *    transfers carry instead of the shared secret ("Authorization: Node NAME:CREDENTIAL");
 *    orders carry the job's "uid" and "limits". */
#define TD_CLUSTER_PROTOCOL 4

typedef struct td_cluster td_cluster;

typedef struct td_cluster_config {
    const char *name;       /* the master's own node name */
    const char *address;    /* the master's advertised address */
    int slots;              /* the master's own slots */
    int gpus;               /* of which GPUs (at most TD_GPUS_MAX) */
    const td_node_gpu *gpu; /* which: gpus of them */
    const char *version;    /* traind's */
    const char *secret;     /* NULL: this master accepts no agents */
    double heartbeat_s;     /* what agents are told to keep */
    double timeout_s;       /* silence after which a node is lost */
    td_log *log;            /* one line per join, refusal, loss */
    td_db *db;              /* where drained nodes are kept; NULL: in memory only (tests) */
} td_cluster_config;

/* A node name: 1 to 63 of [A-Za-z0-9._-], as hostnames are. */
bool td_cluster_name_ok(const char *name);

int td_cluster_open(td_cluster **out, const td_cluster_config *cfg, td_err *err);
/* Starts the sweeper thread (marks silent nodes lost). */
int td_cluster_start(td_cluster *c, td_err *err);
void td_cluster_close(td_cluster *c); /* stops the sweeper too */

/* Whether an Authorization header ("Cluster SECRET") carries this master's secret (registering).
 * 403 in e when the master accepts no agents, 401 when the secret is missing or wrong; the
 * refusal is logged with the peer's address. */
bool td_cluster_authorized(td_cluster *c, const char *authorization, const char *peer,
                           td_reply_error *e);
/* Whether an Authorization header ("Node NAME:CREDENTIAL") is a registered node's, which is
 * named in node (64 bytes): heartbeats and file transfers. 401 "node_credential" otherwise (the
 * shared secret alone included). */
bool td_cluster_node_authorized(td_cluster *c, const char *authorization, const char *peer,
                                char *node, td_reply_error *e);

/* POST /v1/cluster/register: body {"protocol", "name", "node_id", "address", "slots", "gpus",
 * "version"}. 200 with {"heartbeat_s", "timeout_s", "master", "credential"} in out; 400 for a
 * malformed body or another protocol (an address that is not a unicast one others can reach, a
 * loopback one from a peer that is not on loopback (peer: its address), a version or a GPU name
 * with characters that are not printable), 409 for a name another node holds (a node that is
 * not lost, or the master's own). The same name from the same node_id is that node registering
 * again. */
int td_cluster_register(td_cluster *c, const char *body, size_t len, double now, const char *peer,
                        td_buf *out, td_reply_error *e);
/* POST /v1/cluster/heartbeat from node `from` (authenticated): body {"name", "node_id",
 * "slots_used"}. 404 when the node is not registered under that id or was marked lost (it must
 * register again); 403 when the body names another node than `from`. */
int td_cluster_heartbeat(td_cluster *c, const char *from, const char *body, size_t len, double now,
                         td_buf *out, td_reply_error *e);
/* POST /v1/nodes/{name}/drain and /undrain: no new placements on the node (running jobs go on)
 * or again. The node's JSON in out; 404 for a name that is neither the master nor a node that
 * joined. Kept in the database: a restarted master still holds them. master_used: the master's
 * own slots in use, for its entry. */
int td_cluster_drain(td_cluster *c, const char *name, bool drain, double now, int master_used,
                     td_buf *out, td_reply_error *e);
/* fn(ctx, drained) whenever the master's own node is drained or undrained, under the registry's
 * lock so the two never disagree; called at once with the current state. */
void td_cluster_on_master_drain(td_cluster *c, void (*fn)(void *ctx, bool drained), void *ctx);
/* Whether the named node is drained (the master's own: its queue holds). */
bool td_cluster_drained(td_cluster *c, const char *name);
/* Whether name is the master's own node. */
bool td_cluster_is_master(const td_cluster *c, const char *name);

/* The jobs' side of the protocol (td_jobs, td_job_sync.c). sync: after a register or heartbeat
 * is accepted: msg is the node's message (its "parts": what it runs for the master, their exits
 * and output), reply the object about to be sent, to which the jobs add the node's orders.
 * lost: a node was marked lost (why in words). Both are called without the registry's lock. */
#include <jansson.h>
typedef void (*td_cluster_sync_fn)(void *ctx, const char *node, bool registered, json_t *msg,
                                   json_t *reply);
typedef void (*td_cluster_lost_fn)(void *ctx, const char *node, const char *why);
void td_cluster_on_jobs(td_cluster *c, td_cluster_sync_fn sync, td_cluster_lost_fn lost, void *ctx);

/* Every node as placement sees it: [0] is the master's own. */
typedef struct td_cluster_node {
    char name[64], address[64];
    int slots, reported_used; /* reported_used: what the node's last heartbeat said it uses */
    bool master, lost, drained;
    bool stale; /* missed its last two heartbeats: not a place to start anything now */
} td_cluster_node;
/* A copy of the registry (free it); returns how many nodes. */
int td_cluster_snapshot(td_cluster *c, td_cluster_node **out);

/* Marks nodes silent for timeout_s lost and tells the jobs; returns how many it marked. */
int td_cluster_sweep(td_cluster *c, double now);
/* GET /v1/nodes: {"nodes": [...]}, the master first, then by name; master_used: the master's own
 * slots in use; gpu_users: {node: {"<CUDA ordinal>": {"job", "ranks"}}} (td_jobs_gpu_users), which
 * each GPU's "used_by" shows (null: free), or NULL. */
void td_cluster_list(td_cluster *c, double now, int master_used, const json_t *gpu_users,
                     td_buf *out);

#endif
