/* Who jobs run as (run_as, job_uids, job_groups) and what each may use on this node (the job
 * limits): the daemon's side of isolation between users, apart so that it reads as one. */
#define _GNU_SOURCE
#include "daemon_private.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "FIRST-LAST" of job_uids: at least two uids (the last is the probes'), none a system one. */
static void parse_uid_range(const daemon_options *o, uid_t *first, uid_t *last) {
    long a = 0, b = 0;
    char extra;
    if (sscanf(o->job_uids, "%ld-%ld%c", &a, &b, &extra) != 2 || a < 1000 || b <= a ||
        b >= 4294967295L)
        daemon_die(
            "job_uids \"%s\" (%s): expected FIRST-LAST, two uids of at least 1000, FIRST below "
            "LAST (e.g. 1879048192-1879113727)",
            o->job_uids, daemon_config_source(o, OPT_JOB_UIDS));
    *first = (uid_t)a;
    *last = (uid_t)b;
}

/* job_groups ("video,datasets") into gids. */
static int parse_groups(const daemon_options *o, gid_t *out) {
    char copy[sizeof o->job_groups], *save = NULL;
    snprintf(copy, sizeof copy, "%s", o->job_groups);
    int n = 0;
    for (char *g = strtok_r(copy, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        struct group *gr = getgrnam(g);
        if (!gr)
            daemon_die("job_groups (%s): no group \"%s\" here",
                       daemon_config_source(o, OPT_JOB_GROUPS), g);
        if (n == TD_IDENTITY_GROUPS)
            daemon_die("job_groups: at most %d groups", TD_IDENTITY_GROUPS);
        out[n++] = gr->gr_gid;
    }
    return n;
}

/* Who jobs run as (td_identity.h): a root daemon gives each its own uid unless run_as names a
 * user (or root); a daemon that is not root runs them as itself and says they are not
 * isolated. */
void daemon_resolve_run_as(const daemon_options *o, td_log *log, td_jobs_config *jc) {
    if (!td_identity_can_switch()) {
        jc->runner.run_as = TD_RUN_AS_SELF;
        td_log_warn(log,
                    "warning: traind is not root: jobs run as its own user (uid %ld), so they "
                    "can read its token and state and each other's files (run it as root, as "
                    "the packaged unit does, to give each job a user of its own)%s",
                    (long)getuid(),
                    o->from[OPT_RUN_AS] != DAEMON_FROM_DEFAULT ? "; run_as is ignored" : "");
        return;
    }
    const char *name = o->run_as[0] ? o->run_as : "dynamic";
    jc->runner.n_job_groups = parse_groups(o, jc->runner.job_groups);
    if (strcmp(name, "dynamic") == 0) {
        jc->runner.run_as = TD_RUN_AS_DYNAMIC;
        parse_uid_range(o, &jc->runner.job_uid_first, &jc->runner.job_uid_last);
        td_log_info(log, "jobs run as users of their own: uids (and gids) %u to %u (job_uids)",
                    (unsigned)jc->runner.job_uid_first, (unsigned)jc->runner.job_uid_last - 1);
        return;
    }
    jc->runner.run_as = TD_RUN_AS_USER;
    if (strcmp(name, "root") == 0) {
        td_log_warn(log,
                    "warning: jobs run as root (run_as \"root\", %s): every job can do "
                    "anything on this host",
                    daemon_config_source(o, OPT_RUN_AS));
        jc->runner.run_as = TD_RUN_AS_SELF;
        return;
    }
    struct passwd *pw = getpwnam(name);
    if (!pw)
        daemon_die("run_as \"%s\" (%s): no such user (create it, e.g. adduser --system %s, or say "
                   "\"dynamic\")",
                   name, daemon_config_source(o, OPT_RUN_AS), name);
    if (pw->pw_uid == 0)
        daemon_die("run_as \"%s\": that user is root (uid 0); say \"root\" if that is meant", name);
    td_identity *u = &jc->runner.run_as_user;
    *u = (td_identity){.drop = true, .uid = pw->pw_uid, .gid = pw->pw_gid, .lookup_groups = true};
    snprintf(u->name, sizeof u->name, "%s", name);
    td_log_warn(log,
                "jobs run as user %s (uid %ld, gid %ld): isolated from the daemon, not from each "
                "other (run_as \"dynamic\" gives each job its own)",
                name, (long)u->uid, (long)u->gid);
}

/* What a job may use unless it says, and the most (td_job_limits); memory 0: the node's less a
 * reserve (1 GiB, or a tenth of a small node's) for the daemon and the system. */
td_job_limits daemon_job_limits(const daemon_options *o) {
    double total = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 1073741824.0;
    double reserve = total > 10 ? 1.0 : total / 10;
    double node = total - reserve;
    return (td_job_limits){.memory_gb = o->job_memory_gb > 0 ? o->job_memory_gb : node,
                           .max_memory_gb = o->max_job_memory_gb > 0 ? o->max_job_memory_gb : node,
                           .pids = o->job_pids,
                           .max_pids = o->max_job_pids,
                           .disk_gb = o->job_disk_gb,
                           .max_disk_gb = o->max_job_disk_gb};
}
