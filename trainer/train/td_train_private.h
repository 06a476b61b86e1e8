/* Inside the training module (td_train.h): the trainer, shared by its files:
 *   td_train.c             the entry points and the loop: epochs, batches, step, then the train
 *                          line, evaluation and checkpoints as they fall due
 *   td_train_setup.c       before the loop and after it: data, device, model, the GPU, loaders,
 *                          the banner; releasing it all
 *   td_train_dist.c        data parallel: joining the job, the collectives the loop uses, and
 *                          what a failed one reports
 *   td_train_step.c        one batch on the CPU or the GPU, one pass over data.val
 *   td_train_checkpoint.c  restoring (model.init_from, resume_from) and saving
 *   td_metrics.c           the metric lines (td_metrics.h: the daemon reads them too)
 * Only rank 0 prints metric lines and writes checkpoints; every rank runs the rest. */
#ifndef TD_TRAIN_PRIVATE_H
#define TD_TRAIN_PRIVATE_H

#include "train/td_train.h"

#include "core/td_device.h"
#include "data/td_data.h"
#include "dist/td_comm.h"
#include "base/td_clock.h"
#include "dist/td_reducer.h"
#include "gpu/td_gpu.h"
#include "io/td_checkpoint.h"

#include <stdint.h>

/* TRAIND_PROFILE's histogram of step times: 2% bins from 1 us reach past 10 minutes */
#define TD_PROFILE_BINS 1024

typedef struct trainer {
    const td_job *job;
    const td_train_options *opt;
    FILE *metrics, *log;
    td_dataset train, val;
    td_normalize norm;
    /* the spec's "sample" (td_train_sample.c): the text's tokenizer and the prompt's ids */
    td_tokenizer tokenizer;
    int32_t *prompt_ids;
    size_t n_prompt;
    float *sample_logits; /* on a GPU: the position's logits read back for sampling (or NULL) */
    td_model model;
    td_optim optim;
    td_loader *train_loader, *val_loader;
    /* a language model's training windows for the eval line's loss estimate (NULL: none) */
    td_loader *estimate_loader;
    float *dlogits;
    int classes;
    int positions; /* labels per sample: text's block_size (a loss at every position), else 1 */
    td_train_state state; /* position, RNG and open logging interval: what a checkpoint saves */
    long last_saved_step;
    double group_loss;   /* the CPU's loss over the open gradient-accumulation group */
    bool profiling;      /* TRAIND_PROFILE on the CPU: per-node times of the training steps */
    bool fuse_optimizer; /* the optimizer may run inside backward (td_train_step.c) */
    /* ...and where each step's time goes, seconds summed over the steps (td_train_profile.c) */
    struct {
        /* in a step's order */
        double loader, broadcast, forward, loss, backward, reduce_tail, optimizer;
        double step;   /* whole steps, from the loader wait to the optimizer */
        double t_step; /* when the running step began */
        /* each step's own work (all but its all-reduce tail), counted in bins 2% wide from
         * 1 us: its spread is what a synchronous step waits on (td_train_profile.c) */
        double tail_before; /* reduce_tail when the running step began */
        uint32_t own_hist[TD_PROFILE_BINS];
        long own_steps;
    } phase;

    /* data parallel: every rank a replica; rank 0 alone prints and checkpoints */
    const td_dist *dist;
    td_store *store;
    bool own_store;
    td_comm *comm;
    td_reducer *reducer; /* DDP's bucketed gradient all-reduce */
    bool rank0;
    td_loader_config train_cfg, val_cfg;
    td_sync sync; /* SyncBatchNorm's reductions, when train.sync_bn */

    /* the device: a GPU when gpu is set, and then NCCL carries the collectives when gpu_ddp */
    td_device_plan device;
    const td_gpu_api *gpu_api; /* the backend's functions (gpu/td_gpu.h), set with gpu */
    td_gpu *gpu;
    bool gpu_ddp;
    bool graph_off;  /* CUDA graphs off by the spec, or after a failed capture */
    bool graph_warm; /* one full step ran op by op: lazy library setup is done before capture */
} trainer;

