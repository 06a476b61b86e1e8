/* The jobs module's public side (td_jobs.h): opening and closing, and what the HTTP API calls:
 * submit, get, list, cancel, delete, wait for events. td_jobs_private.h lists the other files. */
#define _GNU_SOURCE /* signalfd */
#include "service/td_jobs_private.h"

#include "base/td_strv.h"

#include <errno.h>
#include <ftw.h>
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
    j->cfg.grace_s = grace_s;
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
    if (cfg->gpus > 0) j->gpu_used = td_calloc((size_t)cfg->gpus, sizeof(bool));
    char jobs_dir[PATH_MAX];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", cfg->state_dir);
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
    td_cgroups_sweep(&j->cfg.cgroups); /* what attempts that ended while no daemon ran left */
    /* the parts a previous daemon ran here for its master (after td_jobs_set_cluster: whose slots
     * they hold depends on it), before an agent tells its master what runs here */
    td_jobs_guests_recover(j);
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
    j->cfg.orphan_timeout_s = orphan_timeout_s;
    pthread_mutex_unlock(&j->mu);
}

static bool shepherds_connected(const td_jobs *j) {
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i]->active && !j->live[i]->parts && j->live[i]->sh.fd >= 0) return true;
    return td_jobs_guests_connected(j);
}

/* Without keep_jobs_on_stop: every shepherd stops its group (SIGTERM, SIGKILL after the grace
 * period) while the supervisor still reads what the ranks write, so their last lines (a final
 * checkpoint) are recorded; the jobs stay "running" for the next start to resume. */
static void stop_every_job(td_jobs *j) {
    const char *why = TD_JOBS_STOP_DAEMON_WORDS;
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
            n += td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.grace_s, why);
        }
    }
    td_jobs_guests_stop_for_exit(j, why);
    if (n > 0 || td_jobs_guests_connected(j))
        td_log_notice(j->log,
                      "stopping the jobs running here (keep_jobs_on_stop is false; "
                      "SIGKILL after %g s)",
                      j->cfg.grace_s);
    struct timespec until;
    td_clock_deadline(&until, j->cfg.grace_s + 10.0); /* the shepherds keep the grace period */
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
    td_jobs_guests_free(j);
    for (int i = 0; i < j->n_cg_ended; i++) free(j->cg_ended[i]);
    free(j->cg_ended);
    free(j->jobs);
    free(j->live);
    free(j->gpu_used);
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

static int not_found(td_reply_error *e, long id) {
    return td_reply_fail(e, 404, "not_found", NULL, "there is no job %ld", id);
}

/* Whether who has this many queued jobs (the mutex held). */
static int queued_of(const td_jobs *j, long owner) {
    int n = 0;
    for (int i = 0; i < j->n_live; i++)
        n += j->live[i]->state == QUEUED && j->live[i]->row.owner == owner;
    return n;
}

/* 403 unless who may act on jb: an admin, or the token that submitted it. */
static int owner_check(const job *jb, const td_principal *who, const char *what,
                       td_reply_error *e) {
    if (who->scope >= TD_SCOPE_ADMIN || (who->id != 0 && jb->row.owner == who->id)) return 0;
    return td_reply_fail(e, 403, "forbidden", NULL,
                         "job %ld was submitted by %s%s%s: token \"%s\" (scope %s) may %s only "
                         "the jobs it submitted",
                         jb->row.id, jb->row.owner_name[0] ? "token \"" : "another token",
                         jb->row.owner_name, jb->row.owner_name[0] ? "\"" : "", who->name,
                         td_scope_name(who->scope), what);
}

/* The bytes of specs owner's jobs hold (any state: a cancelled job's spec is kept until it is
 * deleted or expires). */
static long long spec_bytes_of(const td_jobs *j, long owner) {
    long long n = 0;
    for (int i = 0; i < j->n_jobs; i++)
        if (j->jobs[i]->row.owner == owner) n += j->jobs[i]->spec_bytes;
    return n;
}

