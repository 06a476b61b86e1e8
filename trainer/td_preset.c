#include "td_spec.h"

#include <stdio.h>
#include <string.h>

static td_node_spec *add(td_node_spec *nodes, int *n, const char *name, const td_op *op) {
    td_node_spec *s = &nodes[(*n)++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->op = op;
    /* defaults from the op's table, so presets and JSON nodes agree */
    for (int i = 0; op->args[i].name; i++) s->args[i] = op->args[i].def;
    return s;
}

int td_preset_lenet5(int num_classes, td_node_spec **out, int *n_out) {
    td_node_spec *nodes = td_calloc(16, sizeof *nodes);
    int n = 0;
    td_node_spec *s;
    s = add(nodes, &n, "conv1", &td_op_conv2d);
    s->args[0] = 6, s->args[1] = 5;
    add(nodes, &n, "relu1", &td_op_relu);
    s = add(nodes, &n, "pool1", &td_op_maxpool2d);
    s->args[0] = 2;
    s = add(nodes, &n, "conv2", &td_op_conv2d);
    s->args[0] = 16, s->args[1] = 5;
    add(nodes, &n, "relu2", &td_op_relu);
    s = add(nodes, &n, "pool2", &td_op_maxpool2d);
    s->args[0] = 2;
    add(nodes, &n, "flatten", &td_op_flatten);
    s = add(nodes, &n, "fc1", &td_op_linear);
    s->args[0] = 120;
    add(nodes, &n, "relu3", &td_op_relu);
    s = add(nodes, &n, "fc2", &td_op_linear);
    s->args[0] = 84;
    add(nodes, &n, "relu4", &td_op_relu);
    s = add(nodes, &n, "fc3", &td_op_linear);
    s->args[0] = num_classes;
    *out = nodes;
    *n_out = n;
    return 0;
}

int td_preset_mlp(const td_mlp_options *opt, int num_classes, td_node_spec **out, int *n_out) {
    td_node_spec *nodes = td_calloc((size_t)opt->n_hidden * 3 + 2, sizeof *nodes);
    int n = 0;
    char name[32];
    add(nodes, &n, "flatten", &td_op_flatten);
    for (int i = 0; i < opt->n_hidden; i++) {
        snprintf(name, sizeof name, "fc%d", i + 1);
        add(nodes, &n, name, &td_op_linear)->args[0] = opt->hidden[i];
        snprintf(name, sizeof name, "act%d", i + 1);
        add(nodes, &n, name, opt->activation);
        if (opt->dropout > 0) {
            snprintf(name, sizeof name, "dropout%d", i + 1);
            add(nodes, &n, name, &td_op_dropout)->args[0] = opt->dropout;
        }
    }
    snprintf(name, sizeof name, "fc%d", opt->n_hidden + 1);
    add(nodes, &n, name, &td_op_linear)->args[0] = num_classes;
    *out = nodes;
    *n_out = n;
    return 0;
}
