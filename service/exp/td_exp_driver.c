/* The experiments' thread: on every turn (a trial changed, an experiment came or was cancelled,
 * or two seconds passed) each running experiment's unfinished trials are read (state, steps,
 * new metric lines), ASHA's paused trials promoted or stopped (td_exp_asha.c), PBT's
 * generations decided and their trials sent on (td_exp_pbt.c), new trials are
 * made up to max_concurrent running ones, a cancelled
 * experiment's trials are stopped, and an experiment whose trials have all ended is ended. A
 * trial's job is submitted with the table's lock let go (the submission reads the data files as
 * the job would): the API never waits for it. */
#include "service/exp/td_exp_private.h"

#include "base/td_clock.h"

#include <errno.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

enum { TURN_EVERY_S = 2, RETRY_AFTER_S = 30 };
/* a busy cluster's trials poke at every stored batch of lines: turns come this often at most */
#define TURN_AT_MOST_S 0.2

static void say_trial(td_experiments *x, experiment *ex, const td_exp_trial *t) {
    td_exp_emit(x, ex, "trial", td_exp_trial_json(&ex->spec, t));
}

/* The best trial, when another than the last one said ("best" events). */
static void say_best(td_experiments *x, experiment *ex) {
    const td_exp_trial *b = td_exp_best(ex);
    if (!b || b->trial == ex->best_said) return;
    ex->best_said = b->trial;
    td_exp_emit(x, ex, "best",
                json_pack("{s:i, s:I, s:O, s:f, s:I}", "trial", b->trial, "job", (json_int_t)b->job,
                          "hparams", b->hparams, "value", b->best, "step",
                          (json_int_t)b->best_step));
}

/* Reads what is new of a trial's job: its state, steps and metric lines (a "trial" event when
 * its state changed). */
static void follow(td_experiments *x, experiment *ex, td_exp_trial *t) {
    char was[sizeof t->state];
    snprintf(was, sizeof was, "%s", t->state);
    td_job_status st;
    if (td_jobs_status(x->jobs, t->job, &st) != 0) {
        t->final = true;
        snprintf(t->state, sizeof t->state, "failed");
        snprintf(t->reason, sizeof t->reason, "its job %ld is gone", t->job);
        return;
    }
    snprintf(t->state, sizeof t->state, "%s", st.state);
    t->step = st.step;
    /* paused at its rung or generation's end (the searcher's to move), or held with its
     * experiment (to go on as it was) */
    bool asha = ex->spec.searcher == TD_SEARCH_ASHA;
    t->paused = st.paused && td_exp_pauses(&ex->spec) && st.at_stop;
    t->held = st.paused && !t->paused;
    t->stop_at = st.stop_at_step;
    if (asha) t->rung = td_exp_asha_rung(&ex->spec, st.stop_at_step);
    /* nothing printed yet, or nothing since it was paused (its lines were read); a queued one
     * that ran before (promoted, resumed) is read: after a restart its rungs' values count */
    bool idle = (strcmp(st.state, "queued") == 0 && st.step <= 0) ||
                (st.paused && strcmp(was, "paused") == 0);
    if (idle) {
        if (strcmp(was, t->state) != 0) say_trial(x, ex, t);
        return;
    }
    td_buf m = {0};
    td_reply_error e;
    if (td_jobs_metrics(x->jobs, t->job, t->metrics_since, &m, &e) == 0 && m.data)
        td_exp_trial_fold(t, m.data, &ex->spec);
    td_buf_free(&m);
    if (st.final) { /* after its last metric lines were read above */
        t->final = true;
        snprintf(t->reason, sizeof t->reason, "%s", st.reason);
    }
    if (strcmp(was, t->state) != 0) say_trial(x, ex, t);
}

