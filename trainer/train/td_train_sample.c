/* A language model's text at each evaluation, as nanoGPT's sample.py writes it: from the prompt,
 * one token at a time, the logits of the last position divided by the temperature, all but the
 * top_k most likely set aside, a draw from their softmax. No KV cache: each token is a forward
 * pass over the last block_size tokens (the model's input is fixed at block_size: shorter
 * contexts are padded after their end, which causal attention never reads). Rank 0 alone, from
 * a generator seeded by (sample.seed, step), so a resumed run writes the same text, and
 * `traind-worker sample` of that step's checkpoint with the same settings too. */
#include "train/td_train_private.h"

#include "core/td_rng.h"
#include "train/td_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int td_train_sample_setup(trainer *t, td_err *err) {
    const td_sample_spec *s = &t->job->sample;
    if (t->job->data.format != TD_DATA_TEXT) return 0;
    /* the tokenizer is kept with every checkpoint, sample or not */
    if (td_text_tokenizer(&t->job->data, &t->tokenizer, err) != 0) return -1;
    if (!s->present) return 0;
    if (td_tokenizer_encode(&t->tokenizer, (const uint8_t *)s->prompt, strlen(s->prompt),
                            "sample.prompt", &t->prompt_ids, &t->n_prompt, err) != 0)
        return -1;
    if (t->n_prompt == 0)
        return td_fail(err, "sample.prompt: empty; give at least one character (nanoGPT starts "
                            "from \"\\n\")");
    return 0;
}

void td_train_sample_release(trainer *t) {
    td_tokenizer_free(&t->tokenizer);
    free(t->prompt_ids);
    free(t->sample_logits);
    t->prompt_ids = NULL;
    t->sample_logits = NULL;
}

/* The next token from one position's logits (scratch: vocab floats). */
static int32_t draw(const td_sample_spec *s, const float *logits, int vocab, float *scratch,
                    td_rng *rng) {
    float threshold = -INFINITY;
    if (s->top_k > 0 && s->top_k < vocab) { /* the k-th largest: below it, never drawn */
        memcpy(scratch, logits, (size_t)vocab * sizeof *scratch);
        for (int k = 0; k < s->top_k; k++) { /* partial selection: k is small beside vocab */
            int best = k;
            for (int j = k + 1; j < vocab; j++)
                if (scratch[j] > scratch[best]) best = j;
            float tmp = scratch[k];
            scratch[k] = scratch[best];
            scratch[best] = tmp;
        }
        threshold = scratch[s->top_k - 1];
    }
    float max = -INFINITY;
    for (int j = 0; j < vocab; j++)
        if (logits[j] >= threshold && logits[j] > max) max = logits[j];
    double sum = 0;
    for (int j = 0; j < vocab; j++) {
        scratch[j] = logits[j] >= threshold ? expf((logits[j] - max) / (float)s->temperature) : 0;
        sum += scratch[j];
    }
    double u = td_rng_uniform(rng) * sum, acc = 0;
    for (int j = 0; j < vocab; j++) {
        acc += scratch[j];
        if (u < acc && scratch[j] > 0) return j;
    }
    for (int j = vocab - 1; j >= 0; j--) /* rounding left u at the very end */
        if (scratch[j] > 0) return j;
    return 0;
}

int32_t *td_generate_with(td_logits_fn logits_of, void *ctx, int block, int vocab,
                          const td_sample_spec *s, const int32_t *prompt, size_t n_prompt,
                          uint64_t stream, td_err *err) {
    size_t len = n_prompt, cap = n_prompt + (size_t)s->tokens;
    int32_t *ids = td_malloc(cap * sizeof *ids);
    memcpy(ids, prompt, len * sizeof *ids);
    float *x = td_calloc((size_t)block, sizeof *x), *scratch = td_malloc((size_t)vocab * 4);
    td_rng rng;
    td_rng_seed_for(&rng, s->seed, "sample", stream);
    while (len < cap) {
        size_t ctx_len = len < (size_t)block ? len : (size_t)block;
        for (size_t k = 0; k < ctx_len; k++) x[k] = (float)ids[len - ctx_len + k];
        const float *logits = logits_of(ctx, x, ctx_len - 1, err);
        if (!logits) {
            free(ids);
            ids = NULL;
            break;
        }
        ids[len] = draw(s, logits, vocab, scratch, &rng);
        len++;
    }
    free(x);
    free(scratch);
    return ids;
}

