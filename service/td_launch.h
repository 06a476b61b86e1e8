/* Launching and supervising a group of local worker processes with the torchrun environment:
 * used by traind-run and (next) by the daemon, so both supervise workers the same way.
 *
 * Each attempt starts nproc processes in one new process group, each with RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and the TORCHELASTIC_*
 * variables, and PR_SET_PDEATHSIG so none outlives the launcher. When one exits non-zero (or is
 * killed) the rest get SIGTERM, then SIGKILL after the grace period; with restarts left the
 * whole group starts again with TORCHELASTIC_RESTART_COUNT raised. */
#ifndef TD_LAUNCH_H
#define TD_LAUNCH_H

#include "td_error.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct td_launch_config {
    int nproc_per_node, nnodes, node_rank;
    char master_addr[256];
    int master_port; /* 0: a free port (one node only) */
    int max_restarts;
    char run_id[64];
    double grace_s; /* SIGTERM to SIGKILL */
    char *const *argv;
    /* set by a signal handler to forward SIGINT/SIGTERM to the group; may be NULL */
    volatile sig_atomic_t *stop_signal;
} td_launch_config;

/* Runs the attempts; *exit_code is 0 when every process of an attempt succeeded, else the exit
 * status of the first process that failed (128 + signal for a signal). Returns -1 only when the
 * group could not be started at all. */
int td_launch_run(const td_launch_config *cfg, FILE *log, int *exit_code, td_err *err);

/* A free TCP port on the loopback interface (torchrun's choice for a single node). */
int td_launch_free_port(int *port, td_err *err);

#endif