static void finish(td_experiments *x, experiment *ex, td_exp_state state, const char *why) {
    ex->state = state;
    ex->settled = true;
    ex->row.finished_at = td_clock_wall();
    if (why != ex->row.reason) snprintf(ex->row.reason, sizeof ex->row.reason, "%s", why);
    td_exp_save(x, ex);
    say_best(x, ex);
    td_exp_emit(x, ex, "state",
                json_pack("{s:s, s:s}", "state", td_exp_state_names[state], "reason", why));
    td_log_at(x->log, state == TD_EXP_FAILED ? TD_LOG_WARNING : TD_LOG_INFO, TD_LOG_NOWHERE,
              "experiment %ld %s%s%s", ex->row.id, td_exp_state_names[state], why[0] ? ": " : "",
              why);
}

/* Makes trial t's job, with the table's lock let go while the job is submitted; false when the
 * daemon refused for now (a limit, a full disk, a stop): tried again later. */
static bool make(td_experiments *x, experiment *ex, td_exp_trial *t) {
    td_reply_error e = {0};
    char *body = td_exp_trial_body(&ex->spec, ex->row.id, t->trial, t->hparams, &e);
    td_principal who = ex->owner;
    td_tokens_limits limits = td_tokens_get_limits(x->tokens); /* a reload may change them */
    td_job_trial trial = {ex->row.id, t->trial, 0};
    if (ex->spec.searcher == TD_SEARCH_ASHA) trial.stop_at_step = td_exp_asha_stop_at(&ex->spec, 0);
    if (ex->spec.searcher == TD_SEARCH_PBT) trial.stop_at_step = td_exp_pbt_next_stop(&ex->spec, 0);
    long id = 0;
    snprintf(t->state, sizeof t->state, "submitting");
    pthread_mutex_unlock(&x->mu);
    int rc = body
                 ? td_jobs_submit_trial(x->jobs, body, strlen(body), &who, &limits, &trial, &id, &e)
                 : -1;
    pthread_mutex_lock(&x->mu);
    free(body);
    if (rc == 0) {
        t->made = true;
        t->job = id;
        snprintf(t->state, sizeof t->state, "queued");
        say_trial(x, ex, t);
        return true;
    }
    if (e.status == 429 || e.status == 503 || e.status == 507 || e.status >= 500) {
        snprintf(t->state, sizeof t->state, "pending");
        ex->retry_at = td_clock_now() + (e.retry_after_s > 0 ? e.retry_after_s : RETRY_AFTER_S);
        td_log_at(x->log, TD_LOG_WARNING, TD_LOG_NOWHERE, "experiment %ld: trial %d waits: %s",
                  ex->row.id, t->trial, e.message);
        return false;
    }
    t->made = t->final = true; /* its body is refused as a job: the trial failed */
    snprintf(t->state, sizeof t->state, "failed");
    snprintf(t->reason, sizeof t->reason, "its job was refused: %.480s", e.message);
    td_log_at(x->log, TD_LOG_WARNING, TD_LOG_NOWHERE, "experiment %ld: trial %d: %s", ex->row.id,
              t->trial, t->reason);
    say_trial(x, ex, t);
    return true;
}

/* ASHA's promotion: the trial's job resumes from its checkpoint at the rung, to the next. */
static void promote(td_experiments *x, experiment *ex, td_exp_trial *t, const td_asha_move *m) {
    const td_exp_spec *s = &ex->spec;
    long stop = td_exp_asha_stop_at(s, m->rung + 1);
    t->paused = false; /* (not chosen again whatever the job says: the next turn reads it) */
    if (td_jobs_resume_trial(x->jobs, t->job, stop) != 0) return;
    t->rung = m->rung + 1;
    snprintf(t->state, sizeof t->state, "queued");
    snprintf(t->reason, sizeof t->reason,
             "promoted at rung %d (step %ld): %s placed %d of %d; on to step %ld", m->rung,
             s->rung_steps[m->rung], s->metric, m->place, m->of, s->rung_steps[m->rung + 1]);
    td_exp_emit(x, ex, "promoted",
                json_pack("{s:i, s:I, s:i, s:I, s:I, s:i, s:i}", "trial", t->trial, "job",
                          (json_int_t)t->job, "rung", m->rung + 1, "from_step",
                          (json_int_t)s->rung_steps[m->rung], "to_step",
                          (json_int_t)s->rung_steps[m->rung + 1], "place", m->place, "of", m->of));
}