int td_jobs_submit(td_jobs *j, const char *body, size_t len, const td_principal *who,
                   const td_tokens_limits *limits, td_buf *out, long *id, td_reply_error *e) {
    int max_queued = limits->queued;
    td_submission s;
    td_jobs_lock(j);
    td_submit_rules rules = j->cfg.rules;
    char policy[sizeof j->command_jobs]; /* a reload may change it while this one is checked */
    snprintf(policy, sizeof policy, "%s", j->command_jobs);
    rules.command_jobs = policy;
    rules.limits = &j->cfg.limits;
    pthread_mutex_unlock(&j->mu);
    /* the spec's files are read as a job would read them, not as the daemon (td_identity.h):
     * a path naming the daemon's own files, or another job's, is a 400 like a missing one */
    td_identity probe = td_jobs_probe_identity(j);
    td_identity_saved saved;
    td_err as_err = {{0}};
    if (td_identity_become(&probe, &saved, &as_err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", as_err.msg);
    int parsed = td_submission_parse(&s, body, len, &rules, e);
    td_identity_return(&saved);
    if (parsed != 0) return -1;
    td_jobs_lock(j);
    int fits = j->stopping_jobs
                   ? td_reply_fail(e, 503, "unavailable", NULL,
                                   "traind is stopping and stopping its jobs: submit again once "
                                   "it is back")
                   : td_jobs_check_fit(j, &s, e);
    int queued = fits == 0 && max_queued > 0 ? queued_of(j, who->id) : 0;
    if (fits == 0 && max_queued > 0 && queued >= max_queued) {
        fits = td_reply_fail(e, 429, "too_many_queued", NULL,
                             "token \"%s\" already has %d queued jobs, its limit "
                             "(max_queued_per_token): submit again when one has started",
                             who->name, queued);
        e->retry_after_s = 30;
    }
    long long held = fits == 0 && limits->job_bytes > 0 ? spec_bytes_of(j, who->id) : 0;
    if (fits == 0 && limits->job_bytes > 0 && held + (long long)len > limits->job_bytes) {
        fits = td_reply_fail(e, 429, "quota_exceeded", NULL,
                             "token \"%s\"'s jobs hold %lld bytes of specs and this one has %zu: "
                             "over its limit of %lld (max_job_bytes_per_token; finished and "
                             "cancelled jobs count until they are deleted: DELETE "
                             "/v1/jobs/ID)",
                             who->name, held, len, limits->job_bytes);
        e->retry_after_s = 60;
    }
    pthread_mutex_unlock(&j->mu);
    if (fits != 0) {
        td_submission_free(&s);
        return -1;
    }
    td_db_job row = {.nproc = s.nproc,
                     .max_restarts = s.max_restarts,
                     .priority = s.priority,
                     .time_limit_s = s.time_limit_s,
                     .exit_code = -1};
    snprintf(row.name, sizeof row.name, "%s", s.name);
    snprintf(row.kind, sizeof row.kind, "%s", s.command ? "command" : "train");
    snprintf(row.state, sizeof row.state, "queued");
    row.owner = who->id;
    snprintf(row.owner_name, sizeof row.owner_name, "%s", who->name);
    row.spec = td_malloc(len + 1);
    memcpy(row.spec, body, len);
    row.spec[len] = 0;
    row.created_at = td_clock_wall();
    td_err err = {{0}};
    td_jobs_lock(j);
    if (td_jobs_allocate_uid(j, &row.uid, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        free(row.spec);
        td_submission_free(&s);
        td_reply_fail(e, 503, "unavailable", NULL, "%s", err.msg);
        e->retry_after_s = 60;
        return -1;
    }
    if (td_db_insert_job(j->db, &row, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        free(row.spec);
        td_submission_free(&s);
        if (td_db_full(j->db)) {
            td_reply_fail(e, 507, "insufficient_storage", NULL,
                          "the job cannot be stored: the filesystem of traind's state directory "
                          "%s is full (running jobs go on; free space there and submit again)",
                          j->cfg.state_dir);
            e->retry_after_s = 30;
            return -1;
        }
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    job *jb = td_jobs_new_job(j, &row);
    jb->spec_bytes = (long long)len;
    jb->nnodes = s.nnodes;
    jb->pin = s.nodes;
    jb->gpus_per_proc = s.gpus_per_proc;
    jb->launch_self = s.launch_self;
    jb->see_all_gpus = s.see_all_gpus;
    td_jobs_limit_job(jb, &j->cfg.limits, s.memory_gb, s.pids, s.cpu_weight, s.disk_gb);
    s.nodes = NULL;
    int rc = td_jobs_prepare_run(j, jb, &s, &err);
    td_jobs_add(j, jb);
    if (rc != 0) {
        td_jobs_finish(j, jb, FAILED, -1, err.msg);
    } else {
        td_jobs_emit_state(j, jb);
        td_jobs_wake(j);
    }
    td_buf_puts(out, td_jobs_render(jb));
    *id = jb->row.id;
    pthread_mutex_unlock(&j->mu);
    td_submission_free(&s);
    return 0;
}

int td_jobs_get(td_jobs *j, long id, td_buf *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) td_buf_puts(out, td_jobs_render(jb));
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : not_found(e, id);
}

int td_jobs_spec(td_jobs *j, long id, const td_principal *who, td_buf *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = !jb ? not_found(e, id) : owner_check(jb, who, "read the spec of", e);
    if (rc == 0) td_buf_puts(out, jb->row.spec);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_exists(td_jobs *j, long id, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : not_found(e, id);
}

unsigned td_jobs_state_bit(const char *state) {
    for (int s = 0; s < N_STATES; s++)
        if (strcmp(state, td_jobs_state_names[s]) == 0) return 1u << s;
    return 0;
}

void td_jobs_state_list(char *out, size_t len) {
    out[0] = 0;
    for (int s = 0; s < N_STATES; s++)
        snprintf(out + strlen(out), len - strlen(out), "%s%s", s == 0 ? "" : ", ",
                 td_jobs_state_names[s]);
}

void td_jobs_list(td_jobs *j, unsigned states, int limit, int offset, td_buf *out) {
    td_jobs_lock(j);
    td_buf_puts(out, "{\"jobs\":[");
    int seen = 0, shown = 0;
    bool more = false;
    for (int i = j->n_jobs - 1; i >= 0; i--) { /* newest first */
        job *jb = j->jobs[i];
        if (states && !(states & (1u << jb->state))) continue;
        if (seen++ < offset) continue;
        if (shown == limit) {
            more = true;
            break;
        }
        if (shown++) td_buf_puts(out, ",");
        td_buf_puts(out, td_jobs_render(jb));
    }
    if (more)
        td_buf_printf(out, "],\"next_offset\":%d}\n", offset + limit);
    else
        td_buf_puts(out, "],\"next_offset\":null}\n");
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_cancel(td_jobs *j, long id, const td_principal *who, td_buf *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = 0;
    if (!jb) {
        rc = not_found(e, id);
    } else if (owner_check(jb, who, "cancel", e) != 0) {
        rc = -1;
    } else if (td_jobs_final_state(jb->state)) {
        rc = td_reply_fail(e, 409, "conflict", NULL,
                           "job %ld has already ended (%s): there is nothing to cancel", id,
                           td_jobs_state_names[jb->state]);
    } else if (j->stopping_jobs) { /* its stop says "daemon_stop": the next start resumes it */
        rc = td_reply_fail(e, 503, "unavailable", NULL,
                           "traind is stopping and stopping its jobs (job %ld resumes when it "
                           "is back): cancel it again then",
                           id);
    } else if (!jb->active) { /* queued, or waiting to be restarted */
        jb->cancel_requested = true;
        td_jobs_finish(j, jb, CANCELLED, -1, "cancelled by request");
    } else {
        jb->cancel_requested = true;
        td_jobs_wake(j);
        struct timespec until;
        td_clock_deadline(&until, j->cfg.grace_s + 30.0);
        while (!td_jobs_final_state(jb->state) && !j->stopping &&
               pthread_cond_timedwait(&j->changed, &j->mu, &until) != ETIMEDOUT) {
        }
        if (!td_jobs_final_state(jb->state))
            rc = td_reply_fail(e, 503, "unavailable", NULL, "job %ld is still stopping; ask again",
                               id);
    }
    if (rc == 0) td_buf_puts(out, td_jobs_render(jb));
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_wait(td_jobs *j, long id, long after, double timeout_s, long *last_seq, bool *ended) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (!jb) {
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    struct timespec until;
    td_clock_deadline(&until, timeout_s);
    pthread_cond_t *cv = &j->stream_cv[(unsigned long)id % TD_JOBS_STREAM_CVS];
    /* stored events only (the stream reads what is stored); the job is found again after each
     * wait: it may have been deleted meanwhile, which ends the stream */
    while (jb && jb->stored_seq <= after &&
           !(td_jobs_final_state(jb->state) && jb->n_pending == 0) && !j->stopping &&
           pthread_cond_timedwait(cv, &j->mu, &until) != ETIMEDOUT)
        jb = td_jobs_find(j, id);
    if (jb) jb = td_jobs_find(j, id); /* (a timeout returns without looking) */
    *last_seq = jb ? jb->stored_seq : after;
    *ended = !jb || (td_jobs_final_state(jb->state) && jb->n_pending == 0) || j->stopping;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int td_jobs_log_path(td_jobs *j, long id, int rank, char *path, size_t len, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int nproc = jb ? jb->row.nproc * (jb->nnodes > 1 ? jb->nnodes : 1) : 0; /* the world */
    int per_node = jb ? jb->row.nproc : 1;
    bool self = jb && jb->launch_self;
    if (jb) snprintf(path, len, "%s/rank-%d.log", jb->dir, rank);
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    if (rank < 0 || rank >= nproc)
        return td_reply_fail(e, 404, "not_found", "rank", "job %ld has ranks 0 to %d, not %d", id,
                             nproc - 1, rank);
    /* one log a node: its launching process's, where whatever it started writes too */
    if (self && rank % per_node != 0)
        return td_reply_fail(e, 404, "not_found", "rank",
                             "job %ld starts one process a node (launch \"self\"), whose log "
                             "holds what its ranks wrote: ask for rank %d (ranks 0, %d, ...)",
                             id, rank - rank % per_node, per_node);
    return 0;
}

int td_jobs_events(td_jobs *j, long id, long after, int limit, td_db_event_fn fn, void *ctx,
                   td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int served = jb ? td_jobs_recent_events(jb, after, limit, fn, ctx) : -1;
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    if (served >= 0) return 0;
    td_err err = {{0}};
    if (td_db_events(j->db, id, after, limit, fn, ctx, &err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    return 0;
}

static void append_metric(void *ctx, const char *data) {
    td_buf *out = ctx;
    if (out->len > 1) td_buf_puts(out, ",\n");
    td_buf_puts(out, data);
}

int td_jobs_metrics(td_jobs *j, long id, long since, td_buf *out, td_reply_error *e) {
    if (td_jobs_exists(j, id, e) != 0) return -1;
    td_err err = {{0}};
    td_buf_puts(out, "[");
    if (td_db_metrics(j->db, id, since, append_metric, out, &err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    td_buf_puts(out, "]\n");
    return 0;
}

int td_jobs_checkpoints(td_jobs *j, long id, long step, td_db_checkpoint_fn fn, void *ctx,
                        td_reply_error *e) {
    if (td_jobs_exists(j, id, e) != 0) return -1;
    td_err err = {{0}};
    if (td_db_checkpoints(j->db, id, step, fn, ctx, &err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    return 0;
}

int td_jobs_checkpoint_path(td_jobs *j, long id, long step, char *path, size_t len,
                            td_reply_error *e) {
    if (td_jobs_exists(j, id, e) != 0) return -1;
    td_err err = {{0}};
    int found = td_db_checkpoint_path(j->db, id, step, path, len, &err);
    if (found < 0) return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    if (found == 0)
        return td_reply_fail(e, 404, "not_found", NULL, "job %ld has no checkpoint at step %ld", id,
                             step);
    return 0;
}

int td_jobs_tensorboard_dir(td_jobs *j, long id, char *path, size_t len, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) snprintf(path, len, "%s/tensorboard", jb->dir);
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return td_reply_fail(e, 404, "not_found", NULL,
                             "job %ld has no TensorBoard events yet: they are written from its "
                             "first metric on",
                             id);
    return 0;
}

int td_jobs_delete(td_jobs *j, long id, const td_principal *who, td_reply_error *e) {
    td_jobs_lock(j);
    int at = -1;
    for (;;) { /* not while its checkpoint is being copied (into its directory, maybe) */
        at = -1;
        for (int i = 0; i < j->n_jobs; i++)
            if (j->jobs[i]->row.id == id) at = i;
        if (at < 0 || !j->jobs[at]->resume_busy || j->stopping) break;
        pthread_cond_wait(&j->changed, &j->mu);
    }
    if (at < 0) {
        pthread_mutex_unlock(&j->mu);
        return not_found(e, id);
    }
    job *jb = j->jobs[at];
    if (owner_check(jb, who, "delete", e) != 0) {
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    if (!td_jobs_final_state(jb->state)) {
        int rc = td_reply_fail(e, 409, "conflict", NULL,
                               "job %ld is %s: only a finished job can be deleted (cancel it "
                               "first: POST /v1/jobs/%ld/cancel)",
                               id, td_jobs_state_names[jb->state], id);
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    td_err err = {{0}};
    if (td_db_delete_jobs(j->db, &id, 1, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    bool moved = td_jobs_forget_locked(j, at);
    pthread_cond_broadcast(&j->changed); /* its streams end */
    pthread_mutex_unlock(&j->mu);
    char doomed[PATH_MAX + 32];
    snprintf(doomed, sizeof doomed, "%s/jobs/.deleted-%ld", j->cfg.state_dir, id);
    if (moved) td_jobs_remove_tree(j, id, doomed);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(id), "job %ld deleted", id);
    return 0;
}

bool td_jobs_forget_locked(td_jobs *j, int at) {
    job *jb = j->jobs[at];
    long id = jb->row.id;
    /* out of the way at once (a rename), removed after the lock is let go: a job's files can
     * be gigabytes of checkpoints */
    char doomed[PATH_MAX + 32];
    snprintf(doomed, sizeof doomed, "%s/jobs/.deleted-%ld", j->cfg.state_dir, id);
    bool moved = rename(jb->dir, doomed) == 0;
    if (!moved && errno != ENOENT)
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: cannot move %s aside: %s", id,
                  jb->dir, strerror(errno));
    memmove(&j->jobs[at], &j->jobs[at + 1], (size_t)(j->n_jobs - at - 1) * sizeof *j->jobs);
    j->n_jobs--;
    td_jobs_live_remove(j, jb);
    td_jobs_wake_streams(j, id); /* they end */
    td_jobs_free_job(jb);
    return moved;
}

json_t *td_jobs_gpu_users(td_jobs *j) {
    json_t *users = json_object();
    td_jobs_lock(j);
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (!jb->active) continue;
        json_t *pl = td_jobs_placement_json(jb), *nd, *pr;
        size_t a, b;
        json_array_foreach(json_object_get(pl, "nodes"), a, nd) {
            const char *name = json_string_value(json_object_get(nd, "node"));
            const char *state = json_string_value(json_object_get(nd, "state"));
            if (state && strcmp(state, "ended") == 0) continue; /* its GPUs are free again */
            json_t *mine = json_object_get(users, name ? name : "");
            if (!mine) json_object_set_new(users, name ? name : "", mine = json_object());
            json_array_foreach(json_object_get(nd, "processes"), b, pr) {
                const char *d = json_string_value(json_object_get(pr, "devices"));
                int k = 0, per = td_jobs_slots(jb) / td_jobs_procs(jb);
                for (; d && *d; d += strcspn(d, ",") + (d[strcspn(d, ",")] == ','), k++) {
                    /* where every process sees all, the b-th holds the b-th share of them */
                    if (jb->see_all_gpus && k / per != (int)b) continue;
                    char key[16];
                    snprintf(key, sizeof key, "%.*s", (int)strcspn(d, ","), d);
                    json_object_set_new(mine, key,
                                        json_pack("{s:I, s:O}", "job", (json_int_t)jb->row.id,
                                                  "ranks", json_object_get(pr, "ranks")));
                }
            }
        }
        json_decref(pl);
    }
    pthread_mutex_unlock(&j->mu);
    return users;
}

/* A job's labels: its id and name, escaped as the format wants. */
static void job_labels(td_buf *out, const job *jb) {
    td_buf_printf(out, "{job=\"%ld\",name=\"", jb->row.id);
    td_buf_label_value(out, jb->row.name);
    td_buf_puts(out, "\"}");
}

/* A running job's figure from its latest train line, when it has that member as a number. */
static void job_gauge(td_buf *out, const job *jb, const char *metric, const char *member) {
    json_t *v = json_object_get(jb->latest_train, member);
    if (!json_is_number(v)) return;
    td_buf_puts(out, metric);
    job_labels(out, jb);
    td_buf_printf(out, " %.9g\n", json_number_value(v));
}

void td_jobs_prometheus(td_jobs *j, double now, td_buf *out) {
    td_jobs_lock(j);
    int by_state[N_STATES] = {0}, queued = 0;
    double oldest = 0;
    for (int i = 0; i < j->n_jobs; i++) {
        const job *jb = j->jobs[i];
        by_state[jb->state]++;
        if (jb->state == QUEUED) {
            queued++;
            if (jb->row.created_at > 0 && now - jb->row.created_at > oldest)
                oldest = now - jb->row.created_at;
        }
    }
    td_buf_puts(out, "# HELP traind_jobs Jobs by state.\n# TYPE traind_jobs gauge\n");
    for (int s = 0; s < N_STATES; s++)
        td_buf_printf(out, "traind_jobs{state=\"%s\"} %d\n", td_jobs_state_names[s], by_state[s]);
    td_buf_printf(out,
                  "# HELP traind_queue_length Jobs waiting to start.\n"
                  "# TYPE traind_queue_length gauge\ntraind_queue_length %d\n"
                  "# HELP traind_queue_oldest_wait_seconds How long the longest-waiting job has "
                  "waited (0: none waits).\n# TYPE traind_queue_oldest_wait_seconds gauge\n"
                  "traind_queue_oldest_wait_seconds %.3f\n"
                  "# HELP traind_job_restarts_total Attempts restarted since this daemon "
                  "started (a counter: deleting a job does not lower it).\n"
                  "# TYPE traind_job_restarts_total counter\ntraind_job_restarts_total %lld\n"
                  "# HELP traind_jobs_expired_total Finished jobs removed by retention "
                  "(keep_finished_for_s, keep_finished_jobs) since this daemon started.\n"
                  "# TYPE traind_jobs_expired_total counter\ntraind_jobs_expired_total %lld\n",
                  queued, oldest, j->restarts_total, j->expired_total);
    static const char *const GAUGES[][3] = {
        {"traind_job_step", "step", "The step of a running job's latest metric."},
        {"traind_job_loss", "loss", "A running job's latest training loss."},
        {"traind_job_samples_per_second", "samples_per_s",
         "A running job's training throughput (its latest train line)."}};
    for (int g = 0; g < 3; g++) {
        td_buf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", GAUGES[g][0], GAUGES[g][2],
                      GAUGES[g][0]);
        for (int i = 0; i < j->n_live; i++) {
            const job *jb = j->live[i];
            if (jb->state != RUNNING) continue;
            if (g == 0) {
                td_buf_puts(out, GAUGES[g][0]);
                job_labels(out, jb);
                td_buf_printf(out, " %ld\n", jb->last_step);
            } else {
                job_gauge(out, jb, GAUGES[g][0], GAUGES[g][1]);
            }
        }
    }
    td_buf_puts(out, "# HELP traind_job_last_metric_age_seconds Since a running job's latest "
                     "metric arrived.\n# TYPE traind_job_last_metric_age_seconds gauge\n");
    for (int i = 0; i < j->n_live; i++) {
        const job *jb = j->live[i];
        if (jb->state != RUNNING || jb->last_metric_at <= 0) continue;
        td_buf_puts(out, "traind_job_last_metric_age_seconds");
        job_labels(out, jb);
        td_buf_printf(out, " %.3f\n", now - jb->last_metric_at);
    }
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_slots_used(td_jobs *j) {
    td_jobs_lock(j);
    int used = j->used_slots;
    pthread_mutex_unlock(&j->mu);
    return used;
}

void td_jobs_set_draining(td_jobs *j, bool draining) {
    td_jobs_lock(j);
    j->draining = draining;
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j); /* undrained: what waits may start now */
}

/* A node-to-node file name: segments of [A-Za-z0-9._-], none empty or starting with '.', so it
 * can only name something inside the job's directory. */
static bool relative_ok(const char *rel) {
    if (!*rel || strlen(rel) > 1024) return false;
    for (const char *seg = rel; *seg;) {
        size_t n = strcspn(seg, "/");
        if (n == 0 || seg[0] == '.') return false;
        for (size_t i = 0; i < n; i++) {
            char c = seg[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-'))
                return false;
        }
        seg += n;
        if (*seg == '/') seg++;
    }
    return true;
}

int td_jobs_file_path(td_jobs *j, long id, const char *rel, bool writing, const char *node,
                      char *path, size_t len, td_job_files *files, td_reply_error *e) {
    static const char CHECKPOINTS[] = "checkpoints/";
    if (!relative_ok(rel))
        return td_reply_fail(e, 400, "bad_request", NULL,
                             "\"%s\": expected a path inside the job's directory (segments of "
                             "letters, digits, '.', '_' and '-', none starting with '.')",
                             rel);
    if (strncmp(rel, CHECKPOINTS, strlen(CHECKPOINTS)) != 0 || !rel[strlen(CHECKPOINTS)])
        return td_reply_fail(e, 403, "forbidden", NULL,
                             "\"%s\": nodes exchange a job's checkpoints only (checkpoints/...)",
                             rel);
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = 0;
    /* the node sends what its part's rank 0 wrote (node rank 0), and fetches only what its part
     * resumes from: a job it runs no part of is none of its business */
    int node_rank = jb && node ? td_jobs_part_rank_on(jb, node) : 0;
    if (jb && node && (node_rank < 0 || (writing && node_rank != 0)))
        rc = td_reply_fail(e, 403, "forbidden", NULL,
                           "node %s %s of job %ld's attempt: it may not %s its files", node,
                           node_rank < 0 ? "runs no part" : "does not run node rank 0", id,
                           writing ? "send" : "fetch");
    if (jb) {
        snprintf(path, len, "%s/%s", jb->dir, rel);
        td_jobs_files_for(j, id, jb->row.uid, files);
    }
    /* the latest checkpoint, listed as checkpoints/BASE/... (td_job_resume.c), may lie where the
     * master's own rank 0 wrote it: a train job's checkpoint.dir outside the job's directory */
    const char *base = jb && jb->ckpt_path ? strrchr(jb->ckpt_path, '/') : NULL;
    size_t n = base ? strlen(base + 1) : 0;
    char ours[PATH_MAX + 16];
    if (jb) snprintf(ours, sizeof ours, "%s/checkpoints/", jb->dir);
    if (!writing && base && strncmp(jb->ckpt_path, ours, strlen(ours)) != 0 &&
        strncmp(rel + 12, base + 1, n) == 0 && (rel[12 + n] == '/' || rel[12 + n] == 0))
        snprintf(path, len, "%s%s", jb->ckpt_path, rel + 12 + n);
    if (jb && rc == 0 && writing) { /* its checkpoints/ is the job's, as an attempt here makes it */
        td_err err = {{0}};
        char cwd[PATH_MAX + 16];
        if (td_jobs_work_dir(&files->who, jb->dir, cwd, sizeof cwd, &err) != 0)
            rc = td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    pthread_mutex_unlock(&j->mu);
    return !jb ? not_found(e, id) : rc;
}
