/* A job's uid and limits. Its uid is allocated when it is submitted, from job_uids, and kept
 * with it (the database's jobs.uid) for every attempt and every node of it: its checkpoints stay
 * its own across restarts, and no other job of the same daemon gets it while the job is kept (its
 * files may still be there). Who a uid runs as, and the directories it may write, are the node's
 * (service/run/td_runner_identity.c). */
#include "service/jobs/td_jobs_private.h"

#include <stdlib.h>
#include <string.h>

td_identity td_jobs_identity(const td_jobs *j, const job *jb) {
    return td_runner_identity_of(&j->runner, jb->row.id, jb->row.uid);
}

int td_jobs_allocate_uid(td_jobs *j, long *uid, td_err *err) {
    if (j->cfg.runner.run_as != TD_RUN_AS_DYNAMIC || td_runner_uid_ok(&j->runner, *uid)) return 0;
    long first = (long)j->cfg.runner.job_uid_first, n = (long)j->cfg.runner.job_uid_last - first;
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

int td_jobs_files_of(td_jobs *j, long id, td_job_files *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) td_runner_files_for(&j->runner, id, jb->row.uid, out);
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : td_reply_fail(e, 404, "not_found", NULL, "there is no job %ld", id);
}

void td_jobs_quota_words(long long used, long long max, long entries, char *out, size_t len) {
    double gib = 1073741824.0;
    if (entries > TD_JOBS_QUOTA_MAX_ENTRIES)
        snprintf(out, len,
                 "disk quota exceeded: its directory holds more than %ld files (with %.3f GiB "
                 "in them so far)",
                 TD_JOBS_QUOTA_MAX_ENTRIES, (double)used / gib);
    else
        snprintf(out, len,
                 "disk quota exceeded: its files and logs take %.3f GiB (%lld bytes), over "
                 "resources.disk_gb %.3f GiB",
                 (double)used / gib, used, (double)max / gib);
}
