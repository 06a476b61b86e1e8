/* The training loop: spec in, metrics lines out.
 *
 * Metrics go to `metrics` as one JSON object per line (the daemon and scripts parse them);
 * human-readable progress goes to `log`. Every error (data, shapes, divergence) comes back as -1
 * with err set; nothing here exits the process.
 */
#ifndef TD_TRAIN_H
#define TD_TRAIN_H

#include "td_spec.h"

#include <stdio.h>

typedef struct td_train_result {
    long steps;
    int epochs_done;
    double last_loss;
    bool has_val;
    double val_loss, val_acc;
} td_train_result;

int td_train_run(const td_job *job, FILE *metrics, FILE *log, td_train_result *result, td_err *err);

#endif
