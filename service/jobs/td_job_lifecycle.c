/* The jobs module's life (td_jobs.h): opening, starting its threads, stopping (and the jobs
 * with it, without keep_jobs_on_stop) and closing, and the settings a reload changes. Apart from
 * the API calls (td_jobs.c): the daemon makes these at start, reload and stop, and they own the
 * module's threads, descriptors and condition variables. */
#define _GNU_SOURCE /* signalfd */
#include "service/jobs/td_jobs_private.h"

#include "base/td_strv.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char **copy_roots(const char *const *roots, int n) {
    char **v = td_strv_new(n);
    for (int i = 0; i < n; i++) v[i] = td_str_dup(roots[i]);
    return v;
}

void td_jobs_set_command_jobs(td_jobs *j, const char *policy) {
    td_jobs_lock(j);
    snprintf(j->command_jobs, sizeof j->command_jobs, "%s", policy);
    pthread_mutex_unlock(&j->mu);
}

void td_jobs_set_limits(td_jobs *j, const char *const *roots, int n_roots, double grace_s) {
    char **fresh = copy_roots(roots, n_roots);
    td_jobs_lock(j);
    j->retired_roots =
        td_realloc(j->retired_roots, (size_t)(j->n_retired_roots + 1) * sizeof *j->retired_roots);
    j->retired_roots[j->n_retired_roots++] = j->roots;
    j->roots = fresh;
    j->cfg.rules.data_roots = (const char *const *)fresh;
    j->cfg.rules.n_roots = n_roots;
    j->cfg.runner.grace_s = grace_s;
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_open(td_jobs **out, const td_jobs_config *cfg, td_db *db, td_log *log, td_err *err) {
    td_jobs *j = td_calloc(1, sizeof *j);
    j->cfg = *cfg;
    j->db = db;
    j->log = log;
    j->roots = copy_roots(cfg->rules.data_roots, cfg->rules.n_roots);
    j->cfg.rules.data_roots = (const char *const *)j->roots;
    snprintf(j->command_jobs, sizeof j->command_jobs, "%s",
             cfg->rules.command_jobs ? cfg->rules.command_jobs : "any");
    j->cfg.rules.command_jobs = NULL; /* j->command_jobs, copied under the lock */
    j->wake_fd = j->sig_fd = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->changed, &ca);
    pthread_cond_init(&j->resume_wake, NULL);
    pthread_cond_init(&j->janitor_wake, &ca);
    pthread_cond_init(&j->quota_wake, &ca);
    for (int i = 0; i < TD_JOBS_STREAM_CVS; i++) pthread_cond_init(&j->stream_cv[i], &ca);
    pthread_condattr_destroy(&ca);
    td_runner_init(&j->runner, &j->cfg.runner);
    j->node = (td_node_parts){.runner = &j->runner, .log = log, .ended = &j->changed};
    char jobs_dir[PATH_MAX];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", cfg->runner.state_dir);
    if (mkdir(jobs_dir, 0750) != 0 && errno != EEXIST) {
        td_fail(err, "cannot create %s: %s", jobs_dir, strerror(errno));
        goto fail;
    }
    if (td_jobs_load(j, err) != 0) goto fail;
    *out = j;
    return 0;
fail:
    td_jobs_close(j);
    return -1;
}

int td_jobs_start(td_jobs *j, td_err *err) {
    td_cgroups_sweep(
        &j->cfg.runner.cgroups); /* what attempts that ended while no daemon ran left */
    /* the parts a previous daemon ran here for its master (after td_jobs_set_cluster: whose slots
     * they hold depends on it), before an agent tells its master what runs here */
    td_node_parts_recover(&j->node);
    j->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    j->sig_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (j->wake_fd < 0 || j->sig_fd < 0)
        return td_fail(err, "eventfd/signalfd: %s", strerror(errno));
    int rc = pthread_create(&j->thread, NULL, td_jobs_supervise, j);
    if (rc != 0) return td_fail(err, "starting the supervisor thread: %s", strerror(rc));
    j->started = true;
    rc = pthread_create(&j->resumer, NULL, td_jobs_resumer, j);
    if (rc != 0) return td_fail(err, "starting the checkpoint thread: %s", strerror(rc));
    j->resumer_started = true;
    rc = pthread_create(&j->janitor, NULL, td_jobs_janitor, j);
    if (rc != 0) return td_fail(err, "starting the retention thread: %s", strerror(rc));
    j->janitor_started = true;
    rc = pthread_create(&j->quota, NULL, td_jobs_quota_keeper, j);
    if (rc != 0) return td_fail(err, "starting the disk quota thread: %s", strerror(rc));
    j->quota_started = true;
    return 0;
}

