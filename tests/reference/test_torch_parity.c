/* The engine against PyTorch: the same small conv net (conv, relu, maxpool, strided conv, gelu,
 * 1x1 conv with a residual add, avgpool with padding, flatten, linear) with PyTorch's weights on
 * PyTorch's input must give the same logits, loss and gradients within 1e-4 relative error; and
 * so must a one-block GPT as nanoGPT writes it (embeddings, LayerNorm, causal attention, MLP).
 * The references come from reference/torch_parity.py, run by the ctest fixture before this. */
#include "core/td_loss.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *PARITY_NODES =
    "[{\"name\":\"conv1\",\"op\":\"conv2d\",\"out_channels\":8,\"kernel_size\":3,\"padding\":1},"
    " {\"name\":\"relu1\",\"op\":\"relu\"},"
    " {\"name\":\"pool1\",\"op\":\"maxpool2d\",\"kernel_size\":2},"
    " {\"name\":\"conv2\",\"op\":\"conv2d\",\"out_channels\":6,\"kernel_size\":3,\"stride\":2,"
    "\"padding\":1},"
    " {\"name\":\"gelu\",\"op\":\"gelu\"},"
    " {\"name\":\"conv3\",\"op\":\"conv2d\",\"out_channels\":6,\"kernel_size\":1,\"bias\":false},"
    " {\"name\":\"res\",\"op\":\"add\",\"inputs\":[\"gelu\",\"conv3\"]},"
    " {\"name\":\"pool2\",\"op\":\"avgpool2d\",\"kernel_size\":3,\"stride\":1,\"padding\":1},"
    " {\"name\":\"flat\",\"op\":\"flatten\"},"
    " {\"name\":\"fc1\",\"op\":\"linear\",\"out_features\":20},"
    " {\"name\":\"relu2\",\"op\":\"relu\"},"
    " {\"name\":\"fc2\",\"op\":\"linear\",\"out_features\":5}]";

typedef struct reference {
    json_t *index;
    float *data;
} reference;

static const float *ref_get(const reference *ref, const char *name, size_t expect) {
    json_t *e = json_object_get(ref->index, name);
    cr_assert(e, "reference has no tensor %s", name);
    size_t count = 1;
    json_t *dim;
    size_t i;
    json_array_foreach(json_object_get(e, "shape"), i, dim) count *=
        (size_t)json_integer_value(dim);
    cr_assert_eq(count, expect, "%s: reference has %zu values, engine %zu", name, count, expect);
    return ref->data + json_integer_value(json_object_get(e, "offset"));
}

/* max |a - b| / max |b|: one number per tensor, robust to entries near zero */
static void expect_close(const char *what, const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    double rel = diff / (scale > 0 ? scale : 1);
    cr_expect(rel <= 1e-4, "%s: relative error %.3g exceeds 1e-4", what, rel);
}

/* stem.json and stem.bin of the fixture's directory */
static reference ref_load(const char *stem) {
    const char *dir = getenv("TRAIND_PARITY_DIR");
    cr_assert(dir, "TRAIND_PARITY_DIR is not set (ctest sets it)");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.json", dir, stem);
    json_error_t jerr;
    reference ref = {.index = json_load_file(path, 0, &jerr)};
    cr_assert(ref.index, "%s: %s (did the torch_reference fixture run?)", path, jerr.text);
    snprintf(path, sizeof path, "%s/%s.bin", dir, stem);
    ref.data = (float *)test_read_file(path);
    return ref;
}

static void load_params(td_model *m, const reference *ref) {
    for (int p = 0; p < m->n_params; p++)
        memcpy(m->params[p].data, ref_get(ref, m->params[p].name, m->params[p].size),
               m->params[p].size * sizeof(float));
}

static void expect_param_grads(const td_model *m, const reference *ref) {
    for (int p = 0; p < m->n_params; p++) {
        char name[256];
        snprintf(name, sizeof name, "%s.grad", m->params[p].name);
        expect_close(name, m->params[p].grad, ref_get(ref, name, m->params[p].size),
                     m->params[p].size);
    }
}

