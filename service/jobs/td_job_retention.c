/* Retention: a finished job is kept keep_finished_for_s after it finished, and only the newest
 * keep_finished_jobs finished jobs are kept (0: no limit of that kind); older ones go as
 * DELETE /v1/jobs/{id} would take them: their database rows (events, metrics, checkpoints,
 * attempts) in one transaction, then their directory (logs, rank 0's output, the checkpoints
 * under it, TensorBoard files). So a daemon that runs for years holds a bounded disk.
 *
 * The janitor thread does it: when the oldest finished job's time is up, when a job finishes
 * (the count), and once a minute. It holds the jobs' lock only to choose and to take jobs out of
 * the table (a rename moves each directory aside); the files, which can be gigabytes of
 * checkpoints, are removed with the lock let go.
 *
 * On a node that runs parts of a master's jobs, a job's directory has no row here: such a
 * directory goes once no part of it runs here and it was last changed keep_finished_for_s ago
 * (or, with only a count, when more of them than the count are older than an hour). */
#define _GNU_SOURCE
#include "service/jobs/td_jobs_private.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    BATCH = 256, /* jobs removed per turn under the lock: a turn of the API's wait stays short */
};
#define SCAN_EVERY_S     60.0   /* the periodic turn (and the scan of directories) */
#define ORPHAN_MIN_AGE_S 3600.0 /* a directory without a row, counted only past this age */
#define POKE_COALESCE_S  1.0    /* finishes within a second are handled in one turn */

void td_jobs_set_retention(td_jobs *j, double keep_for_s, long keep_jobs) {
    td_jobs_lock(j);
    j->cfg.keep_finished_for_s = keep_for_s;
    j->cfg.keep_finished_jobs = keep_jobs;
    j->janitor_poke = true; /* a shorter time or count applies at once */
    pthread_cond_signal(&j->janitor_wake);
    pthread_mutex_unlock(&j->mu);
}

/* Whether a finished job can be removed now: nothing of it runs or waits to be written. */
static bool removable(const job *jb) {
    return td_jobs_final_state(jb->state) && !jb->active && !jb->parts && !jb->resume_busy &&
           !jb->resume_wanted && jb->n_pending == 0;
}

typedef struct aged {
    double at;
    int index;
} aged;

static int by_age(const void *a, const void *b) {
    const aged *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at ? 1 : x->index - y->index;
}

static int by_index(const void *a, const void *b) {
    return ((const aged *)a)->index - ((const aged *)b)->index;
}

/* Chooses up to BATCH jobs whose time or place in the count is up (oldest finished first),
 * deletes their rows and takes them out of the table; their ids in ids, their directories
 * moved to jobs/.deleted-ID (moved[k]). *next: when the oldest kept one's time is up (0: none).
 * Returns how many went; -1 when the database refused (nothing changed). */
static int expire_locked(td_jobs *j, double now, long *ids, bool *moved, double *next) {
    double keep_for = j->cfg.keep_finished_for_s;
    long keep_n = j->cfg.keep_finished_jobs;
    *next = 0;
    if (keep_for <= 0 && keep_n <= 0) return 0;
    aged *fin = td_calloc((size_t)j->n_jobs + 1, sizeof *fin);
    int n_fin = 0;
    /* an experiment's trials are neither counted nor removed: they go with their experiment */
    for (int i = 0; i < j->n_jobs; i++)
        if (td_jobs_final_state(j->jobs[i]->state) && j->jobs[i]->row.experiment == 0)
            fin[n_fin++] = (aged){j->jobs[i]->row.finished_at, i};
    qsort(fin, (size_t)n_fin, sizeof *fin, by_age);
    /* the oldest over the count, then any past its time; a job that cannot go yet (its last
     * events still waiting for the disk) is counted and tried again next turn */
    long over = keep_n > 0 && n_fin > keep_n ? n_fin - keep_n : 0;
    aged *doomed = td_calloc(BATCH, sizeof *doomed);
    int n = 0;
    for (int k = 0; k < n_fin && n < BATCH; k++) {
        const job *jb = j->jobs[fin[k].index];
        bool expired = k < over || (keep_for > 0 && fin[k].at + keep_for <= now);
        if (!expired) {
            if (keep_for > 0) *next = fin[k].at + keep_for; /* sorted: the first kept is next */
            break;
        }
        if (removable(jb)) doomed[n++] = fin[k];
    }
    if (n == BATCH) *next = now; /* more to do: at once */
    free(fin);
    if (n == 0) {
        free(doomed);
        return 0;
    }
    for (int k = 0; k < n; k++) ids[k] = j->jobs[doomed[k].index]->row.id;
    td_err err = {{0}};
    if (td_db_delete_jobs(j->db, ids, n, &err) != 0) {
        if (!j->janitor_failing)
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                      "retention: cannot remove %d finished job%s (tried again in a minute): %s", n,
                      n == 1 ? "" : "s", err.msg);
        j->janitor_failing = true;
        free(doomed);
        *next = now + SCAN_EVERY_S;
        return -1;
    }
    j->janitor_failing = false;
    /* out of the table from the highest index down, so the lower ones stay where they are */
    qsort(doomed, (size_t)n, sizeof *doomed, by_index);
    for (int k = n - 1; k >= 0; k--) {
        ids[k] = j->jobs[doomed[k].index]->row.id;
        moved[k] = td_jobs_forget_locked(j, doomed[k].index);
    }
    free(doomed);
    return n;
}

