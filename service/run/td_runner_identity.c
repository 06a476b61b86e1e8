/* Who a job runs as, and the directories it may write (td_identity.h says why each job has a
 * uid of its own; the jobs module allocates it, td_job_uid.c). The last uid of job_uids is never
 * a job's: submissions' data probes run as it, with the rights every job has and nothing of any
 * job's.
 *
 * STATE/jobs/ID stays the daemon's (0710, the job's group): the job may enter it but neither
 * list it nor change what is in it (its attempt, output, status and log files are the daemon's
 * and the shepherd's, and a job able to swap them for links could make root write anywhere).
 * The job's processes work in jobs/ID/work and write checkpoints in jobs/ID/checkpoints, both
 * the job's own (0700). */
#define _GNU_SOURCE /* O_PATH */
#include "service/run/td_runner.h"

#include "base/td_error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

td_identity td_runner_identity_of(const td_runner *n, long id, long uid) {
    switch (n->cfg->run_as) {
    case TD_RUN_AS_USER:
        return n->cfg->run_as_user;
    case TD_RUN_AS_DYNAMIC:
        return td_identity_of_job(id, (uid_t)uid, n->cfg->job_groups, n->cfg->n_job_groups);
    case TD_RUN_AS_SELF:
        break;
    }
    return (td_identity){0};
}

td_identity td_runner_probe_identity(const td_runner *n) {
    td_identity who = td_runner_identity_of(n, 0, (long)n->cfg->job_uid_last);
    if (n->cfg->run_as == TD_RUN_AS_DYNAMIC) snprintf(who.name, sizeof who.name, "traind-probe");
    return who;
}

bool td_runner_uid_ok(const td_runner *n, long uid) {
    return n->cfg->run_as != TD_RUN_AS_DYNAMIC ||
           (uid >= (long)n->cfg->job_uid_first && uid < (long)n->cfg->job_uid_last);
}

void td_runner_files_for(const td_runner *n, long id, long uid, td_job_files *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->dir, sizeof out->dir, "%s/jobs/%ld", n->cfg->state_dir, id);
    out->who = td_runner_identity_of(n, id, uid);
    out->owner = out->who.drop ? out->who.uid : TD_JOBFS_ANY_OWNER;
    out->max_files = n->cfg->max_checkpoint_files;
}

void td_runner_cwd_of(const td_identity *who, const char *dir, char *cwd, size_t len) {
    snprintf(cwd, len, "%s%s", dir, who->drop ? "/work" : "");
}

/* path, the daemon's, given to group gid with mode. */
static int give_group(const char *path, gid_t gid, mode_t mode, td_err *err) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOENT ? 0 : td_fail(err, "%s: %s", path, strerror(errno));
    int rc =
        fchown(fd, 0, gid) == 0 && fchmod(fd, mode) == 0
            ? 0
            : td_fail(err, "cannot give %s to group %ld: %s", path, (long)gid, strerror(errno));
    close(fd);
    return rc;
}

void td_runner_start_dir(const char *dir, const char *work, const char *spec_cwd, char *out,
                         size_t len) {
    if (!spec_cwd || !spec_cwd[0])
        snprintf(out, len, "%s", work);
    else if (spec_cwd[0] == '/')
        snprintf(out, len, "%s", spec_cwd);
    else /* below work/ even for a job of the daemon's identity: never among the daemon's files */
        snprintf(out, len, "%s/work/%s", dir, spec_cwd);
}

int td_runner_work_dir(const td_identity *who, const char *dir, char *cwd, size_t len,
                       td_err *err) {
    td_runner_cwd_of(who, dir, cwd, len);
    if (!who->drop) return 0;
    char spec[PATH_MAX + 16];
    snprintf(spec, sizeof spec, "%s/spec.json", dir);
    if (give_group(dir, who->gid, 0710, err) != 0 || give_group(spec, who->gid, 0640, err) != 0)
        return -1;
    int d = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0) return td_fail(err, "%s: %s", dir, strerror(errno));
    /* work/.tmp: the job's TMPDIR, its own and counted in its quota (not a /tmp it shares) */
    static const char *const OWN[] = {"work", "checkpoints", "work/.tmp"};
    int rc = 0;
    for (size_t i = 0; i < sizeof OWN / sizeof OWN[0] && rc == 0; i++) {
        if (mkdirat(d, OWN[i], 0700) != 0 && errno != EEXIST) { /* (work/: the daemon's still) */
            rc = td_fail(err, "cannot create %s/%s: %s", dir, OWN[i], strerror(errno));
            break;
        }
        /* jobs/ID is the daemon's: what is in it is what the daemon made */
        int sub = openat(d, OWN[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0 || fchown(sub, who->uid, who->gid) != 0 || fchmod(sub, 0700) != 0)
            rc = td_fail(err, "cannot give %s/%s to uid %u: %s", dir, OWN[i], (unsigned)who->uid,
                         strerror(errno));
        if (sub >= 0) close(sub);
    }
    close(d);
    return rc;
}

/* "USER=...", "LOGNAME=...", "HOME=...", "TMPDIR=..." for a job of its own identity (no passwd
 * entry names it: Python's getpass and the like read these first; its temporary files go in its
 * own directory, not in a /tmp every job shares), appended to env at *count. */
void td_runner_identity_env(const td_identity *who, const char *cwd, char **env, size_t *count) {
    if (!who->drop || who->lookup_groups) return; /* a real user: its own environment */
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s/.tmp", cwd);
    const char *names[] = {"USER", "LOGNAME", "HOME", "TMPDIR"};
    const char *values[] = {who->name, who->name, cwd, tmp};
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(names[i]) + strlen(values[i]) + 2;
        env[*count] = td_malloc(k);
        snprintf(env[(*count)++], k, "%s=%s", names[i], values[i]);
    }
}

int td_runner_attempt_cgroup(const td_runner *n, long id, int attempt, int node_rank,
                             const td_cgroup_limits *lim, char *out, size_t len, td_err *err) {
    out[0] = 0;
    if (!n->cfg->cgroups.subtree[0]) return 0;
    char name[96];
    snprintf(name, sizeof name, "job-%ld.attempt-%d.node-%d", id, attempt, node_rank);
    return td_cgroups_make(&n->cfg->cgroups, name, lim, out, len, err);
}
