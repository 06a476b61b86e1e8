/* What the benchmark programs run under traind-run share: joining the job's ranks (the store at
 * MASTER_ADDR:MASTER_PORT, then the communicator) as the trainer does, and leaving them. */
#ifndef BENCH_RANK_H
#define BENCH_RANK_H

#include "dist/td_comm.h"
#include "dist/td_dist.h"
#include "dist/td_store.h"

typedef struct bench_rank {
    td_dist dist;
    td_store *store;
    td_comm *comm;
} bench_rank;

/* 0, or -1 with err set (the environment, the store or a peer failed). */
int bench_rank_join(bench_rank *r, td_err *err);

/* Waits for every rank, then closes what bench_rank_join opened. */
void bench_rank_leave(bench_rank *r);

#endif