/* ---- directories without a row (a node's parts of its master's jobs) ---- */

typedef struct dir_entry {
    long id;
    double mtime;
} dir_entry;

static int by_mtime(const void *a, const void *b) {
    const dir_entry *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

static bool node_part_of(const td_jobs *j, long id) {
    for (int i = 0; i < j->node.n_parts; i++)
        if (j->node.parts[i]->job == id) return true;
    return false;
}

/* The numeric entries of jobs/ that are directories, read without the lock. */
static dir_entry *list_job_dirs(const td_jobs *j, int *count) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/jobs", j->cfg.runner.state_dir);
    *count = 0;
    DIR *d = opendir(root);
    if (!d) return NULL;
    dir_entry *v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long id = strtol(e->d_name, &end, 10);
        if (e->d_name[0] < '1' || e->d_name[0] > '9' || *end || id <= 0) continue;
        if (*count == cap) v = td_realloc(v, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
        v[(*count)++] = (dir_entry){id, 0};
    }
    closedir(d);
    return v;
}

/* Moves the directories of parts that ended here long enough ago aside (ids/moved as above;
 * at most BATCH). The lock is held only to tell them from the rows and parts. */
static int expire_orphans(td_jobs *j, double now, long *ids, bool *moved) {
    pthread_mutex_unlock(&j->mu);
    int n_dirs;
    dir_entry *dirs = list_job_dirs(j, &n_dirs);
    td_jobs_lock(j);
    int n = 0;
    for (int i = 0; i < n_dirs; i++) /* keep those without a row or part here */
        if (!td_jobs_find(j, dirs[i].id) && !node_part_of(j, dirs[i].id)) dirs[n++] = dirs[i];
    double keep_for = j->cfg.keep_finished_for_s;
    long keep_n = j->cfg.keep_finished_jobs;
    pthread_mutex_unlock(&j->mu);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/jobs/%ld", j->cfg.runner.state_dir, dirs[i].id);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            dirs[kept++] = (dir_entry){dirs[i].id, (double)st.st_mtime};
    }
    if (kept > 1) qsort(dirs, (size_t)kept, sizeof *dirs, by_mtime); /* dirs is NULL when none */
    long over = keep_n > 0 && kept > keep_n ? kept - keep_n : 0;
    td_jobs_lock(j);
    int out = 0;
    for (int i = 0; i < kept && out < BATCH; i++) {
        double age = now - dirs[i].mtime;
        bool expired = (keep_for > 0 && age >= keep_for) || (i < over && age >= ORPHAN_MIN_AGE_S);
        /* a part may have started meanwhile (its orders came while the lock was let go) */
        if (!expired || td_jobs_find(j, dirs[i].id) || node_part_of(j, dirs[i].id)) continue;
        char from[PATH_MAX + 32], to[PATH_MAX + 32];
        snprintf(from, sizeof from, "%s/jobs/%ld", j->cfg.runner.state_dir, dirs[i].id);
        snprintf(to, sizeof to, "%s/jobs/.deleted-%ld", j->cfg.runner.state_dir, dirs[i].id);
        ids[out] = dirs[i].id;
        moved[out] = rename(from, to) == 0;
        if (moved[out]) out++;
    }
    free(dirs);
    return out;
}