Test(torch_parity, small_convnet_forward_and_backward) {
    reference ref = ref_load("parity");

    const int n = 4;
    td_model m;
    test_build_model(&m, PARITY_NODES, td_shape_image(3, 12, 12), n, 1);
    load_params(&m, &ref);
    const float *x = ref_get(&ref, "input", (size_t)n * 3 * 12 * 12);
    const float *yf = ref_get(&ref, "labels", n);
    int32_t labels[4];
    for (int i = 0; i < n; i++) labels[i] = (int32_t)yf[i];

    td_run run = {.n = n, .training = true};
    const float *logits = td_model_forward(&m, x, &run);
    expect_close("logits", logits, ref_get(&ref, "logits", (size_t)n * 5), (size_t)n * 5);
    td_loss loss = {.kind = TD_LOSS_CROSS_ENTROPY, .label_smoothing = 0.1f};
    float dlogits[4 * 5];
    float l = (float)(td_loss_compute(&loss, logits, labels, n, 5, dlogits, 1.0f, NULL) / n);
    expect_close("loss", &l, ref_get(&ref, "loss", 1), 1);
    td_model_backward(&m, dlogits, &run);
    expect_param_grads(&m, &ref);
    td_model_free(&m);
    json_decref(ref.index);
    free(ref.data);
}

#define GPT_BLOCK "transformer.h.0."
static const char *GPT_NODES =
    "[{\"name\":\"transformer.wte\",\"op\":\"embedding\",\"num_embeddings\":11,"
    "\"embedding_dim\":8},"
    " {\"name\":\"transformer.wpe\",\"op\":\"position_embedding\",\"block_size\":8},"
    " {\"name\":\"" GPT_BLOCK "ln_1\",\"op\":\"layernorm\"},"
    " {\"name\":\"" GPT_BLOCK "attn.c_attn\",\"op\":\"linear\",\"out_features\":24},"
    " {\"name\":\"" GPT_BLOCK "attn.core\",\"op\":\"causal_attention\",\"n_head\":2},"
    " {\"name\":\"" GPT_BLOCK "attn.c_proj\",\"op\":\"linear\",\"out_features\":8},"
    " {\"name\":\"" GPT_BLOCK "res_1\",\"op\":\"add\",\"inputs\":[\"" GPT_BLOCK
    "attn.c_proj\",\"transformer.wpe\"]},"
    " {\"name\":\"" GPT_BLOCK "ln_2\",\"op\":\"layernorm\"},"
    " {\"name\":\"" GPT_BLOCK "mlp.c_fc\",\"op\":\"linear\",\"out_features\":32},"
    " {\"name\":\"" GPT_BLOCK "mlp.gelu\",\"op\":\"gelu\"},"
    " {\"name\":\"" GPT_BLOCK "mlp.c_proj\",\"op\":\"linear\",\"out_features\":8},"
    " {\"name\":\"" GPT_BLOCK "res_2\",\"op\":\"add\",\"inputs\":[\"" GPT_BLOCK
    "mlp.c_proj\",\"" GPT_BLOCK "res_1\"]},"
    " {\"name\":\"transformer.ln_f\",\"op\":\"layernorm\"},"
    " {\"name\":\"lm_head\",\"op\":\"linear\",\"out_features\":11,\"bias\":false,"
    "\"weight_from\":\"transformer.wte\"}]";

/* Parameters named and shaped as nanoGPT's state_dict, PyTorch's weights, the same tokens: the
 * same logits and gradients. The positions' table is longer than the sequences (8 against 6):
 * its last rows get zero gradients in both. lm_head's weight is the token embedding's: one
 * tensor whose gradient sums both uses, which PyTorch lists once, under its first name. */
Test(torch_parity, gpt_block_forward_and_backward) {
    reference ref = ref_load("gpt_parity");
    const int n = 3, t = 6, vocab = 11;
    td_model m;
    test_build_model(&m, GPT_NODES, td_shape_flat(t), n, 1);
    load_params(&m, &ref);
    td_run run = {.n = n, .training = true};
    const float *logits = td_model_forward(&m, ref_get(&ref, "input", (size_t)n * t), &run);
    size_t outs = (size_t)n * t * vocab;
    expect_close("logits", logits, ref_get(&ref, "logits", outs), outs);
    td_model_backward(&m, ref_get(&ref, "dlogits", outs), &run);
    expect_param_grads(&m, &ref);
    cr_expect_eq(m.n_aliases, 1);
    cr_expect_eq(td_model_find_param(&m, "lm_head.weight"),
                 td_model_find_param(&m, "transformer.wte.weight"), "one tensor, two names");
    td_model_free(&m);
    json_decref(ref.index);
    free(ref.data);
}
