/* Fault injection for tests, outside the production API: one environment variable, read once,
 * names one point in the engine and when the process dies there (SIGKILL, as a crash would), or
 * for a hang point, when the thread that reaches it stops for ever.
 *
 *   TRAIND_FAULT=POINT:N        the N-th time this process reaches POINT
 *   TRAIND_FAULT=POINT:RANK:N   the same, only in the process launched as RANK (torchrun's RANK)
 *
 * Unset, td_fault_at costs a pthread_once and a comparison. A value that does not parse, or names
 * no point below, stops the process at once: a test cannot pass because its fault was never
 * armed. */
#ifndef TD_FAULT_H
#define TD_FAULT_H

#define TD_FAULT_ENV "TRAIND_FAULT"

/* The points, each a td_fault_at call: */
/* a checkpoint save with its first file written and the rest not (io/td_checkpoint.c): the
 * previous checkpoint must stay the latest */
#define TD_FAULT_CHECKPOINT "checkpoint"
/* an all-reduce after its first ring step, or its shared-memory sum (dist/td_comm.c,
 * td_comm_shm.c): the peers must fail cleanly, naming this rank */
#define TD_FAULT_ALLREDUCE "allreduce"
/* a turn of the daemon's supervisor loop (service/jobs/td_job_supervisor.c), where the thread hangs
 * instead of dying (td_fault_hang_at): the watchdog pings must stop, so systemd restarts a
 * daemon whose supervisor is stuck */
#define TD_FAULT_SUPERVISOR "supervisor"

/* Counts one arrival at `point`; SIGKILLs this process at the arrival TRAIND_FAULT names. Safe from
 * any thread. */
void td_fault_at(const char *point);
/* The same, but the calling thread blocks for ever instead (a hang, not a crash). */
void td_fault_hang_at(const char *point);

#endif
