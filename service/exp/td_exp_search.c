/* The searchers: how many trials an experiment makes, and each one's hyperparameters. Both are a
 * function of the experiment's body and the trial's number alone: a grid's t-th point, or t's
 * own draw from the seed, so that a daemon that comes back makes the missing trials exactly as
 * it would have, and a random search with the same seed draws the same trials on any machine
 * (td_rng: xoshiro256**, the engine's, bit for bit). */
#include "service/exp/td_exp_private.h"

#include "core/td_rng.h"

#include <math.h>

int td_exp_trial_count(const td_exp_spec *s) {
    if (s->searcher != TD_SEARCH_GRID) return s->max_trials;
    double points = 1;
    for (int i = 0; i < s->n_dims; i++) points *= (double)json_array_size(s->dims[i].values);
    if (s->max_trials > 0 && points > s->max_trials) return s->max_trials;
    return (int)points;
}

/* Uniform in [0, 1) with 53 random bits. */
double td_exp_unit(td_rng *r) {
    return (double)(td_rng_u64(r) >> 11) * 0x1p-53;
}

json_t *td_exp_draw(const td_exp_dim *d, td_rng *r) {
    switch (d->kind) {
    case TD_DIM_GRID:
    case TD_DIM_CHOICE:
        return json_deep_copy(
            json_array_get(d->values, td_rng_below(r, json_array_size(d->values))));
    case TD_DIM_UNIFORM:
        return json_real(d->lo + td_exp_unit(r) * (d->hi - d->lo));
    case TD_DIM_LOG_UNIFORM:
        return json_real(exp(log(d->lo) + td_exp_unit(r) * (log(d->hi) - log(d->lo))));
    case TD_DIM_INT:
        return json_integer((json_int_t)d->lo +
                            (json_int_t)td_rng_below(r, (uint64_t)(d->hi - d->lo) + 1));
    }
    return json_null();
}

json_t *td_exp_hparams(const td_exp_spec *s, int t) {
    json_t *h = json_object();
    if (s->searcher != TD_SEARCH_GRID) { /* ASHA and PBT draw as a random search does */
        td_rng r;
        td_rng_seed_for(&r, s->seed, "trial", (uint64_t)t);
        for (int i = 0; i < s->n_dims; i++)
            json_object_set_new(h, s->dims[i].path, td_exp_draw(&s->dims[i], &r));
        return h;
    }
    /* the grid's point t in mixed radix, the last path fastest; set in path order */
    size_t at[TD_EXP_MAX_DIMS];
    long rest = t;
    for (int i = s->n_dims - 1; i >= 0; i--) {
        size_t n = json_array_size(s->dims[i].values);
        at[i] = (size_t)rest % n;
        rest /= (long)n;
    }
    for (int i = 0; i < s->n_dims; i++)
        json_object_set_new(h, s->dims[i].path,
                            json_deep_copy(json_array_get(s->dims[i].values, at[i])));
    return h;
}
