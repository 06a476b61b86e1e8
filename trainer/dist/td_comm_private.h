/* What td_comm.c (the TCP rings), td_comm_node.c (which ranks share a node) and td_comm_shm.c
 * (shared memory between the ranks of one node) share. Not part of the engine's interface. */
#ifndef TD_COMM_PRIVATE_H
#define TD_COMM_PRIVATE_H

#include "dist/td_comm.h"

#include <stdatomic.h>
#include <stdint.h>

/* 64 Ki floats: big enough to keep the socket busy, small enough to stay in L2 */
#define PIECE_FLOATS        (64 * 1024)
#define TD_COMM_MAX_REGIONS 8
#define TD_COMM_NODE_MAX    160 /* a node identity string, with its terminator */
#define TD_COMM_WHO_MAX     96  /* "host NAME, pid P", with its terminator */

/* Memory from td_comm_alloc. peer[q] is the copy of the node's q-th rank (local position q)
 * mapped here (peer[local_pos] == mine), or NULL when the region is plain memory (the TCP ring
 * all-reduces it). */
typedef struct td_comm_ctl td_comm_ctl;

typedef struct td_comm_region {
    float *mine;
    float **peer;
    size_t floats, bytes, data_bytes; /* bytes: the data, then one control page */
    uint32_t barriers;                /* shared-memory barriers passed on it */
    char transport[320];              /* for td_comm_transport */
} td_comm_region;

/* A TCP ring: every member connected to the next one, in rank order. */
typedef struct td_comm_ring {
    const char *name;         /* "ring", "leaders' ring": for messages */
    int size, pos;            /* members, and this rank's place among them */
    int next_rank, prev_rank; /* the neighbours' global ranks */
    int next_fd, prev_fd;     /* -1 when there is no ring (size 1, or not a member) */
    char addr[128], next_addr[128], prev_addr[128]; /* host:port, this rank's first */
} td_comm_ring;

struct td_comm {
    int rank, world;
    /* every rank, in rank order: broadcast, all-gather, barrier and all-reduce on plain memory */
    td_comm_ring ring;
    /* the ranks on this node (same node identity), in rank order; the first one leads */
    int *local, local_size, local_pos;
    int nodes;       /* distinct node identities */
    int *node_first; /* [world]: the first rank on each rank's node (its leader) */
    /* [world]: "host NAME, pid P" of each rank, for errors that name a peer: a hung or dead
     * peer is found on its host, not only by its rank (NULL before td_comm_find_nodes) */
    char (*who)[TD_COMM_WHO_MAX];
    /* the leaders of every node, when there are several nodes and this rank leads its own: the
     * all-reduce of shared memory between nodes */
    td_comm_ring leaders;
    /* while a node's leader all-reduces over the leaders' ring: its control page's mark of when
     * the current ring step began (td_comm_shm.c), NULL otherwise */
    _Atomic uint64_t *ring_mark;
    double timeout_s;
    td_store *store;
    float *tmp;     /* PIECE_FLOATS */
    int region_seq; /* td_comm_alloc calls so far (the same on every rank) */
    /* for TRAIND_PROFILE: seconds in all-reduces, and of those waiting for the node's peers at
     * shared-memory barriers (written by whichever thread runs the collective: one at a time) */
    double allreduce_s, wait_s;
    td_comm_region regions[TD_COMM_MAX_REGIONS];
};

/* Segment k of n floats split into `parts` nearly equal parts. */
void td_comm_segment(size_t n, int parts, int k, size_t *off, size_t *len);
/* "host NAME, pid P" of rank p ("host unknown" when not known). */
const char *td_comm_who(const td_comm *c, int p);
/* Names the neighbour in ring a failed transfer was with (the next one or the previous one). */
int td_comm_peer_fail(const td_comm *c, const td_comm_ring *ring, bool next, td_err *err);
/* Sums buf [n] over the ring's members in place (no averaging). */
int td_comm_ring_allreduce(td_comm *c, td_comm_ring *ring, float *buf, size_t n, td_err *err);

/* This host's node identity: its boot id and the identity of its /dev/shm (a container or
 * network namespace with its own tmpfs there is another node). */
void td_comm_node_identity(char *out, size_t len);
/* Publishes node (NULL: this host's identity) and sorts the ranks into nodes: fills local,
 * local_size, local_pos, nodes and node_first. */
int td_comm_find_nodes(td_comm *c, const char *node, td_err *err);

/* The shared region holding buf [n], or NULL. */
td_comm_region *td_comm_region_of(td_comm *c, const float *buf, size_t n);
int td_comm_allreduce_shared(td_comm *c, td_comm_region *g, float *buf, size_t n, bool average,
                             td_err *err);
void td_comm_free_regions(td_comm *c);

#endif
