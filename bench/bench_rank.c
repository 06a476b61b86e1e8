#include "bench_rank.h"

int bench_rank_join(bench_rank *r, td_err *err) {
    td_dist *d = &r->dist;
    r->store = NULL;
    r->comm = NULL;
    if (td_dist_from_env(d, err) != 0 ||
        td_store_open(&r->store, d->master_addr[0] ? d->master_addr : "127.0.0.1", d->master_port,
                      d->rank == 0, d->namespace_, d->timeout_s, err) != 0)
        return -1;
    return td_comm_init(&r->comm, r->store, d->rank, d->world, d->host[0] ? d->host : "127.0.0.1",
                        NULL, d->timeout_s, err);
}

void bench_rank_leave(bench_rank *r) {
    td_err err = {{0}};
    (void)td_comm_barrier(r->comm, &err); /* a rank that failed already said why */
    td_comm_close(r->comm);
    td_store_close(r->store);
}