void td_jobs_set_stop_policy(td_jobs *j, bool keep_jobs_on_stop, double orphan_timeout_s) {
    td_jobs_lock(j);
    j->cfg.keep_jobs_on_stop = keep_jobs_on_stop;
    j->cfg.runner.orphan_timeout_s = orphan_timeout_s;
    pthread_mutex_unlock(&j->mu);
}

static bool shepherds_connected(const td_jobs *j) {
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i]->active && !j->live[i]->parts && j->live[i]->sh.fd >= 0) return true;
    return td_node_parts_connected(&j->node);
}

/* Without keep_jobs_on_stop: every shepherd stops its group (SIGTERM, SIGKILL after the grace
 * period) while the supervisor still reads what the ranks write, so their last lines (a final
 * checkpoint) are recorded; the jobs stay "running" for the next start to resume. */
static void stop_every_job(td_jobs *j) {
    const char *why = TD_RUNNER_STOP_DAEMON_WORDS;
    td_jobs_lock(j);
    if (j->cfg.keep_jobs_on_stop || !j->started) {
        pthread_mutex_unlock(&j->mu);
        return;
    }
    j->stopping_jobs = true;
    int n = 0;
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (jb->active && !jb->parts && jb->sh.fd >= 0) {
            jb->sh.stop_sent = false; /* a cancel's stop may be on its way: this one says why */
            n += td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.runner.grace_s, why);
        }
    }
    td_node_parts_stop_for_exit(&j->node, why);
    if (n > 0 || td_node_parts_connected(&j->node))
        td_log_notice(j->log,
                      "stopping the jobs running here (keep_jobs_on_stop is false; "
                      "SIGKILL after %g s)",
                      j->cfg.runner.grace_s);
    struct timespec until;
    td_clock_deadline(&until,
                      j->cfg.runner.grace_s + 10.0); /* the shepherds keep the grace period */
    while (shepherds_connected(j) &&
           pthread_cond_timedwait(&j->changed, &j->mu, &until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&j->mu);
}

void td_jobs_stop(td_jobs *j) {
    if (!j) return; /* a start-up that failed before the jobs opened */
    stop_every_job(j);
    td_jobs_lock(j);
    j->stopping = true;
    pthread_cond_broadcast(&j->changed);
    for (int i = 0; i < TD_JOBS_STREAM_CVS; i++) pthread_cond_broadcast(&j->stream_cv[i]);
    pthread_cond_broadcast(&j->resume_wake);
    pthread_cond_broadcast(&j->janitor_wake);
    pthread_cond_broadcast(&j->quota_wake);
    pthread_mutex_unlock(&j->mu);
    if (j->quota_started) { /* (it may be measuring a directory) */
        pthread_join(j->quota, NULL);
        j->quota_started = false;
    }
    if (j->janitor_started) { /* (it may be removing a directory) */
        pthread_join(j->janitor, NULL);
        j->janitor_started = false;
    }
    if (j->resumer_started) { /* (it may finish a file it is hashing or copying first) */
        pthread_join(j->resumer, NULL);
        j->resumer_started = false;
    }
    if (j->started) {
        td_jobs_wake(j);
        pthread_join(j->thread, NULL);
        j->started = false;
    }
}

void td_jobs_close(td_jobs *j) {
    if (!j) return;
    td_jobs_stop(j);
    /* what still runs is its shepherds': the next daemon re-attaches to it, and without one
     * it stops after orphan_timeout_s */
    for (int i = 0; i < j->n_jobs; i++) td_jobs_free_job(j->jobs[i]);
    td_node_parts_free(&j->node);
    td_cgroups_release(&j->cfg.runner.cgroups);
    free(j->jobs);
    free(j->live);
    td_runner_free(&j->runner);
    td_strv_free(j->roots);
    for (int i = 0; i < j->n_retired_roots; i++) td_strv_free(j->retired_roots[i]);
    free(j->retired_roots);
    if (j->wake_fd >= 0) close(j->wake_fd);
    if (j->sig_fd >= 0) close(j->sig_fd);
    pthread_cond_destroy(&j->changed);
    pthread_cond_destroy(&j->resume_wake);
    pthread_cond_destroy(&j->janitor_wake);
    pthread_cond_destroy(&j->quota_wake);
    for (int i = 0; i < TD_JOBS_STREAM_CVS; i++) pthread_cond_destroy(&j->stream_cv[i]);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void td_jobs_set_draining(td_jobs *j, bool draining) {
    td_jobs_lock(j);
    j->draining = draining;
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j); /* undrained: what waits may start now */
}
