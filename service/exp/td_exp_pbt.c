/* Population-based training (Jaderberg et al., "Population Based Training of Neural Networks",
 * 2017), as Ray Tune's PBT scheduler does it with truncation selection: the population trains in
 * generations of `interval` steps on the pause machinery ASHA uses (each trial's job stops after
 * the generation's last step, checkpointed, its slots freed). Once every trial is paused there,
 * they are ranked by the metric they reported at that step; each trial of the bottom quantile
 * takes the checkpoint of a trial of the top quantile (exploit: td_jobs_exploit_trial copies it)
 * and that trial's values perturbed (explore), and all go on to the next generation's end.
 *
 * Unlike Ray Tune's asynchronous PBT, a generation is decided with the whole population at one
 * step: every trial is judged on the same number of steps, and the decision is a function of
 * what the trials reported, the seed and the step alone, so a daemon that comes back in the
 * middle of one decides it again alike (an exploit made twice copies the same files). */
#include "service/exp/td_exp_private.h"

#include "core/td_rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

long td_exp_pbt_next_stop(const td_exp_spec *s, long at) {
    return at + s->interval < s->max_steps ? at + s->interval : 0;
}

/* Whether t is out of the population: it failed or was cancelled (a trial that ran to its end
 * stays in: it went past every generation). */
static bool dropped(const td_exp_trial *t) {
    return t->made && (t->job <= 0 || (t->final && strcmp(t->state, "succeeded") != 0));
}

long td_exp_pbt_boundary(const experiment *ex) {
    long at = 0;
    for (int i = 0; i < ex->n_trials; i++) {
        const td_exp_trial *t = &ex->trials[i];
        if (!t->made) return 0;
        if (t->final || t->job <= 0) continue; /* (one that ended early is out of the race) */
        if (!t->paused || t->stop_at <= 0) return 0;
        if (at && t->stop_at != at) return 0;
        at = t->stop_at;
    }
    return at;
}

bool td_exp_pbt_decided(const experiment *ex, long at) {
    if (ex->pbt_decided >= at) return true;
    for (int i = 0; i < ex->n_trials; i++) {
        const td_exp_trial *t = &ex->trials[i];
        if (t->made && !dropped(t) && (t->stop_at == 0 || t->stop_at > at)) return true;
    }
    return false;
}

typedef struct ranked {
    const td_exp_trial *t;
    bool maximize; /* (qsort gives its comparison no context) */
} ranked;

/* Better first by the latest value (the one at the generation's end: the trial stopped there);
 * one that reported nothing last; ties by trial number. */
static int by_value(const void *a, const void *b) {
    const td_exp_trial *x = ((const ranked *)a)->t, *y = ((const ranked *)b)->t;
    if (x->has_latest != y->has_latest) return x->has_latest ? -1 : 1;
    if (x->has_latest && x->latest != y->latest)
        return td_exp_better(x->latest, y->latest, ((const ranked *)a)->maximize) ? -1 : 1;
    return x->trial - y->trial;
}

/* A number times perturb_lo or perturb_hi (a coin's choice), kept within its range; an integer
 * rounded. */
static json_t *scaled(const td_exp_spec *s, const td_exp_dim *d, json_t *v, td_rng *r) {
    double factor = td_rng_below(r, 2) ? s->perturb_hi : s->perturb_lo;
    double was = json_number_value(v), x = was * factor;
    if (d->kind == TD_DIM_INT) { /* a step at least, where rounding would keep it (1 x 1.2) */
        x = (double)llround(x);
        if (x == was && factor != 1) x += factor > 1 ? 1 : -1;
    }
    x = x < d->lo ? d->lo : x > d->hi ? d->hi : x;
    return d->kind == TD_DIM_INT ? json_integer((json_int_t)x) : json_real(x);
}

/* A choice's (or a grid's) neighbour: the value before or after it in the list. */
static json_t *neighbour(const td_exp_dim *d, json_t *v, td_rng *r) {
    size_t n = json_array_size(d->values), at = 0;
    while (at < n && !json_equal(json_array_get(d->values, at), v)) at++;
    bool up = td_rng_below(r, 2) != 0;
    if (at == n) return td_exp_draw(d, r); /* not one of its values: drawn afresh */
    if (up && at + 1 < n) at++;
    if (!up && at > 0) at--;
    return json_deep_copy(json_array_get(d->values, at));
}

/* The source's values, explored. */
static json_t *explore(const td_exp_spec *s, const json_t *from, td_rng *r) {
    json_t *h = json_object();
    for (int i = 0; i < s->n_dims; i++) {
        const td_exp_dim *d = &s->dims[i];
        json_t *v = json_object_get(from, d->path), *next;
        if (!v || td_exp_unit(r) < s->resample_probability)
            next = td_exp_draw(d, r);
        else if (d->kind == TD_DIM_GRID || d->kind == TD_DIM_CHOICE)
            next = neighbour(d, v, r);
        else
            next = json_is_number(v) ? scaled(s, d, v, r) : td_exp_draw(d, r);
        json_object_set_new(h, d->path, next);
    }
    return h;
}

int td_exp_pbt_plan(const experiment *ex, long at, td_pbt_exploit *out) {
    const td_exp_spec *s = &ex->spec;
    ranked *list = td_calloc((size_t)ex->n_trials + 1, sizeof *list);
    int n = 0;
    for (int i = 0; i < ex->n_trials; i++) {
        const td_exp_trial *t = &ex->trials[i];
        if (t->made && !dropped(t) && !t->final && t->paused && t->stop_at == at)
            list[n++] = (ranked){t, s->maximize};
    }
    qsort(list, (size_t)n, sizeof *list, by_value);
    int q = (int)floor(n * s->quantile);
    if (q < 1 && n >= 2) q = 1; /* a population of 2 or 3 still exploits */
    if (q > n / 2) q = n / 2;
    int made = 0;
    for (int k = 0; k < q && list[0].t->has_latest; k++) {
        const td_exp_trial *target = list[n - q + k].t;
        td_rng r;
        td_rng_seed_for(&r, s->seed, "pbt", (uint64_t)at * 1024 + (uint64_t)target->trial);
        const td_exp_trial *source = list[td_rng_below(&r, (uint64_t)q)].t;
        if (!source->has_latest) continue; /* (the top reported nothing: nothing to take) */
        out[made++] = (td_pbt_exploit){target->trial, source->trial,
                                       explore(s, source->hparams, &r), n - q + k + 1, n};
    }
    free(list);
    return made;
}
