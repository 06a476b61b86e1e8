/* Presets against torchvision: parameter counts, and every state_dict name, dtype and shape
 * against fixtures written once by tests/fixtures/make_fixtures.py. */
#include "ops/td_ops.h"
#include "spec/td_spec.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void build_preset(td_model *m, const char *model_json, td_shape input) {
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"model\": %s, \"data\": {\"format\": \"idx\", \"train\": {\"images\": "
             "\"unused\", \"labels\": \"unused\"}}, \"train\": {\"batch_size\": 1, "
             "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
             model_json);
    td_job job;
    td_err err = {{0}};
    cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
    cr_assert_eq(td_model_build(m, job.model.nodes, job.model.n_nodes, input, 1, 1, 7, 0, &err), 0,
                 "%s", err.msg);
    td_job_free(&job);
}

/* Every line of the fixture names a tensor the model has, with that dtype and shape, and the
 * model has no other. */
static void expect_state_dict(const td_model *m, const char *fixture) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", getenv("TRAIND_SOURCE_DIR"), fixture);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    char line[512];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        char name[256], dtype[8], shape[128] = "";
        int got = sscanf(line, "%255s %7s %127s", name, dtype, shape);
        cr_assert(got >= 2, "bad fixture line: %s", line);
        lines++;
        const td_param *p = td_model_find_param(m, name);
        if (!p) {
            cr_expect_fail("torchvision has %s; the preset does not", name);
            continue;
        }
        cr_expect_str_eq(p->dtype == TD_I64 ? "I64" : "F32", dtype, "%s dtype", name);
        char ours[128] = "";
        size_t used = 0;
        for (int i = 0; i < p->ndim; i++)
            used +=
                (size_t)snprintf(ours + used, sizeof ours - used, "%s%d", i ? "," : "", p->dims[i]);
        cr_expect_str_eq(ours, shape, "%s: shape [%s], torchvision [%s]", name, ours, shape);
    }
    fclose(f);
    /* a tied weight is one tensor with two names, as in PyTorch's state_dict */
    int tensors = m->n_params + m->n_buffers + m->n_aliases;
    cr_expect_eq(tensors, lines, "the preset has %d tensors, PyTorch %d", tensors, lines);
}

Test(presets, resnet18_matches_torchvision) {
    td_model m;
    build_preset(&m, "{\"preset\": \"resnet18\", \"num_classes\": 1000}",
                 td_shape_image(3, 64, 64));
    cr_expect_eq(m.param_count, 11689512u, "resnet18 has %zu parameters", m.param_count);
    expect_state_dict(&m, "resnet18.state_dict.txt");
    td_model_free(&m);
}

Test(presets, resnet34_matches_torchvision) {
    td_model m;
    build_preset(&m, "{\"preset\": \"resnet34\", \"num_classes\": 1000}",
                 td_shape_image(3, 64, 64));
    cr_expect_eq(m.param_count, 21797672u, "resnet34 has %zu parameters", m.param_count);
    expect_state_dict(&m, "resnet34.state_dict.txt");
    td_model_free(&m);
}

Test(presets, resnet50_matches_torchvision) {
    td_model m;
    build_preset(&m, "{\"preset\": \"resnet50\", \"num_classes\": 1000}",
                 td_shape_image(3, 64, 64));
    cr_expect_eq(m.param_count, 25557032u, "resnet50 has %zu parameters", m.param_count);
    expect_state_dict(&m, "resnet50.state_dict.txt");
    /* v1.5: the stride sits on the 3x3 conv of the first bottleneck of layer2 */
    const td_node *conv2 = NULL, *conv1 = NULL;
    for (int i = 0; i < m.n_nodes; i++) {
        if (strcmp(m.nodes[i].name, "layer2.0.conv2") == 0) conv2 = &m.nodes[i];
        if (strcmp(m.nodes[i].name, "layer2.0.conv1") == 0) conv1 = &m.nodes[i];
    }
    cr_assert(conv1 && conv2);
    cr_expect_eq(conv1->out_shape.h, conv1->in_shape[0].h, "layer2.0.conv1 keeps the size");
    cr_expect_eq(conv2->out_shape.h, conv2->in_shape[0].h / 2, "layer2.0.conv2 halves it");
    td_model_free(&m);
}

