/* traind-bench-allreduce: times all-reduces of one buffer size on the CPU ring. Run it under
 * traind-run; rank 0 prints one JSON line.  usage: traind-bench-allreduce MEGABYTES [REPEATS] */
#include "dist/td_comm.h"
#include "dist/td_dist.h"
#include "dist/td_net.h"
#include "dist/td_store.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: traind-bench-allreduce MEGABYTES [REPEATS]\n");
        return 2;
    }
    size_t n = (size_t)(atof(argv[1]) * 1e6 / sizeof(float));
    int repeats = argc > 2 ? atoi(argv[2]) : 5;
    td_err err = {{0}};
    td_dist d;
    td_store *store = NULL;
    td_comm *comm = NULL;
    if (td_dist_from_env(&d, &err) != 0 ||
        td_store_open(&store, d.master_addr[0] ? d.master_addr : "127.0.0.1", d.master_port,
                      d.rank == 0, d.namespace_, d.timeout_s, &err) != 0 ||
        td_comm_init(&comm, store, d.rank, d.world, d.host[0] ? d.host : "127.0.0.1", NULL,
                     d.timeout_s, &err) != 0) {
        fprintf(stderr, "traind-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    /* registered with the communicator, as the trainer's gradients are: shared memory between
     * the ranks of one host */
    float *buf = td_comm_alloc(comm, n, &err);
    if (!buf) {
        fprintf(stderr, "traind-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7);
    double best = 1e30;
    for (int r = 0; r < repeats + 1; r++) { /* the first round warms the pages and sockets */
        if (td_comm_barrier(comm, &err) != 0) break;
        double t0 = td_clock_now();
        if (td_comm_allreduce(comm, buf, n, true, &err) != 0) break;
        double dt = td_clock_now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    if (err.msg[0]) {
        fprintf(stderr, "traind-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    if (d.rank == 0)
        printf("{\"world\":%d,\"megabytes\":%.1f,\"best_s\":%.4f,\"gb_per_s\":%.2f,"
               "\"transport\":\"%s\"}\n",
               d.world, (double)n * sizeof(float) / 1e6, best,
               (double)n * sizeof(float) / best / 1e9, td_comm_transport(comm, buf));
    td_comm_free(comm, buf);
    td_comm_barrier(comm, &err);
    td_comm_close(comm);
    td_store_close(store);
    return 0;
}
