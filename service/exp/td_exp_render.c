/* An experiment's JSON for the API: what its body chose, each trial as the searcher sees it, and
 * the best trial with the checkpoint to take from it (its checkpoint at the step of its best
 * metric, else the last one before, else its first after). */
#include "service/exp/td_exp_private.h"

#include "base/td_clock.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *time_json(double t) {
    if (t <= 0) return json_null();
    char buf[64];
    td_clock_format(t, buf, sizeof buf);
    return json_string(buf);
}

static json_t *value_json(bool has, long step, double v) {
    return has ? json_pack("{s:I, s:f}", "step", (json_int_t)step, "value", v) : json_null();
}

/* ASHA's view of a trial: the rung it trains to or is paused at, and its metric at each rung it
 * reached ({step, value}, null where it reported none by then). */
static void rungs_json(const td_exp_spec *s, const td_exp_trial *t, json_t *o) {
    json_object_set_new(o, "rung", json_integer(t->rung));
    json_t *values = json_array();
    for (int k = 0; k < s->n_rungs && td_exp_asha_reached(t, k); k++) {
        json_array_append_new(values, t->has_rung[k] ? json_pack("{s:I, s:f}", "step",
                                                                 (json_int_t)s->rung_steps[k],
                                                                 "value", t->rung_value[k])
                                                     : json_null());
    }
    json_object_set_new(o, "rung_values", values);
}

json_t *td_exp_trial_json(const td_exp_spec *s, const td_exp_trial *t) {
    json_t *o = json_pack("{s:i, s:O, s:s, s:o, s:o, s:o}", "trial", t->trial, "hparams",
                          t->hparams, "state", t->state, "job",
                          t->job > 0 ? json_integer((json_int_t)t->job) : json_null(), "latest",
                          value_json(t->has_latest, t->latest_step, t->latest), "best",
                          value_json(t->has_best, t->best_step, t->best));
    json_object_set_new(o, "steps", json_integer(t->step >= 0 ? (json_int_t)t->step : 0));
    json_object_set_new(o, "reason", t->reason[0] ? json_string(t->reason) : json_null());
    if (s->searcher == TD_SEARCH_ASHA) rungs_json(s, t, o);
    if (s->searcher == TD_SEARCH_PBT) { /* the step it trains to or is paused at; its exploits */
        long to = t->stop_at > 0 ? t->stop_at : s->max_steps;
        json_object_set_new(o, "generation", json_integer((json_int_t)((to - 1) / s->interval)));
        json_object_set_new(o, "stop_at", json_integer((json_int_t)to));
        json_object_set_new(o, "exploits", json_integer(t->exploits));
    }
    return o;
}

typedef struct pick {
    long want, before, after; /* -1: none */
} pick;

static void consider(void *ctx, const td_db_checkpoint *c) {
    pick *p = ctx;
    if (c->step <= p->want && c->step > p->before) p->before = c->step;
    if (c->step > p->want && (p->after < 0 || c->step < p->after)) p->after = c->step;
}

static json_t *best_json(td_experiments *x, const td_exp_trial *t) {
    if (!t) return json_null();
    pick p = {t->best_step, -1, -1};
    td_reply_error e;
    (void)td_jobs_checkpoints(x->jobs, t->job, -1, consider, &p, &e); /* none: no checkpoint */
    long step = p.before >= 0 ? p.before : p.after;
    json_t *ck = json_null();
    if (step >= 0) {
        char url[96], archive[96];
        snprintf(url, sizeof url, "/v1/jobs/%ld/checkpoints/%ld", t->job, step);
        snprintf(archive, sizeof archive, "/v1/jobs/%ld/checkpoints/%ld.tar", t->job, step);
        ck = json_pack("{s:I, s:s, s:s}", "step", (json_int_t)step, "url", url, "archive_url",
                       archive);
    }
    return json_pack("{s:i, s:I, s:O, s:f, s:I, s:o}", "trial", t->trial, "job", (json_int_t)t->job,
                     "hparams", t->hparams, "value", t->best, "step", (json_int_t)t->best_step,
                     "checkpoint", ck);
}

/* ASHA's choices in the searcher's object, its rungs' steps among them. */
static void asha_json(const td_exp_spec *s, json_t *searcher) {
    json_t *steps = json_array();
    for (int k = 0; k < s->n_rungs; k++)
        json_array_append_new(steps, json_integer((json_int_t)s->rung_steps[k]));
    json_object_set_new(searcher, "max_trials", json_integer(s->max_trials));
    json_object_set_new(searcher, "max_steps", json_integer((json_int_t)s->max_steps));
    json_object_set_new(searcher, "reduction_factor", json_integer(s->reduction_factor));
    json_object_set_new(searcher, "rungs", json_integer(s->n_rungs));
    json_object_set_new(searcher, "rung_steps", steps);
    json_object_set_new(searcher, "promotion", json_string(s->promote_async ? "async" : "rung"));
}

