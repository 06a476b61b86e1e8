/* Jobs that are an experiment's trials (service/exp/ makes and follows them): what the
 * experiment reads of one, the list of an experiment's, stopping one without waiting, and
 * removing them all with their experiment. Making one is td_jobs_submit_trial
 * (td_job_submit.c). */
#include "service/jobs/td_jobs_private.h"

#include <stdlib.h>
#include <string.h>

int td_jobs_status(td_jobs *j, long id, td_job_status *out) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) {
        snprintf(out->state, sizeof out->state, "%s", td_jobs_state_names[jb->state]);
        out->final = td_jobs_final_state(jb->state);
        out->paused = jb->state == PAUSED;
        out->at_stop =
            out->paused && jb->row.stop_at_step > 0 && jb->checkpoint_step == jb->row.stop_at_step;
        out->step = jb->last_step;
        out->stop_at_step = jb->row.stop_at_step;
        snprintf(out->reason, sizeof out->reason, "%.500s", jb->row.reason);
    }
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : -1;
}

void td_jobs_trials(td_jobs *j, long experiment, void (*fn)(void *ctx, long id, int trial),
                    void *ctx) {
    td_jobs_lock(j);
    for (int i = 0; i < j->n_jobs; i++)
        if (j->jobs[i]->row.experiment == experiment)
            fn(ctx, j->jobs[i]->row.id, j->jobs[i]->row.trial);
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_stop_job(td_jobs *j, long id, const char *why) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = 1;
    if (jb && !td_jobs_final_state(jb->state)) {
        rc = 0;
        jb->cancel_requested = true;
        if (!jb->active)
            td_jobs_finish(j, jb, CANCELLED, -1, why);
        else
            td_jobs_wake(j); /* the supervisor stops it (td_job_supervisor.c) */
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_hold_trial(td_jobs *j, long id) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = jb && !td_jobs_final_state(jb->state) ? 0 : -1;
    if (rc == 0 && jb->state != PAUSED && !jb->hold_requested) {
        jb->hold_requested = true;
        if (!jb->active && !jb->parts) { /* queued, or waiting to be placed again: no slot */
            td_jobs_pause_job(j, jb);
        } else {
            td_jobs_wake(j); /* the supervisor stops it (td_job_supervisor.c) */
        }
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_resume_trial(td_jobs *j, long id, long stop_at_step) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = -1;
    if (jb && jb->state == PAUSED) {
        rc = 0;
        /* a paused job's time limit stops: its clock (from its first start) moves on by the
         * time it was paused, from its last attempt's end (stored: a restart keeps it) */
        double paused_at = jb->n_attempts > 0 ? jb->attempts[jb->n_attempts - 1].finished_at : 0;
        if (jb->row.started_at > 0 && paused_at > 0)
            jb->row.started_at += td_clock_wall() - paused_at;
        jb->row.stop_at_step = stop_at_step;
        jb->row.reason[0] = 0;
        td_jobs_set_state(jb, QUEUED); /* (stored with the state event) */
        td_jobs_emit_state(j, jb);
        td_jobs_wake(j); /* the queue places it; its attempt resumes (TORCHELASTIC_RESTART_COUNT) */
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_end_trial(td_jobs *j, long id, const char *reason) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = -1;
    if (jb && jb->state == PAUSED) {
        rc = 0;
        td_jobs_finish(j, jb, SUCCEEDED, 0, reason);
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_delete_trials(td_jobs *j, long experiment, td_reply_error *e) {
    td_jobs_lock(j);
    int n = 0;
    long *ids = td_calloc((size_t)j->n_jobs + 1, sizeof *ids);
    for (int i = 0; i < j->n_jobs; i++) {
        job *jb = j->jobs[i];
        if (jb->row.experiment != experiment) continue;
        /* (a paused one runs nothing: it goes too, e.g. with an experiment that ended unread) */
        bool idle = td_jobs_final_state(jb->state) || (jb->state == PAUSED && !jb->active);
        if (!idle || jb->resume_busy) {
            pthread_mutex_unlock(&j->mu);
            free(ids);
            return td_reply_fail(e, 409, "conflict", NULL,
                                 "trial %d (job %ld) of experiment %ld is %s: cancel the "
                                 "experiment first (POST /v1/experiments/%ld/cancel)",
                                 jb->row.trial, jb->row.id, experiment,
                                 td_jobs_state_names[jb->state], experiment);
        }
        ids[n++] = jb->row.id;
    }
    td_err err = {{0}};
    if (n > 0 && td_db_delete_jobs(j->db, ids, n, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        free(ids);
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    bool *moved = td_calloc((size_t)n + 1, sizeof *moved);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < j->n_jobs; i++)
            if (j->jobs[i]->row.id == ids[k]) {
                moved[k] = td_jobs_forget_locked(j, i);
                break;
            }
    pthread_cond_broadcast(&j->changed); /* their streams end */
    pthread_mutex_unlock(&j->mu);
    for (int k = 0; k < n; k++) {
        char doomed[PATH_MAX + 32];
        snprintf(doomed, sizeof doomed, "%s/jobs/.deleted-%ld", j->cfg.runner.state_dir, ids[k]);
        if (moved[k]) td_jobs_remove_tree(j, ids[k], doomed);
    }
    free(moved);
    free(ids);
    return 0;
}

void td_jobs_set_observer(td_jobs *j, void (*fn)(void *ctx, long id), void *ctx) {
    td_jobs_lock(j);
    j->observer = fn;
    j->observer_ctx = ctx;
    pthread_mutex_unlock(&j->mu);
}