/* td_train_profile.c: TRAIND_PROFILE's step phases (seconds since t0 added to *phase) */
static inline void td_train_phase(const trainer *t, double *phase, double *t0) {
    if (!t->profiling) return;
    double now = td_clock_now();
    *phase += now - *t0;
    *t0 = now;
}
/* Ends the running step's profile: its time into phase.step, its own work into the histogram. */
void td_train_profile_step(trainer *t);
void td_train_print_phases(const trainer *t, long steps);

/* td_train_setup.c */
int td_train_setup(trainer *t, td_err *err); /* everything training and evaluation share */
void td_train_release(trainer *t);
int td_train_loader_workers(const trainer *t); /* data.num_workers, "auto" resolved */

/* td_train_dist.c */
int td_train_world(const trainer *t);
int td_train_join(trainer *t, td_err *err); /* DDP's setup; nothing for a world of one */
/* Averages (or sums) a few floats over the ranks: a step's loss, evaluation counts. */
int td_train_allreduce(trainer *t, float *v, size_t n, bool average, td_err *err);
int td_train_barrier(trainer *t, td_err *err);
/* After a collective failed: records err in the store, or adds the job's first failure to it;
 * returns -1. */
int td_train_collective_failed(trainer *t, td_err *err);

/* td_train_step.c: one batch of a gradient-accumulation group of `group` batches, `micro` its
 * index; the group's last batch steps the optimizer. On the CPU, *loss is then the step's loss
 * (the mean over ranks); on the GPU the loss stays on the device (td_train_gpu_flush_loss). */
int td_train_cpu_batch(trainer *t, const td_batch *b, td_run *run, float lr, int group, int micro,
                       double *loss, td_err *err);
int td_train_gpu_batch(trainer *t, const td_batch *b, td_run *run, float lr, int group, int micro,
                       td_err *err);
int td_train_gpu_flush_loss(trainer *t, td_err *err);
int td_train_gpu_seek_dropout(trainer *t, long batches, td_err *err);
int td_train_diverged(td_err *err, double loss, long step, int epoch);
/* Loss and accuracy over data.val, every sample counted once over all ranks. */
int td_train_eval_pass(trainer *t, double *val_loss, double *val_acc, td_err *err);
/* A language model's training loss, estimated as nanoGPT's estimate_loss does: the mean over
 * train.eval_iters batches per rank of random training windows (seeded by train.seed and the
 * step, apart from the training batches' stream, which it leaves as it was). NaN without
 * train.eval_iters, or for data that is not text or tokens. */
int td_train_estimate_loss(trainer *t, double *loss, td_err *err);
/* The spec's "sample" (td_train_sample.c): the tokenizer and the prompt, checked at setup; rank 0
 * writes a sample line at each evaluation. */
int td_train_sample_setup(trainer *t, td_err *err);
void td_train_sample(trainer *t);
void td_train_sample_release(trainer *t);
/* prompt and s->tokens more, drawn as sample.py does from a generator seeded by (s->seed,
 * stream); the model's input is block token ids, its output [block, vocab] (malloc'd ids) */
/* The logits [vocab] at `position` of one sample x (block_size token ids as floats), valid until
 * the next call; NULL when the device failed (err says why). */
typedef const float *(*td_logits_fn)(void *ctx, const float *x, size_t position, td_err *err);
int32_t *td_generate_with(td_logits_fn logits, void *ctx, int block, int vocab,
                          const td_sample_spec *s, const int32_t *prompt, size_t n_prompt,
                          uint64_t stream, td_err *err);
int32_t *td_generate(td_model *model, int block, int vocab, const td_sample_spec *s,
                     const int32_t *prompt, size_t n_prompt, uint64_t stream);
/* the ids' text, bytes that are not UTF-8 as U+FFFD (malloc'd) */
char *td_generate_text(const td_tokenizer *tk, const int32_t *ids, size_t n);

/* td_train_checkpoint.c */
int td_train_restore(trainer *t, td_err *err); /* model.init_from, then resume_from */
int td_train_save(trainer *t, td_err *err);    /* unless this step is saved already */

#endif
