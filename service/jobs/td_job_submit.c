/* Submitting a job (td_jobs_submit): the spec parsed as a job would read its files, the
 * token's limits (queued jobs, bytes of specs), the new row stored. Apart from the other API
 * calls (td_jobs.c) because it alone makes a job, and holds the per-token quotas. */
#include "service/jobs/td_jobs_private.h"

#include <stdlib.h>
#include <string.h>

/* Whether who has this many queued jobs (the mutex held). */
static int queued_of(const td_jobs *j, long owner) {
    int n = 0;
    for (int i = 0; i < j->n_live; i++)
        n += j->live[i]->state == QUEUED && j->live[i]->row.owner == owner;
    return n;
}

/* The bytes of specs owner's jobs hold (any state: a cancelled job's spec is kept until it is
 * deleted or expires). */
static long long spec_bytes_of(const td_jobs *j, long owner) {
    long long n = 0;
    for (int i = 0; i < j->n_jobs; i++)
        if (j->jobs[i]->row.owner == owner) n += j->jobs[i]->spec_bytes;
    return n;
}

/* The body parsed as a job would read its files (td_identity.h: a path naming the daemon's own
 * files, or another job's, is a 400 like a missing one), under the rules a reload may change. */
static int parse_as_job(td_jobs *j, const char *body, size_t len, td_submission *s,
                        td_reply_error *e) {
    td_jobs_lock(j);
    td_submit_rules rules = j->cfg.rules;
    char policy[sizeof j->command_jobs]; /* a reload may change it while this one is checked */
    snprintf(policy, sizeof policy, "%s", j->command_jobs);
    rules.command_jobs = policy;
    rules.limits = &j->cfg.limits;
    pthread_mutex_unlock(&j->mu);
    td_identity probe = td_runner_probe_identity(&j->runner);
    td_identity_saved saved;
    td_err as_err = {{0}};
    if (td_identity_become(&probe, &saved, &as_err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", as_err.msg);
    int parsed = td_submission_parse(s, body, len, &rules, e);
    td_identity_return(&saved);
    return parsed;
}

/* Whether the parsed job may be queued now: the daemon not stopping, the job fitting the nodes,
 * and who within its limits (queued jobs, bytes of specs). */
static int admit(td_jobs *j, const td_submission *s, size_t len, const td_principal *who,
                 const td_tokens_limits *limits, td_reply_error *e) {
    td_jobs_lock(j);
    int max_queued = limits->queued;
    int fits = j->stopping_jobs
                   ? td_reply_fail(e, 503, "unavailable", NULL,
                                   "traind is stopping and stopping its jobs: submit again once "
                                   "it is back")
                   : td_jobs_check_fit(j, s, e);
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
    return fits;
}

/* The new job's row, as it is stored. */
static td_db_job new_row(const td_submission *s, const char *body, size_t len,
                         const td_principal *who, const td_job_trial *trial) {
    td_db_job row = {.nproc = s->nproc,
                     .max_restarts = s->max_restarts,
                     .priority = s->priority,
                     .time_limit_s = s->time_limit_s,
                     .exit_code = -1,
                     .experiment = trial ? trial->experiment : 0,
                     .trial = trial ? trial->trial : -1,
                     .stop_at_step = trial ? trial->stop_at_step : 0};
    snprintf(row.name, sizeof row.name, "%s", s->name);
    snprintf(row.kind, sizeof row.kind, "%s", s->command ? "command" : "train");
    snprintf(row.state, sizeof row.state, "queued");
    row.owner = who->id;
    snprintf(row.owner_name, sizeof row.owner_name, "%s", who->name);
    row.spec = td_malloc(len + 1);
    memcpy(row.spec, body, len);
    row.spec[len] = 0;
    row.created_at = td_clock_wall();
    return row;
}

/* Its uid given and its row stored, under the lock (held on return when 0). */
static int store(td_jobs *j, td_db_job *row, td_reply_error *e) {
    td_err err = {{0}};
    td_jobs_lock(j);
    if (td_jobs_allocate_uid(j, &row->uid, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        td_reply_fail(e, 503, "unavailable", NULL, "%s", err.msg);
        e->retry_after_s = 60;
        return -1;
    }
    if (td_db_insert_job(j->db, row, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        if (td_db_full(j->db)) {
            td_reply_fail(e, 507, "insufficient_storage", NULL,
                          "the job cannot be stored: the filesystem of traind's state directory "
                          "%s is full (running jobs go on; free space there and submit again)",
                          j->cfg.runner.state_dir);
            e->retry_after_s = 30;
            return -1;
        }
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    return 0;
}

static int submit(td_jobs *j, const char *body, size_t len, const td_principal *who,
                  const td_tokens_limits *limits, const td_job_trial *trial, td_buf *out, long *id,
                  td_reply_error *e) {
    td_submission s;
    if (parse_as_job(j, body, len, &s, e) != 0) return -1;
    if (admit(j, &s, len, who, limits, e) != 0) {
        td_submission_free(&s);
        return -1;
    }
    td_db_job row = new_row(&s, body, len, who, trial);
    if (store(j, &row, e) != 0) {
        free(row.spec);
        td_submission_free(&s);
        return -1;
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
    td_err err = {{0}};
    int rc = td_jobs_prepare_run(j, jb, &s, &err);
    td_jobs_add(j, jb);
    if (rc != 0) {
        td_jobs_finish(j, jb, FAILED, -1, err.msg);
    } else {
        td_jobs_emit_state(j, jb);
        td_jobs_wake(j);
    }
    if (out) td_buf_puts(out, td_jobs_render(jb));
    *id = jb->row.id;
    pthread_mutex_unlock(&j->mu);
    td_submission_free(&s);
    return 0;
}

int td_jobs_submit(td_jobs *j, const char *body, size_t len, const td_principal *who,
                   const td_tokens_limits *limits, td_buf *out, long *id, td_reply_error *e) {
    return submit(j, body, len, who, limits, NULL, out, id, e);
}

int td_jobs_submit_trial(td_jobs *j, const char *body, size_t len, const td_principal *who,
                         const td_tokens_limits *limits, const td_job_trial *trial, long *id,
                         td_reply_error *e) {
    return submit(j, body, len, who, limits, trial, NULL, id, e);
}

int td_jobs_check(td_jobs *j, const char *body, size_t len, const td_principal *who,
                  const td_tokens_limits *limits, td_reply_error *e) {
    td_submission s;
    if (parse_as_job(j, body, len, &s, e) != 0) return -1;
    td_tokens_limits none = *limits;
    none.queued = 0; /* an experiment's trials are queued one at a time, up to max_concurrent */
    none.job_bytes = 0;
    int rc = admit(j, &s, len, who, &none, e);
    td_submission_free(&s);
    return rc;
}