Test(presets, resnet_init_and_zero_init_residual) {
    td_model m;
    build_preset(&m,
                 "{\"preset\": \"resnet18\", \"num_classes\": 10, \"stem\": \"cifar\", "
                 "\"zero_init_residual\": true}",
                 td_shape_image(3, 32, 32));
    const td_param *w = td_model_find_param(&m, "layer3.1.conv1.weight"); /* 256x256x3x3 */
    double ss = 0;
    for (size_t i = 0; i < w->size; i++) ss += (double)w->data[i] * w->data[i];
    double std = sqrt(ss / (double)w->size), want = sqrt(2.0 / (256 * 9));
    cr_expect(fabs(std / want - 1) < 0.02, "kaiming_normal fan_out: std %.5f, expected %.5f", std,
              want);
    const td_param *bn2 = td_model_find_param(&m, "layer1.0.bn2.weight");
    const td_param *bn1 = td_model_find_param(&m, "layer1.0.bn1.weight");
    cr_expect(bn2->data[0] == 0.0f && bn1->data[0] == 1.0f, "only the block's last BN is zero");
    const td_param *conv1 = td_model_find_param(&m, "conv1.weight");
    cr_expect(conv1->dims[2] == 3 && conv1->dims[3] == 3, "cifar stem: 3x3 conv1");
    cr_expect(td_model_output_shape(&m).c == 10);
    const td_node *last_block = NULL;
    for (int i = 0; i < m.n_nodes; i++)
        if (strcmp(m.nodes[i].name, "layer4.1.relu2") == 0) last_block = &m.nodes[i];
    cr_assert(last_block);
    cr_expect_eq(last_block->out_shape.h, 4, "32x32 input, no max-pool: 4x4 before the pool");
    td_model_free(&m);
}

Test(presets, cifar_net_is_the_tutorial_net) {
    td_model m;
    build_preset(&m, "{\"preset\": \"cifar_net\", \"num_classes\": 10}", td_shape_image(3, 32, 32));
    const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                           "fc1.bias",     "fc2.weight", "fc2.bias",     "fc3.weight", "fc3.bias"};
    cr_assert_eq(m.n_params, 10);
    for (int i = 0; i < 10; i++) cr_expect_str_eq(m.params[i].name, names[i]);
    const td_param *fc1 = td_model_find_param(&m, "fc1.weight");
    cr_expect(fc1->dims[0] == 120 && fc1->dims[1] == 400, "fc1 is 400 -> 120");
    const td_param *c1 = td_model_find_param(&m, "conv1.weight");
    cr_expect(c1->dims[0] == 6 && c1->dims[1] == 3 && c1->dims[2] == 5);
    cr_expect_eq(m.param_count, 62006u, "the tutorial net has 62,006 parameters");
    td_model_free(&m);
}

/* The gpt preset against nanoGPT's architecture written in PyTorch: every state_dict name and
 * shape (lm_head.weight is transformer.wte.weight), and GPT-2's initialisation. */
Test(presets, gpt_matches_nanogpt) {
    td_model m;
    build_preset(&m,
                 "{\"preset\": \"gpt\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 32, "
                 "\"block_size\": 64, \"vocab_size\": 65}",
                 td_shape_flat(16));
    expect_state_dict(&m, "gpt-2layer.state_dict.txt");
    cr_expect_eq(td_model_find_param(&m, "lm_head.weight"),
                 td_model_find_param(&m, "transformer.wte.weight"));
    /* wte 65·32, wpe 64·32, 2 blocks of (2 LayerNorms 4·32, c_attn 32·96 + 96, c_proj 32·32 +
     * 32, c_fc 32·128 + 128, mlp c_proj 128·32 + 32), ln_f 2·32; the head is wte */
    cr_expect_eq(m.param_count, 29600u, "%zu parameters", m.param_count);
    const struct {
        const char *name;
        double mean, std;
    } want[] = {{"transformer.wte.weight", 0, 0.02},
                {"transformer.h.0.attn.c_attn.weight", 0, 0.02},
                {"transformer.h.1.mlp.c_proj.weight", 0, 0.02 / 2}, /* / sqrt(2 · n_layer) */
                {"transformer.h.0.attn.c_proj.weight", 0, 0.02 / 2},
                {"transformer.h.0.attn.c_attn.bias", 0, 0},
                {"transformer.ln_f.weight", 1, 0}};
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        const td_param *p = td_model_find_param(&m, want[k].name);
        cr_assert(p, "%s", want[k].name);
        double sum = 0, sq = 0;
        for (size_t i = 0; i < p->size; i++) sum += p->data[i];
        double mean = sum / (double)p->size;
        for (size_t i = 0; i < p->size; i++) sq += (p->data[i] - mean) * (p->data[i] - mean);
        double std = sqrt(sq / (double)p->size);
        cr_expect(fabs(mean - want[k].mean) < 0.1 * want[k].std + 1e-6 &&
                      fabs(std - want[k].std) < 0.1 * want[k].std + 1e-6,
                  "%s: mean %.4g std %.4g, GPT-2's %.4g and %.4g", want[k].name, mean, std,
                  want[k].mean, want[k].std);
    }
    td_model_free(&m);
}

