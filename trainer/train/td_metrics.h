/* Metric lines: what a training process reports, one compact JSON object a line on its metrics
 * stream (traind-worker's stdout), each flushed as it is written so a reader sees it at once.
 * The daemon reads them (service/jobs/td_job_output.c, td_job_recover.c), as do users' scripts and
 * the tests (api/README.md, "Metric lines"). Their event names are these constants: the writer
 * and every reader compare with them. Keys come in a fixed order and numbers in fixed formats
 * (td_metrics.c): readers may compare lines as text. */
#ifndef TD_METRICS_H
#define TD_METRICS_H

#include <stdbool.h>
#include <stdio.h>

#define TD_EVENT_TRAIN      "train" /* every log.every_steps steps, and at the last */
#define TD_EVENT_EVAL       "eval"  /* after an epoch (and for --eval) when there is data.val */
#define TD_EVENT_CHECKPOINT "checkpoint" /* a checkpoint saved: its step and directory */
#define TD_EVENT_DONE       "done"       /* the run finished (not when stopped early) */
#define TD_EVENT_SAMPLE     "sample"     /* a language model's text at an evaluation */

typedef struct td_metric_train {
    long step;
    int epoch;            /* from 1 */
    double loss;          /* the mean over the interval since the last train line */
    double lr;            /* the step's learning rate (a float, widened) */
    double samples_per_s; /* over this process's part of the interval, all ranks' samples */
    double step_ms;
    long total_steps; /* the run's: what a progress bar runs to */
    int epochs;       /* the run's (train.epochs; max_steps may end it sooner) */
    bool gpu;         /* then the GPU memory this process holds, now and at most */
    double gpu_mem_mb, gpu_mem_peak_mb;
    bool fp16; /* then fp16's dynamic loss scale and the steps it skipped */
    double loss_scale;
    long skipped_steps;
} td_metric_train;

typedef struct td_metric_eval {
    int epoch; /* epochs completed */
    long step;
    double val_loss, val_acc;
    /* a language model's (text and tokens data): perplexity = exp(val_loss), and, when
     * train.eval_iters is set, loss: the training loss estimated on eval_iters random batches of
     * training windows (nanoGPT's estimate_loss); NaN: not estimated */
    bool language_model;
    double loss;
} td_metric_eval;

typedef struct td_metric_done {
    long step;
    int epochs;   /* epochs completed */
    double loss;  /* the last step's (CPU) or the last interval's (GPU) */
    bool has_val; /* then the final evaluation's */
    double val_loss, val_acc;
    double samples_per_s, elapsed_s; /* over what this process ran */
} td_metric_done;

void td_metrics_train(FILE *out, const td_metric_train *m);
void td_metrics_eval(FILE *out, const td_metric_eval *m);
/* path: the checkpoint's directory (UTF-8, as the spec it came from) */
void td_metrics_checkpoint(FILE *out, long step, const char *path);
void td_metrics_done(FILE *out, const td_metric_done *m);
/* prompt and text: UTF-8 (the tokenizer's output; a byte tokenizer's invalid bytes are
 * replaced by U+FFFD first) */
void td_metrics_sample(FILE *out, long step, const char *prompt, const char *text);

#endif
