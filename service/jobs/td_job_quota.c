/* Disk quotas: a job's files in the state directory (its directory: work/, checkpoints/, its
 * logs and output) may take resources.disk_gb (job_disk_gb unless it says, at most
 * max_job_disk_gb), so that one job cannot fill the filesystem that every other job and the
 * daemon's database share.
 *
 * Two guards: each process's RLIMIT_FSIZE is the quota (td_launch.h), so no single file grows
 * past it, however fast it is written; and the keeper thread measures each running job's
 * directory every QUOTA_EVERY_S (as du counts, without following a link) with the jobs' lock let
 * go, and stops a job over its quota: it fails with "disk quota exceeded" and the size, and is
 * not restarted (it would only fill it again). A node's parts are measured likewise and fail
 * with the same words. Many small files written faster than a turn can still overshoot by what
 * they write in that time: filesystem quotas would be exact, and are the operator's to add. */
#include "service/jobs/td_jobs_private.h"

#include "service/run/td_jobfs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define QUOTA_EVERY_S 2.0

typedef struct measured {
    long job;
    int attempt;   /* a node part's; -1 for a local job */
    long long max; /* its quota */
    char dir[PATH_MAX];
    long long bytes;
    long entries;
} measured;

/* What to measure this turn: every running local job and part with a quota. */
static measured *collect(td_jobs *j, int *n) {
    int cap = j->n_live + j->node.n_parts, k = 0;
    measured *m = td_calloc((size_t)cap + 1, sizeof *m);
    for (int i = 0; i < j->n_live; i++) {
        const job *jb = j->live[i];
        if (!jb->active || jb->parts || jb->disk_bytes <= 0 || jb->over_quota) continue;
        m[k] = (measured){.job = jb->row.id, .attempt = -1, .max = jb->disk_bytes};
        snprintf(m[k++].dir, sizeof m->dir, "%s", jb->dir);
    }
    for (int i = 0; i < j->node.n_parts; i++) {
        const td_node_part *g = j->node.parts[i];
        if (!g->running || g->stop || g->disk_bytes <= 0) continue;
        m[k] = (measured){.job = g->job, .attempt = g->attempt, .max = g->disk_bytes};
        snprintf(m[k++].dir, sizeof m->dir, "%s", g->dir);
    }
    *n = k;
    return m;
}

/* A measurement over its quota: the job (or the part) is stopped, saying why. */
static void over(td_jobs *j, const measured *m) {
    char why[400];
    td_jobs_quota_words(m->bytes, m->max, m->entries, why, sizeof why);
    if (m->attempt < 0) {
        job *jb = td_jobs_find(j, m->job);
        if (!jb || !jb->active || jb->over_quota) return;
        jb->over_quota = true;
        snprintf(jb->quota_reason, sizeof jb->quota_reason, "%s", why);
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(m->job), "job %ld: %s: stopping it", m->job,
                  why);
        td_jobs_wake(j);
        return;
    }
    for (int i = 0; i < j->node.n_parts; i++) {
        td_node_part *g = j->node.parts[i];
        if (g->job != m->job || g->attempt != m->attempt || !g->running || g->stop) continue;
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(m->job), "job %ld attempt %d: %s: stopping it",
                  m->job, m->attempt, why);
        snprintf(g->cut_off, sizeof g->cut_off, "node %.60s: %.180s", j->node.name, why);
        g->stop = true;
        if (g->sh.fd >= 0) td_shepherd_stop(&g->sh, SIGTERM, j->cfg.runner.grace_s, g->cut_off);
    }
}

void *td_jobs_quota_keeper(void *arg) {
    td_jobs *j = arg;
    td_jobs_lock(j);
    while (!j->stopping) {
        int n = 0;
        measured *m = collect(j, &n);
        pthread_mutex_unlock(&j->mu);
        for (int i = 0; i < n; i++) {
            td_err err = {{0}};
            if (td_jobfs_usage(m[i].dir, &m[i].bytes, &m[i].entries, TD_JOBS_QUOTA_MAX_ENTRIES,
                               &err) != 0)
                m[i].bytes = -1; /* gone meanwhile */
        }
        td_jobs_lock(j);
        for (int i = 0; i < n; i++) {
            if (m[i].bytes < 0) continue;
            job *jb = m[i].attempt < 0 ? td_jobs_find(j, m[i].job) : NULL;
            if (jb && jb->disk_used != m[i].bytes) {
                jb->disk_used = m[i].bytes;
                td_jobs_stale(jb); /* its JSON shows it */
            }
            if (m[i].bytes > m[i].max || m[i].entries > TD_JOBS_QUOTA_MAX_ENTRIES) over(j, &m[i]);
        }
        free(m);
        struct timespec until;
        td_clock_deadline(&until, QUOTA_EVERY_S);
        while (!j->stopping && pthread_cond_timedwait(&j->quota_wake, &j->mu, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}
