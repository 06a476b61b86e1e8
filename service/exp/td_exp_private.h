/* Inside the experiments module (td_experiments.h), shared by its files, lowest first; each
 * calls only the ones listed before it (tests/style/call_graph.py checks):
 *   td_exp_spec.c      an experiment's body read and checked: the space, the searcher
 *   td_exp_search.c    the searchers: how many trials, and each one's hyperparameters
 *   td_exp_asha.c      ASHA's rungs: which paused trial goes on, which stops there
 *   td_exp_pbt.c       PBT's generations: which trial exploits which, and its new values
 *   td_exp_trial.c     a trial's body, what its metric lines say, the best trial
 *   td_exp_events.c    an experiment's events, for its stream
 *   td_exp_render.c    an experiment's JSON
 *   td_experiments.c   the table and the API's calls
 *   td_exp_driver.c    the thread (started, stopped): trials made, followed, the experiment's end
 * Every function here runs with x->mu held unless it says otherwise. */
#ifndef TD_EXP_PRIVATE_H
#define TD_EXP_PRIVATE_H

#include "service/exp/td_experiments.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum {
    TD_EXP_MAX_TRIALS = 1000,    /* trials of one experiment, at most */
    TD_EXP_MAX_DIMS = 32,        /* paths in its space */
    TD_EXP_MAX_VALUES = 1000,    /* values of one grid or choice */
    TD_EXP_MAX_CONCURRENT = 256, /* unfinished trials at a time, at most */
    TD_EXP_PATH_MAX = 256,
    TD_EXP_VALUE_MAX = 2048,    /* bytes of one value of a grid or choice, as JSON */
    TD_EXP_HPARAMS_MAX = 65536, /* bytes of a trial's values: they go in its environment */
    TD_EXPERIMENTS_KEPT_PER_TOKEN = 1000, /* a token's experiments, ended ones too */
    TD_EXP_BODY_MAX = 256 * 1024,         /* bytes of an experiment's body */
    TD_EXP_MAX_RUNGS = 8,                 /* ASHA's rungs, the last at max_steps */
};

/* ---- td_exp_spec.c ---- */
typedef enum { TD_DIM_GRID, TD_DIM_CHOICE, TD_DIM_UNIFORM, TD_DIM_LOG_UNIFORM, TD_DIM_INT } td_dim;
typedef struct td_exp_dim {
    char path[TD_EXP_PATH_MAX]; /* "train.optimizer.lr", "model.layers[2].width" */
    td_dim kind;
    json_t *values; /* a grid's or a choice's */
    double lo, hi;  /* a range's (an int's inclusive) */
} td_exp_dim;
typedef enum { TD_SEARCH_GRID, TD_SEARCH_RANDOM, TD_SEARCH_ASHA, TD_SEARCH_PBT } td_search;
typedef struct td_exp_spec {
    char name[128];
    json_t *job;      /* the base job */
    td_exp_dim *dims; /* sorted by path: the order grids are walked and values drawn in */
    int n_dims;
    td_search searcher;
    char metric[64];
    bool maximize;
    int max_trials; /* random, asha: how many; pbt: the population; grid: a cap (0: none) */
    /* asha: a trial trains to rung_steps[0], is paused there, and goes on to the next rung only
     * while its metric there is in the top 1/reduction_factor of its rung's; rung_steps[k] is
     * max_steps / reduction_factor^(n_rungs - 1 - k). promote_async: as soon as it is among the
     * top of the trials that reached the rung so far (ASHA's rule; some promoted early may not
     * be in the rung's final top), else once every trial of the rung has reached it
     * (successive halving: the counts are exact, whatever the order trials run in). */
    long max_steps; /* asha, pbt: the steps of a whole trial */
    int reduction_factor, n_rungs;
    long rung_steps[TD_EXP_MAX_RUNGS];
    bool promote_async;
    /* pbt: the population trains in generations of `interval` steps; once every trial is
     * paused at a generation's end, each of the bottom `quantile` takes the checkpoint of one of
     * the top (exploit) and that trial's values perturbed (explore): a number multiplied by
     * perturb_lo or perturb_hi, a choice moved to a neighbour, or, with resample_probability,
     * any of them drawn again from the space */
    long interval;
    double quantile, perturb_lo, perturb_hi, resample_probability;
    int max_concurrent;
    uint64_t seed;
    int priority;
} td_exp_spec;
/* Whether the searcher stops its trials on the way (ASHA at rungs, PBT at generations' ends):
 * its trials' jobs pause at stop_at_step, and run max_steps in all. */
