/* Who a job runs as, and the directories it may write (td_identity.h says why each job has a
 * uid of its own).
 *
 * A job's uid is allocated when it is submitted, from job_uids, and kept with it (the database's
 * jobs.uid) for every attempt and every node of it: its checkpoints stay its own across restarts,
 * and no other job of the same daemon gets it while the job is kept (its files may still be
 * there). The last uid of the range is never a job's: submissions' data probes run as it, with
 * the rights every job has and nothing of any job's.
 *
 * STATE/jobs/ID stays the daemon's (0710, the job's group): the job may enter it but neither
 * list it nor change what is in it (its attempt, output, status and log files are the daemon's
 * and the shepherd's, and a job able to swap them for links could make root write anywhere).
 * The job's processes work in jobs/ID/work and write checkpoints in jobs/ID/checkpoints, both
 * the job's own (0700). */
#define _GNU_SOURCE /* O_PATH */
#include "service/jobs/td_jobs_private.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

td_identity td_jobs_identity_of(const td_jobs *j, long id, long uid) {
    switch (j->cfg.run_as) {
    case TD_RUN_AS_USER:
        return j->cfg.run_as_user;
    case TD_RUN_AS_DYNAMIC:
        return td_identity_of_job(id, (uid_t)uid, j->cfg.job_groups, j->cfg.n_job_groups);
    case TD_RUN_AS_SELF:
        break;
    }
    return (td_identity){0};
}

td_identity td_jobs_identity(const td_jobs *j, const job *jb) {
    return td_jobs_identity_of(j, jb->row.id, jb->row.uid);
}

td_identity td_jobs_probe_identity(const td_jobs *j) {
    td_identity who = td_jobs_identity_of(j, 0, (long)j->cfg.job_uid_last);
    if (j->cfg.run_as == TD_RUN_AS_DYNAMIC) snprintf(who.name, sizeof who.name, "traind-probe");
    return who;
}

bool td_jobs_uid_ok(const td_jobs *j, long uid) {
    return j->cfg.run_as != TD_RUN_AS_DYNAMIC ||
           (uid >= (long)j->cfg.job_uid_first && uid < (long)j->cfg.job_uid_last);
}

int td_jobs_allocate_uid(td_jobs *j, long *uid, td_err *err) {
    if (j->cfg.run_as != TD_RUN_AS_DYNAMIC || td_jobs_uid_ok(j, *uid)) return 0;
    long first = (long)j->cfg.job_uid_first, n = (long)j->cfg.job_uid_last - first;
    unsigned char *used = td_calloc((size_t)n / 8 + 1, 1);
    for (int i = 0; i < j->n_jobs; i++) {
        long u = j->jobs[i]->row.uid - first;
        if (u >= 0 && u < n) used[u / 8] |= (unsigned char)(1u << (u % 8));
    }
    /* after the newest job's, round the range: a uid freed by a deleted job is taken last, so
     * that whatever of it another node may still hold has gone by then */
    long start = j->n_jobs > 0 ? j->jobs[j->n_jobs - 1]->row.uid - first + 1 : 0;
    long found = -1;
    for (long k = 0; k < n && found < 0; k++) {
        long u = ((start < 0 ? 0 : start) + k) % n;
        if (!(used[u / 8] & (1u << (u % 8)))) found = u;
    }
    free(used);
    if (found < 0)
        return td_fail(err,
                       "no free job uid: every one of job_uids (%ld of them) belongs to a job "
                       "that is kept; delete finished jobs or widen job_uids",
                       n);
    *uid = first + found;
    return 0;
}

void td_jobs_limit_job(job *jb, const td_job_limits *d, double memory_gb, long pids, int cpu_weight,
                       double disk_gb) {
    double gib = 1073741824.0;
    double memory = memory_gb > 0 ? memory_gb : d->memory_gb;
    double disk = disk_gb > 0 ? disk_gb : d->disk_gb;
    jb->cg_limits = (td_cgroup_limits){.memory_bytes = (long long)(memory * gib),
                                       .pids = pids > 0 ? pids : d->pids,
                                       .cpu_weight = cpu_weight > 0 ? cpu_weight : 100};
    jb->disk_bytes = (long long)(disk * gib);
}

