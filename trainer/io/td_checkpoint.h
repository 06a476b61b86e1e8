/* Checkpoints: a directory per save, `step-00001234/`, holding
 *   model.safetensors      every parameter and buffer under its PyTorch state_dict name
 *   optimizer.safetensors  "<param>.momentum_buffer" (SGD) or "<param>.exp_avg" and
 *                          "<param>.exp_avg_sq" (Adam, AdamW)
 *   state.json             where training stands: step, epoch and batch within it, the RNG
 *                          state, the optimizer's step count, the open logging interval
 * Written into a temporary directory, each file fsynced, then renamed into place and the parent
 * fsynced: a crash at any point leaves the previous checkpoint complete and the new one either
 * complete or absent (an abandoned .tmp-* directory is ignored and cleaned up later).
 */
#ifndef TD_CHECKPOINT_H
#define TD_CHECKPOINT_H

#include "core/td_model.h"
#include "core/td_optim.h"
#include "core/td_rng.h"

#include <stdbool.h>
#include <stddef.h>

/* A checkpoint's files, named once: the daemon serves and lists them by these names. */
#define TD_CHECKPOINT_MODEL     "model.safetensors"
#define TD_CHECKPOINT_OPTIMIZER "optimizer.safetensors"
#define TD_CHECKPOINT_STATE     "state.json"

/* Everything besides the tensors that a bitwise-exact resume needs. */
typedef struct td_train_state {
    long step; /* optimizer steps done */
    int epoch; /* 0-based epoch in progress (or next, when batch == 0) */
    int batch; /* next batch index within that epoch */
    uint64_t seed;
    td_rng dropout_rng;
    double interval_loss; /* the open logging interval, so the next train line matches */
    long interval_steps;
} td_train_state;

/* Saves into root/step-NNNNNNNN, keeping the newest `keep` (0: all). Writes the directory's path
 * to out. metadata: model.safetensors' __metadata__ (a JSON object of strings; NULL:
 * {"format":"pt"}). Tests kill a save halfway with TRAIND_FAULT=checkpoint:N (core/td_fault.h). */
int td_checkpoint_save(const char *root, const td_model *model, const td_optim *optim,
                       const td_train_state *state, int keep, const char *metadata, char *out,
                       size_t out_len, td_err *err);

/* "latest" (the newest complete checkpoint under root) or a checkpoint directory, checked to
 * hold the three files. */
int td_checkpoint_resolve(const char *resume_from, const char *root, char *dir, size_t len,
                          td_err *err);

/* Loads a checkpoint directory into the model, optimizer and state. Every tensor must match. */
int td_checkpoint_load(const char *dir, td_model *model, td_optim *optim, td_train_state *state,
                       td_err *err);

/* state.json's text (len bytes, named `name` in messages) into state and the optimizer's step
 * count and loss scaler (nothing else of optim is touched): what td_checkpoint_load reads from
 * the file, and the fuzzer's entry (tests/fuzz). */
int td_checkpoint_parse_state(const char *text, size_t len, const char *name, td_train_state *state,
                              td_optim *optim, td_err *err);

/* Writes every parameter and buffer of the model to a safetensors file by state_dict name, with
 * metadata as td_checkpoint_save's. */
int td_checkpoint_save_weights(const char *path, const td_model *model, const char *metadata,
                               td_err *err);

/* Loads weights (parameters and buffers) from a safetensors file by name. strict: missing,
 * unexpected and shape-mismatched names are one error listing them all; otherwise matching
 * names load and the rest are reported to log. */
int td_checkpoint_load_weights(const char *path, td_model *model, bool strict, FILE *log,
                               td_err *err);

#endif
