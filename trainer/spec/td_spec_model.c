/* The spec's model section: a preset (expanded by td_preset.c) or a list of nodes, each an op of
 * ops/td_ops.def with its arguments, named as PyTorch's state_dict would name it. */
#include "spec/td_spec_private.h"

#include "base/td_json.h"
#include "ops/td_op_sigs.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_node(const json_t *v, int index, td_node_spec *s, td_err *err) {
    char path[64];
    snprintf(path, sizeof path, "model.nodes[%d]", index);
    if (!json_is_object(v))
        return td_json_fail_found(err, path, "an object {\"name\", \"op\", ...}", v);
    memset(s, 0, sizeof *s);
    char op_name[64];
    if (td_json_string(v, path, "name", true, "", s->name, sizeof s->name, err) != 0) return -1;
    if (td_json_string(v, path, "op", true, "", op_name, sizeof op_name, err) != 0) return -1;
    s->sig = td_op_sig_find(op_name);
    if (!s->sig)
        return td_fail(err, "%s.op: unknown op \"%s\"; expected one of: %s", path, op_name,
                       td_op_sig_names());
    const char *allowed[TD_MAX_OP_ARGS + 6] = {"name", "op", "inputs", "weight_from", "init_std"};
    int n_allowed = 5;
    for (int i = 0; s->sig->args[i].name; i++) allowed[n_allowed++] = s->sig->args[i].name;
    allowed[n_allowed] = NULL;
    if (td_json_check_keys(v, path, allowed, err) != 0) return -1;
    for (int i = 0; s->sig->args[i].name; i++) {
        const td_op_arg *a = &s->sig->args[i];
        long l = 0;
        bool b = false;
        int c = 0;
        switch (a->type) {
        case TD_ARG_INT:
            if (td_json_int(v, path, a->name, a->required, (long)a->def, (long)a->min, (long)a->max,
                            &l, err) != 0)
                return -1;
            s->args[i] = (double)l;
            break;
        case TD_ARG_FLOAT:
            if (td_json_number(v, path, a->name, a->required, a->def, a->min, a->max, &s->args[i],
                               err) != 0)
                return -1;
            break;
        case TD_ARG_BOOL:
            if (td_json_bool(v, path, a->name, a->def != 0, &b, err) != 0) return -1;
            s->args[i] = b;
            break;
        case TD_ARG_CHOICE: {
            char def[32];
            size_t n = strcspn(a->choices, "|");
            snprintf(def, sizeof def, "%.*s", (int)n, a->choices);
            if (td_json_choice(v, path, a->name, a->required, def, a->choices, &c, err) != 0)
                return -1;
            s->args[i] = c;
            break;
        }
        }
    }
    if (td_json_string(v, path, "weight_from", false, "", s->weight_from, sizeof s->weight_from,
                       err) != 0 ||
        td_json_number(v, path, "init_std", false, 0, 0, 10, &s->init_std, err) != 0)
        return -1;
    json_t *inputs = json_object_get(v, "inputs");
    if (inputs) {
        char where[96];
        snprintf(where, sizeof where, "%s.inputs", path);
        if (!json_is_array(inputs) || json_array_size(inputs) == 0 ||
            json_array_size(inputs) > TD_MAX_INPUTS)
            return td_json_fail_found(err, where, "an array of 1 to 4 node names", inputs);
        s->n_inputs = (int)json_array_size(inputs);
        for (int j = 0; j < s->n_inputs; j++) {
            json_t *name = json_array_get(inputs, (size_t)j);
            snprintf(where, sizeof where, "%s.inputs[%d]", path, j);
            if (!json_is_string(name)) return td_json_fail_found(err, where, "a node name", name);
            snprintf(s->inputs[j], sizeof s->inputs[j], "%s", json_string_value(name));
        }
    }
    return 0;
}

/* "gpt" (sizes given, GPT-2 small's by default, the vocabulary from the data unless
 * vocab_size), and GPT-2's published sizes "gpt2" (124M) and "gpt2-medium" (350M). */
static int parse_gpt(const json_t *m, const char *name, td_job *job, td_err *err) {
    static const char *const keys[] = {"preset",     "n_layer",    "n_head", "n_embd",
                                       "block_size", "vocab_size", "bias",   "dropout",
                                       "init_from",  "strict",     NULL};
    if (td_json_check_keys(m, "model", keys, err) != 0) return -1;
    bool medium = strcmp(name, "gpt2-medium") == 0, named = strcmp(name, "gpt") != 0;
    long layer, head, embd, block, vocab;
    double dropout;
    td_gpt_options o = {0};
    if (td_json_int(m, "model", "n_layer", false, medium ? 24 : 12, 1, 1024, &layer, err) != 0 ||
        td_json_int(m, "model", "n_head", false, medium ? 16 : 12, 1, 1024, &head, err) != 0 ||
        td_json_int(m, "model", "n_embd", false, medium ? 1024 : 768, 1, 1 << 16, &embd, err) !=
            0 ||
        td_json_int(m, "model", "block_size", false, 1024, 1, 1 << 16, &block, err) != 0 ||
        td_json_int(m, "model", "vocab_size", false, named ? 50257 : 0, 1, 1 << 24, &vocab, err) !=
            0 ||
        td_json_bool(m, "model", "bias", true, &o.bias, err) != 0 ||
        td_json_number(m, "model", "dropout", false, 0, 0, 0.999, &dropout, err) != 0)
        return -1;
    if (embd % head != 0)
        return td_fail(err, "model.n_embd: %ld is not a multiple of n_head %ld", embd, head);
    o.n_layer = (int)layer, o.n_head = (int)head, o.n_embd = (int)embd;
    o.block_size = (int)block, o.vocab_size = (int)vocab, o.dropout = dropout;
    job->model.vocab_from_data = vocab == 0;
    return td_preset_gpt(&o, &job->model.nodes, &job->model.n_nodes);
}