/* GPT-2 small has its published size (the head tied: counted once); medium (354,823,168) is
 * the same formula at 24 layers of 1024, left out for the 1.4 GB it would take to check. */
Test(presets, gpt2_size, .timeout = 240) {
    const struct {
        const char *json;
        size_t params;
    } sizes[] = {{"{\"preset\": \"gpt2\"}", 124439808u}};
    for (int k = 0; k < 1; k++) {
        td_model m;
        build_preset(&m, sizes[k].json, td_shape_flat(4));
        cr_expect_eq(m.param_count, sizes[k].params, "%s: %zu parameters", sizes[k].json,
                     m.param_count);
        td_model_free(&m);
    }
}

/* nanoGPT's dropouts: after the embeddings, in the attention, after each c_proj; none at 0 */
Test(presets, gpt_dropout_where_nanogpt_has_it) {
    for (int with = 0; with < 2; with++) {
        char spec[512];
        snprintf(
            spec, sizeof spec,
            "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, "
            "\"n_embd\": 8, \"block_size\": 8, \"vocab_size\": 11, \"dropout\": %s},"
            " \"data\": {\"format\": \"tokens\", \"train\": {\"path\": \"x.bin\"},"
            " \"vocab_size\": 11, \"block_size\": 8},"
            " \"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
            with ? "0.2" : "0");
        td_job job;
        td_err err;
        cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
        char names[1024] = "";
        int attention = 0;
        for (int i = 0; i < job.model.n_nodes; i++) {
            const td_node_spec *s = &job.model.nodes[i];
            if (s->op == &td_op_dropout) {
                cr_expect_float_eq(s->args[0], 0.2, 1e-12);
                strcat(names, s->name);
                strcat(names, " ");
            }
            if (s->op == &td_op_causal_attention) {
                cr_expect_float_eq(s->args[1], with ? 0.2 : 0.0, 1e-12, "%s", s->name);
                attention++;
            }
        }
        cr_expect_eq(attention, 2);
        cr_expect_str_eq(names, with ? "transformer.drop transformer.h.0.attn.resid_dropout "
                                       "transformer.h.0.mlp.dropout "
                                       "transformer.h.1.attn.resid_dropout "
                                       "transformer.h.1.mlp.dropout "
                                     : "");
        td_job_free(&job);
    }
}

Test(presets, gpt_refusals_name_the_field) {
    const char *bad[][2] = {
        {"{\"preset\": \"gpt\", \"n_embd\": 100, \"n_head\": 3}", "model.n_embd"},
        {"{\"preset\": \"gpt\", \"dropout\": 1.0}", "model.dropout"},
        {"{\"preset\": \"gpt\", \"num_classes\": 10}", "num_classes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char spec[1024];
        snprintf(spec, sizeof spec,
                 "{\"model\": %s, \"data\": {\"format\": \"idx\", \"train\": {\"images\": "
                 "\"x\", \"labels\": \"y\"}}, \"train\": {\"batch_size\": 1, \"optimizer\": "
                 "{\"type\": \"sgd\", \"lr\": 0.1}}}",
                 bad[i][0]);
        td_job job;
        td_err err = {{0}};
        cr_expect_neq(td_job_load_string(&job, spec, &err), 0, "%s", bad[i][0]);
        cr_expect(strstr(err.msg, bad[i][1]), "%s: %s", bad[i][1], err.msg);
    }
}
