/* What td_comm.c (the TCP ring) and td_comm_shm.c (shared memory between ranks of one host)
 * share. Not part of the engine's interface. */
#ifndef TD_COMM_PRIVATE_H
#define TD_COMM_PRIVATE_H

#include "dist/td_comm.h"

#include <stdint.h>

/* 64 Ki floats: big enough to keep the socket busy, small enough to stay in L2 */
#define PIECE_FLOATS        (64 * 1024)
#define TD_COMM_MAX_REGIONS 8

/* Memory from td_comm_alloc. peer[p] is rank p's copy mapped here (peer[rank] == mine), or
 * NULL when the ranks could not share memory (other hosts), where the region is plain memory. */
typedef struct td_comm_ctl td_comm_ctl;

typedef struct td_comm_region {
    float *mine;
    float **peer;
    size_t floats, bytes, data_bytes; /* bytes: the data, then one control page */
    uint32_t barriers;                /* shared-memory barriers passed on it */
    char transport[320];              /* for td_comm_transport */
} td_comm_region;

struct td_comm {
    int rank, world;
    int next_fd, prev_fd; /* -1 for world 1 */
    char next_addr[128], prev_addr[128];
    double timeout_s;
    td_store *store;
    float *tmp;     /* PIECE_FLOATS */
    int region_seq; /* td_comm_alloc calls so far (the same on every rank) */
    td_comm_region regions[TD_COMM_MAX_REGIONS];
};

/* Segment k of n floats split into world nearly equal parts. */
void td_comm_segment(size_t n, int world, int k, size_t *off, size_t *len);
/* Names the neighbour a failed transfer was with (the next one or the previous one). */
int td_comm_peer_fail(const td_comm *c, bool next, td_err *err);

/* The shared region holding buf [n], or NULL. */
td_comm_region *td_comm_region_of(td_comm *c, const float *buf, size_t n);
int td_comm_allreduce_shared(td_comm *c, td_comm_region *g, float *buf, size_t n, bool average,
                             td_err *err);
void td_comm_free_regions(td_comm *c);

#endif
