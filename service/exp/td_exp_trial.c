/* One trial: its job's body (the base job with the trial's hyperparameters set at their paths),
 * and what its metric lines say of the searcher's metric. */
#include "service/exp/td_exp_private.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The next segment of path at *p: a name (into name) or an [index] (*index >= 0). */
static void segment(const char **p, char *name, size_t len, long *index) {
    *index = -1;
    if (**p == '[') {
        *index = strtol(*p + 1, (char **)p, 10);
        (*p)++; /* ']' (the path was checked: td_exp_spec.c) */
    } else {
        size_t n = strcspn(*p, ".[");
        snprintf(name, len, "%.*s", (int)n, *p);
        *p += n;
    }
    if (**p == '.') (*p)++;
}

/* Sets a copy of v at path in job (a value is never shared between the spec, the trials and the
 * bodies: what one changes, another must not see): objects on the way are made when missing; an
 * array's item must be there. */
static int set_path(json_t *job, const char *path, json_t *v, td_reply_error *e) {
    json_t *at = job;
    const char *p = path;
    char name[TD_EXP_PATH_MAX];
    for (;;) {
        long index;
        segment(&p, name, sizeof name, &index);
        bool last = *p == 0;
        json_t *next = NULL;
        if (index < 0 && json_is_object(at)) {
            next = json_object_get(at, name);
            if (last) return json_object_set_new(at, name, json_deep_copy(v)) == 0 ? 0 : -1;
            if (!next && p[0] != '[') { /* made when missing: optional sections */
                next = json_object();
                json_object_set_new(at, name, next);
            }
        } else if (index >= 0 && json_is_array(at) && (size_t)index < json_array_size(at)) {
            if (last) return json_array_set_new(at, (size_t)index, json_deep_copy(v)) == 0 ? 0 : -1;
            next = json_array_get(at, (size_t)index);
        }
        if (!next || (!json_is_object(next) && !json_is_array(next))) {
            char field[TD_EXP_PATH_MAX + 16];
            snprintf(field, sizeof field, "space.%s", path);
            return td_reply_fail(e, 400, "invalid_spec", field,
                                 "%s: the base job has no object or array on the way to this "
                                 "path (an array's item must be there)",
                                 field);
        }
        at = next;
    }
}

/* A command job's own environment gets the trial (its processes read TRAIND_HPARAMS), and under
 * ASHA and PBT the steps its whole run has (TRAIND_MAX_STEPS: its schedule's length;
 * TRAIND_STOP_AT_STEP says where an attempt stops). */
static void command_env(json_t *body, const td_exp_spec *s, long experiment, int t,
                        json_t *hparams) {
    json_t *env = json_object_get(body, "env");
    if (!env) {
        env = json_object();
        json_object_set_new(body, "env", env);
    }
    if (!json_is_object(env)) return; /* the job's own error: its check says so */
    char num[32];
    snprintf(num, sizeof num, "%ld", experiment);
    json_object_set_new(env, "TRAIND_EXPERIMENT", json_string(num));
    snprintf(num, sizeof num, "%d", t);
    json_object_set_new(env, "TRAIND_TRIAL", json_string(num));
    char *h = json_dumps(hparams, JSON_COMPACT | JSON_SORT_KEYS);
    json_object_set_new(env, "TRAIND_HPARAMS", json_string(h ? h : "{}"));
    free(h);
    if (td_exp_pauses(s)) {
        snprintf(num, sizeof num, "%ld", s->max_steps);
        json_object_set_new(env, "TRAIND_MAX_STEPS", json_string(num));
    }
}

/* Under ASHA and PBT a train job's run is max_steps long (its schedule spans them), wherever
 * its attempts stop. */
static void train_steps(json_t *body, const td_exp_spec *s) {
    json_t *train = json_object_get(body, "train");
    if (!td_exp_pauses(s) || !json_is_object(train)) return;
    json_object_set_new(train, "max_steps", json_integer((json_int_t)s->max_steps));
}

/* A command's environment holds strings: a number drawn for "env.NAME" goes there as its JSON
 * text (0.0123, 64). */
static json_t *as_env_value(const char *path, json_t *v) {
    if (strncmp(path, "env.", 4) != 0 || json_is_string(v)) return json_incref(v);
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_t *s = json_string(text ? text : "");
    free(text);
    return s;
}

