/* Feeds: a job spec's JSON text to td_job_load_string (trainer/spec), the worker's validator.
 * Why: every byte of it is a user's (POST /v1/jobs, traind-run's file), and what it accepts runs
 * unchecked in the training loop: besides the sanitizers, a spec it accepts must hold the
 * ranges the loop divides and indexes by. */
#include "fuzz_util.h"

#include "spec/td_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the training loop assumes of an accepted spec (trainer/train). */
static void check_accepted(const td_job *j) {
    FUZZ_CHECK(j->log.every_steps >= 1, "log.every_steps %d", j->log.every_steps);
    FUZZ_CHECK(j->train.batch_size >= 1 && j->train.eval_batch_size >= 1, "batch sizes %d, %d",
               j->train.batch_size, j->train.eval_batch_size);
    FUZZ_CHECK(j->train.epochs >= 1, "train.epochs %d", j->train.epochs);
    FUZZ_CHECK(j->train.max_steps >= 0, "train.max_steps %ld", j->train.max_steps);
    FUZZ_CHECK(j->train.threads >= 1, "train.threads %d", j->train.threads);
    FUZZ_CHECK(j->train.grad_accum >= 1, "train.grad_accum %d", j->train.grad_accum);
    FUZZ_CHECK(j->checkpoint.every_steps >= 0 && j->checkpoint.every_epochs >= 0 &&
                   j->checkpoint.keep >= 0,
               "checkpoint %ld/%d/%d", j->checkpoint.every_steps, j->checkpoint.every_epochs,
               j->checkpoint.keep);
    FUZZ_CHECK(j->model.n_nodes >= 0 && (j->model.n_nodes == 0 || j->model.nodes),
               "model: %d nodes", j->model.n_nodes);
    FUZZ_CHECK(j->model.num_classes >= 0, "model.num_classes %d", j->model.num_classes);
    FUZZ_CHECK(j->data.train.n_files >= 0 && j->data.train.n_files <= TD_MAX_FILES &&
                   j->data.val.n_files >= 0 && j->data.val.n_files <= TD_MAX_FILES,
               "data files %d, %d", j->data.train.n_files, j->data.val.n_files);
    FUZZ_CHECK(j->data.norm.channels >= 0 && j->data.norm.channels <= 4, "normalize: %d channels",
               j->data.norm.channels);
    FUZZ_CHECK(j->data.num_workers >= TD_WORKERS_AUTO && j->data.num_workers <= 64,
               "data.num_workers %d", j->data.num_workers);
    FUZZ_CHECK(j->data.format != TD_DATA_SYNTHETIC || j->data.train.size >= 1, "synthetic size %d",
               j->data.train.size);
    FUZZ_CHECK(memchr(j->name, 0, sizeof j->name) && memchr(j->checkpoint.dir, 0, TD_PATH_MAX),
               "unterminated text");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    td_job job;
    td_err err = {{0}};
    if (td_job_load_string(&job, text, &err) == 0) {
        check_accepted(&job);
        td_job_free(&job);
    } else {
        if (fuzz_debug()) fprintf(stderr, "refused: %s\n", err.msg);
        FUZZ_CHECK(err.msg[0], "a refusal without a message");
    }
    free(text);
    return 0;
}