/* PBT's choices in the searcher's object. */
static void pbt_json(const td_exp_spec *s, json_t *searcher) {
    json_object_set_new(searcher, "population", json_integer(s->max_trials));
    json_object_set_new(searcher, "max_steps", json_integer((json_int_t)s->max_steps));
    json_object_set_new(searcher, "interval", json_integer((json_int_t)s->interval));
    json_object_set_new(searcher, "quantile", json_real(s->quantile));
    json_object_set_new(searcher, "perturb", json_pack("[f, f]", s->perturb_lo, s->perturb_hi));
    json_object_set_new(searcher, "resample_probability", json_real(s->resample_probability));
}

/* What every rendering has: the body's choices and the counts. */
static json_t *summary(const experiment *ex) {
    enum { N = 7 };
    int counts[N] = {0}; /* pending, queued, running (and restarting), paused, and the ends */
    static const char *const names[N] = {"pending",   "queued", "running",  "paused",
                                         "succeeded", "failed", "cancelled"};
    for (int t = 0; t < ex->n_trials; t++) {
        const char *st = ex->trials[t].state;
        int k = 0;
        while (k < N && strcmp(names[k], st) != 0) k++;
        if (strcmp(st, "restarting") == 0) k = 2;
        if (k < N) counts[k]++;
    }
    json_t *c = json_object();
    for (int k = 0; k < N; k++) json_object_set_new(c, names[k], json_integer(counts[k]));
    json_t *o = json_pack(
        "{s:I, s:s, s:s, s:o, s:o, s:o, s:{s:I, s:s}, s:{s:s, s:s, s:s}, s:i, s:i, s:I, s:i, s:o}",
        "id", (json_int_t)ex->row.id, "name", ex->row.name, "state",
        ex->paused && ex->state == TD_EXP_RUNNING ? "paused" : td_exp_state_names[ex->state],
        "reason", ex->row.reason[0] ? json_string(ex->row.reason) : json_null(), "created_at",
        time_json(ex->row.created_at), "finished_at", time_json(ex->row.finished_at), "owner",
        "token", (json_int_t)ex->row.owner, "name", ex->row.owner_name, "searcher", "type",
        td_exp_searcher_names[ex->spec.searcher], "metric", ex->spec.metric, "mode",
        ex->spec.maximize ? "max" : "min", "trials_total", ex->n_trials, "max_concurrent",
        ex->spec.max_concurrent, "seed", (json_int_t)ex->spec.seed, "priority", ex->spec.priority,
        "counts", c);
    if (ex->spec.searcher == TD_SEARCH_ASHA) asha_json(&ex->spec, json_object_get(o, "searcher"));
    if (ex->spec.searcher == TD_SEARCH_PBT) pbt_json(&ex->spec, json_object_get(o, "searcher"));
    const td_exp_trial *b = td_exp_best(ex);
    json_object_set_new(o, "best",
                        b ? json_pack("{s:i, s:I, s:f}", "trial", b->trial, "job",
                                      (json_int_t)b->job, "value", b->best)
                          : json_null());
    return o;
}

static void put(json_t *o, td_buf *out) {
    TD_ASSERT(o, "json_pack of an experiment failed");
    char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    TD_CHECK_ALLOC(text, "rendering an experiment");
    td_buf_puts(out, text);
    free(text);
}

void td_exp_render_summary(const experiment *ex, td_buf *out) {
    put(summary(ex), out);
}

void td_exp_render(td_experiments *x, const experiment *ex, td_buf *out) {
    json_t *o = summary(ex);
    json_t *body = json_loads(ex->row.spec, 0, NULL);
    json_object_set(o, "space",
                    json_is_object(body) ? json_object_get(body, "space") : json_null());
    json_decref(body);
    json_t *trials = json_array();
    for (int t = 0; t < ex->n_trials; t++)
        json_array_append_new(trials, td_exp_trial_json(&ex->spec, &ex->trials[t]));
    json_object_set_new(o, "trials", trials);
    json_object_set_new(o, "best", best_json(x, td_exp_best(ex)));
    put(o, out);
    td_buf_puts(out, "\n");
}