/* ASHA's stop: the trial ends at its rung (its job succeeded there). */
static void stop_early(td_experiments *x, experiment *ex, td_exp_trial *t, const td_asha_move *m) {
    const td_exp_spec *s = &ex->spec;
    char why[300];
    snprintf(why, sizeof why,
             "stopped by its experiment's ASHA at rung %d (step %ld): %s placed %d of %d, not "
             "in the top 1/%d",
             m->rung, s->rung_steps[m->rung], s->metric, m->place, m->of, s->reduction_factor);
    t->paused = false;
    if (td_jobs_end_trial(x->jobs, t->job, why) != 0) return;
    t->final = true;
    snprintf(t->state, sizeof t->state, "succeeded");
    snprintf(t->reason, sizeof t->reason, "%s", why);
    td_exp_emit(x, ex, "stopped",
                json_pack("{s:i, s:I, s:i, s:I, s:i, s:i, s:s}", "trial", t->trial, "job",
                          (json_int_t)t->job, "rung", m->rung, "step",
                          (json_int_t)s->rung_steps[m->rung], "place", m->place, "of", m->of,
                          "reason", why));
}

/* ASHA's moves, one at a time until it has none: paused trials promoted (while fewer than
 * max_concurrent run), or stopped at a rung no trial will reach any more. */
static void asha_moves(td_experiments *x, experiment *ex) {
    for (int n = 0; n <= 2 * ex->n_trials; n++) { /* each trial moves once a turn at most */
        bool may_start = td_exp_running(ex) < ex->spec.max_concurrent;
        td_asha_move m = td_exp_asha_next(ex, may_start);
        if (m.what == TD_ASHA_NONE) return;
        td_exp_trial *t = &ex->trials[m.trial];
        if (m.what == TD_ASHA_PROMOTE)
            promote(x, ex, t, &m);
        else
            stop_early(x, ex, t, &m);
    }
}

/* PBT's exploit of one bottom trial by a top one (the experiments' lock let go meanwhile: the
 * checkpoint's bytes are copied). */
static void exploit(td_experiments *x, experiment *ex, long at, td_pbt_exploit *p) {
    td_exp_trial *t = &ex->trials[p->target], *from = &ex->trials[p->source];
    td_reply_error e = {0};
    char *body = td_exp_trial_body(&ex->spec, ex->row.id, t->trial, p->hparams, &e);
    long job = t->job, source = from->job;
    td_err err = {{0}};
    pthread_mutex_unlock(&x->mu);
    int rc = body ? td_jobs_exploit_trial(x->jobs, job, source, body, &err) : -1;
    pthread_mutex_lock(&x->mu);
    free(body);
    if (rc != 0) {
        td_log_at(x->log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                  "experiment %ld: trial %d could not exploit trial %d at step %ld: %s; it goes "
                  "on as it was",
                  ex->row.id, t->trial, from->trial, at, body ? err.msg : e.message);
        return;
    }
    json_t *was = t->hparams;
    t->hparams = json_incref(p->hparams);
    t->exploits++;
    snprintf(t->reason, sizeof t->reason,
             "exploited trial %d at step %ld (%s placed %d of %d): its checkpoint, its values "
             "perturbed",
             from->trial, at, ex->spec.metric, p->place, p->of);
    td_exp_emit(x, ex, "exploited",
                json_pack("{s:i, s:I, s:i, s:I, s:I, s:O, s:O, s:o, s:i, s:i}", "trial", t->trial,
                          "job", (json_int_t)t->job, "source", from->trial, "source_job",
                          (json_int_t)from->job, "step", (json_int_t)at, "hparams", t->hparams,
                          "from", from->hparams, "was", was, "place", p->place, "of", p->of));
}

/* PBT's moves: once every trial is paused at a generation's end, the bottom ones exploit the
 * top ones (once); then the trials paused at a decided end go on to the next, while fewer than
 * max_concurrent run. */
