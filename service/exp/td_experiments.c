/* The experiments' table and the API's calls: opening (the experiments from the database, their
 * trials from the jobs), creating one (its body checked, its base job checked as a job), the
 * JSON of one and of the list, cancelling, deleting, and the Prometheus series. */
#include "service/exp/td_experiments.h"
#include "service/exp/td_exp_private.h"

#include "base/td_clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static td_exp_state state_of(const char *name) {
    for (int i = 0; i < TD_EXP_N; i++)
        if (strcmp(td_exp_state_names[i], name) == 0) return (td_exp_state)i;
    return TD_EXP_FAILED;
}

experiment *td_exp_find(td_experiments *x, long id) {
    for (int i = 0; i < x->n; i++)
        if (x->list[i]->row.id == id) return x->list[i];
    return NULL;
}

void td_exp_poke(td_experiments *x) {
    pthread_mutex_lock(&x->wake_mu);
    x->poked = true;
    pthread_cond_signal(&x->wake);
    pthread_mutex_unlock(&x->wake_mu);
}

void td_exp_save(td_experiments *x, experiment *ex) {
    snprintf(ex->row.state, sizeof ex->row.state, "%s", td_exp_state_names[ex->state]);
    td_err err = {{0}};
    if (td_db_update_experiment(x->db, &ex->row, &err) != 0)
        td_log_at(x->log, TD_LOG_ERROR, TD_LOG_NOWHERE, "experiment %ld: %s", ex->row.id, err.msg);
}

static void add(td_experiments *x, experiment *ex) {
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 16;
        x->list = td_realloc(x->list, (size_t)x->cap * sizeof *x->list);
    }
    x->list[x->n++] = ex;
}

/* The experiment's own fields from its row and checked body (0), its trials not yet known. */
static int build(experiment *ex, td_reply_error *e) {
    if (td_exp_spec_parse(&ex->spec, ex->row.spec, strlen(ex->row.spec), e) != 0) return -1;
    ex->n_trials = td_exp_trial_count(&ex->spec);
    ex->trials = td_calloc((size_t)ex->n_trials + 1, sizeof *ex->trials);
    for (int t = 0; t < ex->n_trials; t++) {
        ex->trials[t] = (td_exp_trial){.trial = t, .step = -1, .metrics_since = -1};
        ex->trials[t].hparams = td_exp_hparams(&ex->spec, t);
        snprintf(ex->trials[t].state, sizeof ex->trials[t].state, "pending");
    }
    ex->owner.id = ex->row.owner;
    snprintf(ex->owner.name, sizeof ex->owner.name, "%s", ex->row.owner_name);
    ex->owner.scope = TD_SCOPE_SUBMIT;
    ex->best_said = -1;
    return 0;
}

static void free_experiment(experiment *ex) {
    for (int t = 0; t < ex->n_trials; t++) json_decref(ex->trials[t].hparams);
    free(ex->trials);
    td_exp_free_events(ex);
    td_exp_spec_free(&ex->spec);
    free(ex->row.spec);
    free(ex);
}

/* ---- opening --------------------------------------------------------------------------------- */

static void found_trial(void *ctx, long id, int trial) {
    experiment *ex = ctx;
    if (trial < 0 || trial >= ex->n_trials) return; /* not this body's (never made by it) */
    ex->trials[trial].made = true;
    ex->trials[trial].job = id;
    snprintf(ex->trials[trial].state, sizeof ex->trials[trial].state, "queued");
}

/* A PBT trial's values are its job's: an exploit changed them (and stored them first). */
static void reread_values(experiment *ex, td_jobs *jobs) {
    for (int t = 0; t < ex->n_trials; t++) {
        if (!ex->trials[t].made) continue;
        char *body = td_jobs_body(jobs, ex->trials[t].job);
        json_t *h = td_exp_hparams_of_body(&ex->spec, body);
        free(body);
        if (!h) continue;
        json_decref(ex->trials[t].hparams);
        ex->trials[t].hparams = h;
    }
}

/* An experiment as stored (with the database's lock held: its trials are found after the load,
 * as the jobs' lock comes before the database's). */
static void loaded(void *ctx, td_db_experiment *row) {
    td_experiments *x = ctx;
    experiment *ex = td_calloc(1, sizeof *ex);
    ex->row = *row;
    td_reply_error e;
    if (build(ex, &e) != 0) { /* a body this traind cannot read: kept, shown as failed */
        td_log_at(x->log, TD_LOG_WARNING, TD_LOG_NOWHERE, "experiment %ld: %s", row->id, e.message);
        ex->state = TD_EXP_FAILED;
        snprintf(ex->row.reason, sizeof ex->row.reason, "%.900s", e.message);
    } else {
        ex->cancel_requested = strcmp(row->state, "cancelling") == 0; /* (then running) */
        ex->paused = strcmp(row->state, "paused") == 0;               /* (then running too) */
        ex->state = ex->cancel_requested || ex->paused ? TD_EXP_RUNNING : state_of(row->state);
    }
    add(x, ex);
}

