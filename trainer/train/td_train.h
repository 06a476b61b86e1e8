/* The training loop: spec in, metrics lines out.
 *
 * Metrics go to `metrics` as one JSON object per line (train/td_metrics.h: the daemon and
 * scripts parse them); human-readable progress goes to `log`. Every error (data, shapes,
 * divergence) comes back as -1 with err set; nothing here exits the process.
 */
#ifndef TD_TRAIN_H
#define TD_TRAIN_H

#include "dist/td_dist.h"
#include "spec/td_spec.h"
#include "dist/td_store.h"

#include <stdio.h>

/* Tests inject crashes through TRAIND_FAULT (core/td_fault.h), not through these options. */
typedef struct td_train_options {
    long stop_after_steps; /* stop (checkpoint and return) after this step; 0: run to the end */
    /* at that stop, after the checkpoint: a train line (unless one was just printed) and a
     * validation pass (with data.val), so that the step has its metrics: an experiment's
     * searcher judges a paused trial by them (TRAIND_STOP_AT_STEP) */
    bool report_at_stop;
    /* Data-parallel training (DDP): NULL or a world of 1 trains alone. Rank 0 hosts the
     * rendezvous store unless `store` is given (tests open it themselves to learn its port). */
    const td_dist *dist;
    td_store *store;
} td_train_options;

typedef struct td_train_result {
    bool stopped; /* by stop_after_steps, before the end */
    long steps;
    int epochs_done;
    double last_loss;
    bool has_val;
    double val_loss, val_acc;
} td_train_result;

/* Trains the job (resuming when it says so); opt may be NULL. */
int td_train_run(const td_job *job, const td_train_options *opt, FILE *metrics, FILE *log,
                 td_train_result *result, td_err *err);
/* Evaluates the weights of resume_from / init_from on data.val and prints the eval line. */
int td_train_evaluate(const td_job *job, FILE *metrics, FILE *log, td_train_result *result,
                      td_err *err);
/* traind-worker sample's settings: each left unset (NULL, or below 0) is the checkpoint's spec's
 * "sample" value, or without one nanoGPT's sample.py default. */
typedef struct td_generate_options {
    const char *prompt; /* "\n" */
    long tokens;        /* 500 */
    long top_k;         /* 200; 0: every token */
    double temperature; /* 0.8 */
    long long seed;     /* 1337 */
    int threads;        /* 1 */
} td_generate_options;

/* Text from a checkpoint of a run on text (its directory or its model.safetensors): the prompt
 * and `tokens` more, as the run's sample line at that step draws them with the same settings,
 * written to out (td_train_generate.c). */
int td_train_generate(const char *checkpoint, const td_generate_options *opt, FILE *out,
                      td_err *err);

#endif
