/* traind-bench-allreduce: times all-reduces of one buffer size on the CPU ring. Run it under
 * traind-run; rank 0 prints one JSON line.  usage: traind-bench-allreduce MEGABYTES [REPEATS] */
#include "bench_rank.h"
#include "base/td_clock.h"

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
    bench_rank me;
    if (bench_rank_join(&me, &err) != 0) {
        fprintf(stderr, "traind-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    /* registered with the communicator, as the trainer's gradients are: shared memory between
     * the ranks of one host */
    float *buf = td_comm_alloc(me.comm, n, &err);
    if (!buf) {
        fprintf(stderr, "traind-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7);
    double best = 1e30;
    for (int r = 0; r < repeats + 1; r++) { /* the first round warms the pages and sockets */
        if (td_comm_barrier(me.comm, &err) != 0) break;
        double t0 = td_clock_now();
        if (td_comm_allreduce(me.comm, buf, n, true, &err) != 0) break;
        double dt = td_clock_now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    if (err.msg[0]) {
        fprintf(stderr, "traind-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    if (me.dist.rank == 0)
        printf("{\"world\":%d,\"megabytes\":%.1f,\"best_s\":%.4f,\"gb_per_s\":%.2f,"
               "\"transport\":\"%s\"}\n",
               me.dist.world, (double)n * sizeof(float) / 1e6, best,
               (double)n * sizeof(float) / best / 1e9, td_comm_transport(me.comm, buf));
    td_comm_free(me.comm, buf);
    bench_rank_leave(&me);
    return 0;
}