static void pbt_moves(td_experiments *x, experiment *ex) {
    long at = td_exp_pbt_boundary(ex);
    if (at > 0 && !td_exp_pbt_decided(ex, at)) {
        td_pbt_exploit *plan = td_calloc((size_t)ex->n_trials + 1, sizeof *plan);
        int n = td_exp_pbt_plan(ex, at, plan);
        for (int k = 0; k < n; k++) {
            if (!ex->cancel_requested && !ex->paused) exploit(x, ex, at, &plan[k]);
            json_decref(plan[k].hparams);
        }
        free(plan);
        if (ex->cancel_requested || ex->paused) return; /* (decided again when resumed) */
        ex->pbt_decided = at;
    }
    for (int k = 0; k < ex->n_trials; k++) {
        td_exp_trial *t = &ex->trials[k];
        if (!t->paused || t->final || !td_exp_pbt_decided(ex, t->stop_at)) continue;
        if (td_exp_running(ex) >= ex->spec.max_concurrent) return;
        long next = td_exp_pbt_next_stop(&ex->spec, t->stop_at);
        t->paused = false; /* (whatever the job says: the next turn reads it) */
        if (td_jobs_resume_trial(x->jobs, t->job, next) != 0) continue;
        t->stop_at = next;
        snprintf(t->state, sizeof t->state, "queued");
    }
}

/* A paused experiment's trials: each unfinished one paused (once each; a running one stops). */
static void hold_trials(td_experiments *x, experiment *ex) {
    for (int k = 0; k < ex->n_trials; k++) {
        td_exp_trial *t = &ex->trials[k];
        if (t->job <= 0 || t->final || t->paused || t->held || t->hold_sent) continue;
        t->hold_sent = true;
        (void)td_jobs_hold_trial(x->jobs, t->job); /* (-1: it has ended; the next turn reads it) */
    }
}

/* A resumed experiment's held trials go on first, where they were (under max_concurrent). */
static void resume_held(td_experiments *x, experiment *ex) {
    for (int k = 0; k < ex->n_trials; k++) {
        td_exp_trial *t = &ex->trials[k];
        t->hold_sent = false;
        if (!t->held || td_exp_running(ex) >= ex->spec.max_concurrent) continue;
        t->held = false; /* (whatever the job says: the next turn reads it) */
        if (td_jobs_resume_trial(x->jobs, t->job, t->stop_at) == 0)
            snprintf(t->state, sizeof t->state, "queued");
    }
}

/* Stops a cancelled experiment's unfinished trials (once each); true when none is left. */
static bool stop_trials(td_experiments *x, experiment *ex) {
    bool left = false;
    for (int k = 0; k < ex->n_trials; k++) {
        td_exp_trial *t = &ex->trials[k];
        if (t->job > 0 && !t->final) {
            left = true;
            if (strcmp(t->reason, "stopping") != 0) {
                char why[96];
                snprintf(why, sizeof why, "experiment %ld was cancelled", ex->row.id);
                (void)td_jobs_stop_job(x->jobs, t->job, why);
                snprintf(t->reason, sizeof t->reason, "stopping");
            }
        }
    }
    return !left;
}

