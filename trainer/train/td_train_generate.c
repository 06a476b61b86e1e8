/* traind-worker sample: text from a checkpoint's model.safetensors alone. The file's metadata
 * holds the spec it was trained by (the model to build, the window) and the text's tokenizer
 * (train/td_train_checkpoint.c writes them), so neither the spec file nor the training text need
 * be at hand. With the spec's sample settings it draws what the run's `sample` line at that
 * step did: the same generator (sample.seed, step) and the same forward passes. */
#include "train/td_train_private.h"

#include "io/td_safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct source {
    char path[TD_PATH_MAX + 32];
    td_job job;
    td_tokenizer tokenizer;
    long step;
} source;

/* The spec, tokenizer and step from the file's metadata. */
static int read_metadata(source *src, td_err *err) {
    td_safetensors st;
    if (td_safetensors_read(&st, src->path, err) != 0) return -1;
    json_t *meta = st.metadata_json ? json_loads(st.metadata_json, 0, NULL) : NULL;
    td_safetensors_free(&st);
    const char *job = json_string_value(json_object_get(meta, "traind.job"));
    const char *tokenizer = json_string_value(json_object_get(meta, "traind.tokenizer"));
    const char *step = json_string_value(json_object_get(meta, "traind.step"));
    int rc = 0;
    if (!job) {
        rc = td_fail(err,
                     "%s: its metadata holds no traind.job: not a checkpoint of a traind run "
                     "(or one older than traind-worker sample)",
                     src->path);
    } else if (!tokenizer) {
        rc = td_fail(err,
                     "%s: the model was not trained on text (data.format \"text\"), so there "
                     "is no tokenizer to sample with",
                     src->path);
    } else if (td_job_load_string(&src->job, job, err) != 0) {
        rc = td_fail_prefix(err, "%s: its spec", src->path);
    } else if (td_tokenizer_from_json(&src->tokenizer, tokenizer, src->path, err) != 0) {
        rc = -1;
    }
    src->step = step ? atol(step) : 0;
    json_decref(meta);
    return rc;
}

/* The spec's model with the tokenizer's vocabulary, the file's weights in it (strict). */
static int load_model(source *src, td_model *model, int threads, td_err *err) {
    const td_job *job = &src->job;
    td_node_spec *nodes = td_malloc((size_t)job->model.n_nodes * sizeof *nodes);
    memcpy(nodes, job->model.nodes, (size_t)job->model.n_nodes * sizeof *nodes);
    if (job->model.vocab_from_data)
        td_preset_gpt_vocab(nodes, job->model.n_nodes, src->tokenizer.vocab_size);
    int rc = td_model_build(model, nodes, job->model.n_nodes, td_shape_flat(job->data.block_size),
                            1, threads, job->train.seed, 0, err);
    free(nodes);
    if (rc != 0) return td_fail_prefix(err, "%s: its spec's model", src->path);
    td_shape out = td_model_output_shape(model);
    if (out.h != job->data.block_size)
        return td_fail(err, "%s: the model outputs [%d, %d], not logits at each of %d positions",
                       src->path, out.h, out.c, job->data.block_size);
    return td_checkpoint_load_weights(src->path, model, true, NULL, err);
}

/* The options over the spec's sample settings over sample.py's defaults. */
static int resolve(const td_generate_options *opt, const td_job *job, td_sample_spec *s,
                   td_err *err) {
    const td_sample_spec *spec = job->sample.present ? &job->sample : NULL;
    *s = (td_sample_spec){.present = true,
                          .prompt = "\n",
                          .tokens = 500,
                          .top_k = 200,
                          .temperature = 0.8,
                          .seed = 1337};
    if (spec) *s = *spec;
    if (opt->prompt) {
        if (strlen(opt->prompt) >= sizeof s->prompt)
            return td_fail(err, "--prompt: %zu bytes; at most %zu", strlen(opt->prompt),
                           sizeof s->prompt - 1);
        snprintf(s->prompt, sizeof s->prompt, "%s", opt->prompt);
    }
    if (opt->tokens >= 0) s->tokens = (int)opt->tokens;
    if (opt->top_k >= 0) s->top_k = (int)opt->top_k;
    if (opt->temperature >= 0) s->temperature = opt->temperature;
    if (opt->seed >= 0) s->seed = (uint64_t)opt->seed;
    if (s->temperature <= 0) return td_fail(err, "--temperature: must be above 0");
    return 0;
}

int td_train_generate(const char *checkpoint, const td_generate_options *opt, FILE *out,
                      td_err *err) {
    source src = {0};
    td_sample_spec sample, *s = &sample;
    int threads = opt->threads > 0 ? opt->threads : 1;
    struct stat info;
    if (stat(checkpoint, &info) != 0)
        return td_fail(err, "%s: no such checkpoint directory or file", checkpoint);
    snprintf(src.path, sizeof src.path, S_ISDIR(info.st_mode) ? "%s/" TD_CHECKPOINT_MODEL : "%s",
             checkpoint);
    td_model model = {0};
    int32_t *prompt = NULL, *ids = NULL;
    size_t n_prompt = 0;
    int rc = read_metadata(&src, err);
    if (rc == 0) rc = resolve(opt, &src.job, s, err);
    if (rc == 0) rc = load_model(&src, &model, threads, err);
    if (rc == 0)
        rc = td_tokenizer_encode(&src.tokenizer, (const uint8_t *)s->prompt, strlen(s->prompt),
                                 "--prompt", &prompt, &n_prompt, err);
    if (rc == 0 && n_prompt == 0) rc = td_fail(err, "--prompt: empty; give at least a character");
    if (rc == 0) {
        ids = td_generate(&model, src.job.data.block_size, td_model_output_shape(&model).c, s,
                          prompt, n_prompt, (uint64_t)src.step);
        char *text = td_generate_text(&src.tokenizer, ids, n_prompt + (size_t)s->tokens);
        fprintf(out, "%s\n", text);
        free(text);
    }
    free(prompt);
    free(ids);
    if (model.nodes) td_model_free(&model);
    td_tokenizer_free(&src.tokenizer);
    td_job_free(&src.job);
    return rc;
}
