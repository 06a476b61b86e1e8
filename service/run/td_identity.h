/* Who a job's processes are, and acting as them.
 *
 * A daemon that may switch users (root) gives every job a uid and gid of its own, allocated from
 * a configured range (run_as "dynamic", as systemd's DynamicUser= does for services): one job
 * can then neither read another's files, environment (/proc/PID/environ) or checkpoints nor
 * signal its processes, and none can read what the daemon keeps (its token, database, cluster
 * secret). run_as may instead name one user for every job (isolated from the daemon, not from
 * each other), or "root".
 *
 * What a job names (a checkpoint's path, a data file) the daemon opens as the job would:
 * td_identity_become switches this thread's file-system identity (fsuid, fsgid and the
 * supplementary groups: per thread on Linux, unlike setuid) to the job's until
 * td_identity_return, so a path the job could not open itself fails, whatever links it holds.
 * Switching the fsuid from 0 drops CAP_DAC_OVERRIDE and the other file capabilities for that
 * thread (capabilities(7)), which is why the daemon runs as root and not as a user with
 * capabilities. */
#ifndef TD_IDENTITY_H
#define TD_IDENTITY_H

#include "base/td_error.h"

#include <stdbool.h>
#include <sys/types.h>

#define TD_IDENTITY_GROUPS 32

typedef struct td_identity {
    bool drop; /* false: the daemon's own identity (nothing is switched) */
    uid_t uid;
    gid_t gid;
    char name[64]; /* "traind-job-ID", or the run_as user's name */
    /* supplementary groups (job_groups, or a run_as user's own); lookup: a run_as user's are
     * looked up by name (getgrouplist) when the processes start, not listed here */
    int n_groups;
    gid_t groups[TD_IDENTITY_GROUPS];
    bool lookup_groups;
} td_identity;

/* The identity of job `job` allocated uid `uid` (uid == gid; groups: job_groups). */
td_identity td_identity_of_job(long job, uid_t uid, const gid_t *groups, int n_groups);

/* This thread's file-system identity before td_identity_become. */
typedef struct td_identity_saved {
    bool switched;
    uid_t fsuid;
    gid_t fsgid;
} td_identity_saved;

/* This thread opens, creates and lists files as who from now on (nothing when who is NULL or
 * does not drop): -1 with err when the switch did not take (then nothing changed). */
int td_identity_become(const td_identity *who, td_identity_saved *saved, td_err *err);
/* Back to the daemon's own (a no-op when become switched nothing). */
void td_identity_return(const td_identity_saved *saved);

/* Whether this process may give jobs identities of their own (it is root). */
bool td_identity_can_switch(void);

#endif