int td_spec_parse_model(const json_t *root, td_job *job, td_err *err) {
    json_t *m;
    if (td_json_object(root, "", "model", true, &m, err) != 0) return -1;
    json_t *nodes = json_object_get(m, "nodes");
    json_t *preset = json_object_get(m, "preset");
    if (nodes && preset)
        return td_fail(err, "model: has both \"preset\" and \"nodes\"; expected one of them");
    if (td_json_string(m, "model", "init_from", false, "", job->model.init_from,
                       sizeof job->model.init_from, err) != 0 ||
        td_json_bool(m, "model", "strict", true, &job->model.init_strict, err) != 0)
        return -1;
    /* a language model's classes are its vocabulary: no num_classes */
    bool gpt = json_is_string(preset) && strncmp(json_string_value(preset), "gpt", 3) == 0;
    long classes;
    if (td_json_int(m, "model", "num_classes", preset != NULL && !gpt, 0, 1, 1 << 20, &classes,
                    err) != 0)
        return -1;
    job->model.num_classes = (int)classes;
    if (nodes) {
        static const char *const keys[] = {"nodes", "num_classes", "init_from", "strict", NULL};
        if (td_json_check_keys(m, "model", keys, err) != 0) return -1;
        if (!json_is_array(nodes) || json_array_size(nodes) == 0)
            return td_json_fail_found(err, "model.nodes", "a non-empty array of nodes", nodes);
        job->model.n_nodes = (int)json_array_size(nodes);
        job->model.nodes = td_calloc((size_t)job->model.n_nodes, sizeof *job->model.nodes);
        for (int i = 0; i < job->model.n_nodes; i++)
            if (parse_node(json_array_get(nodes, (size_t)i), i, &job->model.nodes[i], err) != 0)
                return -1;
        return 0;
    }
    if (!preset) return td_fail(err, "model: missing; expected \"preset\" or \"nodes\"");
    int which;
    if (td_json_choice(m, "model", "preset", true, "",
                       "lenet5|mlp|cifar_net|resnet18|resnet34|resnet50|gpt|gpt2|gpt2-medium",
                       &which, err) != 0)
        return -1;
    if (which >= 6) return parse_gpt(m, json_string_value(preset), job, err);
    if (which == 0 || which == 2) {
        static const char *const keys[] = {"preset", "num_classes", "init_from", "strict", NULL};
        if (td_json_check_keys(m, "model", keys, err) != 0) return -1;
        return which == 0 ? td_preset_lenet5(job->model.num_classes, &job->model.nodes,
                                             &job->model.n_nodes)
                          : td_preset_cifar_net(job->model.num_classes, &job->model.nodes,
                                                &job->model.n_nodes);
    }
    if (which >= 3) {
        static const char *const keys[] = {"preset",    "num_classes", "stem", "zero_init_residual",
                                           "init_from", "strict",      NULL};
        if (td_json_check_keys(m, "model", keys, err) != 0) return -1;
        int stem;
        bool zero_init;
        if (td_json_choice(m, "model", "stem", false, "imagenet", "imagenet|cifar", &stem, err) !=
                0 ||
            td_json_bool(m, "model", "zero_init_residual", false, &zero_init, err) != 0)
            return -1;
        static const int depths[] = {18, 34, 50};
        return td_preset_resnet(depths[which - 3], job->model.num_classes,
                                stem ? TD_STEM_CIFAR : TD_STEM_IMAGENET, zero_init,
                                &job->model.nodes, &job->model.n_nodes);
    }
    static const char *const keys[] = {"preset",  "num_classes", "hidden", "activation",
                                       "dropout", "init_from",   "strict", NULL};
    if (td_json_check_keys(m, "model", keys, err) != 0) return -1;
    td_mlp_options opt = {.n_hidden = 2, .hidden = {512, 512}};
    json_t *hidden = json_object_get(m, "hidden");
    if (hidden) {
        if (!json_is_array(hidden) || json_array_size(hidden) > 16)
            return td_json_fail_found(err, "model.hidden", "an array of up to 16 layer widths",
                                      hidden);
        opt.n_hidden = (int)json_array_size(hidden);
        for (int i = 0; i < opt.n_hidden; i++) {
            json_t *h = json_array_get(hidden, (size_t)i);
            char where[64];
            snprintf(where, sizeof where, "model.hidden[%d]", i);
            if (!json_is_integer(h) || json_integer_value(h) < 1 ||
                json_integer_value(h) > (1 << 20))
                return td_json_fail_found(err, where, "a positive integer width", h);
            opt.hidden[i] = (int)json_integer_value(h);
        }
    }
    int act;
    if (td_json_choice(m, "model", "activation", false, "relu", "relu|gelu", &act, err) != 0)
        return -1;
    opt.activation = act == 0 ? &td_op_sig_relu : &td_op_sig_gelu;
    double dropout;
    if (td_json_number(m, "model", "dropout", false, 0, 0, 0.999, &dropout, err) != 0) return -1;
    opt.dropout = (float)dropout;
    return td_preset_mlp(&opt, job->model.num_classes, &job->model.nodes, &job->model.n_nodes);
}
