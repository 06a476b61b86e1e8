#include "spec/td_spec.h"
#include "ops/td_op_sigs.h"

#include <stdio.h>
#include <string.h>

static td_node_spec *add(td_node_spec *nodes, int *n, const char *name, const td_op_sig *sig) {
    td_node_spec *s = &nodes[(*n)++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->sig = sig;
    /* defaults from the op's table, so presets and JSON nodes agree */
    for (int i = 0; sig->args[i].name; i++) s->args[i] = sig->args[i].def;
    return s;
}

int td_preset_lenet5(int num_classes, td_node_spec **out, int *n_out) {
    td_node_spec *nodes = td_calloc(16, sizeof *nodes);
    int n = 0;
    td_node_spec *s;
    s = add(nodes, &n, "conv1", &td_op_sig_conv2d);
    s->args[0] = 6, s->args[1] = 5;
    add(nodes, &n, "relu1", &td_op_sig_relu);
    s = add(nodes, &n, "pool1", &td_op_sig_maxpool2d);
    s->args[0] = 2;
    s = add(nodes, &n, "conv2", &td_op_sig_conv2d);
    s->args[0] = 16, s->args[1] = 5;
    add(nodes, &n, "relu2", &td_op_sig_relu);
    s = add(nodes, &n, "pool2", &td_op_sig_maxpool2d);
    s->args[0] = 2;
    add(nodes, &n, "flatten", &td_op_sig_flatten);
    s = add(nodes, &n, "fc1", &td_op_sig_linear);
    s->args[0] = 120;
    add(nodes, &n, "relu3", &td_op_sig_relu);
    s = add(nodes, &n, "fc2", &td_op_sig_linear);
    s->args[0] = 84;
    add(nodes, &n, "relu4", &td_op_sig_relu);
    s = add(nodes, &n, "fc3", &td_op_sig_linear);
    s->args[0] = num_classes;
    *out = nodes;
    *n_out = n;
    return 0;
}

int td_preset_mlp(const td_mlp_options *opt, int num_classes, td_node_spec **out, int *n_out) {
    td_node_spec *nodes = td_calloc((size_t)opt->n_hidden * 3 + 2, sizeof *nodes);
    int n = 0;
    char name[32];
    add(nodes, &n, "flatten", &td_op_sig_flatten);
    for (int i = 0; i < opt->n_hidden; i++) {
        snprintf(name, sizeof name, "fc%d", i + 1);
        add(nodes, &n, name, &td_op_sig_linear)->args[0] = opt->hidden[i];
        snprintf(name, sizeof name, "act%d", i + 1);
        add(nodes, &n, name, opt->activation);
        if (opt->dropout > 0) {
            snprintf(name, sizeof name, "dropout%d", i + 1);
            add(nodes, &n, name, &td_op_sig_dropout)->args[0] = opt->dropout;
        }
    }
    snprintf(name, sizeof name, "fc%d", opt->n_hidden + 1);
    add(nodes, &n, name, &td_op_sig_linear)->args[0] = num_classes;
    *out = nodes;
    *n_out = n;
    return 0;
}

int td_preset_cifar_net(int num_classes, td_node_spec **out, int *n_out) {
    /* LeNet's layout on 3-channel 32x32 input: the same nodes, other channel counts */
    td_preset_lenet5(num_classes, out, n_out);
    return 0;
}

/* Appends a node reading `input` (NULL: the previous node). */
static td_node_spec *add_from(td_node_spec *nodes, int *n, const char *name, const td_op_sig *sig,
                              const char *input) {
    td_node_spec *s = add(nodes, n, name, sig);
    if (input) {
        s->n_inputs = 1;
        snprintf(s->inputs[0], sizeof s->inputs[0], "%s", input);
    }
    return s;
}

static void resnet_conv(td_node_spec *nodes, int *n, const char *name, const char *input, int out,
                        int k, int stride) {
    td_node_spec *s = add_from(nodes, n, name, &td_op_sig_conv2d, input);
    s->args[0] = out, s->args[1] = k, s->args[2] = stride, s->args[3] = k / 2;
    s->args[4] = 0; /* no bias */
    s->args[5] = 1; /* kaiming_normal_(mode="fan_out", nonlinearity="relu") */
}

static void resnet_bn(td_node_spec *nodes, int *n, const char *name, bool zero_init) {
    add(nodes, n, name, &td_op_sig_batchnorm2d)->args[4] = zero_init;
}

/* One residual block named prefix ("layer2.0") reading `input`; writes the name of its output
 * node to out_name. */
static void resnet_block(td_node_spec *nodes, int *n, const char *prefix, const char *input,
                         int in_ch, int planes, int stride, bool bottleneck, bool zero_init,
                         char *out_name, size_t out_len) {
    char name[TD_NAME_MAX], branch[TD_NAME_MAX], shortcut[TD_NAME_MAX];
    int expansion = bottleneck ? 4 : 1, out_ch = planes * expansion;
#define NAME(fmt) (snprintf(name, sizeof name, "%s." fmt, prefix), name)
    if (bottleneck) {
        resnet_conv(nodes, n, NAME("conv1"), input, planes, 1, 1);
        resnet_bn(nodes, n, NAME("bn1"), false);
        add(nodes, n, NAME("relu1"), &td_op_sig_relu);
        resnet_conv(nodes, n, NAME("conv2"), NULL, planes, 3, stride);
        resnet_bn(nodes, n, NAME("bn2"), false);
        add(nodes, n, NAME("relu2"), &td_op_sig_relu);
        resnet_conv(nodes, n, NAME("conv3"), NULL, out_ch, 1, 1);
        resnet_bn(nodes, n, NAME("bn3"), zero_init);
        snprintf(branch, sizeof branch, "%s.bn3", prefix);
    } else {
        resnet_conv(nodes, n, NAME("conv1"), input, planes, 3, stride);
        resnet_bn(nodes, n, NAME("bn1"), false);
        add(nodes, n, NAME("relu1"), &td_op_sig_relu);
        resnet_conv(nodes, n, NAME("conv2"), NULL, planes, 3, 1);
        resnet_bn(nodes, n, NAME("bn2"), zero_init);
        snprintf(branch, sizeof branch, "%s.bn2", prefix);
    }
    snprintf(shortcut, sizeof shortcut, "%s", input);
    if (stride != 1 || in_ch != out_ch) {
        resnet_conv(nodes, n, NAME("downsample.0"), input, out_ch, 1, stride);
        resnet_bn(nodes, n, NAME("downsample.1"), false);
        snprintf(shortcut, sizeof shortcut, "%s.downsample.1", prefix);
    }
    td_node_spec *sum = add(nodes, n, NAME("add"), &td_op_sig_add);
    sum->n_inputs = 2;
    snprintf(sum->inputs[0], sizeof sum->inputs[0], "%s", branch);
    snprintf(sum->inputs[1], sizeof sum->inputs[1], "%s", shortcut);
    add(nodes, n, bottleneck ? NAME("relu3") : NAME("relu2"), &td_op_sig_relu);
    snprintf(out_name, out_len, "%s", name);
#undef NAME
}

int td_preset_resnet(int depth, int num_classes, td_resnet_stem stem, bool zero_init_residual,
                     td_node_spec **out, int *n_out) {
    static const int blocks18[4] = {2, 2, 2, 2}, blocks34[4] = {3, 4, 6, 3};
    const int *blocks = depth == 18 ? blocks18 : blocks34; /* 50 shares 34's counts */
    bool bottleneck = depth == 50;
    int total = 0;
    for (int i = 0; i < 4; i++) total += blocks[i];
    td_node_spec *nodes = td_calloc((size_t)total * 14 + 8, sizeof *nodes);
    int n = 0;
    if (stem == TD_STEM_CIFAR) {
        resnet_conv(nodes, &n, "conv1", NULL, 64, 3, 1);
    } else {
        resnet_conv(nodes, &n, "conv1", NULL, 64, 7, 2);
    }
    resnet_bn(nodes, &n, "bn1", false);
    add(nodes, &n, "relu", &td_op_sig_relu);
    char prev[TD_NAME_MAX] = "relu";
    if (stem == TD_STEM_IMAGENET) {
        td_node_spec *pool = add(nodes, &n, "maxpool", &td_op_sig_maxpool2d);
        pool->args[0] = 3, pool->args[1] = 2, pool->args[2] = 1;
        snprintf(prev, sizeof prev, "maxpool");
    }
    int in_ch = 64;
    for (int layer = 0; layer < 4; layer++) {
        int planes = 64 << layer;
        for (int b = 0; b < blocks[layer]; b++) {
            char prefix[32], last[TD_NAME_MAX];
            snprintf(prefix, sizeof prefix, "layer%d.%d", layer + 1, b);
            int stride = (layer > 0 && b == 0) ? 2 : 1;
            resnet_block(nodes, &n, prefix, prev, in_ch, planes, stride, bottleneck,
                         zero_init_residual, last, sizeof last);
            in_ch = planes * (bottleneck ? 4 : 1);
            snprintf(prev, sizeof prev, "%s", last);
        }
    }
    add(nodes, &n, "avgpool", &td_op_sig_adaptive_avgpool2d);
    add(nodes, &n, "flatten", &td_op_sig_flatten);
    add(nodes, &n, "fc", &td_op_sig_linear)->args[0] = num_classes;
    *out = nodes;
    *n_out = n;
    return 0;
}
