/* The scheduler: which waiting jobs start now, and on which nodes, over a list of nodes. One node
 * alone (a daemon without agents) is a cluster of one: the same rules place its jobs.
 *
 * The queue's order: restarts first (they were running), then higher priority, then the earlier
 * submission. The first job that cannot start is the head: it keeps its place, and a later job
 * starts before it only where that cannot delay it (EASY backfilling, as Slurm's backfill):
 *  - the head's shadow time is the first moment it could start if running jobs ended one at a
 *    time, the earliest first, each at its time limit, one without a limit at any moment (now);
 *  - a later job starts if its own time limit ends before the shadow time, or if the head can
 *    still be placed at the shadow time on what the later job leaves free then.
 * Without time limits that is: the head must still fit once the fewest running jobs that make
 * room for it have ended, the later job's slots taken.
 *
 * Placement: a job takes `nnodes` nodes with `slots` free slots each. A one-node job that names
 * no node runs on the first node when it is the master's own and has room (it then runs as it
 * would without a cluster); otherwise the fullest nodes that fit go first, to keep whole nodes
 * free for wide jobs, and the master's own node, when chosen, is node rank 0 (every agent knows
 * its address).
 *
 * Nothing here starts a process or takes a lock: the caller describes the nodes, what running
 * jobs hold and the queue, and its start() does the starting, which may still refuse (GPUs that
 * a stopping job holds, no free port, a checkpoint not yet on the nodes). Unit-tested without
 * processes (tests/unit/test_scheduler.c). */
#ifndef TD_SCHEDULER_H
#define TD_SCHEDULER_H

#include <stdbool.h>

enum { TD_SCHED_MAX_NODES = 4096 };

typedef struct td_sched_node {
    const char *name;
    int slots;   /* in all */
    int free;    /* free now */
    bool usable; /* alive, not stale, not drained: it takes new jobs */
    bool master; /* the master's own node (at most one; first when present) */
} td_sched_node;

/* What one running job holds on one node, and when it ends at the latest (0: no time limit). */
typedef struct td_sched_hold {
    int node; /* index into the nodes */
    int slots;
    double ends; /* wall-clock seconds */
} td_sched_hold;

typedef struct td_sched_job {
    long id;
    int priority;
    bool restart;           /* an attempt after a failure or a restart of the daemon: first */
    int nnodes;             /* nodes it needs */
    int slots;              /* slots on each */
    double time_limit_s;    /* 0: none */
    const char *const *pin; /* the only nodes it may run on, NULL-terminated; NULL: any */
} td_sched_job;

/* What start() did with a placement. */
typedef enum { TD_SCHED_WAITS, TD_SCHED_STARTED, TD_SCHED_ENDED } td_sched_outcome;

/* Why a job did not start (waits()). */
typedef enum {
    TD_SCHED_NO_ROOM, /* the head: too few nodes with room now (or start() refused) */
    TD_SCHED_BEHIND,  /* behind the head, and starting now could delay it */
} td_sched_reason;

/* A placement that start() gets: node indexes in node rank order; local: the job runs on the
 * master's own node alone, as it would without a cluster; ahead_of: the head it starts before
 * (a backfill), else NULL, with in_time: because its time limit ends before the head's shadow
 * time (else: it uses room the head leaves free). */
typedef struct td_sched_start {
    const int *nodes;
    bool local;
    const td_sched_job *ahead_of;
    bool in_time;
} td_sched_start;

typedef struct td_sched_calls {
    td_sched_outcome (*start)(void *ctx, const td_sched_job *job, const td_sched_start *where);
    /* head: the queue's head for TD_SCHED_BEHIND; room_now: whether nodes with room for it
     * exist now */
    void (*waits)(void *ctx, const td_sched_job *job, td_sched_reason why, const td_sched_job *head,
                  bool room_now);
    void *ctx;
} td_sched_calls;

/* Whether a runs before b in the queue: a restart first, then priority, then submission. */
bool td_sched_runs_before(const td_sched_job *a, const td_sched_job *b);

/* One pass: the queue (any order: it is sorted here) against the nodes and what running jobs
 * hold, at wall-clock time now. Calls start() for each job it places, in queue order, and
 * waits() for each it does not. */
void td_sched_run(const td_sched_node *nodes, int n_nodes, const td_sched_hold *holds, int n_holds,
                  const td_sched_job *queue, int n_queue, double now, const td_sched_calls *calls);

/* Where job would go on room (free slots per node) now: false when too few nodes have room.
 * picked: nnodes indexes in node rank order; *local as in td_sched_start. */
bool td_sched_place(const td_sched_job *job, const td_sched_node *nodes, int n_nodes,
                    const int *room, int *picked, bool *local);

#endif
