/* The master's node registry's own (td_cluster.c, td_cluster_auth.c): what it knows of each
 * node, and the checks of who may speak to it. */
#ifndef TD_CLUSTER_PRIVATE_H
#define TD_CLUSTER_PRIVATE_H

#include "service/cluster/td_cluster.h"

#include <pthread.h>

enum { MAX_NODES = 4096, NAME_LEN = 64 };

typedef struct node {
    char name[64], node_id[65], address[64], version[33];
    char credential[65]; /* given at its registration: its heartbeats and transfers carry it */
    int slots, slots_used, gpus;
    td_node_gpu gpu[TD_GPUS_MAX]; /* the first gpus */
    bool lost;
    double last_seen;  /* monotonic: what the timeout counts from */
    double last_wall;  /* the same moment on the wall clock, for the listing */
    double lost_since; /* monotonic */
} node;

struct td_cluster {
    td_cluster_config cfg;
    char name[64], address[64], version[32], secret[256];
    td_node_gpu gpu[TD_GPUS_MAX]; /* the master's own (cfg.gpu is the caller's) */
    bool has_secret;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* on a monotonic clock */
    node *nodes;
    int n, cap;
    char (*drained)[NAME_LEN]; /* names, whether the node is registered now or not */
    int n_drained;
    pthread_mutex_t drain_mu; /* one drain at a time (taken before mu) */
    void (*on_master_drain)(void *ctx, bool drained);
    void *drain_ctx;
    struct {
        char peer[64];
        double at;
    } refused[16]; /* the last refusal logged per peer: at most one line each 10 s */
    pthread_t sweeper;
    bool started, stopping;
    /* the jobs' side (td_cluster_on_jobs); called without mu */
    td_cluster_sync_fn on_sync;
    td_cluster_lost_fn on_lost;
    void *jobs_ctx;
};

/* The registered node of that name (with c->mu held); NULL: none. */
node *td_cluster_find(td_cluster *c, const char *name);
/* A node's advertised address: a unicast IPv4 address other nodes can reach it at (loopback
 * only from a peer on loopback). -1 with 400 in e. */
int td_cluster_address_ok(const char *address, const char *peer, td_reply_error *e);
/* What a node says of itself beyond its address (version, GPU names): printable ASCII. */
int td_cluster_strings_ok(const node *n, td_reply_error *e);

#endif