/* ---- removal, without the lock ---- */

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

bool td_jobs_remove_tree(td_jobs *j, long id, const char *path) {
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT) return true;
    td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: cannot remove all of %s: %s", id,
              path, strerror(errno));
    return false;
}

/* What an interrupted removal (a crash, a kill) left: jobs/.deleted-* whose rows are gone. */
static void remove_leftovers(td_jobs *j) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/jobs", j->cfg.runner.state_dir);
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long id = 0;
        if (sscanf(e->d_name, ".deleted-%ld", &id) != 1) continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (td_jobs_remove_tree(j, id, path))
            td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(id),
                      "job %ld: removed what an interrupted removal left (%s)", id, path);
    }
    closedir(d);
}

static void remove_moved(td_jobs *j, const long *ids, const bool *moved, int n, const char *what,
                         const char *why) {
    long first = 0, last = 0;
    for (int k = 0; k < n; k++) {
        if (!moved[k]) continue;
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/jobs/.deleted-%ld", j->cfg.runner.state_dir, ids[k]);
        td_jobs_remove_tree(j, ids[k], path);
    }
    for (int k = 0; k < n; k++) {
        if (!first || ids[k] < first) first = ids[k];
        if (ids[k] > last) last = ids[k];
    }
    if (n > 0)
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_NOWHERE,
                  "retention: removed %d %s%s (ids %ld to %ld): %s", n, what, n == 1 ? "" : "s",
                  first, last, why);
}

void *td_jobs_janitor(void *arg) {
    td_jobs *j = arg;
    remove_leftovers(j);
    long *ids = td_calloc(BATCH, sizeof *ids);
    bool *moved = td_calloc(BATCH, sizeof *moved);
    double last_scan = 0;
    td_jobs_lock(j);
    while (!j->stopping) {
        j->janitor_poke = false;
        double now = td_clock_wall(), next = 0;
        char why[200], by_time[80] = "", by_count[80] = "";
        if (j->cfg.keep_finished_for_s > 0)
            snprintf(by_time, sizeof by_time, "finished more than %g s ago (keep_finished_for_s)",
                     j->cfg.keep_finished_for_s);
        if (j->cfg.keep_finished_jobs > 0)
            snprintf(by_count, sizeof by_count, "older than the newest %ld (keep_finished_jobs)",
                     j->cfg.keep_finished_jobs);
        snprintf(why, sizeof why, "%s%s%s", by_time, by_time[0] && by_count[0] ? ", or " : "",
                 by_count);
        int n = expire_locked(j, now, ids, moved, &next);
        if (n > 0) {
            j->expired_total += n;
            pthread_cond_broadcast(&j->changed); /* their streams end */
            pthread_mutex_unlock(&j->mu);
            remove_moved(j, ids, moved, n, "finished job", why);
            td_jobs_lock(j);
        }
        bool any_limit = j->cfg.keep_finished_for_s > 0 || j->cfg.keep_finished_jobs > 0;
        if (any_limit && !j->stopping && td_clock_now() - last_scan >= SCAN_EVERY_S) {
            last_scan = td_clock_now();
            int n_orphans = expire_orphans(j, now, ids, moved);
            pthread_mutex_unlock(&j->mu);
            if (n_orphans > 0)
                remove_moved(j, ids, moved, n_orphans, "job directory without a job",
                             "parts of a master's jobs that ran here, unchanged for longer than "
                             "the limits allow");
            td_jobs_lock(j);
        }
        if (n == BATCH || j->stopping) continue;
        /* until the next one's time is up, a finish (the count), a reload, or the minute */
        double wait = SCAN_EVERY_S;
        if (next > 0 && next - td_clock_wall() < wait) wait = next - td_clock_wall() + 0.01;
        if (wait < 0) wait = 0;
        struct timespec until;
        td_clock_deadline(&until, wait);
        while (!j->stopping && !j->janitor_poke &&
               pthread_cond_timedwait(&j->janitor_wake, &j->mu, &until) != ETIMEDOUT) {
        }
        if (j->janitor_poke && !j->stopping) { /* a burst of finishes makes one turn */
            td_clock_deadline(&until, POKE_COALESCE_S);
            while (!j->stopping &&
                   pthread_cond_timedwait(&j->janitor_wake, &j->mu, &until) != ETIMEDOUT) {
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
    free(ids);
    free(moved);
    return NULL;
}