void td_jobs_files_for(const td_jobs *j, long id, long uid, td_job_files *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->dir, sizeof out->dir, "%s/jobs/%ld", j->cfg.state_dir, id);
    out->who = td_jobs_identity_of(j, id, uid);
    out->owner = out->who.drop ? out->who.uid : TD_JOBFS_ANY_OWNER;
    out->max_files = j->cfg.max_checkpoint_files;
}

int td_jobs_files_of(td_jobs *j, long id, td_job_files *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) td_jobs_files_for(j, id, jb->row.uid, out);
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : td_reply_fail(e, 404, "not_found", NULL, "there is no job %ld", id);
}

void td_jobs_cwd_of(const td_identity *who, const char *dir, char *cwd, size_t len) {
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

void td_jobs_start_dir(const char *dir, const char *work, const char *spec_cwd, char *out,
                       size_t len) {
    if (!spec_cwd || !spec_cwd[0])
        snprintf(out, len, "%s", work);
    else if (spec_cwd[0] == '/')
        snprintf(out, len, "%s", spec_cwd);
    else /* below work/ even for a job of the daemon's identity: never among the daemon's files */
        snprintf(out, len, "%s/work/%s", dir, spec_cwd);
}

int td_jobs_work_dir(const td_identity *who, const char *dir, char *cwd, size_t len, td_err *err) {
    td_jobs_cwd_of(who, dir, cwd, len);
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
 * own directory, not in a /tmp every job shares), appended to env at *n. */
void td_jobs_identity_env(const td_identity *who, const char *cwd, char **env, size_t *n) {
    if (!who->drop || who->lookup_groups) return; /* a real user: its own environment */
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s/.tmp", cwd);
    const char *names[] = {"USER", "LOGNAME", "HOME", "TMPDIR"};
    const char *values[] = {who->name, who->name, cwd, tmp};
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(names[i]) + strlen(values[i]) + 2;
        env[*n] = td_malloc(k);
        snprintf(env[(*n)++], k, "%s=%s", names[i], values[i]);
    }
}

int td_jobs_attempt_cgroup(td_jobs *j, long id, int attempt, int node_rank,
                           const td_cgroup_limits *lim, char *out, size_t len, td_err *err) {
    out[0] = 0;
    if (!j->cfg.cgroups.subtree[0]) return 0;
    char name[96];
    snprintf(name, sizeof name, "job-%ld.attempt-%d.node-%d", id, attempt, node_rank);
    return td_cgroups_make(&j->cfg.cgroups, name, lim, out, len, err);
}

void td_jobs_cgroup_ended(td_jobs *j, const char *path) {
    if (!path || !path[0]) return;
    char ranks[PATH_MAX + 16];
    snprintf(ranks, sizeof ranks, "%s/ranks", path);
    int fd = open(ranks, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { /* nothing of the attempt survives it (setsid, a double fork) */
        td_cgroup_kill(fd);
        close(fd);
    }
    if (td_cgroups_remove(path)) return;
    j->cg_ended = td_realloc(j->cg_ended, (size_t)(j->n_cg_ended + 1) * sizeof *j->cg_ended);
    j->cg_ended[j->n_cg_ended++] = td_strdup(path);
}

void td_jobs_cgroups_tidy(td_jobs *j) {
    double now = td_clock_now();
    if (j->n_cg_ended == 0 || now - j->cg_tried < 1.0) return;
    j->cg_tried = now;
    int kept = 0;
    for (int i = 0; i < j->n_cg_ended; i++) {
        if (td_cgroups_remove(j->cg_ended[i]))
            free(j->cg_ended[i]);
        else
            j->cg_ended[kept++] = j->cg_ended[i];
    }
    j->n_cg_ended = kept;
}