static inline bool td_exp_pauses(const td_exp_spec *s) {
    return s->searcher == TD_SEARCH_ASHA || s->searcher == TD_SEARCH_PBT;
}
/* Reads and checks body; 400 naming the JSON path at fault. */
int td_exp_spec_parse(td_exp_spec *s, const char *body, size_t len, td_reply_error *e);
void td_exp_spec_free(td_exp_spec *s);
extern const char *const td_exp_searcher_names[];

/* ---- td_exp_search.c ---- */
int td_exp_trial_count(const td_exp_spec *s); /* the trials the searcher makes in all */
struct td_rng;
double td_exp_unit(struct td_rng *r);                       /* uniform in [0, 1) */
json_t *td_exp_draw(const td_exp_dim *d, struct td_rng *r); /* a value of d's, drawn */
/* Trial t's hyperparameters, {path: value} (new reference): a grid's t-th point (the last path
 * fastest), or t's draw from the seed (independent of every other trial's). */
json_t *td_exp_hparams(const td_exp_spec *s, int t);

/* ---- td_exp_asha.c ---- */
struct experiment;
/* The rung a trial whose job stops after stop_at goes to (0: the last, at max_steps), and back. */
int td_exp_asha_rung(const td_exp_spec *s, long stop_at);
long td_exp_asha_stop_at(const td_exp_spec *s, int rung);
struct td_exp_trial;
/* Whether trial t has a result at rung k: it went past it, is paused there, or ended there
 * having run its course (a run shorter than the rung's step finishes early). A trial that failed
 * has none. */
bool td_exp_asha_reached(const struct td_exp_trial *t, int k);
/* The searcher's next move on the experiment's paused trials, one at a time (the driver makes it
 * and asks again): promote one to its next rung (only when may_start: a trial may start under
 * max_concurrent), stop one at its rung for good, or nothing. */
typedef struct td_asha_move {
    enum { TD_ASHA_NONE, TD_ASHA_PROMOTE, TD_ASHA_STOP } what;
    int trial, rung; /* rung: the one it is paused at */
    int place, of;   /* its place in the rung (from 1), of how many trials reached it */
} td_asha_move;
td_asha_move td_exp_asha_next(const struct experiment *ex, bool may_start);

/* ---- td_exp_pbt.c ---- */
/* The step a trial paused at a generation's end `at` trains to next (0: its end). */
long td_exp_pbt_next_stop(const td_exp_spec *s, long at);
/* The generation's end every unfinished trial is paused at (all made), or 0. */
long td_exp_pbt_boundary(const struct experiment *ex);
/* Whether the generation that ends at `at` was decided: this daemon did, or a trial went past. */
bool td_exp_pbt_decided(const struct experiment *ex, long at);
/* A generation's exploits: the bottom quantile's trials by their metric at its end, each with
 * the top trial it takes from (a draw from the experiment's seed, the generation and the
 * trial: a daemon that decides again decides alike) and its new values (a new reference). */
typedef struct td_pbt_exploit {
    int target, source;
    json_t *hparams;
    int place, of; /* the target's place (from 1) among the trials paused there, of how many */
} td_pbt_exploit;
int td_exp_pbt_plan(const struct experiment *ex, long at, td_pbt_exploit *out); /* how many */

/* ---- td_exp_trial.c ---- */
/* Trial t's job body (allocated, compact JSON): the base job with hparams set at their paths,
 * the experiment's priority, a name of its own, and for a command job TRAIND_EXPERIMENT,
 * TRAIND_TRIAL and TRAIND_HPARAMS in its env. NULL with e when a path cannot be set. */
char *td_exp_trial_body(const td_exp_spec *s, long experiment, int t, json_t *hparams,
                        td_reply_error *e);
/* A trial's values as its stored job body holds them (PBT changes them between generations):
 * a command's TRAIND_HPARAMS, else each path's value; NULL when the body lacks one. */
json_t *td_exp_hparams_of_body(const td_exp_spec *s, const char *body);
/* What an experiment knows of one trial. */
typedef struct td_exp_trial {
    int trial;
    bool made; /* its job was made (job), or refused (reason says why) */
    long job;  /* 0: none */
    json_t *hparams;
    char state[16];
    bool final;
    long step;
    bool has_latest, has_best;
    double latest, best;
    long latest_step, best_step;
    long metrics_since; /* the step its metric lines were read to */
    char reason[512];
    /* asha: the rung it trains to or is paused at (its job's stop_at_step), and its metric at
     * each rung: the latest line at or before the rung's step */
    int rung;
    bool paused; /* at its rung (its job's stop_at_step) */
    bool held;   /* paused with its experiment (td_jobs_hold_trial), to go on from where it was */
    bool hold_sent;
    long stop_at; /* its job's stop_at_step */
    bool has_rung[TD_EXP_MAX_RUNGS];
    double rung_value[TD_EXP_MAX_RUNGS];
    int exploits; /* pbt: how many times it took another trial's checkpoint (this daemon's life) */
} td_exp_trial;
/* Folds a trial's metric events (a JSON array as td_jobs_metrics gives it) into its latest and
 * best value of s's metric, and its value at each of s's rungs. */
