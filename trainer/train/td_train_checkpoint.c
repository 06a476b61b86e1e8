/* Checkpoints in and out of the trainer: the weights of model.init_from, everything of
 * resume_from, and saving (rank 0 writes, every rank waits for it) with its metric line. */
#include "train/td_train_private.h"

#include "train/td_metrics.h"

#include <jansson.h>
#include <stdlib.h>

/* Weights from init_from, then everything from resume_from. */
int td_train_restore(trainer *t, td_err *err) {
    const td_job *job = t->job;
    if (job->model.init_from[0] &&
        td_checkpoint_load_weights(job->model.init_from, &t->model, job->model.init_strict, t->log,
                                   err) != 0)
        return td_fail_prefix(err, "model.init_from");
    if (!job->checkpoint.resume_from[0]) return 0;
    char dir[TD_PATH_MAX + 32];
    if (td_checkpoint_resolve(job->checkpoint.resume_from, job->checkpoint.dir, dir, sizeof dir,
                              err) != 0)
        return -1;
    if (td_checkpoint_load(dir, &t->model, &t->optim, &t->state, err) != 0)
        return td_fail_prefix(err, "resume_from");
    if (t->state.seed != job->train.seed)
        return td_fail(err,
                       "resume_from: %s was trained with train.seed %llu but the spec says "
                       "%llu; the data order would differ",
                       dir, (unsigned long long)t->state.seed, (unsigned long long)job->train.seed);
    t->last_saved_step = t->state.step;
    fprintf(t->log, "[traind] resumed from %s at step %ld (epoch %d, batch %d)\n", dir,
            t->state.step, t->state.epoch + 1, t->state.batch);
    return 0;
}

/* model.safetensors' __metadata__: "format": "pt" as PyTorch's writers put it, and what makes the
 * file usable alone (traind-worker sample): the spec it was trained by, the text's tokenizer and
 * the step. Values are strings, as the format requires. */
static char *weights_metadata(const trainer *t) {
    char step[24];
    snprintf(step, sizeof step, "%ld", t->state.step);
    json_t *meta = json_pack("{ss ss ss}", "format", "pt", "traind.step", step, "traind.job",
                             t->job->json ? t->job->json : "{}");
    TD_CHECK_ALLOC(meta, "for the checkpoint's metadata");
    if (t->tokenizer.vocab_size > 0) {
        char *tokenizer = td_tokenizer_to_json(&t->tokenizer);
        json_object_set_new(meta, "traind.tokenizer", json_string(tokenizer));
        free(tokenizer);
    }
    char *text = json_dumps(meta, JSON_COMPACT | JSON_ENSURE_ASCII);
    TD_CHECK_ALLOC(text, "for the checkpoint's metadata");
    json_decref(meta);
    return text;
}

int td_train_save(trainer *t, td_err *err) {
    if (!t->job->checkpoint.dir[0] || t->last_saved_step == t->state.step) return 0;
    /* the open logging interval's loss is part of the state: fetch it from the device */
    if (t->gpu && td_train_gpu_flush_loss(t, err) != 0) return -1;
    if (!t->rank0) { /* the replicas are identical: rank 0 writes, the others wait for it */
        t->last_saved_step = t->state.step;
        return td_train_barrier(t, err);
    }
    if (t->gpu && t->gpu_api->download(t->gpu, &t->model, &t->optim, err) != 0) return -1;
    char path[TD_PATH_MAX + 32];
    char *metadata = weights_metadata(t);
    int rc = td_checkpoint_save(t->job->checkpoint.dir, &t->model, &t->optim, &t->state,
                                t->job->checkpoint.keep, metadata, path, sizeof path, err);
    free(metadata);
    if (rc != 0) return -1;
    t->last_saved_step = t->state.step;
    td_metrics_checkpoint(t->metrics, t->state.step, path);
    /* no rank races into the next collective while the save is under way */
    return td_train_barrier(t, err);
}
