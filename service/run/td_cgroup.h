/* Each attempt's processes in a cgroup (v2) of their own, under the daemon's subtree:
 *
 *   SUBTREE/job-ID.attempt-A.node-R/shepherd   traind-shepherd, which moves itself there
 *   SUBTREE/job-ID.attempt-A.node-R/ranks      the job's processes: each joins it before exec
 *
 * so that nothing a job starts escapes it (setsid, a double fork: membership is inherited, and
 * a job cannot move itself out, the cgroup being root's), its end and a cancel kill all of it at
 * once (cgroup.kill), the attempt is over only when it is empty (cgroup.events), and its limits
 * are the kernel's to keep: memory.max, pids.max and cpu.weight on `ranks` (resources.memory_gb,
 * pids, cpu_weight), where those controllers can be had.
 *
 * SUBTREE is found at start (td_cgroups_setup): under systemd (Delegate=yes), the service's own
 * cgroup, the daemon moving itself into a leaf ("daemon") so that the controllers can be enabled
 * below; run by hand, a cgroup made beside or below the one it was started in. Where cgroup v2 is
 * not there or not writable, the daemon says so once and the process-group sweep does the job. */
#ifndef TD_CGROUP_H
#define TD_CGROUP_H

#include "base/td_error.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

enum { TD_CG_MEMORY = 1, TD_CG_PIDS = 2, TD_CG_CPU = 4 };

typedef struct td_cgroups {
    char subtree[PATH_MAX]; /* where attempts' cgroups are made; "": none (no cgroup v2) */
    unsigned controllers;   /* TD_CG_* enabled for them */
} td_cgroups;

/* What an attempt's processes may use; 0: no limit of that kind. */
typedef struct td_cgroup_limits {
    long long memory_bytes;
    long pids;
    int cpu_weight; /* 1 to 10000; cgroup's default 100 */
} td_cgroup_limits;

/* Finds and prepares the daemon's subtree (hint: a name for it when one must be made beside the
 * daemon's own cgroup, different for each daemon of a machine). Never fails: what works and
 * what does not is said in note (one sentence for the log). */
void td_cgroups_setup(td_cgroups *cg, const char *hint, char *note, size_t len);

/* Makes SUBTREE/name with its shepherd and ranks cgroups, limits on ranks: path gets the
 * attempt's cgroup (its "shepherd" and "ranks" below). -1 with err. */
int td_cgroups_make(const td_cgroups *cg, const char *name, const td_cgroup_limits *lim, char *path,
                    size_t len, td_err *err);
/* Removes an attempt's cgroup once nothing is in it (true: gone; false: still in use). */
bool td_cgroups_remove(const char *path);
/* Removes every attempt's cgroup of the subtree that nothing is in any more (their attempts
 * are over: a daemon's start, and after attempts end). */
void td_cgroups_sweep(const td_cgroups *cg);
/* The daemon stops: the cgroups of attempts that are over go, and its subtree with them once
 * nothing is left in it (an attempt left running keeps both, for the next start; a subtree made
 * for every state directory a machine ever had would otherwise stay behind, empty). */
void td_cgroups_release(const td_cgroups *cg);

/* On one cgroup directory (open, O_PATH is enough): */
/* Whether a process is still in it (or below it); false when it cannot be read. */
bool td_cgroup_populated(int dir);
/* SIGKILL to all of it at once (cgroup.kill, Linux 5.14), else to each process it lists. */
void td_cgroup_kill(int dir);
/* sig to each process it lists (SIGTERM before the grace period's SIGKILL). */
void td_cgroup_signal(int dir, int sig);
/* The calling process moves into it. */
int td_cgroup_enter(const char *path, td_err *err);

#endif