void td_exp_trial_fold(td_exp_trial *t, const char *metrics_json, const td_exp_spec *s);
typedef enum {
    TD_EXP_RUNNING,
    TD_EXP_SUCCEEDED,
    TD_EXP_FAILED,
    TD_EXP_CANCELLED,
    TD_EXP_N
} td_exp_state;
extern const char *const td_exp_state_names[TD_EXP_N];
typedef struct experiment {
    td_db_experiment row;
    td_exp_spec spec;
    td_exp_state state;
    bool cancel_requested;
    bool paused;          /* by request (POST .../pause): stored as the row's state "paused" */
    bool settled;         /* ended, and its trials' figures read (after a restart: once) */
    td_principal owner;   /* who its trials are submitted as */
    td_exp_trial *trials; /* [n_trials], by number: trials[t].trial == t */
    int n_trials;         /* the searcher's count (td_exp_trial_count) */
    double retry_at;      /* a refused submission (429, 503) is tried again then (monotonic) */
    /* its events (trial, best, state) in this daemon's life, for GET .../events */
    struct td_exp_event {
        long seq;
        char type[16];
        char *data;
    } * events;
    int n_events, cap_events;
    long last_seq;
    int best_said;    /* the best trial the last "best" event named; -1: none */
    long pbt_decided; /* pbt: the last generation's end this daemon decided (0: none) */
} experiment;
/* How many of its trials are unfinished (made, not ended; paused ones too). */
int td_exp_unfinished(const experiment *ex);
/* How many run or wait for slots: unfinished, not paused, not held (max_concurrent bounds
 * them). */
int td_exp_running(const experiment *ex);
/* The trial whose best metric is best, or NULL. */
const td_exp_trial *td_exp_best(const experiment *ex);
/* Whether a is better than b. */
static inline bool td_exp_better(double a, double b, bool maximize) {
    return maximize ? a > b : a < b;
}

/* ---- td_exp_events.c ---- */
/* Lock order: mu, then the jobs' lock (its calls), then wake_mu: the jobs module tells of a
 * trial's change under its own lock, so that call takes wake_mu alone. */
struct td_experiments {
    td_jobs *jobs;
    td_tokens *tokens;
    td_db *db;
    td_log *log;
    pthread_mutex_t mu;
    pthread_mutex_t wake_mu;
    pthread_cond_t wake;    /* a trial changed, an experiment came or was cancelled, or stop */
    pthread_cond_t changed; /* (with mu) an experiment has new events, or stop */
    long first_seq;         /* this life's first event id */
    bool poked;             /* (with wake_mu) */
    pthread_t thread;
    bool started;
    atomic_bool stopping;
    experiment **list; /* by id */
    int n, cap;
};
/* Appends an event to ex's log (data: a new reference taken over) and wakes its streams. Ids
 * start at x->first_seq, above every id an earlier daemon gave: a client that comes back with an
 * id of that life gets this life's events from the first. */
void td_exp_emit(td_experiments *x, experiment *ex, const char *type, json_t *data);
/* Its events after `after` (at most limit) to fn; how many. */
int td_exp_events_after(const experiment *ex, long after, int limit, td_db_event_fn fn, void *ctx);
void td_exp_free_events(experiment *ex);

/* ---- td_exp_render.c ---- */
/* The experiment as the API shows it: its body's choices, every trial (hyperparameters, job,
 * state, steps, latest and best metric) and the best trial with its checkpoint. */
void td_exp_render(td_experiments *x, const experiment *ex, td_buf *out);
/* One line of the list: without its trials. */
void td_exp_render_summary(const experiment *ex, td_buf *out);
json_t *td_exp_trial_json(const td_exp_spec *s, const td_exp_trial *t); /* as the API shows it */

/* ---- td_experiments.c ---- */
experiment *td_exp_find(td_experiments *x, long id);
void td_exp_save(td_experiments *x, experiment *ex); /* its row (state, end, reason) */
void td_exp_poke(td_experiments *x);                 /* wakes the thread (any lock or none held) */

#endif