/* One experiment's turn (x->mu held; let go while a trial's job is submitted). */
static void drive(td_experiments *x, long id) {
    experiment *ex = td_exp_find(x, id);
    if (!ex || ex->settled) return;
    if (ex->state != TD_EXP_RUNNING) { /* ended before this daemon started: its figures, once */
        for (int k = 0; k < ex->n_trials; k++)
            if (ex->trials[k].job > 0) follow(x, ex, &ex->trials[k]);
        ex->settled = true;
        say_best(x, ex);
        td_exp_emit(x, ex, "state",
                    json_pack("{s:s, s:s}", "state", td_exp_state_names[ex->state], "reason",
                              ex->row.reason));
        return;
    }
    for (int k = 0; k < ex->n_trials; k++)
        if (ex->trials[k].job > 0 && !ex->trials[k].final) follow(x, ex, &ex->trials[k]);
    td_principal now;
    if (!ex->cancel_requested && ex->row.owner != 0 &&
        !td_tokens_live(x->tokens, ex->row.owner, &now)) {
        ex->cancel_requested = true; /* its trials are that token's jobs: none more */
        snprintf(ex->row.reason, sizeof ex->row.reason,
                 "token \"%s\" was revoked: no trial is made for it any more", ex->row.owner_name);
        td_log_at(x->log, TD_LOG_WARNING, TD_LOG_NOWHERE, "experiment %ld: %s", ex->row.id,
                  ex->row.reason);
    }
    if (ex->cancel_requested) {
        if (stop_trials(x, ex))
            finish(x, ex, TD_EXP_CANCELLED,
                   ex->row.reason[0] ? ex->row.reason : "cancelled by request");
        return;
    }
    if (ex->paused) {
        hold_trials(x, ex);
        say_best(x, ex);
        return;
    }
    resume_held(x, ex);
    if (ex->spec.searcher == TD_SEARCH_ASHA) asha_moves(x, ex); /* before new trials: ASHA's */
    if (ex->spec.searcher == TD_SEARCH_PBT) pbt_moves(x, ex);
    bool waiting = false;
    for (int k = 0; k < ex->n_trials && !ex->cancel_requested && !ex->paused; k++) {
        td_exp_trial *t = &ex->trials[k];
        if (t->made) continue; /* (a pause may come while a trial's job is submitted) */
        if (td_exp_running(ex) >= ex->spec.max_concurrent || td_clock_now() < ex->retry_at) {
            waiting = true;
            break;
        }
        if (!make(x, ex, t)) {
            waiting = true;
            break;
        }
    }
    say_best(x, ex);
    if (waiting || ex->cancel_requested || td_exp_unfinished(ex) > 0) return;
    const td_exp_trial *best = td_exp_best(ex);
    char why[256] = "";
    if (!best)
        snprintf(why, sizeof why, "no trial reported %s in its metric lines", ex->spec.metric);
    finish(x, ex, best ? TD_EXP_SUCCEEDED : TD_EXP_FAILED, why);
}

static void turn(td_experiments *x) {
    pthread_mutex_lock(&x->mu);
    int n = x->n;
    long *ids = td_calloc((size_t)n + 1, sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = x->list[i]->row.id;
    for (int i = 0; i < n && !x->stopping; i++) drive(x, ids[i]);
    free(ids);
    pthread_mutex_unlock(&x->mu);
}

static void *run(void *arg) {
    td_experiments *x = arg;
    for (;;) {
        pthread_mutex_lock(&x->wake_mu);
        struct timespec until;
        td_clock_deadline(&until, TURN_EVERY_S);
        while (!x->poked && !x->stopping &&
               pthread_cond_timedwait(&x->wake, &x->wake_mu, &until) != ETIMEDOUT) {
        }
        bool stop = x->stopping;
        x->poked = false;
        pthread_mutex_unlock(&x->wake_mu);
        if (stop) return NULL;
        double began = td_clock_now();
        turn(x);
        double took = td_clock_now() - began;
        if (took < TURN_AT_MOST_S) { /* a pace, not a wait for anything: pokes meanwhile count */
            struct timespec pause = {0, (long)((TURN_AT_MOST_S - took) * 1e9)};
            nanosleep(&pause, NULL);
        }
    }
}

static void observed(void *ctx, long id) {
    (void)id;
    td_exp_poke(ctx);
}

int td_experiments_start(td_experiments *x, td_err *err) {
    td_jobs_set_observer(x->jobs, observed, x);
    x->poked = true; /* a first turn at once: what the experiments' trials did meanwhile */
    int rc = pthread_create(&x->thread, NULL, run, x);
    if (rc != 0) return td_fail(err, "cannot start the experiments' thread: %s", strerror(rc));
    x->started = true;
    return 0;
}

void td_experiments_stop(td_experiments *x) {
    if (!x->started) return;
    td_jobs_set_observer(x->jobs, NULL, NULL);
    pthread_mutex_lock(&x->wake_mu);
    atomic_store(&x->stopping, true);
    pthread_cond_signal(&x->wake);
    pthread_mutex_unlock(&x->wake_mu);
    pthread_mutex_lock(&x->mu);
    pthread_cond_broadcast(&x->changed); /* the streams end */
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
    x->started = false;
}