char *td_exp_trial_body(const td_exp_spec *s, long experiment, int t, json_t *hparams,
                        td_reply_error *e) {
    json_t *body = json_deep_copy(s->job);
    const char *path;
    json_t *v;
    json_object_foreach(hparams, path, v) {
        json_t *value = as_env_value(path, v);
        int rc = set_path(body, path, value, e);
        json_decref(value);
        if (rc != 0) {
            json_decref(body);
            return NULL;
        }
    }
    char name[160];
    snprintf(name, sizeof name, "%.100s-trial-%d", s->name, t);
    json_object_set_new(body, "name", json_string(name));
    json_object_set_new(body, "priority", json_integer(s->priority));
    if (json_object_get(body, "command"))
        command_env(body, s, experiment, t, hparams);
    else
        train_steps(body, s);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) td_reply_fail(e, 400, "invalid_spec", "space", "the trial's job cannot be encoded");
    return text;
}

/* The value at path in job, or NULL. */
static json_t *get_path(json_t *job, const char *path) {
    json_t *at = job;
    const char *p = path;
    char name[TD_EXP_PATH_MAX];
    while (at && *p) {
        long index;
        segment(&p, name, sizeof name, &index);
        at = index < 0 ? json_object_get(at, name) : json_array_get(at, (size_t)index);
    }
    return at;
}

json_t *td_exp_hparams_of_body(const td_exp_spec *s, const char *body) {
    json_t *job = body ? json_loads(body, 0, NULL) : NULL;
    json_t *h = NULL;
    const char *text = json_string_value(
        json_object_get(json_object_get(job, "env"), "TRAIND_HPARAMS")); /* a command's, whole */
    if (text) {
        h = json_loads(text, 0, NULL);
    } else if (json_is_object(job)) {
        h = json_object();
        for (int i = 0; i < s->n_dims; i++) {
            json_t *v = get_path(job, s->dims[i].path);
            if (v) json_object_set_new(h, s->dims[i].path, json_deep_copy(v));
        }
    }
    json_decref(job);
    /* (a path missing, or a TRAIND_HPARAMS that is no object of them: size 0) */
    if (h && json_object_size(h) != (size_t)s->n_dims) h = (json_decref(h), NULL);
    return h;
}

/* One metric event: its metric value, when it has one, as of its step. */
static void fold_one(td_exp_trial *t, json_t *ev, const td_exp_spec *s) {
    json_t *v = json_object_get(ev, s->metric);
    json_t *st = json_object_get(ev, "step");
    if (!json_is_number(v) || !isfinite(json_number_value(v))) return;
    double x = json_number_value(v);
    long step = json_is_integer(st) ? (long)json_integer_value(st) : t->latest_step;
    t->has_latest = true;
    t->latest = x;
    t->latest_step = step;
    if (!t->has_best || td_exp_better(x, t->best, s->maximize)) {
        t->has_best = true;
        t->best = x;
        t->best_step = step;
    }
    for (int k = 0; s->searcher == TD_SEARCH_ASHA && k < s->n_rungs; k++)
        if (step <= s->rung_steps[k]) { /* (lines come in step order: the latest stays) */
            t->has_rung[k] = true;
            t->rung_value[k] = x;
        }
}

void td_exp_trial_fold(td_exp_trial *t, const char *metrics_json, const td_exp_spec *s) {
    json_t *a = json_loads(metrics_json, 0, NULL);
    size_t i;
    json_t *ev;
    long newest = -1;
    json_array_foreach(a, i, ev) {
        fold_one(t, ev, s);
        json_t *st = json_object_get(ev, "step");
        if (json_is_integer(st) && (long)json_integer_value(st) > newest)
            newest = (long)json_integer_value(st);
    }
    /* the newest step is read again next time: an evaluation may still come at the step of a
     * train line already read (a value read twice changes neither latest nor best) */
    if (newest - 1 > t->metrics_since) t->metrics_since = newest - 1;
    json_decref(a);
}

/* ---- the experiment's trials ---- */

const char *const td_exp_state_names[TD_EXP_N] = {"running", "succeeded", "failed", "cancelled"};

int td_exp_unfinished(const experiment *ex) {
    int n = 0;
    for (int t = 0; t < ex->n_trials; t++) n += ex->trials[t].job > 0 && !ex->trials[t].final;
    return n;
}

int td_exp_running(const experiment *ex) {
    int n = 0;
    for (int t = 0; t < ex->n_trials; t++) {
        const td_exp_trial *tr = &ex->trials[t];
        n += tr->job > 0 && !tr->final && !tr->paused && !tr->held;
    }
    return n;
}

const td_exp_trial *td_exp_best(const experiment *ex) {
    const td_exp_trial *best = NULL;
    for (int t = 0; t < ex->n_trials; t++) {
        const td_exp_trial *tr = &ex->trials[t];
        if (tr->has_best && (!best || td_exp_better(tr->best, best->best, ex->spec.maximize)))
            best = tr;
    }
    return best;
}