/* The CPU model's logits; evaluation draws no dropout masks and is not training time. */
static const float *cpu_logits(void *ctx, const float *x, size_t position, td_err *err) {
    (void)err;
    td_model *model = ctx;
    td_rng unused;
    td_rng_seed(&unused, 0);
    double *profile = model->profile;
    model->profile = NULL;
    td_run run = {.n = 1, .training = false, .rng = &unused};
    const float *logits = td_model_forward(model, x, &run);
    model->profile = profile;
    return logits + position * (size_t)td_model_output_shape(model).c;
}

int32_t *td_generate(td_model *model, int block, int vocab, const td_sample_spec *s,
                     const int32_t *prompt, size_t n_prompt, uint64_t stream) {
    td_err unused;
    return td_generate_with(cpu_logits, model, block, vocab, s, prompt, n_prompt, stream, &unused);
}

/* On a GPU: the sample as a batch of one, the one position's logits read back (the host model
 * has no activations of its own there; GPT-2's whole [T, V] would be 100 MB a token). */
static const float *gpu_logits(void *ctx, const float *x, size_t position, td_err *err) {
    trainer *t = ctx;
    const td_node *last = &t->model.nodes[t->model.n_nodes - 1];
    size_t vocab = (size_t)last->out_shape.c;
    if (!t->sample_logits) t->sample_logits = td_malloc(vocab * sizeof(float));
    td_run run = {.n = 1, .training = false, .rng = &t->state.dropout_rng};
    if (t->gpu_api->set_batch(t->gpu, &t->model, x, NULL, 1, err) != 0) return NULL;
    t->gpu_api->forward(t->gpu, &t->model, &run);
    const char *row =
        (const char *)last->out + position * vocab * td_precision_bytes(t->device.precision);
    if (t->gpu_api->read(t->gpu, row, vocab, t->sample_logits, err) != 0) return NULL;
    return t->sample_logits;
}

char *td_generate_text(const td_tokenizer *tk, const int32_t *ids, size_t n) {
    size_t bytes = n * (size_t)td_tokenizer_max_bytes(tk) + 1;
    char *raw = td_malloc(bytes), *text = td_malloc(3 * bytes);
    size_t len = td_tokenizer_decode(tk, ids, n, raw, bytes);
    td_utf8_repair(raw, len, text, 3 * bytes); /* U+FFFD is 3 bytes for each bad one */
    free(raw);
    return text;
}

void td_train_sample(trainer *t) {
    const td_sample_spec *s = &t->job->sample;
    if (!s->present || !t->rank0) return;
    td_err err;
    int32_t *ids = t->gpu
                       ? td_generate_with(gpu_logits, t, t->train.shape.c, t->classes, s,
                                          t->prompt_ids, t->n_prompt, (uint64_t)t->state.step, &err)
                       : td_generate(&t->model, t->train.shape.c, t->classes, s, t->prompt_ids,
                                     t->n_prompt, (uint64_t)t->state.step);
    if (!ids) { /* the device failed: the training step after this reports it */
        fprintf(t->log, "[traind] step %ld: no sample: %s\n", t->state.step, err.msg);
        return;
    }
    char *text = td_generate_text(&t->tokenizer, ids + t->n_prompt, (size_t)s->tokens);
    td_metrics_sample(t->metrics, t->state.step, s->prompt, text);
    free(text);
    free(ids);
}