int td_experiments_open(td_experiments **out, td_jobs *jobs, td_db *db, td_tokens *tokens,
                        td_log *log, td_err *err) {
    td_experiments *x = td_calloc(1, sizeof *x);
    x->jobs = jobs;
    x->tokens = tokens;
    x->db = db;
    x->log = log;
    pthread_mutex_init(&x->mu, NULL);
    pthread_mutex_init(&x->wake_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&x->wake, &ca);
    pthread_cond_init(&x->changed, &ca);
    pthread_condattr_destroy(&ca);
    /* above any id an earlier daemon gave (ms since 1970, times 1000 events a millisecond) */
    x->first_seq = (long)(td_clock_wall() * 1000.0) * 1000 + 1;
    if (td_db_load_experiments(db, loaded, x, err) != 0) {
        td_experiments_close(x);
        return -1;
    }
    for (int i = 0; i < x->n; i++)
        if (x->list[i]->trials) td_jobs_trials(jobs, x->list[i]->row.id, found_trial, x->list[i]);
    for (int i = 0; i < x->n; i++)
        if (x->list[i]->trials && x->list[i]->spec.searcher == TD_SEARCH_PBT)
            reread_values(x->list[i], jobs);
    *out = x;
    return 0;
}

void td_experiments_close(td_experiments *x) {
    if (!x) return;
    TD_ASSERT(!x->started, "td_experiments_close before td_experiments_stop");
    for (int i = 0; i < x->n; i++) free_experiment(x->list[i]);
    free(x->list);
    pthread_cond_destroy(&x->wake);
    pthread_cond_destroy(&x->changed);
    pthread_mutex_destroy(&x->wake_mu);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

/* ---- the API's calls ------------------------------------------------------------------------- */

/* Its first trial's job checked as a job (the base job's errors under "job."). */
static int check_base_job(td_experiments *x, experiment *ex, const td_principal *who,
                          const td_tokens_limits *limits, td_reply_error *e) {
    char *body = td_exp_trial_body(&ex->spec, 0, 0, ex->trials[0].hparams, e);
    if (!body) return -1;
    int rc = td_jobs_check(x->jobs, body, strlen(body), who, limits, e);
    free(body);
    if (rc != 0 && e->status < 500) {
        char field[sizeof e->field];
        snprintf(field, sizeof field, "job%s%.250s", e->field[0] ? "." : "", e->field);
        snprintf(e->field, sizeof e->field, "%s", field);
        char message[sizeof e->message];
        snprintf(message, sizeof message, "job: %.1500s", e->message);
        snprintf(e->message, sizeof e->message, "%s", message);
    }
    return rc;
}

int td_experiments_create(td_experiments *x, const char *body, size_t len, const td_principal *who,
                          const td_tokens_limits *limits, td_buf *out, long *id,
                          td_reply_error *e) {
    experiment *ex = td_calloc(1, sizeof *ex);
    ex->row.spec = td_malloc(len + 1);
    memcpy(ex->row.spec, body, len);
    ex->row.spec[len] = 0;
    if (strlen(ex->row.spec) != len) {
        free_experiment(ex);
        return td_reply_fail(e, 400, "invalid_json", NULL, "the body holds a NUL byte");
    }
    if (len > TD_EXP_BODY_MAX) {
        free_experiment(ex);
        return td_reply_fail(e, 413, "body_too_large", NULL,
                             "an experiment's body is %zu bytes; at most %d", len, TD_EXP_BODY_MAX);
    }
    if (build(ex, e) != 0 || check_base_job(x, ex, who, limits, e) != 0) {
        free_experiment(ex);
        return -1;
    }
    snprintf(ex->row.name, sizeof ex->row.name, "%s", ex->spec.name);
    snprintf(ex->row.state, sizeof ex->row.state, "running");
    ex->row.created_at = td_clock_wall();
    ex->row.owner = who->id;
    snprintf(ex->row.owner_name, sizeof ex->row.owner_name, "%s", who->name);
    ex->owner = *who;
    td_err err = {{0}};
    pthread_mutex_lock(&x->mu);
    int running = 0, kept = 0;
    for (int i = 0; i < x->n; i++)
        if (x->list[i]->row.owner == who->id) {
            kept++;
            running += x->list[i]->state == TD_EXP_RUNNING;
        }
    if (who->id != 0 &&
        (running >= TD_EXPERIMENTS_PER_TOKEN || kept >= TD_EXPERIMENTS_KEPT_PER_TOKEN)) {
        pthread_mutex_unlock(&x->mu);
        free_experiment(ex);
        if (running >= TD_EXPERIMENTS_PER_TOKEN)
            td_reply_fail(e, 429, "too_many_experiments", NULL,
                          "token \"%s\" already runs %d experiments, the most one token may: "
                          "create this one when one has ended",
                          who->name, running);
        else
            td_reply_fail(e, 429, "too_many_experiments", NULL,
                          "token \"%s\" has %d experiments, the most one token may keep: delete "
                          "ended ones first (DELETE /v1/experiments/ID)",
                          who->name, kept);
        e->retry_after_s = 60;
        return -1;
    }
    if (td_db_insert_experiment(x->db, &ex->row, &err) != 0) {
        pthread_mutex_unlock(&x->mu);
        free_experiment(ex);
        return td_reply_fail(e, td_db_full(x->db) ? 507 : 500,
                             td_db_full(x->db) ? "insufficient_storage" : "internal", NULL, "%s",
                             err.msg);
    }
    add(x, ex);
    *id = ex->row.id;
    td_exp_render(x, ex, out);
    pthread_mutex_unlock(&x->mu);
    td_log_at(x->log, TD_LOG_INFO, TD_LOG_NOWHERE,
              "experiment %ld (%s) created by token \"%s\": %s search of %d trials on %s",
              ex->row.id, ex->row.name, who->name, td_exp_searcher_names[ex->spec.searcher],
              ex->n_trials, ex->spec.metric);
    td_exp_poke(x);
    return 0;
}

static int not_found(td_reply_error *e, long id) {
    return td_reply_fail(e, 404, "not_found", NULL, "no experiment %ld", id);
}

static int owner_check(const experiment *ex, const td_principal *who, const char *what,
                       td_reply_error *e) {
    if (who->scope >= TD_SCOPE_ADMIN || (who->id != 0 && ex->row.owner == who->id)) return 0;
    return td_reply_fail(e, 403, "forbidden", NULL,
                         "experiment %ld was created by token \"%s\": token \"%s\" (scope %s) "
                         "may %s only the experiments it created",
                         ex->row.id, ex->row.owner_name, who->name, td_scope_name(who->scope),
                         what);
}

int td_experiments_get(td_experiments *x, long id, td_buf *out, td_reply_error *e) {
    pthread_mutex_lock(&x->mu);
    experiment *ex = td_exp_find(x, id);
    if (ex) td_exp_render(x, ex, out);
    pthread_mutex_unlock(&x->mu);
    return ex ? 0 : not_found(e, id);
}

void td_experiments_list(td_experiments *x, td_buf *out) {
    pthread_mutex_lock(&x->mu);
    td_buf_puts(out, "{\"experiments\":[");
    for (int i = x->n - 1; i >= 0; i--) { /* newest first, as the jobs' list */
        if (i < x->n - 1) td_buf_puts(out, ",");
        td_exp_render_summary(x->list[i], out);
    }
    td_buf_puts(out, "]}\n");
    pthread_mutex_unlock(&x->mu);
}

int td_experiments_cancel(td_experiments *x, long id, const td_principal *who, td_buf *out,
                          td_reply_error *e) {
    pthread_mutex_lock(&x->mu);
    experiment *ex = td_exp_find(x, id);
    int rc = !ex ? not_found(e, id) : owner_check(ex, who, "cancel", e);
    if (rc == 0 && ex->state != TD_EXP_RUNNING)
        rc = td_reply_fail(e, 409, "conflict", NULL,
                           "experiment %ld has already ended (%s): there is nothing to cancel", id,
                           td_exp_state_names[ex->state]);
    if (rc == 0 && !ex->cancel_requested) {
        ex->cancel_requested = true;
        /* stored: a daemon that restarts before its trials have ended makes no new one */
        snprintf(ex->row.state, sizeof ex->row.state, "cancelling");
        td_err err = {{0}};
        if (td_db_update_experiment(x->db, &ex->row, &err) != 0)
            td_log_at(x->log, TD_LOG_ERROR, TD_LOG_NOWHERE, "experiment %ld: %s", id, err.msg);
    }
    if (rc == 0) td_exp_render(x, ex, out);
    pthread_mutex_unlock(&x->mu);
    if (rc == 0) td_exp_poke(x);
    return rc;
}

int td_experiments_pause(td_experiments *x, long id, bool pause, const td_principal *who,
                         td_buf *out, td_reply_error *e) {
    const char *what = pause ? "pause" : "resume";
    pthread_mutex_lock(&x->mu);
    experiment *ex = td_exp_find(x, id);
    int rc = !ex ? not_found(e, id) : owner_check(ex, who, what, e);
    if (rc == 0 && (ex->state != TD_EXP_RUNNING || ex->cancel_requested))
        rc = td_reply_fail(e, 409, "conflict", NULL, "experiment %ld %s: there is nothing to %s",
                           id, ex->cancel_requested ? "is being cancelled" : "has ended", what);
    if (rc == 0 && ex->paused != pause) {
        ex->paused = pause;
        snprintf(ex->row.state, sizeof ex->row.state, "%s", pause ? "paused" : "running");
        td_err err = {{0}};
        if (td_db_update_experiment(x->db, &ex->row, &err) != 0)
            td_log_at(x->log, TD_LOG_ERROR, TD_LOG_NOWHERE, "experiment %ld: %s", id, err.msg);
        td_exp_emit(x, ex, pause ? "paused" : "resumed", json_pack("{s:s}", "by", who->name));
        td_log_at(x->log, TD_LOG_INFO, TD_LOG_NOWHERE, "experiment %ld %s by token \"%s\"", id,
                  pause ? "paused" : "resumed", who->name);
    }
    if (rc == 0) td_exp_render(x, ex, out);
    pthread_mutex_unlock(&x->mu);
    if (rc == 0) td_exp_poke(x);
    return rc;
}

int td_experiments_delete(td_experiments *x, long id, const td_principal *who, td_reply_error *e) {
    pthread_mutex_lock(&x->mu);
    experiment *ex = td_exp_find(x, id);
    int rc = !ex ? not_found(e, id) : owner_check(ex, who, "delete", e);
    if (rc == 0 && ex->state == TD_EXP_RUNNING)
        rc = td_reply_fail(e, 409, "conflict", NULL,
                           "experiment %ld is running: cancel it first (POST "
                           "/v1/experiments/%ld/cancel)",
                           id, id);
    if (rc == 0) { /* out of the table first: its trials' files go without the lock */
        int k = 0;
        for (int i = 0; i < x->n; i++)
            if (x->list[i] != ex) x->list[k++] = x->list[i];
        x->n = k;
        pthread_cond_broadcast(&x->changed); /* its streams end */
    }
    pthread_mutex_unlock(&x->mu);
    if (rc != 0) return rc;
    td_err err = {{0}};
    rc = td_jobs_delete_trials(x->jobs, id, e);
    if (rc == 0 && td_db_delete_experiment(x->db, id, &err) != 0)
        rc = td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    pthread_mutex_lock(&x->mu);
    if (rc == 0)
        free_experiment(ex);
    else
        add(x, ex); /* (kept: what could not go is said, and it can be asked again) */
    pthread_mutex_unlock(&x->mu);
    if (rc == 0) td_log_at(x->log, TD_LOG_INFO, TD_LOG_NOWHERE, "experiment %ld deleted", id);
    return rc;
}

int td_experiments_events(td_experiments *x, long id, long after, int limit, td_db_event_fn fn,
                          void *ctx, td_reply_error *e) {
    pthread_mutex_lock(&x->mu);
    experiment *ex = td_exp_find(x, id);
    if (ex) td_exp_events_after(ex, after, limit, fn, ctx);
    pthread_mutex_unlock(&x->mu);
    return ex ? 0 : not_found(e, id);
}

int td_experiments_wait(td_experiments *x, long id, long after, double timeout_s, long *last,
                        bool *ended) {
    struct timespec until;
    td_clock_deadline(&until, timeout_s);
    pthread_mutex_lock(&x->mu);
    experiment *ex;
    /* found again after each wait: it may have gone meanwhile, which ends the stream */
    while ((ex = td_exp_find(x, id)) && ex->last_seq <= after && ex->state == TD_EXP_RUNNING &&
           !atomic_load(&x->stopping) &&
           pthread_cond_timedwait(&x->changed, &x->mu, &until) != ETIMEDOUT) {
    }
    if (ex) {
        *last = ex->last_seq;
        *ended = ex->state != TD_EXP_RUNNING || atomic_load(&x->stopping);
    }
    pthread_mutex_unlock(&x->mu);
    return ex ? 0 : -1;
}

void td_experiments_prometheus(td_experiments *x, td_buf *out) {
    int by_state[TD_EXP_N] = {0};
    long trials = 0;
    pthread_mutex_lock(&x->mu);
    for (int i = 0; i < x->n; i++) {
        by_state[x->list[i]->state]++;
        for (int t = 0; t < x->list[i]->n_trials; t++) trials += x->list[i]->trials[t].job > 0;
    }
    pthread_mutex_unlock(&x->mu);
    td_buf_puts(out, "# HELP traind_experiments Experiments by state.\n"
                     "# TYPE traind_experiments gauge\n");
    for (int s = 0; s < TD_EXP_N; s++)
        td_buf_printf(out, "traind_experiments{state=\"%s\"} %d\n", td_exp_state_names[s],
                      by_state[s]);
    td_buf_printf(out,
                  "# HELP traind_experiment_trials Trials made, all experiments.\n"
                  "# TYPE traind_experiment_trials gauge\n"
                  "traind_experiment_trials %ld\n",
                  trials);
}
