/* ASHA (Li et al., "A System for Massively Parallel Hyperparameter Tuning", 2020): trials train
 * to a rung, are paused there with a checkpoint (their slots freed), and only the top
 * 1/reduction_factor of a rung go on to the next, resumed from that checkpoint: no step is
 * trained twice. Which trial moves is a function of what the trials reported alone (their
 * metric at each rung, their state), so a daemon that comes back decides as it would have. */
#include "service/exp/td_exp_private.h"

#include <stdlib.h>
#include <string.h>

int td_exp_asha_rung(const td_exp_spec *s, long stop_at) {
    for (int k = 0; k + 1 < s->n_rungs; k++)
        if (s->rung_steps[k] == stop_at) return k;
    return s->n_rungs - 1;
}

long td_exp_asha_stop_at(const td_exp_spec *s, int rung) {
    return rung + 1 < s->n_rungs ? s->rung_steps[rung] : 0;
}

bool td_exp_asha_reached(const td_exp_trial *t, int k) {
    if (!t->made || t->job <= 0) return false;
    if (t->rung > k) return true;
    return t->rung == k && (t->paused || strcmp(t->state, "succeeded") == 0);
}

/* Whether trial t may still reach rung k: it is on its way to a rung at or below it (or not
 * made yet: rung 0), or paused below it (a promotion not yet made: it waits for a slot). */
static bool may_reach(const td_exp_trial *t, int k) {
    if (!t->made) return true;
    if (t->job <= 0 || t->final) return false;
    return t->paused ? t->rung < k : t->rung <= k;
}

typedef struct ranked {
    const td_exp_trial *t;
    bool has, maximize; /* (qsort gives its comparison no context: each item carries the mode) */
    double v;
} ranked;

/* Better first; a trial that reported nothing at the rung last; ties by trial number. */
static int by_value(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->has != y->has) return x->has ? -1 : 1;
    if (x->has && x->v != y->v) return td_exp_better(x->v, y->v, x->maximize) ? -1 : 1;
    return x->t->trial - y->t->trial;
}

/* Rung k's move: its top quota's paused trials go on, and once the rung is complete (no trial
 * may reach it any more: every rung below has decided) the rest of its paused trials stop. */
static td_asha_move rung_move(const experiment *ex, int k, ranked *list, bool may_start) {
    td_asha_move none = {.what = TD_ASHA_NONE};
    int m = 0;
    bool complete = true;
    for (int i = 0; i < ex->n_trials; i++) {
        const td_exp_trial *t = &ex->trials[i];
        if (may_reach(t, k)) complete = false;
        if (!td_exp_asha_reached(t, k)) continue;
        list[m++] = (ranked){t, t->has_rung[k], ex->spec.maximize, t->rung_value[k]};
    }
    if (m == 0) return none;
    qsort(list, (size_t)m, sizeof *list, by_value);
    int eta = ex->spec.reduction_factor, quota = m / eta;
    if (complete && quota < 1) quota = 1; /* a rung of fewer than eta trials: its best goes on */
    if (!complete && !ex->spec.promote_async) quota = 0;
    for (int i = 0; i < m; i++) {
        const td_exp_trial *t = list[i].t;
        if (!t->paused || t->final || t->rung != k) continue;
        bool top = i < quota && list[i].has;
        if (top && may_start) return (td_asha_move){TD_ASHA_PROMOTE, t->trial, k, i + 1, m};
        if (!top && complete) return (td_asha_move){TD_ASHA_STOP, t->trial, k, i + 1, m};
    }
    return none;
}

td_asha_move td_exp_asha_next(const experiment *ex, bool may_start) {
    td_asha_move move = {.what = TD_ASHA_NONE};
    ranked *list = td_calloc((size_t)ex->n_trials + 1, sizeof *list);
    /* the highest rung first: a trial near its end frees its slots soonest */
    for (int k = ex->spec.n_rungs - 2; k >= 0 && move.what == TD_ASHA_NONE; k--)
        move = rung_move(ex, k, list, may_start);
    free(list);
    return move;
}
